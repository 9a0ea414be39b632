package dnsgate

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"

	"github.com/airlockhq/airlock/internal/transparent"
)

// udpReadSize is the largest query read; a longer one is cut there and
// fails to parse, as with miekg/dns's server at the gate's UDPSize.
const udpReadSize = 1232

// udpBatch is the most datagrams a reader takes from the socket in one
// recvmmsg, and the most replies it sends in one sendmmsg.
const udpBatch = 32

// udpReplySize is the size of the buffers replies in a batch are packed
// into. The replies answered at once (fake IPs, NXDOMAIN, no data, FORMERR
// and NOTIMP) are far smaller; a larger one gets a buffer of its own.
const udpReplySize = 512

// serveUDP answers the queries that arrive on pc until pc is closed, with
// one goroutine reading, answering and writing in turn. miekg/dns's server
// starts a goroutine per datagram, whose stack grows on every query and
// costs more than most answers; here only queries that may wait on the
// upstream (anything but A, AAAA, HTTPS and SVCB) get a goroutine of their
// own, and write their reply alone. The others are read in batches of
// whatever is queued on the socket, up to udpBatch, without waiting for
// more, and their replies leave together once the batch is answered: one
// recvmmsg and one sendmmsg for many queries instead of a recvmsg and a
// sendmsg each. Which datagrams get a reply follows miekg/dns's server
// exactly: see replyTo. Start runs several of these on one socket.
//
// On a transparent gate each datagram's destination is read from its
// IP_PKTINFO, and its reply leaves from that address: a member that asked
// 203.0.113.53 is answered by 203.0.113.53.
func (g *Gate) serveUDP(pc *net.UDPConn) {
	bc := ipv4.NewPacketConn(pc)
	tp := g.cfg.Transparent
	in := make([]ipv4.Message, udpBatch)
	bufs := make([]byte, udpBatch*udpReadSize)
	for i := range in {
		in[i].Buffers = [][]byte{bufs[i*udpReadSize : (i+1)*udpReadSize : (i+1)*udpReadSize]}
		if tp {
			in[i].OOB = make([]byte, transparent.OOBSize)
		}
	}
	out := &udpReplies{pc: pc, bc: bc, msgs: make([]ipv4.Message, 0, udpBatch)}
	for i := range out.bufs {
		out.bufs[i] = make([]byte, udpReplySize)
		if tp {
			out.oobs[i] = make([]byte, transparent.OOBSize)
		}
	}
	for {
		// The socket does not block (the runtime's poller waits for it), so
		// recvmmsg returns as soon as it has taken what is queued: a lone
		// query is answered at once.
		n, err := bc.ReadBatch(in, 0)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A socket that keeps failing must not spin a core.
			g.log.Debug("read dns queries", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for i := range in[:n] {
			m := &in[i]
			// Each datagram's sender comes with it, in an address of its
			// own that the next read does not reuse; without one there is
			// nobody to answer.
			from, ok := m.Addr.(*net.UDPAddr)
			m.Addr = nil
			if !ok || from == nil {
				continue
			}
			out.to, out.src = from, netip.Addr{}
			if tp {
				// Without its destination a reply could not leave from it.
				if out.src, ok = transparent.Dst(m.OOB[:m.NN]); !ok {
					continue
				}
			}
			req := replyTo(out, m.Buffers[0][:min(m.N, udpReadSize)])
			if req == nil {
				continue
			}
			if len(req.Question) == 1 {
				switch req.Question[0].Qtype {
				case dns.TypeA, dns.TypeAAAA, dns.TypeHTTPS, dns.TypeSVCB:
				default:
					w := &udpWriter{pc: pc, to: from, src: out.src}
					g.wg.Go(func() { g.ServeDNS(w, req) })
					continue
				}
			}
			// Answered here and now (a query whose question count lied too:
			// it gets FORMERR).
			g.ServeDNS(out, req)
		}
		out.to = nil
		if err := out.flush(); err != nil {
			g.log.Debug("write dns reply", "err", err)
		}
	}
}

// replyTo parses datagram m from a client. It returns the query to answer,
// or nil when m gets no answer from the gate: nothing at all for a
// datagram shorter than a header or one that is a response, FORMERR for
// one that is not one question with at most one answer, one authority and
// two additional records, or that fails to parse, and NOTIMP for an opcode
// other than QUERY and NOTIFY (miekg/dns's DefaultMsgAcceptFunc rules).
// FORMERR and NOTIMP are written to w.
func replyTo(w dns.ResponseWriter, m []byte) *dns.Msg {
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
	w.WriteMsg(req)
	return nil
}

// udpReplies is the dns.ResponseWriter of the queries of one batch that
// are answered at once. It queues their replies, each to the sender of the
// query being answered when it was written (to), and flush sends them.
type udpReplies struct {
	pc   *net.UDPConn
	bc   *ipv4.PacketConn
	to   *net.UDPAddr // the sender of the query being answered
	src  netip.Addr   // on a transparent gate, where that query was sent
	msgs []ipv4.Message
	bufs [udpBatch][]byte // msgs[i] is packed into bufs[i] when it fits
	oobs [udpBatch][]byte // msgs[i]'s source, on a transparent gate
}

func (w *udpReplies) LocalAddr() net.Addr  { return w.pc.LocalAddr() }
func (w *udpReplies) RemoteAddr() net.Addr { return w.to }

func (w *udpReplies) WriteMsg(m *dns.Msg) error {
	buf, err := w.slot()
	if err != nil {
		return err
	}
	// Cleared first: miekg/dns has had packers that assumed a zeroed buffer.
	clear(buf)
	b, err := m.PackBuffer(buf)
	if err != nil {
		return err
	}
	w.queue(b)
	return nil
}

func (w *udpReplies) Write(b []byte) (int, error) {
	buf, err := w.slot()
	if err != nil {
		return 0, err
	}
	if len(b) > len(buf) {
		buf = make([]byte, len(b))
	}
	w.queue(buf[:copy(buf, b)])
	return len(b), nil
}

// slot returns the buffer the next reply is put in, sending the queued
// replies first when the queue is full.
func (w *udpReplies) slot() ([]byte, error) {
	if w.to == nil {
		return nil, errors.New("dnsgate: reply outside a query")
	}
	if len(w.msgs) == cap(w.msgs) {
		if err := w.flush(); err != nil {
			return nil, err
		}
	}
	return w.bufs[len(w.msgs)], nil
}

// queue adds reply b, to the sender of the query being answered.
func (w *udpReplies) queue(b []byte) {
	m := ipv4.Message{Buffers: [][]byte{b}, Addr: w.to}
	if w.src.IsValid() {
		m.OOB = transparent.PutSrc(w.oobs[len(w.msgs)], w.src)
	}
	w.msgs = append(w.msgs, m)
}

// flush sends the queued replies and empties the queue. A reply the kernel
// refuses is dropped, as a failed sendmsg drops it, and the rest are still
// sent; the first such error is returned.
func (w *udpReplies) flush() error {
	var first error
	for ms := w.msgs; len(ms) > 0; {
		n, err := w.bc.WriteBatch(ms, 0)
		if err != nil || n < 1 {
			// sendmmsg fails only when it sent none, that is on ms[0].
			if first == nil {
				first = err
			}
			n = 1
		}
		ms = ms[n:]
	}
	clear(w.msgs)
	w.msgs = w.msgs[:0]
	return first
}

func (w *udpReplies) Close() error        { return nil }
func (w *udpReplies) TsigStatus() error   { return nil }
func (w *udpReplies) TsigTimersOnly(bool) {}
func (w *udpReplies) Hijack()             {}

// udpWriter is the dns.ResponseWriter of one UDP query answered on its
// own: its reply is written at once.
type udpWriter struct {
	pc  *net.UDPConn
	to  *net.UDPAddr
	src netip.Addr // on a transparent gate, where the query was sent
}

func (w *udpWriter) LocalAddr() net.Addr  { return w.pc.LocalAddr() }
func (w *udpWriter) RemoteAddr() net.Addr { return w.to }

func (w *udpWriter) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

func (w *udpWriter) Write(b []byte) (int, error) {
	if !w.src.IsValid() {
		return w.pc.WriteToUDP(b, w.to)
	}
	n, _, err := w.pc.WriteMsgUDP(b, transparent.PutSrc(make([]byte, transparent.OOBSize), w.src), w.to)
	return n, err
}
func (w *udpWriter) Close() error        { return nil }
func (w *udpWriter) TsigStatus() error   { return nil }
func (w *udpWriter) TsigTimersOnly(bool) {}
func (w *udpWriter) Hijack()             {}
