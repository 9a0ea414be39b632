package netns

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
)

// maxLinkName is the longest Linux interface name (IFNAMSIZ less the NUL).
const maxLinkName = 15

// BridgeName returns the bridge of sandbox name: "al-NAME", shortened with a
// hash of the full name when that would not fit Linux's 15 characters.
func BridgeName(sandbox string) string {
	return linkName(BridgePrefix, sandbox)
}

// BridgePrefix starts the name of every sandbox bridge.
const BridgePrefix = "al-"

func linkName(prefix, name string) string {
	if len(prefix)+len(name) <= maxLinkName {
		return prefix + name
	}
	sum := sha256.Sum256([]byte(name))
	h := hex.EncodeToString(sum[:])[:5]
	keep := maxLinkName - len(prefix) - len(h)
	return prefix + name[:keep] + h
}

// Network is a sandbox network: its bridge and subnet, and the divert pair
// its members' diverted packets go through (sink_linux.go).
type Network struct {
	Bridge  string
	Subnet  netip.Prefix // masked
	Gateway netip.Addr   // the bridge's address: the subnet's first host
	Divert  string       // the end of the divert pair the bridge's netdev rule writes to
	Sink    string       // the end where diverted packets arrive, for tproxy
}

// NewNetwork returns the network of sandbox on subnet, which must be IPv4
// with room for at least a gateway and two members.
func NewNetwork(sandbox string, subnet netip.Prefix) (Network, error) {
	if !subnet.Addr().Is4() {
		return Network{}, fmt.Errorf("sandbox %s: subnet %s is not IPv4 (sandboxes are IPv4-only)", sandbox, subnet)
	}
	if subnet.Bits() > 29 {
		return Network{}, fmt.Errorf("sandbox %s: subnet %s is too small: want /29 or larger", sandbox, subnet)
	}
	if subnet.Masked() != subnet {
		return Network{}, fmt.Errorf("sandbox %s: subnet %s has host bits set; did you mean %s?", sandbox, subnet, subnet.Masked())
	}
	br := BridgeName(sandbox)
	return Network{Bridge: br, Subnet: subnet, Gateway: subnet.Addr().Next(), Divert: DivertName(br), Sink: SinkName(br)}, nil
}

// Ensure creates the bridge and its divert pair, or repairs what a crash
// or an older version left: it is a bridge with a fixed MAC address, it
// has exactly the gateway address, IPv6 is off on it, reverse-path
// filtering is strict, and it is up; the divert pair is as ensureSink
// leaves it. It returns the divert end's interface index, which the
// bridge's netdev rule (tproxy.EnsureDivert) writes to.
func (n Network) Ensure(h *netlink.Handle) (divertIndex int, err error) {
	if err := n.ensureBridge(h); err != nil {
		return 0, err
	}
	return n.ensureSink(h, bridgeMAC(n.Bridge))
}

func (n Network) ensureBridge(h *netlink.Handle) error {
	link, err := h.LinkByName(n.Bridge)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		la := netlink.NewLinkAttrs()
		la.Name = n.Bridge
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
			return fmt.Errorf("create bridge %s: %w", n.Bridge, err)
		}
		if link, err = h.LinkByName(n.Bridge); err != nil {
			return fmt.Errorf("find bridge %s: %w", n.Bridge, err)
		}
	case err != nil:
		return fmt.Errorf("find bridge %s: %w", n.Bridge, err)
	case link.Type() != "bridge":
		return fmt.Errorf("link %s exists and is a %s, not a bridge; remove it or rename the sandbox", n.Bridge, link.Type())
	}
	// IPv6 off before the link comes up, so it never gets a link-local
	// address.
	if err := writeSysctl(filepath.Join("/proc/sys/net/ipv6/conf", n.Bridge, "disable_ipv6"), "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("disable IPv6 on %s: %w", n.Bridge, err)
	}
	if err := writeSysctl(filepath.Join("/proc/sys/net/ipv4/conf", n.Bridge, "rp_filter"), "1"); err != nil {
		return fmt.Errorf("set rp_filter on %s: %w", n.Bridge, err)
	}
	if mac := bridgeMAC(n.Bridge); link.Attrs().HardwareAddr.String() != mac.String() {
		if err := h.LinkSetHardwareAddr(link, mac); err != nil {
			return fmt.Errorf("set address %s on %s: %w", mac, n.Bridge, err)
		}
	}
	want := &netlink.Addr{IPNet: &net.IPNet{IP: n.Gateway.AsSlice(), Mask: net.CIDRMask(n.Subnet.Bits(), 32)}}
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list addresses of %s: %w", n.Bridge, err)
	}
	for _, a := range addrs {
		if a.IPNet.String() != want.IPNet.String() {
			if err := h.AddrDel(link, &a); err != nil {
				return fmt.Errorf("remove stale address %s from %s: %w", a.IPNet, n.Bridge, err)
			}
		}
	}
	if err := h.AddrReplace(link, want); err != nil {
		return fmt.Errorf("set address %s on %s: %w", want.IPNet, n.Bridge, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("bring up %s: %w", n.Bridge, err)
	}
	return nil
}

// DeleteBridge removes a sandbox bridge by name, and then its divert pair;
// missing ones are not an error. Members' veths attached to the bridge go
// with it.
func DeleteBridge(h *netlink.Handle, name string) error {
	if err := deleteLink(h, name); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	if !strings.HasPrefix(name, BridgePrefix) {
		return nil
	}
	// Deleting one end of a veth pair deletes both.
	return deleteLink(h, DivertName(name))
}

// LookupNetwork reads a sandbox's network off its bridge: the subnet and
// gateway are the bridge's IPv4 address. It is how `airlock run` finds the
// sandbox airlockd set up.
func LookupNetwork(h *netlink.Handle, sandbox string) (Network, error) {
	name := BridgeName(sandbox)
	link, err := h.LinkByName(name)
	if err != nil {
		return Network{}, fmt.Errorf("sandbox %s has no bridge %s: is airlockd running with this sandbox in its config? (%w)", sandbox, name, err)
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 {
		return Network{}, fmt.Errorf("bridge %s of sandbox %s has no IPv4 address: is airlockd running?", name, sandbox)
	}
	gw, _ := netip.AddrFromSlice(addrs[0].IP.To4())
	bits, _ := addrs[0].Mask.Size()
	return Network{Bridge: name, Subnet: netip.PrefixFrom(gw, bits).Masked(), Gateway: gw,
		Divert: DivertName(name), Sink: SinkName(name)}, nil
}

func writeSysctl(path, value string) error {
	return os.WriteFile(path, []byte(value), 0o644)
}
