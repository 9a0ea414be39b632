package tproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/sys/unix"
)

// h1Pool holds the proxy's HTTP/1.1 connections to upstreams for
// intercepted GET and HEAD requests, idle ones by scheme, host, port and
// member: each request is written and its response read in the handler's
// goroutine, as the client's connection itself works. A Transport hands
// each request to a writing and a reading goroutine of its own, and over
// HTTP/2 to one connection shared by many clients: per request, several
// goroutine switches, which bound a keep-alive client on a small machine.
// A connection belongs to one request at a time and goes back to the pool
// when its response has been read to the end, so a client connection that
// sits idle holds none.
//
// Requests that carry a body, upgrades and other methods take the member's
// Transport, which handles a server that answers before it has read the
// body and retries only what is safe to retry (gRPC, whose requests all
// carry a body, keeps HTTP/2 upstream); so do GET and HEAD beyond
// maxH1PerClient at once from one HTTP/2 client. A GET or HEAD is retried
// once on a fresh connection when a kept-alive one turns out to be closed.
type h1Pool struct {
	p *Proxy

	mu         sync.Mutex // guards idle and transports
	idle       map[string][]*h1Upstream
	transports map[string]*http.Transport // by member
}

// transport returns the Transport of member source, for what the pool does
// not carry. Each member has its own, as it has its own pooled
// connections: no request goes over a connection dialled for another
// member (the SSRF guard decides per member). It dials the connection's
// host by name through the SSRF guard, as dial does.
func (l *h1Pool) transport(source string) *http.Transport {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.transports[source]
	if t == nil {
		t = &http.Transport{
			DialContext:           l.p.dialUpstream,
			TLSClientConfig:       l.upstreamTLS(),
			ForceAttemptHTTP2:     true,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       h1IdleTimeout,
			TLSHandshakeTimeout:   l.p.cfg.ConnectTimeout,
			ResponseHeaderTimeout: 0, // LLM APIs may think for minutes
		}
		l.transports[source] = t
	}
	return t
}

// upstreamTLS is the TLS configuration of every intercepted connection's
// upstream side: verified against the system roots and upstream_ca_file.
func (l *h1Pool) upstreamTLS() *tls.Config {
	return &tls.Config{RootCAs: l.p.cfg.UpstreamRoots, MinVersion: tls.VersionTLS12}
}

const (
	// maxH1PerClient bounds the pool's connections one client connection
	// uses at once (an HTTP/2 client may send many requests at once).
	maxH1PerClient = 4
	// maxH1Idle bounds the idle connections kept per scheme, host, port
	// and member.
	maxH1Idle = 64
	// h1IdleTimeout closes connections idle for longer.
	h1IdleTimeout = 90 * time.Second
)

// h1Upstream is one of an h1Pool's connections.
type h1Upstream struct {
	pool  *h1Pool
	key   string // scheme://host:port member
	conn  net.Conn
	raw   syscall.RawConn // the TCP socket under conn, to look for bytes nobody asked for
	head  *headLimit      // under br: bounds what a response head may read
	br    *bufio.Reader
	bw    *bufio.Writer
	since time.Time // idle since
	// peekFn and abortFn are peek and abort as values, made once: a
	// method value made per request would be an allocation each.
	peekFn   func(fd uintptr) bool
	abortFn  func()
	quietNow bool // peek's answer
}

// maxResponseHead bounds the bytes of a response's head (with any
// informational heads before it), as the Transport's
// MaxResponseHeaderBytes does; max1xx bounds the informational heads.
const (
	maxResponseHead = 10 << 20
	max1xx          = 5
)

// headLimit is the reader under a bufio.Reader that reads heads (an
// h1Upstream's responses, an h1Server's requests): while on, reads stop
// with err once left is spent.
type headLimit struct {
	r    io.Reader
	err  error
	on   bool
	left int64
	// rec, when set, gets a copy of what is read while on (a request head
	// the server must read twice; see h1Server.startHead).
	rec *[]byte
}

var errHeadTooLarge = errors.New("the upstream's response head is larger than 10 MiB")

func (l *headLimit) Read(p []byte) (int, error) {
	if !l.on {
		return l.r.Read(p)
	}
	if l.left <= 0 {
		return 0, l.err
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.rec != nil {
		*l.rec = append(*l.rec, p[:n]...)
	}
	return n, err
}

// quiet reports whether the upstream has sent nothing since the last
// response and still has the connection open: an idle connection with
// bytes on it (an answer nobody asked for, a 408 before closing, the body
// of a HEAD answered as a GET) would hand them to the next request.
func (u *h1Upstream) quiet() bool {
	if u.br.Buffered() > 0 {
		return false
	}
	u.quietNow = false
	err := u.raw.Read(u.peekFn)
	return err == nil && u.quietNow
}

// peek looks at the socket for a byte without taking it: quiet when there
// is none yet (EAGAIN), not when there is one or the upstream has closed.
func (u *h1Upstream) peek(fd uintptr) bool {
	var b [1]byte
	// recvfrom without an address (unix.Recvfrom would allocate one), and
	// raw: MSG_DONTWAIT never waits (see package nowait).
	n, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	u.quietNow = int(n) <= 0 && errno == unix.EAGAIN
	return true
}

// abort ends what the connection is doing: its request's context ended.
func (u *h1Upstream) abort() { u.conn.SetDeadline(time.Unix(1, 0)) }

// h1Client is one client connection's use of the pool: a RoundTripper for
// its ReverseProxy.
type h1Client struct {
	pool   *h1Pool
	scheme string
	busy   atomic.Int32
}

// RoundTrip sends req (from the ReverseProxy: its URL's host is the
// connection's checked name and port) and reads the response head.
func (c *h1Client) RoundTrip(req *http.Request) (*http.Response, error) {
	// Connections are kept per member: whatever an upstream leaves on one
	// can reach no other member, and the SSRF guard's per-member cidr:
	// rules hold for the connections they let through.
	source, _ := req.Context().Value(sourceKey{}).(string)
	if !pooled(req) || !c.take() {
		return c.pool.transportRoundTrip(source, req)
	}
	key := c.scheme + "://" + req.URL.Host + " " + source
	return c.send(req, key, req.URL.Host, req.URL.Hostname(), upstreamHead{write: req.Write})
}

// transportRoundTrip sends req over member source's Transport.
//
// A request with a body has its own context, ended when the response's
// body is closed. An HTTP/2 upstream may answer before it has read all of
// a body the member is still sending; closing that response's body then
// waits for the Transport's body writer, which waits in a read of the
// member's body (the ReverseProxy keeps Close from reaching it), until the
// member sends the rest or a timeout ends the connection. Ending the
// context lets Close return at once, the member has its answer, and the
// handler's return ends the read.
//
// A switch of protocols (101) is checked here, as the ReverseProxy checks
// it, so that one it would refuse is closed: the ReverseProxy answers 502
// without closing the upstream connection it was handed.
func (l *h1Pool) transportRoundTrip(source string, req *http.Request) (*http.Response, error) {
	cancel := context.CancelFunc(func() {})
	if req.Body != nil && req.Body != http.NoBody {
		ctx, stop := context.WithCancel(req.Context())
		req, cancel = req.WithContext(ctx), stop
	}
	res, err := l.transport(source).RoundTrip(req)
	if err != nil {
		cancel()
		return nil, err
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		rw, ok := res.Body.(io.ReadWriteCloser)
		asked, got := upgradeType(req.Header), upgradeType(res.Header)
		if !ok || got == "" || !strings.EqualFold(asked, got) || strings.IndexFunc(got, func(r rune) bool { return r < ' ' || r > '~' }) >= 0 {
			res.Body.Close()
			cancel()
			return nil, fmt.Errorf("the upstream switched to protocol %q when asked for %q", got, asked)
		}
		res.Body = &cancelOnCloseRW{cancelOnClose{rw, cancel}, rw}
		return res, nil
	}
	if req.Body != nil && req.Body != http.NoBody {
		res.Body = &cancelOnClose{res.Body, cancel}
	}
	return res, nil
}

// upgradeType is the protocol a head's Upgrade names, if its Connection
// says Upgrade.
func upgradeType(h http.Header) string {
	if !httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade") {
		return ""
	}
	return h.Get("Upgrade")
}

// cancelOnClose is a response body that ends its request's context when
// it is closed, before closing.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	b.cancel()
	return b.ReadCloser.Close()
}

// cancelOnCloseRW is a 101's body, the upgraded connection: a
// cancelOnClose that writes and passes a half-close on, as the
// ReverseProxy asks of it.
type cancelOnCloseRW struct {
	cancelOnClose
	io.Writer
}

func (b *cancelOnCloseRW) CloseWrite() error {
	if cw, ok := b.Writer.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("CloseWrite: %w", http.ErrNotSupported)
}

// upstreamHead says how a request's head is written upstream: by write
// (the ReverseProxy's requests: Request.Write), or, when write is nil, by
// writeRequestHead with target and authority (forward's).
type upstreamHead struct {
	write             func(io.Writer) error
	target, authority string
}

// pooled reports whether the pool carries r: a GET or HEAD without a
// body or an upgrade.
func pooled(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.ContentLength == 0 && r.Header.Get("Upgrade") == ""
}

// take claims one of the client's maxH1PerClient turns, or reports false.
func (c *h1Client) take() bool {
	if c.busy.Add(1) > maxH1PerClient {
		c.busy.Add(-1)
		return false
	}
	return true
}

// send writes req's head (twice at most: once more on a fresh connection
// when a kept-alive one turns out to be closed) to addr over a connection
// pooled under key (scheme://addr member), and reads the response head.
// The caller has taken a turn; the response's body gives it back.
func (c *h1Client) send(req *http.Request, key, addr, host string, head upstreamHead) (*http.Response, error) {
	l := c.pool
	for attempt := 0; ; attempt++ {
		var u *h1Upstream
		if attempt == 0 {
			u = l.get(key)
		}
		reused := u != nil
		if !reused {
			var err error
			if u, err = l.dial(req.Context(), key, c.scheme, addr, host); err != nil {
				c.busy.Add(-1)
				return nil, err
			}
		}
		resp, err := u.exchange(req, head, c)
		if err == nil {
			return resp, nil // its body gives u back
		}
		u.conn.Close()
		// A kept-alive connection the upstream has closed fails before any
		// of its answer arrives: once more, on a connection dialled for it.
		if !reused || attempt > 0 || req.Context().Err() != nil {
			c.busy.Add(-1)
			return nil, err
		}
	}
}

// get takes the most recently used idle connection for key on which the
// upstream has been quiet, or nil; the others are closed.
func (l *h1Pool) get(key string) *h1Upstream {
	for {
		l.mu.Lock()
		idle := l.idle[key]
		if len(idle) == 0 {
			l.mu.Unlock()
			return nil
		}
		u := idle[len(idle)-1]
		idle[len(idle)-1] = nil
		if len(idle) == 1 {
			delete(l.idle, key)
		} else {
			l.idle[key] = idle[:len(idle)-1]
		}
		l.mu.Unlock()
		if u.quiet() {
			return u
		}
		u.conn.Close()
	}
}

// put keeps u for the next request to its upstream, or closes it when
// enough are idle already or the proxy is closing.
func (l *h1Pool) put(u *h1Upstream) {
	u.since = time.Now()
	l.mu.Lock()
	if len(l.idle[u.key]) < maxH1Idle && l.p.ctx.Err() == nil {
		l.idle[u.key] = append(l.idle[u.key], u)
		u = nil
	}
	l.mu.Unlock()
	if u != nil {
		u.conn.Close()
	}
}

// sweep closes connections idle for longer than h1IdleTimeout, or all of
// them, the Transports' too, when all is set (the proxy is closing).
func (l *h1Pool) sweep(all bool) {
	var old []*h1Upstream
	l.mu.Lock()
	if all {
		for _, t := range l.transports {
			t.CloseIdleConnections()
		}
	}
	for key, idle := range l.idle {
		keep := idle[:0]
		for _, u := range idle {
			if all || time.Since(u.since) > h1IdleTimeout {
				old = append(old, u)
			} else {
				keep = append(keep, u)
			}
		}
		clear(idle[len(keep):])
		if len(keep) == 0 {
			delete(l.idle, key)
		} else {
			l.idle[key] = keep
		}
	}
	l.mu.Unlock()
	for _, u := range old {
		u.conn.Close()
	}
}

// exchange writes req's head and reads the response head, skipping
// informational answers (103 Early Hints), within req's context; closing
// the response's body gives client its turn back.
func (u *h1Upstream) exchange(req *http.Request, head upstreamHead, client *h1Client) (*http.Response, error) {
	stop := context.AfterFunc(req.Context(), u.abortFn)
	var err error
	if head.write != nil {
		err = head.write(u.bw)
	} else {
		writeRequestHead(u.bw, req, head.target, head.authority)
	}
	if err != nil {
		stop()
		return nil, err
	}
	if err := u.bw.Flush(); err != nil {
		stop()
		return nil, err
	}
	u.head.on, u.head.left = true, maxResponseHead
	for informational := 0; ; informational++ {
		resp, err := http.ReadResponse(u.br, req)
		if err != nil {
			stop()
			return nil, err
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 {
			if resp.StatusCode == http.StatusSwitchingProtocols {
				stop()
				return nil, errors.New("the upstream switched protocols without being asked")
			}
			if informational == max1xx {
				stop()
				return nil, fmt.Errorf("the upstream sent more than %d informational responses", max1xx)
			}
			continue
		}
		u.head.on = false
		// An answer with no body by rule (to HEAD, 204, 304) is where an
		// upstream that sends one anyway leaves it on the connection: such
		// a connection is not kept.
		bodiless := req.Method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified
		resp.Body = &h1Body{u: u, rc: resp.Body, eof: resp.Body == http.NoBody, keep: !resp.Close && !bodiless, stop: stop, client: client}
		return resp, nil
	}
}

// dial opens a connection to addr through the SSRF guard and, for https,
// verifies the upstream's certificate for host, as the Transport does.
func (l *h1Pool) dial(ctx context.Context, key, scheme, addr, host string) (*h1Upstream, error) {
	c, err := l.p.dialUpstream(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	if scheme == "https" {
		cfg := l.upstreamTLS()
		cfg.ServerName, cfg.NextProtos = host, []string{"http/1.1"}
		tc := tls.Client(c, cfg)
		hctx, cancel := context.WithTimeout(ctx, l.p.cfg.ConnectTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			c.Close()
			return nil, err
		}
		c = tc
	}
	head := &headLimit{r: c, err: errHeadTooLarge}
	u := &h1Upstream{pool: l, key: key, conn: c, raw: raw, head: head, br: bufio.NewReader(head), bw: bufio.NewWriter(c)}
	u.peekFn, u.abortFn = u.peek, u.abort
	return u, nil
}

// h1Body is a response body on an h1Upstream's connection: the connection
// goes back to the pool only when the body was read to its end and the
// upstream did not ask to close.
type h1Body struct {
	u      *h1Upstream
	rc     io.ReadCloser
	eof    bool
	keep   bool
	closed bool
	stop   func() bool
	client *h1Client // whose turn this was
}

func (b *h1Body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// Close gives the connection back to the pool, or closes it; once.
func (b *h1Body) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	defer b.client.busy.Add(-1)
	// A connection whose context ended has a deadline in the past.
	if stopped := b.stop(); !b.eof || !b.keep || !stopped || b.u.br.Buffered() > 0 {
		// Closed first, so that closing the body does not drain the rest of
		// a long answer.
		b.u.conn.Close()
		return b.rc.Close()
	}
	err := b.rc.Close()
	b.u.pool.put(b.u)
	return err
}

// forward carries r, a request the pool carries (pooled), to addr for
// member source (its connections pooled under key) and copies the answer to w, as the ReverseProxy carries
// the rest: hop-by-hop headers and the client's forwarding headers
// dropped, Host the decided authority, the target as decided, the answer
// streamed (flushed at every write for event streams and bodies of unknown
// length), trailers passed on, and an answer that breaks off aborted
// (http.ErrAbortHandler) rather than ended cleanly. It spares each request
// the ReverseProxy's copy of it, its context values and its header copies.
// It reports false, having done nothing, when the client's turns are all
// taken (r then takes the ReverseProxy).
func (c *h1Client) forward(w http.ResponseWriter, r *http.Request, source, key, addr, authority, target string) bool {
	if !c.take() {
		return false
	}
	resp, err := c.send(r, key, addr, c.pool.hostOf(addr), upstreamHead{target: target, authority: authority})
	if err != nil {
		c.pool.p.upstreamError(w, source, r.Method, c.scheme+"://"+addr+target, err)
		return true
	}
	defer resp.Body.Close()
	removeHopByHop(resp.Header)
	dst := w.Header()
	for k, vv := range resp.Header {
		dst[k] = append(dst[k], vv...)
	}
	announced := len(resp.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		dst.Add("Trailer", strings.Join(keys, ", "))
	}
	w.WriteHeader(resp.StatusCode)
	if err := copyBody(w, resp.Body, flushEach(resp)); err != nil {
		panic(http.ErrAbortHandler)
	}
	if len(resp.Trailer) > 0 {
		http.NewResponseController(w).Flush()
		for k, vv := range resp.Trailer {
			if len(resp.Trailer) != announced {
				k = http.TrailerPrefix + k
			}
			for _, v := range vv {
				dst.Add(k, v)
			}
		}
	}
	return true
}

// hostOf is addr's host, without the port.
func (l *h1Pool) hostOf(addr string) string {
	if i := strings.LastIndexByte(addr, ':'); i >= 0 {
		return strings.Trim(addr[:i], "[]")
	}
	return addr
}

// flushEach reports whether an answer is flushed to the client at every
// write, as the ReverseProxy flushes it: an event stream, or a body of
// unknown length (an LLM's token stream).
func flushEach(resp *http.Response) bool {
	if resp.ContentLength == -1 {
		return true
	}
	ct, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// copyBody copies an answer's body to w with a pooled buffer.
func copyBody(w http.ResponseWriter, body io.Reader, flush bool) error {
	buf := copyBuffers.Get()
	defer copyBuffers.Put(buf)
	var rc *http.ResponseController
	if flush {
		rc = http.NewResponseController(w)
	}
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
			if rc != nil {
				if err := rc.Flush(); err != nil {
					return err
				}
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// hopHeaders are dropped from what goes either way, as the ReverseProxy
// drops them, with what a Connection header names; forwardingHeaders are
// the client's, dropped from requests.
var (
	hopHeaders        = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}
	forwardingHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}
)

// removeHopByHop drops h's hop-by-hop headers and those its Connection
// header names.
func removeHopByHop(h http.Header) {
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				h.Del(sf)
			}
		}
	}
	for _, k := range hopHeaders {
		delete(h, k)
	}
}

// writeRequestHead writes the head of r as it goes upstream, byte for byte
// what the ReverseProxy and Request.Write make of it: the request line with
// the decided target, Host the decided authority, the client's first
// User-Agent if it sent one, then its other headers sorted by name, less
// hop-by-hop and forwarding headers and those its Connection header names,
// and "Te: trailers" if it accepts trailers. Names that are not valid are
// dropped, line breaks in values become spaces (the parsers upstream of
// here let neither through).
func writeRequestHead(bw *bufio.Writer, r *http.Request, target, authority string) {
	var dropped []string // named by Connection, canonical
	for _, f := range r.Header["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				dropped = append(dropped, http.CanonicalHeaderKey(sf))
			}
		}
	}
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(target)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(authority)
	bw.WriteString("\r\n")
	if ua := r.Header["User-Agent"]; len(ua) > 0 && ua[0] != "" && !slices.Contains(dropped, "User-Agent") {
		bw.WriteString("User-Agent: ")
		writeHeaderValue(bw, ua[0])
		bw.WriteString("\r\n")
	}
	var keysBuf [32]string
	keys := keysBuf[:0]
	for k := range r.Header {
		switch k {
		case "Host", "User-Agent", "Content-Length":
			continue
		}
		if slices.Contains(hopHeaders, k) || slices.Contains(forwardingHeaders, k) || slices.Contains(dropped, k) || !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		keys = append(keys, k)
	}
	if httpguts.HeaderValuesContainsToken(r.Header["Te"], "trailers") {
		keys = append(keys, "Te")
	}
	slices.Sort(keys)
	for _, k := range keys {
		if k == "Te" {
			bw.WriteString("Te: trailers\r\n")
			continue
		}
		for _, v := range r.Header[k] {
			bw.WriteString(k)
			bw.WriteString(": ")
			writeHeaderValue(bw, v)
			bw.WriteString("\r\n")
		}
	}
	bw.WriteString("\r\n")
}
