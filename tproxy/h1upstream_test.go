package tproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
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

// tlsUpstream listens for HTTPS (HTTP/1.1 only) as api.allowed.test,
// with a CA of its own, whose file up names.
func tlsUpstream(t *testing.T) (*upstream, net.Listener) {
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
	return up, ln
}

// laxUpstream serves HTTPS for api.allowed.test with handle writing raw
// HTTP/1.1 answers to each request on a connection, as a lax or hostile
// server would, and a proxy intercepting it (rules on /v1/*). It returns
// a function that sends one request on a client connection of the proxy
// and returns the answer's status and body.
func laxUpstream(t *testing.T, handle func(c net.Conn, r *http.Request)) (send func(c *tls.Conn, r *bufio.Reader, method, path, header string) (int, string), dial func() (*tls.Conn, *bufio.Reader)) {
	t.Helper()
	up, ln := tlsUpstream(t)
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

// TestBumpAnswerBeforeTheBodyEnds: an upstream (HTTP/2 here, as Go's
// server speaks it to the proxy's Transport) answers an upload before the
// member has sent all of its body. The member gets the answer at once,
// over HTTP/1.1 and over HTTP/2, not when it sends the rest or a timeout
// ends the wait, and the request is recorded with the answer's status.
func TestBumpAnswerBeforeTheBodyEnds(t *testing.T) {
	up := startUpstream(t)
	records := make(chan RequestRecord, 4)
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), up.httpsPort),
		rules(up.httpsPort, fmt.Sprintf("api.allowed.test:%d/v1/*", up.httpsPort)),
		func(c *Config) { c.OnRequest = func(r RequestRecord) { records <- r } })
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	url := fmt.Sprintf("https://api.allowed.test:%d/v1/early", up.httpsPort)
	for _, proto := range []string{"http/1.1", "h2"} {
		tr := &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: roots, NextProtos: []string{proto}},
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp4", h.proxy.Addr().String())
			}}
		defer tr.CloseIdleConnections()
		body, more := io.Pipe()
		defer more.Close()
		req, _ := http.NewRequest("POST", url, body)
		req.ContentLength = 1 << 20
		go more.Write([]byte("the first bytes of a large upload"))
		type answer struct {
			resp *http.Response
			err  error
		}
		got := make(chan answer, 1)
		go func() {
			resp, err := tr.RoundTrip(req)
			got <- answer{resp, err}
		}()
		select {
		case a := <-got:
			if a.err != nil {
				t.Fatalf("%s: %v", proto, a.err)
			}
			b, _ := io.ReadAll(a.resp.Body)
			a.resp.Body.Close()
			if a.resp.StatusCode != http.StatusRequestEntityTooLarge || string(b) != "too large" {
				t.Errorf("%s: %d %q, want the upstream's 413", proto, a.resp.StatusCode, b)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no answer while the member still owes most of its body", proto)
		}
		select {
		case r := <-records:
			if r.Method != "POST" || r.Status != http.StatusRequestEntityTooLarge {
				t.Errorf("%s: recorded %s %d, want POST 413", proto, r.Method, r.Status)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s: the request was not recorded", proto)
		}
	}
}

// rawTLSUpstream serves HTTPS (HTTP/1.1 only) for api.allowed.test,
// handing each connection's first request to handle, and returns the
// upstream (for its port) and a dialer of member connections to a proxy
// intercepting it.
func rawTLSUpstream(t *testing.T, handle func(c net.Conn, br *bufio.Reader, r *http.Request)) (*upstream, func() (*tls.Conn, *bufio.Reader)) {
	t.Helper()
	up := serveRawTLS(t, handle)
	h, roots := apiHarness(t, up)
	return up, dialAPI(t, h, roots)
}

// serveRawTLS serves HTTPS (HTTP/1.1 only) for api.allowed.test, handing
// each connection's first request to handle.
func serveRawTLS(t *testing.T, handle func(c net.Conn, br *bufio.Reader, r *http.Request)) *upstream {
	t.Helper()
	up, ln := tlsUpstream(t)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				r, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				handle(c, br, r)
			}()
		}
	}()
	return up
}

// TestBumpUpgradeWithBodyPassesHalfClose: a WebSocket upgrade that
// carries a body (so it takes transportRoundTrip's wrapped path) must
// pass the member's half-close on to the upstream, as the ReverseProxy
// does when the 101's body can CloseWrite (net/http's can),
// and still deliver what the upstream sends after it.
func TestBumpUpgradeWithBodyPassesHalfClose(t *testing.T) {
	up, dial := rawTLSUpstream(t, func(c net.Conn, br *bufio.Reader, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, _ := io.ReadAll(br) // until the member's half-close reaches us
		io.WriteString(c, "bye:"+string(got))
	})
	for _, body := range []string{"", "Content-Length: 5\r\n\r\nhello"} {
		c, r := dial()
		if body == "" {
			body = "\r\n"
		}
		fmt.Fprintf(c, "GET /v1/ws HTTP/1.1\r\nHost: api.allowed.test:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n%s", up.httpsPort, body)
		status, _ := r.ReadString('\n')
		if !strings.Contains(status, "101") {
			t.Fatalf("upgrade (%q): %q", body, status)
		}
		for {
			l, err := r.ReadString('\n')
			if err != nil || l == "\r\n" {
				break
			}
		}
		io.WriteString(c, "ping")
		c.CloseWrite()
		rest, err := io.ReadAll(r)
		if string(rest) != "bye:ping" {
			t.Errorf("upgrade with body %q, after the member's half-close: %q %v, want %q", body, rest, err, "bye:ping")
		}
	}
}

// TestBumpEarlyAnswerEndsTheConnection: the member's upload is
// answered early by an HTTP/2 upstream (the case d64d386 fixes), on a
// request that said Connection: close. The member has its answer; the
// proxy must then end the connection (within PeekTimeout at most, as it
// does for a kept-alive one), not hold it, its goroutines and the
// upstream stream for as long as the member keeps the socket open.
// (Before the fix it failed when the Transport's body writer was
// already in its read of the member's body as the 413 arrived.)
func TestBumpEarlyAnswerEndsTheConnection(t *testing.T) {
	up := startUpstream(t)
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), up.httpsPort),
		rules(up.httpsPort, fmt.Sprintf("api.allowed.test:%d/v1/*", up.httpsPort)),
		func(c *Config) { c.PeekTimeout = time.Second })
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	for _, conn := range []string{"keep-alive", "close"} {
		c, r := dialAPI(t, h, roots)()
		fmt.Fprintf(c, "POST /v1/early HTTP/1.1\r\nHost: api.allowed.test:%d\r\nConnection: %s\r\nContent-Length: 1048576\r\n\r\nthe first bytes of a large upload", up.httpsPort, conn)
		status, _, err := readAnswer(r, false)
		if status != "413" {
			t.Fatalf("%s: %q %v, want the upstream's 413", conn, status, err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		_, err = r.ReadByte()
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("Connection: %s: the proxy still holds the connection %v after the answer (PeekTimeout 1s)", conn, time.Since(start).Round(time.Second))
		}
	}
}

// TestBumpUpgradeToAnotherProtocolIsClosed: an upstream that answers a
// WebSocket upgrade by switching to another protocol gets its connection
// closed, and the member a 502, with a body or without: the ReverseProxy
// refuses such a switch but leaves the connection it was handed open, so
// a member with such an upstream could make the proxy hold connections
// without end.
func TestBumpUpgradeToAnotherProtocolIsClosed(t *testing.T) {
	closed := make(chan struct{}, 2)
	up, dial := rawTLSUpstream(t, func(c net.Conn, br *bufio.Reader, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: tunnel\r\nConnection: Upgrade\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(br); err == nil {
			closed <- struct{}{}
		}
	})
	for _, body := range []string{"\r\n", "Content-Length: 5\r\n\r\nhello"} {
		c, r := dial()
		fmt.Fprintf(c, "GET /v1/ws HTTP/1.1\r\nHost: api.allowed.test:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n%s", up.httpsPort, body)
		if status, _ := r.ReadString('\n'); !strings.Contains(status, " 502 ") {
			t.Errorf("a switch to another protocol (%q): %q, want 502", body, status)
		}
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Errorf("a switch to another protocol (%q): the upstream connection was left open", body)
		}
	}
}

// TestBumpNothingForwardedAfterTheRecord: a request's record is its whole
// exchange. An upstream that answers before it reads the body gets no
// more of it once the answer is done and recorded: what the member sends
// after that (here a form's _method=DELETE that a DELETE deny rule would
// refuse) is neither forwarded nor decided unrecorded, and the record's
// request bytes are the bytes the upstream received.
func TestBumpNothingForwardedAfterTheRecord(t *testing.T) {
	received := make(chan string, 4)
	up := serveRawTLS(t, func(c net.Conn, _ *bufio.Reader, r *http.Request) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nearly")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(r.Body)
		received <- string(b)
	})
	records := make(chan RequestRecord, 4)
	port := up.httpsPort
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), port),
		rules(port, fmt.Sprintf("api.allowed.test:%d", port))+fmt.Sprintf("  network_denylist:\n    - pattern: \"DELETE api.allowed.test:%d\"\n", port),
		func(c *Config) { c.OnRequest = func(r RequestRecord) { records <- r } })
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	url := fmt.Sprintf("https://api.allowed.test:%d/v1/early", port)
	for _, proto := range []string{"http/1.1", "h2"} {
		tr := &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: roots, NextProtos: []string{proto}},
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp4", h.proxy.Addr().String())
			}}
		defer tr.CloseIdleConnections()
		body, more := io.Pipe()
		defer more.Close()
		rest := "&_method=DELETE&b=" + strings.Repeat("x", 4096)
		req, _ := http.NewRequest("POST", url, body)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.ContentLength = int64(len("a=1") + len(rest))
		go more.Write([]byte("a=1"))
		res, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", proto, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || string(b) != "early" {
			t.Fatalf("%s: %d %q, want the upstream's early answer", proto, res.StatusCode, b)
		}
		var rec RequestRecord
		select {
		case rec = <-records:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the request was not recorded", proto)
		}
		// The rest of the form comes after the answer and its record.
		go func() { more.Write([]byte(rest)); more.Close() }()
		var got string
		select {
		case got = <-received:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the upstream's read of the body did not end", proto)
		}
		if strings.Contains(got, "_method") {
			t.Errorf("%s: the upstream received %q after the record", proto, got)
		}
		if rec.ReqBytes != int64(len(got)) {
			t.Errorf("%s: recorded %d request bytes, the upstream received %d (%q)", proto, rec.ReqBytes, len(got), got)
		}
		select {
		case r := <-records:
			t.Errorf("%s: a second record for one request: %+v", proto, r)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestRecordedBodyEnds: a read of the body that was under way when the
// request was recorded hands nothing on, and the count stays what the
// record holds.
func TestRecordedBodyEnds(t *testing.T) {
	pr, pw := io.Pipe()
	b := &recordedBody{ReadCloser: pr}
	go pw.Write([]byte("first"))
	buf := make([]byte, 64)
	if n, err := b.Read(buf); n != 5 || err != nil {
		t.Fatalf("read %d, %v; want 5 bytes", n, err)
	}
	type result struct {
		n   int
		err error
	}
	got := make(chan result, 1)
	go func() {
		n, err := b.Read(buf) // waits for the member's next bytes
		got <- result{n, err}
	}()
	if n := b.end(); n != 5 {
		t.Fatalf("end = %d, want 5", n)
	}
	// Taken by the read under way, if it had begun.
	go pw.Write([]byte("after the record"))
	defer pw.Close()
	r := <-got
	if r.n != 0 || !errors.Is(r.err, errRecorded) {
		t.Fatalf("read after the record: %d, %v; want 0, errRecorded", r.n, r.err)
	}
	if n, err := b.Read(buf); n != 0 || !errors.Is(err, errRecorded) {
		t.Fatalf("next read: %d, %v; want 0, errRecorded", n, err)
	}
}
