package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/airlockhq/airlock/internal/testworld"
)

// presetSetup is policySetup without the daemon.
func presetSetup(t *testing.T, policyYAML string) (*testworld.World, string, string, string) {
	w, cfg, _, pol, token := policySetup(t, policyYAML)
	return w, cfg, pol, token
}

// TestPresetPythonReadOnly: a member of a sandbox with presets: [python]
// fetches the test world's pypi stand-ins with GET and HEAD, no approval
// asked, and cannot POST to them: 403 naming the preset's rule.
func TestPresetPythonReadOnly(t *testing.T) {
	w, cfg, _, token := presetSetup(t, "sandbox:\n  unknown_action: ask\n  approval_timeout: 3\n  presets: [python]\n")
	r := w.Run(cfg, "default", "agent", 30*time.Second, "sh", "-c",
		`curl -sS -m 10 http://pypi.org/simple/requests/ && echo && `+
			`curl -sS -m 10 -o /dev/null -w '%{http_code}\n' -I http://files.pythonhosted.org/packages/x.whl && `+
			`curl -sS -m 10 -X POST --data 'name=secret' http://pypi.org/legacy/`)
	lines := strings.SplitN(r.Stdout, "\n", 3)
	if len(lines) != 3 || lines[0] != "internet" || lines[1] != "200" {
		t.Fatalf("GET and HEAD through the preset: %q %q", r.Stdout, r.Stderr)
	}
	post := lines[2]
	for _, want := range []string{"airlock blocked this request", "POST http://pypi.org/legacy/", "GET pypi.org", "preset python", "reading only"} {
		if !strings.Contains(post, want) {
			t.Errorf("the 403 for a POST lacks %q:\n%s", want, post)
		}
	}
	// Nothing was asked, and the upload never reached the registry.
	code, body := call(t, w, token, "GET", "/sandboxes/default/requests?kind=approval", "")
	if code != 200 || body != "[]\n" {
		t.Errorf("approvals: %d %s", code, body)
	}
	for _, l := range w.Reached() {
		if strings.Contains(l, "POST") {
			t.Errorf("the registry saw a POST: %s", l)
		}
	}
	// The API and airlock ls label the preset's rules.
	_, body = call(t, w, token, "GET", "/sandboxes/default/allowlist", "")
	if !strings.Contains(body, `"pattern":"GET pypi.org","type":"method","tier":"preset","list":"allowlist","source":"preset:python"`) {
		t.Errorf("allowlist: %s", body)
	}
	out, err := cli(t, w, cfg, "ls", "default")
	if err != nil || !strings.Contains(out, "preset") || !strings.Contains(out, "preset:python") {
		t.Errorf("airlock ls default: %v\n%s", err, out)
	}
}

// cli runs the airlock command in the host namespace.
func cli(t *testing.T, w *testworld.World, cfg string, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(testworld.Binaries(t), "airlock")
	out, err := exec.Command("ip", append([]string{"netns", "exec", w.Host, bin}, append(args, "--config", cfg)...)...).CombinedOutput()
	return string(out), err
}

// TestLearnThenAsk: a scripted member fetches a set of hosts in learn mode;
// the proposal is exactly the expected patterns; saved, and the sandbox
// back to ask, the same script runs with no approval, and a host it never
// used is held.
func TestLearnThenAsk(t *testing.T) {
	w, cfg, pol, token := presetSetup(t, "sandbox:\n  unknown_action: ask\n  approval_timeout: 3\n")
	if out, err := cli(t, w, cfg, "set", "default", "unknown_action", "learn"); err != nil || !strings.Contains(out, "unknown_action learn (") {
		t.Fatalf("set learn: %v %s", err, out)
	}
	if out, _ := cli(t, w, cfg, "ls"); !strings.Contains(out, "learn (") || !strings.Contains(out, "m left") {
		t.Errorf("airlock ls while learning:\n%s", out)
	}
	script := strings.Join([]string{
		"curl -sS -m 10 http://a.cdn.test/assets/x",
		"curl -sS -m 10 http://b.cdn.test/assets/y",
		"curl -sS -m 10 http://c.cdn.test/assets/z",
		"curl -sS -m 10 http://pkgs.test/simple/requests/",
		"curl -sS -m 10 http://pkgs.test/simple/flask/",
		"curl -sS -m 10 --cacert " + w.CAFile + " https://other.test/",
	}, " && echo && ") + " && echo"
	want := strings.Repeat("internet\n", 6)
	if r := w.Run(cfg, "default", "agent", 60*time.Second, "sh", "-c", script); r.Stdout != want {
		t.Fatalf("learning run: %q %q", r.Stdout, r.Stderr)
	}
	_, body := call(t, w, token, "GET", "/sandboxes/default/requests?verdict=learned&kind=request", "")
	if n := strings.Count(body, `"verdict":"learned"`); n != 5 {
		t.Errorf("%d learned requests, want 5: %s", n, body)
	}

	code, body := call(t, w, token, "GET", "/sandboxes/default/proposal?since=1h", "")
	var pv struct {
		Patterns []struct {
			Pattern, Member string
			CoveredBy       string `json:"covered_by"`
			Flags           []string
		}
	}
	if code != 200 || json.Unmarshal([]byte(body), &pv) != nil {
		t.Fatalf("proposal: %d %s", code, body)
	}
	var got []string
	for _, p := range pv.Patterns {
		got = append(got, fmt.Sprintf("%s member=%s covered=%q flags=%d", p.Pattern, p.Member, p.CoveredBy, len(p.Flags)))
	}
	wantPatterns := []string{
		`*.cdn.test/assets/* member=agent covered="" flags=0`,
		`other.test member=agent covered="" flags=0`,
		`pkgs.test/simple/* member=agent covered="" flags=0`,
	}
	if diff := cmp.Diff(wantPatterns, got); diff != "" {
		t.Fatalf("proposal (-want +got):\n%s\n%s", diff, body)
	}

	out, err := cli(t, w, cfg, "propose", "default", "--since", "1h", "--save")
	if err != nil || !strings.Contains(out, "saved 3 patterns") {
		t.Fatalf("airlock propose --save: %v\n%s", err, out)
	}
	text, _ := os.ReadFile(pol)
	for _, s := range []string{`pattern: "*.cdn.test/assets/*"`, `pattern: "pkgs.test/simple/*"`, `pattern: "other.test"`, `member: "agent"`, `source: "learned ` + time.Now().UTC().Format("2006-01-02")} {
		if !strings.Contains(string(text), s) {
			t.Errorf("policy file lacks %s:\n%s", s, text)
		}
	}
	if out, err := cli(t, w, cfg, "set", "default", "unknown_action", "ask"); err != nil || !strings.Contains(out, "unknown_action ask") {
		t.Fatalf("set ask: %v %s", err, out)
	}
	asked := time.Now()
	if r := w.Run(cfg, "default", "agent", 60*time.Second, "sh", "-c", script); r.Stdout != want {
		t.Errorf("the same script after saving: %q %q", r.Stdout, r.Stderr)
	}
	since := asked.UTC().Format(time.RFC3339)
	if _, body := call(t, w, token, "GET", "/sandboxes/default/requests?kind=approval&since="+since, ""); body != "[]\n" {
		t.Errorf("approvals asked for the same script: %s", body)
	}
	// A host the script never used is held.
	done := w.Start(cfg, "default", "agent", 30*time.Second, "curl", "-sS", "-m", "20", "-o", "/dev/null", "-w", "%{http_code}", "http://unknown.example/")
	id := waitPendingAPI(t, w, token)
	if code, body := call(t, w, token, "POST", "/sandboxes/default/approvals/"+id, `{"action": "deny"}`); code != 200 {
		t.Errorf("deny: %d %s", code, body)
	}
	if r := done(); r.Stdout != "403" {
		t.Errorf("the held host after a denial: %+v", r)
	}
}
