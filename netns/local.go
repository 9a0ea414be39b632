package netns

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// LocalAddrs tells whether an address belongs to this host, so the proxy
// never dials the host's own services for a sandbox: an address of any
// interface of the current network namespace (read again at most once a
// second), or one the kernel would deliver locally, asked of the kernel's
// routing table (a local or broadcast route: 0.0.0.0, 127.0.0.0/8, an
// "ip route add local" range), cached a second per address.
type LocalAddrs struct {
	// mu guards the following fields.
	mu     sync.Mutex
	read   time.Time
	set    map[netip.Addr]bool
	routes map[netip.Addr]routeAnswer
}

type routeAnswer struct {
	local bool
	at    time.Time
}

// maxRouteAnswers bounds the cache of route answers.
const maxRouteAnswers = 4096

// Contains reports whether a is an address of this host or one the kernel
// delivers locally. When the kernel cannot be asked, it says yes: the
// address is refused rather than dialled unchecked.
func (l *LocalAddrs) Contains(a netip.Addr) bool {
	a = a.Unmap()
	l.mu.Lock()
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
	if l.set[a] {
		l.mu.Unlock()
		return true
	}
	if r, ok := l.routes[a]; ok && time.Since(r.at) < time.Second {
		l.mu.Unlock()
		return r.local
	}
	l.mu.Unlock()
	local := deliveredLocally(a)
	l.mu.Lock()
	if l.routes == nil || len(l.routes) >= maxRouteAnswers {
		l.routes = map[netip.Addr]routeAnswer{}
	}
	l.routes[a] = routeAnswer{local: local, at: time.Now()}
	l.mu.Unlock()
	return local
}

// deliveredLocally asks the kernel's routing table how it would send a
// packet to a.
func deliveredLocally(a netip.Addr) bool {
	routes, err := netlink.RouteGet(net.IP(a.AsSlice()))
	if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) {
		return false // nowhere to go, here or elsewhere: the dial fails
	}
	if err != nil {
		return true
	}
	for _, r := range routes {
		switch r.Type {
		case unix.RTN_LOCAL, unix.RTN_BROADCAST, unix.RTN_ANYCAST, unix.RTN_MULTICAST:
			return true
		}
		if r.LinkIndex > 0 {
			if link, err := netlink.LinkByIndex(r.LinkIndex); err == nil && link.Attrs().Flags&net.FlagLoopback != 0 {
				return true
			}
		}
	}
	return false
}
