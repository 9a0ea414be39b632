package supervisor

import (
	"net/netip"

	"github.com/airlockhq/airlock/netns"
)

// attribution names the member behind a source address on one sandbox's
// bridge, for records, approvals and per-member rules: the host itself
// for the gateway's address, an `airlock run` member by its live lease, a
// Docker member by its container (its airlock.source label, else its
// name); "" for an address no member holds.
type attribution struct {
	d       *Daemon // its Docker connection, which may come later
	sandbox string
	gateway netip.Addr
	leases  string // the sandbox's lease directory
	// cache answers for the lease directory from memory; nil reads the
	// lease file on every lookup.
	cache   *netns.LeaseCache
	dockers netip.Prefix // Docker's half of the subnet, where there are no leases
}

func (a attribution) member(addr netip.Addr) string {
	if addr == a.gateway {
		return "host" // the rules drop the gateway's address from the bridge: this is the host itself
	}
	// Leases are only ever taken below Docker's range: no file to open
	// for a container's address.
	if !a.dockers.Contains(addr) {
		src := ""
		if a.cache != nil {
			src = a.cache.Source(addr)
		} else {
			src = netns.LeaseSource(a.leases, addr)
		}
		if src != "" {
			return src
		}
	}
	if a.d != nil && a.d.docker != nil {
		if m, ok := a.d.docker.Member(addr); ok && m.Sandbox == a.sandbox {
			return m.Source
		}
	}
	return ""
}
