package tproxy

import (
	"log/slog"
	"strconv"
	"sync"

	"github.com/airlockhq/airlock/internal/ratelog"
)

// limiter counts a sandbox's open connections, per member and in all, so
// that no member, and no sandbox, can take the file descriptors every
// other one needs (design §8, invariant 17). A refusal costs one accept
// and one close; it is recorded each time and logged once per interval per
// member.
type limiter struct {
	perMember, total int // 0 means no limit
	log              *slog.Logger
	refusals         ratelog.Limiter

	// mu guards the following fields.
	mu       sync.Mutex
	byMember map[string]int
	all      int
}

func newLimiter(perMember, total int, log *slog.Logger) *limiter {
	return &limiter{perMember: perMember, total: total, log: log, byMember: map[string]int{}}
}

// acquire takes a place for a connection of member; it returns why not
// when a limit is reached.
func (l *limiter) acquire(member string) (why string) {
	l.mu.Lock()
	switch {
	case l.total > 0 && l.all >= l.total:
		why = "the sandbox's connection limit (" + strconv.Itoa(l.total) + ") is reached"
	case l.perMember > 0 && l.byMember[member] >= l.perMember:
		why = "the member's connection limit (" + strconv.Itoa(l.perMember) + ") is reached"
	default:
		l.all++
		l.byMember[member]++
	}
	l.mu.Unlock()
	if why != "" {
		l.refusals.Log(l.log, member, "connection refused: limit reached", "source", member, "reason", why)
	}
	return why
}

// release gives back the place of a connection of member.
func (l *limiter) release(member string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all--
	if l.byMember[member]--; l.byMember[member] <= 0 {
		delete(l.byMember, member)
	}
}
