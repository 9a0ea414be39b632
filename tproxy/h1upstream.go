package tproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// h1Pool is one intercepted client connection's own HTTP/1.1 connections
// to its upstream, for its GET and HEAD requests: each request is written
// and its response read in the handler's goroutine, as the client's
// connection itself works. The shared Transport hands each request to a
// writing and a reading goroutine of its own, and over HTTP/2 to one
// connection shared by every client: per request, several goroutine
// switches, which bound a keep-alive client on a small machine.
//
// Requests that carry a body, upgrades and other methods take the shared
// Transport, which handles a server that answers before it has read the
// body and retries only what is safe to retry (gRPC, whose requests all
// carry a body, keeps HTTP/2 upstream); so do GET and HEAD beyond
// maxH1Upstreams at once from one HTTP/2 client. A GET or HEAD is retried
// once on a fresh connection when a kept-alive one turns out to be closed.
type h1Pool struct {
	p      *Proxy
	scheme string
	shared *http.Transport

	mu     sync.Mutex // guards the rest
	idle   []*h1Upstream
	open   int
	closed bool
}

// maxH1Upstreams bounds the upstream connections of one client connection
// (an HTTP/2 client may send many requests at once).
const maxH1Upstreams = 4

// h1Upstream is one of an h1Pool's connections, used by one request at a
// time.
type h1Upstream struct {
	pool *h1Pool
	conn net.Conn // nil: none open
	br   *bufio.Reader
	bw   *bufio.Writer
}

// RoundTrip sends req (from the ReverseProxy: its URL's host is the
// connection's checked name and port) and reads the response head.
func (l *h1Pool) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead || req.ContentLength != 0 || req.Header.Get("Upgrade") != "" {
		return l.shared.RoundTrip(req)
	}
	u := l.get()
	if u == nil {
		return l.shared.RoundTrip(req)
	}
	for attempt := 0; ; attempt++ {
		reused := u.conn != nil
		if !reused {
			if err := u.dial(req.Context(), req.URL.Host, req.URL.Hostname()); err != nil {
				l.put(u)
				return nil, err
			}
		}
		resp, err := u.exchange(req)
		if err == nil {
			return resp, nil // its body puts u back
		}
		u.close()
		// A kept-alive connection the upstream has closed fails before any
		// of its answer arrives: once, on a fresh one.
		if !reused || attempt > 0 || req.Context().Err() != nil {
			l.put(u)
			return nil, err
		}
	}
}

// get takes an idle connection, or a new one not yet dialed; nil when the
// client connection has maxH1Upstreams in use or is gone.
func (l *h1Pool) get() *h1Upstream {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return nil
	case len(l.idle) > 0:
		u := l.idle[len(l.idle)-1]
		l.idle = l.idle[:len(l.idle)-1]
		return u
	case l.open < maxH1Upstreams:
		l.open++
		return &h1Upstream{pool: l}
	}
	return nil
}

// put gives u back after a request: kept for the next while its
// connection is open and the client's is not gone.
func (l *h1Pool) put(u *h1Upstream) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if u.conn == nil || l.closed {
		u.close()
		l.open--
		return
	}
	l.idle = append(l.idle, u)
}

// close closes the idle connections, and each busy one when its request
// is done: the client's connection is over.
func (l *h1Pool) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for _, u := range l.idle {
		u.close()
	}
	l.idle, l.open = nil, l.open-len(l.idle)
}

// exchange writes req and reads the response head, skipping informational
// answers (103 Early Hints), within req's context.
func (u *h1Upstream) exchange(req *http.Request) (*http.Response, error) {
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
	for {
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
			continue
		}
		resp.Body = &h1Body{u: u, rc: resp.Body, eof: resp.Body == http.NoBody, keep: !resp.Close, stop: stop}
		return resp, nil
	}
}

// dial opens a connection to addr through the SSRF guard and, for https,
// verifies the upstream's certificate for host, as the Transport does.
func (u *h1Upstream) dial(ctx context.Context, addr, host string) error {
	c, err := u.pool.p.dialUpstream(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	if u.pool.scheme == "https" {
		tc := tls.Client(c, &tls.Config{RootCAs: u.pool.p.cfg.UpstreamRoots, MinVersion: tls.VersionTLS12,
			ServerName: host, NextProtos: []string{"http/1.1"}})
		hctx, cancel := context.WithTimeout(ctx, u.pool.p.cfg.ConnectTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			c.Close()
			return err
		}
		c = tc
	}
	u.conn, u.br, u.bw = c, bufio.NewReader(c), bufio.NewWriter(c)
	return nil
}

// close closes the connection, if one is open.
func (u *h1Upstream) close() {
	if u.conn != nil {
		u.conn.Close()
		u.conn = nil
	}
}

// h1Body is a response body on an h1Upstream's connection: the connection
// is kept for the next request only when the body was read to its end and
// the upstream did not ask to close.
type h1Body struct {
	u    *h1Upstream
	rc   io.ReadCloser
	eof  bool
	keep bool
	stop func() bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *h1Body) Close() error {
	// A connection whose context ended has a deadline in the past.
	if stopped := b.stop(); !b.eof || !b.keep || !stopped {
		// Closed first, so that closing the body does not drain the rest of
		// a long answer.
		b.u.close()
	}
	err := b.rc.Close()
	b.u.pool.put(b.u)
	return err
}
