package tproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/airlockhq/airlock/internal/testenv"
)

// TestBumpHTTP1Server checks how intercepted HTTP/1.1 is served, exchange
// by exchange on one client connection: what the client reads back and
// whether the connection carries another request after.
func TestBumpHTTP1Server(t *testing.T) {
	up, h, roots := newAPIHarness(t)
	host := fmt.Sprintf("api.allowed.test:%d", up.httpsPort)
	big := strings.Repeat("a", 1<<20)
	for _, tc := range []struct {
		name string
		send string   // raw bytes from the client
		want []string // status lines, in order
		body string   // in the last answer
		// open: the connection serves a GET afterwards; else it is closed.
		open bool
		head bool // a HEAD: the answers have no body
	}{
		{name: "GET", send: "GET /v1/a HTTP/1.1\r\nHost: " + host + "\r\n\r\n", want: []string{"200"}, body: "internet", open: true},
		{name: "HEAD has no body", send: "HEAD /v1/a HTTP/1.1\r\nHost: " + host + "\r\n\r\n", want: []string{"200"}, body: "", open: true, head: true},
		{name: "pipelined, answered in order", send: "GET /v1/a HTTP/1.1\r\nHost: " + host + "\r\n\r\nGET /v1/b HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
			want: []string{"200", "200"}, body: "internet", open: true},
		{name: "Connection: close", send: "GET /v1/a HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n", want: []string{"200"}, body: "internet"},
		{name: "HTTP/1.0 closes after", send: "GET /v1/a HTTP/1.0\r\nHost: " + host + "\r\n\r\n", want: []string{"200"}, body: "internet"},
		{name: "POST with a body", send: "POST /v1/a HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 4\r\n\r\nbody", want: []string{"200"}, body: "internet", open: true},
		{name: "chunked POST", send: "POST /v1/a HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\n\r\n", want: []string{"200"}, body: "internet", open: true},
		{name: "refused request, its small body read off", send: "POST /v1/a HTTP/1.1\r\nHost: other.test\r\nContent-Length: 4\r\n\r\nbody", want: []string{"403"}, open: true},
		{name: "refused request, its large body not read", send: "POST /v1/a HTTP/1.1\r\nHost: other.test\r\nContent-Length: 1048576\r\n\r\n" + big, want: []string{"403"}},
		{name: "no Host", send: "GET /v1/a HTTP/1.1\r\n\r\n", want: []string{"400"}},
		{name: "absolute form", send: "GET https://" + host + "/v1/a HTTP/1.1\r\nHost: " + host + "\r\n\r\n", want: []string{"200"}, body: "internet", open: true},
		{name: "absolute form without Host", send: "GET https://" + host + "/v1/a HTTP/1.1\r\n\r\n", want: []string{"400"}},
		{name: "absolute form, a malformed Host", send: "GET https://" + host + "/v1/a HTTP/1.1\r\nHost: a/b\r\n\r\n", want: []string{"400"}},
		// The target's authority is the request's, as for http.Server;
		// the Host header goes upstream as decided.
		{name: "absolute form, Host another name", send: "GET https://" + host + "/v1/a HTTP/1.1\r\nHost: other.test\r\n\r\n", want: []string{"200"}, body: "internet", open: true},
		{name: "absolute form for another name", send: "GET https://other.test/v1/a HTTP/1.1\r\nHost: " + host + "\r\n\r\n", want: []string{"403"}, open: true},
		{name: "absolute form without Host, pipelined", send: "GET /v1/a HTTP/1.1\r\nHost: " + host + "\r\n\r\nGET https://" + host + "/v1/a HTTP/1.1\r\n\r\n", want: []string{"200", "400"}},
		{name: "absolute form, HTTP/1.0 without Host", send: "GET https://" + host + "/v1/a HTTP/1.0\r\n\r\n", want: []string{"200"}, body: "internet"},
		{name: "a bad header name", send: "GET /v1/a HTTP/1.1\r\nHost: " + host + "\r\nBad Name: x\r\n\r\n", want: []string{"400"}},
		{name: "two Content-Lengths", send: "POST /v1/a HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nbody", want: []string{"400"}},
		{name: "an unknown transfer coding", send: "POST /v1/a HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: gzip\r\n\r\n", want: []string{"501"}},
		{name: "an unknown Expect", send: "GET /v1/a HTTP/1.1\r\nHost: " + host + "\r\nExpect: magic\r\n\r\n", want: []string{"417"}},
		{name: "HTTP/2 preface in mid-connection", send: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", want: []string{"505"}},
		{name: "a head over 1 MiB", send: "GET /v1/a HTTP/1.1\r\nHost: " + host + "\r\nX-Big: " + big + strings.Repeat("a", 8<<10) + "\r\n\r\n", want: []string{"431"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tls.Dial("tcp4", h.proxy.Addr().String(), &tls.Config{ServerName: "api.allowed.test", RootCAs: roots, NextProtos: []string{"http/1.1"}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			go io.WriteString(c, tc.send)
			r := bufio.NewReader(c)
			var got []string
			var body string
			for range tc.want {
				status, b, err := readAnswer(r, tc.head)
				if err != nil {
					t.Fatalf("after %v: %v", got, err)
				}
				got, body = append(got, status), b
			}
			if diff := cmp.Diff(tc.want, got); diff != "" || body != tc.body && tc.want[len(tc.want)-1] == "200" {
				t.Fatalf("statuses (-want +got):\n%s\nlast body %q, want %q", diff, body, tc.body)
			}
			// A GET after: answered on an open connection, nothing on a
			// closed one.
			io.WriteString(c, "GET /v1/after HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
			status, _, err := readAnswer(r, false)
			if tc.open && status != "200" {
				t.Errorf("GET after: %q %v, want 200 on a connection kept open", status, err)
			}
			if !tc.open && err == nil {
				t.Errorf("GET after: %q, want the connection closed", status)
			}
		})
	}
}

// TestBumpHTTP1ExpectContinue: a client that waits for 100 Continue
// before it sends its body is told to go on when the body is wanted.
func TestBumpHTTP1ExpectContinue(t *testing.T) {
	up, h, roots := newAPIHarness(t)
	c, r := dialAPI(t, h, roots)()
	fmt.Fprintf(c, "POST /v1/echo HTTP/1.1\r\nHost: api.allowed.test:%d\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n", up.httpsPort)
	if status, _, err := readAnswer(r, false); status != "100" {
		t.Fatalf("before the body: %q %v, want 100", status, err)
	}
	io.WriteString(c, "body")
	status, body, err := readAnswer(r, false)
	for status == "100" && err == nil { // the upstream's own, passed on
		status, body, err = readAnswer(r, false)
	}
	if status != "200" || body != "body" {
		t.Errorf("answer: %q %q %v, want 200 with the body echoed", status, body, err)
	}
}

// readAnswer reads one answer's head and body (none after a HEAD) and
// returns its status code.
func readAnswer(r *bufio.Reader, head bool) (string, string, error) {
	method := "GET"
	if head {
		method = "HEAD"
	}
	resp, err := http.ReadResponse(r, &http.Request{Method: method})
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return fmt.Sprint(resp.StatusCode), string(b), err
}

// TestBumpClientLeavingEndsItsHeldRequest: a client that goes away while
// its request waits for a person ends the wait (the approval, asked by
// nobody any more, is dropped), as it would with http.Server.
func TestBumpClientLeavingEndsItsHeldRequest(t *testing.T) {
	up := startUpstream(t)
	policy := fmt.Sprintf("sandbox:\n  approval_timeout: 60\n  network_allowlist:\n    user:\n      - pattern: \"cidr:127.0.0.1/32:%[1]d\"\n      - pattern: \"api.allowed.test:%[1]d/v1/*\"\n", up.httpsPort)
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), up.httpsPort), policy)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	// The held request first on its connection, and right after a quick
	// one (the watch's timer, set for that one, comes due while this one
	// waits).
	for _, quickFirst := range []bool{false, true} {
		c, r := dialAPI(t, h, roots)()
		if quickFirst {
			fmt.Fprintf(c, "GET /v1/quick HTTP/1.1\r\nHost: api.allowed.test:%d\r\n\r\n", up.httpsPort)
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		fmt.Fprintf(c, "GET /v2/held HTTP/1.1\r\nHost: api.allowed.test:%d\r\n\r\n", up.httpsPort)
		h.waitPending(t, 1)
		c.Close()
		if !testenv.Poll(5*time.Second, func() bool { return len(h.broker.List()) == 0 }) {
			t.Errorf("quick one first %v: pending after the client left: %+v", quickFirst, h.broker.List())
		}
		r.ReadByte()
	}
}

// TestForwardHeadAsTheReverseProxy: what forward writes upstream for a GET
// is byte for byte what the ReverseProxy (which carries every other
// request) makes of the same request with Request.Write.
func TestForwardHeadAsTheReverseProxy(t *testing.T) {
	p := &Proxy{cfg: Config{Sandbox: "test"}}
	for _, tc := range []struct {
		name   string
		target string
		header http.Header
	}{
		{name: "no headers", target: "/v1/x", header: http.Header{}},
		{name: "usual", target: "/v1/x?a=1&b=2", header: http.Header{"Accept": {"*/*"}, "User-Agent": {"curl/8"}, "Accept-Encoding": {"gzip"}, "Cookie": {"a=1", "b=2"}}},
		{name: "hop-by-hop and forwarding headers", target: "/v1/x", header: http.Header{
			"Connection": {"keep-alive, X-Private, user-agent"}, "X-Private": {"p"}, "User-Agent": {"ua"}, "Keep-Alive": {"timeout=5"},
			"Proxy-Authorization": {"Basic x"}, "Proxy-Connection": {"keep-alive"}, "Te": {"trailers, deflate"}, "Trailer": {"X-T"},
			"Forwarded": {"for=1.2.3.4"}, "X-Forwarded-For": {"1.2.3.4"}, "X-Forwarded-Host": {"evil.test"}, "X-Forwarded-Proto": {"http"},
			"Content-Length": {"0"}, "Accept": {"text/html"}}},
		{name: "TE without trailers", target: "/v1/x", header: http.Header{"Te": {"deflate"}}},
		{name: "an empty User-Agent", target: "/v1/x", header: http.Header{"User-Agent": {"", "second"}}},
		{name: "a query Go would re-encode", target: "/v1/x?b=2;a=1&c", header: http.Header{}},
		{name: "values with spaces around", target: "/v1/x", header: http.Header{"X-A": {"  padded\t"}, "X-Many": {"1", "2", "3"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mk := func() *http.Request {
				r, err := http.NewRequest("GET", "https://api.allowed.test"+tc.target, nil)
				if err != nil {
					t.Fatal(err)
				}
				r.Header = tc.header.Clone()
				r.RequestURI = tc.target
				if err := setTarget(r, tc.target); err != nil {
					t.Fatal(err)
				}
				return r
			}
			var lean strings.Builder
			bw := bufio.NewWriter(&lean)
			writeRequestHead(bw, mk(), tc.target, "api.allowed.test:8443")
			bw.Flush()

			var viaProxy strings.Builder
			rp := p.reverseProxy("https", roundTripFunc(func(out *http.Request) (*http.Response, error) {
				out.Write(&viaProxy)
				return nil, io.EOF
			}))
			r := mk()
			ctx := context.WithValue(r.Context(), sourceKey{}, "agent")
			ctx = context.WithValue(ctx, targetKey{}, "api.allowed.test:8443")
			ctx = context.WithValue(ctx, authorityKey{}, "api.allowed.test:8443")
			rp.ServeHTTP(httptest.NewRecorder(), r.WithContext(ctx))
			if diff := cmp.Diff(viaProxy.String(), lean.String()); diff != "" {
				t.Errorf("forward's head differs from the ReverseProxy's (-proxy +forward):\n%s", diff)
			}
		})
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestH1RequestBodyEndsWithItsRequest: a request's body read after its
// answer (by a goroutine the handler left behind, as a Transport's write
// loop may be) gives nothing, never the next request's body or its 100
// Continue.
func TestH1RequestBodyEndsWithItsRequest(t *testing.T) {
	p := &Proxy{ctx: t.Context(), log: slog.New(slog.DiscardHandler), cfg: Config{PeekTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second}}
	client, server := net.Pipe()
	defer client.Close()
	kept := make(chan io.Reader, 1)
	stale := make(chan string, 1)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/first" {
			kept <- r.Body // read later, not now
			return
		}
		b := make([]byte, 64)
		n, err := (<-kept).Read(b)
		stale <- fmt.Sprintf("%q %v", b[:n], err)
		io.Copy(io.Discard, r.Body)
	})
	go newH1Server(p, server, handler).serve()
	go io.WriteString(client, "POST /first HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n\r\none"+
		"POST /second HTTP/1.1\r\nHost: a.test\r\nContent-Length: 6\r\n\r\nsecret")
	r := bufio.NewReader(client)
	for range 2 {
		if status, _, err := readAnswer(r, false); status != "200" {
			t.Fatalf("answer: %q %v", status, err)
		}
	}
	if got, want := <-stale, fmt.Sprintf("%q %v", "", http.ErrBodyReadAfterClose); got != want {
		t.Errorf("the first body read during the second request: %s, want %s", got, want)
	}
}

// TestBumpHTTP1ExpectNotForwarded: Expect is the client's with airlock,
// which answers it; the upstream never sees it, as with http.Server.
func TestBumpHTTP1ExpectNotForwarded(t *testing.T) {
	up, h, roots := newAPIHarness(t)
	c, r := dialAPI(t, h, roots)()
	fmt.Fprintf(c, "GET /v1/expect HTTP/1.1\r\nHost: api.allowed.test:%d\r\nExpect: 100-continue\r\n\r\n", up.httpsPort)
	status, body, err := readAnswer(r, false)
	if status != "200" || body != "" {
		t.Errorf("answer: %q %q %v, want 200 and no Expect upstream", status, body, err)
	}
}

// TestH1TrailersOnlyValidNames: trailers an answer declares, or sets
// undeclared with http.TrailerPrefix, go out only under names valid for a
// trailer, as http.Server (and the HTTP/2 server) send them: a name from
// the upstream cannot write another field or a framing one.
func TestH1TrailersOnlyValidNames(t *testing.T) {
	p := &Proxy{ctx: t.Context(), log: slog.New(slog.DiscardHandler), cfg: Config{PeekTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second}}
	client, server := net.Pipe()
	defer client.Close()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Good, X-A:evil, Content-Length")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "body")
		w.(http.Flusher).Flush()
		w.Header()["X-Good"] = []string{"1"}
		w.Header()["X-A:evil"] = []string{"2"}
		w.Header()["Content-Length"] = []string{"3"}
		// Undeclared, as the ReverseProxy copies an upstream's: the
		// same names are refused.
		w.Header()[http.TrailerPrefix+"Transfer-Encoding"] = []string{"chunked"}
		w.Header()[http.TrailerPrefix+"Content-Length"] = []string{"4"}
		w.Header()[http.TrailerPrefix+"Host"] = []string{"evil.test"}
	})
	go newH1Server(p, server, handler).serve()
	go io.WriteString(client, "GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
	raw, _ := io.ReadAll(client)
	_, rest, _ := strings.Cut(string(raw), "\r\n0\r\n")
	if rest != "X-Good: 1\r\n\r\n" {
		t.Errorf("trailer section %q, want only X-Good\n%s", rest, raw)
	}
	if !strings.Contains(string(raw), "\r\nTrailer: X-Good\r\n") {
		t.Errorf("Trailer header not only X-Good:\n%s", raw)
	}
}

// TestH1HostChecksAsHTTPServer sends request heads to an h1Server and to
// an http.Server, whole and byte by byte, and wants the same status from
// both: the Host header is checked even when the target's authority is
// the request's (absolute form), which http.ReadRequest hides.
func TestH1HostChecksAsHTTPServer(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	ref := httptest.NewServer(ok)
	defer ref.Close()
	p := &Proxy{ctx: t.Context(), log: slog.New(slog.DiscardHandler), cfg: Config{PeekTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second}}
	for _, tc := range []struct{ name, head string }{
		{"origin form", "GET /a HTTP/1.1\r\nHost: a.test\r\n"},
		{"origin form, no Host", "GET /a HTTP/1.1\r\n"},
		{"origin form, a malformed Host", "GET /a HTTP/1.1\r\nHost: a/b\r\n"},
		{"origin form, two Hosts", "GET /a HTTP/1.1\r\nHost: a.test\r\nHost: a.test\r\n"},
		{"absolute form", "GET http://a.test/a HTTP/1.1\r\nHost: a.test\r\n"},
		{"absolute form, no Host", "GET http://a.test/a HTTP/1.1\r\n"},
		{"absolute form https, no Host", "GET https://a.test:443/a HTTP/1.1\r\n"},
		{"absolute form, no Host, other headers", "GET http://a.test/a HTTP/1.1\r\nAccept: */*\r\nX-Host: a.test\r\n"},
		{"absolute form, a malformed Host", "GET http://a.test/a HTTP/1.1\r\nHost: a/b\r\n"},
		{"absolute form, a Host with a space", "GET http://a.test/a HTTP/1.1\r\nHost: a b\r\n"},
		{"absolute form, two Hosts", "GET http://a.test/a HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n"},
		{"absolute form, Host another name", "GET http://a.test/a HTTP/1.1\r\nHost: b.test\r\n"},
		{"absolute form, HTTP/1.0 without Host", "GET http://a.test/a HTTP/1.0\r\n"},
		{"absolute form, HTTP/1.0, a malformed Host", "GET http://a.test/a HTTP/1.0\r\nHost: a/b\r\n"},
		{"absolute form, a long head without Host", "GET http://a.test/a HTTP/1.1\r\nX-Pad: " + strings.Repeat("p", 10<<10) + "\r\n"},
		{"absolute form, a long head, a malformed Host", "GET http://a.test/a HTTP/1.1\r\nX-Pad: " + strings.Repeat("p", 10<<10) + "\r\nHost: a/b\r\n"},
	} {
		send := tc.head + "Connection: close\r\n\r\n"
		t.Run(tc.name, func(t *testing.T) {
			rc, err := net.Dial("tcp4", ref.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			rc.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(rc, send)
			want, _, err := readAnswer(bufio.NewReader(rc), false)
			if err != nil {
				t.Fatalf("http.Server: %v", err)
			}
			for _, bytewise := range []bool{false, true} {
				client, server := net.Pipe()
				go newH1Server(p, server, ok).serve()
				client.SetDeadline(time.Now().Add(10 * time.Second))
				go func() {
					if !bytewise {
						io.WriteString(client, send)
						return
					}
					for i := range len(send) {
						if _, err := io.WriteString(client, send[i:i+1]); err != nil {
							return
						}
					}
				}()
				got, _, err := readAnswer(bufio.NewReader(client), false)
				client.Close()
				if got != want {
					t.Errorf("byte by byte %v: status %q (%v), http.Server's %q", bytewise, got, err, want)
				}
			}
		})
	}
}

// FuzzH1Server feeds a client's bytes to an h1Server whose handler reads
// the body and answers: whatever the bytes, it returns, and what it wrote
// begins as an HTTP/1.1 answer.
func FuzzH1Server(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: a.test\r\n\r\nHEAD /b HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a.test\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
		"GET /flush HTTP/1.0\r\n\r\n",
		"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\nGET http://a.test/ HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer ln.Close()
	p := &Proxy{cfg: Config{PeekTimeout: 2 * time.Second, IdleTimeout: 2 * time.Second}, ctx: context.Background(), log: slog.New(slog.DiscardHandler)}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		w.Header().Set("X-Target", r.RequestURI)
		if r.URL.Path == "/flush" {
			http.NewResponseController(w).Flush()
		}
		io.WriteString(w, "ok")
	})
	f.Fuzz(func(t *testing.T, in []byte) {
		client, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		server, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { newH1Server(p, server, handler).serve(); close(done) }()
		client.SetDeadline(time.Now().Add(10 * time.Second))
		client.Write(in)
		client.(*net.TCPConn).CloseWrite()
		out, _ := io.ReadAll(client)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("the server still serves %q", in)
		}
		if len(out) > 0 && !bytes.HasPrefix(out, []byte("HTTP/1.1 ")) {
			t.Fatalf("answer to %q: %q", in, out)
		}
	})
}
