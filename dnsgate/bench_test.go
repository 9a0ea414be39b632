package dnsgate

import (
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/policy"
)

// benchGate returns a gate like gatebench's (make bench): names under
// bench.test get fake IPs, denied.test is denied, and rules pads the
// policy with exact hosts and wildcards that match none of them.
func benchGate(b *testing.B, rules int) *Gate {
	b.Helper()
	rs := []*policy.Rule{
		policy.NewRule(policy.Allowlist, policy.User, policy.MustParse("*.fwd.test"), "", "bench", time.Time{}),
		policy.NewRule(policy.Denylist, policy.User, policy.MustParse("denied.test"), "", "bench", time.Time{}),
	}
	for i := len(rs); i < rules; i++ {
		p := fmt.Sprintf("h%d.example.com", i)
		if i%5 == 0 {
			p = fmt.Sprintf("*.w%d.example.com", i)
		}
		rs = append(rs, policy.NewRule(policy.Allowlist, policy.User, policy.MustParse(p), "", "bench", time.Time{}))
	}
	pool, err := NewPool(DefaultPool)
	if err != nil {
		b.Fatal(err)
	}
	guard, err := NewGuard(GuardConfig{MaxSubdomains: 1 << 30}, nil)
	if err != nil {
		b.Fatal(err)
	}
	g, err := New(Config{Sandbox: "bench", Listen: netip.MustParseAddrPort("127.0.0.1:0"),
		Policy: policy.NewRuleset(policy.ActionAsk, rs), Pool: pool, Upstream: refusingUpstream{}, Guard: guard,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	return g
}

// benchQueries returns the datagrams of a query set of scripts/bench-dns.sh:
// "fake" (A queries for 10,000 names) or "denied" (one denied name).
func benchQueries(set string) [][]byte {
	var names []string
	switch set {
	case "fake":
		for i := range 10000 {
			names = append(names, fmt.Sprintf("h%d.bench.test.", i))
		}
	case "denied":
		names = []string{"denied.test."}
	}
	var out [][]byte
	for i, n := range names {
		m := new(dns.Msg)
		m.SetQuestion(n, dns.TypeA)
		m.Id = uint16(i)
		b, _ := m.Pack()
		out = append(out, b)
	}
	return out
}

// BenchmarkGateUDP measures the gate's UDP loop, sockets included, on the
// query sets of make bench, with 10 and 100,000 rules: a client on
// loopback keeps a batch of queries outstanding. The client makes system
// calls on a raw socket and allocates nothing, so allocs/op are the
// gate's, per query.
func BenchmarkGateUDP(b *testing.B) {
	for _, rules := range []int{10, 100000} {
		for _, set := range []string{"fake", "denied"} {
			b.Run(fmt.Sprintf("%s/rules=%d", set, rules), func(b *testing.B) {
				g := benchGate(b, rules)
				if err := g.Start(); err != nil {
					b.Fatal(err)
				}
				defer g.Close()
				qs := benchQueries(set)
				fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					b.Fatal(err)
				}
				defer unix.Close(fd)
				ga := g.Addr()
				if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(ga.Port()), Addr: ga.Addr().As4()}); err != nil {
					b.Fatal(err)
				}
				unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2})
				buf := make([]byte, 2048)
				exchange := func(from, n int) {
					for i := range n {
						if _, err := ignoringEINTR(func() (int, error) { return unix.Write(fd, qs[(from+i)%len(qs)]) }); err != nil {
							b.Fatal(err)
						}
					}
					for range n {
						if _, err := ignoringEINTR(func() (int, error) { return unix.Read(fd, buf) }); err != nil {
							b.Fatalf("reply: %v", err)
						}
					}
				}
				// Every name has its fake IP before the clock starts, as in
				// make bench's runs after the first.
				for i := 0; i < len(qs); i += udpBatch {
					exchange(i, min(udpBatch, len(qs)-i))
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i += udpBatch {
					exchange(i, min(udpBatch, b.N-i))
				}
			})
		}
	}
}

// ignoringEINTR calls f until it is not interrupted by a signal (the
// runtime's preemption, the CPU profiler's).
func ignoringEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if err != unix.EINTR {
			return n, err
		}
	}
}

// BenchmarkGateAnswer measures the answer to one query without the
// sockets: reading it, deciding, taking its fake IP and writing the
// reply, on the query sets of make bench, with 10 and 100,000 rules; from
// the wire bytes (fast), and through miekg/dns's Msg as queries the fast
// path declines are (msg).
func BenchmarkGateAnswer(b *testing.B) {
	for _, rules := range []int{10, 100000} {
		for _, set := range []string{"fake", "denied"} {
			for _, path := range []string{"fast", "msg"} {
				b.Run(fmt.Sprintf("%s/rules=%d/%s", set, rules, path), func(b *testing.B) {
					g := benchGate(b, rules)
					qs := benchQueries(set)
					var st fastState
					out := &udpReplies{batch: newUDPBatch(unix.SYS_SENDMMSG, false)}
					out.begin(sockaddr("127.0.0.1:5353"))
					answer := func(q []byte) {
						out.n = 0
						if path == "fast" {
							if !g.fastAnswer(out, &st, q) {
								b.Fatal("not answered at once")
							}
							return
						}
						g.ServeDNS(out, replyTo(out, q))
					}
					for _, q := range qs {
						answer(q)
					}
					b.ReportAllocs()
					i := 0
					for b.Loop() {
						answer(qs[i%len(qs)])
						i++
					}
				})
			}
		}
	}
}
