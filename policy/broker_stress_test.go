package policy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Many members ask, hang up and time out while a person decides: every
// approval is announced opened once, then decided once, and nothing after;
// every answer a member gets was announced before it got it; at the end
// nothing is pending and every event was delivered.
func TestBrokerEventInvariantsUnderStress(t *testing.T) {
	s, _ := openTestSandbox(t, "sandbox:\n  unknown_action: ask\n")
	var mu sync.Mutex
	state := map[string]string{}  // ID -> "opened" / "decided"
	announced := map[string]int{} // host|action -> decided events delivered
	var errs []string
	fail := func(f string, a ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Sprintf(f, a...))
		}
	}
	var b *Broker
	b, err := NewBroker(BrokerConfig{Sandbox: s, Timeout: 3 * time.Millisecond, MaxHeldPerMember: 8, OnEvent: func(e BrokerEvent) {
		b.List()
		mu.Lock()
		defer mu.Unlock()
		id := e.Pending.ID
		switch e.Kind {
		case "opened":
			if st, ok := state[id]; ok {
				fail("%s opened again after %s", id, st)
			}
			state[id] = "opened"
		case "decided":
			if st := state[id]; st != "opened" {
				fail("%s decided (%s) in state %q", id, e.Action, st)
			}
			state[id] = "decided"
			announced[e.Pending.Host+"|"+e.Action]++
		}
		if rand.IntN(4) == 0 {
			time.Sleep(20 * time.Microsecond)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var members, person sync.WaitGroup
	for i := range 16 {
		members.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				host := fmt.Sprintf("h%d.example", (i+n)%5)
				src := fmt.Sprintf("m%d", i%4)
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(4000))*time.Microsecond)
				o := b.Ask(ctx, AskRequest{Source: src, Host: host, Port: 443})
				cancel()
				if o.Action != "" {
					mu.Lock()
					if announced[host+"|"+o.Action] == 0 {
						fail("%s answered %s before any such decision was announced", host, o.Action)
					}
					mu.Unlock()
				}
			}
		})
	}
	person.Go(func() {
		acts := []Choice{{Action: ResolveDeny}, {Action: ResolveAllowOnce}}
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, p := range b.List() {
				b.Decide(p.ID, acts[rand.IntN(len(acts))])
			}
			time.Sleep(100 * time.Microsecond)
		}
	})
	time.Sleep(2 * time.Second)
	close(stop)
	done := make(chan struct{})
	go func() { members.Wait(); person.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("deadlock: goroutines did not finish")
	}
	time.Sleep(50 * time.Millisecond) // timers of approvals nobody waits on
	mu.Lock()
	defer mu.Unlock()
	for _, e := range errs {
		t.Error(e)
	}
	if l := b.List(); len(l) != 0 {
		t.Errorf("left pending: %+v", l)
	}
	for id, st := range state {
		if st != "decided" {
			t.Errorf("%s left %s", id, st)
		}
	}
	b.mu.Lock()
	if b.handed != b.queued || len(b.queue) != 0 || b.delivering {
		t.Errorf("handed %d queued %d queue %d delivering %v", b.handed, b.queued, len(b.queue), b.delivering)
	}
	b.mu.Unlock()
	t.Logf("%d approvals", len(state))
}

// A panic in OnEvent, which the caller recovers (net/http does, for the
// member API's Request), leaves the broker usable: the panic is the
// caller's, and the next change is delivered. (It runs in a child process:
// a broker that unlocked a mutex it did not hold would end the process
// with a fatal error no recover catches.)
func TestBrokerSurvivesAnOnEventPanic(t *testing.T) {
	if os.Getenv("AIRLOCK_BROKER_PANIC_CHILD") == "1" {
		s, _ := openTestSandbox(t, "sandbox:\n  unknown_action: ask\n")
		var boom atomic.Bool
		boom.Store(true)
		b, err := NewBroker(BrokerConfig{Sandbox: s, Timeout: time.Minute, OnEvent: func(BrokerEvent) {
			if boom.Swap(false) {
				panic("journal bug")
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		func() {
			defer func() { recover() }() // as net/http does for a handler
			b.Request(AskRequest{Kind: AskPort, Source: "agent", Port: 8080})
		}()
		done := make(chan struct{})
		go func() {
			defer close(done)
			b.Request(AskRequest{Kind: AskPort, Source: "agent", Port: 8081})
		}()
		select {
		case <-done:
			fmt.Println("BROKER-SURVIVED")
		case <-time.After(2 * time.Second):
			fmt.Println("BROKER-STUCK")
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestBrokerSurvivesAnOnEventPanic$", "-test.count=1")
	cmd.Env = append(os.Environ(), "AIRLOCK_BROKER_PANIC_CHILD=1")
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "BROKER-SURVIVED") {
		i := strings.Index(string(out), "fatal error")
		if i < 0 {
			i = 0
		}
		t.Errorf("a recovered OnEvent panic did not leave the broker usable:\n%.300s", out[i:])
	}
}
