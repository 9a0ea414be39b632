// Package ratelog logs a kind of refusal at most once per interval per key
// (a member), with the count of those it left out, so that a flood is seen
// without flooding the log.
package ratelog

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// maxKeys bounds the keys remembered: a member cycling through spoofed
// sources gets no memory out of it, only more lines.
const maxKeys = 4096

// Limiter remembers when it last logged for each key. The zero value logs
// every 10 s per key.
type Limiter struct {
	// Every is the interval; 0 means 10 s.
	Every time.Duration
	// now is the clock; nil means time.Now. Tests set it.
	now func() time.Time

	// mu guards the following fields.
	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int
}

// Log writes msg with attrs and "left_out", the number of lines for key it
// did not write since the last one, unless it wrote one for key within the
// interval; it reports whether it wrote.
func (l *Limiter) Log(log *slog.Logger, key, msg string, attrs ...any) bool {
	every := l.Every
	if every == 0 {
		every = 10 * time.Second
	}
	now := time.Now
	if l.now != nil {
		now = l.now
	}
	at := now()
	l.mu.Lock()
	if l.last == nil || len(l.last) >= maxKeys {
		l.last, l.suppressed = map[string]time.Time{}, map[string]int{}
	}
	if t, ok := l.last[key]; ok && at.Sub(t) < every {
		l.suppressed[key]++
		l.mu.Unlock()
		return false
	}
	left := l.suppressed[key]
	l.last[key], l.suppressed[key] = at, 0
	l.mu.Unlock()
	log.Warn(msg, append(attrs, "left_out", left, "interval", every)...)
	return true
}

// Count counts refusals that get no line (or record) of their own, and
// logs how many when told, once. The zero value is ready; it is safe for
// concurrent use, and Say costs one atomic load while nothing is counted.
type Count struct{ n atomic.Uint64 }

// Add counts one refusal.
func (c *Count) Add() { c.n.Add(1) }

// Say writes msg with the number counted since the last line, under key,
// unless there is none.
func (c *Count) Say(log *slog.Logger, msg, key string) {
	if c.n.Load() != 0 {
		if n := c.n.Swap(0); n != 0 {
			log.Warn(msg, key, n)
		}
	}
}
