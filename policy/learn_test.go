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
