package dnsgate

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"
	"unsafe"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/nowait"
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
// exactly: see replyTo. Start runs one or more of these on each of its
// sockets.
//
// The common queries (see fastAnswer) are answered from their wire bytes,
// and the batches are read and written through buffers, addresses and
// control messages set up once: such a query allocates nothing, so the
// garbage collector, whose every cycle walks the policy's rules, seldom
// runs however large the policy.
//
// On a transparent gate each datagram's destination is read from its
// IP_PKTINFO, and its reply leaves from that address: a member that asked
// 203.0.113.53 is answered by 203.0.113.53.
func (g *Gate) serveUDP(pc *net.UDPConn) {
	tp := g.cfg.Transparent
	rc, err := pc.SyscallConn()
	if err != nil {
		g.log.Error("dns gate: udp socket", "err", err)
		return
	}
	in := newUDPBatch(unix.SYS_RECVMMSG, tp)
	out := &udpReplies{pc: pc, rc: rc, batch: newUDPBatch(unix.SYS_SENDMMSG, tp), recording: g.cfg.Recording}
	var st fastState
	for {
		// The socket does not block (the runtime's poller waits for it), so
		// recvmmsg returns as soon as it has taken what is queued: a lone
		// query is answered at once.
		n, err := in.recv(rc)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A socket that keeps failing must not spin a core.
			g.log.Debug("read dns queries", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for i := range n {
			// Without the sender's address there is nobody to answer.
			to, ok := in.from(i)
			if !ok {
				continue
			}
			out.begin(to)
			if tp {
				// Without its destination a reply could not leave from it.
				if out.src, ok = transparent.Dst(in.oob(i)); !ok {
					continue
				}
			}
			b := in.payload(i)
			if g.unrecorded() {
				// Refused before anything is decided or recorded: while
				// the journal fails, a record made now could be one too
				// many for what waits in memory, and be left out of the
				// file while its answer went out.
				if len(b) >= 12 && b[2]&0x80 == 0 { // a query, not a response
					g.refused.Add()
					out.Write(servfailQuery(b))
				}
				continue
			}
			if g.fastAnswer(out, &st, b) {
				continue
			}
			req := replyTo(out, b)
			if req == nil {
				continue
			}
			if len(req.Question) == 1 {
				switch req.Question[0].Qtype {
				case dns.TypeA, dns.TypeAAAA, dns.TypeHTTPS, dns.TypeSVCB:
				default:
					w := &udpWriter{pc: pc, to: out.RemoteAddr().(*net.UDPAddr), src: out.src}
					g.wg.Go(func() { g.ServeDNS(w, req) })
					continue
				}
			}
			// Answered here and now (a query whose question count lied too:
			// it gets FORMERR).
			g.ServeDNS(out, req)
		}
		out.end()
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

// udpMsgs holds the headers, addresses and control messages of up to
// udpBatch datagrams for recvmmsg or sendmmsg, set up once; the headers
// point into the rest, which never moves (the heap does not move
// objects).
type udpMsgs struct {
	hdrs  [udpBatch]unix.Mmsghdr
	iovs  [udpBatch]unix.Iovec
	names [udpBatch]unix.RawSockaddrInet4
	oobs  [udpBatch][]byte // nil on a gate that is not transparent

	// The system call the runtime's poller calls back, made once so that
	// a batch allocates nothing: it moves hdrs[lo:hi] and leaves how
	// many it moved in n, or its error in err.
	call   func(fd uintptr) bool
	send   bool // sendmmsg, else recvmmsg
	lo, hi int
	n      int
	err    error
}

// newUDPBatch returns the messages of a batch for recvmmsg or sendmmsg
// (trap), with room for control messages when tp (a transparent gate).
func newUDPBatch(trap uintptr, tp bool) *udpMsgs {
	m := &udpMsgs{send: trap == unix.SYS_SENDMMSG}
	for i := range m.hdrs {
		h := &m.hdrs[i].Hdr
		h.Name = (*byte)(unsafe.Pointer(&m.names[i]))
		h.Iov = &m.iovs[i]
		h.Iovlen = 1
		if tp {
			m.oobs[i] = make([]byte, transparent.OOBSize)
			h.Control = &m.oobs[i][0]
		}
	}
	m.call = func(fd uintptr) bool {
		var err error
		if m.send {
			m.n, err = nowait.Sendmmsg(fd, m.hdrs[m.lo:m.hi])
		} else {
			m.n, err = nowait.Recvmmsg(fd, m.hdrs[m.lo:m.hi])
		}
		switch {
		case err == unix.EAGAIN:
			return false
		case err != nil && m.send:
			m.err = os.NewSyscallError("sendmmsg", err)
		case err != nil:
			m.err = os.NewSyscallError("recvmmsg", err)
		default:
			m.err = nil
		}
		return true
	}
	return m
}

// recv reads what is queued on the socket, at most udpBatch datagrams, into
// m (whose iovecs, on the first call, get buffers of udpReadSize), waiting
// when nothing is; it returns how many it read.
func (m *udpMsgs) recv(rc syscall.RawConn) (int, error) {
	if m.iovs[0].Base == nil {
		bufs := make([]byte, udpBatch*udpReadSize)
		for i := range m.iovs {
			m.iovs[i].Base = &bufs[i*udpReadSize]
			m.iovs[i].SetLen(udpReadSize)
		}
	}
	for i := range m.hdrs {
		h := &m.hdrs[i]
		h.Hdr.Namelen = unix.SizeofSockaddrInet4
		h.Hdr.SetControllen(len(m.oobs[i]))
		h.Hdr.Flags, h.Len = 0, 0
	}
	m.lo, m.hi = 0, udpBatch
	if err := rc.Read(m.call); err != nil {
		return 0, err
	}
	return m.n, m.err
}

// from returns the sender of datagram i, or false when it has no IPv4
// address.
func (m *udpMsgs) from(i int) (*unix.RawSockaddrInet4, bool) {
	sa := &m.names[i]
	return sa, m.hdrs[i].Hdr.Namelen >= unix.SizeofSockaddrInet4 && sa.Family == unix.AF_INET
}

// payload returns datagram i (cut at udpReadSize).
func (m *udpMsgs) payload(i int) []byte {
	return unsafe.Slice(m.iovs[i].Base, udpReadSize)[:min(int(m.hdrs[i].Len), udpReadSize)]
}

// oob returns the control messages of datagram i.
func (m *udpMsgs) oob(i int) []byte {
	return m.oobs[i][:min(int(m.hdrs[i].Hdr.Controllen), len(m.oobs[i]))]
}

// sockaddrAddr returns the address and port of sa.
func sockaddrAddr(sa *unix.RawSockaddrInet4) netip.AddrPort {
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(p[0])<<8|uint16(p[1]))
}

// udpReplies is the dns.ResponseWriter of the queries of one batch that
// are answered at once. It queues their replies, each to the sender of the
// query being answered when it was written (see begin), and flush sends
// them.
type udpReplies struct {
	pc    *net.UDPConn
	rc    syscall.RawConn
	batch *udpMsgs // the queued replies: batch.hdrs[:n]
	n     int
	bufs  [udpBatch][udpReplySize]byte // reply i is packed into bufs[i] when it fits

	// commit, when set, writes the records of the queued replies' queries
	// (Config.Commit): flush calls it, once, before it sends them.
	commit func()
	// recording is Config.Recording: when it reports an error at flush,
	// every queued reply goes out as SERVFAIL.
	recording func() error

	// The query being answered.
	to     *unix.RawSockaddrInet4 // nil outside a query
	src    netip.Addr             // on a transparent gate, where it was sent
	toAddr *net.UDPAddr           // RemoteAddr, made when asked for
}

// begin starts the answer to the query from to.
func (w *udpReplies) begin(to *unix.RawSockaddrInet4) {
	w.to, w.src, w.toAddr = to, netip.Addr{}, nil
}

// end ends the batch's queries: nothing more is written until begin.
func (w *udpReplies) end() { w.to, w.toAddr = nil, nil }

func (w *udpReplies) LocalAddr() net.Addr { return w.pc.LocalAddr() }

// RemoteAddr returns the sender of the query being answered.
func (w *udpReplies) RemoteAddr() net.Addr {
	if w.toAddr == nil && w.to != nil {
		w.toAddr = net.UDPAddrFromAddrPort(sockaddrAddr(w.to))
	}
	return w.toAddr
}

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
	if w.n == udpBatch {
		if err := w.flush(); err != nil {
			return nil, err
		}
	}
	return w.bufs[w.n][:], nil
}

// queue adds reply b, to the sender of the query being answered.
func (w *udpReplies) queue(b []byte) {
	i := w.n
	w.batch.names[i] = *w.to
	w.batch.iovs[i] = unix.Iovec{}
	if len(b) > 0 {
		w.batch.iovs[i].Base = &b[0]
		w.batch.iovs[i].SetLen(len(b))
	}
	h := &w.batch.hdrs[i].Hdr
	h.Namelen = unix.SizeofSockaddrInet4
	h.SetControllen(0)
	if w.src.IsValid() {
		transparent.PutSrc(w.batch.oobs[i], w.src)
		h.SetControllen(len(w.batch.oobs[i]))
	}
	w.n++
}

// flush sends the queued replies and empties the queue. A reply the kernel
// refuses is dropped, as a failed sendmsg drops it, and the rest are still
// sent; the first such error is returned.
func (w *udpReplies) flush() error {
	if w.commit != nil {
		w.commit()
		w.commit = nil
	}
	m := w.batch
	if w.recording != nil && w.recording() != nil {
		for i := range w.n {
			b := unsafe.Slice(m.iovs[i].Base, m.iovs[i].Len)
			m.iovs[i].SetLen(len(servfailWire(b)))
		}
	}
	var first error
	for m.lo, m.hi = 0, w.n; m.lo < m.hi; {
		if err := w.rc.Write(m.call); err != nil {
			// The socket is closed: nothing more can be sent.
			first = cmpOr(first, err)
			break
		}
		if m.err != nil || m.n < 1 {
			// sendmmsg fails only when it sent none, that is on the first.
			first = cmpOr(first, m.err)
			m.n = 1
		}
		m.lo += m.n
	}
	for i := range w.n {
		m.iovs[i] = unix.Iovec{}
	}
	w.n = 0
	return first
}

// servfailWire turns reply b into SERVFAIL in place: the same header
// without answers, and its question if it has one. It returns what is left.
func servfailWire(b []byte) []byte {
	if len(b) < 12 {
		return b
	}
	b[2] &^= 0x02        // TC
	b[3] = b[3]&0xF0 | 2 // RCODE SERVFAIL
	clear(b[6:12])       // ANCOUNT, NSCOUNT, ARCOUNT
	if binary.BigEndian.Uint16(b[4:]) == 0 {
		return b[:12]
	}
	// One question: its name, uncompressed or a pointer, then type and class.
	end := 12
	for end < len(b) {
		l := int(b[end])
		if l == 0 {
			end++
			break
		}
		if l&0xC0 == 0xC0 {
			end += 2
			break
		}
		end += 1 + l
	}
	end += 4
	if end > len(b) {
		clear(b[4:6])
		return b[:12]
	}
	binary.BigEndian.PutUint16(b[4:], 1)
	return b[:end]
}

// servfailQuery turns query b into its SERVFAIL answer in place.
func servfailQuery(b []byte) []byte {
	b[2] |= 0x80 // QR
	b[3] |= 0x80 // RA
	return servfailWire(b)
}

// cmpOr returns a unless it is nil, else b.
func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
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
