package transparent

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// TestControlMessagesAgreeWithXNet: what PutSrc writes is what x/net's
// ipv4 package marshals for a reply from src, and Dst reads the
// destination x/net parses.
func TestControlMessagesAgreeWithXNet(t *testing.T) {
	src := netip.MustParseAddr("203.0.113.53")
	want := (&ipv4.ControlMessage{Src: src.AsSlice()}).Marshal()
	got := PutSrc(make([]byte, OOBSize+8), src)
	if string(got) != string(want) {
		t.Errorf("PutSrc = %x, x/net marshals %x", got, want)
	}
	// A received IP_PKTINFO carries the header's destination in its last
	// address; build one as the kernel does (x/net marshals Dst nowhere,
	// so fill the same layout by hand).
	oob := PutSrc(make([]byte, OOBSize), netip.MustParseAddr("10.88.0.1"))
	copy(oob[unix.CmsgLen(0)+8:], []byte{203, 0, 113, 53}) // in_pktinfo.ipi_addr
	var cm ipv4.ControlMessage
	if err := cm.Parse(oob); err != nil {
		t.Fatal(err)
	}
	dst, ok := Dst(oob)
	if !ok || dst.String() != cm.Dst.String() || dst != src {
		t.Errorf("Dst = %v %v; x/net parses %v", dst, ok, cm.Dst)
	}
	for _, bad := range [][]byte{nil, make([]byte, 3), make([]byte, OOBSize)} {
		if a, ok := Dst(bad); ok {
			t.Errorf("Dst(%x) = %v, want none", bad, a)
		}
	}
}

// TestAcceptedConnectionsKeepAlive: connections a listener accepts have
// Go's keep-alive settings, set once on the listener.
func TestAcceptedConnectionsKeepAlive(t *testing.T) {
	ln, err := Listen("tcp4", netip.MustParseAddrPort("127.0.0.1:0"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	rc, _ := a.(*net.TCPConn).SyscallConn()
	got := map[string]int{}
	rc.Control(func(fd uintptr) {
		got["SO_KEEPALIVE"], _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		got["TCP_KEEPIDLE"], _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		got["TCP_KEEPINTVL"], _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)
		got["TCP_KEEPCNT"], _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
		got["TCP_NODELAY"], _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NODELAY)
	})
	want := map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 15, "TCP_KEEPINTVL": 15, "TCP_KEEPCNT": 9, "TCP_NODELAY": 1}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("accepted connection: %s = %d, want %d", k, got[k], v)
		}
	}
}

// reuseportSocket binds a UDP socket with SO_REUSEPORT on addr, as another
// process of the same user could.
func reuseportSocket(t *testing.T, addr netip.AddrPort) (int, error) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 1000})
	return fd, unix.Bind(fd, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()})
}

// TestListenPacketsShareAnAddress: n sockets take every datagram sent to
// their address between them, each once; a socket another process adds
// to their group later gets none, and a group another process's socket
// was part of first is refused.
func TestListenPacketsShareAnAddress(t *testing.T) {
	pcs, err := ListenPackets("udp4", netip.MustParseAddrPort("127.0.0.1:0"), false, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, pc := range pcs {
			pc.Close()
		}
	}()
	addr := pcs[0].LocalAddr().(*net.UDPAddr).AddrPort()
	if len(pcs) != 2 || pcs[1].LocalAddr().(*net.UDPAddr).AddrPort() != addr {
		t.Fatalf("got %d sockets, the second on %v; want 2 on %v", len(pcs), pcs[len(pcs)-1].LocalAddr(), addr)
	}
	intruder, err := reuseportSocket(t, addr)
	if err != nil {
		t.Fatalf("a later socket could not join the group: %v (then nothing here to check)", err)
	}
	// From 20 clients: without the program, the kernel would spread them
	// over the whole group by a hash of their addresses.
	const n = 200
	for k := range 20 {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(addr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i := k * 10; i < (k+1)*10; i++ {
			c.Write([]byte{byte(i), byte(i >> 8)})
		}
	}
	seen := map[int]int{}
	buf := make([]byte, 16)
	for _, pc := range pcs {
		for {
			pc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			m, err := pc.Read(buf)
			if err != nil {
				break
			}
			if m == 2 {
				seen[int(buf[0])|int(buf[1])<<8]++
			}
		}
	}
	stolen := 0
	for {
		if m, err := unix.Read(intruder, buf); err != nil || m <= 0 {
			break
		}
		stolen++
	}
	if stolen > 0 {
		t.Errorf("a socket that joined the group later received %d of %d datagrams", stolen, n)
	}
	for i := range n {
		if seen[i] != 1 {
			t.Errorf("datagram %d received %d times by the group, want once", i, seen[i])
		}
	}

	// A group that another socket is part of from the start is refused.
	taken := netip.AddrPortFrom(addr.Addr(), 0)
	first, err := reuseportSocket(t, taken)
	if err != nil {
		t.Fatal(err)
	}
	sa, _ := unix.Getsockname(first)
	taken = netip.AddrPortFrom(taken.Addr(), uint16(sa.(*unix.SockaddrInet4).Port))
	if pcs, err := ListenPackets("udp4", taken, false, 2); !errors.Is(err, syscall.EADDRINUSE) {
		for _, pc := range pcs {
			pc.Close()
		}
		t.Errorf("ListenPackets on an address another socket shares: %v, want EADDRINUSE", err)
	}
	// One socket alone shares its address with nobody.
	one, err := ListenPackets("udp4", netip.MustParseAddrPort("127.0.0.1:0"), false, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer one[0].Close()
	if _, err := reuseportSocket(t, one[0].LocalAddr().(*net.UDPAddr).AddrPort()); err == nil {
		t.Error("another socket joined a lone socket's address")
	}
}
