package ui

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/policy"
)

type testSandbox struct {
	name    string
	pol     *policy.Sandbox
	broker  *policy.Broker
	journal *audit.Journal
}

func (s *testSandbox) Name() string            { return s.name }
func (s *testSandbox) Subnet() string          { return "10.88.0.0/24" }
func (s *testSandbox) Policy() *policy.Sandbox { return s.pol }
func (s *testSandbox) Broker() *policy.Broker  { return s.broker }
func (s *testSandbox) Journal() *audit.Journal { return s.journal }
func (s *testSandbox) CAPEM() []byte           { return []byte("-----BEGIN CERTIFICATE-----\n") }

type apiHarness struct {
	srv    *Server
	ts     *httptest.Server
	sb     *testSandbox
	policy string
}

func newAPI(t testing.TB, policyYAML string) *apiHarness {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "app.yaml")
	if policyYAML != "" {
		os.WriteFile(path, []byte(policyYAML), 0o644)
	}
	pol, err := policy.OpenSandbox(policy.SandboxConfig{Name: "myapp", Path: path})
	if err != nil {
		t.Fatal(err)
	}
	j, err := audit.Open(audit.Config{Dir: filepath.Join(dir, "audit")})
	if err != nil {
		t.Fatal(err)
	}
	br, _ := policy.NewBroker(policy.BrokerConfig{Sandbox: pol, OnEvent: func(e policy.BrokerEvent) {
		j.Add(audit.Entry{Kind: audit.KindApproval, Sandbox: "myapp", Host: e.Pending.Host, ApprovalID: e.Pending.ID, Action: e.Kind})
	}})
	sb := &testSandbox{name: "myapp", pol: pol, broker: br, journal: j}
	srv, err := New(Config{Listen: "127.0.0.1:0", TokenFile: filepath.Join(dir, "token"), Sandboxes: func() []Sandbox { return []Sandbox{sb} }})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); j.Close() })
	return &apiHarness{srv: srv, ts: ts, sb: sb, policy: path}
}

// do sends a request with the token and returns the status and body.
// reroute rebuilds the server's routes after a test changed its config.
func (h *apiHarness) reroute() {
	h.srv.e = h.srv.routes()
	h.ts.Config.Handler = h.srv.e
}

func (h *apiHarness) do(t testing.TB, method, path, body string) (int, string) {
	t.Helper()
	return h.doAs(t, "", method, path, body)
}

// doAs is do with host as the request's Host ("": the server's address).
func (h *apiHarness) doAs(t testing.TB, host, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, h.ts.URL+path, strings.NewReader(body))
	req.Host = host
	req.Header.Set("Authorization", "Bearer "+h.srv.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestTokenFileIsPrivate(t *testing.T) {
	h := newAPI(t, "")
	fi, err := os.Stat(h.srv.cfg.TokenFile)
	if err != nil || fi.Mode().Perm() != 0o600 || len(h.srv.Token()) != 64 {
		t.Errorf("token file %v %v, token %q", fi, err, h.srv.Token())
	}
	// The same token on the next start.
	again, err := New(Config{Listen: "127.0.0.1:0", TokenFile: h.srv.cfg.TokenFile, Sandboxes: func() []Sandbox { return nil }})
	if err != nil || again.Token() != h.srv.Token() {
		t.Errorf("token changed across restarts: %v", err)
	}
	os.Chmod(h.srv.cfg.TokenFile, 0o644)
	if _, err := New(Config{Listen: "127.0.0.1:0", TokenFile: h.srv.cfg.TokenFile, Sandboxes: func() []Sandbox { return nil }}); err == nil {
		t.Error("a world-readable token file was accepted")
	}
}

func TestAuth(t *testing.T) {
	h := newAPI(t, "")
	get := func(path string, set func(*http.Request)) int {
		req, _ := http.NewRequest("GET", h.ts.URL+path, nil)
		if set != nil {
			set(req)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := get("/healthz", nil); c != 200 {
		t.Errorf("/healthz without token: %d", c)
	}
	if c := get("/api/v1/sandboxes", nil); c != 401 {
		t.Errorf("no token: %d, want 401", c)
	}
	if c := get("/api/v1/sandboxes", func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") }); c != 401 {
		t.Errorf("wrong token: %d, want 401", c)
	}
	code, body := h.do(t, "GET", "/api/v1/sandboxes/nosuch/allowlist", "")
	if code != 404 || !strings.Contains(body, `"hint":"sandboxes: myapp"`) {
		t.Errorf("wrong sandbox: %d %s", code, body)
	}
	// Login: cookie, and mutations need the CSRF header.
	resp, err := http.Post(h.ts.URL+"/api/v1/login", "application/json", strings.NewReader(`{"token":"`+h.srv.Token()+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	var login struct{ CSRF string }
	json.NewDecoder(resp.Body).Decode(&login)
	resp.Body.Close()
	ck := resp.Cookies()
	if len(ck) != 1 || !ck[0].HttpOnly || ck[0].SameSite != http.SameSiteStrictMode || login.CSRF == "" {
		t.Fatalf("login cookie %+v csrf %q", ck, login.CSRF)
	}
	withCookie := func(r *http.Request) { r.AddCookie(ck[0]) }
	if c := get("/api/v1/sandboxes", withCookie); c != 200 {
		t.Errorf("GET with the session cookie: %d", c)
	}
	post := func(csrf string) int {
		req, _ := http.NewRequest("POST", h.ts.URL+"/api/v1/sandboxes/myapp/allowlist", strings.NewReader(`{"pattern":"a.test"}`))
		withCookie(req)
		if csrf != "" {
			req.Header.Set(csrfHeader, csrf)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := post(""); c != 403 {
		t.Errorf("cookie mutation without CSRF header: %d, want 403", c)
	}
	if c := post(login.CSRF); c != 201 {
		t.Errorf("cookie mutation with CSRF header: %d, want 201", c)
	}
	if resp, _ := http.Post(h.ts.URL+"/api/v1/login", "application/json", strings.NewReader(`{"token":"wrong"}`)); resp.StatusCode != 401 {
		t.Errorf("login with a wrong token: %d", resp.StatusCode)
	}
}

func TestRulesThroughTheAPI(t *testing.T) {
	h := newAPI(t, "name: myapp  # stays\nsandbox:\n  mcp_servers:\n    - name: github\n")
	code, body := h.do(t, "POST", "/api/v1/sandboxes/myapp/allowlist", `{"pattern": "*.example.com", "persist": true}`)
	if code != 201 {
		t.Fatalf("add: %d %s", code, body)
	}
	var r RuleView
	json.Unmarshal([]byte(body), &r)
	file, _ := os.ReadFile(h.policy)
	if !strings.Contains(string(file), `pattern: "*.example.com"`) || !strings.Contains(string(file), "name: myapp  # stays") {
		t.Errorf("policy file after add:\n%s", file)
	}
	code, body = h.do(t, "GET", "/api/v1/sandboxes/myapp/allowlist", "")
	var list []RuleView
	json.Unmarshal([]byte(body), &list)
	tiers := map[string]int{}
	for _, x := range list {
		tiers[x.Tier]++
	}
	if code != 200 || tiers["auto"] != 2 || tiers["user"] != 1 {
		t.Errorf("list: %d %s", code, body)
	}
	// Session rule, then delete both; auto rules are read-only.
	h.do(t, "POST", "/api/v1/sandboxes/myapp/allowlist", `{"pattern": "session.test"}`)
	if code, _ := h.do(t, "DELETE", "/api/v1/sandboxes/myapp/allowlist/"+r.ID, ""); code != 200 {
		t.Errorf("delete: %d", code)
	}
	if file, _ := os.ReadFile(h.policy); strings.Contains(string(file), "example.com") {
		t.Errorf("deleted rule still in the file:\n%s", file)
	}
	for _, x := range list {
		if x.Tier == "auto" {
			if code, body := h.do(t, "DELETE", "/api/v1/sandboxes/myapp/allowlist/"+x.ID, ""); code != 409 {
				t.Errorf("delete auto: %d %s", code, body)
			}
		}
	}
	// Denylist.
	if code, body := h.do(t, "POST", "/api/v1/sandboxes/myapp/denylist", `{"pattern": "pastebin.com", "persist": true}`); code != 201 {
		t.Errorf("deny: %d %s", code, body)
	}
	if file, _ := os.ReadFile(h.policy); !strings.Contains(string(file), "network_denylist") {
		t.Errorf("deny not saved:\n%s", file)
	}
	// The journal records rule changes.
	if got := h.sb.journal.Query(audit.Filter{Kinds: []string{audit.KindRule}}); len(got) != 4 {
		t.Errorf("rule entries: %+v", got)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	h := newAPI(t, "")
	before := len(h.sb.pol.Rules())
	tests := []struct {
		name, method, path, body string
		code                     int
		want                     string
	}{
		{"unknown field", "POST", "/api/v1/sandboxes/myapp/allowlist", `{"pattern": "a.test", "persit": true}`, 400, "unknown field"},
		{"not json", "POST", "/api/v1/sandboxes/myapp/allowlist", `pattern=a.test`, 400, "bad JSON"},
		{"two objects", "POST", "/api/v1/sandboxes/myapp/allowlist", `{"pattern":"a.test"}{"pattern":"b.test"}`, 400, "data after the JSON value"},
		{"a stray brace after the object", "POST", "/api/v1/sandboxes/myapp/allowlist", `{"pattern":"a.test"}}`, 400, "data after the JSON value"},
		{"array", "POST", "/api/v1/sandboxes/myapp/allowlist", `[{"pattern":"a.test"}]`, 400, "bad JSON"},
		{"no pattern", "POST", "/api/v1/sandboxes/myapp/allowlist", `{}`, 400, "no pattern"},
		{"bad pattern", "POST", "/api/v1/sandboxes/myapp/allowlist", `{"pattern": "api.*.example.com"}`, 400, "regex"},
		{"broad", "POST", "/api/v1/sandboxes/myapp/allowlist", `{"pattern": "*.com"}`, 400, "force"},
		{"oversized", "POST", "/api/v1/sandboxes/myapp/allowlist", `{"pattern": "` + strings.Repeat("a", MaxBody) + `"}`, 413, "too large"},
		{"traversal sandbox", "GET", "/api/v1/sandboxes/..%2f..%2fetc/allowlist", "", 404, "no sandbox"},
		{"traversal id", "DELETE", "/api/v1/sandboxes/myapp/allowlist/..%2f..%2fetc%2fpasswd", "", 404, "no rule"},
		{"bad action", "POST", "/api/v1/sandboxes/myapp/approvals/x", `{"action": "maybe"}`, 400, "unknown action"},
		{"no approval", "POST", "/api/v1/sandboxes/myapp/approvals/x", `{"action": "deny"}`, 404, "no pending approval"},
		{"bad limit", "GET", "/api/v1/sandboxes/myapp/requests?limit=-1", "", 400, "limit"},
		{"bad since", "GET", "/api/v1/sandboxes/myapp/requests?since=yesterday", "", 400, "since"},
		{"control chars", "POST", "/api/v1/sandboxes/myapp/allowlist", `{"pattern": "a.test", "member": "x\ny"}`, 400, "control"},
		{"member with a space", "POST", "/api/v1/sandboxes/myapp/allowlist", `{"pattern": "a.test", "member": "my agent", "persist": true}`, 400, "space"},
		{"no route", "GET", "/api/v2/anything", "", 404, "/api/v1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := h.do(t, tt.method, tt.path, tt.body)
			if code != tt.code || !strings.Contains(body, tt.want) || !strings.Contains(body, `"error"`) {
				t.Errorf("%d %s; want %d with %q in a JSON error", code, body, tt.code, tt.want)
			}
		})
	}
	if n := len(h.sb.pol.Rules()); n != before {
		t.Errorf("bad input changed the rules: %d → %d", before, n)
	}
	if _, err := os.Stat(h.policy); err == nil {
		t.Error("bad input created the policy file")
	}
}

func TestPatternTest(t *testing.T) {
	h := newAPI(t, "")
	h.sb.journal.Add(audit.Entry{Kind: audit.KindConnection, Sandbox: "myapp", Host: "api.unknown.com", Port: 443})
	h.sb.journal.Add(audit.Entry{Kind: audit.KindRequest, Sandbox: "myapp", Method: "GET", URL: "https://cdn.unknown.com/api/v2/files"})
	code, body := h.do(t, "POST", "/api/v1/sandboxes/myapp/allowlist/test",
		`{"pattern": "*.unknown.com/api/v*", "urls": ["https://api.unknown.com/api/v1/data", "https://cdn.unknown.com/api/v2/files", "https://api.unknown.com/other/path", "ftp://x"]}`)
	var out struct {
		Valid    bool
		Results  []TestResult
		Recorded int `json:"recorded_matches"`
	}
	json.Unmarshal([]byte(body), &out)
	if code != 200 || !out.Valid || len(out.Results) != 4 || !out.Results[0].Matches || !out.Results[1].Matches || out.Results[2].Matches || out.Results[3].Error == "" {
		t.Errorf("%d %s", code, body)
	}
	// The connection to api.unknown.com (no path known) matches the host
	// part; the request to /api/v2/files matches in full.
	if out.Recorded != 2 {
		t.Errorf("recorded matches = %d, want 2", out.Recorded)
	}
	_, body = h.do(t, "POST", "/api/v1/sandboxes/myapp/allowlist/test", `{"pattern": "*.com", "urls": []}`)
	if !strings.Contains(body, `"broad":true`) || !strings.Contains(body, `"valid":false`) {
		t.Errorf("broad pattern test: %s", body)
	}
}

func TestApprovalsThroughTheAPI(t *testing.T) {
	h := newAPI(t, "sandbox:\n  approval_timeout: 30\n")
	done := make(chan policy.Outcome, 1)
	go func() {
		done <- h.sb.broker.Ask(context.Background(), policy.AskRequest{Source: "agent", Host: "api.unknown.com", Port: 443})
	}()
	var list []ApprovalView
	testenv.WaitFor(t, 5*time.Second, "the pending approval to be listed", func() bool {
		_, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/approvals", "")
		json.Unmarshal([]byte(body), &list)
		return len(list) > 0
	})
	p := list[0]
	if p.Host != "api.unknown.com" || p.Source != "agent" || p.SecondsLeft <= 25 || len(p.Suggestions) != 4 {
		t.Errorf("approval = %+v", p)
	}
	start := time.Now()
	code, body := h.do(t, "POST", "/api/v1/sandboxes/myapp/approvals/"+p.ID, `{"action": "allow_pattern", "pattern": "*.unknown.com", "persist": true}`)
	if code != 200 {
		t.Fatalf("decide: %d %s", code, body)
	}
	if o := <-done; !o.Allowed || time.Since(start) > 100*time.Millisecond {
		t.Errorf("outcome %+v after %v", o, time.Since(start))
	}
	if file, _ := os.ReadFile(h.policy); !strings.Contains(string(file), "*.unknown.com") {
		t.Errorf("pattern not saved:\n%s", file)
	}
}

// Members' requests are in the same approvals list, with their kind, their
// member, reason and values, and the actions they take; an action of
// another kind is a 400 that decides nothing.
func TestApprovalKindsThroughTheAPI(t *testing.T) {
	h := newAPI(t, "sandbox:\n  approval_timeout: 30\n")
	// Port requests say where an allowed one listens: expose_listen.
	h.srv.cfg.Exposures = &fakeExposer{listen: "192.0.2.7"}
	port, err := h.sb.broker.Request(policy.AskRequest{Kind: policy.AskPort, Source: "agent", Port: 8080, Reason: "preview \u202eppa"})
	if err != nil {
		t.Fatal(err)
	}
	host, p, url, _ := policy.RequestedURL("https://pypi.org/simple/")
	netReq, err := h.sb.broker.Request(policy.AskRequest{Kind: policy.AskNetwork, Source: "agent", Host: host, Port: p, URL: url, Reason: "pip"})
	if err != nil {
		t.Fatal(err)
	}
	code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/approvals", "")
	var list []ApprovalView
	if err := json.Unmarshal([]byte(body), &list); err != nil || code != 200 || len(list) != 2 {
		t.Fatalf("%d %s", code, body)
	}
	byID := map[string]ApprovalView{list[0].ID: list[0], list[1].ID: list[1]}
	pv, nv := byID[port.ID()], byID[netReq.ID()]
	if pv.Kind != "port" || !pv.Requested || pv.Port != 8080 || pv.Source != "agent" || pv.Reason != "preview \u202eppa" || strings.Join(pv.Actions, ",") != "deny,allow" || pv.Listen != "192.0.2.7" || nv.Listen != "" {
		t.Errorf("port approval = %+v", pv)
	}
	if nv.Kind != "network" || !nv.Requested || nv.URL != "https://pypi.org/simple/" || strings.Join(nv.Actions, ",") != "deny,allow_pattern" || len(nv.Suggestions) == 0 {
		t.Errorf("network approval = %+v", nv)
	}
	if !strings.Contains(body, `"suggestions":[]`) {
		t.Errorf("a port approval's suggestions are not an empty list: %s", body)
	}
	for _, tt := range []struct{ id, body, want string }{
		{port.ID(), `{"action": "allow_once"}`, "takes deny or allow"},
		{port.ID(), `{"action": "allow_pattern", "pattern": "x.test"}`, "takes deny or allow"},
		{port.ID(), `{"action": "deny", "persist": true}`, "network approvals only"},
		{netReq.ID(), `{"action": "allow_once"}`, "holds no traffic"},
		{netReq.ID(), `{"action": "allow"}`, "takes deny or allow_pattern"},
		{port.ID(), `{"action": "grant"}`, "unknown action"},
	} {
		code, body := h.do(t, "POST", "/api/v1/sandboxes/myapp/approvals/"+tt.id, tt.body)
		if code != 400 || !strings.Contains(body, tt.want) {
			t.Errorf("%s: %d %s, want 400 saying %q", tt.body, code, body, tt.want)
		}
	}
	if n := len(h.sb.broker.List()); n != 2 {
		t.Fatalf("refused actions decided something: %d pending", n)
	}
	// This broker has nothing to carry a port request out with: the
	// person gets a 502 that says so, and so does the member.
	code, body = h.do(t, "POST", "/api/v1/sandboxes/myapp/approvals/"+port.ID(), `{"action": "allow"}`)
	if code != 502 || !strings.Contains(body, "could not be done") {
		t.Errorf("allow: %d %s", code, body)
	}
	if out, done := port.Outcome(); !done || out.Action != "failed" {
		t.Errorf("the member's outcome: %+v %v", out, done)
	}
	code, body = h.do(t, "POST", "/api/v1/sandboxes/myapp/approvals/"+netReq.ID(), `{"action": "allow_pattern", "pattern": "pypi.org"}`)
	if code != 200 || !strings.Contains(body, `"pattern":"pypi.org"`) {
		t.Errorf("allow_pattern: %d %s", code, body)
	}
	if out, done := netReq.Outcome(); !done || !out.Allowed {
		t.Errorf("the member's outcome: %+v %v", out, done)
	}
}

func TestEventsStreamWithin100ms(t *testing.T) {
	h := newAPI(t, "")
	req, _ := http.NewRequest("GET", h.ts.URL+"/api/v1/sandboxes/myapp/events", nil)
	req.Header.Set("Authorization", "Bearer "+h.srv.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("content type %q", resp.Header.Get("Content-Type"))
	}
	r := bufio.NewReader(resp.Body)
	r.ReadString('\n') // the opening comment
	r.ReadString('\n')
	start := time.Now()
	h.sb.journal.Add(audit.Entry{Kind: audit.KindApproval, Sandbox: "myapp", Host: "x.test", Action: "opened"})
	var lines []string
	for len(lines) < 3 {
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, strings.TrimSpace(l))
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("event arrived after %v", d)
	}
	if lines[1] != "event: approval" || !strings.HasPrefix(lines[2], "data: {") || !strings.Contains(lines[2], `"host":"x.test"`) {
		t.Errorf("event = %q", lines)
	}
}

// TestClientEventsReady: an entry added when Events calls ready is on the
// stream, so a caller that reads the history in ready misses nothing
// between the history and the stream (airlock log -f).
func TestClientEventsReady(t *testing.T) {
	h := newAPI(t, "")
	c, err := NewClient(h.ts.URL, h.srv.Token())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []string
	ready := func() error {
		h.sb.journal.Add(audit.Entry{Kind: audit.KindApproval, Sandbox: "myapp", Host: "x.test", Action: "opened"})
		return nil
	}
	err = c.Events(ctx, "myapp", ready, func(e audit.Entry) {
		got = append(got, e.Host)
		cancel()
	})
	if err != nil || len(got) != 1 || got[0] != "x.test" {
		t.Errorf("Events = %v, entries %q; want the entry added in ready", err, got)
	}
	refused := errors.New("no history")
	if err := c.Events(context.Background(), "myapp", func() error { return refused }, func(audit.Entry) {}); err != refused {
		t.Errorf("Events with a failing ready = %v, want its error", err)
	}
}

func TestHARStructure(t *testing.T) {
	h := newAPI(t, "")
	h.sb.journal.Add(audit.Entry{Kind: audit.KindRequest, Sandbox: "myapp", Source: "agent", Method: "GET", URL: "https://api.example.com/v1/x?q=1",
		Status: 200, BytesDown: 8, TTFBMs: 1.5, DurationMs: 2, Proto: "HTTP/2.0", Headers: map[string][]string{"Authorization": {"***"}}, Verdict: "allow", Rule: "api.example.com/v1/*"})
	h.sb.journal.Add(audit.Entry{Kind: audit.KindConnection, Sandbox: "myapp", Source: "mcp:github", Host: "api.github.com", Port: 443, Verdict: "allow", BytesUp: 100, BytesDown: 2000, DurationMs: 50, Upstream: "140.82.0.1:443"})
	code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/requests.har", "")
	if code != 200 {
		t.Fatal(code, body)
	}
	// HAR 1.2: log.version, log.creator{name,version}, log.entries[] with
	// startedDateTime, time, request{method,url,httpVersion,cookies,
	// headers,queryString,headersSize,bodySize}, response{status,
	// statusText,httpVersion,cookies,headers,content{size,mimeType},
	// redirectURL,headersSize,bodySize}, cache, timings{send,wait,receive}.
	var doc map[string]any
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatal(err)
	}
	lg := doc["log"].(map[string]any)
	if lg["version"] != "1.2" || lg["creator"].(map[string]any)["name"] != "airlock" {
		t.Errorf("log = %v", lg)
	}
	entries := lg["entries"].([]any)
	if len(entries) != 2 {
		t.Fatalf("%d entries", len(entries))
	}
	for i, x := range entries {
		e := x.(map[string]any)
		for _, k := range []string{"startedDateTime", "time", "request", "response", "cache", "timings", "_source"} {
			if _, ok := e[k]; !ok {
				t.Errorf("entry %d lacks %s", i, k)
			}
		}
		if _, err := time.Parse(time.RFC3339Nano, e["startedDateTime"].(string)); err != nil {
			t.Errorf("entry %d startedDateTime: %v", i, err)
		}
		req, res := e["request"].(map[string]any), e["response"].(map[string]any)
		for _, k := range []string{"method", "url", "httpVersion", "cookies", "headers", "queryString", "headersSize", "bodySize"} {
			if _, ok := req[k]; !ok {
				t.Errorf("entry %d request lacks %s", i, k)
			}
		}
		for _, k := range []string{"status", "statusText", "httpVersion", "cookies", "headers", "content", "redirectURL", "headersSize", "bodySize"} {
			if _, ok := res[k]; !ok {
				t.Errorf("entry %d response lacks %s", i, k)
			}
		}
		c := res["content"].(map[string]any)
		if _, ok := c["size"]; !ok || c["mimeType"] == nil {
			t.Errorf("entry %d content = %v", i, c)
		}
		tm := e["timings"].(map[string]any)
		for _, k := range []string{"send", "wait", "receive"} {
			if v, ok := tm[k].(float64); !ok || v < -1 {
				t.Errorf("entry %d timings.%s = %v", i, k, tm[k])
			}
		}
	}
	if e := entries[1].(map[string]any); e["request"].(map[string]any)["method"] != "CONNECT" || e["_source"] != "mcp:github" {
		t.Errorf("spliced connection entry = %v", e)
	}
	if e := entries[0].(map[string]any); !strings.Contains(fmt.Sprint(e["request"]), "***") {
		t.Errorf("credentials not masked: %v", e["request"])
	}
}

func TestParallelPersistedAdds(t *testing.T) {
	h := newAPI(t, "name: myapp\n")
	var wg sync.WaitGroup
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, body := h.do(t, "POST", "/api/v1/sandboxes/myapp/allowlist", fmt.Sprintf(`{"pattern": "host-%d.example.com", "persist": true}`, i)); code != 201 {
				t.Errorf("add %d: %d %s", i, code, body)
			}
		}()
	}
	wg.Wait()
	spec, err := policy.LoadSpec(h.policy)
	if err != nil || len(spec.User) != 100 {
		t.Errorf("policy file has %d user rules (%v), want 100", len(spec.User), err)
	}
}

func FuzzAPIBodies(f *testing.F) {
	for _, s := range []string{`{"pattern":"a.test","persist":true}`, `{"action":"allow_once"}`, `{"pattern":"*.x.io","urls":["https://a.x.io/"]}`, `{}`, `[`, `{"pattern":"regex:(a|b"}`} {
		f.Add(s, uint8(0))
	}
	h := newAPI(f, "")
	paths := []string{"/api/v1/sandboxes/myapp/allowlist", "/api/v1/sandboxes/myapp/denylist", "/api/v1/sandboxes/myapp/allowlist/test", "/api/v1/sandboxes/myapp/approvals/x", "/api/v1/login",
		"PATCH /api/v1/sandboxes/myapp/settings", "PUT /api/v1/sandboxes/myapp/allowlist/" + policy.RuleID(policy.Allowlist, mustPattern(f, "a.test"), "")}
	f.Add(`{"unknown_action":"deny","approval_timeout":0}`, uint8(5))
	f.Add(`{"pattern":"b.test"}`, uint8(6))
	f.Fuzz(func(t *testing.T, body string, which uint8) {
		if _, err := h.sb.pol.Add(policy.AddRequest{Pattern: "a.test", List: policy.Allowlist}); err != nil {
			t.Fatal(err)
		}
		before := len(h.sb.pol.Rules())
		spec := h.sb.pol.Spec()
		method, path, ok := strings.Cut(paths[int(which)%len(paths)], " ")
		if !ok {
			method, path = "POST", method
		}
		code, resp := h.do(t, method, path, body)
		if code >= 500 {
			t.Fatalf("%d for %q: %s", code, body, resp)
		}
		if !json.Valid([]byte(resp)) {
			t.Fatalf("response is not JSON: %q", resp)
		}
		if code >= 400 && len(h.sb.pol.Rules()) != before {
			t.Fatalf("a refused body changed the rules: %q", body)
		}
		if after := h.sb.pol.Spec(); code >= 400 && (after.UnknownAction != spec.UnknownAction || after.ApprovalTimeout != spec.ApprovalTimeout) {
			t.Fatalf("a refused body changed the settings: %q", body)
		}
	})
}

func TestUnixSocketAndClient(t *testing.T) {
	h := newAPI(t, "")
	sock := filepath.Join(t.TempDir(), "run", "api.sock")
	srv, err := New(Config{Listen: "unix:" + sock, TokenFile: h.srv.cfg.TokenFile, Sandboxes: h.srv.cfg.Sandboxes})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %v %v, want mode 0600", fi, err)
	}
	c, err := NewClient("unix:"+sock, srv.Token())
	if err != nil {
		t.Fatal(err)
	}
	var sbs []SandboxView
	if err := c.Do(context.Background(), "GET", "/sandboxes", nil, &sbs); err != nil || len(sbs) != 1 || sbs[0].Name != "myapp" {
		t.Errorf("sandboxes over the socket: %+v %v", sbs, err)
	}
	bad, _ := NewClient("unix:"+sock, "wrong")
	var ae *APIError
	if err := bad.Do(context.Background(), "GET", "/sandboxes", nil, nil); !errors.As(err, &ae) || ae.Status != 401 || ae.Hint == "" {
		t.Errorf("wrong token: %v", err)
	}
	if _, err := NewClient("ftp://x", "t"); err == nil {
		t.Error("NewClient accepted ftp://")
	}
}

type fakeManager struct {
	h         *apiHarness
	created   []string
	reloads   int
	reloadErr error
}

func (m *fakeManager) Reload() (ReloadResult, error) {
	if m.reloadErr != nil {
		return ReloadResult{}, m.reloadErr
	}
	m.reloads++
	return ReloadResult{Added: []string{"new"}, Errors: []string{"/p/app.yaml:3: sandbox.unknown_action: want ask, deny or allow"}}, nil
}

func (m *fakeManager) CreateSandbox(name, pol, subnet string) (Sandbox, error) {
	if subnet == "bad" {
		return nil, &ManagerError{Msg: "subnet \"bad\": want an IPv4 prefix"}
	}
	m.created = append(m.created, name)
	return m.h.sb, nil
}

func (m *fakeManager) DeleteSandbox(name string) error {
	if name == "myapp" {
		return &ManagerError{Msg: "defined in the config file", Conflict: true}
	}
	return &ManagerError{Msg: "no sandbox", NotFound: true}
}

func TestSandboxCreateDelete(t *testing.T) {
	h := newAPI(t, "")
	m := &fakeManager{h: h}
	h.srv.cfg.Manager = m
	h.reroute()
	if code, body := h.do(t, "POST", "/api/v1/sandboxes", `{"name": "new", "subnet": "10.88.9.0/24"}`); code != 201 || len(m.created) != 1 {
		t.Errorf("create: %d %s", code, body)
	}
	if code, body := h.do(t, "POST", "/api/v1/sandboxes", `{"name": "new", "subnet": "bad"}`); code != 400 || !strings.Contains(body, "IPv4") {
		t.Errorf("bad subnet: %d %s", code, body)
	}
	if code, _ := h.do(t, "POST", "/api/v1/sandboxes", `{"name": "new"}`); code != 400 {
		t.Errorf("no subnet: %d", code)
	}
	if code, _ := h.do(t, "DELETE", "/api/v1/sandboxes/myapp", ""); code != 409 {
		t.Errorf("delete config sandbox: %d", code)
	}
	if code, _ := h.do(t, "DELETE", "/api/v1/sandboxes/nosuch", ""); code != 404 {
		t.Errorf("delete missing sandbox: %d", code)
	}
}

func TestReload(t *testing.T) {
	h := newAPI(t, "")
	m := &fakeManager{h: h}
	h.srv.cfg.Manager = m
	h.reroute()
	code, body := h.do(t, "POST", "/api/v1/reload", "")
	if code != 200 || m.reloads != 1 {
		t.Fatalf("reload: %d %s (%d reloads)", code, body, m.reloads)
	}
	var got ReloadResult
	if err := json.Unmarshal([]byte(body), &got); err != nil || len(got.Added) != 1 || got.Added[0] != "new" || !strings.Contains(got.Errors[0], "app.yaml:3") {
		t.Errorf("reload result %s: %+v %v", body, got, err)
	}
	// The token is required, and a session cookie needs the CSRF header.
	resp, err := http.Post(h.ts.URL+"/api/v1/reload", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || m.reloads != 1 {
		t.Errorf("reload without a token: %d (%d reloads)", resp.StatusCode, m.reloads)
	}
	resp, err = http.Post(h.ts.URL+"/api/v1/login", "application/json", strings.NewReader(`{"token":"`+h.srv.Token()+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	req, _ := http.NewRequest("POST", h.ts.URL+"/api/v1/reload", nil)
	req.AddCookie(resp.Cookies()[0])
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 || m.reloads != 1 {
		t.Errorf("reload with a cookie and no CSRF header: %d (%d reloads)", resp.StatusCode, m.reloads)
	}
	m.reloadErr = &ManagerError{Msg: "config /etc/airlock/airlockd.yaml: yaml: line 4: did not find expected key", Hint: "the running config stays in force"}
	if code, body := h.do(t, "POST", "/api/v1/reload", ""); code != 400 || !strings.Contains(body, "line 4") || !strings.Contains(body, "stays in force") {
		t.Errorf("broken config: %d %s", code, body)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	h := newAPI(t, "")
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_test_total", Help: "x"})
	reg.MustRegister(c)
	c.Inc()
	srv, _ := New(Config{Listen: "127.0.0.1:0", TokenFile: h.srv.cfg.TokenFile, Sandboxes: h.srv.cfg.Sandboxes, Registry: reg})
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	resp, err := http.Get(ts.URL + "/metrics") // no token: aggregate counts only
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "airlock_test_total 1") {
		t.Errorf("/metrics: %d %s", resp.StatusCode, b)
	}
}

func mustPattern(t testing.TB, s string) policy.Pattern {
	p, err := policy.Parse(s, policy.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type fakeContainers struct {
	started []ContainerRequest
	waits   int
}

func (f *fakeContainers) ListContainers(sb string) ([]Container, error) {
	return []Container{{ID: "abc", Name: "agent-1", Source: "agent-1"}}, nil
}

func (f *fakeContainers) StartContainer(sb string, req ContainerRequest) (Container, error) {
	if req.Kind != "" && req.Kind != "agent" && req.Kind != "mcp" {
		return Container{}, &ManagerError{Msg: "kind " + req.Kind + ": want agent or mcp"}
	}
	f.started = append(f.started, req)
	return Container{ID: "abc", Name: req.Name}, nil
}

func (f *fakeContainers) WaitContainer(ctx context.Context, sb, id string) (ContainerResult, error) {
	f.waits++
	if id == "slow" {
		<-ctx.Done()
		return ContainerResult{}, ctx.Err()
	}
	if id != "abc" {
		return ContainerResult{}, &ManagerError{Msg: "no member " + id, NotFound: true}
	}
	return ContainerResult{ID: id, ExitCode: 3, Output: "bye"}, nil
}

func (f *fakeContainers) RemoveContainer(sb, id string) error { return nil }

func TestContainersThroughTheAPI(t *testing.T) {
	h := newAPI(t, "")
	if code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/containers", ""); code != 503 || !strings.Contains(body, "no Docker Engine") {
		t.Errorf("without Docker: %d %s", code, body)
	}
	f := &fakeContainers{}
	h.srv.cfg.Containers = f
	h.reroute()
	for _, bad := range []string{`{}`, `{"image": "x", "privileged": true}`, `{"image": "x", "kind": "root"}`, `not json`} {
		if code, body := h.do(t, "POST", "/api/v1/sandboxes/myapp/containers", bad); code != 400 {
			t.Errorf("start %s: %d %s, want 400", bad, code, body)
		}
	}
	if len(f.started) != 0 {
		t.Fatalf("a refused body started %d members", len(f.started))
	}
	if code, body := h.do(t, "POST", "/api/v1/sandboxes/myapp/containers", `{"image": "agent:1", "cmd": ["run"], "agent": "claude"}`); code != 201 || len(f.started) != 1 || f.started[0].Agent != "claude" {
		t.Errorf("start: %d %s %+v", code, body, f.started)
	}
	if code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/containers/abc/wait", ""); code != 200 || !strings.Contains(body, `"exit_code":3`) {
		t.Errorf("wait: %d %s", code, body)
	}
	if code, _ := h.do(t, "GET", "/api/v1/sandboxes/myapp/containers/nope/wait", ""); code != 404 {
		t.Errorf("wait for an unknown member: %d", code)
	}
	WaitPoll = 50 * time.Millisecond
	defer func() { WaitPoll = 20 * time.Second }()
	if code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/containers/slow/wait", ""); code != 200 || !strings.Contains(body, `"running":true`) {
		t.Errorf("wait past the poll: %d %s, want running", code, body)
	}
}

// TestEditsRefusedOverAHeldWideningEdit: while the policy file on disk
// widens access beyond the policy in force (a member wrote it; polling left
// it out), an API write, which would put all of the file in force, is a 409
// that says to reload; session rules still work, and after a reload the
// write goes through.
func TestEditsRefusedOverAHeldWideningEdit(t *testing.T) {
	h := newAPI(t, "sandbox:\n  unknown_action: deny\n")
	widened := "sandbox:\n  unknown_action: allow\n"
	if err := os.WriteFile(h.policy, []byte(widened), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, req := range [][3]string{
		{"POST", "/api/v1/sandboxes/myapp/allowlist", `{"pattern": "a.example.com", "persist": true}`},
		{"POST", "/api/v1/sandboxes/myapp/denylist", `{"pattern": "b.example.com", "persist": true}`},
		{"PATCH", "/api/v1/sandboxes/myapp/settings", `{"approval_timeout": 45}`},
	} {
		code, body := h.do(t, req[0], req[1], req[2])
		if code != 409 || !strings.Contains(body, "unknown_action: deny → allow") || !strings.Contains(body, "airlock reload") {
			t.Errorf("%s %s over a held edit: %d %s", req[0], req[1], code, body)
		}
	}
	if file, _ := os.ReadFile(h.policy); string(file) != widened {
		t.Errorf("the policy file was rewritten:\n%s", file)
	}
	if code, body := h.do(t, "POST", "/api/v1/sandboxes/myapp/allowlist", `{"pattern": "session.example.com"}`); code != 201 {
		t.Errorf("session rule over a held edit: %d %s", code, body)
	}
	if err := h.sb.pol.Reload(); err != nil {
		t.Fatal(err)
	}
	if code, body := h.do(t, "POST", "/api/v1/sandboxes/myapp/allowlist", `{"pattern": "a.example.com", "persist": true}`); code != 201 {
		t.Errorf("add after the reload: %d %s", code, body)
	}
}

// TestRuleTypeIsTheForm: the type the API (and so the allowlist manager and
// `airlock ls`) shows names the pattern's form; a host with a path glob is
// not an exact host.
func TestRuleTypeIsTheForm(t *testing.T) {
	h := newAPI(t, "sandbox: {}\n")
	for pattern, want := range map[string]string{
		"api.allowed.test/v1/*":          "path",
		"api.allowed.test":               "exact",
		"*.allowed.test":                 "wildcard",
		"GET api.allowed.test/x/*":       "method",
		"cidr:203.0.113.0/24":            "cidr",
		"*.allowed.test/api/*":           "wildcard-path",
		`regex:api\.allowed\.test/v1/.*`: "regex",
	} {
		body, _ := json.Marshal(map[string]string{"pattern": pattern})
		code, resp := h.do(t, "POST", "/api/v1/sandboxes/myapp/allowlist", string(body))
		var r RuleView
		if err := json.Unmarshal([]byte(resp), &r); code != 201 || err != nil || r.Type != want {
			t.Errorf("add %q: %d %s, want type %q", pattern, code, resp, want)
		}
	}
}

// TestAPIAnswersOnlyLoopbackNames: a web page that rebinds its own name to
// 127.0.0.1 reaches the API's port with its name as Host; it reads
// nothing, not even the routes that need no token, and the token does not
// open them either. Loopback addresses and localhost, as every client of
// the API's own names it, are served.
func TestAPIAnswersOnlyLoopbackNames(t *testing.T) {
	h := newAPI(t, "")
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(h.ts.URL, "http://"))
	for _, host := range []string{"rebind.example:" + port, "rebind.example", "localhost.rebind.example:" + port,
		"127.0.0.1.nip.io:" + port, "2130706433:" + port, "0.0.0.0:" + port, "10.0.0.1:" + port, "localhost.:" + port} {
		for _, path := range []string{"/healthz", "/metrics", "/", "/api/v1/sandboxes", "/mcp"} {
			code, body := h.doAs(t, host, "GET", path, "")
			if code != http.StatusMisdirectedRequest || !strings.Contains(body, "loopback") {
				t.Errorf("Host %q, GET %s: %d %.80q; want 421 naming loopback", host, path, code, body)
			}
		}
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LocalHost:" + port, "127.0.0.1", "[::1]:" + port} {
		if code, body := h.doAs(t, host, "GET", "/api/v1/sandboxes", ""); code != http.StatusOK {
			t.Errorf("Host %q: %d %.80q; want 200", host, code, body)
		}
	}
}

func TestLoopbackHost(t *testing.T) {
	for h, want := range map[string]bool{
		"127.0.0.1": true, "127.8.9.10:80": true, "localhost": true, "LOCALHOST:7433": true, "[::1]:7433": true,
		"[::1]": true, "[::ffff:127.0.0.1]:7433": true,
		"": true, ":7433": false, "localhost.": false, "localhost.example": false, "example.com:7433": false,
		"0.0.0.0": false, "[::]:7433": false, "[fe80::1%lo]:7433": false, "127.0.0.1 ": false, "0x7f.0.0.1": false,
		"2130706433": false, "127.1": false,
	} {
		if got := loopbackHost(h); got != want {
			t.Errorf("loopbackHost(%q) = %v; want %v", h, got, want)
		}
	}
}

// TestLoopbackOnlyOnTheWire sends raw requests a DNS-rebinding page (or an
// odd client) could make: every one that names another host, or none, is
// refused before routing (unknown paths, wrong methods, HEAD and CORS
// preflights included); net/http itself refuses duplicate and malformed
// Host headers. An absolute-form target is what counts over Host (RFC 9112
// §3.2.2); a browser sends one only to a proxy, which names the page's host.
func TestLoopbackOnlyOnTheWire(t *testing.T) {
	h := newAPI(t, "")
	addr := strings.TrimPrefix(h.ts.URL, "http://")
	send := func(req string) int {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, req)
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: strings.Fields(req)[0]})
		if err != nil {
			t.Fatalf("%q: %v", req, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for req, want := range map[string]int{
		"GET /healthz HTTP/1.0\r\n\r\n":                                                                                                             200,
		"GET /healthz HTTP/1.1\r\nhost: rebind.example\r\n\r\n":                                                                                     421,
		"GET /nowhere HTTP/1.1\r\nHost: rebind.example\r\n\r\n":                                                                                     421,
		"DELETE /healthz HTTP/1.1\r\nHost: rebind.example\r\n\r\n":                                                                                  421,
		"HEAD /metrics HTTP/1.1\r\nHost: rebind.example\r\n\r\n":                                                                                    421,
		"GET /app.js HTTP/1.1\r\nHost: rebind.example\r\n\r\n":                                                                                      421,
		"GET /api/v1/sandboxes/myapp/events HTTP/1.1\r\nHost: rebind.example\r\n\r\n":                                                               421,
		"POST /mcp HTTP/1.1\r\nHost: rebind.example\r\nContent-Length: 0\r\n\r\n":                                                                   421,
		"GET //127.0.0.1/healthz HTTP/1.1\r\nHost: rebind.example\r\n\r\n":                                                                          421,
		"GET /healthz HTTP/1.1\r\nHost: app.localhost\r\n\r\n":                                                                                      421,
		"GET /healthz HTTP/1.1\r\nHost: %6cocalhost\r\n\r\n":                                                                                        421,
		"GET /healthz HTTP/1.1\r\nHost: " + strings.Repeat("a", 4000) + ".localhost\r\n\r\n":                                                        421,
		"OPTIONS /api/v1/sandboxes HTTP/1.1\r\nHost: rebind.example\r\nOrigin: http://rebind.example\r\nAccess-Control-Request-Method: GET\r\n\r\n": 421,
		"GET http://rebind.example/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n":                                                                     421,
		"GET /healthz HTTP/1.1\r\nHost: rebind.example\r\nHost: 127.0.0.1\r\n\r\n":                                                                  400,
		"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: rebind.example\r\n\r\n":                                                                  400,
		"GET /healthz HTTP/1.1\r\nHost: rebind.example@localhost\r\n\r\n":                                                                           400,
		"GET /healthz HTTP/1.1\r\nHost: [0:0:0:0:0:0:0:1]\r\n\r\n":                                                                                  200,
		"GET http://127.0.0.1/healthz HTTP/1.1\r\nHost: rebind.example\r\n\r\n":                                                                     200,
	} {
		if got := send(req); got != want {
			t.Errorf("%.100q: %d; want %d", req, got, want)
		}
	}
}
