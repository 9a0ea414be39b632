package testenv

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	var calls atomic.Int32
	if !Poll(5*time.Second, func() bool { return calls.Add(1) == 3 }) {
		t.Errorf("a condition met on the third call was reported unmet")
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("cond called %d times after it held, want 3", n)
	}
	start := time.Now()
	if Poll(50*time.Millisecond, func() bool { return false }) {
		t.Errorf("a condition never met was reported met")
	}
	if el := time.Since(start); el < 50*time.Millisecond || el > 2*time.Second {
		t.Errorf("Poll gave up after %v, want about 50ms", el)
	}
}
