package transparent

import (
	"net"
	"net/netip"
	"testing"

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
