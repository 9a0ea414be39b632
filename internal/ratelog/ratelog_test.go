package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestOncePerIntervalPerKey(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	clock := time.Now()
	l := &Limiter{Every: 50 * time.Millisecond, now: func() time.Time { return clock }}
	for range 100 {
		l.Log(log, "a", "refused")
	}
	l.Log(log, "b", "refused")
	clock = clock.Add(49 * time.Millisecond)
	if l.Log(log, "b", "refused") {
		t.Error("b logged again within the interval")
	}
	clock = clock.Add(time.Millisecond)
	l.Log(log, "a", "refused")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "left_out=0") || !strings.Contains(lines[2], "left_out=99") {
		t.Errorf("lines:\n%s", out.String())
	}
}

// TestCount: Say writes the number counted since its last line, once, and
// nothing when none was.
func TestCount(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(slog.NewTextHandler(&b, nil))
	var c Count
	c.Say(log, "refused", "n")
	for range 3 {
		c.Add()
	}
	c.Say(log, "refused", "n")
	c.Say(log, "refused", "n")
	if got := b.String(); strings.Count(got, "msg=refused") != 1 || !strings.Contains(got, "n=3") {
		t.Errorf("log: %q, want one line with n=3", got)
	}
}
