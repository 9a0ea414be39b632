package ui

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/policy"
)

func TestPresetsThroughTheAPI(t *testing.T) {
	h := newAPI(t, settingsFile)
	code, body := h.do(t, "GET", "/api/v1/presets", "")
	var ps []PresetView
	if code != 200 || json.Unmarshal([]byte(body), &ps) != nil || len(ps) != len(policy.Presets()) {
		t.Fatalf("GET presets: %d %s", code, body)
	}
	if ps[0].Name != "python" || ps[0].Entries[0].Host != "pypi.org" || ps[0].Entries[0].Why == "" ||
		!cmp.Equal(ps[0].Entries[0].Patterns, []string{"GET pypi.org", "HEAD pypi.org"}) {
		t.Errorf("python preset: %+v", ps[0])
	}

	// An unknown name changes nothing.
	before, _ := os.ReadFile(h.policy)
	if code, body := h.do(t, "PATCH", "/api/v1/sandboxes/myapp/settings", `{"presets": ["python", "pip"]}`); code != 400 || !strings.Contains(body, `unknown preset \"pip\": want one of python`) {
		t.Errorf("unknown preset: %d %s", code, body)
	}
	if after, _ := os.ReadFile(h.policy); string(after) != string(before) {
		t.Errorf("refused presets changed the file:\n%s", after)
	}

	code, body = h.do(t, "PATCH", "/api/v1/sandboxes/myapp/settings", `{"presets": ["python", "GitHub"]}`)
	if code != 200 || !strings.Contains(body, `"presets":["python","github"]`) {
		t.Errorf("PATCH presets: %d %s", code, body)
	}
	if file, _ := os.ReadFile(h.policy); !strings.Contains(string(file), "  presets: [python, github]\n") {
		t.Errorf("file:\n%s", file)
	}
	// The preset's rules are listed as their own tier, labelled, and
	// read-only.
	_, body = h.do(t, "GET", "/api/v1/sandboxes/myapp/allowlist", "")
	var rules []RuleView
	json.Unmarshal([]byte(body), &rules)
	var pypi *RuleView
	for i, r := range rules {
		if r.Pattern == "GET pypi.org" {
			pypi = &rules[i]
		}
	}
	if pypi == nil || pypi.Tier != "preset" || pypi.Source != "preset:python" || pypi.Type != "method" {
		t.Fatalf("preset rule: %+v in %s", pypi, body)
	}
	if code, body := h.do(t, "DELETE", "/api/v1/sandboxes/myapp/allowlist/"+pypi.ID, ""); code != 409 || !strings.Contains(body, "preset python") {
		t.Errorf("delete preset rule: %d %s", code, body)
	}
	if code, body := h.do(t, "PUT", "/api/v1/sandboxes/myapp/allowlist/"+pypi.ID, `{"pattern": "pypi.org"}`); code != 409 || !strings.Contains(body, "read-only") {
		t.Errorf("replace preset rule: %d %s", code, body)
	}
	if d := h.sb.pol.Decide(policy.Query{Host: "pypi.org", Port: 443, Method: "POST", Path: "/"}); d.Verdict != policy.Deny || policy.PresetOf(d.Rule) != "python" {
		t.Errorf("POST pypi.org: %v", d)
	}
	// Off again.
	if code, body := h.do(t, "PATCH", "/api/v1/sandboxes/myapp/settings", `{"presets": []}`); code != 200 || !strings.Contains(body, `"presets":[]`) {
		t.Errorf("presets off: %d %s", code, body)
	}
}

func TestLearnThroughTheAPI(t *testing.T) {
	h := newAPI(t, settingsFile)
	start := time.Now()
	code, body := h.do(t, "PATCH", "/api/v1/sandboxes/myapp/settings", `{"unknown_action": "learn"}`)
	var v SettingsView
	if code != 200 || json.Unmarshal([]byte(body), &v) != nil || v.UnknownAction != "learn" || v.LearnUntil == nil {
		t.Fatalf("PATCH learn: %d %s", code, body)
	}
	if d := v.LearnUntil.Sub(start); d < 59*time.Minute || d > 61*time.Minute {
		t.Errorf("learn_until %v is not an hour from now", v.LearnUntil)
	}
	_, body = h.do(t, "GET", "/api/v1/sandboxes/myapp", "")
	if !strings.Contains(body, `"unknown_action":"learn"`) || !strings.Contains(body, `"learn_until":"`) {
		t.Errorf("sandbox view: %s", body)
	}
	if d := h.sb.pol.Decide(policy.Query{Host: "new.test", Port: 443}); d.Verdict != policy.Allow || d.Reason != policy.ReasonLearn {
		t.Errorf("unknown host while learning: %v", d)
	}
	// A learn_until in the past: the sandbox asks, and says it no longer learns.
	code, body = h.do(t, "PATCH", "/api/v1/sandboxes/myapp/settings", `{"learn_until": "2020-01-01T00:00:00Z"}`)
	if code != 200 || strings.Contains(body, "learn_until") {
		t.Errorf("learn_until in the past: %d %s", code, body)
	}
	if d := h.sb.pol.Decide(policy.Query{Host: "new.test", Port: 443}); d.Verdict != policy.Ask {
		t.Errorf("unknown host after learn_until: %v", d)
	}
	if code, body := h.do(t, "PATCH", "/api/v1/sandboxes/myapp/settings", `{"learn_until": "soon"}`); code != 400 || !strings.Contains(body, "duration such as 2h") {
		t.Errorf("bad learn_until: %d %s", code, body)
	}
	before, _ := os.ReadFile(h.policy)
	for _, zero := range []string{"0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z"} {
		if code, body := h.do(t, "PATCH", "/api/v1/sandboxes/myapp/settings", `{"learn_until": "`+zero+`"}`); code != 400 || !strings.Contains(body, "after 1970") {
			t.Errorf("learn_until %s: %d %s, want a 400", zero, code, body)
		}
	}
	if after, _ := os.ReadFile(h.policy); string(after) != string(before) {
		t.Errorf("a refused learn_until changed the file")
	}
}

func TestCreatedSandboxStartsWithPackageManagers(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"default", `{"name": "new", "subnet": "10.88.9.0/24"}`, "presets: [package-managers]"},
		{"told otherwise", `{"name": "new", "subnet": "10.88.9.0/24", "presets": ["go"]}`, "presets: [go]"},
		{"none", `{"name": "new", "subnet": "10.88.9.0/24", "presets": []}`, "presets: []"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newAPI(t, "")
			m := &fakeManager{h: h}
			h.srv.cfg.Manager = m
			h.reroute()
			if code, body := h.do(t, "POST", "/api/v1/sandboxes", tc.body); code != 201 {
				t.Fatalf("create: %d %s", code, body)
			}
			if file, _ := os.ReadFile(h.policy); !strings.Contains(string(file), tc.want) {
				t.Errorf("policy file:\n%s\nwant %q", file, tc.want)
			}
		})
	}
	h := newAPI(t, "")
	m := &fakeManager{h: h}
	h.srv.cfg.Manager = m
	h.reroute()
	if code, body := h.do(t, "POST", "/api/v1/sandboxes", `{"name": "new", "subnet": "10.88.9.0/24", "presets": ["nope"]}`); code != 400 || len(m.created) != 0 || !strings.Contains(body, "unknown preset") {
		t.Errorf("unknown preset: %d %s, created %v", code, body, m.created)
	}
	// A policy file that exists already is left as it says.
	h = newAPI(t, "sandbox:\n  unknown_action: deny\n")
	h.srv.cfg.Manager = &fakeManager{h: h}
	h.reroute()
	if code, body := h.do(t, "POST", "/api/v1/sandboxes", `{"name": "new", "subnet": "10.88.9.0/24"}`); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	if file, _ := os.ReadFile(h.policy); string(file) != "sandbox:\n  unknown_action: deny\n" {
		t.Errorf("existing policy file changed:\n%s", file)
	}
}

func TestProposalThroughTheAPI(t *testing.T) {
	h := newAPI(t, "sandbox:\n  unknown_action: learn\n  presets: [python]\n")
	learned, unknown := policy.ReasonLearn.String(), policy.ReasonUnknown.String()
	for _, e := range []audit.Entry{
		{Kind: audit.KindConnection, Source: "agent", Host: "a.cdn.test", Port: 443, Verdict: "learned", Reason: learned},
		{Kind: audit.KindConnection, Source: "agent", Host: "b.cdn.test", Port: 443, Verdict: "learned", Reason: learned},
		{Kind: audit.KindConnection, Source: "agent", Host: "c.cdn.test", Port: 443, Verdict: "learned", Reason: learned},
		// An intercepted connection stands for its requests.
		{Kind: audit.KindConnection, Source: "agent", Host: "api.test", Port: 80, Verdict: "learned", Reason: "intercepted: " + learned},
		{Kind: audit.KindRequest, Source: "agent", Method: "GET", URL: "http://api.test/v1/models", Host: "api.test", Verdict: "learned", Reason: learned},
		{Kind: audit.KindRequest, Source: "agent", Method: "POST", URL: "http://api.test/v1/chat?x=1", Host: "api.test", Verdict: "learned", Reason: learned},
		{Kind: audit.KindRequest, Source: "agent", Method: "GET", URL: "https://pypi.org/simple/x/", Host: "pypi.org", Verdict: "allow", Reason: policy.ReasonAllowRule.String()},
		// Held, and denied for want of a rule: proposed too.
		{Kind: audit.KindApproval, Source: "mcp:x", Host: "held.test", Port: 443, URL: "held.test:443", Action: "opened"},
		// The member API is airlock's own, and a member's port and resources
		// requests reach no host: nothing to propose.
		{Kind: audit.KindConnection, Source: "agent", Host: "airlock.internal", Port: 80, Verdict: "allow", Reason: "the member API"},
		{Kind: audit.KindApproval, Source: "agent", Port: 8080, ApprovalKind: "port", Request: "port 8080", Action: "opened"},
		{Kind: audit.KindApproval, Source: "agent", ApprovalKind: "resources", Request: "resources memory_mb 2048", Action: "opened"},
		{Kind: audit.KindConnection, Source: "agent", Host: "denied.test", Port: 443, Verdict: "deny", Reason: unknown},
		// Denied by a rule: not proposed.
		{Kind: audit.KindConnection, Source: "agent", Host: "evil.test", Port: 443, Verdict: "deny", Reason: policy.ReasonDenyRule.String()},
		{Kind: audit.KindDNS, Source: "agent", Host: "dns.test", Verdict: "fake-ip"},
	} {
		e.Sandbox = "myapp"
		h.sb.journal.Add(e)
	}
	code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/proposal?since=1h", "")
	var pv ProposalView
	if code != 200 || json.Unmarshal([]byte(body), &pv) != nil || pv.Since == nil {
		t.Fatalf("GET proposal: %d %s", code, body)
	}
	var got []string
	for _, p := range pv.Patterns {
		s := p.Pattern + " member=" + p.Member
		if p.CoveredBy != "" {
			s += " covered by " + p.CoveredBy
		}
		got = append(got, s)
	}
	want := []string{
		"*.cdn.test member=agent",
		"api.test/v1/* member=agent",
		"denied.test member=agent",
		"held.test member=mcp:x",
		"pypi.org member=agent covered by GET pypi.org (preset:python)",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("proposal (-want +got):\n%s", diff)
	}
	if code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/proposal?since=soon", ""); code != 400 {
		t.Errorf("bad since: %d %s", code, body)
	}

	// A bad pattern saves nothing.
	before, _ := os.ReadFile(h.policy)
	if code, body := h.do(t, "POST", "/api/v1/sandboxes/myapp/proposal", `{"rules": [{"pattern": "*.cdn.test", "member": "agent"}, {"pattern": "*.com"}]}`); code != 400 || !strings.Contains(body, "rules[1]") {
		t.Errorf("broad pattern: %d %s", code, body)
	}
	if after, _ := os.ReadFile(h.policy); string(after) != string(before) {
		t.Errorf("a refused save changed the file:\n%s", after)
	}
	// So does a member the policy file takes no entry with (a source
	// recorded as "my agent"), after a good rule: checked before the first
	// is written, not found by the write of the second.
	if code, body := h.do(t, "POST", "/api/v1/sandboxes/myapp/proposal", `{"rules": [{"pattern": "first.test"}, {"pattern": "second.test", "member": "my agent"}]}`); code != 400 || !strings.Contains(body, "rules[1]") || !strings.Contains(body, "space") {
		t.Errorf("member with a space: %d %s", code, body)
	}
	if after, _ := os.ReadFile(h.policy); string(after) != string(before) {
		t.Errorf("a refused save changed the file:\n%s", after)
	}
	code, body = h.do(t, "POST", "/api/v1/sandboxes/myapp/proposal", `{"rules": [{"pattern": "*.cdn.test", "member": "agent"}, {"pattern": "api.test/v1/*"}]}`)
	if code != 201 {
		t.Fatalf("save: %d %s", code, body)
	}
	file, _ := os.ReadFile(h.policy)
	source := "learned " + time.Now().UTC().Format("2006-01-02")
	for _, w := range []string{`pattern: "*.cdn.test"`, `member: "agent"`, `pattern: "api.test/v1/*"`, source} {
		if !strings.Contains(string(file), w) {
			t.Errorf("policy file lacks %q:\n%s", w, file)
		}
	}
	if d := h.sb.pol.Decide(policy.Query{Source: "agent", Host: "b.cdn.test", Port: 443}); d.Verdict != policy.Allow || d.Rule == nil {
		t.Errorf("b.cdn.test after saving: %v", d)
	}

	// A save the file cannot take whole saves nothing: the first rules
	// would fit, the last would take the file past its size limit.
	pad := policy.MaxFileSize - len(file) - 600
	if err := os.WriteFile(h.policy, append(append(file, "# "...), append(bytes.Repeat([]byte("x"), pad), '\n')...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.sb.pol.Reload(); err != nil {
		t.Fatal(err)
	}
	before, _ = os.ReadFile(h.policy)
	long := strings.Repeat("a", 60)
	code, body = h.do(t, "POST", "/api/v1/sandboxes/myapp/proposal", fmt.Sprintf(`{"rules": [{"pattern": "fits.test"}, {"pattern": "%[1]s.one.test"}, {"pattern": "%[1]s.two.test"}, {"pattern": "%[1]s.three.test"}, {"pattern": "%[1]s.four.test"}]}`, long))
	if code != 500 || !strings.Contains(body, "nothing was saved") {
		t.Fatalf("save past the size limit: %d %s", code, body)
	}
	if after, _ := os.ReadFile(h.policy); string(after) != string(before) {
		t.Errorf("a save that could not be written whole changed the file (%d bytes to %d)", len(before), len(after))
	}
	if d := h.sb.pol.Decide(policy.Query{Source: "agent", Host: "fits.test", Port: 443}); d.Rule != nil {
		t.Errorf("fits.test in force after a save that failed: %v", d)
	}
}

func getProposal(t *testing.T, h *apiHarness) ProposalView {
	t.Helper()
	code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/proposal", "")
	var pv ProposalView
	if code != 200 || json.Unmarshal([]byte(body), &pv) != nil {
		t.Fatalf("GET proposal: %d %s", code, body)
	}
	return pv
}

// A member's request whose path is longer than a pattern may be (well
// within what the proxy reads and the journal keeps) is proposed with the
// path prefix shortened until it fits, never as the whole host.
func TestProposalLongPathStaysUnderItsPrefix(t *testing.T) {
	h := newAPI(t, "sandbox:\n  unknown_action: learn\n")
	learned := policy.ReasonLearn.String()
	long := strings.Repeat("a", policy.MaxPatternLen)
	for _, u := range []string{"http://api.test/v1/" + long + "/x", "http://api.test/v1/" + long + "/y"} {
		h.sb.journal.Add(audit.Entry{Kind: audit.KindRequest, Sandbox: "myapp", Source: "agent", Method: "GET", URL: u, Host: "api.test", Verdict: "learned", Reason: learned})
	}
	pv := getProposal(t, h)
	if len(pv.Patterns) != 1 || pv.Patterns[0].Pattern != "api.test/v1/*" || len(pv.Patterns[0].Flags) != 0 {
		t.Fatalf("patterns: %+v", pv.Patterns)
	}
	p := policy.MustParse(pv.Patterns[0].Pattern)
	if p.Matches(policy.Query{Source: "agent", Host: "api.test", Port: 80, Method: "POST", Path: "/admin/delete"}) {
		t.Errorf("proposed %q allows POST /admin/delete too", pv.Patterns[0].Pattern)
	}
}

// A held connection a person denied (without saving a deny rule) is
// proposed flagged, so the page leaves it unticked and --save skips it;
// one allowed once, or still held, is not.
func TestProposalFlagsWhatAPersonDenied(t *testing.T) {
	h := newAPI(t, "sandbox:\n  unknown_action: ask\n")
	for _, e := range []audit.Entry{
		{Kind: audit.KindApproval, Source: "agent", Host: "exfil.test", Port: 443, URL: "exfil.test:443", ApprovalID: "a1", Action: "opened"},
		{Kind: audit.KindApproval, Source: "agent", Host: "exfil.test", Port: 443, URL: "exfil.test:443", ApprovalID: "a1", Action: "deny"},
		{Kind: audit.KindApproval, Source: "agent", Host: "once.test", Port: 443, URL: "once.test:443", ApprovalID: "a2", Action: "opened"},
		{Kind: audit.KindApproval, Source: "agent", Host: "once.test", Port: 443, URL: "once.test:443", ApprovalID: "a2", Action: "allow_once"},
		{Kind: audit.KindApproval, Source: "agent", Host: "held.test", Port: 443, URL: "held.test:443", ApprovalID: "a3", Action: "opened"},
	} {
		e.Sandbox = "myapp"
		h.sb.journal.Add(e)
	}
	got := map[string][]string{}
	for _, p := range getProposal(t, h).Patterns {
		got[p.Pattern] = p.Flags
	}
	want := map[string][]string{"exfil.test": {policy.FlagDenied}, "once.test": nil, "held.test": nil}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("proposal flags (-want +got):\n%s", diff)
	}
}
