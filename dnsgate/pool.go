package dnsgate

import (
	"container/list"
	"fmt"
	"net/netip"
	"sync"
)

// DefaultPool is the fake-IP range of docs/design.md §4 (RFC 2544 benchmarking
// space, never routed on the internet).
var DefaultPool = netip.MustParsePrefix("198.18.0.0/15")

// Pool hands out one fake IPv4 address per name and maps it back. When every
// address is taken, the least recently used name gives up its address. It is
// safe for concurrent use.
type Pool struct {
	prefix netip.Prefix
	first  uint32 // first usable address
	size   uint32 // number of usable addresses

	// mu guards the following fields.
	mu     sync.Mutex
	next   uint32                   // offset of the next never-used address
	byName map[string]*list.Element // name → element holding a *lease
	byAddr map[netip.Addr]*list.Element
	lru    *list.List // front: most recently used
}

type lease struct {
	name string
	addr netip.Addr
}

// NewPool returns a pool over prefix, which must be IPv4 with at least 4
// addresses. The network and broadcast-looking first and last addresses are
// never handed out.
func NewPool(prefix netip.Prefix) (*Pool, error) {
	prefix = prefix.Masked()
	if !prefix.Addr().Is4() {
		return nil, fmt.Errorf("fake IP pool %s is not IPv4", prefix)
	}
	if prefix.Bits() > 30 {
		return nil, fmt.Errorf("fake IP pool %s is too small: want /30 or larger", prefix)
	}
	b := prefix.Addr().As4()
	base := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	total := uint32(1) << (32 - prefix.Bits())
	return &Pool{
		prefix: prefix,
		first:  base + 1,
		size:   total - 2,
		byName: make(map[string]*list.Element),
		byAddr: make(map[netip.Addr]*list.Element),
		lru:    list.New(),
	}, nil
}

// Prefix returns the pool's range.
func (p *Pool) Prefix() netip.Prefix { return p.prefix }

// Contains reports whether a is in the pool's range.
func (p *Pool) Contains(a netip.Addr) bool { return p.prefix.Contains(a) }

// Assign returns name's address, giving it one if it has none. name must be
// normalised (see policy.NormalizeHost).
func (p *Pool) Assign(name string) netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.byName[name]; ok {
		p.lru.MoveToFront(e)
		return e.Value.(*lease).addr
	}
	var l *lease
	if p.next < p.size {
		l = &lease{addr: u32Addr(p.first + p.next)}
		p.next++
	} else {
		// Full: the least recently used name gives up its address.
		e := p.lru.Back()
		l = e.Value.(*lease)
		delete(p.byName, l.name)
		delete(p.byAddr, l.addr)
		p.lru.Remove(e)
	}
	l.name = name
	e := p.lru.PushFront(l)
	p.byName[name] = e
	p.byAddr[l.addr] = e
	return l.addr
}

// lookup returns the name b holding an address, as the pool holds it,
// without allocating and without making it recently used.
func (p *Pool) lookup(b []byte) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.byName[string(b)]; ok {
		return e.Value.(*lease).name, true
	}
	return "", false
}

// Name returns the name an address was assigned to.
func (p *Pool) Name(a netip.Addr) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byAddr[a]
	if !ok {
		return "", false
	}
	p.lru.MoveToFront(e)
	return e.Value.(*lease).name, true
}

// Len returns the number of names holding an address.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byName)
}

func u32Addr(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
