// Package transparent opens the sockets of airlock's TPROXY datapath
// (docs/design.md §12): listeners with IP_TRANSPARENT, which take the
// connections and datagrams nftables' tproxy hands them whatever their
// destination, and the IP_PKTINFO control messages a transparent UDP
// socket reads a datagram's destination from and answers from it with;
// and the transparent sockets airlockd dials a member's port with.
package transparent

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/net/bpf"
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
		return rawControl(rc, network, on)
	}}
}

// Dialer returns a dialer whose TCP sockets are bound to local (any port)
// with IP_TRANSPARENT, for airlockd's connections to a sandbox member (an
// exposure, docs/design.md §12): the member's replies are diverted like
// all TCP from a bridge, and the sink's tproxy rule hands them to the
// established transparent socket they belong to, which is this one. An
// ordinary host socket gets none of them (the sink resets them).
func Dialer(local netip.Addr) *net.Dialer {
	return &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0)), Control: func(network, _ string, rc syscall.RawConn) error {
		return rawControl(rc, network, true)
	}}
}

func rawControl(rc syscall.RawConn, network string, on bool) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = control(int(fd), network, on)
	})
	if err == nil {
		err = serr
	}
	return err
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

// ListenPackets binds n UDP sockets on addr, transparent if on, so that n
// readers each have a socket of their own (n < 1 counts as 1). With n = 1
// it is ListenPacket. With more, the sockets share addr with SO_REUSEPORT,
// and a classic BPF program sends each datagram to the socket of the CPU
// it arrives on, modulo n.
//
// SO_REUSEPORT would let any process of the same user (root, for
// airlockd) bind addr too and take a share of the datagrams. So a group
// that another process's socket is part of once the n are bound is
// closed again with EADDRINUSE, and the BPF program picks only among the
// group's first n sockets: a socket that joins later gets no datagram the
// kernel delivers to addr (one that nftables' tproxy hands over is placed
// by the kernel without the program, by a hash over all the group).
func ListenPackets(network string, addr netip.AddrPort, on bool, n int) ([]*net.UDPConn, error) {
	if n <= 1 {
		pc, err := ListenPacket(network, addr, on)
		if err != nil {
			return nil, err
		}
		return []*net.UDPConn{pc.(*net.UDPConn)}, nil
	}
	lc := ListenConfig(on)
	control := lc.Control
	lc.Control = func(network, address string, rc syscall.RawConn) error {
		if err := control(network, address, rc); err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); serr != nil {
				serr = fmt.Errorf("setsockopt(SO_REUSEPORT): %w", serr)
			}
		}); err != nil {
			return err
		}
		return serr
	}
	var pcs []*net.UDPConn
	fail := func(err error) ([]*net.UDPConn, error) {
		for _, pc := range pcs {
			pc.Close()
		}
		return nil, err
	}
	for range n {
		pc, err := lc.ListenPacket(context.Background(), network, addr.String())
		if err != nil {
			return fail(err)
		}
		pcs = append(pcs, pc.(*net.UDPConn))
		// With port 0, the others take the port the first got.
		addr = pc.LocalAddr().(*net.UDPAddr).AddrPort()
	}
	if err := onlyOurs(addr, pcs); err != nil {
		return fail(err)
	}
	prog, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadExtension{Num: bpf.ExtCPUID},
		bpf.ALUOpConstant{Op: bpf.ALUOpMod, Val: uint32(n)},
		bpf.RetA{},
	})
	if err != nil {
		return fail(err)
	}
	filter := make([]unix.SockFilter, len(prog))
	for i, ins := range prog {
		filter[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	rc, err := pcs[0].SyscallConn()
	if err != nil {
		return fail(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF,
			&unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]})
	}); err != nil {
		return fail(err)
	}
	if serr != nil {
		return fail(fmt.Errorf("setsockopt(SO_ATTACH_REUSEPORT_CBPF): %w", serr))
	}
	return pcs, nil
}

// onlyOurs checks the kernel's table of UDP sockets (/proc/net/udp, of
// this network namespace) for a socket bound to addr that is not one of
// pcs: one that shares their port by SO_REUSEPORT.
func onlyOurs(addr netip.AddrPort, pcs []*net.UDPConn) error {
	ours := map[string]bool{}
	for _, pc := range pcs {
		rc, err := pc.SyscallConn()
		if err != nil {
			return err
		}
		var st unix.Stat_t
		var serr error
		rc.Control(func(fd uintptr) { serr = unix.Fstat(int(fd), &st) })
		if serr != nil {
			return fmt.Errorf("fstat: %w", serr)
		}
		ours[strconv.FormatUint(st.Ino, 10)] = true
	}
	f, err := os.Open("/proc/net/udp")
	if err != nil {
		return err
	}
	defer f.Close()
	a := addr.Addr().As4()
	// The address as the kernel prints it: its 32 bits read in the
	// machine's byte order, in hex; the port in hex.
	local := fmt.Sprintf("%08X:%04X", binary.NativeEndian.Uint32(a[:]), addr.Port())
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[1] != local {
			continue
		}
		if !ours[fields[9]] {
			return fmt.Errorf("listen udp %s: another socket shares the address: %w", addr, syscall.EADDRINUSE)
		}
	}
	return sc.Err()
}
