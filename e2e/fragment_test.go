package e2e

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/testworld"
)

// rogueMember puts a namespace of the test's own on sandbox sb's bridge, as
// a member that may send any frame (root, raw sockets), with address addr
// (CIDR) on link dev; it returns the namespace and its MAC address.
func rogueMember(t *testing.T, w *testworld.World, sb, dev, addr string) (ns string, mac net.HardwareAddr) {
	t.Helper()
	ns = fmt.Sprintf("alt-%s-%d", dev, rand.IntN(1e6))
	if out, err := sh("ip", "netns", "add", ns); err != nil {
		t.Fatal(out)
	}
	t.Cleanup(func() { sh("ip", "netns", "del", ns) })
	host := dev + "h"
	for _, s := range [][]string{
		{"ip", "-n", w.Host, "link", "add", host, "type", "veth", "peer", "name", dev, "netns", ns},
		{"ip", "-n", w.Host, "link", "set", host, "master", "al-" + sb, "up"},
		{"ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"},
		{"ip", "-n", ns, "link", "set", dev, "up"},
		{"ip", "-n", ns, "addr", "add", addr, "dev", dev},
	} {
		if out, err := sh(s...); err != nil {
			t.Fatalf("%v: %s", s, out)
		}
	}
	w.InNetns(ns, func() {
		l, err := net.InterfaceByName(dev)
		if err != nil {
			t.Fatal(err)
		}
		mac = l.HardwareAddr
	})
	return ns, mac
}

// bridgeMACOf returns the MAC address of sandbox sb's bridge.
func bridgeMACOf(t *testing.T, w *testworld.World, sb string) net.HardwareAddr {
	t.Helper()
	out, err := w.HostExec("cat", "/sys/class/net/al-"+sb+"/address")
	if err != nil {
		t.Fatal(out)
	}
	mac, err := net.ParseMAC(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// ipv4Fragment returns an Ethernet frame from src to dst carrying an IPv4
// fragment of a UDP datagram: id, byte offset off, more fragments mf, and
// payload (for the first fragment, the UDP header and what follows).
func ipv4Fragment(dst, src net.HardwareAddr, from, to string, id uint16, off int, mf bool, payload []byte) []byte {
	h := make([]byte, 20)
	h[0], h[8], h[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
	binary.BigEndian.PutUint16(h[4:], id)
	fl := uint16(off / 8)
	if mf {
		fl |= 0x2000
	}
	binary.BigEndian.PutUint16(h[6:], fl)
	copy(h[12:16], net.ParseIP(from).To4())
	copy(h[16:20], net.ParseIP(to).To4())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(h[10:], ^uint16(sum))
	f := append(append(append([]byte{}, dst...), src...), 0x08, 0x00)
	return append(append(f, h...), payload...)
}

// rawSocket opens a packet socket on link dev of namespace ns, for
// sendFrames; it stays in ns.
func rawSocket(t *testing.T, w *testworld.World, ns, dev string) (fd int) {
	t.Helper()
	w.InNetns(ns, func() {
		l, err := net.InterfaceByName(dev)
		if err != nil {
			t.Error(err)
			return
		}
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0); err != nil {
			t.Error(err)
			return
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: l.Index}); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// sendFrames writes raw Ethernet frames on a packet socket.
func sendFrames(t *testing.T, fd int, frames ...[]byte) {
	t.Helper()
	for _, f := range frames {
		if _, err := unix.Write(fd, f); err != nil {
			t.Fatalf("send frame: %v", err)
		}
	}
}

// TestNoFragmentChannelBetweenSandboxes: a member of sandbox B sends an
// IPv4 fragment claiming a source of sandbox A; a member of A then sends
// the first fragment of that datagram to another member of A through the
// gateway. The kernel's reassembly queues are shared by every interface,
// so unless the source checks run before defragmentation, B's bytes are
// reassembled into A's datagram and delivered inside sandbox A: a channel
// between sandboxes. With br_netfilter on and off.
func TestNoFragmentChannelBetweenSandboxes(t *testing.T) {
	w, _, _ := setup(t)
	a, macA := rogueMember(t, w, sbA, "altfa", "10.88.0.98/24")
	b, macB := rogueMember(t, w, sbB, "altfb", "10.88.1.98/24")
	brA, brB := bridgeMACOf(t, w, sbA), bridgeMACOf(t, w, sbB)
	fdA, fdB := rawSocket(t, w, a, "altfa"), rawSocket(t, w, b, "altfb")
	// The receiver: a UDP socket of A's member on 10.88.0.98:7777.
	var rx net.PacketConn
	w.InNetns(a, func() {
		var err error
		if rx, err = net.ListenPacket("udp4", "10.88.0.98:7777"); err != nil {
			t.Fatal(err)
		}
	})
	defer rx.Close()
	const from = "10.88.0.97" // a source of sandbox A's subnet
	tail := []byte("tail:from-sandbox-B")
	first := func(tag string) []byte {
		udp := make([]byte, 16)
		binary.BigEndian.PutUint16(udp[0:], 5555)
		binary.BigEndian.PutUint16(udp[2:], 7777)
		binary.BigEndian.PutUint16(udp[4:], uint16(16+len(tail))) // checksum 0: none
		return append(udp[:8], []byte(tag)[:8]...)
	}
	check := func(t *testing.T) {
		id := uint16(rand.IntN(1 << 15))
		// B's piece first; then A's first fragment completes the datagram.
		sendFrames(t, fdB, ipv4Fragment(brB, macB, from, "10.88.0.98", id, 16, false, tail))
		sendFrames(t, fdA, ipv4Fragment(brA, macA, from, "10.88.0.98", id, 0, true, first("attack--")))
		// Then a datagram A's member sends whole, in two fragments: it
		// is delivered, and anything B's piece completed came before it.
		sendFrames(t, fdA,
			ipv4Fragment(brA, macA, from, "10.88.0.98", id+1, 0, true, first("control-")),
			ipv4Fragment(brA, macA, from, "10.88.0.98", id+1, 16, false, []byte("tail:from-sandbox-A")))
		buf := make([]byte, 2048)
		for {
			rx.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, _, err := rx.ReadFrom(buf)
			if err != nil {
				t.Fatalf("the control datagram from A's own member did not arrive: %v", err)
			}
			got := string(buf[:n])
			if strings.Contains(got, "from-sandbox-B") {
				t.Errorf("sandbox A's member received bytes a member of sandbox B sent: %q", got)
			}
			if strings.Contains(got, "control") {
				return
			}
		}
	}
	onAndOffBrNetfilter(t, w, check)
}
