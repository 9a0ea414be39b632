package dnsgate

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Resolver resolves names the proxy dials: every name passes the sandbox's
// exfiltration guard before it may go upstream, and answers are cached for
// their TTL (at most MaxCacheTTL), so that connecting repeatedly to an
// allowed host costs one upstream query, not one per connection. It is safe
// for concurrent use.
type Resolver struct {
	up    Exchanger
	guard *Guard
	now   func() time.Time

	// mu guards cache.
	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	addrs   []netip.Addr
	expires time.Time
}

// Cache bounds.
const (
	MaxCacheTTL     = 60 * time.Second
	maxCacheEntries = 4096
)

// NewResolver returns a resolver over up, guarded by guard; now is the
// clock (nil means time.Now).
func NewResolver(up Exchanger, guard *Guard, now func() time.Time) *Resolver {
	if now == nil {
		now = time.Now
	}
	return &Resolver{up: up, guard: guard, now: now, cache: make(map[string]cached)}
}

// LookupA returns name's IPv4 addresses.
func (r *Resolver) LookupA(ctx context.Context, name string) ([]netip.Addr, error) {
	now := r.now()
	r.mu.Lock()
	if c, ok := r.cache[name]; ok && now.Before(c.expires) {
		r.mu.Unlock()
		return c.addrs, nil
	}
	r.mu.Unlock()
	if trip, ok := r.guard.Check(name); !ok {
		return nil, fmt.Errorf("exfiltration guard: %s", trip.Reason)
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	m.SetEdns0(1232, false)
	resp, err := r.up.Exchange(ctx, m)
	if err != nil {
		return nil, err
	}
	if resp.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("resolve %s: %s", name, dns.RcodeToString[resp.Rcode])
	}
	var addrs []netip.Addr
	ttl := MaxCacheTTL
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				addrs = append(addrs, ip)
				ttl = min(ttl, time.Duration(a.Hdr.Ttl)*time.Second)
			}
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolve %s: no IPv4 address", name)
	}
	if ttl > 0 {
		r.mu.Lock()
		if len(r.cache) >= maxCacheEntries {
			for k, c := range r.cache {
				if !now.Before(c.expires) || len(r.cache) >= maxCacheEntries {
					delete(r.cache, k)
				}
			}
		}
		r.cache[name] = cached{addrs: addrs, expires: now.Add(ttl)}
		r.mu.Unlock()
	}
	return addrs, nil
}
