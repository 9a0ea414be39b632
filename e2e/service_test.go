package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
)

// The tests of airlockd as a systemd service (issue 9): the unit, install,
// sd_notify, reload, stop and start.

const (
	policyAllowed = "sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n"
	policyOther   = "sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user:\n      - pattern: other.test\n"
)

// svcSandbox is one sandbox of a service test's config.
type svcSandbox struct{ name, subnet, policy string }

// writeSvcConfig writes airlockd's config for world w: its state under
// w.Dir, the world's upstream DNS, extra top-level keys, and sbs.
func writeSvcConfig(t *testing.T, w *testworld.World, path, extra string, sbs ...svcSandbox) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "api_listen: 127.0.0.1:7433\nstate_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\n%[3]s\nsandboxes:\n",
		w.Dir, testworld.DNSAddr, extra)
	for _, s := range sbs {
		fmt.Fprintf(&b, "  - name: %s\n    subnet: %s\n    policy: %s\n", s.name, s.subnet, s.policy)
	}
	write(t, path, b.String())
}

// curlBody fetches url from a member of sandbox sb and returns the body,
// or "" when the fetch failed (refused, reset, HTTP error).
func curlBody(w *testworld.World, cfg, sb, url string) string {
	r := w.Run(cfg, sb, "agent", 20*time.Second, "curl", "-sSf", "-m", "5", url)
	if r.Code != 0 {
		return ""
	}
	return r.Stdout
}

// TestServiceUnitVerifies runs systemd-analyze verify on the unit, with
// ExecStart pointing at a built airlockd, and checks the keys that make it
// a notify service that restarts, starts in the right order and is
// hardened.
func TestServiceUnitVerifies(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Fatalf("systemd-analyze is needed (apt-get install systemd): %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	unit, err := os.ReadFile(filepath.Join(root, "scripts", "airlockd.service"))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(testworld.Binaries(t), "airlockd")
	if !strings.Contains(string(unit), "ExecStart=/usr/local/bin/airlockd ") {
		t.Fatalf("ExecStart does not run /usr/local/bin/airlockd:\n%s", unit)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "airlockd.service")
	write(t, path, strings.ReplaceAll(string(unit), "/usr/local/bin/airlockd", bin))
	cmd := exec.Command("systemd-analyze", "verify", path)
	cmd.Dir = dir
	// verify exits 0 on unknown keys but says so: any output is a failure.
	if out, err := cmd.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}

	keys := map[string][]string{}
	section := ""
	for _, line := range strings.Split(string(unit), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			section = line
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			keys[section+k] = append(keys[section+k], v)
		}
	}
	for _, tt := range []struct{ key, want string }{
		{"[Unit]After", "network-online.target"},
		{"[Unit]Wants", "network-online.target"},
		{"[Unit]Before", "docker.service"},
		{"[Service]Type", "notify"},
		{"[Service]Restart", "on-failure"},
		{"[Service]ExecReload", "/bin/kill -HUP $MAINPID"},
		{"[Service]WatchdogSec", "30s"},
		{"[Service]NoNewPrivileges", "yes"},
		{"[Service]ProtectSystem", "strict"},
		{"[Service]ReadWritePaths", "/var/lib/airlock"},
		{"[Service]StateDirectoryMode", "0700"},
		{"[Service]ProtectHome", "yes"},
		{"[Service]PrivateTmp", "yes"},
		{"[Service]CapabilityBoundingSet", "CAP_NET_ADMIN CAP_NET_BIND_SERVICE CAP_CHOWN CAP_DAC_OVERRIDE"},
		{"[Service]RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"},
		{"[Service]SystemCallFilter", "@system-service"},
		{"[Service]RestrictNamespaces", "yes"},
		{"[Install]WantedBy", "multi-user.target"},
	} {
		if got := keys[tt.key]; len(got) != 1 || got[0] != tt.want {
			t.Errorf("%s = %q, want exactly %q", tt.key, got, tt.want)
		}
	}
	// What systemd itself makes of it: an exposure score of "OK" or better.
	cmd = exec.Command("systemd-analyze", "security", "--offline=yes", path)
	cmd.Dir = dir
	out, _ := cmd.CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for airlockd.service: ([0-9.]+) (\w+)`).FindStringSubmatch(string(out))
	if m == nil || (m[2] != "OK" && m[2] != "SAFE") {
		t.Errorf("systemd-analyze security: %v\n%s", m, out)
	} else {
		t.Logf("exposure %s %s", m[1], m[2])
	}
}

// TestServiceInstall runs make install into a temporary root and checks
// the files and their modes; a second install keeps an edited config;
// uninstall keeps config and state unless PURGE=1.
func TestServiceInstall(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	bin := testworld.Binaries(t)
	dest := t.TempDir()
	make := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("make", append([]string{"-C", root, "--no-print-directory", "DESTDIR=" + dest, "BIN=" + bin, "PREFIX=/opt/al"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("make %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := make("install")
	if !strings.Contains(out, "systemctl enable --now airlockd") {
		t.Errorf("install does not say how to start the service:\n%s", out)
	}
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{
		{"/opt/al/bin/airlockd", 0o755},
		{"/opt/al/bin/airlock", 0o755},
		{"/etc/systemd/system/airlockd.service", 0o644},
		{"/etc/airlock/airlockd.yaml", 0o644},
		{"/var/lib/airlock", 0o700 | os.ModeDir},
	} {
		fi, err := os.Stat(dest + f.path)
		if err != nil {
			t.Errorf("%s: %v", f.path, err)
			continue
		}
		if fi.Mode() != f.mode {
			t.Errorf("%s: mode %v, want %v", f.path, fi.Mode(), f.mode)
		}
	}
	unit, _ := os.ReadFile(dest + "/etc/systemd/system/airlockd.service")
	if !strings.Contains(string(unit), "\nExecStart=/opt/al/bin/airlockd --config /etc/airlock/airlockd.yaml\n") {
		t.Errorf("the installed unit does not run PREFIX/bin/airlockd:\n%s", unit)
	}
	def, _ := exec.Command(filepath.Join(bin, "airlockd"), "--print-default-config").Output()
	conf, _ := os.ReadFile(dest + "/etc/airlock/airlockd.yaml")
	if len(def) == 0 || string(conf) != string(def) {
		t.Errorf("installed config is not the built-in one:\n%s", conf)
	}
	// An existing config is never overwritten.
	write(t, dest+"/etc/airlock/airlockd.yaml", "# mine\n"+string(def))
	if out := make("install"); !strings.Contains(out, "kept") {
		t.Errorf("second install: %s", out)
	}
	if conf, _ := os.ReadFile(dest + "/etc/airlock/airlockd.yaml"); !strings.HasPrefix(string(conf), "# mine\n") {
		t.Errorf("install overwrote an existing config:\n%s", conf)
	}
	write(t, dest+"/var/lib/airlock/token", "t")
	make("uninstall")
	for _, gone := range []string{"/opt/al/bin/airlockd", "/opt/al/bin/airlock", "/etc/systemd/system/airlockd.service"} {
		if _, err := os.Stat(dest + gone); !os.IsNotExist(err) {
			t.Errorf("after uninstall %s: %v", gone, err)
		}
	}
	for _, kept := range []string{"/etc/airlock/airlockd.yaml", "/var/lib/airlock/token"} {
		if _, err := os.Stat(dest + kept); err != nil {
			t.Errorf("uninstall without PURGE removed %s: %v", kept, err)
		}
	}
	make("uninstall", "PURGE=1")
	for _, gone := range []string{"/etc/airlock", "/var/lib/airlock"} {
		if _, err := os.Stat(dest + gone); !os.IsNotExist(err) {
			t.Errorf("after uninstall PURGE=1 %s: %v", gone, err)
		}
	}
}

// notifyListener is the service manager's end of NOTIFY_SOCKET: it
// collects every datagram airlockd sends, and runs onReady when the first
// READY=1 arrives, before it reads on.
type notifyListener struct {
	mu   sync.Mutex
	msgs []string
	seen time.Time // when the last message came
}

func listenNotify(t *testing.T, path string, onReady func()) *notifyListener {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	n := &notifyListener{}
	done := make(chan struct{})
	t.Cleanup(func() { conn.Close(); <-done })
	go func() {
		defer close(done)
		ready := false
		buf := make([]byte, 4096)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				return
			}
			msg := string(buf[:k])
			n.mu.Lock()
			n.msgs = append(n.msgs, msg)
			n.mu.Unlock()
			if !ready && strings.Contains(msg, "READY=1") {
				ready = true
				onReady()
			}
		}
	}()
	return n
}

// count returns how many messages hold field (such as "WATCHDOG=1").
func (n *notifyListener) count(field string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, m := range n.msgs {
		for _, f := range strings.Split(m, "\n") {
			if f == field {
				c++
			}
		}
	}
	return c
}

func (n *notifyListener) all() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.msgs...)
}

func (n *notifyListener) waitFor(t *testing.T, field string, count int) {
	t.Helper()
	if !testenv.Poll(10*time.Second, func() bool { return n.count(field) >= count }) {
		t.Fatalf("no %d× %s within 10 s; got %q", count, field, n.all())
	}
}

// TestServiceNotify gives airlockd a real NOTIFY_SOCKET: READY=1 comes only
// once the rule set exists and the gate answers, WATCHDOG=1 comes every
// WATCHDOG_USEC/2, SIGHUP brings RELOADING=1 then READY=1, and SIGTERM
// STOPPING=1.
func TestServiceNotify(t *testing.T) {
	w := testworld.New(t)
	pol := filepath.Join(w.Dir, "a.yaml")
	write(t, pol, policyAllowed)
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	writeSvcConfig(t, w, cfg, "", svcSandbox{"sva", "10.88.0.0/24", pol})

	var atReady struct {
		table, gate string
		err         error
	}
	ready := make(chan struct{})
	n := listenNotify(t, filepath.Join(w.Dir, "notify.sock"), func() {
		// Checked the moment READY=1 arrives, while airlockd goes on.
		atReady.table, atReady.err = w.HostExec("nft", "list", "table", "inet", "airlock")
		atReady.gate, _ = w.HostExec(os.Args[0], "-test.run=^TestMemberHelper$", "--", "dns", "10.88.0.1:53", "allowed.test")
		close(ready)
	})
	d := w.StartDaemon(cfg, "NOTIFY_SOCKET="+filepath.Join(w.Dir, "notify.sock"), "WATCHDOG_USEC=400000")
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatalf("no READY=1 within 10 s; got %q", n.all())
	}
	if atReady.err != nil || !strings.Contains(atReady.table, "al-sva") {
		t.Errorf("at READY=1 the rule set is missing: %v\n%s", atReady.err, atReady.table)
	}
	if !inFakePool(t, atReady.gate) {
		t.Errorf("at READY=1 the gate does not answer: %q", atReady.gate)
	}
	msgs := n.all()
	if len(msgs) == 0 || !strings.Contains(msgs[0], "STATUS=starting") {
		t.Errorf("the first message is not a starting status: %q", msgs)
	}
	if !strings.Contains(strings.Join(msgs, "\n"), "STATUS=sandboxes: sva; API http://127.0.0.1:7433/") {
		t.Errorf("no status naming the sandboxes: %q", msgs)
	}
	if c := n.count("READY=1"); c != 1 {
		t.Errorf("%d READY=1 before any reload, want 1", c)
	}
	// WATCHDOG_USEC 400 ms: a ping about every 200 ms.
	t0 := time.Now()
	n.waitFor(t, "WATCHDOG=1", 5)
	if el := time.Since(t0); el > 3*time.Second {
		t.Errorf("5 watchdog pings took %v; want one every 200 ms", el)
	}

	d.Signal(syscall.SIGHUP)
	n.waitFor(t, "READY=1", 2)
	msgs = n.all()
	reloading, readyAgain := -1, -1
	for i, m := range msgs {
		if strings.Contains(m, "RELOADING=1") && reloading < 0 {
			reloading = i
		}
		if strings.Contains(m, "READY=1") {
			readyAgain = i
		}
	}
	if reloading < 0 || readyAgain < reloading {
		t.Errorf("SIGHUP: want RELOADING=1 then READY=1; got %q", msgs)
	}

	d.Stop()
	if c := n.count("STOPPING=1"); c != 1 {
		t.Errorf("SIGTERM: %d STOPPING=1, want 1; got %q", c, n.all())
	}
}

// TestServiceReload changes the config and a policy file under a running
// airlockd: SIGHUP brings a new sandbox up, a broken policy file is refused
// with its file and line while the last good policy stays, airlock reload
// takes a sandbox down, and a broken config changes nothing.
func TestServiceReload(t *testing.T) {
	w := testworld.New(t)
	bin := testworld.Binaries(t)
	polA, polB := filepath.Join(w.Dir, "a.yaml"), filepath.Join(w.Dir, "b.yaml")
	write(t, polA, policyAllowed)
	write(t, polB, policyOther)
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	// Polling left out of it: only SIGHUP and airlock reload re-read.
	noPoll := "policy_poll_seconds: 3600"
	sva, svb := svcSandbox{"sva", "10.88.0.0/24", polA}, svcSandbox{"svb", "10.88.1.0/24", polB}
	writeSvcConfig(t, w, cfg, noPoll, sva)
	d := w.StartDaemon(cfg)
	if got := curlBody(w, cfg, "sva", "http://allowed.test/"); got != "internet" {
		t.Fatalf("before reload, sva → allowed.test: %q", got)
	}

	// SIGHUP with a new sandbox in the config brings it up.
	writeSvcConfig(t, w, cfg, noPoll, sva, svb)
	d.Signal(syscall.SIGHUP)
	d.WaitLog("msg=reloaded", 1)
	if got := curlBody(w, cfg, "svb", "http://other.test/"); got != "internet" {
		t.Errorf("after SIGHUP, svb → other.test: %q\n%s", got, d.Log.String())
	}
	if got := curlBody(w, cfg, "svb", "http://allowed.test/"); got != "" {
		t.Errorf("svb's policy lets allowed.test through: %q", got)
	}
	if out, _ := w.HostExec("nft", "list", "table", "inet", "airlock"); !strings.Contains(out, "al-svb") {
		t.Errorf("no rules for svb after SIGHUP:\n%s", out)
	}

	// A broken policy file: refused with file:line, the old policy stays.
	write(t, polA, "sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user:\n      - pattern: \"regex:((\"\n")
	d.Signal(syscall.SIGHUP)
	log := d.WaitLog("msg=reloaded", 2)
	if !strings.Contains(log, "a.yaml:5") {
		t.Errorf("the broken policy's file:line is not in the log:\n%s", log)
	}
	if got := curlBody(w, cfg, "sva", "http://allowed.test/"); got != "internet" {
		t.Errorf("after a broken edit, sva → allowed.test: %q; the last good policy must stay", got)
	}

	cli := func(args ...string) (string, int) {
		out, err := exec.Command("ip", append([]string{"netns", "exec", w.Host, filepath.Join(bin, "airlock")}, append(args, "--config", cfg)...)...).CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return string(out), code
	}
	// airlock reload fails while a policy file is broken, and says where.
	if out, code := cli("reload"); code != 1 || !strings.Contains(out, "a.yaml:5") {
		t.Errorf("airlock reload with a broken policy: %d %s", code, out)
	}
	// Fixed, and svb taken out of the config: airlock reload applies both.
	write(t, polA, policyOther)
	writeSvcConfig(t, w, cfg, noPoll, sva)
	out, code := cli("reload")
	if code != 0 || !regexp.MustCompile(`removed: +svb`).MatchString(out) || !regexp.MustCompile(`policy re-read: +sva`).MatchString(out) {
		t.Errorf("airlock reload: %d %s", code, out)
	}
	if got := curlBody(w, cfg, "sva", "http://other.test/"); got != "internet" {
		t.Errorf("sva's new policy: other.test %q", got)
	}
	if got := curlBody(w, cfg, "sva", "http://allowed.test/"); got != "" {
		t.Errorf("sva's old rule still applies: allowed.test %q", got)
	}
	if out, _ := w.HostExec("ip", "link", "show", "al-svb"); !strings.Contains(out, "does not exist") {
		t.Errorf("svb's bridge is still there: %s", out)
	}
	if out, _ := w.HostExec("nft", "list", "table", "inet", "airlock"); strings.Contains(out, "al-svb") || !strings.Contains(out, "al-sva") {
		t.Errorf("rules after svb was removed:\n%s", out)
	}

	// sva's policy file moves: to a broken one, which leaves sva as it
	// runs, then to a good one, which restarts sva on its bridge.
	polC := filepath.Join(w.Dir, "c.yaml")
	write(t, polC, "sandbox:\n  unknown_action: nonsense\n")
	writeSvcConfig(t, w, cfg, noPoll, svcSandbox{"sva", "10.88.0.0/24", polC})
	if out, code := cli("reload"); code != 1 || !strings.Contains(out, "left as it runs") || !strings.Contains(out, "c.yaml:2") {
		t.Errorf("airlock reload onto a broken policy file: %d %s", code, out)
	}
	if got := curlBody(w, cfg, "sva", "http://other.test/"); got != "internet" {
		t.Errorf("sva after a move onto a broken policy file: other.test %q", got)
	}
	write(t, polC, policyAllowed)
	if out, code := cli("reload"); code != 0 || !regexp.MustCompile(`restarted: +sva`).MatchString(out) {
		t.Errorf("airlock reload onto a new policy file: %d %s", code, out)
	}
	if got := curlBody(w, cfg, "sva", "http://allowed.test/"); got != "internet" {
		t.Errorf("sva with its new policy file: allowed.test %q", got)
	}

	// A config that does not parse changes nothing.
	good, _ := os.ReadFile(cfg)
	write(t, cfg, "sandboxes: [\n")
	if out, code := cli("reload", "--api", "http://127.0.0.1:7433", "--token-file", filepath.Join(w.Dir, "state", "token")); code != 1 || !strings.Contains(out, "airlockd.yaml") || !strings.Contains(out, "stays in force") {
		t.Errorf("airlock reload with a broken config: %d %s", code, out)
	}
	write(t, cfg, string(good)) // for airlock run, not for airlockd
	if got := curlBody(w, cfg, "sva", "http://allowed.test/"); got != "internet" {
		t.Errorf("after a broken config, sva → allowed.test: %q", got)
	}
}

// TestServicePolicyPolling edits a policy file by hand and by rename (as git
// does) under a running airlockd, with no signal: an edit that restricts is
// in force within a few polls; an edit that widens access (here an allow
// rule) is not, and the log says to run airlock reload, which applies it; a
// broken edit is refused with file:line.
func TestServicePolicyPolling(t *testing.T) {
	w := testworld.New(t)
	bin := testworld.Binaries(t)
	pol := filepath.Join(w.Dir, "a.yaml")
	write(t, pol, policyAllowed)
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	writeSvcConfig(t, w, cfg, "policy_poll_seconds: 0.2", svcSandbox{"sva", "10.88.0.0/24", pol})
	d := w.StartDaemon(cfg)
	if got := curlBody(w, cfg, "sva", "http://other.test/"); got != "" {
		t.Fatalf("other.test allowed before the edit: %q", got)
	}
	// By hand, rewritten in place: an allow rule widens access, so the
	// poll leaves it out of force.
	write(t, pol, policyAllowed+"      - pattern: other.test\n")
	log := d.WaitLog("policy file widens access", 1)
	m := regexp.MustCompile(`(?m)^.*policy file widens access.*$`).FindString(log)
	for _, want := range []string{"level=WARN", "sandbox=sva", "a.yaml", "airlock reload", "allow rule added: other.test"} {
		if !strings.Contains(m, want) {
			t.Errorf("the held edit's log line %q lacks %q", m, want)
		}
	}
	// Not a wait: what is checked is that a few more polls (one each
	// 0.2 s) leave the edit out of force, and a poll shows no sign.
	time.Sleep(500 * time.Millisecond)
	if got := curlBody(w, cfg, "sva", "http://other.test/"); got != "" {
		t.Errorf("a widening edit was applied by the poll: other.test %q", got)
	}
	if c := strings.Count(d.Log.String(), "policy file widens access"); c != 1 {
		t.Errorf("the held edit was logged %d times; want once per change", c)
	}
	// A person reloads: applied, and the reload says what widened.
	out, err := exec.Command("ip", "netns", "exec", w.Host, filepath.Join(bin, "airlock"), "reload", "--config", cfg).CombinedOutput()
	if err != nil || !regexp.MustCompile(`widened: +sva: allow rule added: other.test`).MatchString(string(out)) {
		t.Errorf("airlock reload: %v\n%s", err, out)
	}
	if got := curlBody(w, cfg, "sva", "http://other.test/"); got != "internet" {
		t.Errorf("after airlock reload, other.test: %q\n%s", got, d.Log.String())
	}
	// Removing the rule again only restricts: applied by the poll.
	write(t, pol, policyAllowed)
	d.WaitLog("policy file changed; reloaded", 1)
	if got := curlBody(w, cfg, "sva", "http://other.test/"); got != "" {
		t.Errorf("after the rule was removed, other.test: %q", got)
	}
	// As git does: a new file renamed over the old one, here a broken one.
	tmp := pol + ".tmp"
	write(t, tmp, "sandbox:\n  unknown_action: deny\n  network_allowlist: [\n")
	if err := os.Rename(tmp, pol); err != nil {
		t.Fatal(err)
	}
	log = d.WaitLog("policy file changed but refused", 1)
	m = regexp.MustCompile(`(?m)^.*policy file changed but refused.*$`).FindString(log)
	if !strings.Contains(m, "a.yaml:") || !strings.Contains(m, "sandbox=sva") {
		t.Errorf("refusal line %q lacks the sandbox or file:line", m)
	}
	if got := curlBody(w, cfg, "sva", "http://allowed.test/"); got != "internet" {
		t.Errorf("after a broken edit, allowed.test: %q; the last good policy must stay", got)
	}
	// Logged once per change, not once per poll. Not a wait: five polls
	// must pass for the count to mean anything.
	time.Sleep(time.Second)
	if c := strings.Count(d.Log.String(), "policy file changed but refused"); c != 1 {
		t.Errorf("the refusal was logged %d times", c)
	}
}

// TestServiceStopFailsClosed stops airlockd with SIGTERM as systemd does:
// the rules stay and a member gets nothing out; a sandbox dropped from the
// config meanwhile is gone after the next start; after the start traffic
// flows with no manual step.
func TestServiceStopFailsClosed(t *testing.T) {
	w := testworld.New(t)
	polA, polB := filepath.Join(w.Dir, "a.yaml"), filepath.Join(w.Dir, "b.yaml")
	write(t, polA, policyAllowed)
	write(t, polB, policyOther)
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	sva, svb := svcSandbox{"sva", "10.88.0.0/24", polA}, svcSandbox{"svb", "10.88.1.0/24", polB}
	writeSvcConfig(t, w, cfg, "drain_seconds: 1", sva, svb)
	d := w.StartDaemon(cfg)
	if got := curlBody(w, cfg, "sva", "http://allowed.test/"); got != "internet" {
		t.Fatalf("before stop: %q", got)
	}
	reached, queries := len(w.Reached()), len(w.DNS.Queries())

	d.Stop()
	if !strings.Contains(d.Log.String(), "stopping; the rules stay") {
		t.Errorf("no stop line in the log:\n%s", d.Log.String())
	}
	if out, err := w.HostExec("nft", "list", "table", "inet", "airlock"); err != nil || !strings.Contains(out, "al-sva") {
		t.Errorf("after SIGTERM the rules are gone: %v\n%s", err, out)
	}
	helper := []string{os.Args[0], "-test.run=^TestMemberHelper$", "--"}
	for _, argv := range [][]string{
		append(helper, "dns", "10.88.0.1:53", "allowed.test"),
		append(helper, "dns", testworld.DNSAddr+":53", "allowed.test"),
		{"curl", "-sS", "-m", "3", "http://" + testworld.WebAddr + "/"},
		{"curl", "-sS", "-m", "3", "--resolve", "allowed.test:80:" + testworld.WebAddr, "http://allowed.test/"},
	} {
		r := w.Run(cfg, "sva", "agent", 20*time.Second, argv...)
		if r.Code == 0 && strings.TrimSpace(r.Stdout) != "" && !strings.HasPrefix(r.Stdout, "dns failed") {
			t.Errorf("%v with airlockd stopped: %q", argv, r.Stdout)
		}
	}
	// The positive control of the DNS probe: with airlockd back it answers.
	defer func() {
		if r := w.Run(cfg, "sva", "agent", 20*time.Second, append(helper, "dns", "10.88.0.1:53", "allowed.test")...); !inFakePool(t, r.Stdout) {
			t.Errorf("after start the gate does not answer: %q %q", r.Stdout, r.Stderr)
		}
	}()
	if got := w.Reached()[reached:]; len(got) != 0 {
		t.Errorf("with airlockd stopped, reached the internet: %q", got)
	}
	if got := w.DNS.Queries()[queries:]; len(got) != 0 {
		t.Errorf("with airlockd stopped, the upstream DNS saw %v", got)
	}

	// svb leaves the config while airlockd is stopped (an upgrade with a
	// new config); the start removes what is left of it.
	writeSvcConfig(t, w, cfg, "drain_seconds: 1", sva)
	d = w.StartDaemon(cfg)
	if got := curlBody(w, cfg, "sva", "http://allowed.test/"); got != "internet" {
		t.Errorf("after start, sva → allowed.test: %q\n%s", got, d.Log.String())
	}
	if out, _ := w.HostExec("ip", "link", "show", "al-svb"); !strings.Contains(out, "does not exist") {
		t.Errorf("svb's bridge outlived its removal from the config: %s", out)
	}
	if out, _ := w.HostExec("nft", "list", "table", "inet", "airlock"); strings.Contains(out, "al-svb") {
		t.Errorf("svb's rules outlived its removal from the config:\n%s", out)
	}
}

// TestServiceJournalLog runs airlockd with stderr as its JOURNAL_STREAM, as
// systemd does: lines carry a priority prefix and no time, and a denied
// connection is one info line while allowed ones stay quiet, unless
// log_allowed is set.
func TestServiceJournalLog(t *testing.T) {
	w := testworld.New(t)
	pol := filepath.Join(w.Dir, "a.yaml")
	write(t, pol, policyAllowed)
	log := journalRun(t, w, "", pol)
	sc := bufio.NewScanner(strings.NewReader(log))
	prefix := regexp.MustCompile(`^<[3467]>[^ <]`)
	for sc.Scan() {
		if line := sc.Text(); !prefix.MatchString(line) || strings.Contains(line, "time=") || strings.Contains(line, "level=") {
			t.Errorf("not a journal line: %q", line)
		}
	}
	if !regexp.MustCompile(`(?m)^<6>airlockd ready `).MatchString(log) {
		t.Errorf("no info line for ready:\n%s", log)
	}
	if c := len(regexp.MustCompile(`(?m)^<6>connection .*host=other.test .*verdict=deny`).FindAllString(log, -1)); c != 1 {
		t.Errorf("%d info lines for the denied connection, want 1:\n%s", c, log)
	}
	if strings.Contains(log, "host=allowed.test") {
		t.Errorf("allowed traffic is logged by default:\n%s", log)
	}

	log = journalRun(t, w, "log_allowed: true", pol)
	if c := len(regexp.MustCompile(`(?m)^<6>connection .*host=allowed.test .*verdict=allow`).FindAllString(log, -1)); c != 1 {
		t.Errorf("log_allowed: %d info lines for the allowed connection, want 1:\n%s", c, log)
	}
}

// journalRun starts airlockd (config with extra keys, one sandbox sva with
// policy pol) with stderr in a file named by JOURNAL_STREAM, fetches
// allowed.test and other.test from a member, stops it and returns its log.
func journalRun(t *testing.T, w *testworld.World, extra, pol string) string {
	t.Helper()
	bin := testworld.Binaries(t)
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	writeSvcConfig(t, w, cfg, extra, svcSandbox{"sva", "10.88.0.0/24", pol})
	f, err := os.CreateTemp(w.Dir, "journal")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", w.Host, filepath.Join(bin, "airlockd"), "--config", cfg)
	cmd.Env = append(os.Environ(), fmt.Sprintf("JOURNAL_STREAM=%d:%d", st.Dev, st.Ino))
	cmd.Stderr = f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	read := func() string { b, _ := os.ReadFile(f.Name()); return string(b) }
	if !testenv.Poll(15*time.Second, func() bool { return strings.Contains(read(), "airlockd ready") }) {
		t.Fatalf("airlockd not ready:\n%s", read())
	}
	if got := curlBody(w, cfg, "sva", "http://allowed.test/"); got != "internet" {
		t.Errorf("allowed.test: %q", got)
	}
	curlBody(w, cfg, "sva", "http://other.test/")
	// The record of a connection is written just after the client is done.
	testenv.Poll(5*time.Second, func() bool { return strings.Contains(read(), "host=other.test") })
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	return read()
}

// TestServiceStopDrains stops airlockd while a member holds a connection
// open: the connection keeps working for drain_seconds, then is closed,
// and the stop takes about that long.
func TestServiceStopDrains(t *testing.T) {
	w := testworld.New(t)
	pol := filepath.Join(w.Dir, "a.yaml")
	write(t, pol, "sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user:\n      - pattern: ssh.test:22\n")
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	writeSvcConfig(t, w, cfg, "drain_seconds: 2", svcSandbox{"sva", "10.88.0.0/24", pol})
	d := w.StartDaemon(cfg)
	wait := w.Start(cfg, "sva", "agent", 30*time.Second, os.Args[0], "-test.run=^TestMemberHelper$", "--", "hold", "ssh.test:22", "1000")
	// The connection is open once the proxy counts it.
	open := `airlock_open_connections{sandbox="sva"} 1`
	if !testenv.Poll(10*time.Second, func() bool {
		resp, err := w.HostClient().Get("http://127.0.0.1:7433/metrics")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(b), open)
	}) {
		t.Fatalf("the member's connection never opened:\n%s", d.Log.String())
	}
	t0 := time.Now()
	d.Stop()
	took := time.Since(t0)
	t.Logf("stop took %v", took)
	r := wait()
	if !strings.Contains(r.Stdout, "echo ok") || !strings.Contains(r.Stdout, "closed") {
		t.Errorf("the held connection during the drain: %q %q", r.Stdout, r.Stderr)
	}
	if took < 1500*time.Millisecond || took > 4500*time.Millisecond {
		t.Errorf("stop took %v with a connection open; want about drain_seconds (2 s)", took)
	}
}
