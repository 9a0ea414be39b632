package dnsgate

import (
	"context"
	"net"
	"testing"

	"github.com/miekg/dns"
)

// ordinaryApexes are registrable domains whose one label would trip the
// guard's label checks, which a name with nothing under its registrable
// domain does not get (its queries go to its suffix's servers).
var ordinaryApexes = []string{
	"thelongestdomainnameintheworldandthensomeandthensomemoreandmore.com", // 63-byte label, a real site
	"llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch.co.uk",    // 58-byte label (a Welsh village)
	"bestwebhostingcompanyreviews.com",                                    // entropy 3.92 > 3.8
	"cheapflightsandhotelsworldwide.com",                                  // entropy 3.87
	"4wheeldrive4x4parts.com",                                             // "base32-looking"
}

// TestGuardPassesOrdinaryApexNames: the guard passes them, and names
// under them.
func TestGuardPassesOrdinaryApexNames(t *testing.T) {
	for _, name := range ordinaryApexes {
		g, _ := NewGuard(GuardConfig{}, nil)
		if trip, ok := g.Check(name); !ok || trip != nil {
			t.Errorf("Check(%s) = %+v, %v; an ordinary registrable domain is refused", name, trip, ok)
		}
		if _, ok := g.Check("www." + name); !ok {
			t.Errorf("Check(www.%s) refused after the apex tripped (www alone passes on a fresh guard)", name)
		}
	}
}

type apexStub struct{}

func (apexStub) Exchange(_ context.Context, m *dns.Msg) (*dns.Msg, error) {
	r := new(dns.Msg)
	r.SetReply(m)
	r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 1)})
	return r, nil
}

// TestProxyResolvesAllowedApex: the proxy dials an allowed host
// by name through Resolver.LookupA, which shares the guard.
func TestProxyResolvesAllowedApex(t *testing.T) {
	for _, name := range ordinaryApexes {
		g, _ := NewGuard(GuardConfig{}, nil)
		r := NewResolver(apexStub{}, g, nil)
		if _, err := r.LookupA(context.Background(), name); err != nil {
			t.Errorf("LookupA(%s): %v", name, err)
		}
	}
}
