package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
	"github.com/airlockhq/airlock/ui"
)

// memberAPISetup runs airlockd with sandbox "default" (10.88.0.0/24,
// asking, 60 s to decide) and sandbox "other" (10.88.1.0/24).
func memberAPISetup(t *testing.T) (*testworld.World, string, *testworld.Daemon, string) {
	w := testworld.New(t)
	pol := filepath.Join(w.Dir, "default.yaml")
	write(t, pol, "sandbox:\n  approval_timeout: 60\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n")
	other := filepath.Join(w.Dir, "other.yaml")
	write(t, other, "sandbox:\n  unknown_action: deny\n")
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	write(t, cfg, fmt.Sprintf("state_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nsandboxes:\n  - name: default\n    subnet: 10.88.0.0/24\n    policy: %[3]s\n  - name: other\n    subnet: 10.88.1.0/24\n    policy: %[4]s\n",
		w.Dir, testworld.DNSAddr, pol, other))
	d := w.StartDaemon(cfg)
	token, err := os.ReadFile(filepath.Join(w.Dir, "state", "token"))
	if err != nil {
		t.Fatal(err)
	}
	return w, cfg, d, strings.TrimSpace(string(token))
}

// ask is the member's side of the member API: curl POSTing body.
func ask(query, body string) []string {
	return []string{"curl", "-sS", "-m", "90", "-w", "\n%{http_code}", "-H", "Content-Type: application/json", "-d", body, "http://airlock.internal/v1/requests" + query}
}

// answer reads what ask printed: the JSON answer and the status.
func answer(t *testing.T, r testworld.Result) (map[string]any, int) {
	t.Helper()
	out := strings.TrimSpace(r.Stdout)
	i := strings.LastIndexByte(out, '\n')
	body, code, ok := strings.TrimSpace(out[:max(i, 0)]), out[i+1:], i > 0
	status, err := strconv.Atoi(code)
	var a map[string]any
	if !ok || err != nil || json.Unmarshal([]byte(body), &a) != nil {
		t.Fatalf("member API answer %q (stderr %q)", r.Stdout, r.Stderr)
	}
	return a, status
}

func approvals(t *testing.T, w *testworld.World, token string) []ui.ApprovalView {
	t.Helper()
	_, body := call(t, w, token, "GET", "/sandboxes/default/approvals", "")
	var out []ui.ApprovalView
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("approvals: %v %s", err, body)
	}
	return out
}

func TestMemberAPI(t *testing.T) {
	w, cfg, _, token := memberAPISetup(t)

	t.Run("airlock.internal resolves to the gateway, nothing under it", func(t *testing.T) {
		r := w.Run(cfg, "default", "agent", 20*time.Second, "dig", "+short", "+tries=1", "AirLock.Internal.")
		if strings.TrimSpace(r.Stdout) != "10.88.0.1" {
			t.Errorf("dig airlock.internal: %q %q", r.Stdout, r.Stderr)
		}
		r = w.Run(cfg, "other", "agent", 20*time.Second, "dig", "+short", "+tries=1", "airlock.internal")
		if strings.TrimSpace(r.Stdout) != "10.88.1.1" {
			t.Errorf("dig airlock.internal in sandbox other: %q %q", r.Stdout, r.Stderr)
		}
		for _, q := range [][]string{{"x.airlock.internal"}, {"TXT", "a.b.airlock.internal"}} {
			r = w.Run(cfg, "default", "agent", 20*time.Second, append([]string{"dig", "+tries=1"}, q...)...)
			if !strings.Contains(r.Stdout, "status: NXDOMAIN") {
				t.Errorf("dig %v: want NXDOMAIN, got\n%s", q, r.Stdout)
			}
		}
		if r = w.Run(cfg, "default", "agent", 20*time.Second, "dig", "+tries=1", "AAAA", "airlock.internal"); !strings.Contains(r.Stdout, "status: NOERROR") || !strings.Contains(r.Stdout, "ANSWER: 0") {
			t.Errorf("AAAA: want no data, got\n%s", r.Stdout)
		}
		for _, q := range w.DNS.Queries() {
			if strings.Contains(strings.ToLower(q.Name), "airlock") {
				t.Errorf("the upstream saw %v", q)
			}
		}
	})

	t.Run("a network request, approved with a pattern", func(t *testing.T) {
		member := w.Start(cfg, "default", "agent", 90*time.Second, ask("", `{"kind":"network","url":"http://api.unknown.test/v1/","reason":"fetch \u001b[31mdata\nnow"}`)...)
		var p ui.ApprovalView
		testenv.WaitFor(t, 20*time.Second, "the member's request among the approvals", func() bool {
			ps := approvals(t, w, token)
			if len(ps) == 1 {
				p = ps[0]
			}
			return len(ps) == 1
		})
		if p.Kind != "network" || !p.Requested || p.Source != "agent" || p.URL != "http://api.unknown.test/v1/" || p.Reason != "fetch [31mdata now" ||
			strings.Join(p.Actions, ",") != "deny,allow_pattern" {
			t.Errorf("approval = %+v", p)
		}
		if code, body := call(t, w, token, "POST", "/sandboxes/default/approvals/"+p.ID, `{"action": "allow_once"}`); code != 400 {
			t.Errorf("allow_once on a network request: %d %s", code, body)
		}
		if code, body := call(t, w, token, "POST", "/sandboxes/default/approvals/"+p.ID, `{"action": "allow_pattern", "pattern": "api.unknown.test"}`); code != 200 {
			t.Fatalf("allow_pattern: %d %s", code, body)
		}
		a, status := answer(t, member())
		if status != 200 || a["id"] != p.ID || a["status"] != "approved" || a["rule"] != "api.unknown.test" {
			t.Errorf("the member's answer: %d %v", status, a)
		}
		if r := w.Run(cfg, "default", "agent", 20*time.Second, "curl", "-sS", "-m", "10", "http://api.unknown.test/"); r.Stdout != "internet" {
			t.Errorf("after the approval: %q %q", r.Stdout, r.Stderr)
		}
	})

	t.Run("a port request, polled, visible to its member only", func(t *testing.T) {
		a, status := answer(t, w.Run(cfg, "default", "agent", 20*time.Second, ask("?wait=0", `{"kind":"port","port":8080,"reason":"preview the app"}`)...))
		id, _ := a["id"].(string)
		if status != 202 || a["status"] != "pending" || id == "" {
			t.Fatalf("POST wait=0: %d %v", status, a)
		}
		ps := approvals(t, w, token)
		if len(ps) != 1 || ps[0].ID != id || ps[0].Kind != "port" || ps[0].Port != 8080 || ps[0].Source != "agent" || strings.Join(ps[0].Actions, ",") != "deny,allow" {
			t.Errorf("approvals = %+v", ps)
		}
		poll := func(source string) (map[string]any, int) {
			return answer(t, w.Run(cfg, "default", source, 20*time.Second, "curl", "-sS", "-m", "10", "-w", "\n%{http_code}", "http://airlock.internal/v1/requests/"+id))
		}
		if a, status := poll("agent"); status != 200 || a["status"] != "pending" {
			t.Errorf("poll: %d %v", status, a)
		}
		if _, status := poll("intruder"); status != 404 {
			t.Errorf("another member's poll: %d, want 404", status)
		}
		// Nothing under airlock.internal lists, approves or reaches the
		// control API.
		for _, try := range [][]string{
			{"curl", "-sS", "-m", "10", "-w", "\n%{http_code}", "http://airlock.internal/v1/requests"},
			{"curl", "-sS", "-m", "10", "-w", "\n%{http_code}", "-X", "POST", "-H", "Content-Type: application/json", "-d", `{"action":"allow"}`, "http://airlock.internal/v1/requests/" + id},
			{"curl", "-sS", "-m", "10", "-w", "\n%{http_code}", "-H", "Authorization: Bearer " + token, "http://airlock.internal/api/v1/sandboxes/default/approvals"},
		} {
			if _, status := answer(t, w.Run(cfg, "default", "agent", 20*time.Second, try...)); status != 405 && status != 404 {
				t.Errorf("%v: %d", try, status)
			}
		}
		if code, body := call(t, w, token, "POST", "/sandboxes/default/approvals/"+id, `{"action": "deny"}`); code != 200 {
			t.Fatalf("deny: %d %s", code, body)
		}
		if a, status := poll("agent"); status != 200 || a["status"] != "denied" {
			t.Errorf("poll after the denial: %d %v", status, a)
		}
	})

	t.Run("resources of an airlock run member: refused without asking", func(t *testing.T) {
		a, status := answer(t, w.Run(cfg, "default", "agent", 20*time.Second, ask("", `{"kind":"resources","memory_mb":1024,"reason":"more"}`)...))
		if status != 403 || a["status"] != "refused" || !strings.Contains(fmt.Sprint(a["detail"]), "only Docker members") {
			t.Errorf("= %d %v", status, a)
		}
		if ps := approvals(t, w, token); len(ps) != 0 {
			t.Errorf("approvals = %+v", ps)
		}
	})

	t.Run("only the own gateway's port 80, in plain HTTP", func(t *testing.T) {
		for _, try := range []struct {
			args []string
			want string // in the output
		}{
			{[]string{"curl", "-sS", "-m", "10", "https://airlock.internal/v1/requests/x"}, "curl: ("},
			{[]string{"curl", "-sS", "-m", "10", "http://airlock.internal:8080/v1/requests/x"}, "airlock's member API, served only at http://airlock.internal/"},
			{[]string{"curl", "-sS", "-m", "10", "http://10.88.1.1/v1/requests/x"}, "403"},
			{[]string{"curl", "-sS", "-m", "10", "-H", "Host: airlock.internal", "http://10.88.1.1/v1/requests/x"}, "airlock's member API, served only"},
			{[]string{"curl", "-sS", "-m", "10", "http://10.88.0.1:7433/api/v1/sandboxes"}, "403"},
		} {
			r := w.Run(cfg, "default", "agent", 20*time.Second, append(try.args[:len(try.args):len(try.args)], "-w", "%{http_code}")...)
			if got := r.Stdout + r.Stderr; !strings.Contains(got, try.want) {
				t.Errorf("%v: %q, want %q", try.args, got, try.want)
			}
		}
	})
}

// A flood of 1,000 requests from one member leaves the approvals list
// usable, each refusal logged once per interval, and airlockd's memory
// bounded.
func TestMemberAPIFlood(t *testing.T) {
	w, cfg, d, token := memberAPISetup(t)
	rss := func() int {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				n, _ := strconv.Atoi(f[1])
				return n
			}
		}
		t.Fatal("no VmRSS")
		return 0
	}
	// One curl, 1,000 requests for 1,000 ports, one after the other.
	var conf strings.Builder
	for i := range 1000 {
		if i > 0 {
			conf.WriteString("next\n")
		}
		fmt.Fprintf(&conf, "url = \"http://airlock.internal/v1/requests?wait=0\"\noutput = \"/dev/null\"\nheader = \"Content-Type: application/json\"\n"+
			"data = \"{\\\"kind\\\":\\\"port\\\",\\\"port\\\":%d,\\\"reason\\\":\\\"flood\\\"}\"\nwrite-out = \"%%{http_code}\\n\"\n", 10000+i)
	}
	confFile := filepath.Join(w.Dir, "flood.conf")
	write(t, confFile, conf.String())
	before := rss()
	start := time.Now()
	r := w.Run(cfg, "default", "agent", 120*time.Second, "curl", "-s", "-K", confFile)
	took := time.Since(start)
	codes := map[string]int{}
	for _, c := range strings.Fields(r.Stdout) {
		codes[c]++
	}
	if codes["202"] != 4 || codes["429"] != 996 {
		t.Fatalf("statuses %v, want 4 accepted (a member's open requests) and 996 refused (%s %s)", codes, r.Stderr, took)
	}
	t.Logf("1,000 requests in %s: %v", took.Round(time.Millisecond), codes)
	if ps := approvals(t, w, token); len(ps) != 4 {
		t.Errorf("approvals after the flood = %+v, want 4", ps)
	}
	if lines := strings.Count(d.Log.String(), "member request refused"); lines < 1 || lines > int(took/(10*time.Second))+1 {
		t.Errorf("%d refusal lines in %s, want one per 10 s", lines, took)
	}
	if grew := rss() - before; grew > 32<<10 {
		t.Errorf("airlockd grew by %d KiB in the flood", grew)
	}
	// The list is usable: another member's request comes, and a person
	// decides both.
	member := w.Start(cfg, "default", "mcp:github", 60*time.Second, ask("", `{"kind":"network","url":"https://other.test/","reason":"clone"}`)...)
	var other ui.ApprovalView
	testenv.WaitFor(t, 20*time.Second, "the other member's request", func() bool {
		for _, p := range approvals(t, w, token) {
			if p.Source == "mcp:github" {
				other = p
				return true
			}
		}
		return false
	})
	if code, body := call(t, w, token, "POST", "/sandboxes/default/approvals/"+other.ID, `{"action": "deny"}`); code != 200 {
		t.Fatalf("deny: %d %s", code, body)
	}
	if a, status := answer(t, member()); status != 200 || a["status"] != "denied" {
		t.Errorf("the other member: %d %v", status, a)
	}
}

// TestDockerMemberResources: a Docker member (a FROM scratch image) asks
// through airlock.internal for more memory and a CPU within the bounds; a
// person approves through the API; the engine reads the new limits back.
// One beyond the bounds is refused without an approval.
func TestDockerMemberResources(t *testing.T) {
	w := rootWorld(t)
	probeImage(t)
	const (
		api     = "http://127.0.0.1:7534/api/v1"
		sb      = "e2e-mreq"
		agent   = "e2e-mreq-agent"
		network = "airlock-" + sb
	)
	pol := filepath.Join(w.Dir, "mreq.yaml")
	write(t, pol, "sandbox:\n  approval_timeout: 60\n  resources:\n    bounds:\n      memory_mb: {min: 256, max: 2048}\n")
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	write(t, cfg, fmt.Sprintf("api_listen: 127.0.0.1:7534\nstate_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nsandboxes:\n  - name: %[3]s\n    subnet: 10.89.73.0/24\n    policy: %[4]s\n",
		w.Dir, testworld.DNSAddr, sb, pol))
	var d *testworld.Daemon
	t.Cleanup(func() {
		exec.Command("docker", "rm", "-f", agent).Run()
		exec.Command("docker", "network", "rm", network).Run()
		if d != nil {
			if out, err := d.Teardown(); err != nil {
				t.Errorf("teardown: %v\n%s", err, out)
			}
		}
	})
	d = w.StartRootDaemon(cfg)
	tok, err := os.ReadFile(filepath.Join(w.Dir, "state", "token"))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tok))
	pending := func() []ui.ApprovalView {
		_, body := callAt(t, http.DefaultClient, api, token, "GET", "/sandboxes/"+sb+"/approvals", "")
		var out []ui.ApprovalView
		if err := json.Unmarshal([]byte(body), &out); err != nil {
			t.Fatalf("approvals: %v %s", err, body)
		}
		return out
	}
	if out, err := docker(t, "run", "-d", "--name", agent, "--network", network, "--label", "airlock.source=agent", "--memory", "512m", dkImage, "sleep", "300"); err != nil {
		t.Fatal(out)
	}
	inspect := func() string {
		out, err := docker(t, "inspect", "-f", "{{.HostConfig.Memory}} {{.HostConfig.NanoCpus}}", agent)
		if err != nil {
			t.Fatal(out)
		}
		return strings.TrimSpace(out)
	}
	if got := inspect(); got != "536870912 0" {
		t.Fatalf("limits before: %s", got)
	}
	ask := func(body string) string {
		out, _ := docker(t, "exec", "-e", "PROBE_TIMEOUT=90", agent, "/probe", "post", "http://airlock.internal/v1/requests", body)
		return strings.TrimSpace(out)
	}

	// Beyond the bounds: refused at once, nobody asked.
	if out := ask(`{"kind":"resources","memory_mb":4096,"reason":"more"}`); !strings.HasPrefix(out, "status 403") || !strings.Contains(out, `"status":"refused"`) || !strings.Contains(out, "memory_mb 4096 is outside 256 to 2048") {
		t.Errorf("beyond the bounds: %s", out)
	}
	if ps := pending(); len(ps) != 0 {
		t.Errorf("approvals after a refused request: %+v", ps)
	}

	done := make(chan string, 1)
	go func() {
		done <- ask(`{"kind":"resources","memory_mb":1024,"cpus":1,"reason":"the build runs out of memory"}`)
	}()
	var p ui.ApprovalView
	testenv.WaitFor(t, 20*time.Second, "the member's resources request", func() bool {
		ps := pending()
		if len(ps) == 1 {
			p = ps[0]
		}
		return len(ps) == 1
	})
	if p.Kind != "resources" || p.Source != "agent" || p.MemoryMB != 1024 || p.CPUs != 1 || p.Reason != "the build runs out of memory" {
		t.Errorf("approval = %+v", p)
	}
	if got := inspect(); got != "536870912 0" {
		t.Errorf("limits changed before the approval: %s", got)
	}
	if status, body := callAt(t, http.DefaultClient, api, token, "POST", "/sandboxes/"+sb+"/approvals/"+p.ID, `{"action":"allow"}`); status != 200 {
		t.Fatalf("allow: %d %s", status, body)
	}
	select {
	case out := <-done:
		if !strings.HasPrefix(out, "status 200") || !strings.Contains(out, `"status":"approved"`) {
			t.Errorf("the member's answer: %s", out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the member got no answer")
	}
	if got := inspect(); got != "1073741824 1000000000" {
		t.Errorf("limits after the approval: %s, want 1 GiB and 1 CPU", got)
	}
	d.WaitLog("approval decided", 1)
}
