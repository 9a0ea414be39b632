package dnsgate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/policy"
)

// fastPair is two gates with the same policy and pools that start empty:
// one answers through fastAnswer, the other through replyTo and ServeDNS,
// as the UDP loop does with what fastAnswer declines.
type fastPair struct {
	fast, slow     *Gate
	fastEv, slowEv []Event
	// member says the query being checked is the member's, who may have
	// agent-only.test forwarded.
	member atomic.Bool
}

// memberUpstream is refusingUpstream for a pair's rules: allowed.test may
// be forwarded too, and agent-only.test for the member only. Asked about
// any other name, or about that one for anyone else, it panics.
type memberUpstream struct{ member *atomic.Bool }

func (u memberUpstream) Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	switch m.Question[0].Name {
	case "allowed.test.":
	case "agent-only.test.":
		if !u.member.Load() {
			panic("forwarded agent-only.test for a client that is not its member")
		}
	default:
		return refusingUpstream{}.Exchange(ctx, m)
	}
	return nil, errors.New("no upstream in fuzzing")
}

func newFastPair(t testing.TB, unknown policy.Action) *fastPair {
	t.Helper()
	rules := []*policy.Rule{
		policy.NewRule(policy.Allowlist, policy.User, policy.MustParse("allowed.test"), "", "test", time.Time{}),
		policy.NewRule(policy.Allowlist, policy.User, policy.MustParse("*.example.com"), "", "test", time.Time{}),
		policy.NewRule(policy.Allowlist, policy.User, policy.MustParse("agent-only.test"), "agent", "test", time.Time{}),
		policy.NewRule(policy.Denylist, policy.User, policy.MustParse("denied.test"), "", "test", time.Time{}),
		policy.NewRule(policy.Denylist, policy.User, policy.MustParse("*.pastebin.com"), "", "test", time.Time{}),
	}
	p := &fastPair{}
	gate := func(events *[]Event) *Gate {
		pool, _ := NewPool(DefaultPool)
		guard, _ := NewGuard(GuardConfig{}, nil)
		g, err := New(Config{Sandbox: "test", Listen: netip.MustParseAddrPort("127.0.0.1:0"),
			Clients: netip.MustParsePrefix("127.0.0.0/24"),
			Policy:  policy.NewRuleset(unknown, rules), Pool: pool, Upstream: memberUpstream{&p.member}, Guard: guard,
			Members: func(a netip.Addr) string {
				if a == netip.MustParseAddr("127.0.0.2") {
					return "agent"
				}
				return ""
			},
			OnEvent: func(e Event) { e.Time = time.Time{}; *events = append(*events, e) },
			Logger:  slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	p.fast, p.slow = gate(&p.fastEv), gate(&p.slowEv)
	return p
}

// replies returns the replies w queued.
func replies(w *udpReplies) []string {
	var out []string
	for i := range w.n {
		out = append(out, string(unsafe.Slice(w.batch.iovs[i].Base, w.batch.iovs[i].Len)))
	}
	return out
}

// sockaddr is the address of a client.
func sockaddr(addr string) *unix.RawSockaddrInet4 {
	ap := netip.MustParseAddrPort(addr)
	sa := &unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ap.Addr().As4()}
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	p[0], p[1] = byte(ap.Port()>>8), byte(ap.Port())
	return sa
}

// check answers b from client on both gates and reports whether the fast
// path took it; when it did, the replies and events must be the same, and
// when it did not, it must have done nothing.
func (p *fastPair) check(t testing.TB, client string, b []byte) bool {
	t.Helper()
	p.member.Store(netip.MustParseAddrPort(client).Addr() == netip.MustParseAddr("127.0.0.2"))
	var st fastState
	fast := &udpReplies{batch: newUDPBatch(unix.SYS_SENDMMSG, false)}
	fast.begin(sockaddr(client))
	before, evs := p.fast.cfg.Pool.Len(), len(p.fastEv)
	took := p.fast.fastAnswer(fast, &st, b)
	if !took {
		if fast.n != 0 || len(p.fastEv) != evs || p.fast.cfg.Pool.Len() != before {
			t.Fatalf("fastAnswer declined %x but queued %d replies, emitted %d events, gave %d fake IPs",
				b, fast.n, len(p.fastEv)-evs, p.fast.cfg.Pool.Len()-before)
		}
		// Keep the pools in step: the loop answers it the slow way.
		req := replyTo(fast, b)
		if req != nil {
			p.fast.ServeDNS(fast, req)
		}
	}
	slow := &udpReplies{batch: newUDPBatch(unix.SYS_SENDMMSG, false)}
	slow.begin(sockaddr(client))
	if req := replyTo(slow, b); req != nil {
		p.slow.ServeDNS(slow, req)
	}
	if took {
		if diff := cmp.Diff(replies(slow), replies(fast)); diff != "" {
			t.Errorf("query %x: fast reply differs from ServeDNS's (-slow +fast):\n%s", b, diff)
		}
		if diff := cmp.Diff(p.slowEv, p.fastEv, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("query %x: fast events differ from ServeDNS's (-slow +fast):\n%s", b, diff)
		}
	}
	p.fastEv, p.slowEv = p.fastEv[:0], p.slowEv[:0]
	return took
}

// fastCases are queries fastAnswer must answer or decline, by name.
func fastCases() []struct {
	name string
	b    []byte
	fast bool
} {
	query := func(name string, qtype uint16, tune func(*dns.Msg)) []byte {
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		m.Id = 4242
		if tune != nil {
			tune(m)
		}
		b, err := m.Pack()
		if err != nil {
			panic(err)
		}
		return b
	}
	edns := func(size uint16, do bool) func(*dns.Msg) {
		return func(m *dns.Msg) { m.SetEdns0(size, do) }
	}
	bits := func(f func(*dns.Msg)) func(*dns.Msg) { return f }
	label63 := strings.Repeat("a", 63)
	long := func(n int) string { // a name of n wire bytes
		var labels []string
		for left := n - 1; left > 0; {
			l := min(63, left-1)
			if left-1-l == 1 { // no room for a one-byte remainder
				l--
			}
			labels = append(labels, strings.Repeat("b", l))
			left -= l + 1
		}
		return strings.Join(labels, ".") + "."
	}
	a := query("x.example.com.", dns.TypeA, nil)
	return []struct {
		name string
		b    []byte
		fast bool
	}{
		{"A allowed", query("x.example.com.", dns.TypeA, nil), true},
		{"A unknown", query("unknown.test.", dns.TypeA, nil), true},
		{"A mixed case", query("X.Example.COM.", dns.TypeA, nil), true},
		{"A underscore and hyphen", query("_dmarc.a-b.example.com.", dns.TypeA, nil), true},
		{"A denied", query("denied.test.", dns.TypeA, nil), true},
		{"A denied mixed case", query("DENIED.Test.", dns.TypeA, nil), true},
		{"A denied wildcard", query("x.y.pastebin.com.", dns.TypeA, nil), true},
		{"A denied EDNS", query("denied.test.", dns.TypeA, edns(1232, false)), true},
		{"A denied EDNS DO small", query("denied.test.", dns.TypeA, edns(100, true)), true},
		{"A EDNS 4096", query("x.example.com.", dns.TypeA, edns(4096, false)), true},
		{"A member rule", query("agent-only.test.", dns.TypeA, nil), true},
		{"AAAA", query("x.example.com.", dns.TypeAAAA, nil), true},
		{"AAAA denied", query("denied.test.", dns.TypeAAAA, edns(1232, false)), true},
		{"HTTPS", query("x.example.com.", dns.TypeHTTPS, nil), true},
		{"SVCB", query("x.example.com.", dns.TypeSVCB, edns(1232, false)), true},
		{"RD off CD on", query("x.example.com.", dns.TypeA, bits(func(m *dns.Msg) { m.RecursionDesired, m.CheckingDisabled = false, true })), true},
		{"AA TC AD Z RA set", query("x.example.com.", dns.TypeA, bits(func(m *dns.Msg) {
			m.Authoritative, m.Truncated, m.AuthenticatedData, m.Zero, m.RecursionAvailable = true, true, true, true, true
		})), true},
		{"rcode in query", query("denied.test.", dns.TypeA, bits(func(m *dns.Msg) { m.Rcode = 5 })), true},
		{"63-byte label", query(label63+".example.com.", dns.TypeA, nil), true},
		{"longest fast name", query(long(maxFastName), dns.TypeA, edns(1232, false)), true},
		{"name too long for the fast path", query(long(maxFastName+1), dns.TypeA, nil), false},
		{"longest name", query(long(255), dns.TypeA, edns(1232, false)), false},
		{"numeric last label", query("1.2.3.4.", dns.TypeA, nil), false},
		{"hex last label", query("x.0x7f.", dns.TypeA, nil), false},
		{"hyphen at a label's end", query("x-.example.com.", dns.TypeA, nil), false},
		{"escaped dot", query(`a\.b.example.com.`, dns.TypeA, nil), false},
		{"non-ASCII", query(`\195\188.example.com.`, dns.TypeA, nil), false},
		{"root", query(".", dns.TypeA, nil), false},
		{"TXT", query("x.example.com.", dns.TypeTXT, nil), false},
		{"PTR", query("1.0.18.198.in-addr.arpa.", dns.TypePTR, nil), false},
		{"ANY", query("x.example.com.", dns.TypeANY, nil), false},
		{"class CH", query("x.example.com.", dns.TypeA, bits(func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS })), false},
		{"EDNS option", query("x.example.com.", dns.TypeA, func(m *dns.Msg) {
			m.SetEdns0(1232, false)
			m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
		}), false},
		{"opcode NOTIFY", query("x.example.com.", dns.TypeA, bits(func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify })), false},
		{"a response", query("x.example.com.", dns.TypeA, bits(func(m *dns.Msg) { m.Response = true })), false},
		{"an answer record", query("x.example.com.", dns.TypeA, bits(func(m *dns.Msg) {
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: "x.", Rrtype: dns.TypeA, Class: dns.ClassINET}}}
		})), false},
		{"two additional", query("x.example.com.", dns.TypeA, bits(func(m *dns.Msg) {
			m.SetEdns0(1232, false)
			m.Extra = append(m.Extra, &dns.A{Hdr: dns.RR_Header{Name: "x.", Rrtype: dns.TypeA, Class: dns.ClassINET}})
		})), false},
		{"trailing byte", append(query("x.example.com.", dns.TypeA, nil), 0), false},
		{"cut question", a[:len(a)-2], false},
		{"compression pointer", append(append(a[:12:12], 0xc0, 12), 0, 1, 0, 1), false},
	}
}

// TestFastAnswerLikeServeDNS: fastAnswer takes the queries it is meant to,
// and for each gives the reply and the event ServeDNS gives, the first
// time a name is asked and the next; it declines the others without a
// trace. Both unknown actions are tried (deny still answers A with a fake
// IP), and clients a member is named behind or not, or outside the
// sandbox.
func TestFastAnswerLikeServeDNS(t *testing.T) {
	for _, unknown := range []policy.Action{policy.ActionAsk, policy.ActionDeny} {
		for _, tc := range fastCases() {
			t.Run(fmt.Sprintf("%s/%s", unknown, tc.name), func(t *testing.T) {
				p := newFastPair(t, unknown)
				for _, client := range []string{"127.0.0.2:5353", "127.0.0.3:5353", "127.0.0.2:5353"} {
					if took := p.check(t, client, tc.b); took != tc.fast {
						t.Errorf("from %s: fast path took it: %v, want %v", client, took, tc.fast)
					}
				}
				if p.check(t, "127.0.1.1:53", tc.b) {
					t.Error("fast path answered a client outside the sandbox")
				}
			})
		}
	}
}

// TestFastAnswerAllocations: a fake-IP or denied answer for a name asked
// before allocates nothing when no event is wanted.
func TestFastAnswerAllocations(t *testing.T) {
	p := newFastPair(t, policy.ActionAsk)
	g := p.fast
	g.cfg.OnEvent = nil
	for _, tc := range fastCases()[:13] {
		var st fastState
		out := &udpReplies{batch: newUDPBatch(unix.SYS_SENDMMSG, false)}
		out.begin(sockaddr("127.0.0.3:5353"))
		g.fastAnswer(out, &st, tc.b)
		if n := testing.AllocsPerRun(100, func() {
			out.n = 0
			if !g.fastAnswer(out, &st, tc.b) {
				t.Fatal("declined")
			}
		}); n != 0 {
			t.Errorf("%s: %v allocations per answer, want 0", tc.name, n)
		}
	}
}

// FuzzFastAnswer: whatever the datagram, from a client a member is named
// behind or not, with unknown names asked about or denied, fastAnswer
// answers it as ServeDNS would, or declines it without a trace.
func FuzzFastAnswer(f *testing.F) {
	for i, tc := range fastCases() {
		f.Add(tc.b, i%2 == 0, i%3 != 0)
	}
	pairs := map[bool]*fastPair{false: newFastPair(f, policy.ActionAsk), true: newFastPair(f, policy.ActionDeny)}
	f.Fuzz(func(t *testing.T, b []byte, deny, named bool) {
		if len(b) >= 2 {
			binary.BigEndian.PutUint16(b, 4242)
		}
		client := "127.0.0.3:5353"
		if named {
			client = "127.0.0.2:5353"
		}
		pairs[deny].check(t, client, b)
	})
}
