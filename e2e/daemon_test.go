package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/sysmon"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
)

// TestWorldServes is the positive control of the leak tests: from the host
// namespace, outside any sandbox, the internet's servers answer and log.
func TestWorldServes(t *testing.T) {
	w := testworld.New(t)
	for _, argv := range [][]string{
		{"curl", "-sS", "-m", "5", "http://" + testworld.WebAddr + "/"},
		{"curl", "-sS", "-m", "5", "--cacert", w.CAFile, "--resolve", "allowed.test:443:" + testworld.WebAddr, "https://allowed.test/"},
		{"dig", "+short", "@" + testworld.DNSAddr, "allowed.test"},
	} {
		out, err := w.HostExec(argv...)
		if err != nil || strings.TrimSpace(out) == "" {
			t.Errorf("%v from the host: %v %q", argv, err, out)
		}
	}
	got := strings.Join(w.Reached(), "\n")
	for _, want := range []string{"http 203.0.113.10:80 ← 203.0.113.254", "https 203.0.113.10:443 ← 203.0.113.254", "GET / host allowed.test sni allowed.test"} {
		if !strings.Contains(got, want) {
			t.Errorf("internet log lacks %q:\n%s", want, got)
		}
	}
	if !w.DNS.Saw("allowed.test") {
		t.Error("internet DNS did not log the query")
	}
}

func TestGateSurvivesMalformedStorm(t *testing.T) {
	w, cfg, _ := setup(t)
	r := w.Run(cfg, sbA, "agent", 60*time.Second, os.Args[0], "-test.run=^TestMemberHelper$", "--", "storm", "10.88.0.1:53", testworld.DNSAddr+":53")
	if !strings.Contains(r.Stdout, "sent") {
		t.Fatalf("storm helper: %q %q", r.Stdout, r.Stderr)
	}
	if r := w.Run(cfg, sbA, "agent", 20*time.Second, "dig", "+short", "+tries=3", "allowed.test"); !inFakePool(t, r.Stdout) {
		t.Errorf("after the storm the gate does not answer: %q %q", r.Stdout, r.Stderr)
	}
	for _, q := range w.DNS.Queries() {
		t.Errorf("the storm reached the upstream: %v", q)
	}
}

func TestDaemonStartErrors(t *testing.T) {
	w := testworld.New(t)
	bin := testworld.Binaries(t)
	bad := filepath.Join(w.Dir, "bad.yaml")
	write(t, bad, "sandboxes:\n  - name: a\n    subnet: 10.88.0.0/24\n  - name: b\n    subnet: 10.88.0.128/25\n")
	out, err := w.HostExec(filepath.Join(bin, "airlockd"), "--config", bad)
	if err == nil || !strings.Contains(out, "overlaps sandboxes[0]") {
		t.Errorf("overlapping subnets: %v %s", err, out)
	}
	badPolicy := filepath.Join(w.Dir, "policy.yaml")
	write(t, badPolicy, "sandbox:\n  unknown_action: perhaps\n")
	cfg := filepath.Join(w.Dir, "cfg.yaml")
	write(t, cfg, fmt.Sprintf("state_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s\"]\nsandboxes:\n  - name: a\n    subnet: 10.88.0.0/24\n    policy: %[3]s\n", w.Dir, testworld.DNSAddr, badPolicy))
	out, err = w.HostExec(filepath.Join(bin, "airlockd"), "--config", cfg)
	if err == nil || !strings.Contains(out, "policy.yaml:2") || !strings.Contains(out, "unknown_action") {
		t.Errorf("bad policy file: %v %s", err, out)
	}
	// Port 53 taken on the host: airlockd names the process holding it.
	write(t, badPolicy, "sandbox:\n  unknown_action: ask\n")
	w.InNetns(w.Host, func() {
		pc, err := net.ListenPacket("udp4", "0.0.0.0:53")
		if err != nil {
			t.Errorf("squat port 53: %v", err)
			return
		}
		t.Cleanup(func() { pc.Close() })
	})
	out, err = w.HostExec(filepath.Join(bin, "airlockd"), "--config", cfg)
	if err == nil || !strings.Contains(out, "port 53 on 10.88.0.1 is taken by") || !strings.Contains(out, fmt.Sprintf("pid %d", os.Getpid())) {
		t.Errorf("port 53 taken: %v %s", err, out)
	}
	// Even when it failed to start, the rules are in place: fail closed.
	if out, err := w.HostExec("nft", "list", "table", "inet", "airlock"); err != nil || !strings.Contains(out, "al-a") {
		t.Errorf("after a failed start the rules are missing: %v %s", err, out)
	}
}

func TestRunExitCodeAndCleanup(t *testing.T) {
	w, cfg, _ := setup(t)
	if r := w.Run(cfg, sbA, "agent", 20*time.Second, "sh", "-c", "exit 7"); r.Code != 7 {
		t.Errorf("exit code %d, want 7 (%s)", r.Code, r.Stderr)
	}
	if r := w.Run(cfg, sbA, "agent", 20*time.Second, "no-such-command-xyz"); r.Code != 127 {
		t.Errorf("missing command: exit %d, want 127", r.Code)
	}
	if r := w.Run(cfg, sbA, "agent", 20*time.Second, "sh", "-c", "cat /proc/self/status | grep -E '^Cap(Eff|Prm|Bnd)'"); strings.Count(r.Stdout, "0000000000000000") != 3 {
		t.Errorf("member capabilities:\n%s", r.Stdout)
	}

	vethCount := func() int {
		out, _ := w.HostExec("ip", "-o", "link", "show", "master", "al-"+sbA)
		return strings.Count(out, "alr")
	}
	// The command is killed: airlock run returns 128+9, and the member's
	// veth and lease are gone.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := w.Command(ctx, cfg, sbA, "agent", "sleep", "61")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return vethCount() == 1 && pgrep("sleep 61") != "" })
	exec.Command("pkill", "-KILL", "-f", "^sleep 61$").Run()
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 137 {
		t.Errorf("airlock run after its command was killed: %v, want exit 137", err)
	}
	waitFor(t, func() bool { return vethCount() == 0 })
	// Leases are named by address (the file "next" holds whose turn it is).
	if leases, _ := filepath.Glob(filepath.Join(w.Dir, "run", "leases", sbA, "*.*.*.*")); len(leases) != 0 {
		t.Errorf("leases left: %v", leases)
	}

	// airlock run itself is killed: the member and all it started die too.
	cmd = w.Command(ctx, cfg, sbA, "agent", "sh", "-c", "sleep 62 & sleep 63")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return vethCount() == 1 && pgrep("sleep 62") != "" && pgrep("sleep 63") != "" })
	cmd.Process.Kill()
	cmd.Wait()
	waitFor(t, func() bool { return pgrep("sleep 62") == "" && pgrep("sleep 63") == "" && vethCount() == 0 })
}

func pgrep(pattern string) string {
	out, _ := exec.Command("pgrep", "-f", "^"+pattern+"$").Output()
	return strings.TrimSpace(string(out))
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "the members and their links", cond)
}

// airlockd runs with the runtime's monitor thread kept out of its deep
// sleep (package sysmon): it started itself again in place, same process,
// arguments and name, with the setting in GODEBUG.
func TestDaemonRunsWithSysmonSetting(t *testing.T) {
	_, cfg, d := setup(t)
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", d.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	var godebug []string
	for kv := range strings.SplitSeq(string(environ), "\x00") {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			godebug = append(godebug, v)
		}
	}
	// airlockd has the test's environment, whose GODEBUG it extends.
	want := sysmon.Setting
	if g := os.Getenv("GODEBUG"); strings.Contains(g, "schedtrace=") {
		want = g
	} else if g != "" {
		want = g + "," + sysmon.Setting
	}
	if len(godebug) != 1 || godebug[0] != want {
		t.Errorf("airlockd's GODEBUG: %q, want %q", godebug, want)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", d.Pid()))
	if args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00"); !slices.Contains(args, cfg) || !strings.HasSuffix(args[0], "airlockd") {
		t.Errorf("airlockd's arguments after starting again: %q", args)
	}
	// The name ps, pgrep and the journal show.
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", d.Pid())); strings.TrimSpace(string(comm)) != "airlockd" {
		t.Errorf("airlockd's process name after starting again: %q", comm)
	}
}
