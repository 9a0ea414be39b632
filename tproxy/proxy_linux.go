package tproxy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/ratelog"
	"github.com/airlockhq/airlock/internal/transparent"
	"github.com/airlockhq/airlock/policy"
)

// Decider is the policy the proxy asks about each connection.
type Decider interface {
	Decide(q policy.Query) policy.Decision
}

// Changer is a Decider that says when its answers may change
// (policy.Sandbox.Changed): the channel it returns is closed then. With
// one, what learn mode let through is decided again at every change, not
// only when learn mode was to end (design §3.2).
type Changer interface {
	Changed() <-chan struct{}
}

// Asker holds a connection until a person decides (policy.Broker).
type Asker interface {
	// Ask blocks until a decision or the approval's timeout; ctx ends it
	// early as denied.
	Ask(ctx context.Context, req policy.AskRequest) policy.Outcome
}

// Names maps fake-pool addresses back to the names the gate gave them out
// for (dnsgate.Pool).
type Names interface {
	Contains(a netip.Addr) bool
	Name(a netip.Addr) (string, bool)
}

// Resolver looks a name's IPv4 addresses up upstream. The proxy only asks
// about names policy allowed.
type Resolver func(ctx context.Context, name string) ([]netip.Addr, error)

// Config configures a Proxy. Durations are wall-clock; zero takes the
// default named on each field.
type Config struct {
	// Sandbox names the sandbox, for records and 403 pages. Required.
	Sandbox string
	// Listen is the gateway address and proxy port. Required.
	Listen netip.AddrPort
	// Policy decides connections. Required. If it is also a Changer (as
	// policy.Sandbox is), what learn mode let through is decided again
	// whenever the policy in force changes.
	Policy Decider
	// Approvals holds connections policy answers "ask" for; nil denies them.
	Approvals Asker
	// Names maps fake IPs to names. Required.
	Names Names
	// Resolve resolves approved names upstream. Required.
	Resolve Resolver
	// Members names the member behind a source address; nil, or "", means
	// the address itself.
	Members func(netip.Addr) string
	// OnRecord receives one record per connection when it ends; it must
	// not block.
	OnRecord func(Record)
	// Recording, when set, says why records are not being kept
	// (audit.Journal.Err); while it returns an error, new connections are
	// reset and intercepted requests answered 503: the proxy lets nothing
	// through that it could not record.
	Recording func() error
	// Logger gets one line per connection; nil means slog.Default().
	Logger *slog.Logger
	// LogAllowed logs allowed connections and requests at info; false
	// logs them at debug, so that only refusals show by default.
	LogAllowed bool
	// ApprovalURL is where a person approves, shown in 403 pages.
	ApprovalURL string
	// PeekTimeout bounds the wait for the bytes that name a connection to
	// a raw IP; a client that sends nothing is closed after it. Default 10 s.
	PeekTimeout time.Duration
	// SniffTimeout is how long a connection already named by its fake IP
	// is given to start talking before it is taken for a protocol where
	// the server speaks first (SSH, SMTP). Default 300 ms. On the web's
	// ports (80, 443, 8080, 8443), where the client always speaks first,
	// the window is ten times as long, so a busy client is not taken for a
	// silent one.
	SniffTimeout time.Duration
	// ConnectTimeout bounds each upstream dial. Default 10 s.
	ConnectTimeout time.Duration
	// IdleTimeout closes a spliced connection with no data either way for
	// this long. Default 10 minutes.
	IdleTimeout time.Duration
	// DrainTimeout is how long Close lets open connections finish. Default
	// 5 s; negative means none: Close closes them at once.
	DrainTimeout time.Duration
	// Transparent binds the listener with IP_TRANSPARENT, so that it takes
	// the connections airlock's tproxy rules hand it (airlockd sets it; it
	// needs CAP_NET_ADMIN). A connection to the listen address itself is
	// then one to the host, and is refused like any.
	Transparent bool
	// OrigDst finds a connection's original destination; nil means
	// LocalDst, the accepted socket's own address. Tests replace it.
	OrigDst func(*net.TCPConn) (netip.AddrPort, error)
	// CA mints the certificates of intercepted hosts; nil means TLS to
	// hosts that need interception is refused.
	CA *CA
	// UpstreamRoots verify upstream TLS when intercepting; nil means the
	// system roots.
	UpstreamRoots *x509.CertPool
	// InspectAll reports whether the sandbox intercepts every TLS
	// connection (inspect: all); nil means only where rules need it.
	InspectAll func() bool
	// OnRequest receives one record per intercepted request; it must not
	// block.
	OnRequest func(RequestRecord)
	// AllowECH reports whether the sandbox lets a ClientHello with
	// encrypted_client_hello be spliced (allow_ech); nil means it does not.
	AllowECH func() bool
	// MaxConnsPerMember bounds one member's open connections; 0 means no
	// bound. airlockd derives it from its descriptor limit
	// (DefaultLimits).
	MaxConnsPerMember int
	// MaxConnsPerSandbox bounds the sandbox's open connections; 0 means
	// no bound.
	MaxConnsPerSandbox int
	// IsLocal reports an address of this host; such upstreams are refused
	// like loopback (the host's own services). nil means none.
	IsLocal func(netip.Addr) bool
	// MemberAPI serves the connections members make to the gateway's
	// port 80 (http://airlock.internal/); nil means there is none, and
	// they are refused like any raw IP. Its requests' contexts end when
	// the proxy closes.
	MemberAPI http.Handler
}

// Record describes one connection, written when it ends.
type Record struct {
	ID       uint64
	Time     time.Time
	Sandbox  string
	Source   string // member label, or its address
	Host     string // the name decided on, or the raw IP
	Port     uint16
	Dest     string         // the address the client connected to (fake or real)
	Fake     bool           // Dest is in the fake-IP pool
	Upstream string         // the address dialled, if any
	Verdict  policy.Verdict // Allow or Deny
	Rule     string         // the pattern that decided, if any
	Reason   string
	Up, Down int64 // bytes client → upstream, upstream → client
	Duration time.Duration
	Close    string // how it ended
	LLM      bool   // the host is a known LLM API
}

// Proxy is a sandbox's transparent proxy.
type Proxy struct {
	cfg Config
	log *slog.Logger
	ln  net.Listener
	ids atomic.Uint64
	// refused counts the connections and requests refused, with no record
	// each, while records could not be written; logged once they can
	// again. (A record each would let a member's refusals take the room
	// that records waiting for the file have, and push out those that
	// matter: a person's decisions, connections ending.)
	refused ratelog.Count
	wg      sync.WaitGroup
	close   sync.Once
	ctx     context.Context
	stop    context.CancelFunc

	// mu guards conns.
	mu    sync.Mutex
	conns map[*net.TCPConn]*tracked

	// learnMu guards learned: what learn mode let through and is open
	// (see watchLearned).
	learnMu sync.Mutex
	learned map[*learnWatch]struct{}

	// peekBufs holds MaxPeek-byte buffers for peek: a ClientHello needs a
	// few hundred bytes of one, and a connection that stays open for
	// hours keeps only those.
	peekBufs sync.Pool
	pipes    *pipePool

	h1     *h1Pool // interception's upstream connections
	limits *limiter

	api      *http.Server  // the member API's, or nil
	apiConns chan *apiConn // to api
}

type tracked struct {
	up *net.TCPConn // nil until dialled
}

// New checks cfg and returns a proxy; Start binds it.
func New(cfg Config) (*Proxy, error) {
	switch {
	case cfg.Sandbox == "":
		return nil, errors.New("proxy: no sandbox name")
	case !cfg.Listen.IsValid():
		return nil, errors.New("proxy: no listen address")
	case cfg.Policy == nil, cfg.Names == nil, cfg.Resolve == nil:
		return nil, errors.New("proxy: policy, names and resolver are required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.PeekTimeout, 10*time.Second)
	def(&cfg.SniffTimeout, 300*time.Millisecond)
	def(&cfg.ConnectTimeout, 10*time.Second)
	def(&cfg.IdleTimeout, 10*time.Minute)
	def(&cfg.DrainTimeout, 5*time.Second)
	if cfg.OrigDst == nil {
		cfg.OrigDst = LocalDst
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &Proxy{cfg: cfg, log: log.With("component", "tproxy", "sandbox", cfg.Sandbox),
		conns: make(map[*net.TCPConn]*tracked), learned: make(map[*learnWatch]struct{}), ctx: ctx, stop: stop, pipes: newPipePool(64)}
	p.h1 = &h1Pool{p: p, idle: map[string][]*h1Upstream{}, transports: map[string]*http.Transport{}}
	p.limits = newLimiter(cfg.MaxConnsPerMember, cfg.MaxConnsPerSandbox, p.log)
	if cfg.MemberAPI != nil {
		p.api, p.apiConns = p.newMemberAPI(cfg.MemberAPI), make(chan *apiConn)
	}
	return p, nil
}

// Start binds the listen address and serves until Close.
func (p *Proxy) Start() error {
	ln, err := transparent.Listen("tcp4", p.cfg.Listen, p.cfg.Transparent)
	if err != nil {
		return fmt.Errorf("proxy listener %s: %w", p.cfg.Listen, err)
	}
	p.ln = ln
	p.wg.Add(2)
	go p.accept()
	go p.janitor()
	if ch, ok := p.cfg.Policy.(Changer); ok {
		p.wg.Add(1)
		go p.recheckLearned(ch)
	}
	p.startMemberAPI()
	p.log.Info("proxy listening", "addr", ln.Addr().String())
	return nil
}

// Addr returns the bound address.
func (p *Proxy) Addr() netip.AddrPort {
	return p.ln.Addr().(*net.TCPAddr).AddrPort()
}

// Close stops accepting, lets open connections finish for DrainTimeout,
// then closes the rest and waits for every goroutine. It is idempotent.
func (p *Proxy) Close() error {
	var err error
	p.close.Do(func() {
		if p.ln != nil {
			err = p.ln.Close()
		}
		deadline := time.Now().Add(p.cfg.DrainTimeout)
		for time.Now().Before(deadline) && p.active() > 0 {
			time.Sleep(20 * time.Millisecond)
		}
		p.stop() // ends held approvals and the member API's requests
		if p.api != nil {
			p.api.Close()
		}
		p.mu.Lock()
		for c, t := range p.conns {
			c.Close()
			if t.up != nil {
				t.up.Close()
			}
		}
		p.mu.Unlock()
		p.wg.Wait()
		p.h1.sweep(true)
		p.pipes.close()
		p.sayRefused() // what no later connection would have told
	})
	return err
}

// Active returns how many connections the proxy holds open.
func (p *Proxy) Active() int { return p.active() }

func (p *Proxy) active() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			p.log.Warn("accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		tc := c.(*net.TCPConn)
		// Limits are checked before anything else: a refused connection
		// holds its descriptor for no longer than it takes to reset it.
		member := p.memberOf(tc)
		if p.unrecorded() != "" {
			tc.SetLinger(0)
			tc.Close()
			p.refused.Add()
			continue
		}
		if why := p.limits.acquire(member); why != "" {
			tc.SetLinger(0)
			tc.Close()
			now := time.Now()
			p.finish(Record{ID: p.ids.Add(1), Time: now, Sandbox: p.cfg.Sandbox, Source: member, Verdict: policy.Deny, Reason: why, Close: "reset"}, false)
			continue
		}
		p.mu.Lock()
		p.conns[tc] = &tracked{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.limits.release(member)
			p.handle(tc, member)
			p.mu.Lock()
			delete(p.conns, tc)
			p.mu.Unlock()
		}()
	}
}

// conn is the state of one connection while it is handled.
type conn struct {
	client *net.TCPConn
	rec    Record
	peeked []byte
	hello  *Hello
	head   *Head
	// h2c: the client opened with the HTTP/2 preface (prior knowledge).
	h2c   bool
	start time.Time
	// silent: the client sent nothing within the sniff window; its first
	// bytes are checked whenever they come, before they go upstream.
	silent bool
}

func (p *Proxy) handle(client *net.TCPConn, member string) {
	c := &conn{client: client, start: time.Now()}
	c.rec = Record{ID: p.ids.Add(1), Time: c.start, Sandbox: p.cfg.Sandbox, Source: member, Verdict: policy.Deny}
	defer func() {
		client.Close()
		c.rec.Duration = time.Since(c.start)
		p.finish(c.rec, true)
	}()
	dst, err := p.cfg.OrigDst(c.client)
	if err != nil {
		p.reset(c, "no original destination: "+err.Error())
		return
	}
	c.rec.Dest, c.rec.Port = dst.String(), dst.Port()
	if p.memberAPIDst(dst) {
		p.serveMemberAPI(c)
		return
	}
	t, ok := p.name(c, dst)
	if !ok {
		return
	}
	p.act(c, t, p.authorize(c, t))
}

// target is what a connection is for, once its first bytes are read.
type target struct {
	dst  netip.AddrPort // where the client connected (a fake or a raw IP)
	name string         // the name it was resolved for or claims; "" for a raw IP
	host string         // the name normalised, or the raw IP: what policy decides on
}

// name reads what the connection is for: the fake IP's name, else the
// SNI or Host its first bytes claim, else its raw IP. It refuses the
// connection itself (and reports false) when that cannot be read, or when
// the bytes claim another name than the fake IP's (fronting).
func (p *Proxy) name(c *conn, dst netip.AddrPort) (target, bool) {
	t := target{dst: dst}
	if p.cfg.Names.Contains(dst.Addr()) {
		c.rec.Fake = true
		n, ok := p.cfg.Names.Name(dst.Addr())
		if !ok {
			c.rec.Host = dst.Addr().String()
			p.reset(c, "fake IP not assigned to any name (resolve the name again)")
			return target{}, false
		}
		t.name = n
		if err := p.peek(c, p.sniffWindow(dst.Port()), true); err != nil {
			p.reset(c, err.Error())
			return target{}, false
		}
		if err := c.fronting(n); err != nil {
			c.rec.Host = n
			p.deny(c, err.Error(), policy.Decision{})
			return target{}, false
		}
	} else {
		if err := p.peek(c, p.cfg.PeekTimeout, false); err != nil {
			c.rec.Host = dst.Addr().String()
			p.reset(c, err.Error())
			return target{}, false
		}
		t.name = c.claimedName()
	}
	if t.name != "" {
		n, err := policy.NormalizeHost(t.name)
		if err != nil {
			c.rec.Host = t.name
			p.deny(c, "the connection names an invalid host", policy.Decision{})
			return target{}, false
		}
		t.host = n
	} else {
		t.host = dst.Addr().String()
	}
	c.rec.Host = t.host
	if policy.IsInternalName(t.host) {
		// Whatever the rules say: the name is airlock's own, served at
		// the gateway's port 80 only, never dialled upstream.
		p.deny(c, policy.InternalName+" is airlock's member API, served only at http://"+policy.InternalName+"/ (plain HTTP, port 80)", policy.Decision{})
		return target{}, false
	}
	c.rec.LLM = policy.IsLLMHost(t.host)
	return t, true
}

// Actions authorize decides on.
type actionKind uint8

const (
	actDeny   actionKind = iota // refuse: a 403 for plain HTTP, else a reset
	actSplice                   // copy the bytes to the upstream untouched
	actBump                     // serve it request by request (interception)
	actHold                     // ask a person about the connection first
)

// action is authorize's decision about a connection.
type action struct {
	kind     actionKind
	reason   string          // why, for actDeny
	decision policy.Decision // policy's answer, for records
	// inspect: a splice whose TLS starts late must be intercepted, so it
	// is refused then.
	inspect bool
}

// authorize decides what to do with a connection; it never blocks.
func (p *Proxy) authorize(c *conn, t target) action {
	// On the web's ports the client speaks first, and speaks HTTP or TLS:
	// bytes airlock cannot read there are refused, never carried as
	// "another protocol" past the Host and SNI checks (design §8,
	// invariant 10).
	if isWebPort(t.dst.Port()) && !c.silent && !c.readable() {
		return action{reason: fmt.Sprintf("on port %d airlock carries only HTTP and TLS it can read, and these bytes are neither", t.dst.Port())}
	}
	d := p.cfg.Policy.Decide(policy.Query{Source: c.rec.Source, Host: t.host, Port: t.dst.Port()})
	if d.Rule != nil {
		c.rec.Rule = d.Rule.Pattern.String()
	}
	inspectAll := p.cfg.InspectAll != nil && p.cfg.InspectAll()
	// Plain HTTP (HTTP/1.x, or HTTP/2 with prior knowledge) is always
	// served request by request, so a later request on the connection
	// cannot name another host; so is TLS that is intercepted whatever the
	// rules say. Such connections are not asked about: each of their
	// requests is, with its method and URL, so that allowing it once
	// covers exactly the request a person saw.
	requests := t.name != "" && (c.head != nil || c.h2c || c.hello != nil && inspectAll)
	switch d.Verdict {
	case policy.Allow, policy.NeedsL7:
	case policy.Ask:
		if !requests {
			return action{kind: actHold, decision: d}
		}
	default:
		return action{reason: d.Reason.String(), decision: d}
	}
	inspect := d.Verdict == policy.NeedsL7 || inspectAll
	switch {
	case requests || t.name != "" && inspect && c.hello != nil:
		return action{kind: actBump, decision: d}
	case d.Verdict == policy.NeedsL7:
		return action{reason: "rules for this host look at requests, but the connection did not start with TLS or HTTP", decision: d}
	}
	if err := p.checkECH(c); err != nil {
		return action{reason: err.Error()}
	}
	return action{kind: actSplice, decision: d, inspect: inspect}
}

// act carries out authorize's decision: it asks a person about a held
// connection (and decides again on the answer), intercepts, splices or
// refuses.
func (p *Proxy) act(c *conn, t target, a action) {
	if a.kind == actHold {
		if p.cfg.Approvals == nil {
			p.deny(c, "no rule matched and nobody can be asked", a.decision)
			return
		}
		url := t.host + ":" + strconv.Itoa(int(t.dst.Port()))
		out := p.cfg.Approvals.Ask(p.ctx, policy.AskRequest{Source: c.rec.Source, Host: t.host, Port: t.dst.Port(), URL: url})
		if out.Rule != nil {
			c.rec.Rule = out.Rule.Pattern.String()
		}
		if !out.Allowed {
			p.deny(c, out.Reason, policy.Decision{Rule: out.Rule})
			return
		}
		c.rec.Reason = out.Reason
		// Allowed, once or by a rule: decide again, since what the person
		// allowed may itself have path rules. The answer still "ask"s when
		// it was allowed once: this connection goes on as allowed.
		if a = p.authorize(c, t); a.kind == actHold {
			a = action{kind: actSplice, decision: a.decision}
			if err := p.checkECH(c); err != nil {
				a = action{reason: err.Error()}
			}
		}
	}
	switch a.kind {
	case actDeny:
		p.deny(c, a.reason, a.decision)
	case actBump:
		if c.rec.Reason == "" {
			c.rec.Reason = "intercepted: " + a.decision.Reason.String()
		}
		p.bump(c, t.host, t.dst.Port())
	case actSplice:
		if why := p.unrecorded(); why != "" {
			// Since it was accepted: held for a person, say.
			p.deny(c, why, a.decision)
			return
		}
		up, err := p.dial(c, t.host, t.dst, t.name == "")
		if err != nil {
			p.deny(c, err.Error(), policy.Decision{})
			return
		}
		c.rec.Verdict = policy.Allow
		if c.rec.Reason == "" {
			c.rec.Reason = a.decision.Reason.String()
		}
		p.mu.Lock()
		if tr, ok := p.conns[c.client]; ok {
			tr.up = up
		}
		p.mu.Unlock()
		if a.decision.Reason == policy.ReasonLearn {
			w := p.watchLearned([]policy.Query{{Source: c.rec.Source, Host: t.host, Port: t.dst.Port()}}, func() {
				p.log.Info("learn mode ended: connection closed", "sandbox", p.cfg.Sandbox, "source", c.rec.Source, "host", t.host, "port", t.dst.Port())
				c.client.Close()
				up.Close()
			})
			defer w.stop()
		}
		p.splice(c, up, t.name, a.inspect)
	}
}

// learnWatch is something open that learn mode let through: a spliced
// connection, or an intercepted request still under way (a WebSocket, a
// stream). Its queries are decided again when learn mode is to end and
// whenever the policy in force changes; once one of them is not allowed,
// cut closes it. A rule that allows them all keeps it open.
type learnWatch struct {
	p   *Proxy
	qs  []policy.Query
	cut func()

	mu    sync.Mutex // guards qs (see add); serialises check: a later answer is never undone by an earlier one
	timer *time.Timer
	done  bool
}

// watchLearned watches what learn mode let through (see learnWatch) until
// its stop is called; it decides qs once at once, so that a change of the
// policy since they were decided is not missed. A watch costs a map entry
// and a timer: no goroutine.
func (p *Proxy) watchLearned(qs []policy.Query, cut func()) *learnWatch {
	w := &learnWatch{p: p, qs: qs, cut: cut}
	p.learnMu.Lock()
	p.learned[w] = struct{}{}
	p.learnMu.Unlock()
	w.check()
	return w
}

// add watches q too, a question decided after the watch began (a body's
// override), and decides them all at once.
func (w *learnWatch) add(q policy.Query) {
	w.mu.Lock()
	w.qs = append(w.qs, q)
	w.mu.Unlock()
	w.check()
}

// stop ends the watch: what it watched is closed, or let through by
// something else.
func (w *learnWatch) stop() {
	w.mu.Lock()
	w.done = true
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Unlock()
	w.p.learnMu.Lock()
	delete(w.p.learned, w)
	w.p.learnMu.Unlock()
}

// check decides the watch's queries again: it cuts what none allows any
// longer, and otherwise checks again when the earliest learn mode that
// allows one of them is to end.
func (w *learnWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	var until time.Time
	for _, q := range w.qs {
		d := w.p.cfg.Policy.Decide(q)
		switch {
		case d.Verdict != policy.Allow:
			// Learn mode ended, or was turned off, and no rule allows it;
			// or a rule now denies or asks.
			w.done = true
			if w.timer != nil {
				w.timer.Stop()
			}
			w.cut()
			return
		case d.Reason == policy.ReasonLearn && (until.IsZero() || d.Until.Before(until)):
			until = d.Until
		}
	}
	switch {
	case until.IsZero():
		// Rules allow it: checked again only if the policy changes.
		if w.timer != nil {
			w.timer.Stop()
		}
	case w.timer == nil:
		w.timer = time.AfterFunc(time.Until(until), w.check)
	default:
		w.timer.Reset(time.Until(until))
	}
}

// recheckLearned checks every learned watch again whenever the policy in
// force changes, until the proxy closes. The next change's channel is
// taken before the checks, so a change during them is checked for too.
func (p *Proxy) recheckLearned(ch Changer) {
	defer p.wg.Done()
	changed := ch.Changed()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-changed:
		}
		changed = ch.Changed()
		p.checkLearned()
	}
}

// checkLearned checks every learned watch again, and returns how many
// there were.
func (p *Proxy) checkLearned() int {
	p.learnMu.Lock()
	ws := make([]*learnWatch, 0, len(p.learned))
	for w := range p.learned {
		ws = append(ws, w)
	}
	p.learnMu.Unlock()
	for _, w := range ws {
		w.check()
	}
	return len(ws)
}

// checkECH refuses a ClientHello with encrypted_client_hello on its way to
// be spliced, unless the sandbox allows it: the server would act on the
// inner hello's name, which airlock cannot read (design §8, invariant 11).
func (p *Proxy) checkECH(c *conn) error {
	if c.hello == nil || !c.hello.ECH || p.cfg.AllowECH != nil && p.cfg.AllowECH() {
		return nil
	}
	return errors.New("the ClientHello is encrypted (ECH): the server would act on a name airlock cannot read; set allow_ech: true in the sandbox's policy to let it through")
}

// memberOf names the member behind a connection: its label, or its
// address.
func (p *Proxy) memberOf(c *net.TCPConn) string {
	src := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	if p.cfg.Members != nil {
		if s := p.cfg.Members(src); s != "" {
			return s
		}
	}
	return src.String()
}

// unrecorded says why the proxy refuses what it would have to record, or
// "" while records are kept (Config.Recording). The first call that finds
// them kept again logs how many connections and requests were refused
// meanwhile.
func (p *Proxy) unrecorded() string {
	if p.cfg.Recording == nil {
		return ""
	}
	if p.cfg.Recording() != nil {
		// What failed (a path on the host) is in airlockd's log, not here:
		// members read this.
		return "airlock cannot write its audit records: everything is refused until it can"
	}
	p.sayRefused()
	return ""
}

// sayRefused logs how many connections and requests were refused
// unrecorded since it last did, if any: once records are kept again, and
// at Close.
func (p *Proxy) sayRefused() {
	p.refused.Say(p.log, "proxy: connections and requests were refused, unrecorded, while records could not be written", "refused")
}

// finish records a connection, and logs it unless log is false (a
// refusal the limiter logs once per interval).
func (p *Proxy) finish(r Record, log bool) {
	// Checked first: boxing the attributes costs allocations on every
	// connection, also when the line is not written.
	if ctx, level := context.Background(), p.level(r.Verdict); log && p.log.Enabled(ctx, level) {
		p.log.Log(ctx, level, "connection",
			"source", r.Source, "host", r.Host, "port", r.Port, "verdict", r.Verdict, "rule", r.Rule,
			"reason", r.Reason, "dest", r.Dest, "upstream", r.Upstream, "up", r.Up, "down", r.Down,
			"duration", r.Duration.Round(time.Millisecond), "close", r.Close)
	}
	if p.cfg.OnRecord != nil {
		p.cfg.OnRecord(r)
	}
}

// level is the level of a decision's log line.
func (p *Proxy) level(v policy.Verdict) slog.Level {
	if v == policy.Allow && !p.cfg.LogAllowed {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}

// janitor closes spliced connections idle in both directions for longer
// than IdleTimeout, reading each socket's TCP_INFO, so the splice itself
// runs without deadlines or wrappers.
func (p *Proxy) janitor() {
	defer p.wg.Done()
	every := p.cfg.IdleTimeout / 4
	if every > 30*time.Second {
		every = 30 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		}
		p.h1.sweep(false)
		// The pairs are copied under the lock and their sockets asked
		// after it, so accepting and ending connections never wait on
		// those system calls. Closing one that ended meanwhile is harmless.
		type pair struct{ client, up *net.TCPConn }
		p.mu.Lock()
		pairs := make([]pair, 0, len(p.conns))
		for c, tr := range p.conns {
			if tr.up != nil {
				pairs = append(pairs, pair{c, tr.up})
			}
		}
		p.mu.Unlock()
		for _, pr := range pairs {
			if idle(pr.client) > p.cfg.IdleTimeout && idle(pr.up) > p.cfg.IdleTimeout {
				pr.client.Close()
				pr.up.Close()
			}
		}
	}
}

// idle returns how long a socket has neither sent nor received data; for
// one it cannot ask (closed), forever.
func idle(c *net.TCPConn) time.Duration {
	const forever = time.Duration(math.MaxInt64)
	rc, err := c.SyscallConn()
	if err != nil {
		return forever
	}
	var info *unix.TCPInfo
	if rc.Control(func(fd uintptr) {
		info, _ = unix.GetsockoptTCPInfo(int(fd), unix.SOL_TCP, unix.TCP_INFO)
	}) != nil || info == nil {
		return forever
	}
	ms := min(info.Last_data_recv, info.Last_data_sent)
	return time.Duration(ms) * time.Millisecond
}
