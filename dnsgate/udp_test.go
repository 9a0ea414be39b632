package dnsgate

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestUDPRepliesLikeMiekgServer sends the same datagrams to the gate's own
// UDP loop and to miekg/dns's server with the gate as its handler, and
// wants the same reply, or none, from both.
func TestUDPRepliesLikeMiekgServer(t *testing.T) {
	w := newWorld(t, GuardConfig{}, "deny denied.test")
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
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{name: "A", b: a},
		{name: "A mixed case", b: query("X.Example.", dns.TypeA)},
		{name: "AAAA", b: query("x.example.", dns.TypeAAAA)},
		{name: "denied", b: query("denied.test.", dns.TypeA)},
		{name: "ANY", b: query("x.example.", dns.TypeANY)},
		{name: "TXT unknown", b: query("unknown.test.", dns.TypeTXT)},
		{name: "shorter than a header", b: a[:5]},
		{name: "a response", b: withHeader(a, 1<<15|1<<8, 1, 0, 0, 0)},
		{name: "opcode UPDATE", b: withHeader(a, 5<<11, 1, 0, 0, 0)},
		{name: "no question", b: header(1<<8, 0, 0, 0, 0)},
		{name: "two questions", b: withHeader(append(a, a[12:]...), 1<<8, 2, 0, 0, 0)},
		{name: "question count lies", b: header(1<<8, 1, 0, 0, 0)},
		{name: "two answers", b: withHeader(a, 1<<8, 1, 2, 0, 0)},
		{name: "three additional", b: withHeader(a, 1<<8, 1, 0, 0, 3)},
		{name: "garbage additional", b: append(withHeader(a, 1<<8|1<<4, 1, 0, 0, 1), 0xff, 0xff, 0xff)},
		{name: "bad name", b: append(header(1<<8, 1, 0, 0, 0), 0xc0, 0xff, 0, 1, 0, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, want := exchangeRaw(t, w.addr, tc.b), exchangeRaw(t, pc.LocalAddr().String(), tc.b)
			silent := tc.name == "shorter than a header" || tc.name == "a response"
			if (got == nil) != silent {
				t.Errorf("gate replied %x; want a reply: %v", got, !silent)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("gate replied %x\nmiekg/dns's server %x", got, want)
			}
		})
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
