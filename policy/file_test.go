package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// specOpts compares patterns by their canonical form: Pattern's fields are
// unexported.
var specOpts = cmp.Options{
	cmp.Comparer(func(a, b Pattern) bool { return a.String() == b.String() }),
}

var addedAt = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func newUserRule(t testing.TB, l List, pattern, member, source string, when time.Time, force bool) *Rule {
	t.Helper()
	p, err := Parse(pattern, ParseOptions{Force: force || l == Denylist})
	if err != nil {
		t.Fatal(err)
	}
	r := NewRule(l, User, p, member, source, when)
	r.Forced = force
	return r
}

func mustTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestLoadSpecApp(t *testing.T) {
	got, err := LoadSpec("testdata/app.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := &Spec{
		Enabled:         true,
		UnknownAction:   ActionAsk,
		ApprovalTimeout: 30 * time.Second,
		Inspect:         InspectNeeded,
		Auto: []*Rule{
			NewRule(Allowlist, Auto, MustParse("generativelanguage.googleapis.com"), "", "auto", time.Time{}),
			NewRule(Allowlist, Auto, MustParse("api.anthropic.com"), "", "auto", time.Time{}),
			NewRule(Allowlist, Auto, MustParse("api.github.com"), "", "mcp:github", time.Time{}),
			NewRule(Allowlist, Auto, MustParse("github.com"), "", "mcp:github", time.Time{}),
		},
		User: []*Rule{
			newUserRule(t, Allowlist, "*.example.com/*", "", "approved during run", mustTime("2025-01-15T10:30:00Z"), false),
			newUserRule(t, Allowlist, `regex:.*\.internal\.company\.com`, "", "manually added", mustTime("2025-01-13T14:00:00Z"), false),
		},
		Deny: []*Rule{
			newUserRule(t, Denylist, "pastebin.com", "", "denied during run", mustTime("2025-01-16T09:00:00Z"), false),
		},
		MCPServers: []MCPServer{{Name: "github", Transport: "stdio", Trust: TrustBuiltin}},
		Resources: Resources{
			Agent:      Limits{MemoryMB: 512, CPUs: 1, Pids: DefaultPids},
			MCP:        Limits{MemoryMB: 256, CPUs: 0.5, Pids: DefaultPids},
			RunTimeout: 300 * time.Second,
			Bounds:     DefaultBounds(),
		},
	}
	if diff := cmp.Diff(want, got, specOpts); diff != "" {
		t.Errorf("LoadSpec(app.yaml) mismatch (-want +got):\n%s", diff)
	}
}

func TestLoadSpecFull(t *testing.T) {
	got, err := LoadSpec("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := &Spec{
		Enabled:         false,
		UnknownAction:   ActionDeny,
		ApprovalTimeout: 600 * time.Second,
		Inspect:         InspectAll,
		Auto: []*Rule{
			NewRule(Allowlist, Auto, MustParse("slack.com"), "", "mcp:slack", time.Time{}),
			NewRule(Allowlist, Auto, MustParse("api.slack.com"), "", "mcp:slack", time.Time{}),
		},
		User: []*Rule{
			newUserRule(t, Allowlist, "GET api.github.com/repos/*", "mcp:github", "manually added", mustTime("2025-02-01T07:00:00Z"), false),
			newUserRule(t, Allowlist, "*.com", "", "learning mode", time.Time{}, true),
			newUserRule(t, Allowlist, "db.example.com:5432", "agent-1", "", time.Time{}, false),
			newUserRule(t, Allowlist, "cidr:203.0.113.0/24", "", "", time.Time{}, false),
		},
		Deny: []*Rule{
			newUserRule(t, Denylist, "*", "", "", time.Time{}, false),
			newUserRule(t, Denylist, `regex:.*\.(ru|cn)`, "mcp:fetch", "", time.Time{}, false),
		},
		MCPServers: []MCPServer{{Name: "slack", Transport: "stdio", Trust: TrustBuiltin}, {Name: "custom-tool", Transport: "sse", Trust: TrustUserAdded}},
		Resources: Resources{
			Agent:      Limits{MemoryMB: 2048, CPUs: 2, Pids: DefaultPids},
			MCP:        Limits{MemoryMB: DefaultMCPMemoryMB, CPUs: DefaultMCPCPUs, Pids: DefaultPids},
			RunTimeout: time.Hour,
			Bounds: ResourceBounds{
				CPUs:     Range{Min: Bound{Value: 1}, Max: Bound{Value: 4}},
				MemoryMB: Range{Min: Bound{Value: DefaultMinMemoryMB}, Max: Bound{Host: true}},
				Pids:     Range{Min: Bound{Value: 20}, Max: Bound{Value: 500}},
			},
			BandwidthMbps: 50,
		},
	}
	if diff := cmp.Diff(want, got, specOpts); diff != "" {
		t.Errorf("LoadSpec(full.yaml) mismatch (-want +got):\n%s", diff)
	}
}

func TestParseSpecDefaults(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		{name: "empty", in: ""},
		{name: "comments only", in: "# nothing yet\n"},
		{name: "no sandbox", in: "name: myapp\nmodel: {api_base: http://localhost:8080}\n"},
		{name: "empty sandbox", in: "name: myapp\nsandbox:\n"},
		{name: "empty lists", in: "sandbox:\n  network_allowlist:\n    auto:\n    user: []\n  network_denylist:\n  mcp_servers: []\n  resources: {}\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSpec("app.yaml", []byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(DefaultSpec(), got, specOpts); diff != "" {
				t.Errorf("ParseSpec mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseSpecErrors(t *testing.T) {
	tests := []struct {
		name string
		file string
		// want are substrings of the message after "testdata/FILE".
		want []string
		is   error
	}{
		{name: "unknown key", file: "bad-unknown-key.yaml", want: []string{":4: sandbox.unknown_acton: unknown key; want one of"}},
		{name: "unknown nested key", file: "bad-unknown-nested-key.yaml", want: []string{":4: sandbox.resources.agent.memory: unknown key; want one of cpus, memory_mb"}},
		{name: "unknown entry key", file: "bad-unknown-entry-key.yaml", want: []string{":5: sandbox.network_allowlist.user[0].note: unknown key"}},
		{name: "enabled is a string", file: "bad-enabled-type.yaml", want: []string{`:2: sandbox.enabled: want true or false, got the string "yes"`}},
		{name: "unknown action", file: "bad-unknown-action.yaml", want: []string{`:2: sandbox.unknown_action: unknown action "maybe"`}},
		{name: "approval timeout too long", file: "bad-approval-timeout.yaml", want: []string{":2: sandbox.approval_timeout: 601 is out of range; want 1 to 600"}},
		{name: "approval timeout with unit", file: "bad-approval-timeout-type.yaml", want: []string{":2: sandbox.approval_timeout: want a whole number"}},
		{name: "inspect", file: "bad-inspect.yaml", want: []string{`:2: sandbox.inspect: unknown inspect mode "some"`}},
		{name: "broad allow pattern", file: "bad-broad-pattern.yaml", want: []string{`:5: sandbox.network_allowlist.user[1].pattern: pattern "*.com": pattern is too broad`, "add force: true"}, is: ErrBroad},
		{name: "auto pattern with scheme", file: "bad-auto-pattern.yaml", want: []string{`:5: sandbox.network_allowlist.auto[1]: pattern "https://api.openai.com"`, "without a scheme"}},
		{name: "deny regex", file: "bad-deny-regex.yaml", want: []string{`:3: sandbox.network_denylist[0].pattern: pattern "regex:(unclosed"`, "RE2"}},
		{name: "bad timestamp", file: "bad-added.yaml", want: []string{`:4: sandbox.network_denylist[0].added: "yesterday" is not an RFC 3339 time`}},
		{name: "duplicate rule", file: "bad-duplicate-rule.yaml", want: []string{`:6: sandbox.network_allowlist.user[2]: "api.example.com" duplicates the entry at line 4`}},
		{name: "duplicate key", file: "bad-duplicate-key.yaml", want: []string{":4: sandbox.enabled: duplicate key (first at line 2)"}},
		{name: "duplicate sandbox", file: "bad-duplicate-sandbox.yaml", want: []string{":4: sandbox: duplicate key (first at line 1)"}},
		{name: "alias", file: "bad-alias.yaml", want: []string{":4: sandbox: aliases (*hosts) are not allowed"}},
		{name: "anchor", file: "bad-anchor.yaml", want: []string{":2: sandbox: anchors (&deny) are not allowed"}},
		{name: "two documents", file: "bad-multi-doc.yaml", want: []string{":3: a policy file holds one YAML document"}},
		{name: "sandbox is a string", file: "bad-sandbox-scalar.yaml", want: []string{`:2: sandbox: want a mapping, got the string "yes"`}},
		{name: "sandbox is a list", file: "bad-sandbox-list.yaml", want: []string{":2: sandbox: want a mapping, got a list"}},
		{name: "missing pattern", file: "bad-missing-pattern.yaml", want: []string{":3: sandbox.network_denylist[0]: missing pattern"}},
		{name: "entry is a string", file: "bad-entry-scalar.yaml", want: []string{`:4: sandbox.network_allowlist.user[0]: want a mapping with a pattern key, got the string "api.example.com"`}},
		{name: "empty member", file: "bad-member-empty.yaml", want: []string{":5: sandbox.network_allowlist.user[0].member: empty member"}},
		{name: "force is a string", file: "bad-force-type.yaml", want: []string{`:5: sandbox.network_allowlist.user[0].force: want true or false`}},
		{name: "mcp transport", file: "bad-mcp-transport.yaml", want: []string{`:4: sandbox.mcp_servers[0].transport: unknown transport "http"; want stdio or sse`}},
		{name: "mcp server twice", file: "bad-mcp-duplicate.yaml", want: []string{`:4: sandbox.mcp_servers[1].name: server "GitHub" is listed twice (first at line 3)`}},
		{name: "negative cpus", file: "bad-cpus.yaml", want: []string{":3: sandbox.resources.mcp.cpus: -1 is out of range"}},
		{name: "zero run timeout", file: "bad-run-timeout.yaml", want: []string{":3: sandbox.resources.run_timeout: 0 is out of range"}},
		{name: "bounds min above max", file: "bad-bounds-order.yaml", want: []string{":4: sandbox.resources.bounds.memory_mb.min: min 4096 is above max 1024"}},
		{name: "bounds pids host", file: "bad-bounds-pids-host.yaml", want: []string{`:4: sandbox.resources.bounds.pids.max: want a whole number from 8 to 65536, got the string "host"`}},
		{name: "bounds value", file: "bad-bounds-value.yaml", want: []string{`:4: sandbox.resources.bounds.cpus.max: want a number from 0.01 to 1024, or host, got the string "lots"`}},
		{name: "bounds fraction of a MB", file: "bad-bounds-fraction.yaml", want: []string{`:4: sandbox.resources.bounds.memory_mb.min: want a whole number from 4 to 1048576, or host`}},
		{name: "bounds unknown key", file: "bad-bounds-key.yaml", want: []string{":4: sandbox.resources.bounds.disk_mb: unknown key; want one of cpus, memory_mb, pids"}},
		{name: "bandwidth too high", file: "bad-bandwidth.yaml", want: []string{":3: sandbox.resources.bandwidth_mbps: 20000 is out of range; want 0 to 10000"}},
		{name: "bandwidth negative", file: "bad-bandwidth-negative.yaml", want: []string{":3: sandbox.resources.bandwidth_mbps: -1 is out of range; want 0 to 10000"}},
		{name: "bandwidth fraction", file: "bad-bandwidth-type.yaml", want: []string{":3: sandbox.resources.bandwidth_mbps: want a whole number from 0 to 10000, got"}},
		{name: "sessions without image", file: "bad-sessions-no-image.yaml", want: []string{":3: sandbox.sessions: missing image"}},
		{name: "sessions as root", file: "bad-sessions-root.yaml", want: []string{`:4: sandbox.sessions.user: user "0:0": want a numeric UID:GID other than 0`}},
		{name: "sessions env of airlock", file: "bad-sessions-env.yaml", want: []string{":4: sandbox.sessions.env[1]: AIRLOCK_TOKEN: AIRLOCK_ variables are airlock's own"}},
		{name: "sessions timeout 0", file: "bad-sessions-timeout.yaml", want: []string{":4: sandbox.sessions.timeout: 0 is out of range; want 1 to 3600"}},
		{name: "sessions unknown key", file: "bad-sessions-key.yaml", want: []string{":4: sandbox.sessions.max_session: unknown key; want one of command, env, idle_cleanup, image, max_sessions, resources, timeout, user"}},
		{name: "unknown preset", file: "bad-preset.yaml", want: []string{`:2: sandbox.presets[1]: unknown preset "pypi": want one of python, node, go`}, is: ErrUnknownPreset},
		{name: "bad learn_until", file: "bad-learn-until.yaml", want: []string{`:3: sandbox.learn_until: "tomorrow" is not an RFC 3339 time`}},
		{name: "syntax", file: "bad-syntax.yaml", want: []string{": invalid YAML:"}},
		{name: "top level is a list", file: "bad-top-level-list.yaml", want: []string{":1: the file's top level is a list"}},
		{name: "user is a string", file: "bad-user-not-list.yaml", want: []string{`:3: sandbox.network_allowlist.user: want a list, got the string "api.example.com"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join("testdata", tt.file)
			spec, err := LoadSpec(path)
			if err == nil {
				t.Fatalf("LoadSpec(%s) = nil error, want one", path)
			}
			if spec != nil {
				t.Errorf("LoadSpec(%s) returned a spec with its error", path)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, path+":") {
				t.Errorf("error %q does not start with %q", msg, path+":")
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
			var fe *FileError
			if !errors.As(err, &fe) || fe.File != path {
				t.Errorf("error %v is not a *FileError for %s", err, path)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v does not wrap %v", err, tt.is)
			}
		})
	}
}

func TestParseSpecTooBig(t *testing.T) {
	data := []byte("name: x\n# " + strings.Repeat("x", MaxFileSize) + "\n")
	if _, err := ParseSpec("big.yaml", data); err == nil || !strings.Contains(err.Error(), "big.yaml: file is larger than") {
		t.Errorf("ParseSpec(%d bytes) error = %v, want too large", len(data), err)
	}
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSpec(path); err == nil || !strings.Contains(err.Error(), "file is larger than") {
		t.Errorf("LoadSpec(%d bytes) error = %v, want too large", len(data), err)
	}
}

// TestReadFileRefusesWhatIsNotARegularFile: a member that can write its
// project may make the policy file a named pipe (an open that waits for a
// writer forever), a link to a device (/dev/zero: endless bytes) or a
// directory. Loading, polling and editing refuse each at once with an error
// that says what it is, and the sandbox keeps its last good policy.
func TestReadFileRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	zero := filepath.Join(dir, "zero.yaml")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "dir.yaml")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, kind string }{{fifo, "a named pipe"}, {zero, "a device"}, {sub, "a directory"}} {
		t.Run(tc.kind, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { _, _, err := ReadFile(tc.path); done <- err }()
			select {
			case err := <-done:
				if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), tc.kind) {
					t.Errorf("ReadFile error = %v, want ErrNotRegular naming %s", err, tc.kind)
				}
			case <-time.After(2 * time.Second):
				if f, err := os.OpenFile(tc.path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					f.Close()
				}
				t.Fatal("ReadFile blocked")
			}
			if _, err := LoadSpec(tc.path); !errors.Is(err, ErrNotRegular) {
				t.Errorf("LoadSpec error = %v, want ErrNotRegular", err)
			}
			if err := AddRule(tc.path, newUserRule(t, Allowlist, "api.example.org", "", "", time.Time{}, false)); !errors.Is(err, ErrNotRegular) && !errors.Is(err, ErrSymlink) {
				t.Errorf("AddRule error = %v, want ErrNotRegular (ErrSymlink for the link)", err)
			}
		})
	}

	// A sandbox whose file turns into one keeps its policy.
	path := filepath.Join(dir, "app.yaml")
	if err := os.WriteFile(path, []byte("sandbox:\n  unknown_action: ask\n  network_denylist:\n    - pattern: pastebin.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := OpenSandbox(SandboxConfig{Name: "myapp", Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.ReloadRestricting(); !errors.Is(err, ErrNotRegular) {
		t.Errorf("ReloadRestricting error = %v, want ErrNotRegular", err)
	}
	if err := s.Reload(); !errors.Is(err, ErrNotRegular) {
		t.Errorf("Reload error = %v, want ErrNotRegular", err)
	}
	if len(s.Spec().Deny) != 1 {
		t.Errorf("the sandbox lost its last good policy: deny rules %v", s.Spec().Deny)
	}
}

// TestReadFileHugeSparseFile: a policy file made sparse and huge (truncate
// -s 100G) is refused as too big without reading it.
func TestReadFileHugeSparseFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.yaml")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 1<<40); err != nil {
		t.Fatal(err)
	}
	_, info, err := ReadFile(path)
	var fe *FileError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "file is larger than") {
		t.Errorf("ReadFile error = %v, want too large", err)
	}
	if info == nil || info.Size() != 1<<40 {
		t.Errorf("ReadFile info = %v, want the file's (size 1 TiB)", info)
	}
}

// copyFixture copies a testdata file to a temporary directory.
func copyFixture(t *testing.T, name string) (path string, data []byte) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, data
}

func readText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// insertedLines returns the block of lines new holds that old lacks, and
// whether new is old with exactly one block of lines inserted.
func insertedLines(old, new string) ([]string, bool) {
	o := strings.SplitAfter(old, "\n")
	n := strings.SplitAfter(new, "\n")
	p := 0
	for p < len(o) && p < len(n) && o[p] == n[p] {
		p++
	}
	s := 0
	for s < len(o)-p && s < len(n)-p && o[len(o)-1-s] == n[len(n)-1-s] {
		s++
	}
	ins := n[p : len(n)-s]
	return ins, p+s == len(o) && strings.Join(n[:p], "")+strings.Join(ins, "")+strings.Join(n[len(n)-s:], "") == new
}

func TestAddRuleRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		rule *Rule
		want []string // the lines AddRule inserts
	}{
		{
			name: "allowlist",
			rule: newUserRule(t, Allowlist, "API.New.Example.com", "mcp:github", "approved during run", addedAt, false),
			want: []string{
				`      - pattern: "api.new.example.com"` + "\n",
				`        added: "2025-03-01T12:00:00Z"` + "\n",
				`        source: "approved during run"` + "\n",
				`        member: "mcp:github"` + "\n",
			},
		},
		{
			name: "forced broad allow",
			rule: newUserRule(t, Allowlist, "*.io", "", "", time.Time{}, true),
			want: []string{
				`      - pattern: "*.io"` + "\n",
				`        force: true` + "\n",
			},
		},
		{
			name: "denylist",
			rule: newUserRule(t, Denylist, `regex:.*\.ngrok\.io`, "", "denied during run", addedAt, false),
			want: []string{
				`    - pattern: "regex:.*\\.ngrok\\.io"` + "\n",
				`      added: "2025-03-01T12:00:00Z"` + "\n",
				`      source: "denied during run"` + "\n",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, orig := copyFixture(t, "app.yaml")
			if err := AddRule(path, tt.rule); err != nil {
				t.Fatal(err)
			}
			got := readText(t, path)
			ins, ok := insertedLines(string(orig), got)
			if !ok {
				t.Fatalf("AddRule changed more than an inserted block:\n%s", got)
			}
			if diff := cmp.Diff(tt.want, ins); diff != "" {
				t.Errorf("inserted lines mismatch (-want +got):\n%s", diff)
			}
			spec, err := LoadSpec(path)
			if err != nil {
				t.Fatal(err)
			}
			list := spec.User
			if tt.rule.List == Denylist {
				list = spec.Deny
			}
			if diff := cmp.Diff(tt.rule, list[len(list)-1], specOpts); diff != "" {
				t.Errorf("added rule mismatch (-want +got):\n%s", diff)
			}

			removed, err := RemoveRule(path, tt.rule.List, tt.rule.ID)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.rule, removed, specOpts); diff != "" {
				t.Errorf("removed rule mismatch (-want +got):\n%s", diff)
			}
			if got := readText(t, path); got != string(orig) {
				t.Errorf("after add and remove the file differs from the original:\n%s", got)
			}
		})
	}
}

func TestRemoveRuleExisting(t *testing.T) {
	tests := []struct {
		name    string
		list    List
		pattern string
		gone    []string // the lines RemoveRule deletes
	}{
		{
			name:    "first user entry keeps the blank line and comment after it",
			list:    Allowlist,
			pattern: "*.example.com/*",
			gone: []string{
				`      - pattern: "*.example.com/*"` + "\n",
				`        added: "2025-01-15T10:30:00Z"` + "\n",
				`        source: "approved during run"` + "\n",
			},
		},
		{
			name:    "last user entry",
			list:    Allowlist,
			pattern: `regex:.*\.internal\.company\.com`,
			gone: []string{
				`      - pattern: "regex:.*\\.internal\\.company\\.com"` + "\n",
				`        added: "2025-01-13T14:00:00Z"` + "\n",
				`        source: "manually added"` + "\n",
			},
		},
		{
			name:    "only deny entry",
			list:    Denylist,
			pattern: "pastebin.com",
			gone: []string{
				`    - pattern: "pastebin.com"` + "\n",
				`      added: "2025-01-16T09:00:00Z"` + "\n",
				`      source: "denied during run"` + "\n",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, orig := copyFixture(t, "app.yaml")
			id := RuleID(tt.list, MustParse(tt.pattern), "")
			removed, err := RemoveRule(path, tt.list, id)
			if err != nil {
				t.Fatal(err)
			}
			if removed.Pattern.String() != tt.pattern {
				t.Errorf("removed %v, want %s", removed, tt.pattern)
			}
			got := readText(t, path)
			gone, ok := insertedLines(got, string(orig))
			if !ok {
				t.Fatalf("RemoveRule changed more than one block of lines:\n%s", got)
			}
			if diff := cmp.Diff(tt.gone, gone); diff != "" {
				t.Errorf("removed lines mismatch (-want +got):\n%s", diff)
			}
			spec, err := LoadSpec(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range append(spec.User, spec.Deny...) {
				if r.ID == id {
					t.Errorf("rule %v still loads", r)
				}
			}
		})
	}
}

func TestAddRuleInPlace(t *testing.T) {
	allow := newUserRule(t, Allowlist, "api.example.com", "", "approved during run", addedAt, false)
	deny := newUserRule(t, Denylist, "pastebin.com", "", "", time.Time{}, false)
	entry := func(indent string) string {
		return indent + "- pattern: \"api.example.com\"\n" +
			indent + "  added: \"2025-03-01T12:00:00Z\"\n" +
			indent + "  source: \"approved during run\"\n"
	}
	tests := []struct {
		name string
		in   string
		rule *Rule
		want string
		// wantRemoved is the file after RemoveRule of the rule; "" means
		// the same as in.
		wantRemoved string
	}{
		{
			name:        "empty file",
			in:          "",
			rule:        allow,
			want:        "sandbox:\n  network_allowlist:\n    user:\n" + entry("      "),
			wantRemoved: "sandbox:\n  network_allowlist:\n    user:\n",
		},
		{
			name: "no sandbox, four-space indent",
			in:   "name: myapp\nmodel:\n    api_base: http://localhost:8080\n\n# end\n",
			rule: allow,
			want: "name: myapp\nmodel:\n    api_base: http://localhost:8080\n\n# end\n" +
				"sandbox:\n    network_allowlist:\n        user:\n" + entry("            "),
			wantRemoved: "name: myapp\nmodel:\n    api_base: http://localhost:8080\n\n# end\n" +
				"sandbox:\n    network_allowlist:\n        user:\n",
		},
		{
			name:        "no final newline",
			in:          "name: myapp",
			rule:        deny,
			want:        "name: myapp\nsandbox:\n  network_denylist:\n    - pattern: \"pastebin.com\"\n",
			wantRemoved: "name: myapp\nsandbox:\n  network_denylist:\n",
		},
		{
			name:        "empty sandbox",
			in:          "name: myapp\nsandbox:   # later\nmodel: x\n",
			rule:        allow,
			want:        "name: myapp\nsandbox:   # later\n  network_allowlist:\n    user:\n" + entry("      ") + "model: x\n",
			wantRemoved: "name: myapp\nsandbox:   # later\n  network_allowlist:\n    user:\nmodel: x\n",
		},
		{
			name:        "sandbox without the list, next key after a blank line",
			in:          "sandbox:\n  enabled: true\n  # inspect: all\n\n# model settings\nmodel: x\n",
			rule:        deny,
			want:        "sandbox:\n  enabled: true\n  # inspect: all\n  network_denylist:\n    - pattern: \"pastebin.com\"\n\n# model settings\nmodel: x\n",
			wantRemoved: "sandbox:\n  enabled: true\n  # inspect: all\n  network_denylist:\n\n# model settings\nmodel: x\n",
		},
		{
			name:        "empty flow list",
			in:          "sandbox:\n  network_allowlist:\n    user: []   # none yet\n  enabled: true\n",
			rule:        allow,
			want:        "sandbox:\n  network_allowlist:\n    user:   # none yet\n" + entry("      ") + "  enabled: true\n",
			wantRemoved: "sandbox:\n  network_allowlist:\n    user:   # none yet\n  enabled: true\n",
		},
		{
			name:        "null list",
			in:          "sandbox:\n  network_allowlist:\n    user: ~\n    auto:\n      - api.anthropic.com\n",
			rule:        allow,
			want:        "sandbox:\n  network_allowlist:\n    user:\n" + entry("      ") + "    auto:\n      - api.anthropic.com\n",
			wantRemoved: "sandbox:\n  network_allowlist:\n    user:\n    auto:\n      - api.anthropic.com\n",
		},
		{
			name:        "empty flow mapping",
			in:          "sandbox:\n  network_allowlist: {}\n  enabled: true\n",
			rule:        allow,
			want:        "sandbox:\n  network_allowlist:\n    user:\n" + entry("      ") + "  enabled: true\n",
			wantRemoved: "sandbox:\n  network_allowlist:\n    user:\n  enabled: true\n",
		},
		{
			name: "compact list",
			in:   "sandbox:\n  network_allowlist:\n    user:\n    - pattern: a.example.com\n    auto: []\n",
			rule: allow,
			want: "sandbox:\n  network_allowlist:\n    user:\n    - pattern: a.example.com\n" + entry("    ") + "    auto: []\n",
		},
		{
			name: "flow list with items",
			in:   "sandbox:\n  network_allowlist:\n    user: [{pattern: a.example.com, source: x},\n      {pattern: b.example.com}]  # two\n  enabled: true\n",
			rule: allow,
			want: "sandbox:\n  network_allowlist:\n    user:  # two\n" +
				"      - pattern: \"a.example.com\"\n        source: \"x\"\n" +
				"      - pattern: \"b.example.com\"\n" +
				entry("      ") + "  enabled: true\n",
			wantRemoved: "sandbox:\n  network_allowlist:\n    user:  # two\n" +
				"      - pattern: \"a.example.com\"\n        source: \"x\"\n" +
				"      - pattern: \"b.example.com\"\n" +
				"  enabled: true\n",
		},
		{
			name: "items with wide dash and trailing comment",
			in:   "sandbox:\n  network_denylist:\n  -   pattern: a.example.com\n      # keep\n  inspect: all\n",
			rule: deny,
			want: "sandbox:\n  network_denylist:\n  -   pattern: a.example.com\n      # keep\n  -   pattern: \"pastebin.com\"\n  inspect: all\n",
		},
		{
			name:        "crlf",
			in:          "name: x\r\nsandbox:\r\n  enabled: true\r\n",
			rule:        deny,
			want:        "name: x\r\nsandbox:\r\n  enabled: true\r\n  network_denylist:\r\n    - pattern: \"pastebin.com\"\r\n",
			wantRemoved: "name: x\r\nsandbox:\r\n  enabled: true\r\n  network_denylist:\r\n",
		},
		{
			name: "member and force",
			in:   "sandbox:\n  network_allowlist:\n    user:\n",
			rule: newUserRule(t, Allowlist, "*.dev", "mcp:github", "", time.Time{}, true),
			want: "sandbox:\n  network_allowlist:\n    user:\n      - pattern: \"*.dev\"\n        member: \"mcp:github\"\n        force: true\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "app.yaml")
			if err := os.WriteFile(path, []byte(tt.in), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := AddRule(path, tt.rule); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, readText(t, path)); diff != "" {
				t.Errorf("after AddRule (-want +got):\n%s", diff)
			}
			if _, err := RemoveRule(path, tt.rule.List, tt.rule.ID); err != nil {
				t.Fatal(err)
			}
			want := tt.wantRemoved
			if want == "" {
				want = tt.in
			}
			if diff := cmp.Diff(want, readText(t, path)); diff != "" {
				t.Errorf("after RemoveRule (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRemoveRuleFlowToEmpty(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.yaml")
	in := "sandbox:\n  network_denylist: [{pattern: pastebin.com}]  # why\n"
	if err := os.WriteFile(path, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := RemoveRule(path, Denylist, RuleID(Denylist, MustParse("pastebin.com"), "")); err != nil {
		t.Fatal(err)
	}
	want := "sandbox:\n  network_denylist: []  # why\n"
	if diff := cmp.Diff(want, readText(t, path)); diff != "" {
		t.Errorf("after RemoveRule (-want +got):\n%s", diff)
	}
}

func TestAddRuleCreatesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.yaml")
	r := newUserRule(t, Denylist, "pastebin.com", "", "denied during run", addedAt, false)
	if err := AddRule(path, r); err != nil {
		t.Fatal(err)
	}
	want := "sandbox:\n  network_denylist:\n    - pattern: \"pastebin.com\"\n      added: \"2025-03-01T12:00:00Z\"\n      source: \"denied during run\"\n"
	if diff := cmp.Diff(want, readText(t, path)); diff != "" {
		t.Errorf("created file (-want +got):\n%s", diff)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("created file mode = %v, want 0644", fi.Mode().Perm())
	}
}

func TestAddRuleKeepsMode(t *testing.T) {
	path, orig := copyFixture(t, "app.yaml")
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	r := newUserRule(t, Allowlist, "api.example.org", "", "", time.Time{}, false)
	if err := AddRule(path, r); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode = %v, want 0600 as before", fi.Mode().Perm())
	}
	if got := readText(t, path); got == string(orig) {
		t.Errorf("the file was not edited")
	}
}

// TestEditRefusesSymlink: a member that can write the project (a Docker
// container with it mounted) replaces the policy file with a symbolic link
// to a file outside: another sandbox's policy file, any YAML of the host.
// The next rule a person saves must not be written there by airlockd (as
// root), nor that file's content copied into the project: the save fails,
// saying why, and changes nothing. Reading through the link still works.
func TestEditRefusesSymlink(t *testing.T) {
	project, outside := t.TempDir(), t.TempDir()
	path := filepath.Join(project, "app.yaml")
	if err := os.WriteFile(path, []byte("sandbox:\n  unknown_action: ask\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := OpenSandbox(SandboxConfig{Name: "myapp", Path: path})
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(outside, "other-sandbox.yaml")
	const other = "sandbox:\n  unknown_action: ask\n  network_denylist:\n    - pattern: pastebin.com\n"
	if err := os.WriteFile(target, []byte(other), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrSymlink) || !strings.Contains(err.Error(), target) {
			t.Errorf("%s: error = %v, want ErrSymlink naming the link's target", what, err)
		}
		if b, _ := os.ReadFile(target); string(b) != other {
			t.Errorf("%s wrote the link's target:\n%s", what, b)
		}
		if fi, err := os.Lstat(path); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			t.Errorf("%s replaced the link (%v, %v)", what, fi, err)
		}
	}
	_, err = s.Add(AddRequest{Pattern: "pypi.org", List: Allowlist, Persist: true})
	check("Add", err)
	action := ActionDeny
	_, err = s.SetSettings(Settings{UnknownAction: &action})
	check("SetSettings", err)
	// Reading follows it: a person's reload puts the target in force.
	if err := s.Reload(); err != nil || len(s.Spec().Deny) != 1 {
		t.Errorf("Reload through the link: %v, deny rules %v", err, s.Spec().Deny)
	}

	// A dangling link is refused too, rather than replaced.
	if err := os.Remove(target); err != nil {
		t.Fatal(err)
	}
	_, err = s.Add(AddRequest{Pattern: "pypi.org", List: Allowlist, Persist: true})
	if !errors.Is(err, ErrSymlink) {
		t.Errorf("Add through a dangling link: error = %v, want ErrSymlink", err)
	}
	if _, err := os.Stat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Add through a dangling link created its target (%v)", err)
	}
}

// TestEditRefusesSymlinkedLock: the lock file beside the policy file is in
// the project too; a member that makes it a link must not have airlockd
// create or open the file it names.
func TestEditRefusesSymlinkedLock(t *testing.T) {
	path, orig := copyFixture(t, "app.yaml")
	target := filepath.Join(t.TempDir(), "nologin")
	if err := os.Symlink(target, path+".lock"); err != nil {
		t.Fatal(err)
	}
	err := AddRule(path, newUserRule(t, Allowlist, "api.example.org", "", "", time.Time{}, false))
	if err == nil {
		t.Errorf("AddRule with a linked lock file succeeded")
	}
	if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the lock file's link target was created (%v)", err)
	}
	if got := readText(t, path); got != string(orig) {
		t.Errorf("the policy file changed")
	}
}

// TestEditRefusesReplacedDirectory: O_NOFOLLOW guards the last component
// only. A member moves the policy file's directory aside and puts a link
// to another sandbox's project in its place: a rule saved for this sandbox
// must not land in the other one's policy file, nor a lock file be created
// there. The save fails, saying why, and changes nothing.
func TestEditRefusesReplacedDirectory(t *testing.T) {
	const content = "sandbox:\n  enabled: true\n  unknown_action: deny\n"
	base := t.TempDir()
	conf := filepath.Join(base, "proj", "conf")
	other := filepath.Join(base, "other")
	for _, d := range []string{conf, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(conf, "app.yaml")
	otherPath := filepath.Join(other, "app.yaml")
	for _, p := range []string{path, otherPath} {
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := OpenSandbox(SandboxConfig{Name: "a", Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(conf, conf+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, conf); err != nil {
		t.Fatal(err)
	}
	_, err = s.Add(AddRequest{Pattern: "approved-for-a.example.com", List: Allowlist, Persist: true})
	if err == nil || !strings.Contains(err.Error(), "no longer the directory it was") {
		t.Errorf("Add through a replaced directory: error = %v, want one that says the directory was replaced", err)
	}
	if got, _ := os.ReadFile(otherPath); string(got) != content {
		t.Errorf("a rule saved for sandbox a was written into %s:\n%s", otherPath, got)
	}
	if _, err := os.Lstat(otherPath + ".lock"); err == nil {
		t.Errorf("a lock file was created in %s", other)
	}
	if got, _ := os.ReadFile(filepath.Join(conf+".old", "app.yaml")); string(got) != content {
		t.Errorf("the moved policy file changed:\n%s", got)
	}
}

// TestEditNeverOpensLockThatIsNotRegular: a member makes PATH.lock a named
// pipe (or, with CAP_MKNOD, a device such as a watchdog). The edit refuses
// it without opening it: a reader of the pipe is not woken.
func TestEditNeverOpensLockThatIsNotRegular(t *testing.T) {
	path, orig := copyFixture(t, "app.yaml")
	if err := syscall.Mkfifo(path+".lock", 0o644); err != nil {
		t.Fatal(err)
	}
	opened := make(chan struct{})
	go func() {
		// The member's reader blocks until the pipe is opened for writing.
		if f, err := os.OpenFile(path+".lock", os.O_RDONLY, 0); err == nil {
			close(opened)
			f.Close()
		}
	}()
	time.Sleep(50 * time.Millisecond)
	err := AddRule(path, newUserRule(t, Allowlist, "api.example.org", "", "", time.Time{}, false))
	if err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("AddRule with a pipe for a lock file: %v, want it refused", err)
	}
	select {
	case <-opened:
		t.Errorf("the edit opened the pipe %s.lock before refusing it", path)
	case <-time.After(200 * time.Millisecond):
		// Let the reader go.
		if f, err := os.OpenFile(path+".lock", os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			<-opened
			f.Close()
		}
	}
	if got := readText(t, path); got != string(orig) {
		t.Errorf("the policy file changed")
	}
}

// TestEditLockHeldElsewhere: a lock file held by another process (a
// sandbox member can write the project) fails the edit after lockWait,
// saying so, and changes nothing; a lock file that is not a regular file
// (a pipe) is refused at once.
func TestEditLockHeldElsewhere(t *testing.T) {
	defer func(w time.Duration) { lockWait = w }(lockWait)
	lockWait = 100 * time.Millisecond
	path, orig := copyFixture(t, "app.yaml")
	f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	err = AddRule(path, newUserRule(t, Allowlist, "api.example.org", "", "", time.Time{}, false))
	if err == nil || !strings.Contains(err.Error(), "another process has held") {
		t.Errorf("AddRule with the lock held elsewhere: %v, want an error that says so", err)
	}
	if got := readText(t, path); got != string(orig) {
		t.Errorf("the policy file changed")
	}
	// Released: the edit goes through.
	f.Close()
	if err := AddRule(path, newUserRule(t, Allowlist, "api.example.org", "", "", time.Time{}, false)); err != nil {
		t.Errorf("AddRule after the lock was released: %v", err)
	}

	path2, orig2 := copyFixture(t, "app.yaml")
	if err := syscall.Mkfifo(path2+".lock", 0o644); err != nil {
		t.Fatal(err)
	}
	err = AddRule(path2, newUserRule(t, Allowlist, "api.example.org", "", "", time.Time{}, false))
	if err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("AddRule with a pipe for a lock file: %v, want it refused", err)
	}
	if got := readText(t, path2); got != string(orig2) {
		t.Errorf("the policy file changed")
	}
}

// holdLockElsewhere takes the lock of the policy file at path as another
// process would (its own open file description), until the test ends.
func holdLockElsewhere(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path+".lock", os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
}

// TestEditLockWaitBoundedFromCall: with the lock held elsewhere, each of
// several concurrent edits fails within about lockWait of its call, not
// one lockWait behind the other (four saves: four times as long).
func TestEditLockWaitBoundedFromCall(t *testing.T) {
	defer func(d time.Duration) { lockWait = d }(lockWait)
	lockWait = 300 * time.Millisecond
	path, _ := copyFixture(t, "app.yaml")
	holdLockElsewhere(t, path)
	var wg sync.WaitGroup
	waited := make([]time.Duration, 4)
	for i := range waited {
		r := newUserRule(t, Allowlist, fmt.Sprintf("h%d.example.com", i), "", "", time.Time{}, false)
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			err := AddRule(path, r)
			waited[i] = time.Since(start)
			if err == nil || !strings.Contains(err.Error(), "another process has held") {
				t.Errorf("edit %d with the lock held elsewhere: %v, want an error that says so", i, err)
			}
		}()
	}
	wg.Wait()
	if worst := slices.Max(waited); worst > 2*lockWait {
		t.Errorf("an edit waited %v for a lock bounded at %v", worst.Round(time.Millisecond), lockWait)
	}
}

// TestEditLockTimeoutsLeaveNoThreads: edits that time out waiting for a
// lock a member holds leave nothing behind (a goroutine blocked in
// flock(2) holds an OS thread and a descriptor until the member lets go).
func TestEditLockTimeoutsLeaveNoThreads(t *testing.T) {
	defer func(d time.Duration) { lockWait = d }(lockWait)
	lockWait = 5 * time.Millisecond
	path, _ := copyFixture(t, "app.yaml")
	holdLockElsewhere(t, path)
	before := osThreads(t)
	for i := range 200 {
		if err := AddRule(path, newUserRule(t, Allowlist, fmt.Sprintf("h%d.example.com", i), "", "", time.Time{}, false)); err == nil {
			t.Fatal("an edit succeeded while the lock was held elsewhere")
		}
	}
	time.Sleep(50 * time.Millisecond)
	if after := osThreads(t); after-before > 20 {
		t.Errorf("200 timed-out edits left %d more OS threads (%d → %d)", after-before, before, after)
	}
}

// osThreads returns how many OS threads this process has (Linux only).
func osThreads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status:", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return n
			}
		}
	}
	t.Skip("no Threads line in /proc/self/status")
	return 0
}

func TestAddRuleExisting(t *testing.T) {
	tests := []struct {
		name string
		rule *Rule
	}{
		{name: "same user rule", rule: newUserRule(t, Allowlist, "*.EXAMPLE.com/*", "", "other source", addedAt, false)},
		{name: "same deny rule", rule: newUserRule(t, Denylist, "pastebin.com.", "", "", time.Time{}, false)},
		{name: "auto rule of an MCP server", rule: newUserRule(t, Allowlist, "api.github.com", "", "", time.Time{}, false)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, orig := copyFixture(t, "app.yaml")
			before, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := AddRule(path, tt.rule); err != nil {
				t.Fatal(err)
			}
			after, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if !os.SameFile(before, after) || readText(t, path) != string(orig) {
				t.Errorf("AddRule of an existing rule rewrote the file")
			}
		})
	}
}

func TestAddRuleRefuses(t *testing.T) {
	broad := newUserRule(t, Allowlist, "*.com", "", "", time.Time{}, true)
	broad.Forced = false
	session := newUserRule(t, Allowlist, "api.example.com", "", "", time.Time{}, false)
	session.Tier = Session
	badID := newUserRule(t, Allowlist, "api.example.com", "", "", time.Time{}, false)
	badID.ID = "123"
	spacy := newUserRule(t, Allowlist, "api.example.com", "", "", time.Time{}, false)
	spacy.Member = "my agent"
	spacy.ID = RuleID(Allowlist, spacy.Pattern, spacy.Member)
	tests := []struct {
		name string
		rule *Rule
		want string
	}{
		{name: "broad without force", rule: broad, want: "pattern is too broad"},
		{name: "session rule", rule: session, want: "only user rules"},
		{name: "wrong ID", rule: badID, want: "does not match"},
		{name: "member with a space", rule: spacy, want: "space"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, orig := copyFixture(t, "app.yaml")
			err := AddRule(path, tt.rule)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("AddRule error = %v, want one containing %q", err, tt.want)
			}
			if readText(t, path) != string(orig) {
				t.Errorf("AddRule changed the file although it failed")
			}
		})
	}
}

func TestRemoveRuleErrors(t *testing.T) {
	tests := []struct {
		name string
		list List
		id   string
		is   error
	}{
		{name: "unknown id", list: Allowlist, id: "000000000000", is: ErrNoRule},
		{name: "deny id in allowlist", list: Allowlist, id: RuleID(Denylist, MustParse("pastebin.com"), ""), is: ErrNoRule},
		{name: "auto entry", list: Allowlist, id: RuleID(Allowlist, MustParse("api.anthropic.com"), ""), is: ErrAutoRule},
		{name: "MCP server domain", list: Allowlist, id: RuleID(Allowlist, MustParse("github.com"), ""), is: ErrAutoRule},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, orig := copyFixture(t, "app.yaml")
			r, err := RemoveRule(path, tt.list, tt.id)
			if !errors.Is(err, tt.is) || r != nil {
				t.Errorf("RemoveRule = %v, %v; want nil, %v", r, err, tt.is)
			}
			if readText(t, path) != string(orig) {
				t.Errorf("RemoveRule changed the file although it failed")
			}
		})
	}
	if _, err := RemoveRule(filepath.Join(t.TempDir(), "missing.yaml"), Denylist, "000000000000"); !errors.Is(err, ErrNoRule) {
		t.Errorf("RemoveRule on a missing file: %v, want ErrNoRule", err)
	}
}

// TestAddRuleFailsClosed checks that edits the splicer cannot do right leave
// the file alone.
func TestAddRuleFailsClosed(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{name: "flow sandbox", in: "sandbox: {enabled: true}\n", want: "sandbox is written in flow style"},
		{name: "flow list parent", in: "sandbox:\n  network_allowlist: {auto: [api.anthropic.com]}\n", want: "sandbox.network_allowlist is written in flow style"},
		{name: "document end marker", in: "name: x\n...\n", want: "would not load"},
		{name: "broken file", in: "sandbox:\n  enabled: maybe\n", want: "sandbox.enabled: want true or false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "app.yaml")
			if err := os.WriteFile(path, []byte(tt.in), 0o644); err != nil {
				t.Fatal(err)
			}
			err := AddRule(path, newUserRule(t, Allowlist, "api.example.com", "", "", time.Time{}, false))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("AddRule error = %v, want one containing %q", err, tt.want)
			}
			if got := readText(t, path); got != tt.in {
				t.Errorf("file changed to %q although the edit failed", got)
			}
		})
	}
}

// TestFileWriteInterrupted stops a write after the temporary file is complete
// and before it replaces the policy file, as a crash would.
func TestFileWriteInterrupted(t *testing.T) {
	path, orig := copyFixture(t, "app.yaml")
	dir := filepath.Dir(path)
	r := newUserRule(t, Allowlist, "api.example.org", "", "", addedAt, false)
	var tmpOK bool
	hooks := writeHooks{beforeRename: func(tmp string) error {
		// The new content is complete on disk before the rename.
		_, err := LoadSpec(tmp)
		tmpOK = err == nil
		return errors.New("simulated crash")
	}}
	if err := addRule(path, r, hooks); err == nil || !strings.Contains(err.Error(), "simulated crash") {
		t.Fatalf("addRule error = %v, want the simulated crash", err)
	}
	if !tmpOK {
		t.Errorf("the temporary file did not hold a loadable policy before the rename")
	}
	if got := readText(t, path); got != string(orig) {
		t.Errorf("the policy file changed although the write was interrupted")
	}
	if _, err := LoadSpec(path); err != nil {
		t.Errorf("the policy file no longer loads: %v", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "app.yaml" && e.Name() != "app.yaml.lock" {
			t.Errorf("left behind %s", e.Name())
		}
	}
	// The next edit still works.
	if err := AddRule(path, r); err != nil {
		t.Fatal(err)
	}
}

const (
	helperEnvFile  = "AIRLOCK_TEST_POLICY_FILE"
	helperEnvFirst = "AIRLOCK_TEST_FIRST_HOST"
	concurrentAdds = 50
)

// addHosts adds rules for host-N.example.com, N from first on, from
// concurrentAdds goroutines at once.
func addHosts(t *testing.T, path string, first int) {
	var wg sync.WaitGroup
	errs := make(chan error, concurrentAdds)
	for i := range concurrentAdds {
		wg.Go(func() {
			r := newUserRule(t, Allowlist, fmt.Sprintf("host-%d.example.com", first+i), "", "approved during run", addedAt, false)
			if err := AddRule(path, r); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestHelperProcessAddRules is the other process of TestAddRuleConcurrent;
// it does nothing unless started by it.
func TestHelperProcessAddRules(t *testing.T) {
	path := os.Getenv(helperEnvFile)
	if path == "" {
		t.Skip("helper process for TestAddRuleConcurrent")
	}
	first, err := strconv.Atoi(os.Getenv(helperEnvFirst))
	if err != nil {
		t.Fatal(err)
	}
	addHosts(t, path, first)
}

func TestAddRuleConcurrent(t *testing.T) {
	path, _ := copyFixture(t, "app.yaml")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcessAddRules$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnvFile+"="+path, helperEnvFirst+"="+strconv.Itoa(concurrentAdds))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addHosts(t, path, 0)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper process: %v\n%s", err, out.String())
	}

	spec, err := LoadSpec(path)
	if err != nil {
		t.Fatal(err)
	}
	have := make(map[string]bool)
	for _, r := range spec.User {
		have[r.Pattern.String()] = true
	}
	for i := range 2 * concurrentAdds {
		if h := fmt.Sprintf("host-%d.example.com", i); !have[h] {
			t.Errorf("rule for %s is missing", h)
		}
	}
	if got, want := len(spec.User), 2+2*concurrentAdds; got != want {
		t.Errorf("%d user rules, want %d", got, want)
	}
}

// specSeeds returns the policy files in testdata: the seeds of the fuzz
// targets that parse and edit policy files.
func specSeeds(f *testing.F) [][]byte {
	names, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		f.Fatal(err)
	}
	var seeds [][]byte
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, data)
	}
	return seeds
}

// fuzzEdit writes data to a policy file and runs edit, named what, on it
// with the spec data parses as (nil when it does not). It holds an edit
// to its contract: one that fails leaves the file as it was; one that
// succeeds started from a file that loads and leaves one that loads. It
// returns the file and the specs before and after the edit, and whether
// the edit succeeded.
func fuzzEdit(t *testing.T, data []byte, what string, edit func(path string, before *Spec) error) (path string, before, after *Spec, ok bool) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "app.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	before, loadErr := ParseSpec(path, data)
	if err := edit(path, before); err != nil {
		if got := readText(t, path); got != string(data) {
			t.Fatalf("%s failed (%v) but changed the file to %q", what, err, got)
		}
		return path, before, nil, false
	}
	if loadErr != nil {
		t.Fatalf("%s succeeded on a file that does not load: %v", what, loadErr)
	}
	after, err := LoadSpec(path)
	if err != nil {
		t.Fatalf("file does not load after %s: %v\n%s", what, err, readText(t, path))
	}
	return path, before, after, true
}

func FuzzParseSpec(f *testing.F) {
	for _, data := range specSeeds(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := ParseSpec("fuzz.yaml", data)
		switch {
		case err != nil && spec != nil:
			t.Fatalf("ParseSpec returned a spec with error %v", err)
		case err == nil && spec == nil:
			t.Fatal("ParseSpec returned neither a spec nor an error")
		case err != nil:
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Errorf("error %q does not name the file", err)
			}
			return
		}
		for _, r := range slices.Concat(spec.Auto, spec.User, spec.Deny) {
			p, err := Parse(r.Pattern.String(), ParseOptions{Force: true})
			if err != nil {
				t.Fatalf("rule %v: canonical pattern does not parse: %v", r, err)
			}
			if p.String() != r.Pattern.String() {
				t.Fatalf("pattern %q re-parses as %q", r.Pattern.String(), p.String())
			}
			if r.ID != RuleID(r.List, r.Pattern, r.Member) {
				t.Fatalf("rule %v has ID %s, want %s", r, r.ID, RuleID(r.List, r.Pattern, r.Member))
			}
		}
	})
}

// FuzzAddRule edits arbitrary files: an edit either fails and leaves the
// file alone, or leaves a file that loads with the rule added (and, after
// RemoveRule, without it again).
func FuzzAddRule(f *testing.F) {
	for _, data := range specSeeds(f) {
		f.Add(data, false)
		f.Add(data, true)
	}
	allow := newUserRule(f, Allowlist, "api.example.com", "", "approved during run", addedAt, false)
	deny := newUserRule(f, Denylist, "pastebin.com", "mcp:fetch", "", time.Time{}, false)
	f.Fuzz(func(t *testing.T, data []byte, denyList bool) {
		r := allow
		if denyList {
			r = deny
		}
		path, before, after, ok := fuzzEdit(t, data, "AddRule", func(path string, _ *Spec) error { return AddRule(path, r) })
		if !ok {
			return
		}
		if !hasRule(after, r) {
			t.Fatalf("rule missing after AddRule:\n%s", readText(t, path))
		}
		if hasRule(before, r) {
			if got := readText(t, path); got != string(data) {
				t.Fatalf("AddRule of an existing rule changed the file")
			}
			return
		}
		if _, err := RemoveRule(path, r.List, r.ID); err != nil {
			t.Fatalf("RemoveRule after AddRule: %v\n%s", err, readText(t, path))
		}
		final, err := LoadSpec(path)
		if err != nil {
			t.Fatalf("file does not load after RemoveRule: %v", err)
		}
		if !sameSpec(before, final) {
			t.Fatalf("add and remove changed the spec:\n%s", readText(t, path))
		}
	})
}

// A line break YAML knows but LF/CRLF editing does not is refused with its
// line, not half understood; CRLF is fine.
func TestParseSpecRefusesForeignLineBreaks(t *testing.T) {
	for _, tc := range []struct {
		data string
		line int
	}{
		{"\r\r\r ", 1},
		{"sandbox:\n  network_allowlist:\r    user: []\n", 2},
		{"# a\n# b\nsandbox: {}\u2028\n", 3},
		{"sandbox: {}\u0085", 1},
	} {
		_, err := ParseSpec("app.yaml", []byte(tc.data))
		var fe *FileError
		if !errors.As(err, &fe) || fe.Line != tc.line || !strings.Contains(err.Error(), "LF or CRLF") {
			t.Errorf("ParseSpec(%q) = %v, want a FileError at line %d about LF or CRLF", tc.data, err, tc.line)
		}
	}
	if _, err := ParseSpec("app.yaml", []byte("sandbox:\r\n  network_allowlist:\r\n    user:\r\n      - pattern: api.example.com\r\n")); err != nil {
		t.Errorf("CRLF: %v", err)
	}
}
