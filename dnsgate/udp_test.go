package dnsgate

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"
)

// udpCase is a datagram sent to the gate; silent ones get no reply.
type udpCase struct {
	name   string
	b      []byte
	silent bool
}

// udpCases are queries, malformed datagrams and ones that are not queries,
// each with id 4242.
func udpCases() []udpCase {
	query := func(name string, qtype uint16) []byte {
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		m.Id = 4242
		b, _ := m.Pack()
		return b
	}
	header := func(bits, qd, an, ns, ar uint16) []byte {
		b := make([]byte, 12)
		for i, v := range []uint16{4242, bits, qd, an, ns, ar} {
			binary.BigEndian.PutUint16(b[2*i:], v)
		}
		return b
	}
	withHeader := func(b []byte, bits, qd, an, ns, ar uint16) []byte {
		return append(header(bits, qd, an, ns, ar), b[12:]...)
	}
	a := query("x.example.", dns.TypeA)
	edns := new(dns.Msg)
	edns.SetQuestion("denied.test.", dns.TypeA)
	edns.Id = 4242
	edns.SetEdns0(1232, false)
	ednsDenied, _ := edns.Pack()
	return []udpCase{
		{name: "A", b: a},
		{name: "A mixed case", b: query("X.Example.", dns.TypeA)},
		{name: "AAAA", b: query("x.example.", dns.TypeAAAA)},
		{name: "HTTPS", b: query("x.example.", dns.TypeHTTPS)},
		{name: "denied", b: query("denied.test.", dns.TypeA)},
		{name: "denied with EDNS", b: ednsDenied},
		{name: "ANY", b: query("x.example.", dns.TypeANY)},
		{name: "TXT unknown", b: query("unknown.test.", dns.TypeTXT)},
		{name: "shorter than a header", b: a[:5], silent: true},
		{name: "a response", b: withHeader(a, 1<<15|1<<8, 1, 0, 0, 0), silent: true},
		{name: "opcode UPDATE", b: withHeader(a, 5<<11, 1, 0, 0, 0)},
		{name: "no question", b: header(1<<8, 0, 0, 0, 0)},
		{name: "two questions", b: withHeader(append(a, a[12:]...), 1<<8, 2, 0, 0, 0)},
		{name: "question count lies", b: header(1<<8, 1, 0, 0, 0)},
		{name: "two answers", b: withHeader(a, 1<<8, 1, 2, 0, 0)},
		{name: "three additional", b: withHeader(a, 1<<8, 1, 0, 0, 3)},
		{name: "garbage additional", b: append(withHeader(a, 1<<8|1<<4, 1, 0, 0, 1), 0xff, 0xff, 0xff)},
		{name: "bad name", b: append(header(1<<8, 1, 0, 0, 0), 0xc0, 0xff, 0, 1, 0, 1)},
	}
}

// startReference runs miekg/dns's server with w's gate as its handler and
// returns its address.
func startReference(t *testing.T, w *world) string {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ref := &dns.Server{PacketConn: pc, Handler: w.gate, UDPSize: udpReadSize}
	started := make(chan struct{})
	ref.NotifyStartedFunc = func() { close(started) }
	go ref.ActivateAndServe()
	<-started
	t.Cleanup(func() { ref.Shutdown() })
	return pc.LocalAddr().String()
}

// TestUDPRepliesLikeMiekgServer sends the same datagrams to the gate's own
// UDP loop and to miekg/dns's server with the gate as its handler, and
// wants the same reply, or none, from both.
func TestUDPRepliesLikeMiekgServer(t *testing.T) {
	w := newWorld(t, GuardConfig{}, "deny denied.test")
	ref := startReference(t, w)
	for _, tc := range udpCases() {
		t.Run(tc.name, func(t *testing.T) {
			got, want := exchangeRaw(t, w.addr, tc.b), exchangeRaw(t, ref, tc.b)
			if (got == nil) != tc.silent {
				t.Errorf("gate replied %x; want a reply: %v", got, !tc.silent)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("gate replied %x\nmiekg/dns's server %x", got, want)
			}
		})
	}
}

// TestUDPBatchRepliesToEachSender queues the datagrams of udpCases, twice
// over and from several clients, on a socket before the gate's UDP loop
// starts reading it, so that it reads them in full batches with the
// malformed ones, the silent ones and the forwarded ones mixed in. Each
// client must receive exactly the replies miekg/dns's server gives to the
// datagrams it sent, and no others.
func TestUDPBatchRepliesToEachSender(t *testing.T) {
	w := newWorld(t, GuardConfig{}, "deny denied.test")
	ref := startReference(t, w)
	cases := udpCases()
	want := make([][]byte, len(cases))
	for i, tc := range cases {
		want[i] = exchangeRaw(t, ref, tc.b)
		if (want[i] == nil) != tc.silent {
			t.Fatalf("%s: miekg/dns's server replied %x; want a reply: %v", tc.name, want[i], !tc.silent)
		}
	}

	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	pc.SetReadBuffer(1 << 20)
	const clients, rounds = 4, 2
	if n := clients * rounds * len(cases); n < 3*udpBatch {
		t.Fatalf("%d datagrams fill fewer than three batches of %d", n, udpBatch)
	}
	conns := make([]net.Conn, clients)
	wantBy := make([][]string, clients)
	for c := range conns {
		conn, err := net.Dial("udp4", pc.LocalAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conns[c] = conn
	}
	// Sent round-robin, so that each batch holds datagrams of every client.
	for r := range rounds {
		for i, tc := range cases {
			for c, conn := range conns {
				// An id of its own for every datagram: replies echo it.
				id := uint16(c<<12 | r<<8 | i)
				b := bytes.Clone(tc.b)
				binary.BigEndian.PutUint16(b, id)
				if _, err := conn.Write(b); err != nil {
					t.Fatal(err)
				}
				if want[i] != nil {
					reply := bytes.Clone(want[i])
					binary.BigEndian.PutUint16(reply, id)
					wantBy[c] = append(wantBy[c], string(reply))
				}
			}
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.gate.serveUDP(pc)
	}()
	t.Cleanup(func() {
		pc.Close()
		<-done
	})

	for c, conn := range conns {
		var got []string
		buf := make([]byte, 2048)
		for {
			conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, err := conn.Read(buf)
			if err != nil {
				break
			}
			got = append(got, string(buf[:n]))
		}
		// Forwarded queries are answered by goroutines of their own, so
		// replies need not come in the order of the queries.
		slices.Sort(got)
		slices.Sort(wantBy[c])
		if diff := cmp.Diff(wantBy[c], got); diff != "" {
			t.Errorf("client %d: replies differ from miekg/dns's server (-want +got):\n%s", c, diff)
		}
	}
}

// exchangeRaw sends b to addr over UDP and returns the reply, or nil when
// none comes within 300 ms.
func exchangeRaw(t *testing.T, addr string, b []byte) []byte {
	t.Helper()
	c, err := net.Dial("udp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(b)
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// TestGateSocketPerCore: a gate bound to one address has a UDP socket for
// each core the runtime uses, and queries from many clients, spread over
// them, are all answered.
func TestGateSocketPerCore(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(3))
	w := newWorld(t, GuardConfig{}, "deny denied.test")
	if n := len(w.gate.udp); n != 3 {
		t.Fatalf("gate has %d UDP sockets with 3 cores, want 3", n)
	}
	for i := range 30 {
		name, want := fmt.Sprintf("h%d.example.", i), dns.RcodeSuccess
		if i%3 == 0 {
			name, want = "denied.test.", dns.RcodeNameError
		}
		if r := w.query(t, "udp", name, dns.TypeA); r.Rcode != want {
			t.Errorf("%s: rcode %s, want %s", name, dns.RcodeToString[r.Rcode], dns.RcodeToString[want])
		}
	}
}
