package supervisor

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/policy"
)

// TestWidenedBy: a reload that points a sandbox at another policy file says
// what that widens, as an edit of the file would.
func TestWidenedBy(t *testing.T) {
	spec := func(yaml string) *policy.Spec {
		t.Helper()
		s, err := policy.ParseSpec("p.yaml", []byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	run := config.Sandbox{Name: "myapp", Policy: "/srv/myapp/app.yaml", Subnet: netip.MustParsePrefix("10.88.0.0/24")}
	moved := run
	moved.Policy = "/tmp/evil.yaml"
	strict := spec("sandbox:\n  unknown_action: deny\n  network_denylist:\n    - pattern: pastebin.com\n")
	for _, tc := range []struct {
		name  string
		next  config.Sandbox
		after *policy.Spec
		want  string
	}{
		{"same file, nothing wider", run, strict, ""},
		{"another file, nothing wider", moved, spec("sandbox:\n  unknown_action: deny\n  network_denylist:\n    - pattern: pastebin.com\n    - pattern: x.test\n"), ""},
		{"another file, wider", moved, spec("sandbox:\n  unknown_action: allow\n  network_allowlist:\n    user:\n      - pattern: evil.test\n"),
			"myapp: policy file /srv/myapp/app.yaml → /tmp/evil.yaml: unknown_action: deny → allow; allow rule added: evil.test; deny rule removed: pastebin.com"},
		{"same file, wider", run, spec("sandbox:\n  unknown_action: ask\n  network_denylist:\n    - pattern: pastebin.com\n"), "myapp: unknown_action: deny → ask"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := widenedBy(run, tc.next, strict, tc.after); got != tc.want {
				t.Errorf("widenedBy = %q\nwant        %q", got, tc.want)
			}
		})
	}
}

// TestPlan: what a reload does to each sandbox of the config, decided from
// the two configs alone.
func TestPlan(t *testing.T) {
	sb := func(name, subnet, pol string) config.Sandbox {
		return config.Sandbox{Name: name, Subnet: netip.MustParsePrefix(subnet), Policy: pol}
	}
	a, b, c := sb("a", "10.88.0.0/24", "/a.yaml"), sb("b", "10.88.1.0/24", "/b.yaml"), sb("c", "10.88.2.0/24", "/c.yaml")
	for _, tc := range []struct {
		name          string
		running, next []config.Sandbox
		want          reloadPlan
	}{
		{"nothing changed", []config.Sandbox{a, b}, []config.Sandbox{a, b}, reloadPlan{Keep: []string{"a", "b"}}},
		{"one removed, one added", []config.Sandbox{a, b}, []config.Sandbox{a, c}, reloadPlan{Keep: []string{"a"}, Remove: []string{"b"}, Add: []config.Sandbox{c}}},
		{"another policy file, same subnet", []config.Sandbox{a}, []config.Sandbox{sb("a", "10.88.0.0/24", "/evil.yaml")},
			reloadPlan{Restart: []config.Sandbox{sb("a", "10.88.0.0/24", "/evil.yaml")}}},
		{"another subnet", []config.Sandbox{a}, []config.Sandbox{sb("a", "10.88.9.0/24", "/a.yaml")},
			reloadPlan{Replace: []config.Sandbox{sb("a", "10.88.9.0/24", "/a.yaml")}}},
		{"a subnet freed and taken", []config.Sandbox{a, b}, []config.Sandbox{sb("c", "10.88.1.0/24", "/c.yaml"), a},
			reloadPlan{Keep: []string{"a"}, Remove: []string{"b"}, Add: []config.Sandbox{sb("c", "10.88.1.0/24", "/c.yaml")}}},
		{"first start of a config", nil, []config.Sandbox{a, b}, reloadPlan{Add: []config.Sandbox{a, b}}},
		{"all gone", []config.Sandbox{a}, nil, reloadPlan{Remove: []string{"a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := plan(tc.running, tc.next); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("plan = %+v\nwant   %+v", got, tc.want)
			}
		})
	}
}

// TestFingerprintOfNamedPipe: a member that can write its project's policy
// file (a container with the project mounted) replaces it with a named
// pipe. The poll must not wait for a writer: WatchPolicies checks the
// sandboxes one after another, so one blocked read would stop every
// sandbox's edits from being applied.
func TestFingerprintOfNamedPipe(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.yaml")
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan fingerprint, 1)
	go func() { done <- fingerprintOf(path) }()
	select {
	case fp := <-done:
		if !strings.Contains(fp.state, "not a regular file") {
			t.Errorf("fingerprint state %q, want an error that says it is not a regular file", fp.state)
		}
	case <-time.After(2 * time.Second):
		// Let the blocked open return, so the test ends.
		if f, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		t.Fatal("fingerprintOf blocked on a named pipe")
	}
}

// TestFingerprintOfHugeFile: a member makes its policy file a sparse file
// far over policy.MaxFileSize (truncate -s 100G app.yaml). The poll reads
// no more than the loader would, and the fingerprint still follows the
// file's size, so the next change is seen.
func TestFingerprintOfHugeFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.yaml")
	const size = 256 << 20
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fp := fingerprintOf(path)
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 2*policy.MaxFileSize {
		t.Errorf("fingerprintOf allocated %d MiB for a sparse %d MiB file; policy files are capped at %d MiB", alloc>>20, size>>20, policy.MaxFileSize>>20)
	}
	if !strings.Contains(fp.state, "larger than") || fp.size != size {
		t.Errorf("fingerprint state %q size %d, want the too-big error and size %d", fp.state, fp.size, size)
	}
	if err := os.Truncate(path, size+1); err != nil {
		t.Fatal(err)
	}
	if fingerprintOf(path) == fp {
		t.Errorf("the fingerprint of a too-big file did not change with its size")
	}
}
