package e2e

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/testworld"
	"github.com/airlockhq/airlock/internal/transparent"
)

// The datapath is TPROXY (docs/design.md §12): these tests show it as a
// user would, with nft, conntrack and the sysctls of the host namespace.

// brNetfilter returns the host namespace's bridge-nf-call-iptables, "" when
// br_netfilter is not loaded.
func brNetfilter(t *testing.T, w *testworld.World) string {
	t.Helper()
	out, err := w.HostExec("cat", "/proc/sys/net/bridge/bridge-nf-call-iptables")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

func setBrNetfilter(t *testing.T, w *testworld.World, v string) {
	t.Helper()
	if out, err := w.HostExec("sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables="+v); err != nil {
		t.Fatalf("sysctl bridge-nf-call-iptables=%s: %v %s", v, err, out)
	}
}

// onAndOffBrNetfilter runs check with the host namespace's br_netfilter on,
// as Docker leaves it, then off.
func onAndOffBrNetfilter(t *testing.T, w *testworld.World, check func(*testing.T)) {
	t.Helper()
	switch brNetfilter(t, w) {
	case "":
		t.Fatal("br_netfilter is not loaded (Docker loads it; modprobe br_netfilter): the datapath must be shown with it on")
	case "1":
	default:
		setBrNetfilter(t, w, "1")
	}
	t.Run("br_netfilter on", check)
	setBrNetfilter(t, w, "0")
	t.Run("br_netfilter off", check)
}

// withSYNCookies has the host namespace's listeners answer every SYN with
// a SYN cookie (tcp_syncookies=2) until the test ends.
func withSYNCookies(t *testing.T, w *testworld.World) {
	t.Helper()
	old, err := w.HostExec("cat", "/proc/sys/net/ipv4/tcp_syncookies")
	if err != nil {
		t.Fatal(old)
	}
	if out, err := w.HostExec("sysctl", "-q", "-w", "net.ipv4.tcp_syncookies=2"); err != nil {
		t.Fatalf("sysctl tcp_syncookies=2: %v %s", err, out)
	}
	t.Cleanup(func() { w.HostExec("sysctl", "-q", "-w", "net.ipv4.tcp_syncookies="+strings.TrimSpace(old)) })
}

// conntrackFrom returns the host namespace's conntrack entries whose
// original source is in p, rendered.
func conntrackFrom(t *testing.T, w *testworld.World, p netip.Prefix) []string {
	t.Helper()
	ns, err := vnetns.GetFromName(w.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatalf("conntrack list: %v", err)
	}
	var out []string
	for _, f := range flows {
		if a, ok := netip.AddrFromSlice(f.Forward.SrcIP.To4()); ok && p.Contains(a) {
			out = append(out, f.String())
		}
	}
	return out
}

// ruleCounter returns the packet counter of the first rule in the host
// namespace's chain (family table chain) whose text matches re.
func ruleCounter(t *testing.T, w *testworld.World, family, chain string, re *regexp.Regexp) int {
	t.Helper()
	out, err := w.HostExec("nft", "list", "chain", family, "airlock", chain)
	if err != nil {
		t.Fatalf("nft list chain %s airlock %s: %v %s", family, chain, err, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if re.MatchString(l) {
			var pk int
			if i := strings.Index(l, "packets "); i >= 0 {
				fmt.Sscanf(l[i:], "packets %d", &pk)
			}
			return pk
		}
	}
	t.Fatalf("no rule matching %s in:\n%s", re, out)
	return 0
}

// TestDatapathIsTPROXY: on a running airlockd the rule set diverts TCP and
// DNS with tproxy, nothing is DNATed; a member reaches what its policy
// allows with the proxy seeing the address it dialled and the gate
// answering from the address it asked; conntrack holds nothing of the
// proxied flows; a Docker-style DNAT of the gateway's port does not apply
// to members; and all of it with br_netfilter on, as Docker leaves it, and
// off.
func TestDatapathIsTPROXY(t *testing.T) {
	w, cfg, d := setup(t)
	inet, err := w.HostExec("nft", "list", "table", "inet", "airlock")
	if err != nil {
		t.Fatalf("nft list table inet airlock: %v %s", err, inet)
	}
	for _, want := range []string{
		"tproxy ip to 10.88.0.1:15001", // TCP
		"udp dport 53 tproxy ip to 10.88.0.1:53",
		"tcp dport 53 tproxy ip to 10.88.0.1:53",
		"reject with tcp reset", // tproxy finding no socket does not drop
	} {
		if !strings.Contains(inet, want) {
			t.Errorf("nft list table inet airlock lacks %q:\n%s", want, inet)
		}
	}
	if strings.Contains(inet, "dnat") || strings.Contains(inet, "nat hook") {
		t.Errorf("the rule set still NATs:\n%s", inet)
	}
	netdev, err := w.HostExec("nft", "list", "table", "netdev", "airlock")
	if err != nil || !strings.Contains(netdev, `device "al-sba"`) || !strings.Contains(netdev, `dup to "aldsba"`) {
		t.Errorf("nft list table netdev airlock: %v\n%s", err, netdev)
	}
	// What Docker adds for a published port on a bridge network: DNAT of
	// a local address's port, here the gateway's 8080 to the decoy.
	dockerlike := filepath.Join(w.Dir, "dockerlike.nft")
	write(t, dockerlike, fmt.Sprintf(`table ip dockerlike {
	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
		fib daddr type local tcp dport 8080 dnat to %s:80
	}
}
`, testworld.DecoyAddr))
	if out, err := w.HostExec("nft", "-f", dockerlike); err != nil {
		t.Fatalf("load Docker-like DNAT: %v %s", err, out)
	}

	check := func(t *testing.T) {
		run := func(argv ...string) testworld.Result {
			return w.Run(cfg, sbA, "agent", 30*time.Second, argv...)
		}
		// The gate answers a query sent to any address, from that address
		// (dig waits for an answer from the server it asked).
		if r := run("dig", "+short", "+tries=1", "+time=3", "@"+testworld.DNSAddr, "allowed.test"); !inFakePool(t, r.Stdout) {
			t.Errorf("dig @%s allowed.test: %q %q", testworld.DNSAddr, r.Stdout, r.Stderr)
		}
		if r := run("dig", "+short", "+tcp", "+tries=1", "+time=3", "@192.0.2.1", "allowed.test"); !inFakePool(t, r.Stdout) {
			t.Errorf("dig +tcp @192.0.2.1 allowed.test: %q %q", r.Stdout, r.Stderr)
		}
		// Allowed by name through the proxy, which saw the fake IP dialled.
		if r := run("curl", "-sS", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", "http://allowed.test/"); r.Stdout != "200" {
			t.Errorf("curl http://allowed.test/: %q %q", r.Stdout, r.Stderr)
		}
		if !regexp.MustCompile(`msg=connection .*host=allowed\.test port=80 .*dest=198\.1[89]\.\d+\.\d+:80 `).MatchString(d.Log.String()) {
			t.Errorf("the proxy logged no connection to allowed.test at its fake IP")
		}
		// After its SYN, a connection's packets go from the bridge to the
		// proxy's socket directly: the divert pair carries the SYN alone.
		syns := regexp.MustCompile(`meta l4proto tcp counter packets \d+ bytes \d+ dup to`)
		fast := regexp.MustCompile(`socket transparent 1 counter packets \d+ bytes \d+ notrack`)
		syn0, fast0 := ruleCounter(t, w, "netdev", "divert-al-"+sbA, syns), ruleCounter(t, w, "inet", "pre-al-"+sbA, fast)
		if r := run("curl", "-sS", "-m", "20", "-o", "/dev/null", "-w", "%{size_download}", "http://allowed.test/bytes/4000000"); r.Stdout != "4000000" {
			t.Errorf("curl http://allowed.test/bytes/4000000: %q %q", r.Stdout, r.Stderr)
		}
		syn1, fast1 := ruleCounter(t, w, "netdev", "divert-al-"+sbA, syns), ruleCounter(t, w, "inet", "pre-al-"+sbA, fast)
		if syn1-syn0 < 1 || syn1-syn0 > 3 || fast1-fast0 < 10 {
			t.Errorf("one download: %d packets through the divert pair (want its SYN), %d straight to the proxy's socket", syn1-syn0, fast1-fast0)
		}
		// The gateway's port that the Docker-like rule DNATs: the proxy
		// gets it as dialled (this host) and refuses it.
		if r := run("curl", "-sSf", "-m", "5", "http://10.88.0.1:8080/"); r.Code == 0 {
			t.Errorf("curl http://10.88.0.1:8080/ succeeded: %q", r.Stdout)
		}
		if !strings.Contains(d.Log.String(), "dest=10.88.0.1:8080 ") {
			t.Errorf("the proxy logged no connection to 10.88.0.1:8080 as dialled")
		}
		// A raw IP is still refused, and nothing reached the internet.
		if r := run("curl", "-sSf", "-m", "5", "http://"+testworld.DecoyAddr+"/"); r.Code == 0 {
			t.Errorf("curl http://%s/ succeeded: %q", testworld.DecoyAddr, r.Stdout)
		}
		for _, l := range w.Reached() {
			if strings.Contains(l, testworld.DecoyAddr) || strings.Contains(l, "← 10.88.") {
				t.Errorf("reached the internet: %s", l)
			}
		}
		if ct := conntrackFrom(t, w, netip.MustParsePrefix("10.88.0.0/16")); len(ct) > 0 {
			t.Errorf("conntrack holds flows of members:\n%s", strings.Join(ct, "\n"))
		}
	}
	// From another network the gateway is not there: neither the proxy
	// nor the gate answers a caller from the internet.
	w.InNetns(w.Inet, func() {
		if c, err := net.DialTimeout("tcp4", "10.88.0.1:15001", 2*time.Second); err == nil {
			c.Close()
			t.Error("the internet reached the proxy at 10.88.0.1:15001")
		}
		m := new(dns.Msg)
		m.SetQuestion("allowed.test.", dns.TypeA)
		if r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, "10.88.0.1:53"); err == nil {
			t.Errorf("the internet got an answer from the gate at 10.88.0.1:53: %v", r)
		}
	})
	onAndOffBrNetfilter(t, w, check)
}

// TestDivertedPacketsFindNothingWhenAirlockdDies: with airlockd killed, the
// tproxy rules find no socket: a member's TCP is reset at once by the
// rule set (its counter rises), its DNS is dropped, nothing reaches the
// internet and conntrack holds nothing of it.
func TestDivertedPacketsFindNothingWhenAirlockdDies(t *testing.T) {
	w, cfg, d := setup(t)
	if r := w.Run(cfg, sbA, "agent", 20*time.Second, "dig", "+short", "+tries=1", "allowed.test"); !inFakePool(t, r.Stdout) {
		t.Fatalf("before: %q %q", r.Stdout, r.Stderr)
	}
	resets := regexp.MustCompile(`meta l4proto tcp counter packets \d+ bytes \d+ reject with tcp reset`)
	before := ruleCounter(t, w, "inet", "tp-al-"+sbA, resets)
	queries := len(w.DNS.Queries())
	d.Kill()
	start := time.Now()
	r := w.Run(cfg, sbA, "agent", 20*time.Second, "curl", "-sS", "-m", "5", "http://"+testworld.WebAddr+"/")
	if r.Code != 7 || time.Since(start) > 4*time.Second {
		t.Errorf("curl with airlockd dead: exit %d %q after %s; want 7 (connection refused, a reset)", r.Code, r.Stderr, time.Since(start))
	}
	if r := w.Run(cfg, sbA, "agent", 20*time.Second, "dig", "+short", "+tries=1", "+time=2", "@"+testworld.DNSAddr, "allowed.test"); r.Code == 0 || !strings.Contains(r.Stdout, "timed out") {
		t.Errorf("dig with airlockd dead: exit %d %q; want a time-out", r.Code, r.Stdout)
	}
	if after := ruleCounter(t, w, "inet", "tp-al-"+sbA, resets); after <= before {
		t.Errorf("tp-al-%s reset counter %d → %d: the SYN did not end at the rule set's reset", sbA, before, after)
	}
	if n := len(w.DNS.Queries()); n != queries {
		t.Errorf("with airlockd dead the upstream DNS saw %v", w.DNS.Queries()[queries:])
	}
	for _, l := range w.Reached() {
		t.Errorf("with airlockd dead, reached the internet: %s", l)
	}
	if ct := conntrackFrom(t, w, netip.MustParsePrefix("10.88.0.0/16")); len(ct) > 0 {
		t.Errorf("with airlockd dead, conntrack holds:\n%s", strings.Join(ct, "\n"))
	}

	// Another transparent socket of the host on the same ports, bound to
	// every address (a resolver with ip-transparent, say), would match
	// tproxy while airlockd is gone: it must not get the members' traffic.
	var got atomic.Int32
	w.InNetns(w.Host, func() {
		ln, err := transparent.Listen("tcp4", netip.MustParseAddrPort("0.0.0.0:15001"), true)
		if err != nil {
			t.Errorf("transparent listener: %v", err)
			return
		}
		t.Cleanup(func() { ln.Close() })
		go countAccepts(ln, &got)
		pc, err := transparent.ListenPacket("udp4", netip.MustParseAddrPort("0.0.0.0:53"), true)
		if err != nil {
			t.Errorf("transparent UDP socket: %v", err)
			return
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 512)
			for {
				if _, _, err := pc.ReadFrom(buf); err != nil {
					return
				}
				got.Add(1)
			}
		}()
	})
	if r := w.Run(cfg, sbA, "agent", 20*time.Second, "curl", "-sS", "-m", "3", "http://"+testworld.WebAddr+"/"); r.Code == 0 {
		t.Errorf("curl with airlockd dead and a wildcard transparent listener: %q", r.Stdout)
	}
	if r := w.Run(cfg, sbA, "agent", 20*time.Second, "dig", "+short", "+tries=1", "+time=2", "@"+testworld.DNSAddr, "allowed.test"); r.Code == 0 {
		t.Errorf("dig with airlockd dead and a wildcard transparent socket: %q", r.Stdout)
	}
	if n := got.Load(); n != 0 {
		t.Errorf("a wildcard transparent socket of the host got %d of the members' connections or queries", n)
	}
}

// tcpSegment returns an Ethernet frame from src to dst carrying a TCP
// segment with flags and a correct checksum, from → to.
func tcpSegment(dst, src net.HardwareAddr, from, to string, sport, dport uint16, flags byte) []byte {
	h := make([]byte, 20)
	h[0], h[8], h[9] = 0x45, 64, unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(h[2:], 40)
	copy(h[12:16], net.ParseIP(from).To4())
	copy(h[16:20], net.ParseIP(to).To4())
	binary.BigEndian.PutUint16(h[10:], ^onesSum(0, h))
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], dport)
	binary.BigEndian.PutUint32(tcp[4:], 1000)
	binary.BigEndian.PutUint32(tcp[8:], 2000)
	tcp[12], tcp[13] = 5<<4, flags
	binary.BigEndian.PutUint16(tcp[14:], 64240)
	pseudo := append(append(append([]byte{}, h[12:20]...), 0, unix.IPPROTO_TCP), 0, 20)
	binary.BigEndian.PutUint16(tcp[16:], ^onesSum(onesSum(0, pseudo), tcp))
	f := append(append(append([]byte{}, dst...), src...), 0x08, 0x00)
	return append(append(f, h...), tcp...)
}

// tcpResets opens a packet socket on link dev of namespace ns and returns
// a func that collects the TCP resets it has received since the last
// call, by destination port, waiting until 300 ms pass without one.
func tcpResets(t *testing.T, w *testworld.World, ns, dev string) func() map[uint16]bool {
	t.Helper()
	var fd int
	w.InNetns(ns, func() {
		l, err := net.InterfaceByName(dev)
		if err != nil {
			t.Fatal(err)
		}
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_IP))); err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: l.Index}); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { unix.Close(fd) })
	tv := unix.NsecToTimeval((300 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return func() map[uint16]bool {
		got := map[uint16]bool{}
		buf := make([]byte, 2048)
		for {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				return got
			}
			f := buf[:n]
			if len(f) < 14+20 || f[14+9] != unix.IPPROTO_TCP {
				continue
			}
			tcp := f[14+int(f[14]&0xf)*4:]
			if len(tcp) >= 14 && tcp[13]&0x04 != 0 {
				got[binary.BigEndian.Uint16(tcp[2:])] = true
			}
		}
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// onesSum adds b to the ones' complement sum s.
func onesSum(s uint16, b []byte) uint16 {
	sum := uint32(s)
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// TestEstablishedPathReachesOnlyTheProxysSockets: after a SYN the bridge
// hands a connection's packets to their socket directly, found by their
// addresses and ports. A member sending segments without a SYN cannot use
// that to reach anything else: a host socket on every address, transparent
// or not, or a destination with no socket at all. Each is dropped or reset
// by the rule set (its counter rises), and nothing reaches the internet;
// with br_netfilter on and off.
func TestEstablishedPathReachesOnlyTheProxysSockets(t *testing.T) {
	w, _, _ := setup(t)
	ns, mac := rogueMember(t, w, sbA, "altea", "10.88.0.97/24")
	br := bridgeMACOf(t, w, sbA)
	fd := rawSocket(t, w, ns, "altea")
	var got atomic.Int32
	w.InNetns(w.Host, func() {
		plain, err := net.Listen("tcp4", "0.0.0.0:4444")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { plain.Close() })
		tp, err := transparent.Listen("tcp4", netip.MustParseAddrPort("0.0.0.0:4445"), true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tp.Close() })
		for _, ln := range []net.Listener{plain, tp} {
			go countAccepts(ln, &got)
		}
	})
	// A segment with no socket of its own goes to the proxy's listener
	// (which resets it, or takes it for a SYN cookie's ACK).
	resets := regexp.MustCompile(`tcp flags ! syn tproxy ip to 10\.88\.0\.1:15001 counter packets \d+ bytes \d+ notrack`)
	wildcards := regexp.MustCompile(`tcp flags ! syn socket wildcard 1 counter packets \d+ bytes \d+ reject with tcp reset`)
	const ack, fin, rst, psh = 0x10, 0x01, 0x04, 0x08
	resetsTo := tcpResets(t, w, ns, "altea")
	toHost := regexp.MustCompile(`fib daddr type local counter packets \d+ bytes \d+ dup to`)
	check := func(t *testing.T) {
		// Under br_netfilter the bridge pass sees every segment first, and
		// those to a host address that go the listener's way then cross the
		// divert pair; without it the divert rule sees them first and sends
		// every segment to a host address (10 of the 20) through the pair.
		wantW, wantR, wantHost := 8, 12, 6
		if brNetfilter(t, w) != "1" {
			wantW, wantR, wantHost = 4, 6, 10
		}
		resetsTo()
		r0, w0 := ruleCounter(t, w, "inet", "pre-al-"+sbA, resets), ruleCounter(t, w, "inet", "pre-al-"+sbA, wildcards)
		h0 := ruleCounter(t, w, "netdev", "divert-al-"+sbA, toHost)
		for i, to := range []string{testworld.DecoyAddr, testworld.WebAddr, "10.88.0.1", "10.88.1.1"} {
			port := uint16(40000 + 10*i)
			sendFrames(t, fd,
				tcpSegment(br, mac, "10.88.0.97", to, port, 4444, ack),       // an ordinary socket on every address
				tcpSegment(br, mac, "10.88.0.97", to, port+1, 4445, ack|psh), // a transparent one on every address
				tcpSegment(br, mac, "10.88.0.97", to, port+2, 5555, ack),     // none
				tcpSegment(br, mac, "10.88.0.97", to, port+3, 5555, fin|ack),
				tcpSegment(br, mac, "10.88.0.97", to, port+4, 80, rst))
		}
		time.Sleep(300 * time.Millisecond)
		r1, w1 := ruleCounter(t, w, "inet", "pre-al-"+sbA, resets), ruleCounter(t, w, "inet", "pre-al-"+sbA, wildcards)
		if w1-w0 != wantW {
			t.Errorf("segments to sockets on every address: %d reset in the bridge pass, want %d", w1-w0, wantW)
		}
		if h := ruleCounter(t, w, "netdev", "divert-al-"+sbA, toHost) - h0; h != wantHost {
			t.Errorf("segments to host addresses through the divert pair: %d, want %d", h, wantHost)
		}
		// The member gets the same answer whatever the host listens on: a
		// reset for each segment but the reset (no scan of the host's
		// ports).
		got := resetsTo()
		for i := range 4 {
			for j := range 4 {
				if p := uint16(40000 + 10*i + j); !got[p] {
					t.Errorf("no reset for the member's segment from port %d", p)
				}
			}
		}
		if r1-r0 != wantR {
			t.Errorf("segments with no socket: %d handed to the proxy's listener in the bridge pass, want %d", r1-r0, wantR)
		}
	}
	onAndOffBrNetfilter(t, w, check)
	if n := got.Load(); n != 0 {
		t.Errorf("host sockets accepted %d connections from a member", n)
	}
	for _, l := range w.Reached() {
		t.Errorf("reached the internet: %s", l)
	}
}

// TestProxiedConnectionsWorkWithSYNCookies: when the proxy's listener
// answers a SYN with a SYN cookie (tcp_syncookies=2 here; with 1, as soon
// as a member fills the listener's queue), no socket holds the connection
// until the member's ACK reaches the listener, which only the tproxy rule
// finds (the ACK is addressed to the destination the member dialled).
// Connections must still work, with br_netfilter on and off.
func TestProxiedConnectionsWorkWithSYNCookies(t *testing.T) {
	w, cfg, _ := setup(t)
	withSYNCookies(t, w)
	check := func(t *testing.T) {
		r := w.Run(cfg, sbA, "agent", 30*time.Second, "curl", "-sS", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", "http://allowed.test/")
		if r.Stdout != "200" {
			t.Errorf("curl http://allowed.test/ with SYN cookies: %q %q", r.Stdout, r.Stderr)
		}
	}
	onAndOffBrNetfilter(t, w, check)
}

// TestNoSandboxReachesAnothersListeners: a member's segments after its
// SYN are found their socket by their addresses, so a segment addressed to
// another sandbox's gateway would find that sandbox's proxy or gate
// listener. With SYN cookies (tcp_syncookies=2; with 1, while both
// listeners' queues overflow) the member's own proxy answers its SYN with
// a cookie that the other sandbox's listener accepts (the secret is the
// host's): a connection from sandbox A into sandbox B's proxy. Nothing
// from another network may reach a gateway's listeners.
func TestNoSandboxReachesAnothersListeners(t *testing.T) {
	w, cfg, d := setup(t)
	withSYNCookies(t, w)
	check := func(t *testing.T) {
		// Sandbox B's listeners have sent cookies lately.
		w.Run(cfg, sbB, "agent", 30*time.Second, "curl", "-sS", "-m", "5", "-o", "/dev/null", "http://"+testworld.WebAddr+"/")
		w.Run(cfg, sbB, "agent", 30*time.Second, "dig", "+short", "+tcp", "+tries=1", "+time=3", "allowed.test")
		// Sandbox A's proxy (and gate) may take these, as dialled.
		for _, port := range []string{"15001", "53"} {
			w.Run(cfg, sbA, "agent", 30*time.Second, "curl", "-sS", "-m", "3", "-o", "/dev/null", "http://10.88.1.1:"+port+"/")
		}
		if m := regexp.MustCompile(`.*sandbox=sbb .*10\.88\.0\.\d+.*`).FindString(d.Log.String()); m != "" {
			t.Errorf("sandbox B's listeners served a member of sandbox A: %s", m)
		}
	}
	onAndOffBrNetfilter(t, w, check)
}

// vlanTagged returns an Ethernet frame with 802.1Q tags of VLAN 0 (priority
// tags) inserted after its addresses, one per entry of tpids.
func vlanTagged(frame []byte, tpids ...uint16) []byte {
	out := append([]byte{}, frame[:12]...)
	for _, p := range tpids {
		out = binary.BigEndian.AppendUint16(out, p)
		out = append(out, 0, 0)
	}
	return append(out, frame[12:]...)
}

// TestShapedSandboxDivertsEveryTCPFrame: while a sandbox has a bandwidth
// cap, the cap on its uploads is the divert pair's queue, so every TCP
// frame a member sends up the bridge must cross the pair; the bridge pass
// hands a connection's segments to their socket whatever the divert rule
// decided. A frame with two priority tags (VLAN 0) reaches the netdev rule
// with a VLAN ethertype and the host's IPv4 receive after the kernel has
// taken both tags off: it must not get past the divert rule as something
// other than IPv4, with br_netfilter on and off.
func TestShapedSandboxDivertsEveryTCPFrame(t *testing.T) {
	w, _, _, _, _ := policySetup(t, "sandbox:\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n  resources:\n    bandwidth_mbps: 20\n")
	ns, mac := rogueMember(t, w, "default", "altev", "10.88.0.97/24")
	br := bridgeMACOf(t, w, "default")
	fd := rawSocket(t, w, ns, "altev")
	// Segments without SYN that took the bridge pass's way (the socket
	// lookup, then the proxy's listener or a reset) instead of the pair.
	count := func(family, chain, what string) int {
		out, err := w.HostExec("nft", "list", "chain", family, "airlock", chain)
		if err != nil {
			t.Fatalf("nft list chain: %v %s", err, out)
		}
		n := 0
		for _, l := range strings.Split(out, "\n") {
			if i := strings.Index(l, "packets "); i >= 0 && strings.Contains(l, what) {
				var pk int
				fmt.Sscanf(l[i:], "packets %d", &pk)
				n += pk
			}
		}
		return n
	}
	passed := func() int { return count("inet", "pre-al-default", "tcp flags ! syn") }
	// Frames the divert rule saw and dropped or diverted.
	seen := func() int { return count("netdev", "divert-al-default", "") }
	check := func(t *testing.T) {
		p0, s0 := passed(), seen()
		for i, tpids := range [][]uint16{{0x8100, 0x8100}, {0x88a8, 0x8100}, {0x8100, 0x8100, 0x8100}} {
			f := tcpSegment(br, mac, "10.88.0.97", testworld.WebAddr, uint16(41000+i), 80, 0x10)
			sendFrames(t, fd, vlanTagged(f, tpids...))
		}
		time.Sleep(300 * time.Millisecond)
		if n := passed() - p0; n != 0 {
			t.Errorf("%d VLAN-tagged segments took the bridge pass's way under a bandwidth cap (not the divert pair)", n)
		}
		if n := seen() - s0; n != 3 {
			t.Errorf("the divert rule dropped or diverted %d of 3 VLAN-tagged segments", n)
		}
	}
	onAndOffBrNetfilter(t, w, check)
}

// countAccepts accepts and closes ln's connections, counting them in n,
// until ln is closed.
func countAccepts(ln net.Listener, n *atomic.Int32) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		n.Add(1)
		c.Close()
	}
}
