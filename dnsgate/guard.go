package dnsgate

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/publicsuffix"

	"github.com/airlockhq/airlock/policy"
)

// GuardConfig tunes the exfiltration guard. Zero fields take the defaults
// documented on each.
type GuardConfig struct {
	// MaxLabelLen is the longest label, in bytes, of a name resolved
	// upstream. Default 50 (DNS allows 63).
	MaxLabelLen int
	// EntropyMinLen is the shortest label, in bytes, checked for entropy.
	// Default 24.
	EntropyMinLen int
	// MaxEntropy is the highest Shannon entropy, in bits per byte, of a
	// label at least EntropyMinLen long. Default 3.8: words and hyphenated
	// names stay below it, random or encoded data does not.
	MaxEntropy float64
	// EncodedMinLen is the shortest label, in bytes, refused for looking hex
	// or base32 encoded (letters and digits mixed from those alphabets).
	// Default 16.
	EncodedMinLen int
	// MaxSubdomains is how many distinct names under one registrable domain
	// may be resolved upstream per Window. Default 30.
	MaxSubdomains int
	// Window is the period MaxSubdomains counts over. Default 1 minute.
	Window time.Duration
	// BlockFor is how long, after a trip, new names under the domain are
	// refused (names resolved before the trip keep working). Default 10
	// minutes.
	BlockFor time.Duration
	// AlertOnly reports trips without blocking anything.
	AlertOnly bool
}

// Guard defaults.
const (
	DefaultMaxLabelLen   = 50
	DefaultEntropyMinLen = 24
	DefaultMaxEntropy    = 3.8
	DefaultEncodedMinLen = 16
	DefaultMaxSubdomains = 30
	DefaultWindow        = time.Minute
	DefaultBlockFor      = 10 * time.Minute

	// maxDomains bounds the guard's memory: past it, idle domains are
	// forgotten first.
	maxDomains = 10000
)

func (c GuardConfig) withDefaults() GuardConfig {
	if c.MaxLabelLen == 0 {
		c.MaxLabelLen = DefaultMaxLabelLen
	}
	if c.EntropyMinLen == 0 {
		c.EntropyMinLen = DefaultEntropyMinLen
	}
	if c.MaxEntropy == 0 {
		c.MaxEntropy = DefaultMaxEntropy
	}
	if c.EncodedMinLen == 0 {
		c.EncodedMinLen = DefaultEncodedMinLen
	}
	if c.MaxSubdomains == 0 {
		c.MaxSubdomains = DefaultMaxSubdomains
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.BlockFor == 0 {
		c.BlockFor = DefaultBlockFor
	}
	return c
}

func (c GuardConfig) validate() error {
	switch {
	case c.MaxLabelLen < 1 || c.MaxLabelLen > 63:
		return fmt.Errorf("exfiltration guard: max label length %d: want 1 to 63", c.MaxLabelLen)
	case c.EntropyMinLen < 1, c.EncodedMinLen < 1:
		return fmt.Errorf("exfiltration guard: label lengths must be positive")
	case c.MaxEntropy <= 0:
		return fmt.Errorf("exfiltration guard: max entropy %v: want > 0", c.MaxEntropy)
	case c.MaxSubdomains < 1:
		return fmt.Errorf("exfiltration guard: max subdomains %d: want ≥ 1", c.MaxSubdomains)
	case c.Window <= 0, c.BlockFor <= 0:
		return fmt.Errorf("exfiltration guard: window and block duration must be positive")
	}
	return nil
}

// Trip describes a name the guard objected to.
type Trip struct {
	Domain string // registrable domain
	Name   string
	Reason string
	// Blocked is false in alert-only mode.
	Blocked bool
}

// Guard watches the names a sandbox resolves upstream for signs of data
// being carried out in them. It is safe for concurrent use.
type Guard struct {
	cfg GuardConfig
	now func() time.Time

	// mu guards domains.
	mu      sync.Mutex
	domains map[string]*domainState
}

type domainState struct {
	windowStart  time.Time
	windowNames  map[string]struct{} // names first seen in this window
	known        map[string]time.Time
	blockedUntil time.Time
	lastSeen     time.Time
}

// NewGuard returns a guard; now is its clock (nil means time.Now).
func NewGuard(cfg GuardConfig, now func() time.Time) (*Guard, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &Guard{cfg: cfg, now: now, domains: make(map[string]*domainState)}, nil
}

// Check decides whether name (normalised) may be resolved upstream. It
// returns ok=false when the name must not go upstream, and a non-nil Trip
// when the guard objected (in alert-only mode ok stays true).
func (g *Guard) Check(name string) (trip *Trip, ok bool) {
	domain := icannDomain(name)
	now := g.now()

	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.stateLocked(domain, now)
	st.lastSeen = now
	if _, seen := st.known[name]; seen {
		st.known[name] = now
		return nil, true
	}
	if now.Before(st.blockedUntil) {
		return &Trip{Domain: domain, Name: name, Reason: "new name under a domain blocked after an exfiltration trip", Blocked: true}, false
	}
	// A name with nothing under its registrable domain (example.com) is
	// not checked: its queries go to the servers of its public suffix,
	// never to one a member chose, and registrable names are often long.
	reason := ""
	if sub, ok := strings.CutSuffix(name, "."+domain); ok {
		reason = g.labelReason(sub)
	}
	if reason == "" {
		if now.Sub(st.windowStart) >= g.cfg.Window {
			st.windowStart, st.windowNames = now, make(map[string]struct{})
		}
		if len(st.windowNames) >= g.cfg.MaxSubdomains {
			reason = fmt.Sprintf("more than %d distinct names under %s within %s", g.cfg.MaxSubdomains, domain, g.cfg.Window)
		}
	}
	if reason != "" {
		t := &Trip{Domain: domain, Name: name, Reason: reason, Blocked: !g.cfg.AlertOnly}
		if t.Blocked {
			st.blockedUntil = now.Add(g.cfg.BlockFor)
			return t, false
		}
		return t, true
	}
	st.windowNames[name] = struct{}{}
	st.known[name] = now
	g.pruneKnownLocked(st, now)
	return nil, true
}

func (g *Guard) stateLocked(domain string, now time.Time) *domainState {
	st, ok := g.domains[domain]
	if ok {
		return st
	}
	if len(g.domains) >= maxDomains {
		g.forgetIdleLocked(now)
	}
	st = &domainState{windowStart: now, windowNames: make(map[string]struct{}), known: make(map[string]time.Time)}
	g.domains[domain] = st
	return st
}

// forgetIdleLocked drops domains that are neither blocked nor seen within a
// window; if that frees nothing, the least recently seen half goes.
func (g *Guard) forgetIdleLocked(now time.Time) {
	for d, st := range g.domains {
		if now.After(st.blockedUntil) && now.Sub(st.lastSeen) > g.cfg.Window {
			delete(g.domains, d)
		}
	}
	if len(g.domains) < maxDomains {
		return
	}
	var cutoff time.Time
	for _, st := range g.domains {
		if cutoff.IsZero() || st.lastSeen.Before(cutoff) {
			cutoff = st.lastSeen
		}
	}
	mid := cutoff.Add(now.Sub(cutoff) / 2)
	for d, st := range g.domains {
		if st.lastSeen.Before(mid) && now.After(st.blockedUntil) {
			delete(g.domains, d)
		}
	}
}

// pruneKnownLocked keeps the names that still work under a block to those
// used within BlockFor.
func (g *Guard) pruneKnownLocked(st *domainState, now time.Time) {
	if len(st.known) <= 4*g.cfg.MaxSubdomains {
		return
	}
	for n, t := range st.known {
		if now.Sub(t) > g.cfg.BlockFor {
			delete(st.known, n)
		}
	}
}

// icannDomain is the registrable domain of name under the ICANN section of
// the public suffix list, without its wildcard rules; name itself when it
// is a public suffix. Private suffixes (github.io, appspot.com) are one
// company's namespace but anyone's subdomains, and each name a wildcard
// rule makes a public suffix (x.kawasaki.jp under *.kawasaki.jp) is
// anyone's label: counting under them would give every made-up name its
// own quota and skip the label checks. So names under github.io count
// under github.io, and names under x.kawasaki.jp under kawasaki.jp.
func icannDomain(name string) string {
	suffix := name
	for {
		ps, icann := publicsuffix.PublicSuffix(suffix)
		i := strings.IndexByte(ps, '.')
		if i < 0 || icann && !policy.ChildrenArePublicSuffixes(ps[i+1:]) {
			suffix = ps
			break
		}
		suffix = ps[i+1:] // drop the private or wildcard label
	}
	if suffix == name {
		return name
	}
	rest := strings.TrimSuffix(name, "."+suffix)
	return rest[strings.LastIndexByte(rest, '.')+1:] + "." + suffix
}

// labelReason returns why the labels of a subdomain look like carried data,
// or "".
func (g *Guard) labelReason(sub string) string {
	for _, l := range strings.Split(sub, ".") {
		switch {
		case len(l) > g.cfg.MaxLabelLen:
			return fmt.Sprintf("label of %d bytes (limit %d)", len(l), g.cfg.MaxLabelLen)
		case len(l) >= g.cfg.EncodedMinLen && looksHex(l):
			return "hex-encoded-looking label"
		case len(l) >= g.cfg.EncodedMinLen && looksBase32(l):
			return "base32-encoded-looking label"
		case len(l) >= g.cfg.EntropyMinLen:
			if e := policy.LabelEntropy(l); e > g.cfg.MaxEntropy {
				return fmt.Sprintf("label entropy %.2f bits/byte (limit %.2f)", e, g.cfg.MaxEntropy)
			}
		}
	}
	return ""
}

// looksHex: only hex digits, with both decimal digits and letters.
func looksHex(l string) bool {
	var digits, letters int
	for i := 0; i < len(l); i++ {
		switch c := l[i]; {
		case '0' <= c && c <= '9':
			digits++
		case 'a' <= c && c <= 'f':
			letters++
		default:
			return false
		}
	}
	return digits > 0 && letters > 0
}

// looksBase32: only the RFC 4648 alphabet (a-z, 2-7), with at least two
// digits among letters, which words and names rarely have.
func looksBase32(l string) bool {
	var digits int
	for i := 0; i < len(l); i++ {
		switch c := l[i]; {
		case '2' <= c && c <= '7':
			digits++
		case 'a' <= c && c <= 'z':
		default:
			return false
		}
	}
	return digits >= 2 && digits < len(l)
}
