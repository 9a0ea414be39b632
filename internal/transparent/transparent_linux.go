// Package transparent opens the sockets of airlock's TPROXY datapath
// (docs/design.md §12): listeners with IP_TRANSPARENT, which take the
// connections and datagrams nftables' tproxy hands them whatever their
// destination, and the IP_PKTINFO control messages a transparent UDP
// socket reads a datagram's destination from and answers from it with.
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
//
// A TCP listener gets Go's keep-alive settings (probes after 15 s idle,
// every 15 s, 9 of them) on its own socket, which every connection it
// accepts inherits from the kernel: four system calls once instead of
// on each accepted connection.
func ListenConfig(on bool) *net.ListenConfig {
	return &net.ListenConfig{KeepAlive: -1, Control: func(network, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = control(int(fd), network, on)
		})
		if err == nil {
			err = serr
		}
		return err
	}}
}

// Keep-alive settings of TCP listeners, as Go sets them on each
// connection by default.
const (
	keepAliveIdle     = 15 // seconds
	keepAliveInterval = 15 // seconds
	keepAliveCount    = 9
)

func control(fd int, network string, on bool) error {
	if on {
		if err := unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_TRANSPARENT, 1); err != nil {
			return fmt.Errorf("setsockopt(IP_TRANSPARENT): %w (airlockd needs CAP_NET_ADMIN)", err)
		}
	}
	switch network {
	case "udp", "udp4":
		if on {
			if err := unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_PKTINFO, 1); err != nil {
				return fmt.Errorf("setsockopt(IP_PKTINFO): %w", err)
			}
		}
	case "tcp", "tcp4":
		for _, o := range []struct {
			level, opt, v int
			name          string
		}{
			{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1, "SO_KEEPALIVE"},
			{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, keepAliveIdle, "TCP_KEEPIDLE"},
			{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, keepAliveInterval, "TCP_KEEPINTVL"},
			{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, keepAliveCount, "TCP_KEEPCNT"},
		} {
			if err := unix.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
				return fmt.Errorf("setsockopt(%s): %w", o.name, err)
			}
		}
	}
	return nil
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
