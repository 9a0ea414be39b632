package policy

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// widenBase is the policy in force in TestWidens; each case edits it.
const widenBase = `# project settings
name: myapp
sandbox:
  enabled: true
  unknown_action: ask
  approval_timeout: 30
  inspect: all
  network_allowlist:
    auto:
      - api.anthropic.com
    user:
      - pattern: "*.example.com/*"
        added: "2025-01-15T10:30:00Z"
        source: "approved during run"
      - pattern: "api.internal.test"
        member: "mcp:custom"
  network_denylist:
    - pattern: "pastebin.com"
    - pattern: "paste.example.com"
  mcp_servers:
    - name: github
      transport: stdio
    - name: custom
      transport: sse
      image: example/custom:1
      command: [serve, --port, "8080"]
      trust: verified
  resources:
    run_timeout: 300
    bandwidth_mbps: 20
`

func TestWidens(t *testing.T) {
	tests := []struct {
		name string
		// edits are old → new replacements applied to widenBase, in order.
		edits []string
		old   string // the policy in force instead of widenBase, when set
		want  []string
	}{
		{name: "unchanged"},
		{name: "comments and other keys", edits: []string{"# project settings", "# edited by hand", "name: myapp", "name: other"}},
		{name: "rules reordered", edits: []string{
			`      - pattern: "*.example.com/*"
        added: "2025-01-15T10:30:00Z"
        source: "approved during run"
      - pattern: "api.internal.test"
        member: "mcp:custom"
`, `      - pattern: "api.internal.test"
        member: "mcp:custom"
      - pattern: "*.example.com/*"
        added: "2020-01-01T00:00:00Z"
        source: "moved"
`,
			`    - pattern: "pastebin.com"
    - pattern: "paste.example.com"
`, `    - pattern: "paste.example.com"
    - pattern: "pastebin.com"
`}},
		{name: "auto rule moved to user", edits: []string{"      - api.anthropic.com\n", "      []\n", "    user:\n", "    user:\n      - pattern: api.anthropic.com\n"}},
		{name: "not security relevant", edits: []string{"approval_timeout: 30", "approval_timeout: 600", "run_timeout: 300", "run_timeout: 3000"}},
		{name: "restrict: bandwidth lowered", edits: []string{"bandwidth_mbps: 20", "bandwidth_mbps: 5"}},
		{name: "restrict: bandwidth capped", old: strings.Replace(widenBase, "    bandwidth_mbps: 20\n", "", 1)},
		{name: "bandwidth raised", edits: []string{"bandwidth_mbps: 20", "bandwidth_mbps: 100"}, want: []string{"resources.bandwidth_mbps: 20 → 100"}},
		{name: "bandwidth lifted", edits: []string{"    bandwidth_mbps: 20\n", ""}, want: []string{"resources.bandwidth_mbps: 20 → unlimited"}},
		{name: "bandwidth 0 is unlimited", edits: []string{"bandwidth_mbps: 20", "bandwidth_mbps: 0"}, want: []string{"resources.bandwidth_mbps: 20 → unlimited"}},
		{name: "restrict: disabled", edits: []string{"enabled: true", "enabled: false"}},
		{name: "allow_ech turned on", edits: []string{"enabled: true", "enabled: true\n  allow_ech: true"}, want: []string{"allow_ech: false → true"}},
		{name: "allow_ech turned off", old: strings.Replace(widenBase, "enabled: true", "enabled: true\n  allow_ech: true", 1), edits: []string{"enabled: true", "enabled: true\n  allow_ech: false"}},
		{name: "restrict: ask to deny", edits: []string{"unknown_action: ask", "unknown_action: deny"}},
		{name: "restrict: allow rule removed", edits: []string{"      - api.anthropic.com\n", ""}},
		{name: "restrict: deny rule added", edits: []string{`    - pattern: "pastebin.com"`, "    - pattern: evil.test\n    - pattern: \"pastebin.com\""}},
		{name: "restrict: MCP server removed", edits: []string{"    - name: github\n      transport: stdio\n", ""}},
		{name: "restrict: trust lowered", edits: []string{"trust: verified", "trust: user_added"}},
		{name: "restrict: inspect needed to all", old: strings.Replace(widenBase, "inspect: all", "inspect: needed", 1)},

		{name: "enabled", old: strings.Replace(widenBase, "enabled: true", "enabled: false", 1), want: []string{"enabled: false → true"}},
		{name: "ask to allow", edits: []string{"unknown_action: ask", "unknown_action: allow"}, want: []string{"unknown_action: ask → allow"}},
		{name: "deny to ask", old: strings.Replace(widenBase, "unknown_action: ask", "unknown_action: deny", 1), want: []string{"unknown_action: deny → ask"}},
		{name: "inspect all to needed", edits: []string{"inspect: all", "inspect: needed"}, want: []string{"inspect: all → needed"}},
		{name: "user allow rule added", edits: []string{"    user:\n", "    user:\n      - pattern: evil.test\n"}, want: []string{"allow rule added: evil.test"}},
		{name: "auto allow rule added", edits: []string{"      - api.anthropic.com\n", "      - api.anthropic.com\n      - evil.test\n"}, want: []string{"allow rule added: evil.test"}},
		{name: "rule's member dropped", edits: []string{"        member: \"mcp:custom\"\n", ""}, want: []string{"allow rule added: api.internal.test"}},
		{name: "rule's pattern changed", edits: []string{`"*.example.com/*"`, `"*.example.org/*"`}, want: []string{"allow rule added: *.example.org/*"}},
		{name: "deny rule removed", edits: []string{"    - pattern: \"pastebin.com\"\n", ""}, want: []string{"deny rule removed: pastebin.com"}},
		{name: "MCP server added", edits: []string{"  mcp_servers:\n", "  mcp_servers:\n    - name: slack\n      transport: stdio\n"},
			want: []string{"allow rule added: slack.com", "allow rule added: api.slack.com", "MCP server added: slack"}},
		{name: "trust raised", edits: []string{"trust: verified", "trust: builtin"}, want: []string{"MCP server custom: trust verified → builtin"}},
		{name: "image changed", edits: []string{"image: example/custom:1", "image: evil/custom:1"}, want: []string{`MCP server custom: image "example/custom:1" → "evil/custom:1"`}},
		{name: "command changed", edits: []string{`command: [serve, --port, "8080"]`, "command: [sh, -c, 'curl evil.test']"},
			want: []string{`MCP server custom: command ["serve" "--port" "8080"] → ["sh" "-c" "curl evil.test"]`}},
		{name: "preset turned on", edits: []string{"  enabled: true\n", "  enabled: true\n  presets: [python, github]\n"}, want: []string{"preset turned on: python", "preset turned on: github"}},
		{name: "restrict: preset turned off", old: strings.Replace(widenBase, "  enabled: true\n", "  enabled: true\n  presets: [python, github]\n", 1),
			edits: []string{"  enabled: true\n", "  enabled: true\n  presets: [github]\n"}},
		{name: "ask to learn", edits: []string{"unknown_action: ask", "unknown_action: learn"}, want: []string{"unknown_action: ask → learn"}},
		{name: "restrict: learn to ask", old: strings.Replace(widenBase, "unknown_action: ask", "unknown_action: learn", 1)},
		{name: "learn to allow", old: strings.Replace(widenBase, "unknown_action: ask", "unknown_action: learn", 1), edits: []string{"unknown_action: ask", "unknown_action: allow"},
			want: []string{"unknown_action: learn → allow"}},
		{name: "learn_until later", old: strings.Replace(widenBase, "unknown_action: ask", "unknown_action: learn\n  learn_until: \"2030-01-01T10:00:00Z\"", 1),
			edits: []string{"unknown_action: ask", "unknown_action: learn\n  learn_until: \"2030-01-01T11:00:00Z\""},
			want:  []string{"learn_until: 2030-01-01T10:00:00Z → 2030-01-01T11:00:00Z"}},
		{name: "restrict: learn_until earlier", old: strings.Replace(widenBase, "unknown_action: ask", "unknown_action: learn\n  learn_until: \"2030-01-01T10:00:00Z\"", 1),
			edits: []string{"unknown_action: ask", "unknown_action: learn\n  learn_until: \"2030-01-01T09:00:00Z\""}},
		{name: "several", edits: []string{"unknown_action: ask", "unknown_action: allow", "    - pattern: \"paste.example.com\"\n", ""},
			want: []string{"unknown_action: ask → allow", "deny rule removed: paste.example.com"}},
		{name: "missing file is the default", old: widenBase, edits: []string{widenBase, ""},
			want: []string{"inspect: all → needed", "deny rule removed: pastebin.com", "deny rule removed: paste.example.com", "resources.bandwidth_mbps: 20 → unlimited"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			oldText := widenBase
			if tt.old != "" {
				oldText = tt.old
			}
			newText := widenBase
			for i := 0; i+1 < len(tt.edits); i += 2 {
				if !strings.Contains(newText, tt.edits[i]) {
					t.Fatalf("edit %d: %q is not in the file", i/2, tt.edits[i])
				}
				newText = strings.Replace(newText, tt.edits[i], tt.edits[i+1], 1)
			}
			old, err := ParseSpec("old.yaml", []byte(oldText))
			if err != nil {
				t.Fatal(err)
			}
			next, err := ParseSpec("new.yaml", []byte(newText))
			if err != nil {
				t.Fatal(err)
			}
			got := Widens(old, next)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Widens mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSandboxReloadRestricting(t *testing.T) {
	s, path := openTestSandbox(t, "sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user:\n      - pattern: api.example.com\n")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// A member writes an allow rule and unknown_action: allow: kept out.
	write("sandbox:\n  unknown_action: allow\n  network_allowlist:\n    user:\n      - pattern: api.example.com\n      - pattern: evil.test\n")
	err := s.ReloadRestricting()
	var we *WidensError
	if !errors.As(err, &we) {
		t.Fatalf("ReloadRestricting of a widening edit: %v, want a *WidensError", err)
	}
	if diff := cmp.Diff([]string{"unknown_action: deny → allow", "allow rule added: evil.test"}, we.Reasons); diff != "" {
		t.Errorf("reasons (-want +got):\n%s", diff)
	}
	if !strings.Contains(err.Error(), "airlock reload") || !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the file and say to run airlock reload", err)
	}
	if v := verdict(s, "evil.test"); v != Deny {
		t.Errorf("evil.test after a refused widening edit: %v, want deny", v)
	}

	// An edit of the file through the API would put the held edit in
	// force with it: refused until a person reloads.
	if _, err := s.Add(AddRequest{Pattern: "other.example.com", List: Allowlist, Persist: true}); !errors.As(err, &we) {
		t.Errorf("persisted Add over a held widening edit: %v, want a *WidensError", err)
	}
	if _, err := s.SetSettings(Settings{ApprovalTimeout: ptr(60 * time.Second)}); !errors.As(err, &we) {
		t.Errorf("SetSettings over a held widening edit: %v, want a *WidensError", err)
	}
	if _, err := s.Add(AddRequest{Pattern: "session.example.com", List: Allowlist}); err != nil {
		t.Errorf("session Add over a held widening edit: %v", err)
	}

	// An edit that only restricts goes in.
	write("sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user: []\n")
	if err := s.ReloadRestricting(); err != nil {
		t.Fatalf("ReloadRestricting of a restricting edit: %v", err)
	}
	if v := verdict(s, "api.example.com"); v != Deny {
		t.Errorf("api.example.com after its rule was removed: %v, want deny", v)
	}
	if v := verdict(s, "session.example.com"); v != Allow {
		t.Errorf("session rule after a restricting reload: %v, want allow", v)
	}

	// A person's explicit reload puts a widening edit in force.
	write("sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user:\n      - pattern: evil.test\n")
	if err := s.ReloadRestricting(); !errors.As(err, &we) {
		t.Fatalf("ReloadRestricting: %v, want a *WidensError", err)
	}
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if v := verdict(s, "evil.test"); v != Allow {
		t.Errorf("evil.test after an explicit reload: %v, want allow", v)
	}
	if _, err := s.Add(AddRequest{Pattern: "other.example.com", List: Allowlist, Persist: true}); err != nil {
		t.Errorf("persisted Add once the file is in force: %v", err)
	}
}
