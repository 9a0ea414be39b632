package tproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/policy"
)

// RequestRecord describes one intercepted HTTP request, written when its
// response is done.
type RequestRecord struct {
	ConnID   uint64 // the connection's Record.ID
	Time     time.Time
	Sandbox  string
	Source   string
	Method   string
	URL      string // scheme://host[:port]/path?query
	Host     string
	Proto    string         // HTTP/1.1 or HTTP/2.0
	Status   int            // 0 when no response was sent
	Verdict  policy.Verdict // Allow or Deny
	Rule     string
	Reason   string
	ReqBytes int64
	ResBytes int64
	TTFB     time.Duration // until the response head
	Duration time.Duration
	Headers  http.Header // request headers, credentials masked as ***
	LLM      bool
}

// bump terminates the client's TLS (or takes its plain HTTP) and serves it
// request by request: each request is checked (Host against the name the
// connection was decided for, then method and path against policy) and
// forwarded upstream by that name.
func (p *Proxy) bump(c *conn, host string, port uint16) {
	var client net.Conn = &prefixConn{TCPConn: c.client, r: io.MultiReader(bytes.NewReader(c.peeked), c.client)}
	hello := c.hello
	// The reader above has the bytes; a connection held open for hours
	// keeps nothing else of them.
	c.peeked, c.hello, c.head = nil, nil, nil
	scheme, proto := "http", "http/1.1"
	if c.h2c {
		proto = "h2"
	}
	if hello != nil {
		if p.cfg.CA == nil {
			p.reset(c, "interception needed but this sandbox has no CA")
			return
		}
		scheme = "https"
		var alpn []string
		for _, a := range hello.ALPN {
			if a == "h2" || a == "http/1.1" {
				alpn = append(alpn, a)
			}
		}
		tc := tls.Server(client, &tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: alpn,
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				return p.cfg.CA.Leaf(host)
			},
		})
		tc.SetDeadline(time.Now().Add(p.cfg.PeekTimeout))
		if err := tc.Handshake(); err != nil {
			c.rec.Verdict, c.rec.Close = policy.Allow, "client TLS handshake failed (does the client trust the sandbox CA?): "+err.Error()
			return
		}
		tc.SetDeadline(time.Time{})
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			proto = "h2"
		}
		client = tc
	}
	c.rec.Verdict = policy.Allow
	authority := host
	if !(scheme == "https" && port == 443) && !(scheme == "http" && port == 80) {
		authority += ":" + strconv.Itoa(int(port))
	}
	addr := net.JoinHostPort(host, strconv.Itoa(int(port)))
	h := &bumpHandler{p: p, c: c, host: host, port: port, scheme: scheme, authority: authority, addr: addr,
		key: scheme + "://" + addr + " " + c.rec.Source, pool: &h1Client{pool: p.h1, scheme: scheme}}
	h.fwd = p.reverseProxy(scheme, h.pool)
	if proto == "h2" {
		newH2Server(p, client, h).serve()
	} else {
		newH1Server(p, client, h).serve()
	}
	h.mu.Lock()
	c.rec.Close = fmt.Sprintf("intercepted, %d requests", h.requests)
	h.mu.Unlock()
}

type bumpHandler struct {
	p      *Proxy
	c      *conn
	host   string
	port   uint16
	scheme string
	// authority is the connection's host with its port where the scheme's
	// is another: the Host header every request goes upstream with.
	authority string
	// addr is the upstream's host and port, whatever the Host header's
	// spelling or (missing) port.
	addr string
	// key names the pool's connections for addr and the member.
	key string
	// pool carries GET and HEAD upstream (forward); fwd, a ReverseProxy
	// over the same, the rest.
	pool *h1Client
	fwd  *httputil.ReverseProxy

	mu       sync.Mutex // guards requests
	requests int
}

func (h *bumpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.requests++
	h.mu.Unlock()
	start := time.Now()
	// The one form of the target that is decided on, recorded, shown to a
	// person and forwarded (design §5.6); a target servers could read in
	// another way is refused before any rule sees it.
	target, targetErr := policy.CanonicalTarget(r.RequestURI)
	shown := target
	if targetErr != nil {
		shown = r.RequestURI
	}
	rec := RequestRecord{
		ConnID: h.c.rec.ID, Time: start, Sandbox: h.p.cfg.Sandbox, Source: h.c.rec.Source,
		Method: r.Method, URL: h.scheme + "://" + h.authority + shown, Host: h.host,
		Proto: r.Proto, Verdict: policy.Deny, Headers: sanitizeHeaders(r.Header), LLM: h.c.rec.LLM,
	}
	// One allocation for all three: each request has its own.
	state := &struct {
		rw   recordingWriter
		body recordedBody
		lt   letThrough
	}{rw: recordingWriter{ResponseWriter: w, start: start}, lt: letThrough{h: h, source: rec.Source}}
	rw, body, lt := &state.rw, &state.body, &state.lt
	var ob *overrideBody // the body's override scan, if it has one
	unrecorded := false  // refused so: counted, not recorded (see Proxy.refused)
	defer func() {
		// Nothing more of the body goes upstream once the request is
		// recorded: what was forwarded, and what was refused on its
		// way, is in the record.
		rec.ReqBytes = body.end()
		if unrecorded {
			h.p.refused.Add()
			return
		}
		if ref := ob.refusal(); ref != nil {
			rec.Verdict, rec.Reason, rec.Rule = policy.Deny, ref.reason, ref.rule
		}
		rec.Status, rec.ResBytes, rec.TTFB = rw.status, rw.n, rw.ttfb
		rec.Duration = time.Since(start)
		if hw, ok := w.(*h1Response); ok {
			// Recorded once the answer's last bytes have left: the
			// journal's write is not on the way to the member.
			hw.recordAfter(h.p, rec)
			return
		}
		h.p.finishRequest(rec)
	}()

	if why := h.p.unrecorded(); why != "" {
		unrecorded = true
		refuseUnrecorded(rw, why)
		return
	}
	// The request must be for the host the connection was decided for:
	// anything else is domain fronting.
	if !h.isHost(r.Host) {
		rec.Reason = fmt.Sprintf("request for %q on a connection for %s (domain fronting)", r.Host, h.host)
		h.forbid(rw, r, &rec)
		return
	}
	if targetErr != nil {
		rec.Reason = targetErr.Error()
		h.forbid(rw, r, &rec)
		return
	}
	if err := setTarget(r, target); err != nil {
		rec.Reason = err.Error()
		h.forbid(rw, r, &rec)
		return
	}
	// Only WebSocket upgrades become tunnels. Any other (h2c) would carry
	// requests nobody checks, so it goes upstream as a plain request.
	if u := r.Header.Get("Upgrade"); u != "" && !strings.EqualFold(u, "websocket") {
		stripUpgrade(r.Header)
	}
	dropPathOverrides(r.Header)
	d := lt.decide(r.Method, target)
	// A WebDAV COPY or MOVE acts on its Destination too.
	dest, hasDest, err := h.destination(r.Header)
	if err != nil {
		rec.Reason = err.Error()
		h.forbid(rw, r, &rec)
		return
	}
	// Servers that honour a method override act on it: it is decided too,
	// and the stricter answer stands. Every value is: servers differ on
	// which of several they take.
	_, query, _ := strings.Cut(target, "?")
	queried, err := queryOverrides(query)
	if err == nil {
		var scan overrideScanner
		if scan, err = bodyScanner(r); scan != nil {
			ob = &overrideBody{ReadCloser: r.Body, scan: scan, decide: func(methods []string) *overrideRefusal {
				return h.bodyOverrides(lt, r.Method, target, dest, methods)
			}}
			r.Body = ob
		}
	}
	body.ReadCloser, r.Body = r.Body, body
	if err != nil {
		rec.Reason = err.Error()
		h.forbid(rw, r, &rec)
		return
	}
	// The methods no rule decides, each asked about as itself: a person
	// who is asked about an override is shown the method the server will
	// act on, and a held request is released only by what allows that.
	var asks []string
	if d.Verdict == policy.Ask {
		asks = append(asks, r.Method)
	}
	overrides, err := overrideMethods(r.Header)
	if err != nil {
		rec.Reason = err.Error()
		h.forbid(rw, r, &rec)
		return
	}
	overrides = append(overrides, queried...)
	if hasDest {
		if rule, err := h.checkDestination(lt, dest, append([]string{r.Method}, overrides...)); err != nil {
			rec.Reason, rec.Rule = err.Error(), rule
			h.forbid(rw, r, &rec)
			return
		}
	}
	for _, m := range overrides {
		if m == strings.ToUpper(r.Method) || slices.Contains(asks, m) {
			continue
		}
		od := lt.decide(m, target)
		if od.Verdict == policy.Ask {
			asks = append(asks, m)
		}
		if od.Verdict == policy.Deny || od.Verdict == policy.Ask && d.Verdict == policy.Allow {
			d = od
		}
	}
	if d.Rule != nil {
		rec.Rule = d.Rule.Pattern.String()
	}
	switch d.Verdict {
	case policy.Allow:
		rec.Reason = d.Reason.String()
	case policy.Ask:
		// Each request no rule decides is asked about with its method and
		// URL: an approval once covers exactly the request shown.
		if h.p.cfg.Approvals == nil {
			rec.Reason = "no rule matched and nobody can be asked"
			h.forbid(rw, r, &rec)
			return
		}
		for _, m := range asks {
			out := h.p.cfg.Approvals.Ask(r.Context(), policy.AskRequest{Source: rec.Source, Host: h.host, Port: h.port, Method: m, URL: rec.URL, Headers: rec.Headers})
			if out.Rule != nil {
				rec.Rule = out.Rule.Pattern.String()
			}
			rec.Reason = out.Reason
			if !out.Allowed {
				h.forbid(rw, r, &rec)
				return
			}
		}
	default:
		// Detail names a preset whose read-only rule refused the request.
		rec.Reason = d.Detail()
		h.forbid(rw, r, &rec)
		return
	}
	if why := h.p.unrecorded(); why != "" {
		// Records stopped while a person decided.
		unrecorded = true
		refuseUnrecorded(rw, why)
		return
	}
	rec.Verdict = policy.Allow
	if lt.learnedAny() || ob != nil {
		// What learn mode let through is cut when learn mode ends, or is
		// turned off, unless rules allow it by then: a WebSocket, or a
		// stream, can outlast it by far. A body's overrides are decided
		// as it goes upstream: one learn mode allows starts the watch
		// then.
		ctx, cancel := context.WithCancel(r.Context())
		defer func() {
			// Nothing more of the body goes upstream, or is decided, once
			// the request is done: its watch ends first.
			body.end()
			lt.stop()
			cancel()
		}()
		r = r.WithContext(ctx)
		method, url := r.Method, rec.URL
		lt.arm(func() {
			h.p.log.Info("learn mode ended: intercepted connection closed", "sandbox", h.p.cfg.Sandbox, "source", lt.source, "host", h.host, "port", h.port, "method", method, "url", url)
			cancel()
			h.c.client.Close()
		})
	}
	if pooled(r) && h.pool.forward(rw, r, rec.Source, h.key, h.addr, h.authority, target) {
		return
	}
	ctx := context.WithValue(r.Context(), sourceKey{}, rec.Source)
	ctx = context.WithValue(ctx, targetKey{}, h.addr)
	ctx = context.WithValue(ctx, authorityKey{}, h.authority)
	h.fwd.ServeHTTP(rw, r.WithContext(ctx))
}

// letThrough is what one request is let through on. Every policy
// decision for the request is made by its decide (there is no other way
// to decide one: bumpHandler has none), which keeps each question a rule
// or learn mode allowed: the request's method and each override it names
// (headers, query, body) on its target and on its Destination. If learn
// mode allowed any of them, the request is watched once it is let
// through (arm), and the watch decides them all again whenever the policy
// in force changes: it is cut once one is no longer allowed (design
// §3.2). A question decided after arm (a body's override) is added to the
// watch, or starts it. What a person approved is not among them: Decide
// would ask again.
type letThrough struct {
	h      *bumpHandler
	source string

	// mu guards the rest: a body's overrides are decided on the
	// goroutine that sends it upstream.
	mu      sync.Mutex
	qs      []policy.Query  // the questions that allowed it, each once
	buf     [2]policy.Query // qs's first: most requests ask no more
	learned bool            // learn mode allowed one of qs
	cut     func()          // set by arm: what closes the request
	watch   *learnWatch     // once learned and armed
	stopped bool
}

// decide decides the request's method on path (its target or its
// Destination), and keeps the question if it is allowed.
func (l *letThrough) decide(method, path string) policy.Decision {
	q := policy.Query{Source: l.source, Host: l.h.host, Port: l.h.port, Method: method, Path: path}
	d := l.h.p.cfg.Policy.Decide(q)
	if d.Verdict != policy.Allow {
		return d
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if slices.Contains(l.qs, q) {
		return d
	}
	if l.qs == nil {
		l.qs = l.buf[:0]
	}
	l.qs = append(l.qs, q)
	l.learned = l.learned || d.Reason == policy.ReasonLearn
	switch {
	case l.stopped || l.cut == nil:
	case l.watch != nil:
		l.watch.add(q)
	case l.learned:
		l.watch = l.h.p.watchLearned(slices.Clone(l.qs), l.cut)
	}
	return d
}

// learnedAny reports whether learn mode allowed any question decided so
// far.
func (l *letThrough) learnedAny() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.learned
}

// arm is called once the request is let through, with what closes it:
// from then on, while any of its questions was allowed by learn mode, they
// are all watched.
func (l *letThrough) arm(cut func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	l.cut = cut
	if l.learned {
		l.watch = l.h.p.watchLearned(slices.Clone(l.qs), cut)
	}
}

// stop ends the watch, if any, once the request is done.
func (l *letThrough) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	if l.watch != nil {
		l.watch.stop()
	}
}

// isHost reports whether a Host header or URL authority (host[:port])
// names the connection's host, in any spelling of it.
func (h *bumpHandler) isHost(hostport string) bool {
	host, port := hostport, ""
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 && !strings.Contains(hostport, "]") {
		host, port = hostport[:i], hostport[i+1:]
	}
	n, err := policy.NormalizeHost(host)
	return err == nil && n == h.host && validPort(port)
}

// checkDestination refuses a Destination (see destination) that a rule
// (or learn mode) does not allow for each of methods, the request's own
// and the ones its overrides name; rule names the rule that refused it.
func (h *bumpHandler) checkDestination(lt *letThrough, dest string, methods []string) (rule string, err error) {
	for _, m := range methods {
		d := lt.decide(m, dest)
		if d.Verdict == policy.Allow {
			continue
		}
		if d.Rule != nil {
			rule = d.Rule.Pattern.String()
		}
		return rule, fmt.Errorf("the Destination %s %s is not allowed by a rule: %s", m, dest, d.Detail())
	}
	return "", nil
}

// destination returns the canonical target a request's Destination header
// names (WebDAV's COPY and MOVE act on it), if it has one: an absolute
// path, or an http(s) URL on the connection's host. Anything else, or more
// than one, is an error.
func (h *bumpHandler) destination(hdr http.Header) (string, bool, error) {
	var vv []string
	for k, v := range hdr {
		if namedAs(k, "Destination") {
			vv = append(vv, v...)
		}
	}
	switch {
	case len(vv) == 0:
		return "", false, nil
	case len(vv) > 1:
		return "", false, errors.New("more than one Destination header")
	}
	dest := vv[0]
	if rest, ok := cutScheme(dest); ok {
		authority, _, _ := strings.Cut(rest, "/")
		if strings.ContainsAny(authority, "@?#") || !h.isHost(authority) {
			return "", false, fmt.Errorf("a Destination on another host than %s", h.host)
		}
		dest = rest[len(authority):]
	}
	if !strings.HasPrefix(dest, "/") {
		return "", false, fmt.Errorf("a Destination that is neither an absolute path nor a URL on %s", h.host)
	}
	target, err := policy.CanonicalTarget(dest)
	if err != nil {
		return "", false, fmt.Errorf("the Destination: %w", err)
	}
	return target, true, nil
}

// forbid answers 403 with a body that says what was blocked and how to
// allow it.
func (h *bumpHandler) forbid(w http.ResponseWriter, r *http.Request, rec *RequestRecord) {
	denial{sandbox: h.p.cfg.Sandbox, source: rec.Source, request: r.Method + " " + rec.URL, reason: rec.Reason, rule: rec.Rule,
		suggest: r.Method + " " + h.host + r.URL.EscapedPath(), approvalURL: h.p.cfg.ApprovalURL}.write(w)
}

// bodyOverrides decides the methods a request's form body names as
// overrides: each must be allowed by a rule of its own, since nobody can
// be asked once the body is on its way, and so must the request's
// Destination (dest, if it has one) for it.
func (h *bumpHandler) bodyOverrides(lt *letThrough, method, target, dest string, methods []string) *overrideRefusal {
	for _, m := range methods {
		if m == strings.ToUpper(method) {
			continue
		}
		d := lt.decide(m, target)
		if d.Verdict == policy.Allow {
			if dest == "" {
				continue
			}
			rule, err := h.checkDestination(lt, dest, []string{m})
			if err == nil {
				continue
			}
			return &overrideRefusal{reason: fmt.Sprintf("the form's _method asks for %q, and %v", m, err), rule: rule}
		}
		ref := &overrideRefusal{reason: fmt.Sprintf("the form's _method asks for %q, and %s", m, d.Detail()),
			suggest: m + " " + h.host + strings.SplitN(target, "?", 2)[0]}
		if d.Verdict == policy.Ask {
			ref.reason = fmt.Sprintf("the form's _method asks for %q, which no rule allows (nobody is asked once a body is on its way)", m)
		}
		if d.Rule != nil {
			ref.rule = d.Rule.Pattern.String()
		}
		return ref
	}
	return nil
}

// refuseUnrecorded answers 503: the proxy cannot record the request.
func refuseUnrecorded(w http.ResponseWriter, why string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Airlock-Verdict", "unrecorded")
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, why+"\n")
}

// setTarget makes r's URL the canonical target, so that what goes
// upstream is byte for byte what was decided: the path in its escaped
// form, the query as sent.
func setTarget(r *http.Request, target string) error {
	path, query, hasQuery := strings.Cut(target, "?")
	dec, err := url.PathUnescape(path)
	if err != nil {
		return fmt.Errorf("%w: %v", policy.ErrAmbiguousPath, err)
	}
	r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.URL.Opaque = dec, path, query, ""
	r.URL.ForceQuery = hasQuery && query == ""
	if got := r.URL.RequestURI(); got != target {
		return fmt.Errorf("%w: %q would go upstream as %q", policy.ErrAmbiguousPath, target, got)
	}
	return nil
}

// stripUpgrade removes a protocol upgrade from a request's headers.
func stripUpgrade(h http.Header) {
	h.Del("Upgrade")
	h.Del("HTTP2-Settings")
	var keep []string
	for _, v := range h.Values("Connection") {
		for _, tok := range strings.Split(v, ",") {
			tok = strings.TrimSpace(tok)
			if tok != "" && !strings.EqualFold(tok, "upgrade") && !strings.EqualFold(tok, "http2-settings") {
				keep = append(keep, tok)
			}
		}
	}
	h.Del("Connection")
	if len(keep) > 0 {
		h.Set("Connection", strings.Join(keep, ", "))
	}
}

type (
	sourceKey    struct{}
	targetKey    struct{}
	authorityKey struct{}
)

// validPort reports the port of a Host header: none, or 1 to 5 digits.
func validPort(p string) bool {
	if len(p) > 5 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}

// copyBuffers lends forward and the ReverseProxy the buffers they copy
// response bodies with; without it each response allocates 32 KiB.
var copyBuffers = &bufferPool{free: make(chan []byte, 64)}

// bufferPool keeps up to cap(free) buffers of 32 KiB: a channel of slices,
// since a sync.Pool of them would allocate on every Put.
type bufferPool struct{ free chan []byte }

func (p *bufferPool) Get() []byte {
	select {
	case b := <-p.free:
		return b
	default:
		return make([]byte, 32<<10)
	}
}

func (p *bufferPool) Put(b []byte) {
	select {
	case p.free <- b:
	default:
	}
}

// reverseProxy forwards requests over tr to the connection's host and
// port (targetKey), answering 403 for what the SSRF guard refuses and 502
// for any other upstream failure.
func (p *Proxy) reverseProxy(scheme string, tr http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = scheme
			pr.Out.URL.Host = pr.In.Context().Value(targetKey{}).(string)
			// The Host header says exactly what was decided, whatever
			// spelling the client used (case, a trailing dot, a port).
			pr.Out.Host = pr.In.Context().Value(authorityKey{}).(string)
			// And the query goes as decided and recorded, not re-encoded
			// where Go's parser would not take it (";" separators).
			pr.Out.URL.RawQuery = pr.In.URL.RawQuery
		},
		Transport:  tr,
		BufferPool: copyBuffers,
		// Event streams and bodies of unknown length (SSE, LLM token
		// streams) are flushed at every write whatever this says; the
		// rest is flushed by recordingWriter after each large write.
		FlushInterval: 0,
		ErrorLog:      log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			source, _ := r.Context().Value(sourceKey{}).(string)
			var ref *overrideRefusal
			if errors.As(err, &ref) {
				// The body ended with the refusal of its form's override.
				denial{sandbox: p.cfg.Sandbox, source: source, request: r.Method + " " + r.URL.String(), reason: ref.reason,
					rule: ref.rule, suggest: ref.suggest, approvalURL: p.cfg.ApprovalURL}.write(w)
				return
			}
			p.upstreamError(w, source, r.Method, r.URL.String(), err)
		},
	}
}

// upstreamError answers a request whose upstream exchange failed before
// its answer began: 403 for what the SSRF guard refuses, 502 for any
// other failure.
func (p *Proxy) upstreamError(w http.ResponseWriter, source, method, url string, err error) {
	var se *ssrfError
	if errors.As(err, &se) {
		// A refusal, not an upstream failure.
		denial{sandbox: p.cfg.Sandbox, source: source, request: method + " " + url, reason: se.Error(),
			suggest: "cidr:" + strings.Fields(se.refused[0])[0] + "/32", approvalURL: p.cfg.ApprovalURL}.write(w)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Airlock-Verdict", "upstream-error")
	w.WriteHeader(http.StatusBadGateway)
	fmt.Fprintf(w, "airlock could not get %s from the upstream: %v\n", url, explainUpstream(err))
}

func (p *Proxy) finishRequest(r RequestRecord) {
	if ctx, level := context.Background(), p.level(r.Verdict); p.log.Enabled(ctx, level) {
		p.log.Log(ctx, level, "request", "source", r.Source, "host", r.Host, "method", r.Method, "url", r.URL,
			"status", r.Status, "verdict", r.Verdict, "rule", r.Rule, "reason", r.Reason,
			"req_bytes", r.ReqBytes, "res_bytes", r.ResBytes, "ttfb", r.TTFB.Round(time.Microsecond),
			"duration", r.Duration.Round(time.Microsecond))
	}
	if p.cfg.OnRequest != nil {
		p.cfg.OnRequest(r)
	}
}

// sensitive header names: credentials are masked in records, by name or
// by a part of the name.
var (
	sensitiveHeaders = []string{"authorization", "proxy-authorization", "cookie", "set-cookie"}
	sensitiveParts   = []string{"key", "token", "secret", "auth", "session", "password", "signature"}
)

func sanitizeHeaders(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, v := range h {
		if sensitiveHeader(k) {
			masked := make([]string, len(v))
			for i := range masked {
				masked[i] = "***"
			}
			out[k] = masked
			continue
		}
		// Shared with the request: header values are never changed in
		// place, only replaced.
		out[k] = v
	}
	return out
}

// sensitiveHeader reports whether a header's name, in any case, is or
// contains one of the sensitive ones.
func sensitiveHeader(k string) bool {
	var buf [64]byte
	lk := buf[:0]
	if len(k) > len(buf) {
		lk = make([]byte, 0, len(k))
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lk = append(lk, c)
	}
	for _, n := range sensitiveHeaders {
		if string(lk) == n {
			return true
		}
	}
	for _, part := range sensitiveParts {
		if bytes.Contains(lk, []byte(part)) {
			return true
		}
	}
	return false
}

// recordingWriter notes the status, the time of the response head and the
// body size. Unwrap lets http.ResponseController reach Flush and Hijack
// (WebSocket upgrades).
type recordingWriter struct {
	http.ResponseWriter
	start  time.Time
	status int
	ttfb   time.Duration
	n      int64
}

func (w *recordingWriter) WriteHeader(code int) {
	if w.status == 0 || code >= 200 && w.status < 200 {
		w.status, w.ttfb = code, time.Since(w.start)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recordingWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status, w.ttfb = http.StatusOK, time.Since(w.start)
	}
	n, err := w.ResponseWriter.Write(b)
	w.n += int64(n)
	if len(b) >= bigWrite && err == nil {
		// Out at once, in TLS records of full size: a large piece left
		// in the server's small buffers would go out in pieces of that
		// size. A small answer waits for the end of the request, to leave
		// with its head in one write.
		w.Flush()
	}
	return n, err
}

// bigWrite is the size from which a write of a response body is flushed
// at once: the size of the HTTP server's buffers.
const bigWrite = 4 << 10

func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack is the ReverseProxy's, for an upgrade the upstream accepted: it
// writes the 101 on the connection it takes, so that is the status.
func (w *recordingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.status < 200 { // none yet, or 103 Early Hints before it
		if w.status == 0 {
			w.ttfb = time.Since(w.start)
		}
		w.status = http.StatusSwitchingProtocols
	}
	return c, brw, err
}

func (w *recordingWriter) Flush() {
	http.NewResponseController(w.ResponseWriter).Flush()
}

// recordedBody is a request's body as it is handed on upstream: it counts
// the bytes handed on, and ends when the request is recorded. A Transport's
// write loop may still be reading the body then (an upstream that answered
// before reading it); what it reads after is dropped, so the record holds
// everything that went upstream.
type recordedBody struct {
	io.ReadCloser
	mu    sync.Mutex // guards n and ended
	n     int64
	ended bool
}

var errRecorded = errors.New("the request was answered and recorded before its body ended")

func (b *recordedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	ended := b.ended
	b.mu.Unlock()
	if ended {
		return 0, errRecorded
	}
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return 0, errRecorded // under way when the request was recorded
	}
	b.n += int64(n)
	return n, err
}

// end stops the body and returns the bytes handed on.
func (b *recordedBody) end() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ended = true
	return b.n
}

// prefixConn replays the peeked bytes before the rest of the connection.
type prefixConn struct {
	*net.TCPConn
	r io.Reader
}

func (c *prefixConn) Read(b []byte) (int, error) { return c.r.Read(b) }
