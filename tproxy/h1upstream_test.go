package tproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testcerts"
	"github.com/airlockhq/airlock/internal/testenv"
)

// TestBumpKeepAliveUpstream checks the upstream side of intercepted
// HTTP/1.1: GET and HEAD requests reuse one upstream connection, across
// client connections too; an upstream that closes it, asks to close it, or
// whose answer the client abandons costs a new one, and no request fails
// for it; a POST still goes through.
func TestBumpKeepAliveUpstream(t *testing.T) {
	up, h, roots := newAPIHarness(t)
	port := up.httpsPort
	dial := dialAPI(t, h, roots)
	c, r := dial()
	do := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, fmt.Sprintf("https://api.allowed.test:%d%s", port, path), strings.NewReader(map[bool]string{true: "body"}[method == "POST"]))
		if method != "POST" {
			req.Body, req.ContentLength = nil, 0
		}
		if err := req.Write(c); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(r, req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	want := func(what string, method, path string, status int, body string, conns int32) {
		t.Helper()
		s, b := do(method, path)
		if s != status || b != body {
			t.Errorf("%s: %d %q, want %d %q", what, s, b, status, body)
		}
		if n := up.tlsConns.Load(); n != conns {
			t.Errorf("%s: the upstream has had %d connections, want %d", what, n, conns)
		}
	}
	want("first GET", "GET", "/v1/a", 200, "internet", 1)
	want("second GET", "GET", "/v1/b", 200, "internet", 1)
	want("HEAD", "HEAD", "/v1/c", 200, "", 1)
	// The upstream closes its idle connections: the next GET is sent
	// again on a new one.
	up.tlsSrv.SetKeepAlivesEnabled(false)
	testenv.WaitFor(t, 5*time.Second, "the upstream to close its connections", func() bool { return up.tlsClosed.Load() == up.tlsConns.Load() })
	up.tlsSrv.SetKeepAlivesEnabled(true)
	want("GET after the upstream closed", "GET", "/v1/d", 200, "internet", 2)
	want("GET answered with Connection: close", "GET", "/v1/close", 200, "internet", 2)
	want("GET after Connection: close", "GET", "/v1/e", 200, "internet", 3)
	// A body goes through the shared Transport.
	if s, b := do("POST", "/v1/f"); s != 200 || b != "internet" {
		t.Errorf("POST: %d %q", s, b)
	}

	// A client that leaves in the middle of an endless answer: the
	// upstream connection is closed, not drained, and the proxy serves the
	// next client at once.
	c2, r2 := dial()
	fmt.Fprintf(c2, "GET /v1/stream HTTP/1.1\r\nHost: api.allowed.test:%d\r\n\r\n", port)
	if status, _ := r2.ReadString('\n'); !strings.Contains(status, "200") {
		t.Fatalf("stream: %q", status)
	}
	io.ReadFull(r2, make([]byte, 256<<10))
	c2.Close()
	before := up.tlsConns.Load()
	c, r = dial()
	want("GET after an abandoned stream", "GET", "/v1/g", 200, "internet", before+1)
	// Idle upstream connections belong to the proxy, not to a client
	// connection: another client's GET takes the one /v1/g left.
	c, r = dial()
	want("GET from another client connection", "GET", "/v1/h", 200, "internet", before+1)

	var paths []string
	for _, s := range up.requests() {
		paths = append(paths, strings.Fields(s)[1])
	}
	if got := strings.Join(paths, " "); got != "/v1/a /v1/b /v1/c /v1/d /v1/close /v1/e /v1/f /v1/stream /v1/g /v1/h" {
		t.Errorf("the upstream saw %s", got)
	}
}

// TestBumpStreamsArriveAtOnce checks that an intercepted event stream and
// a body of unknown length (an LLM's token stream) reach the client as the
// upstream sends them, over HTTP/1.1 and HTTP/2.
func TestBumpStreamsArriveAtOnce(t *testing.T) {
	up, h, roots := newAPIHarness(t)
	port := up.httpsPort
	for _, proto := range []string{"http/1.1", "h2"} {
		tr := &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: roots, NextProtos: []string{proto}},
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, "tcp4", h.proxy.Addr().String())
				if err == nil {
					t.Cleanup(func() { c.Close() }) // before the proxy's: it would wait for them
				}
				return c, err
			}}
		if proto == "http/1.1" {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		for _, p := range []string{"events", "ndjson"} {
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("https://api.allowed.test:%d/v1/%s", port, p), nil)
			start := time.Now()
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", proto, p, err)
			}
			line, err := bufio.NewReader(resp.Body).ReadString('\n')
			if el := time.Since(start); line != "data: first\n" || el > 2*time.Second || resp.Proto != map[string]string{"h2": "HTTP/2.0"}[proto]+map[string]string{"http/1.1": "HTTP/1.1"}[proto] {
				t.Errorf("%s %s: %q (%v) after %v", proto, p, line, err, el)
			}
			cancel()
			resp.Body.Close()
		}
	}
}

// laxUpstream serves HTTPS for api.allowed.test with handle writing raw
// HTTP/1.1 answers to each request on a connection, as a lax or hostile
// server would, and a proxy intercepting it (rules on /v1/*). It returns
// a function that sends one request on a client connection of the proxy
// and returns the answer's status and body.
func laxUpstream(t *testing.T, handle func(c net.Conn, r *http.Request)) (send func(c *tls.Conn, r *bufio.Reader, method, path, header string) (int, string), dial func() (*tls.Conn, *bufio.Reader)) {
	t.Helper()
	caPEM, leaf, err := testcerts.New([]string{"api.allowed.test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	up := &upstream{caFile: filepath.Join(t.TempDir(), "ca.pem")}
	os.WriteFile(up.caFile, caPEM, 0o644)
	ln, err := tls.Listen("tcp4", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{leaf}, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	up.httpsPort = uint16(ln.Addr().(*net.TCPAddr).Port)
	var conns sync.WaitGroup
	// Registered before the proxy's cleanup, so it runs after it: the
	// proxy closes its side of the connections first.
	t.Cleanup(func() { ln.Close(); conns.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					handle(c, r)
				}
			})
		}
	}()
	port := up.httpsPort
	h, roots := apiHarness(t, up)
	dial = dialAPI(t, h, roots)
	send = func(c *tls.Conn, r *bufio.Reader, method, path, header string) (int, string) {
		t.Helper()
		fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: api.allowed.test:%d\r\n%s\r\n", method, path, port, header)
		req, _ := http.NewRequest(method, "https://api.allowed.test"+path, nil)
		resp, err := http.ReadResponse(r, req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	return send, dial
}

// TestBumpPoolKeepsAnswersApart: an upstream that answers a HEAD with a
// body (as one honouring X-HTTP-Method-Override: GET does) leaves bytes
// on its connection; they must not become another request's answer, nor
// push that request's answer onto a third.
func TestBumpPoolKeepsAnswersApart(t *testing.T) {
	inject := "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nINJECTED"
	answered := make(chan struct{}, 16) // the upstream has written all it will for a request
	send, dial := laxUpstream(t, func(c net.Conn, r *http.Request) {
		defer func() { answered <- struct{}{} }()
		time.Sleep(20 * time.Millisecond) // not a wait: a slow upstream
		switch {
		case r.Method == "HEAD":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", len(inject))
			time.Sleep(20 * time.Millisecond) // not a wait: the stray body comes after the head
			io.WriteString(c, inject)
		case r.URL.Path == "/v1/private-b":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nsecret of b")
		default:
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfor a")
		}
	})
	ca, ra := dial()
	cb, rb := dial()
	send(ca, ra, "HEAD", "/v1/evil", "X-HTTP-Method-Override: GET\r\n")
	<-answered // the stray body is on the connection
	_, b := send(cb, rb, "GET", "/v1/private-b", "Authorization: Bearer b\r\n")
	<-answered // so is b's answer, if a stray body took its place
	_, a := send(ca, ra, "GET", "/v1/a", "")
	if b != "secret of b" || a != "for a" {
		t.Errorf("answers mixed up: B got %q, A got %q", b, a)
	}
}

// TestBumpPoolDropsNoisyIdleConnections: a server that sends 408 on an
// idle kept-alive connection before closing it must not answer the next
// request with it.
func TestBumpPoolDropsNoisyIdleConnections(t *testing.T) {
	noisy := make(chan struct{}, 16) // the upstream has sent its 408
	send, dial := laxUpstream(t, func(c net.Conn, r *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		time.Sleep(30 * time.Millisecond) // not a wait: the 408 comes while the connection is idle
		io.WriteString(c, "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
		noisy <- struct{}{}
	})
	c, r := dial()
	send(c, r, "GET", "/v1/1", "")
	<-noisy
	if s, b := send(c, r, "GET", "/v1/2", ""); s != 200 || b != "ok" {
		t.Errorf("second GET: %d %q (the idle connection's 408)", s, b)
	}
}

// TestBumpPoolBoundsTheHead: an upstream's endless head or endless
// informational answers end in a 502, not in airlockd's memory.
func TestBumpPoolBoundsTheHead(t *testing.T) {
	send, dial := laxUpstream(t, func(c net.Conn, r *http.Request) {
		switch r.URL.Path {
		case "/v1/big":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Big: ")
			chunk := []byte(strings.Repeat("a", 1<<20))
			for range 20 {
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
			io.WriteString(c, "\r\nContent-Length: 0\r\n\r\n")
		case "/v1/hints":
			for range 100 {
				io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	for _, p := range []string{"/v1/big", "/v1/hints"} {
		c, r := dial()
		if s, b := send(c, r, "GET", p, ""); s != http.StatusBadGateway {
			t.Errorf("%s: %d %.80q, want 502", p, s, b)
		}
	}
}

// TestBumpUpstreamConnectionsPerMember: no member's request goes over an
// upstream connection dialled for another, by the pool (GET) or by the
// Transport (POST).
func TestBumpUpstreamConnectionsPerMember(t *testing.T) {
	up, h, _ := newAPIHarness(t)
	cl := &h1Client{pool: h.proxy.h1, scheme: "https"}
	send := func(member, method string) {
		t.Helper()
		ctx := context.WithValue(context.Background(), sourceKey{}, member)
		req, _ := http.NewRequestWithContext(ctx, method, fmt.Sprintf("https://api.allowed.test:%d/v1/x", up.httpsPort), strings.NewReader(map[bool]string{true: "body"}[method == "POST"]))
		if method == "GET" {
			req.Body, req.ContentLength = nil, 0
		}
		resp, err := cl.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s from %s: %v", method, member, err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	for _, step := range []struct {
		member, method string
		conns          int32
	}{
		{"agent", "GET", 1}, {"agent-2", "GET", 2}, {"agent", "GET", 2},
		{"agent", "POST", 3}, {"agent-2", "POST", 4}, {"agent", "POST", 4}, {"agent-2", "POST", 4},
	} {
		send(step.member, step.method)
		if n := up.tlsConns.Load(); n != step.conns {
			t.Errorf("after %s from %s: %d upstream connections, want %d", step.method, step.member, n, step.conns)
		}
	}
}
