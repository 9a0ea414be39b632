package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
)

func TestCLI(t *testing.T) {
	w, cfg, _, _ := apiSetup(t)
	bin := filepath.Join(testworld.Binaries(t), "airlock")
	cli := func(args ...string) (string, int) {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"netns", "exec", w.Host, bin}, append(args, "--config", cfg)...)...).CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return string(out), code
	}
	if out, code := cli("ls"); code != 0 || !strings.Contains(out, "default") || !strings.Contains(out, "10.88.0.0/24") {
		t.Errorf("ls: %d %s", code, out)
	}
	out, code := cli("allow", "default", "x.test", "--save")
	id := regexp.MustCompile(`id ([0-9a-f]{12})`).FindStringSubmatch(out)
	if code != 0 || !strings.Contains(out, "saved to the policy file") || id == nil {
		t.Fatalf("allow --save: %d %s", code, out)
	}
	if out, _ := cli("ls", "default"); !strings.Contains(out, "x.test") || !strings.Contains(out, "allowed.test") {
		t.Errorf("ls default: %s", out)
	}
	if out, code := cli("rm", id[1]); code != 0 || !strings.Contains(out, "removed x.test") {
		t.Errorf("rm: %d %s", code, out)
	}
	if pol, _ := os.ReadFile(filepath.Join(w.Dir, "default.yaml")); strings.Contains(string(pol), "x.test") {
		t.Errorf("x.test still in the policy file:\n%s", pol)
	}
	// Errors say what to do.
	if out, code := cli("allow", "default", "*.com"); code != 1 || !strings.Contains(out, "force") {
		t.Errorf("broad pattern: %d %s", code, out)
	}
	if out, code := cli("ls", "nosuch"); code != 1 || !strings.Contains(out, "sandboxes: default") {
		t.Errorf("wrong sandbox: %d %s", code, out)
	}
	if out, code := cli("approve", "nope"); code != 1 || !strings.Contains(out, "airlock pending") {
		t.Errorf("unknown approval: %d %s", code, out)
	}
	if out, code := cli("allow", "default"); code != 2 || !strings.Contains(out, "usage: airlock allow") {
		t.Errorf("missing argument: %d %s", code, out)
	}

	// Follow the log while a member is held and approved from the CLI.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	follow := exec.CommandContext(ctx, "ip", "netns", "exec", w.Host, bin, "log", "default", "-f", "--config", cfg)
	stdout, _ := follow.StdoutPipe()
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	member := w.Start(cfg, "default", "agent", 60*time.Second, "curl", "-sS", "-m", "50", "http://unknown.example/")
	var ps []struct{ ID, URL string }
	testenv.WaitFor(t, 10*time.Second, "airlock pending to list the held member", func() bool {
		out, _ := cli("pending", "--json")
		json.Unmarshal([]byte(out), &ps)
		return len(ps) > 0
	})
	pid := ps[0].ID
	if ps[0].URL != "http://unknown.example/" {
		t.Errorf("pending URL %q", ps[0].URL)
	}
	if out, code := cli("approve", pid); code != 0 || !strings.Contains(out, "allow_once: default http://unknown.example/") {
		t.Errorf("approve: %d %s", code, out)
	}
	if r := member(); r.Stdout != "internet" {
		t.Errorf("member after approve: %q %q", r.Stdout, r.Stderr)
	}
	var followed []string
	for timeout := time.After(5 * time.Second); ; {
		select {
		case l := <-lines:
			followed = append(followed, l)
		case <-timeout:
			t.Fatalf("log -f printed %q", followed)
		}
		if strings.Contains(strings.Join(followed, "\n"), "allow    connection agent") {
			break
		}
	}
	cancel()
	follow.Wait()

	if out, code := cli("log", "default", "--json", "--limit", "5"); code != 0 || !json.Valid([]byte(strings.SplitN(out, "\n", 2)[0])) {
		t.Errorf("log --json: %d %s", code, out)
	}
	har := filepath.Join(w.Dir, "out.har")
	if out, code := cli("har", "default", "-o", har); code != 0 {
		t.Errorf("har: %d %s", code, out)
	}
	var doc struct{ Log struct{ Version string } }
	if b, _ := os.ReadFile(har); json.Unmarshal(b, &doc) != nil || doc.Log.Version != "1.2" {
		t.Errorf("har file: %s", b)
	}
	if out, _ := cli("ca", "default"); !strings.HasPrefix(out, "-----BEGIN CERTIFICATE-----") {
		t.Errorf("ca: %s", out)
	}

	// Settings: a bad value changes nothing; deny is saved and in force.
	pol := filepath.Join(w.Dir, "default.yaml")
	before, _ := os.ReadFile(pol)
	if out, code := cli("set", "default", "approval_timeout", "0"); code != 1 || !strings.Contains(out, "from 1 to 600") {
		t.Errorf("set approval_timeout 0: %d %s", code, out)
	}
	if out, code := cli("set", "default", "color", "blue"); code != 1 || !strings.Contains(out, "unknown_action, approval_timeout, learn_until or presets") {
		t.Errorf("set color: %d %s", code, out)
	}
	if after, _ := os.ReadFile(pol); string(after) != string(before) {
		t.Errorf("refused settings changed the file:\n%s", after)
	}
	if out, code := cli("set", "default", "unknown_action", "deny"); code != 0 || !strings.Contains(out, "unknown_action deny") {
		t.Errorf("set unknown_action deny: %d %s", code, out)
	}
	if after, _ := os.ReadFile(pol); !strings.Contains(string(after), "\n  unknown_action: deny\n") {
		t.Errorf("policy file after set:\n%s", after)
	}
	if r := w.Run(cfg, "default", "agent", 20*time.Second, "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "http://api.unknown.test/"); r.Stdout != "403" {
		t.Errorf("unknown host after set deny: %q %q", r.Stdout, r.Stderr)
	}
}

// TestBuiltInConfigSave runs the README's `airlock allow … --save` line
// against airlockd's built-in config, as a newcomer does right after `make
// run`: the sandbox's policy file (state_dir/sandboxes/default.yaml) is
// created at start with the package-managers preset, and saving a rule
// adds to it. Then it checks what
// `make run` says about an unknown host. Only the paths and the upstream
// DNS are moved into the test's own directory.
func TestBuiltInConfigSave(t *testing.T) {
	w := testworld.New(t)
	bin := testworld.Binaries(t)
	def, err := exec.Command(filepath.Join(bin, "airlockd"), "--print-default-config").Output()
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(def)
	for _, r := range []struct{ key, value string }{
		{"state_dir:", w.Dir + "/state"},
		{"run_dir:", w.Dir + "/run"},
		{"upstream_dns:", `["` + testworld.DNSAddr + `:53"]`},
	} {
		re := regexp.MustCompile(`(?m)^` + r.key + `.*$`)
		if !re.MatchString(cfg) {
			t.Fatalf("the built-in config has no %s line:\n%s", r.key, cfg)
		}
		cfg = re.ReplaceAllString(cfg, r.key+" "+r.value)
	}
	cfgPath := filepath.Join(w.Dir, "airlockd.yaml")
	write(t, cfgPath, cfg)
	w.StartDaemon(cfgPath)

	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^sudo bin/(airlock allow default \S+ --save)`).FindSubmatch(readme)
	if line == nil {
		t.Fatal("the README has no `sudo bin/airlock allow default HOST --save` line")
	}
	args := append(strings.Fields(string(line[1]))[1:], "--config", cfgPath)
	out, err := exec.Command("ip", append([]string{"netns", "exec", w.Host, filepath.Join(bin, "airlock")}, args...)...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "saved to the policy file") {
		t.Fatalf("%s: %v\n%s", line[1], err, out)
	}
	pol, err := os.ReadFile(filepath.Join(w.Dir, "state", "sandboxes", "default.yaml"))
	if host := strings.Fields(string(line[1]))[3]; err != nil || !strings.Contains(string(pol), host) || !strings.Contains(string(pol), "  presets: [package-managers]\n") {
		t.Errorf("policy file after %s: %v\n%s", line[1], err, pol)
	}

	// The README's presets and learn mode lines, as written.
	block := string(readme)
	if i := strings.Index(block, "### Presets and learn mode"); i >= 0 {
		block = block[i:]
		if j := strings.Index(block, "\n## "); j >= 0 {
			block = block[:j]
		}
	}
	lines := regexp.MustCompile(`(?m)^sudo bin/(airlock [^#\n]*?)\s*(#.*)?$`).FindAllStringSubmatch(block, -1)
	if len(lines) < 3 {
		t.Fatalf("the README's presets and learn mode section has %d airlock lines, want 3", len(lines))
	}
	for _, l := range lines {
		args := append(strings.Fields(l[1])[1:], "--config", cfgPath)
		if out, err := exec.Command("ip", append([]string{"netns", "exec", w.Host, filepath.Join(bin, "airlock")}, args...)...).CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", l[1], err, out)
		}
	}
	if pol, err := os.ReadFile(filepath.Join(w.Dir, "state", "sandboxes", "default.yaml")); err != nil || !strings.Contains(string(pol), "python") || !strings.Contains(string(pol), "learn") {
		t.Errorf("policy file after the README's presets and learn lines: %v\n%s", err, pol)
	}
	if _, err := exec.Command("ip", "netns", "exec", w.Host, filepath.Join(bin, "airlock"), "set", "default", "unknown_action", "ask", "--config", cfgPath).CombinedOutput(); err != nil {
		t.Fatalf("set unknown_action ask: %v", err)
	}

	// What `make run` tells the user about an unknown host is what
	// happens: it is held until someone decides, then refused with a 403.
	script, err := os.ReadFile("../scripts/run.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*bin/airlock run --sandbox default -- (curl [^#]*?)\s*# (.*)$`).FindSubmatch(script)
	if m == nil || !strings.Contains(string(m[2]), "held") {
		t.Fatalf("scripts/run.sh shows no curl line that says the request is held: %q", m)
	}
	done := w.Start(cfgPath, "default", "", 20*time.Second, strings.Fields(string(m[1]))...)
	token, err := os.ReadFile(filepath.Join(w.Dir, "state", "token"))
	if err != nil {
		t.Fatal(err)
	}
	id := waitPendingAPI(t, w, strings.TrimSpace(string(token)))
	if code, body := call(t, w, strings.TrimSpace(string(token)), "POST", "/sandboxes/default/approvals/"+id, `{"action": "deny"}`); code != 200 {
		t.Fatalf("deny %s: %d %s", id, code, body)
	}
	if r := done(); !strings.Contains(r.Stdout, "airlock blocked this request") {
		t.Errorf("%s after a denial: %+v", m[1], r)
	}
}
