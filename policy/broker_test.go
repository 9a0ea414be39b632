package policy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/airlockhq/airlock/internal/testenv"
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
	var p []Pending
	if !testenv.Poll(5*time.Second, func() bool {
		p = b.List()
		total := 0
		for _, x := range p {
			total += x.Waiting
		}
		return len(p) == n && total == waiting
	}) {
		t.Fatalf("pending = %+v, want %d approvals with %d waiting", p, n, waiting)
	}
	return p
}

// Connections of one member to one host and port share an approval, but
// allow once lets exactly one of them through: the one whose approval the
// person saw. The others are asked about again (design §8, invariant 13).
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
	again := waitPending(t, b, 1, 2)[0]
	if again.ID == p.ID || again.URL != p.URL || again.Source != p.Source {
		t.Errorf("after allow once, pending = %+v; want a new approval for the other two", again)
	}
	if _, err := b.Decide(again.ID, Choice{Action: ResolveDeny}); err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for _, o := range collect() {
		switch {
		case o.Allowed && o.Reason == "approved once":
			allowed++
		case o.Allowed || o.Reason != "denied by a person":
			t.Errorf("outcome %+v, want approved once for one and denied for the others", o)
		}
	}
	if allowed != 1 {
		t.Errorf("allow once let %d connections through, want 1", allowed)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("release took %v", d)
	}
	if len(b.List()) != 0 || len(s.Rules()) != 0 {
		t.Errorf("left pending %v or rules %v", b.List(), s.Rules())
	}
	var kinds []string
	for _, e := range *events {
		kinds = append(kinds, e.Kind+" "+e.Action)
	}
	if want := []string{"opened ", "decided allow_once", "opened ", "decided deny"}; !slices.Equal(kinds, want) {
		t.Errorf("events = %q, want %q", kinds, want)
	}
	if (*events)[1].Pending.Waiting != 1 || (*events)[2].Pending.Waiting != 2 {
		t.Errorf("events = %+v", *events)
	}
	if _, err := b.Decide(p.ID, Choice{Action: ResolveDeny}); !errors.Is(err, ErrNoPending) {
		t.Errorf("deciding twice: %v, want ErrNoPending", err)
	}
}

// Requests with the same method and URL share an approval, but may carry
// other bodies and headers: allow once covers only the one shown.
func TestBrokerAllowOnceCoversOneRequest(t *testing.T) {
	b, _, _, _ := newTestBroker(t, time.Minute)
	shown := ask(t, b, AskRequest{Source: "agent", Host: "x.example", Port: 443, Method: "POST", URL: "https://x.example/upload", Headers: map[string][]string{"X-N": {"1"}}})
	waitPending(t, b, 1, 1)
	other := ask(t, b, AskRequest{Source: "agent", Host: "x.example", Port: 443, Method: "POST", URL: "https://x.example/upload", Headers: map[string][]string{"X-N": {"2"}}})
	p := waitPending(t, b, 1, 2)[0]
	if p.Headers["X-N"][0] != "1" {
		t.Fatalf("approval shows %v, want the first request's headers", p.Headers)
	}
	if _, err := b.Decide(p.ID, Choice{Action: ResolveAllowOnce}); err != nil {
		t.Fatal(err)
	}
	if o := outcome(t, shown); !o.Allowed {
		t.Errorf("the request shown: %+v, want allowed", o)
	}
	stillHeld(t, other, "the second request")
	if q := waitPending(t, b, 1, 1)[0]; q.ID == p.ID {
		t.Errorf("the second request is still on the decided approval %s", p.ID)
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

// ask starts one Ask and returns where its outcome arrives. The Ask ends
// with the test if nobody decided it.
func ask(t *testing.T, b *Broker, req AskRequest) <-chan Outcome {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan Outcome, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ch <- b.Ask(ctx, req)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ch
}

func outcome(t *testing.T, ch <-chan Outcome) Outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(5 * time.Second):
		t.Fatal("held request not released")
		return Outcome{}
	}
}

// stillHeld fails if the Ask behind ch has returned.
func stillHeld(t *testing.T, ch <-chan Outcome, what string) {
	t.Helper()
	select {
	case o := <-ch:
		t.Errorf("%s released: %+v, want still held", what, o)
	case <-time.After(50 * time.Millisecond):
	}
}

func pendingBySource(t *testing.T, b *Broker, source string) Pending {
	t.Helper()
	for _, p := range b.List() {
		if p.Source == source {
			return p
		}
	}
	t.Fatalf("no approval for %s in %+v", source, b.List())
	return Pending{}
}

func TestBrokerMergesOnlyTheSameQuestion(t *testing.T) {
	type approval struct {
		Source  string
		Sources []string
		Method  string
		URL     string
		Waiting int
	}
	conn := func(source string) AskRequest {
		return AskRequest{Source: source, Host: "x.example", Port: 443}
	}
	req := func(source, method, url string) AskRequest {
		return AskRequest{Source: source, Host: "x.example", Port: 443, Method: method, URL: url}
	}
	tests := []struct {
		name string
		asks []AskRequest
		want []approval
	}{
		{
			name: "connections of one member to one host",
			asks: []AskRequest{conn("agent"), conn("agent"), conn("agent")},
			want: []approval{{"agent", []string{"agent"}, "", "x.example:443", 3}},
		},
		{
			name: "two members to one host",
			asks: []AskRequest{conn("agent"), conn("mcp:github")},
			want: []approval{
				{"agent", []string{"agent"}, "", "x.example:443", 1},
				{"mcp:github", []string{"mcp:github"}, "", "x.example:443", 1},
			},
		},
		{
			name: "two requests with different paths",
			asks: []AskRequest{req("agent", "GET", "https://x.example/a"), req("agent", "GET", "https://x.example/b")},
			want: []approval{
				{"agent", []string{"agent"}, "GET", "https://x.example/a", 1},
				{"agent", []string{"agent"}, "GET", "https://x.example/b", 1},
			},
		},
		{
			name: "the same request twice",
			asks: []AskRequest{req("agent", "GET", "https://x.example/a"), req("agent", "GET", "https://x.example/a")},
			want: []approval{{"agent", []string{"agent"}, "GET", "https://x.example/a", 2}},
		},
		{
			name: "the same URL with another method",
			asks: []AskRequest{req("agent", "GET", "https://x.example/a"), req("agent", "POST", "https://x.example/a")},
			want: []approval{
				{"agent", []string{"agent"}, "GET", "https://x.example/a", 1},
				{"agent", []string{"agent"}, "POST", "https://x.example/a", 1},
			},
		},
		{
			name: "the same request from two members",
			asks: []AskRequest{req("agent", "GET", "https://x.example/a"), req("mcp:fetch", "GET", "https://x.example/a")},
			want: []approval{
				{"agent", []string{"agent"}, "GET", "https://x.example/a", 1},
				{"mcp:fetch", []string{"mcp:fetch"}, "GET", "https://x.example/a", 1},
			},
		},
		{
			name: "a connection and a request",
			asks: []AskRequest{conn("agent"), req("agent", "GET", "https://x.example/a")},
			want: []approval{
				{"agent", []string{"agent"}, "", "x.example:443", 1},
				{"agent", []string{"agent"}, "GET", "https://x.example/a", 1},
			},
		},
		{
			name: "plain HTTP connections for different paths",
			asks: []AskRequest{
				{Source: "agent", Host: "x.example", Port: 80, URL: "http://x.example/a"},
				{Source: "agent", Host: "x.example", Port: 80, URL: "http://x.example/b"},
			},
			want: []approval{
				{"agent", []string{"agent"}, "", "http://x.example/a", 1},
				{"agent", []string{"agent"}, "", "http://x.example/b", 1},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _, _, _ := newTestBroker(t, time.Minute)
			for _, r := range tt.asks {
				ask(t, b, r)
			}
			waitPending(t, b, len(tt.want), len(tt.asks))
			var got []approval
			for _, p := range b.List() {
				got = append(got, approval{p.Source, p.Sources, p.Method, p.URL, p.Waiting})
			}
			slices.SortFunc(got, func(a, b approval) int {
				return cmp.Compare(a.Source+" "+a.Method+" "+a.URL, b.Source+" "+b.Method+" "+b.URL)
			})
			if diff := gocmp.Diff(tt.want, got); diff != "" {
				t.Errorf("approvals (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBrokerAllowOnceReleasesOnlyItsMember(t *testing.T) {
	b, s, _, _ := newTestBroker(t, time.Minute)
	agent1 := ask(t, b, AskRequest{Source: "agent", Host: "x.example", Port: 443})
	waitPending(t, b, 1, 1) // agent1 opens the approval
	agent2 := ask(t, b, AskRequest{Source: "agent", Host: "x.example", Port: 443})
	github := ask(t, b, AskRequest{Source: "mcp:github", Host: "x.example", Port: 443})
	waitPending(t, b, 2, 3)
	if _, err := b.Decide(pendingBySource(t, b, "agent").ID, Choice{Action: ResolveAllowOnce}); err != nil {
		t.Fatal(err)
	}
	if o := outcome(t, agent1); !o.Allowed || o.Reason != "approved once" {
		t.Errorf("agent's first connection: %+v, want approved once", o)
	}
	// Its second connection is asked about again; mcp:github's stays held.
	stillHeld(t, agent2, "agent's second connection")
	stillHeld(t, github, "mcp:github's connection")
	waitPending(t, b, 2, 2)
	if p := pendingBySource(t, b, "mcp:github"); p.Waiting != 1 || len(s.Rules()) != 0 {
		t.Errorf("pending %+v and rules %v, want mcp:github's approval and no rule", p, s.Rules())
	}
}

// A member whose rules are narrower than everyone's (high-risk, user_added)
// must not get through on another member's approval or pattern.
func TestBrokerAllowPatternKeepsNarrowMembersHeld(t *testing.T) {
	tests := []struct {
		name   string
		policy string
		member string
		req    AskRequest
	}{
		{
			name:   "high-risk MCP server",
			policy: "sandbox:\n  unknown_action: ask\n  mcp_servers:\n    - name: fetch\n",
			member: "mcp:fetch",
			req:    AskRequest{Source: "mcp:fetch", Host: "x.example", Port: 443, Method: "GET", URL: "https://x.example/exfil?secret=1"},
		},
		{
			name:   "user_added member",
			policy: "sandbox:\n  unknown_action: ask\n  mcp_servers:\n    - name: custom\n      transport: sse\n      image: custom-mcp:1\n",
			member: "mcp:custom",
			req:    AskRequest{Source: "mcp:custom", Host: "x.example", Port: 443},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := openTestSandbox(t, tt.policy)
			b, err := NewBroker(BrokerConfig{Sandbox: s, Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			agent := ask(t, b, AskRequest{Source: "agent", Host: "x.example", Port: 443})
			waitPending(t, b, 1, 1)
			narrow := ask(t, b, tt.req)
			waitPending(t, b, 2, 2)
			p := pendingBySource(t, b, tt.member)
			if want := tt.req.URL; want != "" && p.URL != want {
				t.Errorf("%s's approval shows %s, want %s", tt.member, p.URL, want)
			}
			r, err := b.Decide(pendingBySource(t, b, "agent").ID, Choice{Action: ResolveAllowPattern, Pattern: "x.example"})
			if err != nil {
				t.Fatal(err)
			}
			if o := outcome(t, agent); !o.Allowed || o.Rule == nil || o.Rule.ID != r.ID {
				t.Errorf("agent's outcome %+v, want allowed by x.example", o)
			}
			stillHeld(t, narrow, tt.member+"'s request")
			if got := b.List(); len(got) != 1 || got[0].Source != tt.member {
				t.Fatalf("pending %+v, want %s's approval only", got, tt.member)
			}
			// A rule naming the member does release it.
			mr, err := s.Add(AddRequest{Pattern: "x.example", List: Allowlist, Member: tt.member})
			if err != nil {
				t.Fatal(err)
			}
			b.ReleaseAllowed()
			if o := outcome(t, narrow); !o.Allowed || o.Rule == nil || o.Rule.ID != mr.ID {
				t.Errorf("%s's outcome %+v, want allowed by its member rule", tt.member, o)
			}
		})
	}
}

func TestBrokerReleaseAllowedDecidesTheRequest(t *testing.T) {
	b, s, _, _ := newTestBroker(t, time.Minute)
	public := ask(t, b, AskRequest{Source: "agent", Host: "x.example", Port: 443, Method: "GET", URL: "https://x.example/public/a"})
	private := ask(t, b, AskRequest{Source: "agent", Host: "x.example", Port: 443, Method: "GET", URL: "https://x.example/private/b"})
	conn := ask(t, b, AskRequest{Source: "agent", Host: "x.example", Port: 443})
	waitPending(t, b, 3, 3)
	r, err := s.Add(AddRequest{Pattern: "x.example/public/*", List: Allowlist})
	if err != nil {
		t.Fatal(err)
	}
	b.ReleaseAllowed()
	if o := outcome(t, public); !o.Allowed || o.Rule == nil || o.Rule.ID != r.ID {
		t.Errorf("/public/a outcome %+v, want allowed by x.example/public/*", o)
	}
	stillHeld(t, private, "/private/b")
	// The rule does not answer the connection-level question: its
	// requests must be seen one by one.
	stillHeld(t, conn, "the connection")
	if got := b.List(); len(got) != 2 {
		t.Errorf("pending %+v, want /private/b and the connection", got)
	}
}

func TestAskQuery(t *testing.T) {
	tests := []struct {
		name string
		req  AskRequest
		want Query
	}{
		{"connection", AskRequest{Source: "agent", Host: "x.example", Port: 443, URL: "x.example:443"}, Query{Source: "agent", Host: "x.example", Port: 443}},
		{"connection without URL", AskRequest{Host: "x.example", Port: 443}, Query{Host: "x.example", Port: 443}},
		{"IPv6 connection", AskRequest{Host: "2001:db8::1", Port: 443, URL: "2001:db8::1:443"}, Query{Host: "2001:db8::1", Port: 443}},
		{"request", AskRequest{Source: "mcp:fetch", Host: "x.example", Port: 443, Method: "GET", URL: "https://x.example/exfil?secret=1"}, Query{Source: "mcp:fetch", Host: "x.example", Port: 443, Method: "GET", Path: "/exfil?secret=1"}},
		{"request with a port", AskRequest{Host: "::1", Port: 8443, Method: "POST", URL: "https://[::1]:8443/a/b"}, Query{Host: "::1", Port: 8443, Method: "POST", Path: "/a/b"}},
		{"query without a path", AskRequest{Host: "x.example", Port: 80, URL: "http://x.example?q=1"}, Query{Host: "x.example", Port: 80, Path: "/?q=1"}},
		{"plain HTTP connection", AskRequest{Host: "x.example", Port: 80, URL: "http://x.example/index.html"}, Query{Host: "x.example", Port: 80, Path: "/index.html"}},
		{"method without a URL", AskRequest{Host: "x.example", Port: 443, Method: "GET"}, Query{Host: "x.example", Port: 443, Method: "GET"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := queryOf(tt.req)
			if diff := gocmp.Diff(tt.want, got); diff != "" {
				t.Errorf("queryOf(%+v) (-want +got):\n%s", tt.req, diff)
			}
			if got.IsRequest() != tt.req.isRequest() {
				t.Errorf("query is a request: %v, ask is a request: %v", got.IsRequest(), tt.req.isRequest())
			}
		})
	}
}

// TestBrokerBoundsHeldAsks: over a member's or the sandbox's bound, an ask
// is denied at once instead of held; others are still held.
func TestBrokerBoundsHeldAsks(t *testing.T) {
	b, _, _, _ := newTestBroker(t, time.Minute)
	b.cfg.MaxHeldPerMember, b.cfg.MaxHeldPerSandbox = 2, 3
	for i := range 2 {
		ask(t, b, AskRequest{Source: "agent", Host: fmt.Sprintf("h%d.test", i), Port: 443})
		waitPending(t, b, i+1, i+1)
	}
	over := ask(t, b, AskRequest{Source: "agent", Host: "h9.test", Port: 443})
	if o := outcome(t, over); o.Allowed || !strings.Contains(o.Reason, "too many held requests of this member (limit 2)") {
		t.Errorf("a member's third held ask: %+v, want denied at once", o)
	}
	ask(t, b, AskRequest{Source: "mcp:x", Host: "h3.test", Port: 443})
	waitPending(t, b, 3, 3)
	full := ask(t, b, AskRequest{Source: "mcp:y", Host: "h4.test", Port: 443})
	if o := outcome(t, full); o.Allowed || !strings.Contains(o.Reason, "in the sandbox (limit 3)") {
		t.Errorf("an ask over the sandbox's bound: %+v, want denied at once", o)
	}
}

// Requests that share an approval (same member, method and URL) may differ
// in their headers; allow once lets through the one whose headers the
// person was shown, and every other is shown with its own when it is asked
// about anew: after allow once, and when the shown one's member hangs up.
func TestBrokerShowsEachHeldRequestsOwnHeaders(t *testing.T) {
	req := func(n string) AskRequest {
		return AskRequest{Source: "agent", Host: "x.example", Port: 443, Method: "POST", URL: "https://x.example/upload",
			Headers: map[string][]string{"X-N": {n}}, Reason: "reason " + n}
	}
	shows := func(t *testing.T, p Pending, n string) {
		t.Helper()
		if got := p.Headers["X-N"]; len(got) != 1 || got[0] != n || p.Reason != "reason "+n {
			t.Fatalf("approval shows X-N %v, reason %q; want the held request's own, %s", got, p.Reason, n)
		}
	}

	t.Run("after allow once", func(t *testing.T) {
		b, _, _, _ := newTestBroker(t, time.Minute)
		first := ask(t, b, req("one"))
		waitPending(t, b, 1, 1)
		second := ask(t, b, req("two"))
		p := waitPending(t, b, 1, 2)[0]
		shows(t, p, "one")
		if _, err := b.Decide(p.ID, Choice{Action: ResolveAllowOnce}); err != nil {
			t.Fatal(err)
		}
		if o := outcome(t, first); !o.Allowed {
			t.Fatalf("the request shown: %+v", o)
		}
		q := waitPending(t, b, 1, 1)[0]
		shows(t, q, "two")
		stillHeld(t, second, "the request not shown yet")
		if _, err := b.Decide(q.ID, Choice{Action: ResolveAllowOnce}); err != nil {
			t.Fatal(err)
		}
		if o := outcome(t, second); !o.Allowed {
			t.Errorf("the second request, once shown and allowed: %+v", o)
		}
	})

	t.Run("when the shown request goes away", func(t *testing.T) {
		b, _, _, events := newTestBroker(t, time.Minute)
		ctx, cancel := context.WithCancel(context.Background())
		first := make(chan Outcome, 1)
		go func() { first <- b.Ask(ctx, req("benign")) }()
		p := waitPending(t, b, 1, 1)[0]
		second := ask(t, b, req("exfil"))
		waitPending(t, b, 1, 2)
		third := ask(t, b, req("three"))
		waitPending(t, b, 1, 3)
		cancel() // the member hangs up the request the person is shown
		if o := <-first; o.Allowed {
			t.Fatalf("hung up: %+v", o)
		}
		q := waitPending(t, b, 1, 2)[0]
		if q.ID == p.ID {
			t.Fatalf("the approval the person saw (%s) still stands for requests they did not see", p.ID)
		}
		shows(t, q, "exfil")
		// A decision made on what the person saw before finds nothing.
		if _, err := b.Decide(p.ID, Choice{Action: ResolveAllowOnce}); !errors.Is(err, ErrNoPending) {
			t.Errorf("allow once of the approval that is gone: %v, want ErrNoPending", err)
		}
		stillHeld(t, second, "a request never shown")
		stillHeld(t, third, "a request never shown")
		if !announced(events, p.ID, "gone") {
			t.Errorf("no decided event (gone) for %s: %+v", p.ID, *events)
		}
		if _, err := b.Decide(q.ID, Choice{Action: ResolveAllowOnce}); err != nil {
			t.Fatal(err)
		}
		if o := outcome(t, second); !o.Allowed {
			t.Errorf("the request shown now: %+v", o)
		}
		stillHeld(t, third, "a request never shown")
		shows(t, waitPending(t, b, 1, 1)[0], "three")
	})

	t.Run("a joiner going away changes nothing", func(t *testing.T) {
		b, _, _, _ := newTestBroker(t, time.Minute)
		first := ask(t, b, req("one"))
		waitPending(t, b, 1, 1)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan Outcome, 1)
		go func() { done <- b.Ask(ctx, req("two")) }()
		p := waitPending(t, b, 1, 2)[0]
		cancel()
		<-done
		if q := waitPending(t, b, 1, 1)[0]; q.ID != p.ID {
			t.Errorf("approval %s became %s when a request it did not show left", p.ID, q.ID)
		}
		if _, err := b.Decide(p.ID, Choice{Action: ResolveAllowOnce}); err != nil {
			t.Fatal(err)
		}
		if o := outcome(t, first); !o.Allowed {
			t.Errorf("the request shown: %+v", o)
		}
	})
}

// announced reports whether events hold a decided event with action for
// the approval id.
func announced(events *[]BrokerEvent, id, action string) bool {
	for _, e := range *events {
		if e.Kind == "decided" && e.Pending.ID == id && e.Action == action {
			return true
		}
	}
	return false
}

// An approval whose only held request hangs up is dropped and announced
// (decided, gone), so that the page and the journal close it.
func TestBrokerAnnouncesADroppedApproval(t *testing.T) {
	b, _, _, events := newTestBroker(t, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Outcome, 1)
	go func() { done <- b.Ask(ctx, AskRequest{Source: "agent", Host: "gone.test", Port: 443}) }()
	p := waitPending(t, b, 1, 1)[0]
	cancel()
	<-done
	waitPending(t, b, 0, 0)
	if !announced(events, p.ID, "gone") {
		t.Errorf("approval %s dropped with no decided event (gone): %+v", p.ID, *events)
	}
}

// Deny with a saved rule: the approval cannot end (time out) while the
// rule is written, so the rule is never saved for a decision refused; and
// a rule that cannot be saved leaves the approval pending as it was.
func TestBrokerPersistedDenyIsAllOrNothing(t *testing.T) {
	t.Run("the approval waits for the rule", func(t *testing.T) {
		b, s, path, events := newTestBroker(t, 300*time.Millisecond)
		// The policy file's lock is held (a member may hold it: the file
		// sits in its project) past the approval's timeout.
		lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer lock.Close()
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
			t.Fatal(err)
		}
		held := ask(t, b, AskRequest{Source: "agent", Host: "evil.test", Port: 443})
		p := waitPending(t, b, 1, 1)[0]
		done := make(chan error, 1)
		go func() {
			_, err := b.Decide(p.ID, Choice{Action: ResolveDeny, Persist: true})
			done <- err
		}()
		waitPending(t, b, 0, 0) // taken to be decided
		stillHeld(t, held, "the request being denied")
		time.Sleep(400 * time.Millisecond) // not a wait: past the approval's timeout
		syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		if err := <-done; err != nil {
			t.Fatalf("deny and save: %v", err)
		}
		o := outcome(t, held)
		if o.Allowed || o.Action != "deny" || o.Rule == nil {
			t.Errorf("outcome %+v, want denied by the saved rule", o)
		}
		if d := s.Decide(Query{Host: "evil.test", Port: 443}); d.Verdict != Deny || d.Rule == nil {
			t.Errorf("evil.test after the saved deny: %v", d)
		}
		if announced(events, p.ID, "timeout") {
			t.Errorf("the approval timed out while it was being decided")
		}
	})
	t.Run("a rule that cannot be saved", func(t *testing.T) {
		b, _, path, _ := newTestBroker(t, time.Minute)
		// An edit refuses a flow-style sandbox section.
		const flow = "sandbox: {unknown_action: ask}\n"
		if err := os.WriteFile(path, []byte(flow), 0o644); err != nil {
			t.Fatal(err)
		}
		held := ask(t, b, AskRequest{Source: "agent", Host: "evil.test", Port: 443})
		p := waitPending(t, b, 1, 1)[0]
		if _, err := b.Decide(p.ID, Choice{Action: ResolveDeny, Persist: true}); err == nil {
			t.Fatal("deny and save into a file the edit refuses: no error")
		}
		if q := waitPending(t, b, 1, 1)[0]; q.ID != p.ID || !q.Deadline.Equal(p.Deadline) {
			t.Errorf("after the failed save: %+v, want %s as it was", q, p.ID)
		}
		stillHeld(t, held, "the request whose deny could not be saved")
		if got := readFile(t, path); got != flow {
			t.Errorf("the file changed: %q", got)
		}
		if _, err := b.Decide(p.ID, Choice{Action: ResolveDeny}); err != nil {
			t.Fatal(err)
		}
		if o := outcome(t, held); o.Allowed {
			t.Errorf("denied: %+v", o)
		}
	})
}

// The member holds the policy file's .lock (it sits in its project) so that
// a persisted deny cannot be saved, and hangs up the request the approval
// shows while the rule is being written. The approval is not put back
// showing a request that went away: it ends "gone" and the others are
// asked anew, each shown with its own request (invariant 13).
func TestBrokerFailedSaveAfterTheShownRequestLeft(t *testing.T) {
	b, _, path, events := newTestBroker(t, time.Minute)
	holdPolicyLock(t, path)
	req := func(n string) AskRequest {
		return AskRequest{Source: "agent", Host: "x.example", Port: 443, Method: "POST", URL: "https://x.example/upload",
			Headers: map[string][]string{"X-N": {n}}, Reason: "reason " + n}
	}
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan Outcome, 1)
	go func() { first <- b.Ask(ctx, req("benign")) }()
	waitPending(t, b, 1, 1)
	second := ask(t, b, req("exfil"))
	p := waitPending(t, b, 1, 2)[0]
	done := make(chan error, 1)
	go func() {
		_, err := b.Decide(p.ID, Choice{Action: ResolveDeny, Persist: true})
		done <- err
	}()
	waitPending(t, b, 0, 0) // taken to be decided; the rule waits on the lock
	cancel()                // the member hangs up the request shown
	<-first
	if err := <-done; err == nil {
		t.Fatal("deny+persist with the lock held: no error")
	}
	q := waitPending(t, b, 1, 1)[0]
	if got := q.Headers["X-N"]; q.ID == p.ID || len(got) != 1 || got[0] != "exfil" {
		t.Errorf("after the failed save the approval is %s showing X-N %v (reason %q); want a new approval (the old one gone) showing the held request's own headers, exfil",
			q.ID, got, q.Reason)
	}
	// Shown now, it is what a pattern's yes once answers.
	if _, err := b.Decide(q.ID, Choice{Action: ResolveAllowPattern, Pattern: "unrelated.example"}); err != nil {
		t.Fatal(err)
	}
	if o := outcome(t, second); !o.Allowed {
		t.Errorf("the request shown, allowed by a pattern: %+v", o)
	}
	if !announced(events, p.ID, "gone") {
		t.Errorf("approval %s not announced as gone", p.ID)
	}
}

// After a failed save whose shown request left, allow once lets through the
// request the new approval shows, and is announced for it.
func TestBrokerFailedSaveThenAllowOnce(t *testing.T) {
	b, _, path, events := newTestBroker(t, time.Minute)
	holdPolicyLock(t, path)
	req := func(n string) AskRequest {
		return AskRequest{Source: "agent", Host: "x.example", Port: 443, Method: "POST", URL: "https://x.example/upload",
			Headers: map[string][]string{"X-N": {n}}}
	}
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan Outcome, 1)
	go func() { first <- b.Ask(ctx, req("benign")) }()
	waitPending(t, b, 1, 1)
	second := ask(t, b, req("exfil"))
	p := waitPending(t, b, 1, 2)[0]
	done := make(chan error, 1)
	go func() {
		_, err := b.Decide(p.ID, Choice{Action: ResolveDeny, Persist: true})
		done <- err
	}()
	waitPending(t, b, 0, 0)
	cancel()
	<-first
	<-done
	q := waitPending(t, b, 1, 1)[0]
	if got := q.Headers["X-N"]; q.ID == p.ID || len(got) != 1 || got[0] != "exfil" {
		t.Fatalf("after the failed save: %s showing %v", q.ID, got)
	}
	if _, err := b.Decide(q.ID, Choice{Action: ResolveAllowOnce}); err != nil {
		t.Fatal(err)
	}
	if o := outcome(t, second); !o.Allowed {
		t.Errorf("the request shown, allowed once: %+v", o)
	}
	if !announced(events, q.ID, "allow_once") || !announced(events, p.ID, "gone") {
		t.Errorf("events: %+v", *events)
	}
}

// allow_pattern with a pattern that does not cover the approval's own
// question (here a high-risk MCP member, for which a rule without a member
// does not speak) answers yes once to the request shown, and nothing else:
// not a request that joined it unseen, nor one asked after the person
// clicked while the rule waited on the lock the member holds. Those are
// asked about anew.
func TestBrokerAllowPatternLetsThroughOnlyWhatWasShown(t *testing.T) {
	s, path := openTestSandbox(t, "sandbox:\n  unknown_action: ask\n  mcp_servers:\n    - name: fetch\n")
	b, err := NewBroker(BrokerConfig{Sandbox: s, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	req := func(n string) AskRequest {
		return AskRequest{Source: "mcp:fetch", Host: "x.example", Port: 443, Method: "POST", URL: "https://x.example/upload",
			Headers: map[string][]string{"X-N": {n}}}
	}
	shown := ask(t, b, req("benign"))
	waitPending(t, b, 1, 1)
	unseen := ask(t, b, req("joined-unseen"))
	p := waitPending(t, b, 1, 2)[0]
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.Decide(p.ID, Choice{Action: ResolveAllowPattern, Pattern: "x.example", Persist: true})
		done <- err
	}()
	waitPending(t, b, 0, 0) // taken to be decided; the rule waits on the lock
	late := ask(t, b, req("exfil-after-the-click"))
	waitPending(t, b, 1, 1) // asked about in an approval of its own
	syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if o := outcome(t, shown); !o.Allowed {
		t.Fatalf("the request shown: %+v", o)
	}
	if d := s.Decide(queryOf(req("x"))); d.Verdict == Allow {
		t.Fatalf("the rules allow the member's request: %v", d)
	}
	stillHeld(t, late, "a request asked after the click")
	stillHeld(t, unseen, "a request that joined unseen")
	if q := waitPending(t, b, 1, 2)[0]; q.Headers["X-N"][0] != "exfil-after-the-click" {
		t.Errorf("pending after: %+v", q)
	}
}

// While a persisted deny's rule waits on the lock the member holds, the
// member asks the same question again, in an approval of its own; when the
// save fails, the first is not put back beside it: one question, one
// approval (design §5.2).
func TestBrokerFailedSaveKeepsOneApprovalPerQuestion(t *testing.T) {
	b, _, path, _ := newTestBroker(t, time.Minute)
	holdPolicyLock(t, path)
	req := AskRequest{Source: "agent", Host: "x.example", Port: 443, Method: "GET", URL: "https://x.example/a"}
	ask(t, b, req)
	p := waitPending(t, b, 1, 1)[0]
	done := make(chan error, 1)
	go func() {
		_, err := b.Decide(p.ID, Choice{Action: ResolveDeny, Persist: true})
		done <- err
	}()
	waitPending(t, b, 0, 0)
	ask(t, b, req) // the same question, while the rule is written
	waitPending(t, b, 1, 1)
	<-done
	if got := b.List(); len(got) != 1 {
		t.Errorf("%d approvals for one question after the failed save: %+v", len(got), got)
	}
}

// Decide reads an approval while members join and leave it (go test -race).
func TestBrokerDecideWhileMembersComeAndGo(t *testing.T) {
	b, _, _, _ := newTestBroker(t, time.Minute)
	req := AskRequest{Source: "agent", Host: "x.example", Port: 443}
	ask(t, b, req)
	p := waitPending(t, b, 1, 1)[0]
	stop := make(chan struct{})
	joined := make(chan struct{})
	go func() {
		defer close(joined)
		for i := 0; i < 200; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithCancel(context.Background())
			d := make(chan struct{})
			go func() { b.Ask(ctx, req); close(d) }()
			time.Sleep(time.Millisecond)
			cancel()
			<-d
		}
	}()
	for i := 0; i < 2000; i++ {
		// A wrong action: checked, refused, nothing decided.
		b.Decide(p.ID, Choice{Action: ResolveAllow})
	}
	close(stop)
	<-joined
}
