package transparent

import (
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
