package netns

import (
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/airlockhq/airlock/internal/testenv"
)

func TestDivertNames(t *testing.T) {
	for _, sb := range []string{"default", "abcdefghijkl", "abcdefghijklm", strings.Repeat("z", 31)} {
		br := BridgeName(sb)
		d, s := DivertName(br), SinkName(br)
		if len(d) != len(br) || len(s) != len(br) || len(d) > 15 || d == s {
			t.Errorf("sandbox %q: bridge %q, divert %q, sink %q: want distinct names as long as the bridge's", sb, br, d, s)
		}
		if !strings.HasPrefix(d, DivertPrefix) || !strings.HasPrefix(s, SinkPrefix) || strings.HasPrefix(d, BridgePrefix) || strings.HasPrefix(s, BridgePrefix) || strings.HasPrefix(s, MemberVethPrefix) {
			t.Errorf("sandbox %q: divert %q and sink %q must start with their own prefixes only", sb, d, s)
		}
	}
	if DivertName(BridgeName("a")) == DivertName(BridgeName("b")) {
		t.Error("two sandboxes share a divert name")
	}
}

func TestBridgeMAC(t *testing.T) {
	a, b := bridgeMAC("al-a"), bridgeMAC("al-b")
	if a.String() == b.String() || a.String() != bridgeMAC("al-a").String() {
		t.Errorf("bridge MACs %s, %s: want stable and distinct", a, b)
	}
	if a[0]&1 != 0 || a[0]&2 == 0 {
		t.Errorf("bridge MAC %s: want unicast, locally administered", a)
	}
}

// inNewNetns runs fn on a locked thread inside a network namespace of its
// own, with a netlink handle there; /proc/sys/net is that namespace's too.
func inNewNetns(t *testing.T, fn func(h *netlink.Handle)) {
	t.Helper()
	testenv.Privileged(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		ns, err := vnetns.New()
		if err != nil {
			t.Errorf("new netns: %v", err)
			return
		}
		defer ns.Close()
		h, err := netlink.NewHandle()
		if err != nil {
			t.Errorf("netlink: %v", err)
			return
		}
		defer h.Close()
		fn(h)
	}()
	<-done
}

func sysctl(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc/sys/net", path))
	if err != nil {
		t.Errorf("read %s: %v", path, err)
	}
	return strings.TrimSpace(string(b))
}

// TestEnsureBuildsTheDivertPath: Ensure makes the bridge with a fixed MAC
// and its divert pair, the sink carrying that MAC with src_valid_mark on
// and IPv6 off, the subnet routed through the sink in DivertTable; a
// second Ensure changes nothing; EnsureDivertRouting adds the ip rule and
// the local route once; DeleteBridge takes the pair along, and
// DeleteDivertRouting leaves no rule or route.
func TestEnsureBuildsTheDivertPath(t *testing.T) {
	inNewNetns(t, func(h *netlink.Handle) {
		n, err := NewNetwork("dv", netip.MustParsePrefix("10.88.7.0/24"))
		if err != nil {
			t.Error(err)
			return
		}
		idx, err := n.Ensure(h)
		if err != nil {
			t.Errorf("Ensure: %v", err)
			return
		}
		br, err1 := h.LinkByName(n.Bridge)
		div, err2 := h.LinkByName(n.Divert)
		sink, err3 := h.LinkByName(n.Sink)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Errorf("links: %v %v %v", err1, err2, err3)
			return
		}
		if div.Attrs().Index != idx || sink.Attrs().ParentIndex != idx {
			t.Errorf("Ensure returned index %d; divert %d, sink's peer %d", idx, div.Attrs().Index, sink.Attrs().ParentIndex)
		}
		if got, want := sink.Attrs().HardwareAddr.String(), br.Attrs().HardwareAddr.String(); got != want || want != bridgeMAC(n.Bridge).String() {
			t.Errorf("sink MAC %s, bridge MAC %s, want both %s", got, want, bridgeMAC(n.Bridge))
		}
		if sink.Attrs().MasterIndex != 0 || div.Attrs().MasterIndex != 0 {
			t.Error("a divert end is a bridge port")
		}
		if v := sysctl(t, "ipv4/conf/"+n.Sink+"/src_valid_mark"); v != "1" {
			t.Errorf("src_valid_mark on the sink = %s", v)
		}
		for _, l := range []string{n.Bridge, n.Divert, n.Sink} {
			if v := sysctl(t, "ipv6/conf/"+l+"/disable_ipv6"); v != "1" {
				t.Errorf("IPv6 on %s: disable_ipv6 = %s", l, v)
			}
		}
		routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: DivertTable}, netlink.RT_FILTER_TABLE)
		if err != nil || len(routes) != 1 || routes[0].Dst.String() != "10.88.7.0/24" || routes[0].LinkIndex != sink.Attrs().Index {
			t.Errorf("table %d: %v %v; want 10.88.7.0/24 dev %s", DivertTable, routes, err, n.Sink)
		}
		// Idempotent, also with the bridge's MAC changed behind its back.
		h.LinkSetHardwareAddr(br, []byte{2, 0, 0, 0, 0, 9})
		if again, err := n.Ensure(h); err != nil || again != idx {
			t.Errorf("second Ensure: %d %v, want %d", again, err, idx)
		}
		if br, _ = h.LinkByName(n.Bridge); br.Attrs().HardwareAddr.String() != bridgeMAC(n.Bridge).String() {
			t.Errorf("Ensure left the bridge's MAC at %s", br.Attrs().HardwareAddr)
		}

		for range 2 {
			if err := EnsureDivertRouting(h); err != nil {
				t.Errorf("EnsureDivertRouting: %v", err)
			}
		}
		rules, _ := h.RuleList(netlink.FAMILY_V4)
		found := 0
		for _, r := range rules {
			if r.Table == DivertTable {
				found++
				if r.Mark != DivertMark || r.Mask == nil || *r.Mask != DivertMark {
					t.Errorf("ip rule %v: want fwmark %#x/%#x", r, DivertMark, DivertMark)
				}
			}
		}
		if found != 1 {
			t.Errorf("%d ip rules look up table %d, want 1", found, DivertTable)
		}
		// What the table does: a marked packet to any address is local.
		r, err := h.RouteGetWithOptions(netip.MustParseAddr("203.0.113.10").AsSlice(), &netlink.RouteGetOptions{Mark: DivertMark})
		if err != nil || len(r) != 1 || r[0].Type != 2 /* RTN_LOCAL */ {
			t.Errorf("route get 203.0.113.10 mark %#x: %+v %v; want local", DivertMark, r, err)
		}

		if err := DeleteBridge(h, n.Bridge); err != nil {
			t.Errorf("DeleteBridge: %v", err)
		}
		for _, l := range []string{n.Bridge, n.Divert, n.Sink} {
			if _, err := h.LinkByName(l); err == nil {
				t.Errorf("%s left after DeleteBridge", l)
			}
		}
		if err := DeleteDivertRouting(h); err != nil {
			t.Errorf("DeleteDivertRouting: %v", err)
		}
		rules, _ = h.RuleList(netlink.FAMILY_V4)
		for _, r := range rules {
			if r.Table == DivertTable {
				t.Errorf("ip rule left: %v", r)
			}
		}
		if routes, _ := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: DivertTable}, netlink.RT_FILTER_TABLE); len(routes) != 0 {
			t.Errorf("routes left in table %d: %v", DivertTable, routes)
		}
	})
}
