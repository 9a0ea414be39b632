package netns

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestSetBandwidth: a cap puts a token bucket at the root of the bridge
// (towards members) and of the divert end (from members) with the rate
// asked for, as the kernel reports it; the same cap again is no error,
// another replaces the rate, and 0 lifts the cap, leaving a root qdisc
// airlock did not put there alone.
func TestSetBandwidth(t *testing.T) {
	inNewNetns(t, func(h *netlink.Handle) {
		n, err := NewNetwork("bw", netip.MustParsePrefix("10.88.8.0/24"))
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := n.Ensure(h); err != nil {
			t.Errorf("Ensure: %v", err)
			return
		}
		// roots returns the kernel's root qdisc of the bridge and of the
		// divert end (nil for none).
		roots := func() []netlink.Qdisc {
			var out []netlink.Qdisc
			for _, name := range []string{n.Bridge, n.Divert} {
				link, err := h.LinkByName(name)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				qs, err := h.QdiscList(link)
				if err != nil {
					t.Fatalf("qdiscs of %s: %v", name, err)
				}
				var root netlink.Qdisc
				for _, q := range qs {
					if q.Attrs().Parent == netlink.HANDLE_ROOT {
						root = q
					}
				}
				out = append(out, root)
			}
			return out
		}
		wantRate := func(mbps int) {
			t.Helper()
			for i, q := range roots() {
				tbf, ok := q.(*netlink.Tbf)
				if !ok {
					t.Errorf("link %d: root qdisc %v, want tbf", i, q)
					continue
				}
				if tbf.Rate != uint64(mbps)*125000 {
					t.Errorf("link %d: tbf rate %d bytes/s, want %d (%d Mbit/s)", i, tbf.Rate, mbps*125000, mbps)
				}
				if tbf.Limit < 32<<10 || tbf.Buffer == 0 {
					t.Errorf("link %d: tbf limit %d bytes, buffer %d ticks: want a queue and a bucket", i, tbf.Limit, tbf.Buffer)
				}
			}
			if down, up, err := n.Bandwidth(h); err != nil || down != mbps || up != mbps {
				t.Errorf("Bandwidth() = %d, %d, %v; want %d both ways", down, up, err, mbps)
			}
		}

		if err := n.SetBandwidth(h, 20); err != nil {
			t.Fatalf("SetBandwidth(20): %v", err)
		}
		wantRate(20)
		if err := n.SetBandwidth(h, 20); err != nil {
			t.Fatalf("SetBandwidth(20) again: %v", err)
		}
		wantRate(20)
		if err := n.SetBandwidth(h, 5); err != nil {
			t.Fatalf("SetBandwidth(5): %v", err)
		}
		wantRate(5)
		if err := n.SetBandwidth(h, 0); err != nil {
			t.Fatalf("SetBandwidth(0): %v", err)
		}
		for i, q := range roots() {
			if _, ok := q.(*netlink.Tbf); ok {
				t.Errorf("link %d: tbf left after the cap was lifted", i)
			}
		}
		if down, up, err := n.Bandwidth(h); err != nil || down != 0 || up != 0 {
			t.Errorf("Bandwidth() after lifting = %d, %d, %v", down, up, err)
		}

		// A root qdisc someone else put on the bridge is not airlock's to
		// remove.
		br, _ := h.LinkByName(n.Bridge)
		other := &netlink.Tbf{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: br.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
			Rate: 1 << 20, Limit: 1 << 20, Buffer: netlink.Xmittime(1<<20, 1<<16)}
		if err := h.QdiscAdd(other); err != nil {
			t.Fatalf("add a foreign tbf: %v", err)
		}
		if err := n.SetBandwidth(h, 0); err != nil {
			t.Fatalf("SetBandwidth(0) with a foreign root: %v", err)
		}
		if q := roots()[0]; q == nil || q.Attrs().Handle != netlink.MakeHandle(1, 0) {
			t.Errorf("lifting the cap removed a qdisc airlock did not add: root is now %v", q)
		}
		if err := n.SetBandwidth(h, -1); err == nil {
			t.Error("SetBandwidth(-1) accepted")
		}
	})
}
