package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
)

// TestRunHidesDaemonState checks what an `airlock run` member, here uid 0
// without capabilities, can touch of airlockd's files: not the token, CA
// keys and leases (STATE_DIR and RUN_DIR are empty to it but for its CA
// bundle), and no sandbox's policy file for writing; the sandbox CA still
// works. Nothing of it shows in the host's mounts.
func TestRunHidesDaemonState(t *testing.T) {
	w, cfg, _ := setup(t)
	state, run := filepath.Join(w.Dir, "state"), filepath.Join(w.Dir, "run")
	token := filepath.Join(state, "token")
	key := filepath.Join(state, "ca", sbC, "ca.key")
	bundle := filepath.Join(state, "ca", sbC, "bundle.pem")
	// The positive control: they are there for the host.
	for _, f := range []string{token, bundle} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("the host lacks %s: %v", f, err)
		}
	}
	member := func(script string) (string, int) {
		t.Helper()
		r := w.Run(cfg, sbC, "agent", 20*time.Second, "sh", "-c", script)
		return r.Stdout + r.Stderr, r.Code
	}
	if out, code := member("id -u; cat " + token); code == 0 {
		t.Errorf("a member read the token: %q", out)
	}
	if out, code := member("cat " + key + " " + filepath.Join(state, "ca", sbA, "ca.key")); code == 0 {
		t.Errorf("a member read a CA key: %q", out)
	}
	if out, _ := member("ls -A " + state + "; echo --; ls -A " + run + "; echo --; ls -A " + filepath.Join(state, "ca")); out != "ca\n--\n--\n"+sbC+"\n" {
		t.Errorf("a member sees in STATE_DIR, RUN_DIR, STATE_DIR/ca: %q; want only its CA bundle's path", out)
	}
	if out, code := member("touch " + filepath.Join(state, "x")); code == 0 || !strings.Contains(out, "Read-only file system") {
		t.Errorf("a member wrote into the hidden STATE_DIR (exit %d): %q", code, out)
	}

	// Its own policy file and another sandbox's: read-only.
	for _, pol := range []string{filepath.Join(w.Dir, "c.yaml"), filepath.Join(w.Dir, "app.yaml")} {
		before, _ := os.ReadFile(pol)
		out, code := member("echo '      - pattern: evil.test' >> " + pol)
		if code == 0 || !strings.Contains(out, "Read-only file system") {
			t.Errorf("a member appended to %s (exit %d): %q", pol, code, out)
		}
		if out, code := member("grep -c pattern " + pol); code != 0 || out == "0\n" {
			t.Errorf("a member cannot read %s: %d %q", pol, code, out)
		}
		if after, _ := os.ReadFile(pol); string(after) != string(before) {
			t.Errorf("%s changed:\n%s", pol, after)
		}
	}

	// The CA bundle stays at its path, read-only, and trusted.
	if out, code := member(`test "$SSL_CERT_FILE" = ` + bundle + ` && grep -c "BEGIN CERTIFICATE" "$SSL_CERT_FILE"`); code != 0 || out == "0\n" {
		t.Errorf("the CA bundle in the member: %d %q", code, out)
	}
	if out, code := member("echo x >> " + bundle); code == 0 {
		t.Errorf("a member appended to the CA bundle: %q", out)
	}
	if r := runC(t, w, cfg, "curl", "-sS", "https://api.allowed.test/v1/x"); r.Code != 0 || r.Stdout != "internet" {
		t.Errorf("intercepted HTTPS with the sandbox CA: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}

	// Nothing propagated to the host.
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(mi), "airlock-hidden") || strings.Contains(string(mi), w.Dir) {
		t.Errorf("the member's mounts show on the host (%v):\n%s", err, mi)
	}
	if out, err := w.HostExec("cat", "/proc/self/mountinfo"); err != nil || strings.Contains(out, "airlock-hidden") {
		t.Errorf("the member's mounts show in the host namespace (%v):\n%s", err, out)
	}
}

// TestRunRefusesWithoutHiddenState: when STATE_DIR cannot be hidden (here
// it is a file), airlock run refuses to start the member rather than run
// it with airlockd's state in reach.
func TestRunRefusesWithoutHiddenState(t *testing.T) {
	w, cfg, _ := setup(t)
	good, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(w.Dir, "state-file")
	write(t, notDir, "")
	bad := filepath.Join(w.Dir, "bad.yaml")
	write(t, bad, strings.Replace(string(good), "state_dir: "+w.Dir+"/state", "state_dir: "+notDir, 1))
	r := w.Run(bad, sbC, "agent", 20*time.Second, "echo", "ran")
	if r.Code == 0 || strings.Contains(r.Stdout, "ran") || !strings.Contains(r.Stderr, "hide "+notDir+" from the member: not a directory") {
		t.Errorf("airlock run with state_dir a file: exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
	}
}

// TestRunScrubsAirlockEnv: `airlock run` passes the caller's environment to
// the member, but none of airlock's own variables: the API token a caller
// exported (AIRLOCK_TOKEN) and the ways to the daemon (AIRLOCK_API,
// AIRLOCK_CONFIG, AIRLOCK_TOKEN_FILE) never reach a member, which could
// send them to any allowed host.
func TestRunScrubsAirlockEnv(t *testing.T) {
	w, cfg, _ := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := w.Command(ctx, cfg, sbC, "agent", "env")
	cmd.Env = append(os.Environ(), "AIRLOCK_TOKEN=sekrit-token", "AIRLOCK_API=http://127.0.0.1:7433", "AIRLOCK_TOKEN_FILE="+filepath.Join(w.Dir, "state", "token"),
		"airlock_token=sekrit-lower", "FOO=bar")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("airlock run env: %v\n%s", err, out)
	}
	env := string(out)
	if !strings.Contains(env, "\nFOO=bar\n") {
		t.Errorf("the caller's FOO=bar did not reach the member:\n%s", env)
	}
	for _, line := range strings.Split(env, "\n") {
		name, _, _ := strings.Cut(line, "=")
		if strings.Contains(line, "sekrit") || strings.HasPrefix(strings.ToUpper(name), "AIRLOCK_") && name != "AIRLOCK_SANDBOX" {
			t.Errorf("the member's environment holds %q", line)
		}
	}
}

// TestRunCannotRewriteTheConfig: a member running as uid 0 (it owns root's
// files) cannot write airlockd's config file, rename another file over it,
// or add one beside it, so it cannot point a sandbox at a policy of its own
// for the next reload; the host's file is unchanged.
func TestRunCannotRewriteTheConfig(t *testing.T) {
	w, cfg, _ := setup(t)
	before, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(cfg)
	for _, script := range []string{
		"echo 'sandboxes: []' > " + cfg,
		"echo '# x' >> " + cfg,
		"echo 'sandboxes: []' > " + dir + "/evil.yaml",
		"cp " + cfg + " /tmp/evil.yaml && mv /tmp/evil.yaml " + cfg,
		"mv " + cfg + " " + cfg + ".old",
		"rm -f " + cfg,
		"ln -sf /tmp/evil.yaml " + cfg,
		"touch -d 2001-01-01 " + cfg,
	} {
		r := w.Run(cfg, sbC, "agent", 20*time.Second, "sh", "-c", "id -u; "+script)
		if r.Code == 0 || r.Stdout != "0\n" {
			t.Errorf("a uid-0 member ran %q: exit %d, %q %q", script, r.Code, r.Stdout, r.Stderr)
		}
	}
	after, err := os.ReadFile(cfg)
	if err != nil || string(after) != string(before) {
		t.Errorf("the config file changed (%v):\n%s", err, after)
	}
	if _, err := os.Stat(filepath.Join(dir, "evil.yaml")); err == nil {
		t.Errorf("a member wrote beside the config file")
	}
}

// TestLimitsKeepSandboxesApart: a member of one sandbox that opens far more
// connections than its limit gets exactly its limit, and a member of
// another sandbox is served all the while.
func TestLimitsKeepSandboxesApart(t *testing.T) {
	w := testworld.New(t)
	polA, polB := filepath.Join(w.Dir, "a.yaml"), filepath.Join(w.Dir, "b.yaml")
	write(t, polA, "sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user:\n      - pattern: \"ssh.test:22\"\n")
	write(t, polB, "sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n")
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	write(t, cfg, fmt.Sprintf("state_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nlimits:\n  member_connections: 3\n  sandbox_connections: 5\nsandboxes:\n"+
		"  - name: lima\n    subnet: 10.88.0.0/24\n    policy: %[3]s\n  - name: limb\n    subnet: 10.88.1.0/24\n    policy: %[4]s\n", w.Dir, testworld.DNSAddr, polA, polB))
	d := w.StartDaemon(cfg)
	holder := w.Start(cfg, "lima", "hog", 40*time.Second, os.Args[0], "-test.run=^TestMemberHelper$", "--", "holdmany", "ssh.test:22", "20", "4")
	// Once the hog holds what it may, the other sandbox is still served.
	if !testenv.Poll(20*time.Second, func() bool { return strings.Contains(d.Log.String(), "connection refused: limit reached") }) {
		t.Fatalf("the hog was never refused:\n%s", d.Log.String())
	}
	if r := w.Run(cfg, "limb", "agent", 20*time.Second, "curl", "-sS", "-m", "10", "http://allowed.test/"); r.Stdout != "internet" {
		t.Errorf("the other sandbox while one is at its limit: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if r := holder(); !strings.Contains(r.Stdout, "held 3 refused 17") {
		t.Errorf("the hog: %q %q; want exactly its limit of 3 held", r.Stdout, r.Stderr)
	}
	if n := strings.Count(d.Log.String(), "connection refused: limit reached"); n != 1 {
		t.Errorf("%d log lines for 17 refusals, want 1 per interval", n)
	}
}
