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
	l := &Limiter{Every: 50 * time.Millisecond}
	for range 100 {
		l.Log(log, "a", "refused")
	}
	l.Log(log, "b", "refused")
	time.Sleep(60 * time.Millisecond)
	l.Log(log, "a", "refused")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "left_out=0") || !strings.Contains(lines[2], "left_out=99") {
		t.Errorf("lines:\n%s", out.String())
	}
}
