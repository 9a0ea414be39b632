// Package transparent opens the sockets of airlock's TPROXY datapath
// (docs/design.md §12): listeners with IP_TRANSPARENT, which take the
// connections and datagrams nftables' tproxy hands them whatever their
// destination, and the IP_PKTINFO control messages a transparent UDP
// socket reads a datagram's destination from and answers from it with;
// and the transparent sockets airlockd dials a member's port with.
package transparent

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ListenConfig returns a listen configuration that sets IP_TRANSPARENT on
// the socket when on is true, and IP_PKTINFO too on a UDP one (see
// Dst). Setting IP_TRANSPARENT needs CAP_NET_ADMIN.
func ListenConfig(on bool) *net.ListenConfig {
	if !on {
		return &net.ListenConfig{}
	}
	return &net.ListenConfig{Control: control}
}

// Dialer returns a dialer whose TCP sockets are bound to local (any port)
// with IP_TRANSPARENT, for airlockd's connections to a sandbox member (an
// exposure, docs/design.md §12): the member's replies are diverted like
// all TCP from a bridge, and the sink's tproxy rule hands them to the
// established transparent socket they belong to, which is this one. An
// ordinary host socket gets none of them (the sink resets them).
func Dialer(local netip.Addr) *net.Dialer {
	return &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0)), Control: control}
}

// control sets IP_TRANSPARENT, and IP_PKTINFO on a UDP socket.
func control(network, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
		if serr != nil {
			serr = fmt.Errorf("setsockopt(IP_TRANSPARENT): %w (airlockd needs CAP_NET_ADMIN)", serr)
			return
		}
		if network == "udp" || network == "udp4" {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_PKTINFO, 1); serr != nil {
				serr = fmt.Errorf("setsockopt(IP_PKTINFO): %w", serr)
			}
		}
	})
	if err == nil {
		err = serr
	}
	return err
}

// Listen binds a TCP listener on addr, transparent if on.
func Listen(network string, addr netip.AddrPort, on bool) (net.Listener, error) {
	return ListenConfig(on).Listen(context.Background(), network, addr.String())
}

// ListenPacket binds a UDP socket on addr, transparent if on.
func ListenPacket(network string, addr netip.AddrPort, on bool) (net.PacketConn, error) {
	return ListenConfig(on).ListenPacket(context.Background(), network, addr.String())
}

// OOBSize is the room a datagram's control messages need for Dst, and a
// reply's for PutSrc.
var OOBSize = unix.CmsgSpace(unix.SizeofInet4Pktinfo)

// Dst returns the destination address of a datagram read on a socket with
// IP_PKTINFO, from its control messages: where the member sent it, which
// tproxy leaves as it was. It reports false when oob has none.
func Dst(oob []byte) (netip.Addr, bool) {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return netip.Addr{}, false
		}
		if h.Level == unix.SOL_IP && h.Type == unix.IP_PKTINFO && l >= unix.CmsgLen(unix.SizeofInet4Pktinfo) {
			data := oob[unix.CmsgLen(0):l]
			// struct in_pktinfo { int ifindex; in_addr spec_dst; in_addr addr; }
			return netip.AddrFrom4([4]byte(data[8:12])), true
		}
		next := unix.CmsgSpace(l - unix.CmsgLen(0))
		if next > len(oob) {
			break
		}
		oob = oob[next:]
	}
	return netip.Addr{}, false
}

// PutSrc writes into buf, which has OOBSize bytes at least, the control
// message that sends a datagram from src, and returns it. On a
// transparent socket src need not be an address of this host.
func PutSrc(buf []byte, src netip.Addr) []byte {
	buf = buf[:OOBSize]
	clear(buf)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&buf[0]))
	h.Level, h.Type = unix.SOL_IP, unix.IP_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
	data := buf[unix.CmsgLen(0):]
	binary.NativeEndian.PutUint32(data[0:4], 0) // any interface
	a := src.As4()
	copy(data[4:8], a[:]) // spec_dst: the source address
	return buf
}
