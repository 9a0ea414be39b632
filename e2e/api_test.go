package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
)

const apiBase = "http://127.0.0.1:7433/api/v1"

// apiSetup runs airlockd with one sandbox named "default", as in the
// README, which asks for unknown hosts (30 s) and allows allowed.test.
func apiSetup(t *testing.T) (*testworld.World, string, *testworld.Daemon, string) {
	w, cfg, d, _, token := policySetup(t, "sandbox:\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n")
	return w, cfg, d, token
}

// policySetup runs airlockd with one sandbox "default" whose policy file
// says policyYAML, and returns the world, the config path, the daemon, the
// policy path and the API token.
func policySetup(t *testing.T, policyYAML string) (*testworld.World, string, *testworld.Daemon, string, string) {
	w := testworld.New(t)
	pol := filepath.Join(w.Dir, "default.yaml")
	write(t, pol, policyYAML)
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	write(t, cfg, fmt.Sprintf("state_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nsandboxes:\n  - name: default\n    subnet: 10.88.0.0/24\n    policy: %[3]s\n",
		w.Dir, testworld.DNSAddr, pol))
	d := w.StartDaemon(cfg)
	token, err := os.ReadFile(filepath.Join(w.Dir, "state", "token"))
	if err != nil {
		t.Fatal(err)
	}
	return w, cfg, d, pol, strings.TrimSpace(string(token))
}

// call sends an API request from the host namespace.
func call(t testing.TB, w *testworld.World, token, method, path, body string) (int, string) {
	t.Helper()
	return callAt(t, w.HostClient(), apiBase, token, method, path, body)
}

// callAt sends an API request to the API at base with client.
func callAt(t testing.TB, client *http.Client, base, token, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func waitPendingAPI(t *testing.T, w *testworld.World, token string) string {
	t.Helper()
	var p []struct{ ID string }
	testenv.WaitFor(t, 10*time.Second, "a pending approval", func() bool {
		_, body := call(t, w, token, "GET", "/sandboxes/default/approvals", "")
		return json.Unmarshal([]byte(body), &p) == nil && len(p) > 0
	})
	return p[0].ID
}

func TestREADMEAPITour(t *testing.T) {
	w, cfg, _, token := apiSetup(t)
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	i, j := strings.Index(s, "<!-- tour:api -->"), strings.Index(s, "<!-- /tour:api -->")
	if i < 0 || j < i {
		t.Fatal("README has no tour:api block")
	}
	block := s[i:j]
	block = block[strings.Index(block, "```sh\n")+6 : strings.LastIndex(block, "```")]

	// The member of the tour's comment, held until the tour lets it through.
	member := w.Start(cfg, "default", "agent", 60*time.Second, "curl", "-sS", "-m", "50", "http://unknown.example/")
	waitPendingAPI(t, w, token)

	cmd := exec.Command("ip", "netns", "exec", w.Host, "bash", "-euo", "pipefail", "-c", block)
	cmd.Dir = w.Dir
	cmd.Env = append(os.Environ(), "TOKEN="+token, "API="+apiBase)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README tour failed: %v\n%s", err, out)
	}
	for _, want := range []string{" session example.com", " user *.example.org", "agent http://unknown.example/ ", "allow_once agent http://unknown.example/"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("tour output lacks %q:\n%s", want, out)
		}
	}
	if r := member(); r.Stdout != "internet" {
		t.Errorf("the held member after allow_once: %q %q", r.Stdout, r.Stderr)
	}
	var har struct {
		Log struct {
			Version string
			Entries []json.RawMessage
		}
	}
	b, _ := os.ReadFile(filepath.Join(w.Dir, "default.har"))
	if err := json.Unmarshal(b, &har); err != nil || har.Log.Version != "1.2" || len(har.Log.Entries) == 0 {
		t.Errorf("default.har: %v %+v", err, har.Log)
	}
	if pol, _ := os.ReadFile(filepath.Join(w.Dir, "default.yaml")); !strings.Contains(string(pol), "*.example.org") {
		t.Errorf("persisted pattern not in the policy file:\n%s", pol)
	}
}

func TestAPIApprovalWithin100ms(t *testing.T) {
	w, cfg, _, token := apiSetup(t)
	req, _ := http.NewRequest("GET", apiBase+"/sandboxes/default/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := w.HostClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	opened := make(chan time.Time, 1)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		approval := false
		for sc.Scan() {
			l := sc.Text()
			approval = approval || l == "event: approval"
			if approval && strings.HasPrefix(l, "data: ") && strings.Contains(l, `"action":"opened"`) {
				opened <- time.Now()
				return
			}
		}
	}()
	member := w.Start(cfg, "default", "agent", 60*time.Second, os.Args[0], "-test.run=^TestMemberHelper$", "--", "timed-get", "http://unknown.example/")
	var seen time.Time
	select {
	case seen = <-opened:
	case <-time.After(15 * time.Second):
		t.Fatal("no approval event on the stream")
	}
	id := waitPendingAPI(t, w, token)
	posted := time.Now()
	if code, body := call(t, w, token, "POST", "/sandboxes/default/approvals/"+id, `{"action": "allow_once"}`); code != 200 {
		t.Fatalf("approve: %d %s", code, body)
	}
	r := member()
	var sent, done int64
	var status int
	for _, l := range strings.Split(r.Stdout, "\n") {
		fmt.Sscanf(l, "sent %d", &sent)
		fmt.Sscanf(l, "done %d %d", &done, &status)
	}
	if sent == 0 || done == 0 || status != 200 {
		t.Fatalf("member: %q %q", r.Stdout, r.Stderr)
	}
	if d := seen.Sub(time.Unix(0, sent)); d > 100*time.Millisecond {
		t.Errorf("the approval appeared on the event stream %v after the request was sent", d)
	}
	if d := time.Unix(0, done).Sub(posted); d > 100*time.Millisecond {
		t.Errorf("the request completed %v after the approving POST", d)
	}
}

func TestAuditAndRulesSurviveKill9(t *testing.T) {
	w, cfg, d, token := apiSetup(t)
	if code, body := call(t, w, token, "POST", "/sandboxes/default/allowlist", `{"pattern": "other.test", "persist": true}`); code != 201 {
		t.Fatalf("add: %d %s", code, body)
	}
	for _, u := range []string{"http://allowed.test/", "http://other.test/"} {
		if r := w.Run(cfg, "default", "agent", 20*time.Second, "curl", "-sSf", u); r.Stdout != "internet" {
			t.Fatalf("%s: %q %q", u, r.Stdout, r.Stderr)
		}
	}
	allowedHosts := func() (map[string]bool, string) {
		_, body := call(t, w, token, "GET", "/sandboxes/default/requests?source=agent", "")
		var got []struct{ Host, Verdict string }
		json.Unmarshal([]byte(body), &got)
		hosts := map[string]bool{}
		for _, e := range got {
			if e.Verdict == "allow" {
				hosts[e.Host] = true
			}
		}
		return hosts, body
	}
	// A connection's record is written when the proxy is done with it,
	// which may be just after curl is: wait until both are listed.
	testenv.WaitFor(t, 5*time.Second, "the records of both connections", func() bool {
		h, _ := allowedHosts()
		return h["allowed.test"] && h["other.test"]
	})
	d.Kill()
	w.StartDaemon(cfg)
	if hosts, body := allowedHosts(); !hosts["allowed.test"] || !hosts["other.test"] {
		t.Errorf("history after kill -9 and restart: %s", body)
	}
	if r := w.Run(cfg, "default", "agent", 20*time.Second, "curl", "-sSf", "http://other.test/"); r.Stdout != "internet" {
		t.Errorf("the persisted pattern does not apply after restart: %q %q", r.Stdout, r.Stderr)
	}
	// The API is not reachable from the sandbox on any host address.
	for _, u := range []string{"http://10.88.0.1:7433/healthz", "http://127.0.0.1:7433/healthz", "http://" + testworld.HostUplink + ":7433/healthz"} {
		if r := w.Run(cfg, "default", "agent", 20*time.Second, "curl", "-sSf", "-m", "5", u); r.Code == 0 {
			t.Errorf("%s reached from the sandbox: %q", u, r.Stdout)
		}
	}
}

func TestAPISandboxLifecycle(t *testing.T) {
	w, cfg, d, token := apiSetup(t)
	code, body := call(t, w, token, "POST", "/sandboxes", `{"name": "made", "subnet": "10.88.7.0/24"}`)
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	if code, body := call(t, w, token, "POST", "/sandboxes", `{"name": "clash", "subnet": "10.88.0.128/25"}`); code != 400 || !strings.Contains(body, "overlaps") {
		t.Errorf("overlapping subnet: %d %s", code, body)
	}
	// The new sandbox cages its members like any other.
	if r := w.Run(cfg, "made", "agent", 20*time.Second, "dig", "+short", "+tries=2", "allowed.test"); !inFakePool(t, r.Stdout) {
		t.Errorf("dig in the new sandbox: %q %q", r.Stdout, r.Stderr)
	}
	if r := w.Run(cfg, "made", "agent", 20*time.Second, "curl", "-sSf", "-m", "5", "http://"+testworld.WebAddr+"/"); r.Code == 0 {
		t.Errorf("raw IP from the new sandbox: %q", r.Stdout)
	}
	// It comes back after a restart.
	d.Kill()
	w.StartDaemon(cfg)
	if _, body := call(t, w, token, "GET", "/sandboxes", ""); !strings.Contains(body, `"name":"made"`) {
		t.Errorf("after restart: %s", body)
	}
	if code, _ := call(t, w, token, "DELETE", "/sandboxes/default", ""); code != 409 {
		t.Errorf("deleting a config-file sandbox: %d, want 409", code)
	}
	if code, body := call(t, w, token, "DELETE", "/sandboxes/made", ""); code != 200 {
		t.Fatalf("delete: %d %s", code, body)
	}
	if out, _ := w.HostExec("ip", "link", "show", "al-made"); !strings.Contains(out, "does not exist") {
		t.Errorf("bridge still there: %s", out)
	}
	if out, _ := w.HostExec("nft", "list", "table", "inet", "airlock"); strings.Contains(out, "al-made") || !strings.Contains(out, "al-default") {
		t.Errorf("rules after delete:\n%s", out)
	}
}

// TestReloadSaysWhatANewPolicyFileWidens: pointing a sandbox at another
// policy file in airlockd's config is a policy edit like any other; the
// reload that applies it lists what it widens, not only "changed".
func TestReloadSaysWhatANewPolicyFileWidens(t *testing.T) {
	w, cfg, _, token := apiSetup(t)
	evil := filepath.Join(w.Dir, "evil.yaml")
	write(t, evil, "sandbox:\n  unknown_action: allow\n  network_allowlist:\n    user:\n      - pattern: evil.test\n")
	old, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	write(t, cfg, strings.Replace(string(old), filepath.Join(w.Dir, "default.yaml"), evil, 1))
	code, body := call(t, w, token, "POST", "/reload", "")
	var res struct{ Changed, Widened []string }
	if err := json.Unmarshal([]byte(body), &res); code != 200 || err != nil {
		t.Fatalf("reload: %d %s", code, body)
	}
	if len(res.Widened) != 1 {
		t.Fatalf("reload widened = %q (changed %q); want what the new policy file widens", res.Widened, res.Changed)
	}
	for _, want := range []string{"default: policy file ", "→ " + evil, "unknown_action: ask → allow", "allow rule added: evil.test"} {
		if !strings.Contains(res.Widened[0], want) {
			t.Errorf("reload widened %q lacks %q", res.Widened[0], want)
		}
	}
}
