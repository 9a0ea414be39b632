package dnsgate

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/airlockhq/airlock/policy"
)

// maxFastName is the longest name, in wire bytes, that fastAnswer
// answers: with it, every reply it writes fits in udpReplySize bytes.
const maxFastName = 200

// maxFastNames bounds the names and addresses a reader keeps in text.
const maxFastNames = 4096

// Bits of a DNS header's second word.
const (
	bitQR = 1 << 15
	bitRD = 1 << 8
	bitRA = 1 << 7
	bitCD = 1 << 4
)

// edeDenied starts the Extended DNS Error text of a denied name (addEDE).
const edeDenied = "airlock: denied by airlock: "

// maxReasonLen is the longest text of a policy.Reason.
var maxReasonLen = func() int {
	n := 0
	for r := range 256 {
		n = max(n, len(policy.Reason(r).String()))
	}
	return n
}()

// fastState is what a UDP reader keeps from query to query for fastAnswer.
type fastState struct {
	name  [maxFastName]byte     // the name of the query being read
	names map[string]string     // names read before, to decide on without allocating
	addrs map[netip.Addr]string // addresses in text, for clients no member is named behind
}

// fastQuery is a query as fastAnswer reads it.
type fastQuery struct {
	id, bits uint16
	qtype    uint16
	question []byte // the question as sent: name, type and class
	wireName []byte // the question's name as sent
	name     []byte // lower case, in presentation form without the last dot
	edns     bool   // the query has an OPT record
}

// parseFastQuery reads b as a query fastAnswer may answer: not a
// response, opcode QUERY, one question for A, AAAA, HTTPS or SVCB of class
// IN, whose name (of at most maxFastName bytes, not the root) has labels
// of letters, digits, hyphens and underscores only, and no other record
// but an OPT without options, with no bytes after it. It writes the name,
// lower-cased, into name, which has room for it.
func parseFastQuery(b, name []byte) (fastQuery, bool) {
	var q fastQuery
	if len(b) < 12 {
		return q, false
	}
	q.id, q.bits = binary.BigEndian.Uint16(b), binary.BigEndian.Uint16(b[2:])
	ar := binary.BigEndian.Uint16(b[10:])
	if q.bits&bitQR != 0 || int(q.bits>>11)&0xF != dns.OpcodeQuery ||
		binary.BigEndian.Uint16(b[4:]) != 1 || binary.BigEndian.Uint16(b[6:]) != 0 ||
		binary.BigEndian.Uint16(b[8:]) != 0 || ar > 1 {
		return q, false
	}
	off := 12
	name = name[:0]
	for {
		if off >= len(b) {
			return q, false
		}
		l := int(b[off])
		if l == 0 {
			off++
			break
		}
		// l > 63 is a compression pointer or an extended label type.
		if l > 63 || off+1+l > len(b) || off+1+l-12 >= maxFastName {
			return q, false
		}
		if len(name) > 0 {
			name = append(name, '.')
		}
		for _, c := range b[off+1 : off+1+l] {
			switch {
			case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
			case 'A' <= c && c <= 'Z':
				c += 'a' - 'A'
			default:
				return q, false
			}
			name = append(name, c)
		}
		off += 1 + l
	}
	if len(name) == 0 || off+4 > len(b) {
		return q, false
	}
	q.wireName, q.name = b[12:off], name
	q.qtype = binary.BigEndian.Uint16(b[off:])
	if binary.BigEndian.Uint16(b[off+2:]) != dns.ClassINET {
		return q, false
	}
	switch q.qtype {
	case dns.TypeA, dns.TypeAAAA, dns.TypeHTTPS, dns.TypeSVCB:
	default:
		return q, false
	}
	off += 4
	q.question = b[12:off]
	if ar == 1 {
		// OPT: the root name, its type, payload size, extended RCODE and
		// flags, and no data.
		if len(b)-off < 11 || b[off] != 0 || binary.BigEndian.Uint16(b[off+1:]) != dns.TypeOPT ||
			binary.BigEndian.Uint16(b[off+9:]) != 0 {
			return q, false
		}
		q.edns = true
		off += 11
	}
	return q, off == len(b)
}

// fastAnswer answers datagram b, from out's current sender, from its wire
// bytes when parseFastQuery takes it and the sender is a client of the
// sandbox: the queries a sandbox sends most. The reply is byte for byte
// the one ServeDNS writes, and so are the event and the log line
// (TestFastAnswerLikeServeDNS); the name is decided on, and handed a fake
// IP, the same way. It allocates nothing for a name it has seen before
// (kept by the pool or by st) unless an event is wanted. It reports false,
// having done nothing, for any other datagram.
func (g *Gate) fastAnswer(out *udpReplies, st *fastState, b []byte) bool {
	q, ok := parseFastQuery(b, st.name[:])
	if !ok {
		return false
	}
	// The largest reply: an A record, or an OPT with an Extended DNS Error.
	if 12+len(q.question)+max(len(q.wireName)+14, 11+6+len(edeDenied)+maxReasonLen) > udpReplySize {
		return false
	}
	addr := sockaddrAddr(out.to).Addr()
	if g.cfg.Clients.IsValid() && !g.cfg.Clients.Contains(addr) {
		return false
	}
	name, ok := st.intern(g.cfg.Pool, q.name)
	if !ok || policy.IsInternalName(name) {
		// airlock.internal and the names under it are answered by
		// ServeDNS (Gate.internal), whatever the policy says.
		return false
	}
	source := st.source(g, addr)
	d := g.cfg.Policy.DecideName(source, name)

	ev := Event{Sandbox: g.cfg.Sandbox, Addr: addr, Source: source, Name: name, Type: dns.Type(q.qtype).String()}
	if d.Rule != nil {
		ev.Rule = d.Rule.Pattern.String()
	}
	var ip netip.Addr
	rcode, an, ar := dns.RcodeSuccess, 0, 0
	switch {
	case d.Verdict == policy.Deny && d.Reason != policy.ReasonUnknown:
		ev.Verdict = VerdictDenied
		rcode = dns.RcodeNameError
		if q.edns {
			ar = 1
		}
	case q.qtype == dns.TypeA:
		ev.Verdict = VerdictFake
		ip = g.cfg.Pool.Assign(name)
		an = 1
	default:
		ev.Verdict, ev.Reason = VerdictNoData, "sandboxes are IPv4-only and connect through the proxy"
	}

	if buf, err := out.slot(); err != nil {
		g.log.Debug("write dns reply", "err", err)
	} else {
		binary.BigEndian.PutUint16(buf, q.id)
		binary.BigEndian.PutUint16(buf[2:], bitQR|q.bits&(bitRD|bitCD)|bitRA|uint16(rcode))
		binary.BigEndian.PutUint16(buf[4:], 1)
		binary.BigEndian.PutUint16(buf[6:], uint16(an))
		binary.BigEndian.PutUint16(buf[8:], 0)
		binary.BigEndian.PutUint16(buf[10:], uint16(ar))
		n := 12 + copy(buf[12:], q.question)
		if an == 1 {
			n += copy(buf[n:], q.wireName)
			binary.BigEndian.PutUint16(buf[n:], dns.TypeA)
			binary.BigEndian.PutUint16(buf[n+2:], dns.ClassINET)
			binary.BigEndian.PutUint32(buf[n+4:], g.cfg.TTL)
			binary.BigEndian.PutUint16(buf[n+8:], 4)
			a := ip.As4()
			n += 10 + copy(buf[n+10:], a[:])
		}
		if ar == 1 {
			// As addEDE writes it: payload size 1232, no flags, the
			// Blocked code and the reason.
			reason := d.Reason.String()
			buf[n] = 0
			binary.BigEndian.PutUint16(buf[n+1:], dns.TypeOPT)
			binary.BigEndian.PutUint16(buf[n+3:], 1232)
			binary.BigEndian.PutUint32(buf[n+5:], 0)
			binary.BigEndian.PutUint16(buf[n+9:], uint16(6+len(edeDenied)+len(reason)))
			binary.BigEndian.PutUint16(buf[n+11:], dns.EDNS0EDE)
			binary.BigEndian.PutUint16(buf[n+13:], uint16(2+len(edeDenied)+len(reason)))
			binary.BigEndian.PutUint16(buf[n+15:], dns.ExtendedErrorCodeBlocked)
			n += 17
			n += copy(buf[n:], edeDenied)
			n += copy(buf[n:], reason)
		}
		out.queue(buf[:n])
	}

	// The event's texts cost allocations: made only for whoever takes them.
	level := slog.LevelDebug
	if ev.Verdict == VerdictDenied || g.cfg.LogAllowed {
		level = slog.LevelInfo
	}
	if g.cfg.OnEvent != nil || g.cfg.OnEventHeld != nil || g.log.Enabled(context.Background(), level) {
		ev.Time = time.Now()
		switch ev.Verdict {
		case VerdictDenied:
			ev.Reason = d.Reason.String()
		case VerdictFake:
			ev.Reason = ip.String()
		}
		g.emitHeld(ev, out)
	}
	return true
}

// intern returns b as a string: one the pool or st already holds, else a
// new one that st keeps. It reports false when b is not a normal name
// (policy.IsNormalName).
func (st *fastState) intern(pool *Pool, b []byte) (string, bool) {
	s, ok := st.names[string(b)]
	if !ok {
		if s, ok = pool.lookup(b); !ok {
			s = string(b)
			if st.names == nil || len(st.names) >= maxFastNames {
				st.names = make(map[string]string)
			}
			st.names[s] = s
		}
	}
	return s, policy.IsNormalName(s)
}

// source returns what Gate.source returns for addr, keeping the text of
// addresses no member is named behind.
func (st *fastState) source(g *Gate, addr netip.Addr) string {
	if g.cfg.Members != nil {
		if s := g.cfg.Members(addr); s != "" {
			return s
		}
	}
	s, ok := st.addrs[addr]
	if !ok {
		s = addr.String()
		if st.addrs == nil || len(st.addrs) >= maxFastNames {
			st.addrs = make(map[netip.Addr]string)
		}
		st.addrs[addr] = s
	}
	return s
}
