package testenv

import (
	"testing"
	"time"
)

// Poll calls cond until it reports true or timeout has passed, and reports
// whether it did. It calls cond at once, then after 1 ms, and backs off to
// one call every 20 ms, so that a condition met quickly is seen quickly and
// one that costs a process (curl, nft) is not run in a tight loop. It needs
// no *testing.T, so a goroutine of a test may use it.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
	}
}

// WaitFor is how a test waits for something it cannot receive from a
// channel (a record in a journal, a line in a log, a file, a count): it
// polls cond (see Poll) and fails the test, saying what it waited for, when
// cond does not hold within timeout.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(timeout, cond) {
		t.Fatalf("waited %v for %s", timeout, what)
	}
}
