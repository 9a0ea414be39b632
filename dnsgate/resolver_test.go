package dnsgate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/dnsgate/dnsgatetest"
)

func TestResolverCachesAndGuards(t *testing.T) {
	up := &dnsgatetest.Server{A: map[string]string{"allowed.test": "203.0.113.10", "a.example.com": "203.0.113.11", "b.example.com": "203.0.113.12"}}
	addr, err := up.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	u, _ := NewUpstream([]string{addr}, time.Second)
	now := time.Unix(1000, 0)
	g, _ := NewGuard(GuardConfig{MaxSubdomains: 1}, func() time.Time { return now })
	r := NewResolver(u, g, func() time.Time { return now })
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		a, err := r.LookupA(ctx, "allowed.test")
		if err != nil || len(a) != 1 || a[0].String() != "203.0.113.10" {
			t.Fatalf("LookupA = %v, %v", a, err)
		}
	}
	if n := len(up.Queries()); n != 1 {
		t.Errorf("3 lookups sent %d upstream queries, want 1 (cached)", n)
	}
	now = now.Add(61 * time.Second) // past the 60 s TTL
	r.LookupA(ctx, "allowed.test")
	if n := len(up.Queries()); n != 2 {
		t.Errorf("after the TTL: %d upstream queries, want 2", n)
	}
	// The guard stands before the upstream: a second distinct name under
	// example.com trips the cap of 1 and never goes out.
	if _, err := r.LookupA(ctx, "a.example.com"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.LookupA(ctx, "b.example.com"); err == nil || !strings.Contains(err.Error(), "exfiltration guard") {
		t.Errorf("second name: %v, want the guard's refusal", err)
	}
	if up.Saw("b.example.com") {
		t.Error("a name the guard refused reached the upstream")
	}
	if _, err := r.LookupA(ctx, "missing.test"); err == nil {
		t.Error("NXDOMAIN resolved")
	}
}
