package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A file that says learn without learn_until learns for one hour from when
// it is first put in force, not for a new hour at every restart: the end
// is written to the file, so that a restart (a reboot, a crash and
// Restart=on-failure) after the hour finds learn mode over.
func TestLearnWithoutEndIsPinnedToTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.yaml")
	if err := os.WriteFile(path, []byte("sandbox:\n  unknown_action: learn\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 21, 6, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	open := func() *Sandbox {
		t.Helper()
		s, err := OpenSandbox(SandboxConfig{Name: "myapp", Path: path, Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	if got, want := s.LearnUntil(), now.Add(DefaultLearnFor); !got.Equal(want) {
		t.Fatalf("learn until = %v, want %v", got, want)
	}
	if got := readFile(t, path); !strings.Contains(got, `learn_until: "2026-11-21T07:00:00Z"`) {
		t.Errorf("the policy file does not hold the end of learn mode:\n%s", got)
	}
	// Two hours later airlockd restarts: learn mode is over.
	now = now.Add(2 * time.Hour)
	s = open()
	if got := s.LearnUntil(); !got.IsZero() {
		t.Errorf("after a restart past the end, learn until = %v, want over (zero)", got)
	}
	if d := s.Decide(Query{Host: "new.example", Port: 443}); d.Verdict != Ask {
		t.Errorf("after a restart past the end: %v, want ask", d)
	}
}

// Changed's channel is closed by every change of what Decide answers, so
// that whoever keeps open what learn mode let through decides it again:
// settings, rules added and removed, reloads, trust levels. Reading the
// policy changes nothing.
func TestChangedClosesOnEveryChangeInForce(t *testing.T) {
	s, _ := openTestSandbox(t, "sandbox:\n  unknown_action: learn\n  learn_until: \"2099-01-01T00:00:00Z\"\n")
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	deny := ActionDeny
	var added *Rule
	for _, step := range []struct {
		name   string
		change func() error
	}{
		{"settings", func() error { _, err := s.SetSettings(Settings{UnknownAction: &deny}); return err }},
		{"session rule added", func() error {
			var err error
			added, err = s.Add(AddRequest{Pattern: "a.example.com", List: Allowlist})
			return err
		}},
		{"session rule removed", func() error { _, err := s.Remove(added.ID); return err }},
		{"rule persisted", func() error {
			_, err := s.Add(AddRequest{Pattern: "b.example.com", List: Allowlist, Persist: true})
			return err
		}},
		{"reload", s.Reload},
		{"trust", func() error { s.SetTrust("mcp:x", TrustUserAdded); return nil }},
	} {
		ch := s.Changed()
		s.Decide(Query{Host: "c.example.com", Port: 443})
		s.Spec()
		s.Rules()
		if closed(ch) {
			t.Fatalf("before %s: closed without a change", step.name)
		}
		if err := step.change(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if !closed(ch) {
			t.Errorf("%s: Changed's channel is still open", step.name)
		}
		if closed(s.Changed()) {
			t.Errorf("%s: the next channel is closed already", step.name)
		}
	}
}
