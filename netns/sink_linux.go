package netns

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The TPROXY datapath (docs/design.md §12). With br_netfilter loaded, a
// socket that nftables' tproxy assigns while the bridge runs the IPv4
// hooks is orphaned before TCP sees the packet. So the frames a sandbox
// bridge passes up to the host (TCP, and UDP to port 53) are sent on, by a
// netdev ingress rule on the bridge, into a veth pair of the host that is
// on no bridge: the "divert" end is written to, and the packets arrive on
// the "sink" end as an ordinary receive, where tproxy works as on any
// router. The sink carries the bridge's MAC, so the frames are for the
// host there; a policy route sends packets with DivertMark to the local
// table; src_valid_mark and a route for the subnet through the sink let
// them pass reverse-path filtering in any mode.

// DivertPrefix and SinkPrefix start the names of the two ends of every
// sandbox's divert pair: the bridge's name with "al-" made "ald" and
// "als" ("al-myapp": "aldmyapp", "alsmyapp").
const (
	DivertPrefix = "ald"
	SinkPrefix   = "als"
)

// DivertMark is the packet mark bit airlock's tproxy rules set on diverted
// packets, and DivertTable the routing table a packet with it is looked up
// in: every address is local there, so the packet reaches the proxy's or
// the gate's transparent socket. DivertRulePriority is the ip rule's
// place, ahead of the main table. Chosen not to collide with the marks of
// Kubernetes (0x4000, 0x8000), Cilium (0x0f00), Istio (0x539), Weave
// (0x20000, 0x40000) or Tailscale (0xff0000).
const (
	DivertMark         uint32 = 0x2000
	DivertTable               = 2588
	DivertRulePriority        = 2588
)

// DivertName returns the end of a bridge's divert pair that its netdev rule
// writes to.
func DivertName(bridge string) string { return DivertPrefix + strings.TrimPrefix(bridge, BridgePrefix) }

// SinkName returns the end of a bridge's divert pair where diverted
// packets arrive.
func SinkName(bridge string) string { return SinkPrefix + strings.TrimPrefix(bridge, BridgePrefix) }

// bridgeMAC is the address a sandbox bridge is given: locally
// administered, unicast, derived from the bridge's name. A Linux bridge
// without an address of its own takes its lowest port's and changes it as
// ports come and go; the sink must carry the bridge's, so it is fixed.
func bridgeMAC(bridge string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("airlock bridge " + bridge))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&0xfc | 0x02
	return mac
}

// ensureSink creates the divert pair of n, or repairs it: IPv6 off on
// both ends, the sink carrying the bridge's MAC with src_valid_mark on,
// both up, and the subnet routed through the sink in DivertTable. It
// returns the divert end's interface index, which the netdev rule writes
// to.
func (n Network) ensureSink(h *netlink.Handle, mac net.HardwareAddr) (int, error) {
	divert, err := h.LinkByName(n.Divert)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		// A lone sink end (its pair half-deleted) is in the way.
		if err := deleteLink(h, n.Sink); err != nil {
			return 0, fmt.Errorf("remove stale link: %w", err)
		}
		la := netlink.NewLinkAttrs()
		la.Name = n.Divert
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: n.Sink}); err != nil {
			return 0, fmt.Errorf("create divert pair %s/%s: %w", n.Divert, n.Sink, err)
		}
		if divert, err = h.LinkByName(n.Divert); err != nil {
			return 0, fmt.Errorf("find %s: %w", n.Divert, err)
		}
	case err != nil:
		return 0, fmt.Errorf("find %s: %w", n.Divert, err)
	case divert.Type() != "veth":
		return 0, fmt.Errorf("link %s exists and is a %s, not airlock's divert veth; remove it", n.Divert, divert.Type())
	}
	sink, err := h.LinkByName(n.Sink)
	if err != nil {
		return 0, fmt.Errorf("find %s (the peer of %s): %w; remove %s and restart airlockd", n.Sink, n.Divert, err, n.Divert)
	}
	if sink.Type() != "veth" || sink.Attrs().ParentIndex != divert.Attrs().Index {
		return 0, fmt.Errorf("link %s is not the peer of %s; remove both and restart airlockd", n.Sink, n.Divert)
	}
	for _, l := range []string{n.Divert, n.Sink} {
		if err := writeSysctl(filepath.Join("/proc/sys/net/ipv6/conf", l, "disable_ipv6"), "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("disable IPv6 on %s: %w", l, err)
		}
	}
	if err := writeSysctl(filepath.Join("/proc/sys/net/ipv4/conf", n.Sink, "src_valid_mark"), "1"); err != nil {
		return 0, fmt.Errorf("set src_valid_mark on %s: %w", n.Sink, err)
	}
	if sink.Attrs().HardwareAddr.String() != mac.String() {
		if err := h.LinkSetHardwareAddr(sink, mac); err != nil {
			return 0, fmt.Errorf("give %s the bridge's address %s: %w", n.Sink, mac, err)
		}
	}
	for _, l := range []netlink.Link{divert, sink} {
		if err := h.LinkSetUp(l); err != nil {
			return 0, fmt.Errorf("bring up %s: %w", l.Attrs().Name, err)
		}
	}
	route := &netlink.Route{LinkIndex: sink.Attrs().Index, Dst: prefixNet(n.Subnet), Table: DivertTable, Scope: netlink.SCOPE_LINK}
	if err := h.RouteReplace(route); err != nil {
		return 0, fmt.Errorf("route %s through %s in table %d: %w", n.Subnet, n.Sink, DivertTable, err)
	}
	return divert.Attrs().Index, nil
}

// EnsureDivertRouting installs what every sandbox's diverted packets share:
// the ip rule that looks packets with DivertMark up in DivertTable, and
// the route there that makes every address local. It is idempotent.
func EnsureDivertRouting(h *netlink.Handle) error {
	rules, err := h.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list ip rules: %w", err)
	}
	found := false
	for _, r := range rules {
		if r.Table == DivertTable && r.Mark == DivertMark && r.Mask != nil && *r.Mask == DivertMark && r.Priority == DivertRulePriority {
			found = true
		}
	}
	if !found {
		if err := h.RuleAdd(divertRule()); err != nil {
			return fmt.Errorf("add ip rule fwmark %#x lookup %d: %w", DivertMark, DivertTable, err)
		}
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	local := &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: prefixNet(netip.MustParsePrefix("0.0.0.0/0")),
		Table: DivertTable, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST}
	if err := h.RouteReplace(local); err != nil {
		return fmt.Errorf("add route local 0.0.0.0/0 dev lo table %d: %w", DivertTable, err)
	}
	return nil
}

// DeleteDivertRouting removes the ip rule and every route of DivertTable.
// Missing ones are not an error.
func DeleteDivertRouting(h *netlink.Handle) error {
	var errs []error
	for {
		err := h.RuleDel(divertRule())
		if err != nil {
			if !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("delete ip rule fwmark %#x lookup %d: %w", DivertMark, DivertTable, err))
			}
			break
		}
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: DivertTable}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("list routes of table %d: %w", DivertTable, err))...)
	}
	for _, r := range routes {
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s from table %d: %w", r.Dst, DivertTable, err))
		}
	}
	return errors.Join(errs...)
}

func divertRule() *netlink.Rule {
	r := netlink.NewRule()
	r.Family = unix.AF_INET
	r.Mark = DivertMark
	mask := DivertMark
	r.Mask = &mask
	r.Table = DivertTable
	r.Priority = DivertRulePriority
	return r
}

// deleteLink removes a link by name; a missing one is not an error.
func deleteLink(h *netlink.Handle, name string) error {
	link, err := h.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := h.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
