package netns

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// LocalAddrs tells whether an address belongs to this host (any interface
// of the current network namespace), so the proxy never dials the host's own
// services for a sandbox. The set is read again at most once a second.
type LocalAddrs struct {
	// mu guards the following fields.
	mu   sync.Mutex
	read time.Time
	set  map[netip.Addr]bool
}

// Contains reports whether a is an address of this host.
func (l *LocalAddrs) Contains(a netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.set == nil || time.Since(l.read) > time.Second {
		set := map[netip.Addr]bool{}
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, x := range addrs {
				if n, ok := x.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(n.IP); ok {
						set[ip.Unmap()] = true
					}
				}
			}
		}
		l.set, l.read = set, time.Now()
	}
	return l.set[a.Unmap()]
}
