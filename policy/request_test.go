package policy

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
)

var testHost = HostResources{CPUs: 8, MemoryMB: 16384}

// newRequestBroker is a broker whose grants are recorded and answered by
// grant (nil: "exposed").
func newRequestBroker(t *testing.T, policyYAML string, grant func(Pending) (string, error)) (*Broker, *Sandbox, *[]Pending, *[]BrokerEvent) {
	t.Helper()
	s, _ := openTestSandbox(t, policyYAML)
	var mu sync.Mutex
	var grants []Pending
	var events []BrokerEvent
	if grant == nil {
		grant = func(Pending) (string, error) { return "exposed at 127.0.0.1:40123", nil }
	}
	b, err := NewBroker(BrokerConfig{Sandbox: s, Timeout: time.Minute, Host: testHost,
		Grant: func(p Pending) (string, error) {
			mu.Lock()
			grants = append(grants, p)
			mu.Unlock()
			return grant(p)
		},
		OnEvent: func(e BrokerEvent) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	return b, s, &grants, &events
}

func outcomeOf(t *testing.T, tk *Ticket) Outcome {
	t.Helper()
	select {
	case <-tk.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the request was not decided")
	}
	out, ok := tk.Outcome()
	if !ok {
		t.Fatal("Done closed, but no outcome")
	}
	return out
}

// A port request is one approval of kind port, with the member's name and
// reason, that takes allow or deny; allow carries the grant out before the
// member learns it, and the member learns what it did.
func TestBrokerPortRequest(t *testing.T) {
	b, _, grants, events := newRequestBroker(t, "", nil)
	tk, err := b.Request(AskRequest{Kind: AskPort, Source: "agent", Port: 8080, Reason: "preview the app"})
	if err != nil {
		t.Fatal(err)
	}
	if _, done := tk.Outcome(); done {
		t.Fatal("decided before anyone did")
	}
	list := b.List()
	if len(list) != 1 {
		t.Fatalf("pending = %+v", list)
	}
	p := list[0]
	want := Pending{ID: tk.ID(), Kind: AskPort, Source: "agent", Sources: []string{"agent"}, Port: 8080, Requested: true,
		Reason: "preview the app", Created: p.Created, Deadline: tk.Deadline(), Waiting: 1}
	if diff := gocmp.Diff(want, p); diff != "" {
		t.Errorf("pending (-want +got):\n%s", diff)
	}
	if got := p.Actions(); len(got) != 2 || got[0] != ResolveDeny || got[1] != ResolveAllow {
		t.Errorf("actions = %v, want deny, allow", got)
	}
	for _, c := range []Choice{{Action: ResolveAllowOnce}, {Action: ResolveAllowPattern, Pattern: "example.com"}, {Action: ResolveAllow, Persist: true}, {Action: ResolveDeny, Pattern: "x.test"}} {
		if _, err := b.Decide(p.ID, c); !errors.Is(err, ErrWrongAction) {
			t.Errorf("Decide(%+v) = %v, want ErrWrongAction", c, err)
		}
	}
	if len(*grants) != 0 || len(b.List()) != 1 {
		t.Fatalf("a refused action changed something: grants %v, pending %v", *grants, b.List())
	}
	if _, err := b.Decide(p.ID, Choice{Action: ResolveAllow}); err != nil {
		t.Fatal(err)
	}
	out := outcomeOf(t, tk)
	if !out.Allowed || out.Action != "allow" || out.Reason != "exposed at 127.0.0.1:40123" {
		t.Errorf("outcome = %+v", out)
	}
	if len(*grants) != 1 || (*grants)[0].Port != 8080 || (*grants)[0].Source != "agent" {
		t.Errorf("grants = %+v", *grants)
	}
	if len(b.List()) != 0 {
		t.Errorf("still pending: %+v", b.List())
	}
	if _, err := b.Decide(p.ID, Choice{Action: ResolveAllow}); !errors.Is(err, ErrNoPending) {
		t.Errorf("deciding twice: %v, want ErrNoPending", err)
	}
	if len(*grants) != 1 {
		t.Error("granted twice")
	}
	var actions []string
	for _, e := range *events {
		actions = append(actions, e.Kind+" "+e.Action+" "+string(e.Pending.Kind))
	}
	if diff := gocmp.Diff([]string{"opened  port", "decided allow port"}, actions); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// A grant that fails is the person's error and the member's answer: failed,
// with why.
func TestBrokerGrantFails(t *testing.T) {
	b, _, _, _ := newRequestBroker(t, "", func(Pending) (string, error) { return "", errors.New("port exposure not available") })
	tk, err := b.Request(AskRequest{Kind: AskPort, Source: "agent", Port: 8080, Reason: "preview"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Decide(tk.ID(), Choice{Action: ResolveAllow})
	if !errors.Is(err, ErrGrantFailed) || !strings.Contains(err.Error(), "port exposure not available") {
		t.Errorf("Decide = %v, want ErrGrantFailed saying why", err)
	}
	out := outcomeOf(t, tk)
	if out.Allowed || out.Action != "failed" || !strings.Contains(out.Reason, "port exposure not available") {
		t.Errorf("outcome = %+v", out)
	}
	// Denied: no grant.
	tk, _ = b.Request(AskRequest{Kind: AskPort, Source: "agent", Port: 3000, Reason: "preview"})
	if _, err := b.Decide(tk.ID(), Choice{Action: ResolveDeny}); err != nil {
		t.Fatal(err)
	}
	if out := outcomeOf(t, tk); out.Allowed || out.Action != "deny" {
		t.Errorf("outcome = %+v", out)
	}
}

// A member's network request asks about a URL ahead of its traffic: it
// takes allow_pattern (through the same path as held traffic: the rule is
// added and what it allows is released) or deny, never allow_once.
func TestBrokerNetworkRequest(t *testing.T) {
	b, s, grants, _ := newRequestBroker(t, "", nil)
	host, port, url, err := RequestedURL("https://API.Example.com/v1/items?x=1")
	if err != nil {
		t.Fatal(err)
	}
	tk, err := b.Request(AskRequest{Kind: AskNetwork, Source: "agent", Host: host, Port: port, URL: url, Reason: "fetch items"})
	if err != nil {
		t.Fatal(err)
	}
	// Held traffic of the member to the same host waits on its own
	// approval: a request never shares one with traffic.
	held := make(chan Outcome, 1)
	go func() {
		held <- b.Ask(context.Background(), AskRequest{Source: "agent", Host: "api.example.com", Port: 443})
	}()
	ps := waitPending(t, b, 2, 2)
	p := ps[0]
	if p.ID != tk.ID() || p.Kind != AskNetwork || !p.Requested || p.URL != "https://api.example.com/v1/items?x=1" || len(p.Suggestions) != 4 {
		t.Fatalf("pending = %+v", p)
	}
	if got := ps[1].Actions(); len(got) != 3 || ps[1].Requested || ps[1].Kind != AskNetwork {
		t.Errorf("held traffic: %+v, actions %v", ps[1], got)
	}
	for _, c := range []Choice{{Action: ResolveAllowOnce}, {Action: ResolveAllow}} {
		if _, err := b.Decide(p.ID, c); !errors.Is(err, ErrWrongAction) {
			t.Errorf("Decide(%v) = %v, want ErrWrongAction", c.Action, err)
		}
	}
	r, err := b.Decide(p.ID, Choice{Action: ResolveAllowPattern, Pattern: "api.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	out := outcomeOf(t, tk)
	if !out.Allowed || out.Action != "allow_pattern" || out.Rule != r {
		t.Errorf("outcome = %+v", out)
	}
	if d := s.Decide(Query{Source: "agent", Host: "api.example.com", Port: 443}); d.Verdict != Allow {
		t.Errorf("after approval: %v", d)
	}
	// The rule released the held connection too.
	select {
	case o := <-held:
		if !o.Allowed {
			t.Errorf("held connection: %+v", o)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the held connection was not released")
	}
	if len(*grants) != 0 {
		t.Errorf("a network request was granted: %+v", *grants)
	}
}

// A network request the rules decide already asks nobody: allowed at once,
// or refused.
func TestBrokerNetworkRequestDecidedByRules(t *testing.T) {
	b, _, _, events := newRequestBroker(t, "sandbox:\n  network_allowlist:\n    user:\n      - pattern: pypi.org\n  network_denylist:\n    - pattern: pastebin.com\n", nil)
	host, port, url, _ := RequestedURL("https://pypi.org/simple/")
	tk, err := b.Request(AskRequest{Kind: AskNetwork, Source: "agent", Host: host, Port: port, URL: url, Reason: "pip"})
	if err != nil {
		t.Fatal(err)
	}
	if out, done := tk.Outcome(); !done || !out.Allowed || out.Action != "allowed" || out.Rule == nil || out.Rule.Pattern.String() != "pypi.org" {
		t.Errorf("allowed by a rule: %+v %v", out, done)
	}
	host, port, url, _ = RequestedURL("https://pastebin.com/raw/x")
	if _, err := b.Request(AskRequest{Kind: AskNetwork, Source: "agent", Host: host, Port: port, URL: url, Reason: "paste"}); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "pastebin.com") {
		t.Errorf("denied by a rule: %v, want ErrRefused", err)
	}
	if len(b.List()) != 0 || len(*events) != 0 {
		t.Errorf("asked: %+v %+v", b.List(), *events)
	}
}

// A rule added meanwhile answers a member's network request it covers, and
// leaves port and resources requests alone.
func TestBrokerReleaseAnswersNetworkRequests(t *testing.T) {
	b, s, _, _ := newRequestBroker(t, "", nil)
	host, port, url, _ := RequestedURL("pypi.org")
	net, _ := b.Request(AskRequest{Kind: AskNetwork, Source: "agent", Host: host, Port: port, URL: url, Reason: "pip"})
	prt, _ := b.Request(AskRequest{Kind: AskPort, Source: "agent", Port: 8080, Reason: "preview"})
	if _, err := s.Add(AddRequest{Pattern: "pypi.org", List: Allowlist}); err != nil {
		t.Fatal(err)
	}
	b.ReleaseAllowed()
	if out := outcomeOf(t, net); !out.Allowed || out.Rule == nil {
		t.Errorf("network request: %+v", out)
	}
	if _, done := prt.Outcome(); done {
		t.Error("a port request was answered by a rule")
	}
}

// Resources requests are checked against the bounds before anyone is
// asked: beyond them nothing opens.
func TestBrokerResourcesBounds(t *testing.T) {
	b, _, grants, _ := newRequestBroker(t, "sandbox:\n  resources:\n    bounds:\n      pids: {min: 10, max: 100}\n", nil)
	tests := []struct {
		name  string
		req   AskRequest
		fails bool
	}{
		{name: "inside", req: AskRequest{MemoryMB: 2048, CPUs: 2}},
		{name: "all three", req: AskRequest{MemoryMB: 512, CPUs: 0.5, Pids: 100}},
		{name: "memory over the host's", req: AskRequest{MemoryMB: 16385}, fails: true},
		{name: "memory under the minimum", req: AskRequest{MemoryMB: 511}, fails: true},
		{name: "cpus over the host's", req: AskRequest{CPUs: 8.5}, fails: true},
		{name: "cpus under the minimum", req: AskRequest{CPUs: 0.25}, fails: true},
		{name: "pids over the file's", req: AskRequest{Pids: 101}, fails: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(b.List())
			tt.req.Kind, tt.req.Source, tt.req.Reason, tt.req.MemberID = AskResources, "agent", "build", "c0ffee"
			tk, err := b.Request(tt.req)
			if tt.fails {
				if !errors.Is(err, ErrBeyondBounds) {
					t.Fatalf("Request = %v, want ErrBeyondBounds", err)
				}
				if len(b.List()) != before {
					t.Errorf("a refused request opened an approval: %+v", b.List())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Decide(tk.ID(), Choice{Action: ResolveAllow}); err != nil {
				t.Fatal(err)
			}
			g := (*grants)[len(*grants)-1]
			if g.MemoryMB != tt.req.MemoryMB || g.CPUs != tt.req.CPUs || g.Pids != tt.req.Pids || g.MemberID != "c0ffee" {
				t.Errorf("granted %+v, want %+v", g, tt.req)
			}
		})
	}
}

// Two containers under one member name (replicas with one airlock.source
// label, or a container recreated under its name) ask for the same limits:
// each gets its own approval, and allowing one changes that container's
// limits, never the other's.
func TestBrokerRequestsOfOtherContainersDoNotShare(t *testing.T) {
	b, _, grants, _ := newRequestBroker(t, "", nil)
	first, err := b.Request(AskRequest{Kind: AskResources, Source: "worker", MemberID: "c1", MemoryMB: 2048, Reason: "build"})
	if err != nil {
		t.Fatal(err)
	}
	second, err := b.Request(AskRequest{Kind: AskResources, Source: "worker", MemberID: "c2", MemoryMB: 2048, Reason: "build"})
	if err != nil {
		t.Fatal(err)
	}
	if first.ID() == second.ID() {
		t.Fatalf("the second container's request joined the first's approval %s", first.ID())
	}
	if _, err := b.Decide(second.ID(), Choice{Action: ResolveAllow}); err != nil {
		t.Fatal(err)
	}
	if len(*grants) != 1 || (*grants)[0].MemberID != "c2" {
		t.Errorf("granted %+v, want the limits of c2, the container that asked", *grants)
	}
	if _, done := first.Outcome(); done {
		t.Error("allowing the second container's request decided the first's")
	}
}

// Each kind carries its own fields and no others.
func TestBrokerRequestFields(t *testing.T) {
	b, _, _, _ := newRequestBroker(t, "", nil)
	tests := []struct {
		name string
		req  AskRequest
		want string
	}{
		{name: "unknown kind", req: AskRequest{Kind: "disk"}, want: `unknown kind "disk"`},
		{name: "port without a port", req: AskRequest{Kind: AskPort}, want: "needs a port"},
		{name: "port with memory", req: AskRequest{Kind: AskPort, Port: 80, MemoryMB: 1024}, want: "belong to a resources request"},
		{name: "port with a url", req: AskRequest{Kind: AskPort, Port: 80, Host: "a.test", URL: "https://a.test/"}, want: "url belongs to a network request"},
		{name: "resources without values", req: AskRequest{Kind: AskResources}, want: "needs memory_mb, cpus or pids"},
		{name: "resources negative", req: AskRequest{Kind: AskResources, MemoryMB: -1}, want: "must be positive"},
		{name: "resources with a port", req: AskRequest{Kind: AskResources, MemoryMB: 1024, Port: 80}, want: "port belongs to a port request"},
		{name: "network without a url", req: AskRequest{Kind: AskNetwork}, want: "needs a url"},
		{name: "network with cpus", req: AskRequest{Kind: AskNetwork, Host: "a.test", Port: 443, URL: "https://a.test/", CPUs: 1}, want: "belong to a resources request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.Source = "agent"
			_, err := b.Request(tt.req)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Request = %v, want an error saying %q", err, tt.want)
			}
			if len(b.List()) != 0 {
				t.Errorf("opened %+v", b.List())
			}
		})
	}
}

// Equal requests of one member share an approval; other members, values
// or kinds do not; and the bound on held asks holds for requests too.
func TestBrokerRequestsShareAndAreBounded(t *testing.T) {
	s, _ := openTestSandbox(t, "")
	b, _ := NewBroker(BrokerConfig{Sandbox: s, Timeout: time.Minute, Host: testHost, MaxHeldPerMember: 3})
	a1, _ := b.Request(AskRequest{Kind: AskPort, Source: "agent", Port: 8080, Reason: "one"})
	a2, _ := b.Request(AskRequest{Kind: AskPort, Source: "agent", Port: 8080, Reason: "two"})
	o1, _ := b.Request(AskRequest{Kind: AskPort, Source: "other", Port: 8080, Reason: "one"})
	a3, _ := b.Request(AskRequest{Kind: AskPort, Source: "agent", Port: 8081, Reason: "one"})
	if a1.ID() != a2.ID() || a1.ID() == o1.ID() || a1.ID() == a3.ID() {
		t.Errorf("ids %s %s %s %s: want the first two shared, the others not", a1.ID(), a2.ID(), o1.ID(), a3.ID())
	}
	if _, err := b.Request(AskRequest{Kind: AskPort, Source: "agent", Port: 8082, Reason: "one"}); !errors.Is(err, ErrTooManyHeld) {
		t.Errorf("a fourth held ask of the member: %v, want ErrTooManyHeld", err)
	}
	if len(b.List()) != 3 {
		t.Errorf("pending = %d, want 3", len(b.List()))
	}
	if _, err := b.Decide(a1.ID(), Choice{Action: ResolveDeny}); err != nil {
		t.Fatal(err)
	}
	if o := outcomeOf(t, a2); o.Action != "deny" {
		t.Errorf("the joined request: %+v", o)
	}
}

// A request nobody decides times out like held traffic, and the member
// learns it.
func TestBrokerRequestTimesOut(t *testing.T) {
	s, _ := openTestSandbox(t, "")
	b, _ := NewBroker(BrokerConfig{Sandbox: s, Timeout: 50 * time.Millisecond})
	tk, err := b.Request(AskRequest{Kind: AskPort, Source: "agent", Port: 8080, Reason: "preview"})
	if err != nil {
		t.Fatal(err)
	}
	if out := outcomeOf(t, tk); out.Allowed || out.Action != "timeout" {
		t.Errorf("outcome = %+v", out)
	}
	if len(b.List()) != 0 {
		t.Errorf("pending after the timeout: %+v", b.List())
	}
}

func TestCleanReason(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{name: "plain", in: "preview the web app", want: "preview the web app"},
		{name: "line breaks and tabs", in: "line one\r\n\tline two\u2028three", want: "line one line two three"},
		{name: "terminal escape", in: "ok\x1b[2J\x1b]0;pwned\x07done", want: "ok [2J ]0;pwned done"},
		{name: "bidi and zero width", in: "abc\u202edef\u200bghi", want: "abc def ghi"},
		{name: "invalid UTF-8", in: "a\xffb", want: "a b"},
		{name: "leading and trailing space", in: "  \n hi \n ", want: "hi"},
		{name: "letters of any script", in: "Vorschau für 日本", want: "Vorschau für 日本"},
		{name: "cut at the bound", in: strings.Repeat("é", MaxReasonLen), want: strings.Repeat("é", MaxReasonLen/2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CleanReason(tt.in); got != tt.want {
				t.Errorf("CleanReason(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestRequestedURL(t *testing.T) {
	tests := []struct {
		in, host string
		port     uint16
		url      string
		err      string
	}{
		{in: "https://API.example.com/v1/x?y=1", host: "api.example.com", port: 443, url: "https://api.example.com/v1/x?y=1"},
		{in: "http://example.com:8080", host: "example.com", port: 8080, url: "http://example.com:8080/"},
		{in: "pypi.org", host: "pypi.org", port: 443, url: "https://pypi.org/"},
		{in: "https://203.0.113.7/", host: "203.0.113.7", port: 443, url: "https://203.0.113.7/"},
		{in: "https://user:pw@example.com/", err: "credentials"},
		{in: "https://example.com/#frag", err: "fragment"},
		{in: "ftp://example.com/", err: "not http or https"},
		{in: "https://example.com/a b", err: "space or control"},
		{in: "https://x.airlock.internal/", err: "airlock's own name"},
		{in: "http://AIRLOCK.internal/", err: "airlock's own name"},
		{in: "https://3405803783/", err: "not a host name"},
		{in: "https://example.com:0/", err: "bad port"},
		{in: "https://" + strings.Repeat("a", 2100) + ".com/", err: "longer than 2048"},
		// Unicode controls, bidi and line separators are as refused as
		// ASCII ones, wherever they stand (the query is not re-encoded).
		{in: "https://example.com/x?q=\u202egpj.exe", err: "space or control"},
		{in: "https://example.com/?a=\u0085b", err: "space or control"},
		{in: "https://example.com/?a=\u2028b", err: "space or control"},
		{in: "https://example.com/?a=\u200bb", err: "space or control"},
		{in: "https://example.com/?a=\u00a0b", err: "space or control"},
		{in: "https://example.com/?a=\xffb", err: "space or control"},
		{in: "https://example.com/?q=caf\u00e9", host: "example.com", port: 443, url: "https://example.com/?q=caf\u00e9"},
	}
	for _, tt := range tests {
		t.Run(tt.in[:min(len(tt.in), 40)], func(t *testing.T) {
			host, port, url, err := RequestedURL(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("RequestedURL(%q) = %v, want an error saying %q", tt.in, err, tt.err)
				}
				return
			}
			if err != nil || host != tt.host || port != tt.port || url != tt.url {
				t.Errorf("RequestedURL(%q) = %q %d %q %v, want %q %d %q", tt.in, host, port, url, err, tt.host, tt.port, tt.url)
			}
		})
	}
}

func TestBoundsCheck(t *testing.T) {
	b := DefaultBounds()
	tests := []struct {
		name     string
		mem      int
		cpus     float64
		pids     int
		host     HostResources
		wantText string // "" means within
	}{
		{name: "nothing asked", host: testHost},
		{name: "host's memory exactly", mem: 16384, host: testHost},
		{name: "over the host's memory", mem: 16385, host: testHost, wantText: "memory_mb 16385 is outside 512 to host (512 to 16384 here)"},
		{name: "pids default max", pids: 1000, host: testHost},
		{name: "pids over", pids: 1001, host: testHost, wantText: "pids 1001 is outside 10 to 1000"},
		{name: "host unknown", cpus: 1, host: HostResources{}, wantText: "could not read"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := b.Check(tt.mem, tt.cpus, tt.pids, tt.host)
			switch {
			case tt.wantText == "" && err != nil:
				t.Errorf("Check = %v, want nil", err)
			case tt.wantText != "" && (!errors.Is(err, ErrBeyondBounds) || !strings.Contains(err.Error(), tt.wantText)):
				t.Errorf("Check = %v, want ErrBeyondBounds saying %q", err, tt.wantText)
			}
		})
	}
}
