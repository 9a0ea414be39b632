package ui

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/policy"
)

const settingsFile = "name: myapp  # stays\nsandbox:\n  unknown_action: ask   # ask | deny | allow\n  network_allowlist:\n    user:\n      - pattern: a.example.com\n        source: manually added\n      - pattern: z.example.com\n  network_denylist:\n    - pattern: pastebin.com\n"

func TestSettingsThroughTheAPI(t *testing.T) {
	h := newAPI(t, settingsFile)
	code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/settings", "")
	if code != 200 || body != `{"unknown_action":"ask","approval_timeout":30,"presets":[],"allow_ech":false}`+"\n" {
		t.Errorf("GET settings: %d %s", code, body)
	}
	code, body = h.do(t, "PATCH", "/api/v1/sandboxes/myapp/settings", `{"unknown_action": "deny", "approval_timeout": 45}`)
	if code != 200 || body != `{"unknown_action":"deny","approval_timeout":45,"presets":[],"allow_ech":false}`+"\n" {
		t.Errorf("PATCH settings: %d %s", code, body)
	}
	file, _ := os.ReadFile(h.policy)
	want := strings.Replace(settingsFile, "  unknown_action: ask   #", "  approval_timeout: 45\n  unknown_action: deny   #", 1)
	if string(file) != want {
		t.Errorf("file after PATCH:\n%s\nwant:\n%s", file, want)
	}
	// In force at once: an unknown host is denied without asking, and the
	// next held request waits 45 s.
	if d := h.sb.pol.Decide(policy.Query{Host: "unknown.test", Port: 443}); d.Verdict != policy.Deny {
		t.Errorf("unknown host after deny: %v", d)
	}
	if got := h.sb.pol.Spec().ApprovalTimeout; got != 45*time.Second {
		t.Errorf("approval timeout in force: %v", got)
	}
	if got := h.sb.journal.Query(audit.Filter{Kinds: []string{audit.KindSettings}}); len(got) != 1 || got[0].Reason != "unknown_action=deny approval_timeout=45" {
		t.Errorf("journal: %+v", got)
	}
	// The sandbox view says the same.
	_, body = h.do(t, "GET", "/api/v1/sandboxes/myapp", "")
	if !strings.Contains(body, `"unknown_action":"deny","approval_timeout":45`) {
		t.Errorf("sandbox view: %s", body)
	}
}

func TestBadSettingsChangeNothing(t *testing.T) {
	h := newAPI(t, settingsFile)
	for _, tc := range []struct {
		name, body, want string
	}{
		{"empty", `{}`, "no setting to change"},
		{"unknown action", `{"unknown_action": "maybe"}`, "want ask, deny, learn or allow"},
		{"upper case", `{"unknown_action": "DENY"}`, "want ask, deny, learn or allow"},
		{"zero timeout", `{"approval_timeout": 0}`, "from 1 to 600"},
		{"negative timeout", `{"approval_timeout": -5}`, "from 1 to 600"},
		{"too long", `{"approval_timeout": 3601}`, "from 1 to 600"},
		{"fraction", `{"approval_timeout": 1.5}`, "bad JSON"},
		{"string timeout", `{"approval_timeout": "30"}`, "bad JSON"},
		{"huge", `{"approval_timeout": 99999999999999999999}`, "bad JSON"},
		{"unknown field", `{"unknown_action": "deny", "inspect": "all"}`, "unknown field"},
		{"both, one bad", `{"unknown_action": "deny", "approval_timeout": 0}`, "approval_timeout"},
		{"null", `null`, "no setting"},
		{"not json", `unknown_action=deny`, "bad JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := h.do(t, "PATCH", "/api/v1/sandboxes/myapp/settings", tc.body)
			if code != 400 || !strings.Contains(body, tc.want) || !strings.Contains(body, `"hint"`) {
				t.Errorf("%d %s; want 400 with %q and a hint", code, body, tc.want)
			}
		})
	}
	if file, _ := os.ReadFile(h.policy); string(file) != settingsFile {
		t.Errorf("bad settings changed the file:\n%s", file)
	}
	if s := h.sb.pol.Spec(); s.UnknownAction != policy.ActionAsk || s.ApprovalTimeout != 30*time.Second {
		t.Errorf("bad settings changed the policy: %v %v", s.UnknownAction, s.ApprovalTimeout)
	}
}

func TestSettingsNeedCSRF(t *testing.T) {
	h := newAPI(t, settingsFile)
	resp, err := http.Post(h.ts.URL+"/api/v1/login", "application/json", strings.NewReader(`{"token":"`+h.srv.Token()+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	req, _ := http.NewRequest("PATCH", h.ts.URL+"/api/v1/sandboxes/myapp/settings", strings.NewReader(`{"unknown_action": "allow"}`))
	for _, c := range resp.Cookies() {
		req.AddCookie(c)
	}
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Errorf("PATCH with the cookie and no CSRF header: %d, want 403", resp.StatusCode)
	}
	if file, _ := os.ReadFile(h.policy); string(file) != settingsFile {
		t.Errorf("file changed:\n%s", file)
	}
}

func ruleIDs(t *testing.T, h *apiHarness, list string) map[string]RuleView {
	t.Helper()
	_, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/"+list, "")
	var rules []RuleView
	if err := json.Unmarshal([]byte(body), &rules); err != nil {
		t.Fatal(err)
	}
	out := map[string]RuleView{}
	for _, r := range rules {
		out[r.Pattern] = r
	}
	return out
}

func TestReplaceRuleThroughTheAPI(t *testing.T) {
	h := newAPI(t, settingsFile)
	a := ruleIDs(t, h, "allowlist")["a.example.com"]
	code, body := h.do(t, "PUT", "/api/v1/sandboxes/myapp/allowlist/"+a.ID, `{"pattern": "b.example.com/v1/*"}`)
	if code != 200 {
		t.Fatalf("PUT: %d %s", code, body)
	}
	var nr RuleView
	json.Unmarshal([]byte(body), &nr)
	if nr.Pattern != "b.example.com/v1/*" || nr.Source != "manually added" || nr.Tier != "user" || nr.ID == a.ID {
		t.Errorf("new rule: %+v", nr)
	}
	file, _ := os.ReadFile(h.policy)
	if !strings.Contains(string(file), "    user:\n      - pattern: \"b.example.com/v1/*\"\n") || strings.Contains(string(file), "a.example.com") ||
		!strings.Contains(string(file), "name: myapp  # stays") || !strings.Contains(string(file), "z.example.com") {
		t.Errorf("file after PUT:\n%s", file)
	}
	if d := h.sb.pol.Decide(policy.Query{Host: "b.example.com", Port: 443, Method: "GET", Path: "/v1/x"}); d.Verdict != policy.Allow {
		t.Errorf("new pattern not in force: %v", d)
	}
	// Denylist too.
	p := ruleIDs(t, h, "denylist")["pastebin.com"]
	if code, body := h.do(t, "PUT", "/api/v1/sandboxes/myapp/denylist/"+p.ID, `{"pattern": "*.pastebin.com"}`); code != 200 {
		t.Errorf("PUT deny: %d %s", code, body)
	}
	if file, _ := os.ReadFile(h.policy); !strings.Contains(string(file), `- pattern: "*.pastebin.com"`) {
		t.Errorf("deny not replaced:\n%s", file)
	}
	if got := h.sb.journal.Query(audit.Filter{Kinds: []string{audit.KindRule}}); len(got) != 2 || got[0].Action != "replaced" || got[0].Reason != "was a.example.com" {
		t.Errorf("journal: %+v", got)
	}
}

func TestBadReplaceChangesNothing(t *testing.T) {
	h := newAPI(t, "sandbox:\n  mcp_servers:\n    - name: github\n"+strings.TrimPrefix(settingsFile, "name: myapp  # stays\nsandbox:\n"))
	before, _ := os.ReadFile(h.policy)
	rules := ruleIDs(t, h, "allowlist")
	a, z, auto := rules["a.example.com"].ID, rules["z.example.com"].ID, rules["api.github.com"].ID
	base := "/api/v1/sandboxes/myapp/allowlist/"
	for _, tc := range []struct {
		name, path, body string
		code             int
		want             string
	}{
		{"no pattern", base + a, `{}`, 400, "no pattern"},
		{"bad pattern", base + a, `{"pattern": "api.*.example.com"}`, 400, "regex"},
		{"bad regex", base + a, `{"pattern": "regex:(a"}`, 400, "pattern"},
		{"broad", base + a, `{"pattern": "*.com"}`, 400, "force"},
		{"duplicate", base + a, `{"pattern": "z.example.com"}`, 409, "already holds"},
		{"duplicate of auto", base + z, `{"pattern": "api.github.com"}`, 409, "already holds"},
		{"auto rule", base + auto, `{"pattern": "x.example.com"}`, 409, "auto rules"},
		{"no such rule", base + "0123456789ab", `{"pattern": "x.example.com"}`, 404, "no rule"},
		{"wrong list", "/api/v1/sandboxes/myapp/denylist/" + a, `{"pattern": "x.example.com"}`, 404, "no rule"},
		{"unknown field", base + a, `{"pattern": "x.example.com", "persist": true}`, 400, "unknown field"},
		{"not json", base + a, `pattern=x`, 400, "bad JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := h.do(t, "PUT", tc.path, tc.body)
			if code != tc.code || !strings.Contains(body, tc.want) {
				t.Errorf("%d %s; want %d with %q", code, body, tc.code, tc.want)
			}
		})
	}
	if after, _ := os.ReadFile(h.policy); string(after) != string(before) {
		t.Errorf("bad edits changed the file:\n%s", after)
	}
	if d := h.sb.pol.Decide(policy.Query{Host: "a.example.com", Port: 443}); d.Verdict != policy.Allow {
		t.Errorf("bad edits changed the policy: %v", d)
	}
}

// A new approval_timeout holds the next request for that long.
func TestApprovalTimeoutInForce(t *testing.T) {
	h := newAPI(t, settingsFile)
	if code, body := h.do(t, "PATCH", "/api/v1/sandboxes/myapp/settings", `{"approval_timeout": 1}`); code != 200 {
		t.Fatalf("PATCH: %d %s", code, body)
	}
	start := time.Now()
	out := h.sb.broker.Ask(context.Background(), policy.AskRequest{Source: "agent", Host: "held.test", Port: 443, URL: "held.test:443"})
	if took := time.Since(start); out.Allowed || took < 900*time.Millisecond || took > 5*time.Second || !strings.Contains(out.Reason, "1s") {
		t.Errorf("held %v: %+v; want a denial after 1 s", took, out)
	}
}

// TestSettingsBodyWithTrailingBytes: a body with bytes after its object
// (a stray } or ], which encoding/json's More does not report) is a 400 and
// changes nothing.
func TestSettingsBodyWithTrailingBytes(t *testing.T) {
	h := newAPI(t, settingsFile)
	for _, b := range []string{`{"unknown_action": "allow"}}`, `{"unknown_action": "allow"}]`, `{"unknown_action": "allow"},`, `{"unknown_action": "allow"} {}`} {
		code, body := h.do(t, "PATCH", "/api/v1/sandboxes/myapp/settings", b)
		if code != 400 {
			t.Errorf("PATCH %s: %d %s; want 400", b, code, body)
		}
	}
	if file, _ := os.ReadFile(h.policy); string(file) != settingsFile {
		t.Errorf("a malformed body changed the policy file:\n%s", file)
	}
}
