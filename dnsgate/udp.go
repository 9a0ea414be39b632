package dnsgate

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"

	"github.com/miekg/dns"
)

// udpReadSize is the largest query read; a longer one is cut there and
// fails to parse, as with miekg/dns's server at the gate's UDPSize.
const udpReadSize = 1232

// serveUDP answers the queries that arrive on pc until pc is closed, with
// one goroutine reading, answering and writing in turn. miekg/dns's server
// starts a goroutine per datagram, whose stack grows on every query and
// costs more than most answers; here only queries that may wait on the
// upstream (anything but A, AAAA, HTTPS and SVCB) get a goroutine of their
// own. Which datagrams get a reply follows that server exactly: see
// replyTo. Start runs several of these on one socket.
func (g *Gate) serveUDP(pc *net.UDPConn) {
	buf := make([]byte, udpReadSize)
	for {
		n, from, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		req := replyTo(pc, buf[:n], from)
		if req == nil {
			continue
		}
		w := &udpWriter{pc: pc, to: from}
		if len(req.Question) == 1 {
			switch req.Question[0].Qtype {
			case dns.TypeA, dns.TypeAAAA, dns.TypeHTTPS, dns.TypeSVCB:
			default:
				g.wg.Go(func() { g.ServeDNS(w, req) })
				continue
			}
		}
		// Answered here and now (a query whose question count lied too:
		// it gets FORMERR).
		g.ServeDNS(w, req)
	}
}

// replyTo parses datagram m from a client. It returns the query to answer,
// or nil when m gets no answer from the gate: nothing at all for a
// datagram shorter than a header or one that is a response, FORMERR for
// one that is not one question with at most one answer, one authority and
// two additional records, or that fails to parse, and NOTIMP for an opcode
// other than QUERY and NOTIFY (miekg/dns's DefaultMsgAcceptFunc rules).
func replyTo(pc *net.UDPConn, m []byte, from netip.AddrPort) *dns.Msg {
	if len(m) < 12 {
		return nil
	}
	dh := dns.Header{
		Id: binary.BigEndian.Uint16(m), Bits: binary.BigEndian.Uint16(m[2:]),
		Qdcount: binary.BigEndian.Uint16(m[4:]), Ancount: binary.BigEndian.Uint16(m[6:]),
		Nscount: binary.BigEndian.Uint16(m[8:]), Arcount: binary.BigEndian.Uint16(m[10:]),
	}
	req := new(dns.Msg)
	action := dns.DefaultMsgAcceptFunc(dh)
	switch action {
	case dns.MsgIgnore:
		return nil
	case dns.MsgAccept:
		if req.Unpack(m) == nil {
			return req
		}
		// Unpack keeps the header and whatever question it read.
	default:
		req.Id, req.Opcode = dh.Id, int(dh.Bits>>11)&0xF
		req.RecursionDesired, req.CheckingDisabled = dh.Bits&(1<<8) != 0, dh.Bits&(1<<4) != 0
	}
	opcode := req.Opcode
	req.SetRcodeFormatError(req)
	req.Zero = false
	if action == dns.MsgRejectNotImplemented {
		req.Opcode, req.Rcode = opcode, dns.RcodeNotImplemented
	}
	req.Ns, req.Answer, req.Extra = nil, nil, nil
	(&udpWriter{pc: pc, to: from}).WriteMsg(req)
	return nil
}

// udpWriter is the dns.ResponseWriter of one UDP query.
type udpWriter struct {
	pc *net.UDPConn
	to netip.AddrPort
}

func (w *udpWriter) LocalAddr() net.Addr  { return w.pc.LocalAddr() }
func (w *udpWriter) RemoteAddr() net.Addr { return net.UDPAddrFromAddrPort(w.to) }

func (w *udpWriter) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

func (w *udpWriter) Write(b []byte) (int, error) { return w.pc.WriteToUDPAddrPort(b, w.to) }
func (w *udpWriter) Close() error                { return nil }
func (w *udpWriter) TsigStatus() error           { return nil }
func (w *udpWriter) TsigTimersOnly(bool)         {}
func (w *udpWriter) Hijack()                     {}
