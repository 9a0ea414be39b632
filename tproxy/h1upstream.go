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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

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
}

// maxResponseHead bounds the bytes of a response's head (with any
// informational heads before it), as the Transport's
// MaxResponseHeaderBytes does; max1xx bounds the informational heads.
const (
	maxResponseHead = 10 << 20
	max1xx          = 5
)

// headLimit is the reader under an h1Upstream's bufio.Reader: while left
// is set, reads stop with an error once it is spent.
type headLimit struct {
	r    io.Reader
	on   bool
	left int64
}

var errHeadTooLarge = errors.New("the upstream's response head is larger than 10 MiB")

func (l *headLimit) Read(p []byte) (int, error) {
	if !l.on {
		return l.r.Read(p)
	}
	if l.left <= 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
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
	quiet := false
	var b [1]byte
	err := u.raw.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		quiet = n <= 0 && err == unix.EAGAIN
		return true
	})
	return err == nil && quiet
}

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
	if req.Method != http.MethodGet && req.Method != http.MethodHead || req.ContentLength != 0 || req.Header.Get("Upgrade") != "" {
		return c.pool.transport(source).RoundTrip(req)
	}
	if c.busy.Add(1) > maxH1PerClient {
		c.busy.Add(-1)
		return c.pool.transport(source).RoundTrip(req)
	}
	l := c.pool
	key := c.scheme + "://" + req.URL.Host + " " + source
	for attempt := 0; ; attempt++ {
		var u *h1Upstream
		if attempt == 0 {
			u = l.get(key)
		}
		reused := u != nil
		if !reused {
			var err error
			if u, err = l.dial(req.Context(), key, c.scheme, req.URL.Host, req.URL.Hostname()); err != nil {
				c.busy.Add(-1)
				return nil, err
			}
		}
		resp, err := u.exchange(req, func() { c.busy.Add(-1) })
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

// exchange writes req and reads the response head, skipping informational
// answers (103 Early Hints), within req's context; done runs when the
// response's body is closed.
func (u *h1Upstream) exchange(req *http.Request, done func()) (*http.Response, error) {
	conn := u.conn
	stop := context.AfterFunc(req.Context(), func() { conn.SetDeadline(time.Unix(1, 0)) })
	if err := req.Write(u.bw); err != nil {
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
		resp.Body = &h1Body{u: u, rc: resp.Body, eof: resp.Body == http.NoBody, keep: !resp.Close && !bodiless, stop: stop, done: done}
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
	head := &headLimit{r: c}
	return &h1Upstream{pool: l, key: key, conn: c, raw: raw, head: head, br: bufio.NewReader(head), bw: bufio.NewWriter(c)}, nil
}

// h1Body is a response body on an h1Upstream's connection: the connection
// goes back to the pool only when the body was read to its end and the
// upstream did not ask to close.
type h1Body struct {
	u    *h1Upstream
	rc   io.ReadCloser
	eof  bool
	keep bool
	stop func() bool
	done func()
}

func (b *h1Body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *h1Body) Close() error {
	defer b.done()
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
