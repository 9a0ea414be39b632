package dnsgate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/dnsgate/dnsgatetest"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
	"github.com/airlockhq/airlock/policy"
)

type world struct {
	gate     *Gate
	addr     string
	upstream *dnsgatetest.Server
	pool     *Pool

	mu     sync.Mutex
	events []Event
}

func (w *world) Events() []Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Event(nil), w.events...)
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// newWorld starts a fake upstream and a gate in front of it, with rules
// (patterns; "deny " prefix for the denylist) and unknown_action ask.
func newWorld(t *testing.T, guard GuardConfig, rules ...string) *world {
	t.Helper()
	return newWorldWith(t, guard, nil, rules...)
}

// newWorldWith is newWorld with tune applied to the gate's config before
// the gate starts.
func newWorldWith(t *testing.T, guard GuardConfig, tune func(*Config), rules ...string) *world {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	up := &dnsgatetest.Server{
		A:   map[string]string{"allowed.test": "203.0.113.10", "api.example.com": "203.0.113.11"},
		TXT: map[string]string{"allowed.test": "v=allowed", "unknown.test": "v=secret"},
	}
	upAddr, err := up.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.Close)
	var rs []*policy.Rule
	for _, s := range rules {
		l := policy.Allowlist
		if p, ok := strings.CutPrefix(s, "deny "); ok {
			l, s = policy.Denylist, p
		}
		rs = append(rs, policy.NewRule(l, policy.User, policy.MustParse(s), "", "test", time.Time{}))
	}
	pool, err := NewPool(DefaultPool)
	if err != nil {
		t.Fatal(err)
	}
	upstream, err := NewUpstream([]string{upAddr}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGuard(guard, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{upstream: up, pool: pool}
	cfg := Config{
		Sandbox:  "test",
		Listen:   netip.MustParseAddrPort("127.0.0.1:0"),
		Policy:   policy.NewRuleset(policy.ActionAsk, rs),
		Pool:     pool,
		Upstream: upstream,
		Guard:    g,
		Members: func(a netip.Addr) string {
			if a == netip.MustParseAddr("127.0.0.1") {
				return "agent"
			}
			return ""
		},
		OnEvent: func(e Event) { w.mu.Lock(); w.events = append(w.events, e); w.mu.Unlock() },
		Logger:  testLogger(t),
	}
	if tune != nil {
		tune(&cfg)
	}
	gate, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := gate.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gate.Close() })
	w.gate, w.addr = gate, gate.Addr().String()
	return w
}

func (w *world) query(t *testing.T, netw, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.SetEdns0(1232, false)
	c := &dns.Client{Net: netw, Timeout: 2 * time.Second}
	r, _, err := c.Exchange(m, w.addr)
	if err != nil {
		t.Fatalf("query %s %s over %s: %v", name, dns.Type(qtype), netw, err)
	}
	return r
}

func ede(r *dns.Msg) (uint16, bool) {
	if opt := r.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok {
				return e.InfoCode, true
			}
		}
	}
	return 0, false
}

func TestGateAnswers(t *testing.T) {
	w := newWorld(t, GuardConfig{}, "allowed.test", "*.example.com", "deny pastebin.com")
	tests := []struct {
		name      string
		netw      string
		qname     string
		qtype     uint16
		rcode     int
		fake      bool   // answer is an A record from the fake pool
		txt       string // expected TXT answer
		blocked   bool   // carries EDE Blocked
		upstream  bool   // the upstream must have seen the name
		noAnswers bool
	}{
		{name: "allowed A is fake", netw: "udp", qname: "allowed.test.", qtype: dns.TypeA, rcode: dns.RcodeSuccess, fake: true},
		{name: "unknown A is fake", netw: "udp", qname: "unknown.test.", qtype: dns.TypeA, rcode: dns.RcodeSuccess, fake: true},
		{name: "unknown A over TCP", netw: "tcp", qname: "tcp-unknown.test.", qtype: dns.TypeA, rcode: dns.RcodeSuccess, fake: true},
		{name: "AAAA no data", netw: "udp", qname: "allowed.test.", qtype: dns.TypeAAAA, rcode: dns.RcodeSuccess, noAnswers: true},
		{name: "HTTPS no data", netw: "udp", qname: "allowed.test.", qtype: dns.TypeHTTPS, rcode: dns.RcodeSuccess, noAnswers: true},
		{name: "SVCB no data", netw: "udp", qname: "allowed.test.", qtype: dns.TypeSVCB, rcode: dns.RcodeSuccess, noAnswers: true},
		{name: "TXT allowed forwarded", netw: "udp", qname: "allowed.test.", qtype: dns.TypeTXT, rcode: dns.RcodeSuccess, txt: "v=allowed", upstream: true},
		{name: "TXT allowed over TCP", netw: "tcp", qname: "allowed.test.", qtype: dns.TypeTXT, rcode: dns.RcodeSuccess, txt: "v=allowed", upstream: true},
		{name: "TXT unknown refused", netw: "udp", qname: "unknown.test.", qtype: dns.TypeTXT, rcode: dns.RcodeRefused, blocked: true},
		{name: "MX unknown refused", netw: "udp", qname: "unknown.test.", qtype: dns.TypeMX, rcode: dns.RcodeRefused, blocked: true},
		{name: "NULL refused", netw: "udp", qname: "allowed.test.", qtype: dns.TypeNULL, rcode: dns.RcodeRefused, blocked: true},
		{name: "ANY refused", netw: "udp", qname: "allowed.test.", qtype: dns.TypeANY, rcode: dns.RcodeRefused, blocked: true},
		{name: "AXFR refused", netw: "tcp", qname: "allowed.test.", qtype: dns.TypeAXFR, rcode: dns.RcodeRefused, blocked: true},
		{name: "IXFR refused", netw: "udp", qname: "allowed.test.", qtype: dns.TypeIXFR, rcode: dns.RcodeRefused, blocked: true},
		{name: "denied NXDOMAIN", netw: "udp", qname: "pastebin.com.", qtype: dns.TypeA, rcode: dns.RcodeNameError, blocked: true},
		{name: "denied TXT NXDOMAIN", netw: "udp", qname: "pastebin.com.", qtype: dns.TypeTXT, rcode: dns.RcodeNameError, blocked: true},
		{name: "denied mixed case", netw: "udp", qname: "PasteBin.COM.", qtype: dns.TypeA, rcode: dns.RcodeNameError, blocked: true},
		{name: "reverse of a real IP refused", netw: "udp", qname: "10.113.0.203.in-addr.arpa.", qtype: dns.TypePTR, rcode: dns.RcodeRefused, blocked: true},
		{name: "numeric name refused", netw: "udp", qname: "3405803783.", qtype: dns.TypeA, rcode: dns.RcodeRefused, blocked: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(w.upstream.Queries())
			r := w.query(t, tt.netw, tt.qname, tt.qtype)
			if r.Rcode != tt.rcode {
				t.Fatalf("rcode = %s, want %s", dns.RcodeToString[r.Rcode], dns.RcodeToString[tt.rcode])
			}
			if tt.fake {
				if len(r.Answer) != 1 {
					t.Fatalf("answers = %v, want one A", r.Answer)
				}
				a, _ := netip.AddrFromSlice(r.Answer[0].(*dns.A).A.To4())
				if !DefaultPool.Contains(a) {
					t.Errorf("A = %s, want an address in %s", a, DefaultPool)
				}
			}
			if tt.txt != "" {
				if len(r.Answer) != 1 || r.Answer[0].(*dns.TXT).Txt[0] != tt.txt {
					t.Errorf("answers = %v, want TXT %q", r.Answer, tt.txt)
				}
			}
			if tt.noAnswers && len(r.Answer) != 0 {
				t.Errorf("answers = %v, want none", r.Answer)
			}
			if code, ok := ede(r); tt.blocked && (!ok || code != dns.ExtendedErrorCodeBlocked) {
				t.Errorf("EDE = %d (%v), want Blocked (15)", code, ok)
			}
			if got := len(w.upstream.Queries()) > before; got != tt.upstream {
				t.Errorf("query reached the upstream = %v, want %v (queries %v)", got, tt.upstream, w.upstream.Queries())
			}
		})
	}
	// No name that no rule allows ever reached the upstream.
	for _, q := range w.upstream.Queries() {
		if q.Name != "allowed.test" {
			t.Errorf("upstream received %v; only allowed.test is allowlisted", q)
		}
	}
}

// TestGateLearnModeForwardsNothing: learn mode lets connections through,
// but a name no rule allows still never reaches the upstream (design §8,
// invariant 2): A gets a fake address, TXT is refused.
func TestGateLearnModeForwardsNothing(t *testing.T) {
	w := newWorldWith(t, GuardConfig{}, func(c *Config) {
		c.Policy = policy.NewRuleset(policy.ActionLearn).Learning(time.Now().Add(time.Hour), nil)
	})
	if r := w.query(t, "udp", "unknown.test.", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("A while learning: %v", r)
	}
	if r := w.query(t, "udp", "unknown.test.", dns.TypeTXT); r.Rcode != dns.RcodeRefused {
		t.Errorf("TXT while learning: %s", dns.RcodeToString[r.Rcode])
	}
	if q := w.upstream.Queries(); len(q) != 0 {
		t.Errorf("the upstream saw %v while learning", q)
	}
}

func TestGateFakeIPsStableAndReversible(t *testing.T) {
	w := newWorld(t, GuardConfig{})
	a1 := w.query(t, "udp", "one.test.", dns.TypeA).Answer[0].(*dns.A).A.String()
	a2 := w.query(t, "udp", "ONE.test.", dns.TypeA).Answer[0].(*dns.A).A.String()
	b := w.query(t, "udp", "two.test.", dns.TypeA).Answer[0].(*dns.A).A.String()
	if a1 != a2 {
		t.Errorf("one.test got %s then %s; want one stable address (case ignored)", a1, a2)
	}
	if a1 == b {
		t.Errorf("one.test and two.test share %s", a1)
	}
	rev, _ := dns.ReverseAddr(a1)
	r := w.query(t, "udp", rev, dns.TypePTR)
	if len(r.Answer) != 1 || r.Answer[0].(*dns.PTR).Ptr != "one.test." {
		t.Errorf("PTR %s = %v, want one.test.", rev, r.Answer)
	}
	if name, ok := w.pool.Name(netip.MustParseAddr(a1)); !ok || name != "one.test" {
		t.Errorf("pool maps %s to %q, %v; want one.test", a1, name, ok)
	}
	if len(w.upstream.Queries()) != 0 {
		t.Errorf("upstream saw %v; A and PTR must never be forwarded", w.upstream.Queries())
	}
}

func TestGateEvents(t *testing.T) {
	w := newWorld(t, GuardConfig{}, "deny pastebin.com")
	w.query(t, "udp", "pastebin.com.", dns.TypeA)
	w.query(t, "udp", "Unknown.Test.", dns.TypeTXT)
	ev := w.Events()
	if len(ev) != 2 {
		t.Fatalf("events = %+v, want 2", ev)
	}
	want := []struct{ source, name, typ, verdict, rule string }{
		{"agent", "pastebin.com", "A", VerdictDenied, "pastebin.com"},
		{"agent", "unknown.test", "TXT", VerdictRefused, ""},
	}
	for i, e := range ev {
		got := struct{ source, name, typ, verdict, rule string }{e.Source, e.Name, e.Type, e.Verdict, e.Rule}
		if got != want[i] || e.Sandbox != "test" {
			t.Errorf("event %d = %+v (sandbox %q), want %+v", i, got, e.Sandbox, want[i])
		}
	}
}

func TestGateExfiltrationCap(t *testing.T) {
	const limit = 10
	w := newWorld(t, GuardConfig{MaxSubdomains: limit}, "*.example.com")
	r := rand.New(rand.NewPCG(7, 7))
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	for i := 0; i < 200; i++ {
		b := make([]byte, 40)
		for j := range b {
			b[j] = alphabet[r.IntN(len(alphabet))]
		}
		w.query(t, "udp", string(b)+".example.com.", dns.TypeTXT)
	}
	seen := 0
	for _, q := range w.upstream.Queries() {
		if strings.HasSuffix(q.Name, ".example.com") {
			seen++
		}
	}
	if seen > limit {
		t.Errorf("upstream saw %d random subdomains of example.com; cap is %d", seen, limit)
	}
	trips := 0
	for _, e := range w.Events() {
		if e.Trip != nil {
			trips++
		}
	}
	if trips == 0 {
		t.Error("no exfiltration trip event")
	}
}

// TestGateGuardUnderWildcardPublicSuffixes: under a (forced) rule
// *.kawasaki.jp, where the public suffix list makes every x.kawasaki.jp a
// public suffix and so every name one label under it its own registrable
// domain, the guard checks labels and caps names as under *.example.com.
func TestGateGuardUnderWildcardPublicSuffixes(t *testing.T) {
	const limit = 5
	w := newWorld(t, GuardConfig{MaxSubdomains: limit}, "*.kawasaki.jp", "*.example.com")
	hex := strings.Repeat("deadbeef", 7) + "0123456" // 63 bytes, hex-looking
	for _, name := range []string{hex + ".x.example.com.", hex + ".x.kawasaki.jp.", hex + ".kawasaki.jp."} {
		if r := w.query(t, "udp", name, dns.TypeTXT); r.Rcode != dns.RcodeRefused {
			t.Errorf("%s: %s, want REFUSED by the guard", name, dns.RcodeToString[r.Rcode])
		}
	}
	// Plain names, each under another x.kawasaki.jp: one cap for all.
	for i := range 20 {
		w.query(t, "udp", fmt.Sprintf("host.x%d.kawasaki.jp.", i), dns.TypeTXT)
	}
	n := 0
	for _, q := range w.upstream.Queries() {
		if strings.HasSuffix(q.Name, "kawasaki.jp") {
			n++
		}
	}
	if n > limit {
		t.Errorf("%d names under kawasaki.jp reached the upstream; the cap is %d", n, limit)
	}
}

func TestGateSubdomainCapWithPlainNames(t *testing.T) {
	// Plain, low-entropy names pass the label checks; the distinct-name cap
	// stops them.
	const limit = 5
	w := newWorld(t, GuardConfig{MaxSubdomains: limit}, "*.example.com")
	for i := 0; i < 20; i++ {
		w.query(t, "udp", fmt.Sprintf("host%d.example.com.", i), dns.TypeTXT)
	}
	if n := len(w.upstream.Queries()); n != limit {
		t.Errorf("upstream saw %d names, want exactly the cap %d", n, limit)
	}
	// A name resolved before the trip keeps working.
	w.query(t, "udp", "host0.example.com.", dns.TypeTXT)
	if n := len(w.upstream.Queries()); n != limit+1 {
		t.Errorf("upstream saw %d queries after re-asking a known name, want %d", n, limit+1)
	}
}

func TestGateMalformedPackets(t *testing.T) {
	w := newWorld(t, GuardConfig{}, "allowed.test")
	conn, err := net.Dial("udp", w.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := rand.New(rand.NewPCG(1, 1))
	valid, _ := (&dns.Msg{Question: []dns.Question{{Name: "allowed.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET}}}).Pack()
	for i := 0; i < 2000; i++ {
		var b []byte
		switch i % 3 {
		case 0: // random bytes
			b = make([]byte, r.IntN(600))
			for j := range b {
				b[j] = byte(r.UintN(256))
			}
		case 1: // a valid query with bytes flipped
			b = append([]byte(nil), valid...)
			b[r.IntN(len(b))] ^= byte(1 + r.UintN(255))
		default: // truncated
			b = valid[:r.IntN(len(valid))]
		}
		conn.Write(b)
	}
	// Still serving. The storm may have filled the socket's receive buffer,
	// so ask as a resolver would: retry a few times.
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	c := &dns.Client{Net: "udp", Timeout: time.Second}
	var a *dns.Msg
	for i := 0; i < 10 && a == nil; i++ {
		a, _, _ = c.Exchange(m, w.addr)
	}
	if a == nil || a.Rcode != dns.RcodeSuccess || len(a.Answer) != 1 {
		t.Fatalf("after the storm the gate does not answer: %v", a)
	}
	for _, q := range w.upstream.Queries() {
		if q.Name != "allowed.test" {
			t.Errorf("a malformed packet reached the upstream as %v", q)
		}
	}
}

func TestGateRefusesOutsiders(t *testing.T) {
	w := newWorldWith(t, GuardConfig{}, func(c *Config) { c.Clients = netip.MustParsePrefix("10.88.0.0/24") }, "allowed.test")
	r := w.query(t, "udp", "allowed.test.", dns.TypeA)
	if r.Rcode != dns.RcodeRefused {
		t.Errorf("query from outside the sandbox subnet: rcode %s, want REFUSED", dns.RcodeToString[r.Rcode])
	}
}

func TestGatePortTakenNamesTheProcess(t *testing.T) {
	w := newWorld(t, GuardConfig{})
	g, err := New(Config{Sandbox: "x", Listen: w.gate.Addr(), Policy: policy.NewRuleset(policy.ActionAsk),
		Pool: w.pool, Upstream: w.gate.cfg.Upstream, Guard: w.gate.cfg.Guard})
	if err != nil {
		t.Fatal(err)
	}
	err = g.Start()
	if err == nil {
		g.Close()
		t.Fatal("second gate on the same port started")
	}
	if !strings.Contains(err.Error(), "is taken by") || !strings.Contains(err.Error(), "pid") {
		t.Errorf("error %q does not name the process holding the port", err)
	}
}

func FuzzGateAnswer(f *testing.F) {
	for _, q := range []struct {
		n string
		t uint16
	}{{"allowed.test.", dns.TypeA}, {"x.example.com.", dns.TypeTXT}, {"1.0.18.198.in-addr.arpa.", dns.TypePTR}, {"pastebin.com.", dns.TypeAAAA}} {
		m := new(dns.Msg)
		m.SetQuestion(q.n, q.t)
		m.SetEdns0(1232, false)
		b, _ := m.Pack()
		f.Add(b)
	}
	pool, _ := NewPool(DefaultPool)
	guard, _ := NewGuard(GuardConfig{}, nil)
	rs := policy.NewRuleset(policy.ActionAsk, []*policy.Rule{
		policy.NewRule(policy.Allowlist, policy.User, policy.MustParse("*.example.com"), "", "", time.Time{}),
		policy.NewRule(policy.Denylist, policy.User, policy.MustParse("pastebin.com"), "", "", time.Time{}),
	})
	g, _ := New(Config{Sandbox: "fuzz", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Policy: rs, Pool: pool,
		Upstream: refusingUpstream{}, Guard: guard, Logger: slog.New(slog.DiscardHandler)})
	f.Fuzz(func(t *testing.T, b []byte) {
		req := new(dns.Msg)
		if err := req.Unpack(b); err != nil {
			return // the server drops or FORMERRs what does not unpack
		}
		resp := g.answer(req, netip.MustParseAddr("127.0.0.1"))
		if resp == nil {
			return
		}
		if _, err := resp.Pack(); err != nil {
			t.Fatalf("reply does not pack: %v", err)
		}
		if resp.Id != req.Id {
			t.Fatalf("reply id %d for query %d", resp.Id, req.Id)
		}
	})
}

// refusingUpstream fails every exchange, and panics (failing the fuzz run)
// when asked about a name the fuzz policy does not allow.
type refusingUpstream struct{}

func (refusingUpstream) Exchange(_ context.Context, m *dns.Msg) (*dns.Msg, error) {
	if n := m.Question[0].Name; !strings.HasSuffix(n, ".example.com.") {
		panic("forwarded a name no rule allows: " + n)
	}
	return nil, errors.New("no upstream in fuzzing")
}

func TestGateLogAllowed(t *testing.T) {
	for _, tt := range []struct {
		name       string
		logAllowed bool
		verdict    string
		want       string
	}{
		{"answered, quiet", false, VerdictFake, ""},
		{"answered, log_allowed", true, VerdictFake, "level=INFO msg=dns"},
		{"refused, quiet", false, VerdictRefused, "level=INFO msg=dns"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			g := &Gate{cfg: Config{LogAllowed: tt.logAllowed}, log: slog.New(slog.NewTextHandler(&b, nil))}
			g.emit(Event{Name: "allowed.test", Type: "A", Verdict: tt.verdict})
			if got := b.String(); (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Errorf("log %q, want %q", got, tt.want)
			}
		})
	}
}

// TestGateInternalName: airlock.internal, in any case, with or without the
// trailing dot, is answered with the gateway whatever the policy says
// (here: deny everything, and a deny rule for the name itself); AAAA and
// other types have no data; nothing under it exists; none of it reaches
// the upstream or takes a fake IP.
func TestGateInternalName(t *testing.T) {
	gw := netip.MustParseAddr("10.88.0.1")
	w := newWorldWith(t, GuardConfig{}, func(c *Config) {
		c.Internal = gw
		c.Policy = policy.NewRuleset(policy.ActionDeny, []*policy.Rule{
			policy.NewRule(policy.Denylist, policy.User, policy.MustParse("*.internal"), "", "test", time.Time{}),
			policy.NewRule(policy.Denylist, policy.User, policy.MustParse("airlock.internal"), "", "test", time.Time{}),
		})
	})
	tests := []struct {
		name   string
		netw   string
		qname  string
		qtype  uint16
		rcode  int
		answer string // the A record's address; "" for no data
	}{
		{name: "A", netw: "udp", qname: "airlock.internal.", qtype: dns.TypeA, rcode: dns.RcodeSuccess, answer: "10.88.0.1"},
		{name: "A over TCP", netw: "tcp", qname: "airlock.internal.", qtype: dns.TypeA, rcode: dns.RcodeSuccess, answer: "10.88.0.1"},
		{name: "mixed case", netw: "udp", qname: "AirLock.INTERNAL.", qtype: dns.TypeA, rcode: dns.RcodeSuccess, answer: "10.88.0.1"},
		{name: "AAAA no data", netw: "udp", qname: "airlock.internal.", qtype: dns.TypeAAAA, rcode: dns.RcodeSuccess},
		{name: "TXT no data", netw: "udp", qname: "airlock.internal.", qtype: dns.TypeTXT, rcode: dns.RcodeSuccess},
		{name: "under it", netw: "udp", qname: "x.airlock.internal.", qtype: dns.TypeA, rcode: dns.RcodeNameError},
		{name: "deep under it", netw: "udp", qname: "a.b.AIRLOCK.internal.", qtype: dns.TypeTXT, rcode: dns.RcodeNameError},
		{name: "a name ending like it", netw: "udp", qname: "xairlock.internal.", qtype: dns.TypeA, rcode: dns.RcodeNameError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := w.query(t, tt.netw, tt.qname, tt.qtype)
			if r.Rcode != tt.rcode {
				t.Fatalf("rcode = %s, want %s", dns.RcodeToString[r.Rcode], dns.RcodeToString[tt.rcode])
			}
			var got string
			for _, rr := range r.Answer {
				a, ok := rr.(*dns.A)
				if !ok {
					t.Fatalf("answer %v, want only A records", rr)
				}
				got = a.A.String()
			}
			if len(r.Answer) > 1 || got != tt.answer {
				t.Errorf("answers = %v, want %q", r.Answer, tt.answer)
			}
		})
	}
	if q := w.upstream.Queries(); len(q) != 0 {
		t.Errorf("the upstream saw %v", q)
	}
	if n := w.pool.Len(); n != 0 {
		t.Errorf("%d names took a fake IP, want none", n)
	}
	var internal int
	for _, e := range w.Events() {
		if e.Verdict == VerdictInternal {
			internal++
		}
	}
	if internal != 5 {
		t.Errorf("%d events with verdict internal, want 5: %+v", internal, w.Events())
	}
}

// heldUpstream answers nothing until released (or its context ends), and
// counts the queries it holds.
type heldUpstream struct {
	release chan struct{}
	mu      sync.Mutex
	held    int
}

func (u *heldUpstream) Held() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.held
}

func (u *heldUpstream) Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	u.mu.Lock()
	u.held++
	u.mu.Unlock()
	defer func() { u.mu.Lock(); u.held--; u.mu.Unlock() }()
	select {
	case <-u.release:
		r := new(dns.Msg)
		r.SetReply(m)
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestGateBoundsForwarded: however many queries for an allowed name a
// member sends while the upstream is slow, the gate forwards at most
// MaxForwarded at once (each holds a socket) and answers the others
// SERVFAIL at once; once the upstream answers, forwarding goes on.
func TestGateBoundsForwarded(t *testing.T) {
	up := &heldUpstream{release: make(chan struct{})}
	w := newWorldWith(t, GuardConfig{}, func(c *Config) {
		c.Upstream, c.MaxForwarded, c.UpstreamTimeout = up, 4, 10*time.Second
	}, "allowed.test")
	for _, netw := range []string{"udp", "tcp"} {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				m := new(dns.Msg)
				m.SetQuestion("allowed.test.", dns.TypeTXT)
				c := &dns.Client{Net: netw, Timeout: 8 * time.Second}
				if r, _, err := c.Exchange(m, w.addr); err != nil || r.Rcode != dns.RcodeSuccess {
					t.Errorf("a query forwarded over %s: %v %v", netw, r, err)
				}
			})
		}
		deadline := time.Now().Add(5 * time.Second)
		for up.Held() < 4 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if n := up.Held(); n != 4 {
			t.Fatalf("upstream holds %d queries, want 4", n)
		}
		start := time.Now()
		for _, n := range []string{"udp", "tcp"} {
			if r := w.query(t, n, "allowed.test.", dns.TypeMX); r.Rcode != dns.RcodeServerFailure {
				t.Errorf("a fifth query over %s: rcode %s, want SERVFAIL", n, dns.RcodeToString[r.Rcode])
			}
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("the queries past the bound took %v to answer", d)
		}
		if n := up.Held(); n != 4 {
			t.Errorf("upstream holds %d queries, want 4", n)
		}
		for range 4 {
			up.release <- struct{}{}
		}
		wg.Wait()
	}
	var refused int
	for _, e := range w.Events() {
		if e.Verdict == VerdictError && strings.Contains(e.Reason, "being forwarded already") {
			refused++
		}
	}
	if refused != 4 {
		t.Errorf("%d events say the bound was reached, want 4", refused)
	}
}

// TestGateBoundsTCPConnections: a client holds at most
// maxTCPConnsPerClient DNS connections open at once; one more is closed
// at once, unanswered, and the gate takes new ones again as it closes
// the ones it holds.
func TestGateBoundsTCPConnections(t *testing.T) {
	w := newWorld(t, GuardConfig{}, "allowed.test")
	ask := func(c *dns.Conn) error {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		m := new(dns.Msg)
		m.SetQuestion("allowed.test.", dns.TypeA)
		if err := c.WriteMsg(m); err != nil {
			return err
		}
		r, err := c.ReadMsg()
		if err == nil && r.Rcode != dns.RcodeSuccess {
			err = fmt.Errorf("rcode %s", dns.RcodeToString[r.Rcode])
		}
		return err
	}
	var held []*dns.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range maxTCPConnsPerClient {
		c, err := dns.Dial("tcp", w.addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		if err := ask(c); err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
	}
	c, err := dns.Dial("tcp", w.addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := ask(c); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("connection %d past the bound: %v, want it closed at once", maxTCPConnsPerClient+1, err)
	}
	c.Close()
	held[0].Close()
	held = held[1:]
	if !testenv.Poll(2*time.Second, func() bool {
		c, err := dns.Dial("tcp", w.addr)
		if err != nil {
			return false
		}
		defer c.Close()
		return ask(c) == nil
	}) {
		t.Error("no connection taken after one closed")
	}
}

// TestGateCommitsHeldEventsBeforeAnswering: with OnEventHeld and Commit
// set, the events of fast answers go to OnEventHeld, and every one is
// committed before its answer reaches the client; the rest (an answer
// that is not a fast one, over TCP) still go to OnEvent.
func TestGateCommitsHeldEventsBeforeAnswering(t *testing.T) {
	var mu sync.Mutex
	held, committed, events := 0, 0, 0
	w := newWorldWith(t, GuardConfig{}, func(c *Config) {
		c.OnEvent = func(Event) { mu.Lock(); events++; mu.Unlock() }
		c.OnEventHeld = func(Event) { mu.Lock(); held++; mu.Unlock() }
		c.Commit = func() { mu.Lock(); committed = held; mu.Unlock() }
	}, "allowed.test", "deny pastebin.com")
	for i, q := range []string{"allowed.test.", "unknown.test.", "pastebin.com.", "allowed.test."} {
		w.query(t, "udp", q, dns.TypeA)
		mu.Lock()
		if held != i+1 || committed != held {
			t.Errorf("after the answer to %s: %d events held, %d committed; want %d, all", q, held, committed, i+1)
		}
		mu.Unlock()
	}
	w.query(t, "tcp", "allowed.test.", dns.TypeA)
	w.query(t, "udp", "allowed.test.", dns.TypeTXT)
	mu.Lock()
	defer mu.Unlock()
	if events != 2 || held != 4 {
		t.Errorf("events: %d to OnEvent, %d held; want 2 and 4", events, held)
	}
}

// TestGateAnswersNothingItCannotRecord: while Recording reports that
// events are not recorded, every answer is SERVFAIL with no records in
// it, whichever path answers (fast fake-IP and denied answers in a batch,
// a forwarded TXT, TCP); once it reports none, answers are as before.
func TestGateAnswersNothingItCannotRecord(t *testing.T) {
	w, failing, logs := unrecordedWorld(t, "allowed.test", "deny pastebin.com")
	type q struct {
		netw, name string
		qtype      uint16
	}
	queries := []q{
		{"udp", "allowed.test.", dns.TypeA}, {"udp", "allowed.test.", dns.TypeAAAA},
		{"udp", "pastebin.com.", dns.TypeA}, {"udp", "unknown.test.", dns.TypeA},
		{"udp", "allowed.test.", dns.TypeTXT}, {"udp", "allowed.test.", dns.TypeHTTPS},
		{"tcp", "allowed.test.", dns.TypeA}, {"tcp", "pastebin.com.", dns.TypeA},
	}
	failing.Store(true)
	for _, q := range queries {
		r := w.query(t, q.netw, q.name, q.qtype)
		if r.Rcode != dns.RcodeServerFailure || len(r.Answer)+len(r.Ns)+len(r.Extra) != 0 ||
			len(r.Question) != 1 || r.Question[0].Name != q.name || r.Question[0].Qtype != q.qtype {
			t.Errorf("%s %s over %s while not recording: %v", q.name, dns.Type(q.qtype), q.netw, r)
		}
	}
	if q := w.upstream.Queries(); len(q) != 0 {
		t.Errorf("the upstream was asked while not recording: %v", q)
	}
	failing.Store(false)
	if r := w.query(t, "udp", "allowed.test.", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("allowed.test A once recording again: %v", r)
	}
	if r := w.query(t, "udp", "pastebin.com.", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("pastebin.com A once recording again: %v", r)
	}
	// The refused queries have no record each: the log counts them, once.
	const said = "queries were answered SERVFAIL, unrecorded, while records could not be written"
	if got := logs.String(); strings.Count(got, said) != 1 || !strings.Contains(got, fmt.Sprintf("queries=%d", len(queries))) {
		t.Errorf("log after recording again, want one line counting %d queries:\n%s", len(queries), got)
	}
}

// TestGateLogsRefusedCountAtClose: queries refused while
// records could not be written have no record each; the only trace is the
// log's count. Once records are written again and the gate closes (the
// sandbox stops) before any other query, the count must still be logged.
func TestGateLogsRefusedCountAtClose(t *testing.T) {
	w, failing, logs := unrecordedWorld(t, "allowed.test")
	failing.Store(true)
	for range 3 {
		w.query(t, "udp", "allowed.test.", dns.TypeA)
	}
	failing.Store(false) // the journal is written again (by the proxy, say)
	w.gate.Close()
	const said = "queries were answered SERVFAIL, unrecorded"
	if got := logs.String(); !strings.Contains(got, said) {
		t.Errorf("3 queries refused unrecorded, records written again, gate closed: the log never counts them:\n%s", got)
	}
}

// unrecordedWorld is a world with rules whose gate's records fail while
// failing is set, and whose log is logs.
func unrecordedWorld(t *testing.T, rules ...string) (w *world, failing *atomic.Bool, logs *testworld.SyncBuffer) {
	failing, logs = new(atomic.Bool), new(testworld.SyncBuffer)
	w = newWorldWith(t, GuardConfig{}, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
		c.OnEventHeld = func(Event) {}
		c.Commit = func() {}
		c.Recording = func() error {
			if failing.Load() {
				return errors.New("disk full")
			}
			return nil
		}
	}, rules...)
	return w, failing, logs
}

// FuzzServfailWire: any bytes, made SERVFAIL, do not panic and never grow;
// a reply the gate packs becomes a SERVFAIL for its question alone.
func FuzzServfailWire(f *testing.F) {
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	r := new(dns.Msg)
	r.SetReply(m)
	r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: "allowed.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.IPv4(198, 18, 0, 1)})
	r.SetEdns0(1232, false)
	b, _ := r.Pack()
	f.Add(b)
	f.Add(b[:20])
	f.Add([]byte{0, 1, 0x81, 0x80, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		in := b
		out := servfailWire(append([]byte(nil), b...))
		if len(out) > len(in) {
			t.Fatalf("grew: %d to %d bytes", len(in), len(out))
		}
		if len(in) < 12 {
			return
		}
		var got dns.Msg
		if err := got.Unpack(out); err != nil {
			return // a question that was never valid
		}
		if got.Rcode != dns.RcodeServerFailure || len(got.Answer)+len(got.Ns)+len(got.Extra) != 0 || len(got.Question) > 1 || got.Id != binary.BigEndian.Uint16(in) {
			t.Fatalf("%x made SERVFAIL: %v", in, &got)
		}
		var orig dns.Msg
		whole := func(q dns.Question) bool { // its type and class were there
			m := &dns.Msg{Question: []dns.Question{q}}
			p, err := m.Pack()
			return err == nil && len(in) >= len(p)
		}
		if orig.Unpack(in) == nil && binary.BigEndian.Uint16(in[4:]) == 1 && len(orig.Question) == 1 && whole(orig.Question[0]) &&
			(len(got.Question) != 1 || got.Question[0] != orig.Question[0]) {
			t.Fatalf("question %v became %v", orig.Question, got.Question)
		}
	})
}
