package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// presetRows renders the presets as the rows of docs/policy.md's table:
// preset, host (with its path), methods, why.
func presetRows() [][4]string {
	var rows [][4]string
	for _, p := range Presets() {
		for _, e := range p.Entries {
			methods := "GET, HEAD"
			switch {
			case e.Methods == nil:
			case len(e.Methods) == 0:
				methods = "any"
			default:
				methods = strings.Join(e.Methods, ", ")
			}
			rows = append(rows, [4]string{p.Name, e.Host + e.Path, methods, e.Why})
		}
		if len(p.Includes) > 0 {
			rows = append(rows, [4]string{p.Name, "all of " + strings.Join(p.Includes, ", "), "", p.Description})
		}
	}
	return rows
}

// TestPresetsMatchDocs reads the presets table of docs/policy.md, so that
// the documented names and hosts are the ones airlock allows.
func TestPresetsMatchDocs(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "policy.md"))
	if err != nil {
		t.Fatal(err)
	}
	const header = "| preset | host | methods | why |"
	_, table, ok := strings.Cut(string(doc), header+"\n")
	if !ok {
		t.Fatalf("docs/policy.md has no table starting %q", header)
	}
	var got [][4]string
	for i, line := range strings.Split(table, "\n") {
		if i == 0 {
			continue // |---|---|
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 4 {
			t.Fatalf("table row %q: want 4 cells", line)
		}
		var row [4]string
		for j, c := range cells {
			row[j] = strings.ReplaceAll(strings.TrimSpace(c), "`", "")
		}
		got = append(got, row)
	}
	want := presetRows()
	if diff := cmp.Diff(want, got); diff != "" {
		var b strings.Builder
		for _, r := range want {
			methods := r[2]
			if methods != "" {
				methods = " " + methods + " "
			} else {
				methods = " "
			}
			b.WriteString("| `" + r[0] + "` | `" + r[1] + "` |" + methods + "| " + r[3] + " |\n")
		}
		t.Errorf("docs/policy.md's presets table differs from the presets (-want +got):\n%s\nthe table should read:\n%s%s", diff, header+"\n|---|---|---|---|\n", b.String())
	}
	for _, name := range []string{"python", "node", "go", "rust", "ruby", "java", "debian", "ubuntu", "alpine", "github", "gitlab", "docker-hub", "huggingface", "llm", "package-managers"} {
		if _, ok := LookupPreset(name); !ok {
			t.Errorf("no preset %q", name)
		}
	}
}

func TestPresetData(t *testing.T) {
	for _, p := range Presets() {
		if p.Description == "" || len(p.Entries) == 0 && len(p.Includes) == 0 {
			t.Errorf("preset %s: no description or nothing in it", p.Name)
		}
		for _, in := range p.Includes {
			if _, ok := LookupPreset(in); !ok {
				t.Errorf("preset %s includes unknown %s", p.Name, in)
			}
		}
		for _, e := range p.Entries {
			if e.Why == "" {
				t.Errorf("preset %s: %s says not why", p.Name, e.Host)
			}
			for _, s := range e.Patterns() {
				// Presets are accepted without force: none is broad.
				if _, err := Parse(s, ParseOptions{}); err != nil {
					t.Errorf("preset %s: %v", p.Name, err)
				}
			}
		}
	}
	rules := PresetRules([]string{"package-managers", "python"})
	var hosts []string
	for _, r := range rules {
		if r.Tier != FromPreset || r.List != Allowlist || !strings.HasPrefix(r.Source, "preset:") {
			t.Errorf("rule %v: tier %v, source %q", r, r.Tier, r.Source)
		}
		if r.Pattern.Host() == "pypi.org" {
			hosts = append(hosts, r.Pattern.String()+" "+r.Source)
		}
	}
	// python comes in through package-managers, labelled with the
	// preset that holds it, once.
	if diff := cmp.Diff([]string{"GET pypi.org preset:python", "HEAD pypi.org preset:python"}, hosts); diff != "" {
		t.Errorf("pypi.org rules (-want +got):\n%s", diff)
	}
	if _, err := CheckPresets([]string{"python", "nope"}); !errors.Is(err, ErrUnknownPreset) || !strings.Contains(err.Error(), `"nope": want one of python, node`) {
		t.Errorf("CheckPresets(nope) = %v", err)
	}
}

func TestPresetDecisions(t *testing.T) {
	s, _ := openTestSandbox(t, `sandbox:
  unknown_action: allow
  presets: [python, github]
  network_allowlist:
    user:
      - pattern: "POST pypi.org/legacy/*"
      - pattern: files.pythonhosted.org
        member: uploader
  network_denylist:
    - pattern: "GET pypi.org/simple/evil/*"
  mcp_servers:
    - name: custom
      trust: user_added
`)
	type result struct {
		Verdict, Reason, Rule, Detail string
	}
	for _, tc := range []struct {
		name string
		q    Query
		want result
	}{
		{"connection: intercepted", Query{Source: "agent", Host: "PyPI.org", Port: 443},
			result{"needs-l7", ReasonPathRules.String(), "GET pypi.org", ReasonPathRules.String() + " (rule GET pypi.org of preset python)"}},
		{"GET", Query{Source: "agent", Host: "pypi.org", Port: 443, Method: "GET", Path: "/simple/requests/"},
			result{"allow", ReasonAllowRule.String(), "GET pypi.org", ReasonAllowRule.String() + " (rule GET pypi.org of preset python)"}},
		{"HEAD", Query{Source: "agent", Host: "files.pythonhosted.org", Port: 443, Method: "HEAD", Path: "/x.whl"},
			result{"allow", ReasonAllowRule.String(), "HEAD files.pythonhosted.org", ReasonAllowRule.String() + " (rule HEAD files.pythonhosted.org of preset python)"}},
		{"POST: read only, whatever unknown_action says", Query{Source: "agent", Host: "pypi.org", Port: 443, Method: "POST", Path: "/upload"},
			result{"deny", ReasonReadOnly.String(), "GET pypi.org", ReasonReadOnly.String() + " (rule GET pypi.org of preset python)"}},
		{"a user rule allows more", Query{Source: "agent", Host: "pypi.org", Port: 443, Method: "POST", Path: "/legacy/x"},
			result{"allow", ReasonAllowRule.String(), "POST pypi.org/legacy/*", ReasonAllowRule.String()}},
		{"a member's rule allows more for it", Query{Source: "uploader", Host: "files.pythonhosted.org", Port: 443, Method: "PUT", Path: "/x"},
			result{"allow", ReasonAllowRule.String(), "files.pythonhosted.org", ReasonAllowRule.String()}},
		{"deny rules first", Query{Source: "agent", Host: "pypi.org", Port: 443, Method: "GET", Path: "/simple/evil/"},
			result{"deny", ReasonDenyRule.String(), "GET pypi.org/simple/evil/*", ReasonDenyRule.String()}},
		{"git clone", Query{Source: "agent", Host: "github.com", Port: 443, Method: "POST", Path: "/o/r.git/git-upload-pack"},
			result{"allow", ReasonAllowRule.String(), "POST github.com/*/git-upload-pack", ReasonAllowRule.String() + " (rule POST github.com/*/git-upload-pack of preset github)"}},
		{"git push", Query{Source: "agent", Host: "github.com", Port: 443, Method: "POST", Path: "/o/r.git/git-receive-pack"},
			result{"deny", ReasonReadOnly.String(), "GET github.com", ReasonReadOnly.String() + " (rule GET github.com of preset github)"}},
		{"other port: not the preset's", Query{Source: "agent", Host: "pypi.org", Port: 8443, Method: "POST", Path: "/"},
			result{"allow", ReasonUnknown.String(), "", ReasonUnknown.String()}},
		{"user_added member: presets are not its rules", Query{Source: "mcp:custom", Host: "pypi.org", Port: 443, Method: "GET", Path: "/"},
			result{"deny", ReasonUntrusted.String(), "", ReasonUntrusted.String()}},
		{"high-risk member: asked", Query{Source: "mcp:fetch", Host: "pypi.org", Port: 443, Method: "GET", Path: "/"},
			result{"ask", ReasonAskEach.String(), "", ReasonAskEach.String()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := s.Decide(tc.q)
			got := result{d.Verdict.String(), d.Reason.String(), "", d.Detail()}
			if d.Rule != nil {
				got.Rule = d.Rule.Pattern.String()
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decide (-want +got):\n%s", diff)
			}
		})
	}

	// Preset rules are listed, labelled and read-only.
	var id string
	for _, r := range s.Rules() {
		if r.Tier == FromPreset && r.Pattern.String() == "HEAD pypi.org" {
			id = r.ID
			if r.Source != "preset:python" || r.Tier.String() != "preset" {
				t.Errorf("preset rule: source %q tier %v", r.Source, r.Tier)
			}
		}
	}
	if _, err := s.Remove(id); !errors.Is(err, ErrPresetRule) || !strings.Contains(err.Error(), "turn its preset python off") {
		t.Errorf("Remove(preset rule) = %v", err)
	}
	if _, _, err := s.Replace(ReplaceRequest{ID: id, Pattern: "pypi.org"}); !errors.Is(err, ErrPresetRule) {
		t.Errorf("Replace(preset rule) = %v", err)
	}
}

func TestLearnDecisions(t *testing.T) {
	now := time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	deny := NewRule(Denylist, User, MustParse("evil.test"), "", "", time.Time{})
	rs := NewRuleset(ActionLearn, []*Rule{deny}).Learning(now.Add(time.Minute), clock)
	for _, tc := range []struct {
		name    string
		q       Query
		verdict Verdict
		reason  Reason
	}{
		{"unknown host: learned", Query{Source: "agent", Host: "new.test", Port: 443}, Allow, ReasonLearn},
		{"unknown request: learned", Query{Source: "agent", Host: "new.test", Port: 80, Method: "POST", Path: "/"}, Allow, ReasonLearn},
		{"deny rules still deny", Query{Source: "agent", Host: "EVIL.test", Port: 443}, Deny, ReasonDenyRule},
		{"raw IPs still need a cidr rule", Query{Source: "agent", Host: "203.0.113.9", Port: 443}, Deny, ReasonRawIP},
		{"a high-risk member is still asked", Query{Source: "mcp:fetch", Host: "new.test", Port: 80, Method: "GET", Path: "/", AskEach: true}, Ask, ReasonAskEach},
		{"a user_added member is still denied", Query{Source: "x", Host: "new.test", Port: 443, MemberOnly: true}, Deny, ReasonUntrusted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := rs.Decide(tc.q)
			if d.Verdict != tc.verdict || d.Reason != tc.reason {
				t.Errorf("Decide = %v, want %v (%v)", d, tc.verdict, tc.reason)
			}
		})
	}
	if d := rs.DecideName("agent", "new.test"); d.Verdict != Allow || d.Reason != ReasonLearn {
		t.Errorf("DecideName while learning = %v", d)
	}
	now = now.Add(time.Minute)
	if d := rs.Decide(Query{Source: "agent", Host: "new.test", Port: 443}); d.Verdict != Ask || d.Unknown != ActionAsk {
		t.Errorf("Decide after learn_until = %v, want ask", d)
	}
	for _, tc := range []struct {
		v      Verdict
		reason string
		want   string
	}{
		{Allow, ReasonLearn.String(), "learned"},
		{Allow, "intercepted: " + ReasonLearn.String(), "learned"},
		{Allow, ReasonAllowRule.String(), "allow"},
		{Deny, ReasonLearn.String(), "deny"},
	} {
		if got := RecordVerdict(tc.v, tc.reason); got != tc.want {
			t.Errorf("RecordVerdict(%v, %q) = %q, want %q", tc.v, tc.reason, got, tc.want)
		}
	}
}

func TestSandboxLearnUntil(t *testing.T) {
	now := time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)
	path := filepath.Join(t.TempDir(), "app.yaml")
	if err := os.WriteFile(path, []byte("sandbox:\n  unknown_action: learn\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := OpenSandbox(SandboxConfig{Name: "myapp", Path: path, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	// No learn_until: an hour from when learn mode was put in force, kept
	// across reloads that leave it on.
	if got, want := s.LearnUntil(), now.Add(time.Hour); !got.Equal(want) {
		t.Errorf("LearnUntil = %v, want %v", got, want)
	}
	now = now.Add(30 * time.Minute)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if got, want := s.LearnUntil(), now.Add(30*time.Minute); !got.Equal(want) {
		t.Errorf("LearnUntil after a reload = %v, want %v", got, want)
	}
	if d := s.Decide(Query{Source: "agent", Host: "new.test", Port: 443}); d.Reason != ReasonLearn {
		t.Errorf("Decide while learning = %v", d)
	}
	now = now.Add(30 * time.Minute)
	if d := s.Decide(Query{Source: "agent", Host: "new.test", Port: 443}); d.Verdict != Ask {
		t.Errorf("Decide after the hour = %v, want ask", d)
	}
	if !s.LearnUntil().IsZero() {
		t.Errorf("LearnUntil after the hour = %v, want zero", s.LearnUntil())
	}
	// Turning learn on through the settings writes its end to the file.
	if _, err := s.SetSettings(Settings{UnknownAction: ptr(ActionAsk)}); err != nil {
		t.Fatal(err)
	}
	spec, err := s.SetSettings(Settings{UnknownAction: ptr(ActionLearn)})
	if err != nil {
		t.Fatal(err)
	}
	want := now.Add(time.Hour)
	if !spec.LearnUntil.Equal(want) || !s.LearnUntil().Equal(want) {
		t.Errorf("learn_until = %v / %v, want %v", spec.LearnUntil, s.LearnUntil(), want)
	}
	if text := readText(t, path); !strings.Contains(text, `learn_until: "`+want.Format(time.RFC3339)+`"`) {
		t.Errorf("file:\n%s", text)
	}
}

// TestPresetOnDiskWaitsForReload: a preset turned on by an edit on disk
// widens access, so an unattended reload leaves it out of force, and the
// API's edits of the file are refused until a person reloads.
func TestPresetOnDiskWaitsForReload(t *testing.T) {
	s, path := openTestSandbox(t, "sandbox:\n  unknown_action: ask\n")
	if err := os.WriteFile(path, []byte("sandbox:\n  unknown_action: ask\n  presets: [python]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var we *WidensError
	if err := s.ReloadRestricting(); !errors.As(err, &we) || !strings.Contains(err.Error(), "preset turned on: python") {
		t.Fatalf("ReloadRestricting = %v, want a WidensError naming the preset", err)
	}
	if d := s.Decide(Query{Host: "pypi.org", Port: 443, Method: "GET", Path: "/"}); d.Verdict != Ask {
		t.Errorf("pypi.org before the reload: %v", d)
	}
	if _, err := s.SetSettings(Settings{ApprovalTimeout: ptr(40 * time.Second)}); !errors.As(err, &we) {
		t.Errorf("an API edit while the preset waits: %v", err)
	}
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if d := s.Decide(Query{Host: "pypi.org", Port: 443, Method: "GET", Path: "/"}); d.Verdict != Allow || PresetOf(d.Rule) != "python" {
		t.Errorf("pypi.org after the reload: %v", d)
	}
}
