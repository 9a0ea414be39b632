// Package logging builds airlockd's slog handler: logfmt lines on stderr,
// and, when stderr is the systemd journal's stream, lines in the journal's
// own format: a "<N>" priority prefix (sd-daemon(3)) instead of a level and
// no timestamp, since the journal stamps every line itself.
package logging

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/airlockhq/airlock/internal/visible"
)

// New returns a handler writing to w at level and above: the journal's
// format when journal is true, slog's text format otherwise.
//
// Every string value (errors and Stringers included) goes through
// visible.String, so that a name, URL or header a sandbox member chose
// cannot rewrite a terminal or forge a log line, whichever call site logs
// it (design §8, invariant 16).
func New(w io.Writer, level slog.Leveler, journal bool) slog.Handler {
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: escapeAttr}
	if !journal {
		return slog.NewTextHandler(w, opts)
	}
	opts.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey || a.Key == slog.MessageKey) {
			return slog.Attr{}
		}
		return escapeAttr(groups, a)
	}
	j := &journalHandler{out: w, mu: new(sync.Mutex), buf: new(bytes.Buffer)}
	j.text = slog.NewTextHandler(j.buf, opts)
	return j
}

// escapeAttr shows every string value, and the message, with unsafe
// characters escaped.
func escapeAttr(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindString:
		if v := a.Value.String(); visible.String(v) != v {
			a.Value = slog.StringValue(visible.String(v))
		}
	case slog.KindAny:
		switch v := a.Value.Any().(type) {
		case error:
			a.Value = slog.StringValue(visible.String(v.Error()))
		case fmt.Stringer:
			a.Value = slog.StringValue(visible.String(v.String()))
		case []string:
			esc := make([]string, len(v))
			for i, x := range v {
				esc[i] = visible.String(x)
			}
			a.Value = slog.AnyValue(esc)
		}
	}
	return a
}

// Priority maps a slog level to the syslog priority the journal files it
// under: debug 7, info 6, warn 4, error 3.
func Priority(l slog.Level) int {
	switch {
	case l >= slog.LevelError:
		return 3
	case l >= slog.LevelWarn:
		return 4
	case l >= slog.LevelInfo:
		return 6
	default:
		return 7
	}
}

// journalHandler writes "<N>message key=value…" lines. The attributes are
// formatted by a text handler into buf, which mu guards; handlers made by
// WithAttrs and WithGroup share both.
type journalHandler struct {
	out  io.Writer
	text slog.Handler // writes into buf, without time, level or message
	mu   *sync.Mutex
	buf  *bytes.Buffer
}

func (h *journalHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.text.Enabled(ctx, l)
}

func (h *journalHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.buf.Reset()
	if err := h.text.Handle(ctx, r); err != nil {
		return err
	}
	attrs := bytes.TrimRight(h.buf.Bytes(), "\n")
	var line bytes.Buffer
	line.WriteByte('<')
	line.WriteByte(byte('0' + Priority(r.Level)))
	line.WriteByte('>')
	// The journal splits its stream at newlines: a message must stay one
	// line, or the rest would be filed at the default priority.
	line.WriteString(visible.String(r.Message))
	if len(attrs) > 0 {
		line.WriteByte(' ')
		line.Write(attrs)
	}
	line.WriteByte('\n')
	_, err := h.out.Write(line.Bytes())
	return err
}

func (h *journalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.text = h.text.WithAttrs(as)
	return &c
}

func (h *journalHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.text = h.text.WithGroup(name)
	return &c
}
