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
	time.Sleep(300 * time.Millisecond)
	member := w.Start(cfg, "default", "agent", 60*time.Second, "curl", "-sS", "-m", "50", "http://unknown.example/")
	var pid string
	for deadline := time.Now().Add(10 * time.Second); pid == ""; time.Sleep(20 * time.Millisecond) {
		out, _ := cli("pending", "--json")
		var ps []struct{ ID, URL string }
		json.Unmarshal([]byte(out), &ps)
		if len(ps) > 0 {
			pid = ps[0].ID
			if ps[0].URL != "http://unknown.example/" {
				t.Errorf("pending URL %q", ps[0].URL)
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing pending")
		}
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
	if out, code := cli("set", "default", "color", "blue"); code != 1 || !strings.Contains(out, "unknown_action or approval_timeout") {
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
