package dnsgate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/airlockhq/airlock/internal/ratelog"
	"github.com/airlockhq/airlock/internal/transparent"
	"github.com/airlockhq/airlock/policy"
)

// Decider is the policy question the gate asks about a name.
type Decider interface {
	// DecideName answers for a DNS name asked by source (see
	// policy.Ruleset.DecideName).
	DecideName(source, name string) policy.Decision
}

// Verdicts of DNS events.
const (
	VerdictFake      = "fake-ip"   // A query answered from the fake-IP pool
	VerdictForwarded = "forwarded" // answered by an upstream server
	VerdictNoData    = "nodata"    // AAAA, HTTPS, SVCB: no records by design
	VerdictReverse   = "reverse"   // PTR of a fake IP answered with its name
	VerdictDenied    = "denied"    // NXDOMAIN: a deny rule matched
	VerdictRefused   = "refused"   // REFUSED: type not allowed, or name not allowlisted
	VerdictTripped   = "exfiltration"
	VerdictError     = "error"    // SERVFAIL: upstream failed
	VerdictInternal  = "internal" // airlock.internal, answered with the gateway
)

// Event records one query.
type Event struct {
	Time    time.Time
	Sandbox string
	Source  string // member label, or its address when unknown
	Addr    netip.Addr
	Name    string
	Type    string
	Verdict string
	Rule    string // the pattern that decided, if any
	Reason  string
	Trip    *Trip // set for exfiltration trips
}

// Config configures a Gate.
type Config struct {
	// Sandbox names the sandbox the gate serves, for events. Required.
	Sandbox string
	// Listen is the address the gate binds for UDP and TCP, normally the
	// sandbox bridge's address and port 53. Required.
	Listen netip.AddrPort
	// Transparent binds with IP_TRANSPARENT, so that the gate takes the
	// queries airlock's tproxy rules hand it whatever address they were
	// sent to, and answers each from that address (airlockd sets it; it
	// needs CAP_NET_ADMIN).
	Transparent bool
	// Clients is the range queries may come from (the sandbox subnet);
	// others are refused. Zero means any.
	Clients netip.Prefix
	// Policy decides names. Required.
	Policy Decider
	// Pool hands out fake IPs; it may be shared by gates. Required.
	Pool *Pool
	// Upstream answers forwarded queries. Required.
	Upstream Exchanger
	// Guard checks names before they are forwarded. Required.
	Guard *Guard
	// Members names the member behind an address; nil, or "" from it, means
	// the address itself names the source.
	Members func(netip.Addr) string
	// OnEvent receives every query's event; nil means none. It must not
	// block.
	OnEvent func(Event)
	// OnEventHeld and Commit, when both are set, take the events of the
	// queries a read of UDP datagrams answers at once (fake-IP and denied
	// answers) in OnEvent's place: the gate calls Commit after their
	// events and before it sends their answers, so their records can
	// share one write (audit.Journal.AddHeld and Commit) and none is lost
	// for an answer a member got.
	OnEventHeld func(Event)
	Commit      func()
	// Recording, when set, says why events are not being recorded
	// (audit.Journal.Err); while it returns an error, every query is
	// answered SERVFAIL before anything is decided, forwarded or recorded,
	// and an answer made while records stopped is sent as SERVFAIL: the
	// gate answers nothing it could not record.
	Recording func() error
	// Logger receives one line per decision; nil means slog.Default().
	Logger *slog.Logger
	// LogAllowed logs answered queries at info; false logs them at debug,
	// so that only refusals show by default.
	LogAllowed bool
	// TTL of fake-IP answers in seconds; 0 means DefaultTTL.
	TTL uint32
	// UpstreamTimeout bounds one forwarded query; 0 means 5 s.
	UpstreamTimeout time.Duration
	// MaxForwarded is the most queries the gate forwards upstream at once,
	// over UDP and TCP together; another one is answered SERVFAIL at once.
	// Each holds a socket and a goroutine for up to UpstreamTimeout, so
	// without a bound a member's flood of queries for an allowed name
	// would take airlockd's descriptors from every sandbox. 0 means
	// DefaultMaxForwarded.
	MaxForwarded int
	// Internal is the IPv4 address policy.InternalName (airlock.internal)
	// answers with: the gateway, where the proxy serves the member API.
	// Zero means Listen's address; when that is unspecified too, the name
	// does not exist.
	Internal netip.Addr
}

// DefaultMaxForwarded is a gate's MaxForwarded when its config names none.
const DefaultMaxForwarded = 256

// DefaultTTL is the TTL, in seconds, of fake-IP answers: short, so that a
// name's answer follows policy and pool changes quickly.
const DefaultTTL = 5

// Gate is a sandbox's DNS server.
type Gate struct {
	cfg       Config
	log       *slog.Logger
	forwarded chan struct{} // a slot for each query being forwarded, MaxForwarded in all
	// refused counts the queries answered SERVFAIL, with no record each,
	// while records could not be written; logged once they can again.
	refused ratelog.Count

	mu      sync.Mutex // guards servers, udp, closed and addr
	servers []*dns.Server
	udp     []*net.UDPConn // served by serveUDP; none when a server in servers has UDP
	closed  bool
	addr    netip.AddrPort
	wg      sync.WaitGroup
}

// New checks cfg and returns a gate; Start binds it.
func New(cfg Config) (*Gate, error) {
	switch {
	case cfg.Sandbox == "":
		return nil, errors.New("dnsgate: no sandbox name")
	case !cfg.Listen.IsValid():
		return nil, errors.New("dnsgate: no listen address")
	case cfg.Policy == nil, cfg.Pool == nil, cfg.Upstream == nil, cfg.Guard == nil:
		return nil, errors.New("dnsgate: policy, pool, upstream and guard are required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = 5 * time.Second
	}
	if cfg.MaxForwarded == 0 {
		cfg.MaxForwarded = DefaultMaxForwarded
	}
	if cfg.MaxForwarded < 0 {
		return nil, errors.New("dnsgate: MaxForwarded is negative")
	}
	if !cfg.Internal.IsValid() && !cfg.Listen.Addr().IsUnspecified() {
		cfg.Internal = cfg.Listen.Addr()
	}
	if cfg.Internal.IsValid() && !cfg.Internal.Is4() {
		return nil, errors.New("dnsgate: the internal address must be IPv4")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Gate{cfg: cfg, log: log.With("component", "dnsgate", "sandbox", cfg.Sandbox),
		forwarded: make(chan struct{}, cfg.MaxForwarded)}, nil
}

// Start binds UDP and TCP on the listen address and serves until Close. A
// taken port is an error that names the process holding it.
func (g *Gate) Start() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return errors.New("dnsgate: closed")
	}
	// Bound to every address, replies must leave from the one each query
	// came to, which miekg/dns's server arranges per datagram. Bound to
	// one, the gate's own readers serve it, with a socket for each core
	// the runtime uses (transparent.ListenPackets).
	miekg := g.cfg.Listen.Addr().IsUnspecified() && !g.cfg.Transparent
	sockets := runtime.GOMAXPROCS(0)
	if miekg {
		sockets = 1
	}
	pcs, ln, err := g.listen(sockets)
	if err != nil {
		return err
	}
	addr := pcs[0].LocalAddr().String()
	g.addr = pcs[0].LocalAddr().(*net.UDPAddr).AddrPort()
	tcp := &dns.Server{Listener: &tcpLimit{Listener: ln, log: g.log}, Handler: g, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
	g.servers = []*dns.Server{tcp}
	if miekg {
		g.servers = append(g.servers, &dns.Server{PacketConn: pcs[0], Handler: g, UDPSize: udpReadSize})
	} else {
		g.udp = pcs
		// The readers get the sockets themselves: Close clears g.udp.
		for i := range max(2, len(pcs)) {
			pc := pcs[i%len(pcs)]
			g.wg.Go(func() { g.serveUDP(pc) })
		}
	}
	for _, s := range g.servers {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			if err := s.ActivateAndServe(); err != nil {
				g.log.Error("dns server stopped", "err", err)
			}
		}()
		<-started
	}
	g.log.Info("dns gate listening", "addr", addr)
	return nil
}

// listen binds the UDP sockets and the TCP listener. With port 0 (tests),
// TCP takes the port UDP got; when a TCP socket of another program holds
// that port, it tries other ports, a few times.
func (g *Gate) listen(sockets int) ([]*net.UDPConn, net.Listener, error) {
	for attempt := 1; ; attempt++ {
		pcs, err := transparent.ListenPackets("udp4", g.cfg.Listen, g.cfg.Transparent, sockets)
		if err != nil {
			return nil, nil, listenError("udp", g.cfg.Listen, err)
		}
		ln, err := transparent.Listen("tcp4", pcs[0].LocalAddr().(*net.UDPAddr).AddrPort(), g.cfg.Transparent)
		if err == nil {
			return pcs, ln, nil
		}
		for _, pc := range pcs {
			pc.Close()
		}
		if g.cfg.Listen.Port() != 0 || attempt == 20 {
			return nil, nil, listenError("tcp", g.cfg.Listen, err)
		}
	}
}

// Addr returns the address the gate is bound to, once started.
func (g *Gate) Addr() netip.AddrPort {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.addr
}

// Close stops the gate and waits for its goroutines. It is idempotent.
func (g *Gate) Close() error {
	g.mu.Lock()
	servers, udp := g.servers, g.udp
	g.servers, g.udp, g.closed = nil, nil, true
	g.mu.Unlock()
	var errs []error
	for _, pc := range udp {
		errs = append(errs, pc.Close())
	}
	for _, s := range servers {
		if err := s.Shutdown(); err != nil {
			errs = append(errs, err)
		}
	}
	g.wg.Wait()
	g.sayRefused() // what no later query would have told
	return errors.Join(errs...)
}

// ServeDNS answers one query. It implements dns.Handler.
func (g *Gate) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	if g.unrecorded() {
		// Refused before anything is decided or recorded (see serveUDP).
		g.refused.Add()
		w.WriteMsg(servfail(req))
		return
	}
	resp := g.answer(req, remoteAddr(w))
	if resp == nil {
		return
	}
	if _, batched := w.(*udpReplies); !batched && g.unrecorded() {
		// Records stopped while it was answered. (A batch's replies are
		// checked when they are sent.)
		resp = servfail(req)
	}
	if _, ok := w.RemoteAddr().(*net.UDPAddr); ok {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(int(opt.UDPSize()), dns.MinMsgSize)
		}
		resp.Truncate(size)
	}
	if err := w.WriteMsg(resp); err != nil {
		g.log.Debug("write dns reply", "err", err)
	}
}

func remoteAddr(w dns.ResponseWriter) netip.Addr {
	switch a := w.RemoteAddr().(type) {
	case *net.UDPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

// answer builds the reply to req from addr; nil means send nothing.
func (g *Gate) answer(req *dns.Msg, addr netip.Addr) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	resp.Authoritative = false
	ev := Event{Time: time.Now(), Sandbox: g.cfg.Sandbox, Addr: addr, Source: g.source(addr)}
	defer func() { g.emit(ev) }()

	if req.Response || len(req.Question) != 1 {
		ev.Verdict, ev.Reason = VerdictRefused, "not one question"
		resp.SetRcodeFormatError(req)
		return resp
	}
	q := req.Question[0]
	ev.Name, ev.Type = q.Name, dns.Type(q.Qtype).String()
	switch {
	case req.Opcode != dns.OpcodeQuery:
		ev.Verdict, ev.Reason = VerdictRefused, "opcode "+dns.OpcodeToString[req.Opcode]
		resp.Rcode = dns.RcodeNotImplemented
		return resp
	case g.cfg.Clients.IsValid() && !g.cfg.Clients.Contains(addr):
		ev.Verdict, ev.Reason = VerdictRefused, "client outside the sandbox subnet"
		return refuse(req, resp, ev.Reason)
	case q.Qclass != dns.ClassINET:
		ev.Verdict, ev.Reason = VerdictRefused, "class "+dns.Class(q.Qclass).String()
		return refuse(req, resp, "only class IN is served")
	}
	name, err := policy.NormalizeHost(q.Name)
	if err != nil {
		ev.Verdict, ev.Reason = VerdictRefused, "not a valid name"
		return refuse(req, resp, "not a valid name")
	}
	ev.Name = name

	switch q.Qtype {
	case dns.TypeNULL, dns.TypeANY, dns.TypeAXFR, dns.TypeIXFR:
		ev.Verdict, ev.Reason = VerdictRefused, "record type never served"
		return refuse(req, resp, ev.Type+" queries are refused by airlock")
	case dns.TypePTR:
		return g.reverse(req, resp, name, &ev)
	}
	if policy.IsInternalName(name) {
		return g.internal(req, resp, name, &ev)
	}

	d := g.cfg.Policy.DecideName(ev.Source, name)
	if d.Rule != nil {
		ev.Rule = d.Rule.Pattern.String()
	}
	if d.Verdict == policy.Deny && d.Reason != policy.ReasonUnknown {
		ev.Verdict, ev.Reason = VerdictDenied, d.Reason.String()
		resp.Rcode = dns.RcodeNameError
		addEDE(req, resp, "denied by airlock: "+d.Reason.String())
		return resp
	}
	switch q.Qtype {
	case dns.TypeA:
		ip := g.cfg.Pool.Assign(name)
		ev.Verdict, ev.Reason = VerdictFake, ip.String()
		resp.Answer = append(resp.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: g.cfg.TTL},
			A:   ip.AsSlice(),
		})
		return resp
	case dns.TypeAAAA, dns.TypeHTTPS, dns.TypeSVCB:
		ev.Verdict, ev.Reason = VerdictNoData, "sandboxes are IPv4-only and connect through the proxy"
		return resp
	}
	if d.Verdict != policy.Allow || d.Rule == nil {
		ev.Verdict, ev.Reason = VerdictRefused, "no allow rule for this name"
		return refuse(req, resp, "no allow rule for this name; approve it to resolve "+ev.Type+" records")
	}
	return g.forward(req, resp, name, &ev)
}

func (g *Gate) forward(req, resp *dns.Msg, name string, ev *Event) *dns.Msg {
	trip, ok := g.cfg.Guard.Check(name)
	if trip != nil {
		ev.Trip = trip
	}
	if !ok {
		ev.Verdict, ev.Reason = VerdictTripped, trip.Reason
		return refuse(req, resp, "exfiltration guard: "+trip.Reason)
	}
	if g.unrecorded() {
		// The name would leave the sandbox with no record of it.
		ev.Verdict, ev.Reason = VerdictError, "records cannot be written"
		resp.Rcode = dns.RcodeServerFailure
		return resp
	}
	select {
	case g.forwarded <- struct{}{}:
		defer func() { <-g.forwarded }()
	default:
		ev.Verdict, ev.Reason = VerdictError, fmt.Sprintf("%d queries of the sandbox are being forwarded already", cap(g.forwarded))
		resp.Rcode = dns.RcodeServerFailure
		return resp
	}
	q := req.Question[0]
	up := new(dns.Msg)
	up.SetQuestion(dns.Fqdn(name), q.Qtype)
	up.SetEdns0(1232, false)
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.UpstreamTimeout)
	defer cancel()
	r, err := g.cfg.Upstream.Exchange(ctx, up)
	if err != nil {
		ev.Verdict, ev.Reason = VerdictError, err.Error()
		resp.Rcode = dns.RcodeServerFailure
		return resp
	}
	ev.Verdict, ev.Reason = VerdictForwarded, dns.RcodeToString[r.Rcode]
	if trip != nil {
		ev.Verdict = VerdictTripped
	}
	resp.Rcode = r.Rcode
	resp.Answer, resp.Ns = r.Answer, r.Ns
	for _, rr := range r.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			resp.Extra = append(resp.Extra, rr)
		}
	}
	return resp
}

// internal answers airlock.internal, whatever the policy says, with the
// gateway (A; other types have no data), and nothing under it: the member
// API's name is airlock's own, never forwarded and never a fake IP.
func (g *Gate) internal(req, resp *dns.Msg, name string, ev *Event) *dns.Msg {
	if name != policy.InternalName || !g.cfg.Internal.IsValid() {
		ev.Verdict, ev.Reason = VerdictDenied, "reserved: only "+policy.InternalName+" itself exists"
		resp.Rcode = dns.RcodeNameError
		resp.Authoritative = true
		return resp
	}
	resp.Authoritative = true
	ev.Verdict, ev.Reason = VerdictInternal, "the member API"
	q := req.Question[0]
	if q.Qtype == dns.TypeA {
		ev.Reason = g.cfg.Internal.String()
		resp.Answer = append(resp.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: g.cfg.TTL},
			A:   g.cfg.Internal.AsSlice(),
		})
	}
	return resp
}

func (g *Gate) reverse(req, resp *dns.Msg, name string, ev *Event) *dns.Msg {
	if ip, ok := ptrAddr(name); ok && g.cfg.Pool.Contains(ip) {
		if host, ok := g.cfg.Pool.Name(ip); ok {
			ev.Verdict, ev.Reason = VerdictReverse, host
			resp.Answer = append(resp.Answer, &dns.PTR{
				Hdr: dns.RR_Header{Name: req.Question[0].Name, Rrtype: dns.TypePTR, Class: dns.ClassINET, Ttl: g.cfg.TTL},
				Ptr: dns.Fqdn(host),
			})
			return resp
		}
		ev.Verdict, ev.Reason = VerdictDenied, "fake IP not assigned"
		resp.Rcode = dns.RcodeNameError
		return resp
	}
	// Reverse names of real addresses would carry data upstream and help no
	// sandboxed program; they are never forwarded.
	ev.Verdict, ev.Reason = VerdictRefused, "reverse lookups outside the fake-IP pool are not forwarded"
	return refuse(req, resp, ev.Reason)
}

// ptrAddr reads "d.c.b.a.in-addr.arpa" as a.b.c.d.
func ptrAddr(name string) (netip.Addr, bool) {
	rest, ok := strings.CutSuffix(name, ".in-addr.arpa")
	if !ok {
		return netip.Addr{}, false
	}
	p := strings.Split(rest, ".")
	if len(p) != 4 {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(p[3] + "." + p[2] + "." + p[1] + "." + p[0])
	return a, err == nil
}

func refuse(req, resp *dns.Msg, why string) *dns.Msg {
	resp.Rcode = dns.RcodeRefused
	addEDE(req, resp, why)
	return resp
}

// addEDE attaches an Extended DNS Error (Blocked) when the client speaks
// EDNS; RFC 6891 forbids an OPT record in a reply to a query without one.
func addEDE(req, resp *dns.Msg, why string) {
	opt := req.IsEdns0()
	if opt == nil {
		return
	}
	resp.SetEdns0(1232, false)
	ro := resp.IsEdns0()
	ro.Option = append(ro.Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeBlocked, ExtraText: "airlock: " + why})
}

func (g *Gate) source(addr netip.Addr) string {
	if g.cfg.Members != nil {
		if s := g.cfg.Members(addr); s != "" {
			return s
		}
	}
	if !addr.IsValid() {
		return ""
	}
	return addr.String()
}

func (g *Gate) emit(ev Event) { g.emitTo(ev, g.cfg.OnEvent) }

// unrecorded reports that events are not being recorded (Config.Recording).
// The first call that finds them recorded again logs how many queries were
// refused meanwhile (sayRefused): those have no record of their own.
func (g *Gate) unrecorded() bool {
	if g.cfg.Recording == nil {
		return false
	}
	if g.cfg.Recording() != nil {
		return true
	}
	g.sayRefused()
	return false
}

// sayRefused logs how many queries were refused unrecorded since it last
// did, if any: once records are written again, and at Close.
func (g *Gate) sayRefused() {
	g.refused.Say(g.log, "dns: queries were answered SERVFAIL, unrecorded, while records could not be written", "queries")
}

// servfail is the SERVFAIL answer to req.
func servfail(req *dns.Msg) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetRcode(req, dns.RcodeServerFailure)
	resp.RecursionAvailable = true
	return resp
}

// emitHeld emits the event of a query answered in a read of datagrams,
// held when the config holds events: out commits them before it sends.
func (g *Gate) emitHeld(ev Event, out *udpReplies) {
	if g.cfg.OnEventHeld == nil || g.cfg.Commit == nil {
		g.emit(ev)
		return
	}
	out.commit = g.cfg.Commit
	g.emitTo(ev, g.cfg.OnEventHeld)
}

func (g *Gate) emitTo(ev Event, to func(Event)) {
	level := slog.LevelDebug
	switch ev.Verdict {
	case VerdictDenied, VerdictRefused, VerdictTripped, VerdictError:
		level = slog.LevelInfo
	default:
		if g.cfg.LogAllowed {
			level = slog.LevelInfo
		}
	}
	// Checked first: boxing the attributes costs allocations on every
	// query, also when the line is not written.
	if ctx := context.Background(); g.log.Enabled(ctx, level) {
		g.log.Log(ctx, level, "dns",
			"source", ev.Source, "host", ev.Name, "type", ev.Type, "verdict", ev.Verdict, "rule", ev.Rule, "reason", ev.Reason)
	}
	if ev.Trip != nil {
		g.log.Warn("exfiltration guard tripped", "source", ev.Source, "host", ev.Name, "domain", ev.Trip.Domain,
			"reason", ev.Trip.Reason, "blocked", ev.Trip.Blocked)
	}
	if to != nil {
		to(ev)
	}
}

// Bounds of a gate's DNS-over-TCP connections, each a descriptor and a
// goroutine of airlockd's that a member keeps as long as it asks on it
// (invariant 17).
const (
	maxTCPConns          = 512 // a gate's at once
	maxTCPConnsPerClient = 16  // one client address's at once
)

// tcpLimit is the gate's TCP listener: a connection past maxTCPConns, or
// past maxTCPConnsPerClient from its address, is closed at accept.
type tcpLimit struct {
	net.Listener
	log *slog.Logger

	mu    sync.Mutex // guards the following fields
	total int
	per   map[netip.Addr]int
}

func (l *tcpLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		var addr netip.Addr
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			addr = a.AddrPort().Addr().Unmap()
		}
		l.mu.Lock()
		ok := l.total < maxTCPConns && l.per[addr] < maxTCPConnsPerClient
		if ok {
			if l.per == nil {
				l.per = map[netip.Addr]int{}
			}
			l.total++
			l.per[addr]++
		}
		l.mu.Unlock()
		if ok {
			return &limitedConn{Conn: c, l: l, addr: addr}, nil
		}
		l.log.Debug("dns over tcp: connection closed at the limit", "addr", addr.String())
		c.Close()
	}
}

func (l *tcpLimit) release(addr netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.per[addr]--; l.per[addr] <= 0 {
		delete(l.per, addr)
	}
}

// limitedConn gives its place back to its tcpLimit when closed.
type limitedConn struct {
	net.Conn
	l    *tcpLimit
	addr netip.Addr
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.addr) })
	return err
}

// listenError explains a failed bind in words a user can act on.
func listenError(proto string, addr netip.AddrPort, err error) error {
	if errors.Is(err, syscallEADDRINUSE) {
		if who := portOwner(proto, addr.Port()); who != "" {
			return fmt.Errorf("dns gate: %s port %d on %s is taken by %s; stop it or choose another sandbox subnet", proto, addr.Port(), addr.Addr(), who)
		}
		return fmt.Errorf("dns gate: %s port %d on %s is taken; stop the program holding it or choose another sandbox subnet", proto, addr.Port(), addr.Addr())
	}
	if errors.Is(err, syscallEADDRNOTAVAIL) {
		return fmt.Errorf("dns gate: %s is not an address of this host (is the sandbox bridge up?): %w", addr.Addr(), err)
	}
	return fmt.Errorf("dns gate: listen %s %s: %w", proto, addr, err)
}
