package policy

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func newTestBroker(t *testing.T, timeout time.Duration) (*Broker, *Sandbox, string, *[]BrokerEvent) {
	t.Helper()
	s, path := openTestSandbox(t, "")
	var mu sync.Mutex
	var events []BrokerEvent
	b, err := NewBroker(BrokerConfig{Sandbox: s, Timeout: timeout, OnEvent: func(e BrokerEvent) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	return b, s, path, &events
}

// askAll starts n Asks for host:port and returns a func collecting their
// outcomes.
func askAll(b *Broker, n int, host string, port uint16) func() []Outcome {
	ch := make(chan Outcome, n)
	for i := 0; i < n; i++ {
		go func() { ch <- b.Ask(context.Background(), AskRequest{Source: "agent", Host: host, Port: port}) }()
	}
	return func() []Outcome {
		var out []Outcome
		for i := 0; i < n; i++ {
			out = append(out, <-ch)
		}
		return out
	}
}

func waitPending(t *testing.T, b *Broker, n, waiting int) []Pending {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		p := b.List()
		total := 0
		for _, x := range p {
			total += x.Waiting
		}
		if len(p) == n && total == waiting {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pending = %+v, want %d approvals with %d waiting", p, n, waiting)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestBrokerCoalescesAndAllowsOnce(t *testing.T) {
	b, s, _, events := newTestBroker(t, time.Minute)
	collect := askAll(b, 3, "unknown.test", 443)
	p := waitPending(t, b, 1, 3)[0]
	if p.Host != "unknown.test" || p.URL != "unknown.test:443" || len(p.Suggestions) != 4 || p.Deadline.Sub(p.Created) != time.Minute {
		t.Errorf("pending = %+v", p)
	}
	start := time.Now()
	if _, err := b.Decide(p.ID, Choice{Action: ResolveAllowOnce}); err != nil {
		t.Fatal(err)
	}
	for _, o := range collect() {
		if !o.Allowed || o.Reason != "approved once" {
			t.Errorf("outcome %+v, want approved once", o)
		}
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("release took %v", d)
	}
	if len(b.List()) != 0 || len(s.Rules()) != 0 {
		t.Errorf("allow once left pending %v or rules %v", b.List(), s.Rules())
	}
	if len(*events) != 2 || (*events)[0].Kind != "opened" || (*events)[1].Action != "allow_once" {
		t.Errorf("events = %+v", *events)
	}
	if _, err := b.Decide(p.ID, Choice{Action: ResolveDeny}); !errors.Is(err, ErrNoPending) {
		t.Errorf("deciding twice: %v, want ErrNoPending", err)
	}
}

func TestBrokerDenyAndTimeout(t *testing.T) {
	b, _, path, _ := newTestBroker(t, 200*time.Millisecond)
	collect := askAll(b, 1, "evil.test", 443)
	p := waitPending(t, b, 1, 1)[0]
	if _, err := b.Decide(p.ID, Choice{Action: ResolveDeny, Persist: true}); err != nil {
		t.Fatal(err)
	}
	if o := collect()[0]; o.Allowed || o.Reason != "denied by a person" {
		t.Errorf("deny outcome %+v", o)
	}
	if !strings.Contains(readFile(t, path), `pattern: "evil.test"`) {
		t.Errorf("persisted deny not in the file:\n%s", readFile(t, path))
	}
	start := time.Now()
	o := askAll(b, 1, "slow.test", 443)()[0]
	if o.Allowed || !strings.Contains(o.Reason, "no decision within") {
		t.Errorf("timeout outcome %+v", o)
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > 2*time.Second {
		t.Errorf("timed out after %v, want about 200ms", d)
	}
	if len(b.List()) != 0 {
		t.Errorf("timed-out approval still pending: %v", b.List())
	}
}

func TestBrokerAllowPatternReleasesMatching(t *testing.T) {
	b, s, path, _ := newTestBroker(t, time.Minute)
	ca := askAll(b, 2, "a.unknown.test", 443)
	cb := askAll(b, 1, "b.unknown.test", 443)
	co := askAll(b, 1, "other.test", 443)
	pend := waitPending(t, b, 3, 4)
	var id string
	for _, p := range pend {
		if p.Host == "a.unknown.test" {
			id = p.ID
		}
	}
	if _, err := b.Decide(id, Choice{Action: ResolveAllowPattern, Pattern: "*.com"}); !errors.Is(err, ErrBroad) {
		t.Fatalf("broad pattern: %v", err)
	}
	if len(b.List()) != 3 {
		t.Fatal("a refused pattern decided something")
	}
	r, err := b.Decide(id, Choice{Action: ResolveAllowPattern, Pattern: "*.unknown.test", Persist: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range append(ca(), cb()...) {
		if !o.Allowed || o.Rule == nil || o.Rule.ID != r.ID {
			t.Errorf("outcome %+v, want allowed by *.unknown.test", o)
		}
	}
	if p := b.List(); len(p) != 1 || p[0].Host != "other.test" {
		t.Errorf("still pending: %+v, want other.test only", p)
	}
	if s.Decide(Query{Host: "c.unknown.test", Port: 443}).Verdict != Allow || !strings.Contains(readFile(t, path), "*.unknown.test") {
		t.Error("pattern not in force or not saved")
	}
	b.Decide(b.List()[0].ID, Choice{Action: ResolveDeny})
	if o := co()[0]; o.Allowed {
		t.Error("other.test was allowed")
	}
}

func TestBrokerClientGoesAway(t *testing.T) {
	b, _, _, _ := newTestBroker(t, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Outcome)
	go func() { done <- b.Ask(ctx, AskRequest{Host: "x.test", Port: 443}) }()
	waitPending(t, b, 1, 1)
	cancel()
	if o := <-done; o.Allowed {
		t.Error("allowed after cancel")
	}
	if len(b.List()) != 0 {
		t.Error("approval with nobody waiting still pending")
	}
}

func TestBrokerDecideErrors(t *testing.T) {
	b, _, _, _ := newTestBroker(t, time.Minute)
	if _, err := b.Decide("nope", Choice{Action: ResolveAllowOnce}); !errors.Is(err, ErrNoPending) {
		t.Errorf("unknown id: %v", err)
	}
	collect := askAll(b, 1, "x.test", 443)
	id := waitPending(t, b, 1, 1)[0].ID
	if _, err := b.Decide(id, Choice{Action: ResolveAllowPattern}); err == nil {
		t.Error("allow_pattern without a pattern accepted")
	}
	if _, err := b.Decide(id, Choice{Action: 99}); err == nil {
		t.Error("unknown action accepted")
	}
	if len(b.List()) != 1 {
		t.Fatal("a bad decision decided")
	}
	b.Decide(id, Choice{Action: ResolveDeny})
	collect()
	if _, err := ParseResolution("maybe"); err == nil {
		t.Error("ParseResolution accepted maybe")
	}
}
