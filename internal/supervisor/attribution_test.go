package supervisor

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/netns"
)

// TestAttribution: the gateway is the host, a live lease names its
// member, a stale lease or an address in Docker's range (with no Docker
// connection) names nobody.
func TestAttribution(t *testing.T) {
	dir := t.TempDir()
	lease := func(addr, source string, live bool) {
		t.Helper()
		f, err := os.Create(filepath.Join(dir, addr))
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(`{"source": "` + source + `", "pid": 1}`)
		if live {
			if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
		} else {
			f.Close()
		}
	}
	lease("10.88.0.2", "mcp:github", true)
	lease("10.88.0.3", "gone", false)
	lease("10.88.0.200", "not a lease", true) // in Docker's range: never read
	a := attribution{sandbox: "sb", gateway: netip.MustParseAddr("10.88.0.1"), leases: dir, dockers: netip.MustParsePrefix("10.88.0.128/25")}
	cache, err := netns.NewLeaseCache(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	cached := a
	cached.cache = cache
	for _, a := range []attribution{a, cached} {
		// Twice: the second from memory where there is a cache.
		for range 2 {
			for addr, want := range map[string]string{"10.88.0.1": "host", "10.88.0.2": "mcp:github", "10.88.0.3": "", "10.88.0.4": "", "10.88.0.200": ""} {
				if got := a.member(netip.MustParseAddr(addr)); got != want {
					t.Errorf("member(%s) = %q, want %q (cached: %v)", addr, got, want, a.cache != nil)
				}
			}
		}
	}
}

// BenchmarkAttribution names the member behind one connection or DNS
// query from an `airlock run` member's address: by reading its lease
// file, or from the cache airlockd keeps.
func BenchmarkAttribution(b *testing.B) {
	dir := b.TempDir()
	f, err := os.Create(filepath.Join(dir, "10.88.0.2"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	f.WriteString(`{"source": "agent", "pid": 1}`)
	unix.Flock(int(f.Fd()), unix.LOCK_EX)
	cache, err := netns.NewLeaseCache(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer cache.Close()
	addr := netip.MustParseAddr("10.88.0.2")
	for _, bc := range []struct {
		name  string
		cache *netns.LeaseCache
	}{{"file", nil}, {"cache", cache}} {
		b.Run(bc.name, func(b *testing.B) {
			a := attribution{sandbox: "sb", gateway: netip.MustParseAddr("10.88.0.1"), leases: dir, cache: bc.cache, dockers: netip.MustParsePrefix("10.88.0.128/25")}
			b.ReportAllocs()
			for b.Loop() {
				if a.member(addr) != "agent" {
					b.Fatal("wrong member")
				}
			}
		})
	}
}
