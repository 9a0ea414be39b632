package dnsgate

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestPoolReusesLeastRecentlyUsedWhenFull(t *testing.T) {
	p, err := NewPool(netip.MustParsePrefix("198.18.0.0/30")) // two usable addresses
	if err != nil {
		t.Fatal(err)
	}
	a := p.Assign("a.test")
	b := p.Assign("b.test")
	if a == b || a.String() != "198.18.0.1" || b.String() != "198.18.0.2" {
		t.Fatalf("a=%s b=%s, want 198.18.0.1 and .2", a, b)
	}
	p.Assign("a.test") // a is now the most recently used
	c := p.Assign("c.test")
	if c != b {
		t.Errorf("c.test got %s, want b.test's %s (least recently used)", c, b)
	}
	if _, ok := p.Name(b); !ok {
		t.Fatal("reused address has no name")
	}
	if n, _ := p.Name(b); n != "c.test" {
		t.Errorf("%s maps to %q, want c.test", b, n)
	}
	if got := p.Assign("a.test"); got != a {
		t.Errorf("a.test moved from %s to %s", a, got)
	}
	if p.Len() != 2 {
		t.Errorf("Len = %d, want 2", p.Len())
	}
}

func TestNewPoolErrors(t *testing.T) {
	for _, s := range []string{"198.18.0.0/31", "2001:db8::/64"} {
		if _, err := NewPool(netip.MustParsePrefix(s)); err == nil {
			t.Errorf("NewPool(%s) succeeded", s)
		}
	}
}

func TestGuardReasons(t *testing.T) {
	tests := []struct {
		name, host, reason string
	}{
		{"long label", strings.Repeat("a", 51) + ".example.com", "label of 51 bytes"},
		{"hex", "deadbeef00112233.example.com", "hex-encoded"},
		{"base32", "mzxw6ytboi2dgnzr.example.com", "base32-encoded"},
		{"entropy", "q8f7z0x1m2n3b4v5c6k9j8h7.example.com", "entropy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, _ := NewGuard(GuardConfig{}, nil)
			trip, ok := g.Check(tt.host)
			if ok || trip == nil || !strings.Contains(trip.Reason, tt.reason) || trip.Domain != "example.com" {
				t.Fatalf("Check(%s) = %+v, %v; want a blocking trip for %q", tt.host, trip, ok, tt.reason)
			}
			if _, ok := g.Check("www.example.com"); ok {
				t.Error("a new name under the tripped domain was let through")
			}
			if _, ok := g.Check("www.other.com"); !ok {
				t.Error("a name under another domain was blocked")
			}
		})
	}
}

func TestGuardPassesOrdinaryNames(t *testing.T) {
	g, _ := NewGuard(GuardConfig{}, nil)
	for _, h := range []string{"www.example.com", "storage.googleapis.com", "generativelanguage.googleapis.com",
		"api.github.com", "objects.githubusercontent.com", "ec2-203-0-113-7.compute-1.amazonaws.com",
		"my-really-long-service-name-in-prod.example.com", "example.com"} {
		if trip, ok := g.Check(h); !ok || trip != nil {
			t.Errorf("Check(%s) = %+v, %v; want it to pass", h, trip, ok)
		}
	}
}

func TestGuardAlertOnlyAndBlockExpiry(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	g, _ := NewGuard(GuardConfig{AlertOnly: true}, clock)
	if trip, ok := g.Check("deadbeef00112233.example.com"); !ok || trip == nil || trip.Blocked {
		t.Errorf("alert-only: %+v, %v; want a trip that does not block", trip, ok)
	}

	g, _ = NewGuard(GuardConfig{MaxSubdomains: 2, BlockFor: time.Minute}, clock)
	g.Check("a.example.com")
	g.Check("b.example.com")
	if _, ok := g.Check("c.example.com"); ok {
		t.Fatal("third distinct name passed a cap of 2")
	}
	if _, ok := g.Check("a.example.com"); !ok {
		t.Error("a name resolved before the trip stopped working")
	}
	now = now.Add(2 * time.Minute)
	if _, ok := g.Check("d.example.com"); !ok {
		t.Error("still blocked after BlockFor and a new window")
	}
}

// TestGuardChecksNamesWithNothingUnderTheirDomain: labels under a
// registrable domain are checked, also where a wildcard rule of the public
// suffix list (*.kawasaki.jp) makes a label anyone's; a name that is
// itself a registrable domain is not (its queries go to its suffix's
// servers, and registrable names are often long or odd).
func TestGuardChecksNamesWithNothingUnderTheirDomain(t *testing.T) {
	for _, tt := range []struct{ host, domain, reason string }{
		{"mzxw6ytboi2dgnzr.kawasaki.jp", "kawasaki.jp", "base32-encoded"},
		{"deadbeef00112233.x.kawasaki.jp", "kawasaki.jp", "hex-encoded"},
		{"deadbeef00112233.example.com", "example.com", "hex-encoded"},
	} {
		g, _ := NewGuard(GuardConfig{}, nil)
		trip, ok := g.Check(tt.host)
		if ok || trip == nil || !strings.Contains(trip.Reason, tt.reason) || trip.Domain != tt.domain {
			t.Errorf("Check(%s) = %+v, %v; want a blocking trip under %s for %q", tt.host, trip, ok, tt.domain, tt.reason)
		}
	}
	for _, host := range []string{
		"thelongestdomainnameintheworldandthensomeandthensomemoreandmore.com",
		"llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch.co.uk",
		"bestwebhostingcompanyreviews.com",
		"4wheeldrive4x4parts.com",
		"deadbeef00112233.com",
	} {
		g, _ := NewGuard(GuardConfig{}, nil)
		if trip, ok := g.Check(host); !ok {
			t.Errorf("Check(%s) = %+v; an apex name is not checked", host, trip)
		}
	}
}

func TestGuardConfigValidation(t *testing.T) {
	for _, c := range []GuardConfig{{MaxLabelLen: 64}, {MaxSubdomains: -1}, {Window: -time.Second}, {MaxEntropy: -1}} {
		if _, err := NewGuard(c, nil); err == nil {
			t.Errorf("NewGuard(%+v) succeeded", c)
		}
	}
}

func TestGuardCountsUnderICANNDomains(t *testing.T) {
	tests := []struct{ name, want string }{
		{"a.b.example.com", "example.com"},
		{"example.com", "example.com"},
		{"x.example.co.uk", "example.co.uk"},
		{"data-carrier.github.io", "github.io"},
		{"a.b.storage.googleapis.com", "googleapis.com"},
		{"test", "test"},
		{"co.uk", "co.uk"},
		// *.kawasaki.jp makes each x.kawasaki.jp a public suffix: anyone's
		// label, so names under it count under kawasaki.jp; not so under
		// the exception !city.kawasaki.jp.
		{"a.b.x.kawasaki.jp", "kawasaki.jp"},
		{"b.x.kawasaki.jp", "kawasaki.jp"},
		{"x.kawasaki.jp", "kawasaki.jp"},
		{"kawasaki.jp", "kawasaki.jp"},
		{"a.b.city.kawasaki.jp", "city.kawasaki.jp"},
		{"a.b.ck", "b.ck"},
	}
	for _, tt := range tests {
		if got := icannDomain(tt.name); got != tt.want {
			t.Errorf("icannDomain(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
	// Made-up names under a private suffix share one quota and get the
	// label checks.
	g, _ := NewGuard(GuardConfig{MaxSubdomains: 2}, nil)
	g.Check("one.github.io")
	g.Check("two.github.io")
	if _, ok := g.Check("three.github.io"); ok {
		t.Error("a third name under github.io passed a cap of 2")
	}
	g2, _ := NewGuard(GuardConfig{}, nil)
	if trip, ok := g2.Check("deadbeef00112233.github.io"); ok || trip == nil {
		t.Error("a hex label under a private suffix passed the label checks")
	}
}
