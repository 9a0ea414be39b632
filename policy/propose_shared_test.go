package policy

import (
	"slices"
	"strings"
	"testing"
)

// A member that reaches a few subdomains of a cloud's shared domain must
// not get "*.amazonaws.com" proposed (ticked by default on the page, saved
// by airlock propose --save): it would open every customer's buckets and
// endpoints under it, far more than the hosts shown. Each host is proposed
// on its own instead. Tunnels and request catchers are flagged like paste
// sites.
func TestProposeNoWildcardOverSharedDomains(t *testing.T) {
	for _, domain := range []string{"amazonaws.com", "storage.googleapis.com", "r2.cloudflarestorage.com", "fastly.net", "nip.io", "oast.fun", "interact.sh"} {
		t.Run(domain, func(t *testing.T) {
			var hits []Hit
			for _, l := range []string{"a", "b", "c", "d"} {
				hits = append(hits, conn("agent", l+"."+domain, 443))
			}
			got := Propose(hits, nil)
			for _, p := range got {
				if strings.HasPrefix(p.Pattern, "*.") {
					t.Errorf("proposed %q for %v: it covers every customer of %s", p.Pattern, p.Hosts, domain)
				}
			}
			if len(got) != len(hits) {
				t.Errorf("got %d patterns, want one per host: %+v", len(got), got)
			}
		})
	}
	for _, host := range []string{"abc.oast.fun", "x.interact.sh", "me.loca.lt", "foo.trycloudflare.com", "foo.ngrok-free.app", "1.2.3.4.nip.io", "x.burpcollaborator.net"} {
		got := Propose([]Hit{conn("agent", host, 443)}, nil)
		if len(got) != 1 || !slices.ContainsFunc(got[0].Flags, func(f string) bool { return strings.Contains(f, "anything can be carried out") }) {
			t.Errorf("%s: %+v, want it flagged as a tunnel or request catcher", host, got)
		}
	}
}
