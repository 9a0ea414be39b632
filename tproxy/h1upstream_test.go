package tproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestBumpKeepAliveUpstream checks the upstream side of intercepted
// HTTP/1.1: GET and HEAD requests reuse one upstream connection, across
// client connections too; an upstream that closes it, asks to close it, or
// whose answer the client abandons costs a new one, and no request fails
// for it; a POST still goes through.
func TestBumpKeepAliveUpstream(t *testing.T) {
	up, h, roots := newAPIHarness(t)
	port := up.httpsPort
	dial := func() (*tls.Conn, *bufio.Reader) {
		c, err := tls.Dial("tcp4", h.proxy.Addr().String(), &tls.Config{ServerName: "api.allowed.test", RootCAs: roots, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c, bufio.NewReader(c)
	}
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
	up.tlsSrv.SetKeepAlivesEnabled(true)
	time.Sleep(50 * time.Millisecond)
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
