package policy

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func openTestSandbox(t *testing.T, content string) (*Sandbox, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "app.yaml")
	if content != "" {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := OpenSandbox(SandboxConfig{Name: "myapp", Path: path, Now: func() time.Time {
		return time.Date(2026, 11, 21, 6, 0, 0, 0, time.UTC)
	}})
	if err != nil {
		t.Fatal(err)
	}
	return s, path
}

func verdict(s *Sandbox, host string) Verdict {
	return s.Decide(Query{Host: host, Port: 443}).Verdict
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSandboxMissingFileIsDefault(t *testing.T) {
	s, path := openTestSandbox(t, "")
	if v := verdict(s, "unknown.test"); v != Ask {
		t.Errorf("unknown host with no policy file: %v, want ask", v)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("OpenSandbox created the policy file: %v", err)
	}
}

func TestSandboxSessionRuleStaysInMemory(t *testing.T) {
	s, path := openTestSandbox(t, "name: myapp\n")
	r, err := s.Add(AddRequest{Pattern: "api.example.com", List: Allowlist, Source: "approved during run"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Tier != Session || verdict(s, "api.example.com") != Allow {
		t.Fatalf("session rule %+v, verdict %v", r, verdict(s, "api.example.com"))
	}
	if got := readFile(t, path); got != "name: myapp\n" {
		t.Errorf("a session rule changed the file:\n%s", got)
	}
	again, _ := OpenSandbox(SandboxConfig{Name: "myapp", Path: path})
	if verdict(again, "api.example.com") != Ask {
		t.Error("a session rule survived a reopen")
	}
}

func TestSandboxPersistedRuleIsOnDisk(t *testing.T) {
	s, path := openTestSandbox(t, "name: myapp  # keep me\n")
	if _, err := s.Add(AddRequest{Pattern: "*.example.com/*", List: Allowlist}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Add(AddRequest{Pattern: "API.Example.com", List: Allowlist, Persist: true, Source: "manually added"})
	if err != nil {
		t.Fatal(err)
	}
	file := readFile(t, path)
	for _, want := range []string{"name: myapp  # keep me", `pattern: "api.example.com"`, `source: "manually added"`, `added: "2026-11-21T06:00:00Z"`} {
		if !strings.Contains(file, want) {
			t.Errorf("policy file lacks %q:\n%s", want, file)
		}
	}
	again, err := OpenSandbox(SandboxConfig{Name: "myapp", Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if verdict(again, "api.example.com") != Allow {
		t.Error("persisted rule not in force after reopening")
	}
	// The same rule again: nothing changes, the same rule comes back.
	dup, err := s.Add(AddRequest{Pattern: "api.example.com", List: Allowlist, Persist: true})
	if err != nil || dup.ID != r.ID {
		t.Errorf("duplicate add = %+v, %v; want the existing rule", dup, err)
	}
	if readFile(t, path) != file {
		t.Error("duplicate add rewrote the file")
	}
	// Removing it takes it off disk and out of force.
	if _, err := s.Remove(r.ID); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(readFile(t, path), "api.example.com") || verdict(s, "api.example.com") != Allow /* still *.example.com/* session */ {
		t.Errorf("after remove:\n%s", readFile(t, path))
	}
	if verdict(s, "example.com") != Ask {
		t.Error("example.com should be unknown")
	}
}

func TestSandboxSaveSessionRuleToProject(t *testing.T) {
	s, path := openTestSandbox(t, "")
	sess, _ := s.Add(AddRequest{Pattern: "api.example.com", List: Allowlist})
	saved, err := s.Add(AddRequest{Pattern: "api.example.com", List: Allowlist, Persist: true})
	if err != nil {
		t.Fatal(err)
	}
	if saved.ID != sess.ID || saved.Tier != User {
		t.Errorf("saved = %+v", saved)
	}
	n := 0
	for _, r := range s.Rules() {
		if r.ID == saved.ID {
			n++
		}
	}
	if n != 1 {
		t.Errorf("rule listed %d times after saving the session rule, want once", n)
	}
	if !strings.Contains(readFile(t, path), "api.example.com") {
		t.Error("not written")
	}
}

func TestSandboxDenyAndRemoveErrors(t *testing.T) {
	s, path := openTestSandbox(t, "sandbox:\n  mcp_servers:\n    - name: github\n")
	d, err := s.Add(AddRequest{Pattern: "pastebin.com", List: Denylist, Persist: true, Source: "denied during run"})
	if err != nil {
		t.Fatal(err)
	}
	if verdict(s, "pastebin.com") != Deny || !strings.Contains(readFile(t, path), "network_denylist") {
		t.Errorf("persisted deny not in force or not under network_denylist:\n%s", readFile(t, path))
	}
	if verdict(s, "api.github.com") != Allow {
		t.Error("mcp_servers github did not allow api.github.com")
	}
	var auto *Rule
	for _, r := range s.Rules() {
		if r.Tier == Auto {
			auto = r
		}
	}
	if _, err := s.Remove(auto.ID); !errors.Is(err, ErrAutoRule) {
		t.Errorf("removing an auto rule: %v, want ErrAutoRule", err)
	}
	if _, err := s.Remove("000000000000"); !errors.Is(err, ErrNoRule) {
		t.Errorf("removing a missing rule: %v, want ErrNoRule", err)
	}
	if _, err := s.Remove(d.ID); err != nil || verdict(s, "pastebin.com") != Ask {
		t.Errorf("remove deny: %v, verdict %v", err, verdict(s, "pastebin.com"))
	}
}

func TestSandboxBroadPatterns(t *testing.T) {
	s, path := openTestSandbox(t, "")
	if _, err := s.Add(AddRequest{Pattern: "*.com", List: Allowlist, Persist: true}); !errors.Is(err, ErrBroad) {
		t.Fatalf("broad allow without force: %v, want ErrBroad", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Error("a refused pattern created the file")
	}
	if _, err := s.Add(AddRequest{Pattern: "*.com", List: Allowlist, Persist: true, Force: true}); err != nil {
		t.Fatalf("forced: %v", err)
	}
	if !strings.Contains(readFile(t, path), "force: true") || verdict(s, "x.com") != Allow {
		t.Errorf("forced rule:\n%s", readFile(t, path))
	}
	if _, err := s.Add(AddRequest{Pattern: "*", List: Denylist}); err != nil {
		t.Errorf("a broad deny needs no force: %v", err)
	}
	if _, err := s.Add(AddRequest{Pattern: "bad pattern here", List: Allowlist}); err == nil {
		t.Error("bad pattern accepted")
	}
}

func TestSandboxReloadKeepsLastGoodPolicy(t *testing.T) {
	s, path := openTestSandbox(t, "sandbox:\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n")
	if err := os.WriteFile(path, []byte("sandbox:\n  network_allowlist:\n    user:\n      - patern: typo.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := s.Reload()
	if err == nil || !strings.Contains(err.Error(), "app.yaml:4") || !strings.Contains(err.Error(), "patern") {
		t.Errorf("reload of a broken file: %v; want an error naming app.yaml:4 and the key", err)
	}
	if verdict(s, "allowed.test") != Allow {
		t.Error("the last good policy is no longer in force")
	}
}

func TestSandboxDisabledDeniesEverything(t *testing.T) {
	s, _ := openTestSandbox(t, "sandbox:\n  enabled: false\n  unknown_action: allow\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n")
	for _, h := range []string{"allowed.test", "unknown.test"} {
		if v := verdict(s, h); v != Deny {
			t.Errorf("%s in a disabled sandbox: %v, want deny", h, v)
		}
	}
}

func TestSandboxConcurrentDecideAndEdit(t *testing.T) {
	s, path := openTestSandbox(t, "")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					s.Decide(Query{Host: "h3.example.com", Port: 443})
				}
			}
		}()
	}
	for i := 0; i < 20; i++ {
		if _, err := s.Add(AddRequest{Pattern: "h" + string(rune('a'+i)) + ".example.com", List: Allowlist, Persist: i%2 == 0}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	spec, err := LoadSpec(path)
	if err != nil || len(spec.User) != 10 {
		t.Errorf("file has %d user rules (%v), want 10", len(spec.User), err)
	}
}

func TestOpenSandboxErrors(t *testing.T) {
	if _, err := OpenSandbox(SandboxConfig{Name: "Bad_Name", Path: "/x"}); err == nil {
		t.Error("bad name accepted")
	}
	if _, err := OpenSandbox(SandboxConfig{Name: "ok"}); err == nil {
		t.Error("missing path accepted")
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("sandbox:\n  unknown_action: maybe\n"), 0o644)
	if _, err := OpenSandbox(SandboxConfig{Name: "ok", Path: bad}); err == nil || !strings.Contains(err.Error(), "bad.yaml:2") {
		t.Errorf("broken file: %v", err)
	}
}

func TestSandboxUserAddedMemberGetsOnlyItsRules(t *testing.T) {
	s, _ := openTestSandbox(t, `sandbox:
  unknown_action: ask
  network_allowlist:
    auto: [api.anthropic.com]
    user:
      - pattern: "api.example.com"
      - pattern: "tools.example.com"
        member: "mcp:custom"
  network_denylist:
    - pattern: "evil.example.com"
  mcp_servers:
    - name: custom
      transport: sse
      image: custom-mcp:1
      command: ["/srv", "--port", "8080"]
      env: {LOG_LEVEL: debug}
    - name: github
    - name: vouched
      trust: verified
`)
	spec := s.Spec()
	if got := spec.MCPServers[0]; got.Trust != TrustUserAdded || got.Image != "custom-mcp:1" || len(got.Command) != 3 || got.Env["LOG_LEVEL"] != "debug" {
		t.Errorf("custom server parsed as %+v", got)
	}
	if spec.MCPServers[1].Trust != TrustBuiltin || spec.MCPServers[2].Trust != TrustVerified {
		t.Errorf("trust of github %v, vouched %v; want builtin, verified", spec.MCPServers[1].Trust, spec.MCPServers[2].Trust)
	}
	tests := []struct {
		source, host string
		want         Verdict
	}{
		{"mcp:custom", "tools.example.com", Allow}, // a rule names it
		{"mcp:custom", "api.example.com", Deny},    // everyone's rule, not its own
		{"mcp:custom", "api.anthropic.com", Deny},  // auto entries too
		{"mcp:custom", "unknown.test", Deny},       // not asked: denied
		{"mcp:custom", "evil.example.com", Deny},
		{"mcp:vouched", "api.example.com", Allow},
		{"agent", "api.example.com", Allow},
		{"agent", "unknown.test", Ask},
		{"agent", "tools.example.com", Ask}, // the rule is mcp:custom's only
	}
	for _, tc := range tests {
		d := s.Decide(Query{Source: tc.source, Host: tc.host, Port: 443})
		if d.Verdict != tc.want {
			t.Errorf("%s -> %s: %v (%s), want %v", tc.source, tc.host, d.Verdict, d, tc.want)
		}
		if tc.source == "mcp:custom" && tc.want == Deny && tc.host != "evil.example.com" && d.Reason != ReasonUntrusted {
			t.Errorf("%s -> %s: reason %v, want ReasonUntrusted", tc.source, tc.host, d.Reason)
		}
		if n := s.DecideName(tc.source, tc.host); (n.Verdict == Allow) != (tc.want == Allow) {
			t.Errorf("DNS %s -> %s: %v, want allowed=%v", tc.source, tc.host, n.Verdict, tc.want == Allow)
		}
	}
	if d := s.Decide(Query{Source: "mcp:custom", Host: "tools.example.com", Port: 443, Method: "GET", Path: "/x"}); d.Verdict != Allow {
		t.Errorf("request from mcp:custom to its own host: %v", d)
	}
	if d := s.Decide(Query{Source: "mcp:custom", Host: "api.example.com", Port: 443, Method: "GET", Path: "/x"}); d.Verdict != Deny {
		t.Errorf("request from mcp:custom to everyone's host: %v", d)
	}

	// A member airlock could not name is known by its bare address only:
	// trusted as before unless the sandbox says otherwise (airlockd does).
	if v := s.Decide(Query{Source: "10.88.0.200", Host: "api.example.com", Port: 443}).Verdict; v != Allow {
		t.Errorf("unnamed member, by default: %v, want allow", v)
	}
	s.unnamedUntrusted = true
	for _, src := range []string{"10.88.0.200", "fd00::1"} {
		if v := s.Decide(Query{Source: src, Host: "api.example.com", Port: 443}).Verdict; v != Deny {
			t.Errorf("unnamed member %s: %v, want deny", src, v)
		}
	}
	s.unnamedUntrusted = false

	// A container labelled user_added at run time.
	s.SetTrust("scraper", TrustUserAdded)
	if v := s.Decide(Query{Source: "scraper", Host: "api.example.com", Port: 443}).Verdict; v != Deny {
		t.Errorf("user_added container: %v, want deny", v)
	}
	s.SetTrust("scraper", 0)
	if v := s.Decide(Query{Source: "scraper", Host: "api.example.com", Port: 443}).Verdict; v != Allow {
		t.Errorf("forgotten container: %v, want allow", v)
	}
}

func TestParseMCPServerFieldsRefused(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"image: \"\"", "want an image reference"},
		{"image: \"a b\"", "want an image reference"},
		{"trust: root", `unknown trust level "root"`},
		{"env: [A]", "want a mapping of NAME: value"},
		{"env: {\"A-B\": x}", `environment name "A-B"`},
		{"command: /bin/sh", "want a list"},
	} {
		_, err := ParseSpec("app.yaml", []byte("sandbox:\n  mcp_servers:\n    - name: x\n      "+tc.body+"\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "app.yaml:") {
			t.Errorf("%s: error %v, want one naming app.yaml:LINE and %q", tc.body, err, tc.want)
		}
	}
}

func TestSandboxHighRiskServerIsAskedEachRequest(t *testing.T) {
	s, _ := openTestSandbox(t, `sandbox:
  network_allowlist:
    user:
      - pattern: "allowed.example"
      - pattern: "docs.example/*"
        member: "mcp:fetch"
  network_denylist:
    - pattern: "evil.example"
`)
	conn := func(host string) Decision { return s.Decide(Query{Source: "mcp:fetch", Host: host, Port: 443}) }
	req := func(host, path string) Decision {
		return s.Decide(Query{Source: "mcp:fetch", Host: host, Port: 443, Method: "GET", Path: path})
	}
	if d := conn("allowed.example"); d.Verdict != NeedsL7 || d.Reason != ReasonAskEach {
		t.Errorf("fetch to a host everyone may reach: %v, want needs-L7 (intercept and ask)", d)
	}
	if d := req("allowed.example", "/page"); d.Verdict != Ask || d.Reason != ReasonAskEach {
		t.Errorf("fetch request to a host everyone may reach: %v, want ask", d)
	}
	if d := req("docs.example", "/guide"); d.Verdict != Allow {
		t.Errorf("fetch request its own rule allows: %v, want allow", d)
	}
	if d := conn("evil.example"); d.Verdict != Deny || d.Reason != ReasonDenyRule {
		t.Errorf("fetch to a denied host: %v, want the deny rule", d)
	}
	if d := s.DecideName("mcp:fetch", "allowed.example"); d.Verdict != Ask {
		t.Errorf("fetch DNS for a host others may reach: %v, want ask (a fake address, not forwarded)", d)
	}
	if d := s.Decide(Query{Source: "mcp:github", Host: "allowed.example", Port: 443}); d.Verdict != Allow {
		t.Errorf("github (medium risk) to an allowed host: %v, want allow", d)
	}

	s2, _ := openTestSandbox(t, "sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user: [{pattern: allowed.example}]\n")
	if d := s2.Decide(Query{Source: "mcp:puppeteer", Host: "allowed.example", Port: 443, Method: "GET", Path: "/"}); d.Verdict != Deny {
		t.Errorf("puppeteer in a deny sandbox: %v, want deny", d)
	}
	s3, _ := openTestSandbox(t, "sandbox:\n  unknown_action: allow\n")
	if d := s3.Decide(Query{Source: "mcp:browserbase", Host: "any.example", Port: 443, Method: "GET", Path: "/"}); d.Verdict != Ask {
		t.Errorf("browserbase in an allow-all sandbox: %v, want ask: high-risk servers are never let through unasked", d)
	}
}

// TestSandboxOnResourcesFollowsThePolicyInForce: whoever enforces the
// resources outside the policy hears each policy put in force (opened,
// reloaded, restricted by a poll, re-read by an edit) and not one that is
// refused.
func TestSandboxOnResourcesFollowsThePolicyInForce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("sandbox:\n  resources: {bandwidth_mbps: 20}\n")
	var got []int
	s, err := OpenSandbox(SandboxConfig{Name: "myapp", Path: path, OnResources: func(r Resources) { got = append(got, r.BandwidthMbps) }})
	if err != nil {
		t.Fatal(err)
	}
	write("sandbox:\n  resources: {bandwidth_mbps: 5}\n")
	if err := s.ReloadRestricting(); err != nil {
		t.Fatalf("lowering the bandwidth is a restriction: %v", err)
	}
	write("sandbox:\n  resources: {}\n")
	var we *WidensError
	if err := s.ReloadRestricting(); !errors.As(err, &we) {
		t.Fatalf("lifting the bandwidth cap on a poll: %v, want a WidensError", err)
	}
	write("sandbox:\n  resources: {bandwidth_mbps: 1x}\n")
	if err := s.Reload(); err == nil {
		t.Fatal("a broken file reloaded")
	}
	write("sandbox:\n  resources: {}\n")
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(AddRequest{Pattern: "api.example.com", List: Allowlist, Persist: true}); err != nil {
		t.Fatal(err)
	}
	if want := []int{20, 5, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("OnResources heard bandwidths %v, want %v", got, want)
	}
}

// TestSandboxAddAllIsAllOrNothing: rules added together are written in one
// edit. When one of them cannot be written, none is: the file and the rules
// in force stay as they were. Repeats and rules already there are the
// rules there.
func TestSandboxAddAllIsAllOrNothing(t *testing.T) {
	// The allowlist's user rules sit in a flow mapping, which an edit
	// refuses to rewrite; the denylist can take entries.
	s, path := openTestSandbox(t, "sandbox:\n  unknown_action: deny\n  network_allowlist: {user: [{pattern: kept.test}]}\n  network_denylist:\n    - pattern: evil.test\n")
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.AddAll([]AddRequest{
		{Pattern: "pastebin.test", List: Denylist, Persist: true},
		{Pattern: "new.test", List: Allowlist, Persist: true},
	})
	if err == nil || !strings.Contains(err.Error(), `"new.test"`) {
		t.Fatalf("AddAll with a rule that cannot be written: %v, want an error naming new.test", err)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Errorf("the file changed:\n%s", after)
	}
	for _, r := range s.Rules() {
		if p := r.Pattern.String(); p == "pastebin.test" || p == "new.test" {
			t.Errorf("%s %s in force after a failed AddAll", r.List, p)
		}
	}

	s, path = openTestSandbox(t, "sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user:\n      - pattern: kept.test\n")
	rules, err := s.AddAll([]AddRequest{
		{Pattern: "one.test", List: Allowlist, Persist: true, Source: "learned"},
		{Pattern: "kept.test", List: Allowlist, Persist: true},
		{Pattern: "two.test", List: Allowlist, Persist: true, Member: "agent"},
		{Pattern: "one.test", List: Allowlist, Persist: true},
		{Pattern: "bad.test", List: Denylist, Persist: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"one.test", "kept.test", "two.test", "one.test", "bad.test"}
	for i, r := range rules {
		if r.Pattern.String() != want[i] || r.Tier != User {
			t.Errorf("rules[%d] = %s %s, want user rule %s", i, r.Tier, r.Pattern, want[i])
		}
	}
	if rules[0] != rules[3] {
		t.Errorf("a repeated request added a second rule")
	}
	file, _ := os.ReadFile(path)
	if n := strings.Count(string(file), "one.test"); n != 1 {
		t.Errorf("one.test written %d times:\n%s", n, file)
	}
	for _, w := range []string{"kept.test", "two.test", `member: "agent"`, "network_denylist", "bad.test", `source: "learned"`} {
		if !strings.Contains(string(file), w) {
			t.Errorf("file lacks %q:\n%s", w, file)
		}
	}
	for host, verdict := range map[string]Verdict{"one.test": Allow, "kept.test": Allow, "bad.test": Deny, "other.test": Deny} {
		if d := s.Decide(Query{Host: host, Port: 443}); d.Verdict != verdict {
			t.Errorf("%s: %v, want %v", host, d.Verdict, verdict)
		}
	}
	if d := s.Decide(Query{Source: "agent", Host: "two.test", Port: 443}); d.Verdict != Allow {
		t.Errorf("two.test for agent: %v", d.Verdict)
	}
	// A bad request adds nothing, also after good ones.
	if _, err := s.AddAll([]AddRequest{{Pattern: "three.test", List: Allowlist, Persist: true}, {Pattern: "*.com", List: Allowlist, Persist: true}}); err == nil {
		t.Fatal("AddAll took a broad pattern without force")
	}
	if after, _ := os.ReadFile(path); string(after) != string(file) {
		t.Errorf("a refused AddAll changed the file:\n%s", after)
	}
}
