package logging

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestJournalFormat(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(New(&out, slog.LevelDebug, true)).With("component", "tproxy")
	log.Debug("connection", "host", "allowed.test", "verdict", "allow")
	log.Info("connection", "host", "unknown.test", "verdict", "deny", "rule", "")
	log.Warn("policy reload refused", "err", errors.New("app.yaml:3: sandbox.unknown_action: want ask, deny or allow"))
	log.Error("two\nlines", "v", "a\nb")
	log.WithGroup("g").Info("grouped", "k", 1)
	want := []string{
		`<7>connection component=tproxy host=allowed.test verdict=allow`,
		`<6>connection component=tproxy host=unknown.test verdict=deny rule=""`,
		`<4>policy reload refused component=tproxy err="app.yaml:3: sandbox.unknown_action: want ask, deny or allow"`,
		`<3>two\x0alines component=tproxy v=a\x0ab`,
		`<6>grouped component=tproxy g.k=1`,
	}
	got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("journal lines (-want +got):\n%s", d)
	}
}

func TestJournalLevelFilter(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(New(&out, slog.LevelInfo, true))
	log.Debug("quiet")
	log.Info("loud")
	if got, want := out.String(), "<6>loud\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestTextFormatKeepsTime(t *testing.T) {
	var out bytes.Buffer
	slog.New(New(&out, slog.LevelInfo, false)).Info("ready", "sandboxes", 2)
	if s := out.String(); !strings.HasPrefix(s, "time=") || !strings.Contains(s, "level=INFO msg=ready sandboxes=2") {
		t.Errorf("text line %q", s)
	}
}

func TestPriority(t *testing.T) {
	for _, tt := range []struct {
		l    slog.Level
		want int
	}{{slog.LevelDebug, 7}, {slog.LevelDebug + 2, 7}, {slog.LevelInfo, 6}, {slog.LevelWarn, 4}, {slog.LevelError, 3}, {slog.LevelError + 4, 3}} {
		if got := Priority(tt.l); got != tt.want {
			t.Errorf("Priority(%v) = %d, want %d", tt.l, got, tt.want)
		}
	}
}

// TestMemberTextIsEscaped: a host or URL a sandbox member chose cannot
// clear the operator's terminal, write their clipboard, forge a line or
// reorder text in a log line, in either format.
func TestMemberTextIsEscaped(t *testing.T) {
	for _, journal := range []bool{false, true} {
		var out bytes.Buffer
		log := slog.New(New(&out, slog.LevelInfo, journal))
		host := "evil.test\x1b[2J\x1b]52;c;ZXZpbA==\a\u009b31m\u2028\u202e"
		log.Info("request", "host", host, "url", "http://x.test/\nlevel=ERROR msg=forged", "err", errors.New("resolve \x1b[31m"))
		got := out.String()
		if strings.ContainsAny(got, "\x1b\a\u009b\u2028\u202e") || strings.Count(got, "\n") != 1 {
			t.Errorf("journal=%v: raw control characters in %q", journal, got)
		}
		for _, want := range []string{`\x1b[2J`, `\u{2028}`, `\u{202e}`, `\x0alevel=ERROR`} {
			if !strings.Contains(got, want) {
				t.Errorf("journal=%v: %q lacks the visible escape %s", journal, got, want)
			}
		}
	}
}
