package policy

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestSessionsSection(t *testing.T) {
	spec, err := LoadSpec("testdata/sessions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := &Sessions{
		Image: "my-agent:1", Command: []string{"agent", "--task", "{task}"},
		Env: []string{"LOG_LEVEL=debug", "ANTHROPIC_API_KEY"}, User: DefaultSessionUser,
		Timeout: 120 * time.Second, IdleCleanup: 10 * time.Minute, MaxSessions: 5,
		Limits: Limits{MemoryMB: 256, CPUs: 0.5, Pids: 64},
	}
	if diff := cmp.Diff(want, spec.Sessions); diff != "" {
		t.Errorf("sessions (-want +got):\n%s", diff)
	}
	// Defaults, and none without the section.
	spec, err = ParseSpec("x.yaml", []byte("sandbox:\n  sessions: {image: a:1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s := spec.Sessions; s.Timeout != DefaultSessionTimeout || s.IdleCleanup != DefaultSessionIdleCleanup || s.MaxSessions != DefaultMaxSessions || s.User != DefaultSessionUser {
		t.Errorf("defaults: %+v", s)
	}
	if spec, _ := ParseSpec("x.yaml", []byte("sandbox: {}\n")); spec.Sessions != nil {
		t.Errorf("a file without sessions: has %+v", spec.Sessions)
	}
}

func TestSessionsWiden(t *testing.T) {
	base := &Sessions{Image: "a:1", User: DefaultSessionUser}
	tests := []struct {
		name      string
		old, next *Sessions
		want      []string
	}{
		{name: "added", old: nil, next: base, want: []string{"sessions added: image a:1"}},
		{name: "removed", old: base, next: nil},
		{name: "timeout only", old: base, next: &Sessions{Image: "a:1", User: DefaultSessionUser, Timeout: time.Second}},
		{name: "image", old: base, next: &Sessions{Image: "b:1", User: DefaultSessionUser}, want: []string{`sessions: image "a:1" → "b:1"`}},
		{name: "env", old: base, next: &Sessions{Image: "a:1", User: DefaultSessionUser, Env: []string{"HOME"}}, want: []string{"sessions: env changed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Widens(&Spec{Sessions: tt.old}, &Spec{Sessions: tt.next})
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
