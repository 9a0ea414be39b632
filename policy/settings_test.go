package policy

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func ptr[T any](v T) *T { return &v }

func TestSetSettings(t *testing.T) {
	deny := Settings{UnknownAction: ptr(ActionDeny)}
	both := Settings{UnknownAction: ptr(ActionAllow), ApprovalTimeout: ptr(45 * time.Second)}
	for _, tc := range []struct {
		name     string
		file     string // "" with missing: no file at all
		missing  bool
		set      Settings
		want     string
		wantSpec func(*Spec)
	}{
		{
			name: "value replaced in place, comments kept",
			file: "# project\nname: app # keep\nsandbox:\n  enabled: true\n  unknown_action: ask   # ask | deny | allow\n  approval_timeout: 30\n",
			set:  deny,
			want: "# project\nname: app # keep\nsandbox:\n  enabled: true\n  unknown_action: deny   # ask | deny | allow\n  approval_timeout: 30\n",
		},
		{
			name: "quoted values",
			file: "sandbox:\n  unknown_action: \"ask\"\n  approval_timeout: 30\n  inspect: 'all'\n",
			set:  Settings{UnknownAction: ptr(ActionDeny)},
			want: "sandbox:\n  unknown_action: deny\n  approval_timeout: 30\n  inspect: 'all'\n",
		},
		{
			name: "single quotes",
			file: "sandbox:\n  unknown_action: 'ask' # q\n",
			set:  Settings{UnknownAction: ptr(ActionDeny)},
			want: "sandbox:\n  unknown_action: deny # q\n",
		},
		{
			name: "absent keys go first in the section",
			file: "sandbox:\n    # rules\n    network_allowlist:\n        user:\n            - pattern: a.example.com\nother: 1\n",
			set:  both,
			want: "sandbox:\n    approval_timeout: 45\n    unknown_action: allow\n    # rules\n    network_allowlist:\n        user:\n            - pattern: a.example.com\nother: 1\n",
		},
		{
			name: "no sandbox section",
			file: "name: app\nservices:\n  web: {}\n# end\n",
			set:  deny,
			want: "name: app\nservices:\n  web: {}\n# end\nsandbox:\n  unknown_action: deny\n",
		},
		{
			name: "no trailing newline",
			file: "name: app",
			set:  deny,
			want: "name: app\nsandbox:\n  unknown_action: deny\n",
		},
		{
			name: "empty sandbox",
			file: "sandbox:   # settings below\nx: 1\n",
			set:  deny,
			want: "sandbox:   # settings below\n  unknown_action: deny\nx: 1\n",
		},
		{
			name: "empty flow sandbox",
			file: "sandbox: {}\n",
			set:  deny,
			want: "sandbox:\n  unknown_action: deny\n",
		},
		{
			name: "CRLF",
			file: "sandbox:\r\n  unknown_action: ask\r\n  enabled: true\r\n",
			set:  both,
			want: "sandbox:\r\n  approval_timeout: 45\r\n  unknown_action: allow\r\n  enabled: true\r\n",
		},
		{
			name: "only comments",
			file: "# nothing yet\n",
			set:  deny,
			want: "# nothing yet\nsandbox:\n  unknown_action: deny\n",
		},
		{
			name:    "missing file",
			missing: true,
			set:     Settings{ApprovalTimeout: ptr(600 * time.Second)},
			want:    "sandbox:\n  approval_timeout: 600\n",
		},
		{
			name: "presets inserted",
			file: "sandbox:\n  enabled: true\n",
			set:  Settings{Presets: ptr([]string{"Python", "github", "python"})},
			want: "sandbox:\n  presets: [python, github]\n  enabled: true\n",
		},
		{
			name: "presets replaced in flow style, comment kept",
			file: "sandbox:\n  presets: [python]   # registries\n  enabled: true\n",
			set:  Settings{Presets: ptr([]string{"node", "go"})},
			want: "sandbox:\n  presets: [node, go]   # registries\n  enabled: true\n",
		},
		{
			name: "presets turned off",
			file: "sandbox:\n  presets: [python, github]\n",
			set:  Settings{Presets: ptr([]string{})},
			want: "sandbox:\n  presets: []\n",
		},
		{
			name: "presets after an empty key",
			file: "sandbox:\n  presets:\n  enabled: true\n",
			set:  Settings{Presets: ptr([]string{"rust"})},
			want: "sandbox:\n  presets: [rust]\n  enabled: true\n",
		},
		{
			name: "learn with its end",
			file: "sandbox:\n  unknown_action: ask\n",
			set:  Settings{UnknownAction: ptr(ActionLearn), LearnUntil: ptr(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))},
			want: "sandbox:\n  learn_until: \"2030-01-02T03:04:05Z\"\n  unknown_action: learn\n",
		},
		{
			name: "same value: file untouched",
			file: "sandbox:\n  unknown_action:   deny # same\n",
			set:  deny,
			want: "sandbox:\n  unknown_action:   deny # same\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "app.yaml")
			if !tc.missing {
				if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := SetSettings(path, tc.set); err != nil {
				t.Fatalf("SetSettings: %v", err)
			}
			got := readText(t, path)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("file (-want +got):\n%s", diff)
			}
			spec, err := LoadSpec(path)
			if err != nil {
				t.Fatal(err)
			}
			if tc.set.UnknownAction != nil && spec.UnknownAction != *tc.set.UnknownAction {
				t.Errorf("unknown_action = %v", spec.UnknownAction)
			}
			if tc.set.ApprovalTimeout != nil && spec.ApprovalTimeout != *tc.set.ApprovalTimeout {
				t.Errorf("approval_timeout = %v", spec.ApprovalTimeout)
			}
			if tc.set.Presets != nil {
				want, _ := CheckPresets(*tc.set.Presets)
				if diff := cmp.Diff(want, spec.Presets); diff != "" || len(spec.Preset) != len(PresetRules(want)) {
					t.Errorf("presets (-want +got):\n%s (%d rules)", diff, len(spec.Preset))
				}
			}
		})
	}
}

func TestSetSettingsRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		set        Settings
		want       string
	}{
		{"timeout 0", "sandbox:\n  approval_timeout: 30\n", Settings{ApprovalTimeout: ptr(time.Duration(0))}, "whole number of seconds from 1 to 600"},
		{"timeout too long", "sandbox: {}\n", Settings{ApprovalTimeout: ptr(601 * time.Second)}, "from 1 to 600"},
		{"timeout not whole seconds", "", Settings{ApprovalTimeout: ptr(1500 * time.Millisecond)}, "whole number"},
		{"unknown action", "", Settings{UnknownAction: ptr(Action(9))}, "want ask, deny, learn or allow"},
		{"bad YAML", "sandbox:\n  unknown_action: [\n", Settings{UnknownAction: ptr(ActionDeny)}, "invalid YAML"},
		{"file does not load", "sandbox:\n  unknown_action: maybe\n", Settings{UnknownAction: ptr(ActionDeny)}, "unknown action \"maybe\""},
		{"flow sandbox", "sandbox: {unknown_action: ask}\n", Settings{UnknownAction: ptr(ActionDeny)}, "flow style"},
		{"flow top level", "{sandbox: {}}\n", Settings{UnknownAction: ptr(ActionDeny)}, "flow style"},
		{"block scalar", "sandbox:\n  unknown_action: >-\n    ask\n", Settings{UnknownAction: ptr(ActionDeny)}, "one line"},
		{"tagged", "sandbox:\n  unknown_action: !!str ask\n", Settings{UnknownAction: ptr(ActionDeny)}, "one line"},
		{"unknown preset", "sandbox:\n  presets: [python]\n", Settings{Presets: ptr([]string{"python", "pythn"})}, `unknown preset "pythn": want one of python, node`},
		{"presets in block style", "sandbox:\n  presets:\n    - python\n", Settings{Presets: ptr([]string{"go"})}, "write it on one line as presets: [a, b]"},
		{"zero learn_until", "", Settings{LearnUntil: ptr(time.Time{})}, "learn_until: want a time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "app.yaml")
			if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
				t.Fatal(err)
			}
			err := SetSettings(path, tc.set)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("SetSettings = %v, want an error with %q", err, tc.want)
			}
			if got := readText(t, path); got != tc.file {
				t.Errorf("file changed to %q", got)
			}
		})
	}
}

func TestReplaceRule(t *testing.T) {
	nr := func(l List, pattern string) *Rule {
		return newUserRule(t, l, pattern, "", "edited", addedAt, false)
	}
	for _, tc := range []struct {
		name, file string
		list       List
		old        string
		repl       *Rule
		want       string
	}{
		{
			name: "in place, comments kept",
			file: "sandbox:\n  network_allowlist:\n    user:\n      # first\n      - pattern: a.example.com\n        source: x\n      # about b\n      - pattern: b.example.com   # b\n      - pattern: c.example.com\n",
			list: Allowlist, old: "a.example.com", repl: nr(Allowlist, "a.example.org"),
			want: "sandbox:\n  network_allowlist:\n    user:\n      # first\n      - pattern: \"a.example.org\"\n        added: \"2025-03-01T12:00:00Z\"\n        source: \"edited\"\n      # about b\n      - pattern: b.example.com   # b\n      - pattern: c.example.com\n",
		},
		{
			name: "last item without trailing newline",
			file: "sandbox:\n  network_denylist:\n  -   pattern: pastebin.com",
			list: Denylist, old: "pastebin.com", repl: nr(Denylist, "*.pastebin.com"),
			want: "sandbox:\n  network_denylist:\n  -   pattern: \"*.pastebin.com\"\n      added: \"2025-03-01T12:00:00Z\"\n      source: \"edited\"",
		},
		{
			name: "flow list",
			file: "sandbox:\n  network_denylist: [{pattern: a.test}, {pattern: b.test}]\n",
			list: Denylist, old: "a.test", repl: nr(Denylist, "c.test"),
			want: "sandbox:\n  network_denylist:\n    - pattern: \"c.test\"\n      added: \"2025-03-01T12:00:00Z\"\n      source: \"edited\"\n    - pattern: \"b.test\"\n",
		},
		{
			name: "CRLF",
			file: "sandbox:\r\n  network_denylist:\r\n    - pattern: a.test\r\n    - pattern: b.test\r\n",
			list: Denylist, old: "b.test", repl: nr(Denylist, "c.test"),
			want: "sandbox:\r\n  network_denylist:\r\n    - pattern: a.test\r\n    - pattern: \"c.test\"\r\n      added: \"2025-03-01T12:00:00Z\"\r\n      source: \"edited\"\r\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "app.yaml")
			os.WriteFile(path, []byte(tc.file), 0o644)
			id := newUserRule(t, tc.list, tc.old, "", "", time.Time{}, false).ID
			old, err := ReplaceRule(path, tc.list, id, tc.repl)
			if err != nil {
				t.Fatalf("ReplaceRule: %v", err)
			}
			if old.Pattern.String() != tc.old {
				t.Errorf("replaced %v", old)
			}
			if diff := cmp.Diff(tc.want, readText(t, path)); diff != "" {
				t.Errorf("file (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReplaceRuleRefuses(t *testing.T) {
	file := "sandbox:\n  mcp_servers:\n    - name: github\n      transport: stdio\n  network_allowlist:\n    auto: [api.anthropic.com]\n    user:\n      - pattern: a.example.com\n      - pattern: b.example.com\n"
	a := newUserRule(t, Allowlist, "a.example.com", "", "", time.Time{}, false)
	auto := NewRule(Allowlist, Auto, a.Pattern, "", "", time.Time{})
	p, _ := Parse("api.anthropic.com", ParseOptions{})
	auto.ID = RuleID(Allowlist, p, "")
	for _, tc := range []struct {
		name string
		list List
		id   string
		repl *Rule
		want error
		msg  string
	}{
		{"duplicate", Allowlist, a.ID, newUserRule(t, Allowlist, "b.example.com", "", "", time.Time{}, false), ErrDuplicateRule, ""},
		{"duplicate of an auto rule", Allowlist, a.ID, newUserRule(t, Allowlist, "api.github.com", "", "", time.Time{}, false), ErrDuplicateRule, ""},
		{"auto", Allowlist, auto.ID, newUserRule(t, Allowlist, "x.example.com", "", "", time.Time{}, false), ErrAutoRule, ""},
		{"no rule", Allowlist, "000000000000", newUserRule(t, Allowlist, "x.example.com", "", "", time.Time{}, false), ErrNoRule, ""},
		{"wrong list", Denylist, a.ID, newUserRule(t, Allowlist, "x.example.com", "", "", time.Time{}, false), nil, "not the denylist"},
		{"broad without force", Allowlist, a.ID, &Rule{ID: RuleID(Allowlist, mustParse(t, "*.com"), ""), Pattern: mustParse(t, "*.com"), List: Allowlist, Tier: User}, ErrBroad, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "app.yaml")
			os.WriteFile(path, []byte(file), 0o644)
			_, err := ReplaceRule(path, tc.list, tc.id, tc.repl)
			if err == nil || tc.want != nil && !errors.Is(err, tc.want) || tc.msg != "" && !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("ReplaceRule = %v, want %v %q", err, tc.want, tc.msg)
			}
			if got := readText(t, path); got != file {
				t.Errorf("file changed to %q", got)
			}
		})
	}
}

func mustParse(t testing.TB, s string) Pattern {
	p, err := Parse(s, ParseOptions{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSandboxSetSettingsTakesEffect(t *testing.T) {
	s, path := openTestSandbox(t, "sandbox:\n  unknown_action: ask\n")
	if v := verdict(s, "unknown.test"); v != Ask {
		t.Fatalf("before: %v", v)
	}
	spec, err := s.SetSettings(Settings{UnknownAction: ptr(ActionDeny), ApprovalTimeout: ptr(5 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if v := verdict(s, "unknown.test"); v != Deny {
		t.Errorf("after deny: %v", v)
	}
	if spec.ApprovalTimeout != 5*time.Second || s.Spec().ApprovalTimeout != 5*time.Second {
		t.Errorf("timeout %v", spec.ApprovalTimeout)
	}
	if got := readFile(t, path); got != "sandbox:\n  approval_timeout: 5\n  unknown_action: deny\n" {
		t.Errorf("file: %q", got)
	}
	if _, err := s.SetSettings(Settings{ApprovalTimeout: ptr(time.Hour)}); err == nil {
		t.Error("an hour was accepted")
	}
	if v := verdict(s, "unknown.test"); v != Deny || s.Spec().ApprovalTimeout != 5*time.Second {
		t.Error("a refused change changed the policy")
	}
}

func TestSandboxReplace(t *testing.T) {
	s, path := openTestSandbox(t, "sandbox:\n  network_allowlist:\n    user:\n      - pattern: a.example.com\n        added: \"2025-01-01T00:00:00Z\"\n        source: manually added\n      - pattern: z.example.com\n")
	a := RuleID(Allowlist, mustParse(t, "a.example.com"), "")
	old, nr, err := s.Replace(ReplaceRequest{ID: a, Pattern: "b.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	if old.Pattern.String() != "a.example.com" || nr.Pattern.String() != "b.example.com" || nr.Source != "manually added" || nr.Tier != User {
		t.Errorf("old %v new %+v", old, nr)
	}
	if verdict(s, "a.example.com") == Allow || verdict(s, "b.example.com") != Allow {
		t.Error("the running policy did not follow the edit")
	}
	want := "sandbox:\n  network_allowlist:\n    user:\n      - pattern: \"b.example.com\"\n        added: \"2026-11-21T06:00:00Z\"\n        source: \"manually added\"\n      - pattern: z.example.com\n"
	if got := readFile(t, path); got != want {
		t.Errorf("file:\n%s", got)
	}
	// A bad pattern changes nothing.
	if _, _, err := s.Replace(ReplaceRequest{ID: nr.ID, Pattern: "*.com"}); !errors.Is(err, ErrBroad) {
		t.Errorf("broad: %v", err)
	}
	if _, _, err := s.Replace(ReplaceRequest{ID: nr.ID, Pattern: "regex:("}); err == nil {
		t.Error("a bad regex was accepted")
	}
	if got := readFile(t, path); got != want {
		t.Errorf("a refused edit changed the file:\n%s", got)
	}
	// Session rules are replaced in memory.
	sr, err := s.Add(AddRequest{Pattern: "s.example.com", List: Denylist})
	if err != nil {
		t.Fatal(err)
	}
	if _, nr, err := s.Replace(ReplaceRequest{ID: sr.ID, Pattern: "t.example.com"}); err != nil || nr.Tier != Session {
		t.Fatalf("session: %v %v", nr, err)
	}
	if verdict(s, "t.example.com") != Deny || verdict(s, "s.example.com") == Deny {
		t.Error("session rule not replaced")
	}
	if got := readFile(t, path); got != want {
		t.Errorf("a session edit changed the file:\n%s", got)
	}
}

// FuzzSetSettings edits arbitrary files: the edit either fails and leaves
// the file alone, or leaves a file that loads with the settings set and
// every other setting and rule as before.
func FuzzSetSettings(f *testing.F) {
	for _, data := range specSeeds(f) {
		f.Add(data, uint8(2), uint16(45))
	}
	f.Add([]byte("sandbox:\r\n  unknown_action: ask # c\r\n"), uint8(3), uint16(0))
	f.Add([]byte("a: 1\nsandbox:\n"), uint8(0), uint16(601))
	f.Fuzz(func(t *testing.T, data []byte, action uint8, secs uint16) {
		var set Settings
		if action%4 != 0 {
			set.UnknownAction = ptr(Action(action % 4))
		}
		if secs != 0 {
			set.ApprovalTimeout = ptr(time.Duration(secs) * time.Second)
		}
		path, before, after, ok := fuzzEdit(t, data, "SetSettings", func(path string, _ *Spec) error { return SetSettings(path, set) })
		if !ok {
			return
		}
		want := *before
		set.applyTo(&want)
		if !sameSpec(after, &want) {
			t.Fatalf("spec after SetSettings is not the old one with the settings set:\n%s", readText(t, path))
		}
	})
}

// errNothingToEdit is what a fuzzEdit edit returns when it edits nothing.
var errNothingToEdit = errors.New("nothing to edit")

// FuzzReplaceRule replaces the first user rule of arbitrary files: the edit
// either fails and leaves the file alone, or leaves a file that loads with
// that rule replaced in its place and nothing else changed.
func FuzzReplaceRule(f *testing.F) {
	for _, data := range specSeeds(f) {
		f.Add(data, false)
		f.Add(data, true)
	}
	f.Add([]byte("sandbox:\r\n  network_denylist: [{pattern: a.test}, b.test]\r\n"), true)
	f.Fuzz(func(t *testing.T, data []byte, denyList bool) {
		var rules []*Rule
		var r *Rule
		path, before, after, ok := fuzzEdit(t, data, "ReplaceRule", func(path string, before *Spec) error {
			if before == nil {
				return errNothingToEdit
			}
			l := Allowlist
			rules = before.User
			if denyList {
				l, rules = Denylist, before.Deny
			}
			if len(rules) == 0 {
				return errNothingToEdit
			}
			r = newUserRule(t, l, "replaced.example.net", rules[0].Member, "fuzz", addedAt, false)
			_, err := ReplaceRule(path, l, rules[0].ID, r)
			return err
		})
		if !ok {
			return
		}
		want := *before
		next := slices.Clone(rules)
		next[0] = r
		if denyList {
			want.Deny = next
		} else {
			want.User = next
		}
		if !sameSpec(after, &want) {
			t.Fatalf("spec after ReplaceRule is not the old one with the rule replaced:\n%s", readText(t, path))
		}
	})
}
