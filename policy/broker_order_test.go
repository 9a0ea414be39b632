package policy

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// holdPolicyLock takes the policy file's .lock as a member could (the file
// sits in its project), so that a persisted Add waits lockWait and fails.
func holdPolicyLock(t *testing.T, path string) {
	t.Helper()
	old := lockWait
	lockWait = 500 * time.Millisecond
	t.Cleanup(func() { lockWait = old })
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
}

// While a decision that saves a rule is in flight its approval is off the
// list, but its held requests still count against MaxHeldPerMember: a
// member that holds the policy file's lock to stretch that window cannot
// hold more than its limit (invariant 17).
func TestBrokerHeldLimitCountsApprovalsBeingDecided(t *testing.T) {
	s, path := openTestSandbox(t, "")
	b, err := NewBroker(BrokerConfig{Sandbox: s, Timeout: time.Minute, MaxHeldPerMember: 2})
	if err != nil {
		t.Fatal(err)
	}
	holdPolicyLock(t, path)
	ask(t, b, AskRequest{Source: "agent", Host: "x.example", Port: 443})
	ask(t, b, AskRequest{Source: "agent", Host: "x.example", Port: 443})
	p := waitPending(t, b, 1, 2)[0]
	done := make(chan error, 1)
	go func() {
		_, err := b.Decide(p.ID, Choice{Action: ResolveDeny, Persist: true})
		done <- err
	}()
	waitPending(t, b, 0, 0) // taken; the rule waits on the member's lock
	extra := []<-chan Outcome{
		ask(t, b, AskRequest{Source: "agent", Host: "y.example", Port: 443}),
		ask(t, b, AskRequest{Source: "agent", Host: "z.example", Port: 443}),
	}
	for i, ch := range extra {
		select {
		case o := <-ch:
			if !strings.Contains(o.Reason, "too many held") {
				t.Errorf("extra ask %d: %+v", i, o)
			}
		case <-time.After(200 * time.Millisecond):
			t.Errorf("extra ask %d held beyond MaxHeldPerMember=2 while the approval was being decided", i)
		}
	}
	if err := <-done; err == nil {
		t.Fatal("persisted deny with the lock held: no error")
	}
	total := 0
	for _, x := range b.List() {
		total += x.Waiting
	}
	if total > 2 {
		t.Errorf("after the failed save the member holds %d requests, limit 2", total)
	}
}

// Events are delivered in the order of the changes they report, also when
// delivering one is slow (a journal write) and another goroutine changes
// the approvals meanwhile: an approval asked anew, whose shown request
// hangs up at once, is announced opened before it is announced gone.
func TestBrokerEventsInOrder(t *testing.T) {
	s, _ := openTestSandbox(t, "")
	var mu sync.Mutex
	var events []BrokerEvent
	firstGone := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	b, err := NewBroker(BrokerConfig{Sandbox: s, Timeout: time.Minute, OnEvent: func(e BrokerEvent) {
		if e.Action == "gone" {
			blocked := false
			once.Do(func() { blocked = true })
			if blocked {
				close(firstGone)
				<-release // a slow journal write
			}
		}
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	req := func(n string) AskRequest {
		return AskRequest{Source: "agent", Host: "x.example", Port: 443, Method: "GET", URL: "https://x.example/a",
			Headers: map[string][]string{"X-N": {n}}}
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	c1 := make(chan Outcome, 1)
	go func() { c1 <- b.Ask(ctx1, req("1")) }()
	waitPending(t, b, 1, 1)
	ctx2, cancel2 := context.WithCancel(context.Background())
	c2 := make(chan Outcome, 1)
	go func() { c2 <- b.Ask(ctx2, req("2")) }()
	waitPending(t, b, 1, 2)
	ask(t, b, req("3"))
	waitPending(t, b, 1, 3)
	go cancel1() // the shown request hangs up: gone, 2 and 3 asked anew
	<-firstGone
	q := waitPending(t, b, 1, 2)[0]
	cancel2() // the member hangs up the request the new approval shows
	waitPending(t, b, 1, 1)
	close(release) // its hang-up waits for its own events, behind the slow one
	<-c2
	<-c1
	mu.Lock()
	defer mu.Unlock()
	decidedAt, openedAt := -1, -1
	for i, e := range events {
		if e.Pending.ID != q.ID {
			continue
		}
		if e.Kind == "decided" && decidedAt < 0 {
			decidedAt = i
		}
		if e.Kind == "opened" && openedAt < 0 {
			openedAt = i
		}
	}
	if decidedAt >= 0 && openedAt > decidedAt {
		t.Errorf("approval %s announced decided (event %d) before opened (event %d)", q.ID, decidedAt, openedAt)
	}
}

// A member's second equal network request joins the first's approval. It
// holds no traffic, so allow_pattern answers every asker of it alike, also
// with a rule that does not cover the question: none is left waiting under
// an approval the member never learns of.
func TestBrokerMemberRequestsShareTheirAnswer(t *testing.T) {
	s, _ := openTestSandbox(t, "sandbox:\n  unknown_action: ask\n")
	b, err := NewBroker(BrokerConfig{Sandbox: s, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	req := func(reason string) AskRequest {
		return AskRequest{Kind: AskNetwork, Source: "agent", Host: "x.example", Port: 443, URL: "https://x.example/a", Reason: reason}
	}
	t1, err := b.Request(req("benign"))
	if err != nil {
		t.Fatal(err)
	}
	t2, err := b.Request(req("second"))
	if err != nil {
		t.Fatal(err)
	}
	if t1.ID() != t2.ID() {
		t.Fatalf("not joined: %s %s", t1.ID(), t2.ID())
	}
	if _, err := b.Decide(t1.ID(), Choice{Action: ResolveAllowPattern, Pattern: "x.example/other"}); err != nil {
		t.Fatal(err)
	}
	for i, tk := range []*Ticket{t1, t2} {
		if o, done := tk.Outcome(); !done || !o.Allowed || o.Action != "allow_pattern" || tk.ID() != t1.ID() {
			t.Errorf("ticket %d: %+v %v (approval %s)", i+1, o, done, tk.ID())
		}
	}
	waitPending(t, b, 0, 0)
}

// A member that opens held asks and hangs up at once, over and over, makes
// two events each time; it waits for their delivery like everyone else, so
// a person's decision, which waits for its own, is carried out while the
// member goes on, and the queue stays short.
func TestBrokerDecisionNotStarvedByAMembersChurn(t *testing.T) {
	s, _ := openTestSandbox(t, "sandbox:\n  unknown_action: ask\n")
	var fast atomic.Bool // the test is over: drain quickly
	var b *Broker
	b, err := NewBroker(BrokerConfig{Sandbox: s, Timeout: time.Minute, OnEvent: func(BrokerEvent) {
		b.List() // List and Get may be called from OnEvent
		if !fast.Load() {
			time.Sleep(200 * time.Microsecond) // a journal write and a log line
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	held := ask(t, b, AskRequest{Source: "other", Host: "shown.example", Port: 443})
	p := waitPending(t, b, 1, 1)[0]
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithCancel(context.Background())
				cancel() // hangs up at once: opened, then gone
				b.Ask(ctx, AskRequest{Source: "agent", Host: fmt.Sprintf("h%d-%d.example", i, n), Port: 443})
			}
		})
	}
	defer func() {
		close(stop)
		fast.Store(true)
		wg.Wait()
	}()
	if _, err := b.Decide(p.ID, Choice{Action: ResolveAllowOnce}); err != nil {
		t.Fatal(err)
	}
	if o := outcome(t, held); !o.Allowed {
		t.Errorf("allowed once: %+v", o)
	}
	b.mu.Lock()
	queued := len(b.queue)
	b.mu.Unlock()
	if queued > 64 {
		t.Errorf("%d events queued while a member churns asks, want a few batches' worth", queued)
	}
}
