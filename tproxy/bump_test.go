package tproxy

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/policy"
)

// newBumpHarness is newHarness with a sandbox CA and the upstream's CA
// trusted upstream.
func newBumpHarness(t testing.TB, up *upstream, dst netip.AddrPort, policyYAML string, tune ...func(*Config)) (*harness, *CA) {
	ca, err := LoadOrCreateCA(filepath.Join(t.TempDir(), "ca"), "test")
	if err != nil {
		t.Fatal(err)
	}
	roots := up.roots(t)
	h := newHarness(t, up, dst, policyYAML, func(c *Config) {
		c.CA, c.UpstreamRoots = ca, roots
		for _, f := range tune {
			f(c)
		}
	})
	return h, ca
}

func TestBumpHeldRequestAllowPatternPersist(t *testing.T) {
	up := startUpstream(t)
	port := up.httpsPort
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), port),
		rules(port, fmt.Sprintf("api.allowed.test:%d/v1/*", port)))
	curl := func(path string) (string, error) {
		return h.getPath(t, ca.CertFile(), "api.allowed.test", port, path)
	}
	if out, err := curl("/v1/x"); err != nil || out != "internet" {
		t.Fatalf("/v1/x: %v %q", err, out)
	}
	// /v2/x is held, as a request, with its full URL.
	done := make(chan string, 1)
	go func() { o, _ := curl("/v2/x"); done <- o }()
	p := h.waitPending(t, 1)
	if want := fmt.Sprintf("https://api.allowed.test:%d/v2/x", port); p.URL != want || p.Method != "GET" {
		t.Errorf("pending = %+v, want GET %s", p, want)
	}
	if ua := p.Headers["User-Agent"]; len(ua) != 1 || !strings.HasPrefix(ua[0], "Go-http-client/") {
		t.Errorf("pending headers = %v, want the client's User-Agent", p.Headers)
	}
	pattern := fmt.Sprintf("api.allowed.test:%d/v2/*", port)
	if _, err := h.broker.Decide(p.ID, policy.Choice{Action: policy.ResolveAllowPattern, Pattern: pattern, Persist: true}); err != nil {
		t.Fatal(err)
	}
	if out := <-done; out != "internet" {
		t.Errorf("held request after allow_pattern: %q", out)
	}
	file, _ := os.ReadFile(h.sandbox.Path())
	if !strings.Contains(string(file), pattern) {
		t.Errorf("pattern not saved:\n%s", file)
	}
	// The next request needs no approval.
	if out, err := curl("/v2/y"); err != nil || out != "internet" || len(h.broker.List()) != 0 {
		t.Errorf("/v2/y: %v %q, pending %v", err, out, h.broker.List())
	}
	waitRecords(t, h, 3)
	h.mu.Lock()
	n := len(h.records)
	h.mu.Unlock()
	if n != 3 {
		t.Errorf("%d connection records, want 3", n)
	}
}

// newAPIHarness starts an upstream and a proxy that intercepts
// api.allowed.test (its rules look at paths under /v1/), and returns the
// sandbox CA as the roots clients trust.
func newAPIHarness(t *testing.T) (*upstream, *harness, *x509.CertPool) {
	t.Helper()
	up := startUpstream(t)
	h, roots := apiHarness(t, up)
	return up, h, roots
}

// apiHarness is newAPIHarness on upstream up.
func apiHarness(t *testing.T, up *upstream) (*harness, *x509.CertPool) {
	t.Helper()
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), up.httpsPort),
		rules(up.httpsPort, fmt.Sprintf("api.allowed.test:%d/v1/*", up.httpsPort)))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	return h, roots
}

// dialAPI returns a function that opens an HTTP/1.1 TLS connection to the
// proxy for api.allowed.test, trusting roots, closed when the test ends.
func dialAPI(t *testing.T, h *harness, roots *x509.CertPool) func() (*tls.Conn, *bufio.Reader) {
	return func() (*tls.Conn, *bufio.Reader) {
		t.Helper()
		c, err := tls.Dial("tcp4", h.proxy.Addr().String(), &tls.Config{ServerName: "api.allowed.test", RootCAs: roots, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(20 * time.Second))
		return c, bufio.NewReader(c)
	}
}

func TestBumpSanitizedHeaders(t *testing.T) {
	hdr := http.Header{"Authorization": {"Bearer sk-secret"}, "X-Api-Key": {"k"}, "Cookie": {"a=b"},
		"X-Goog-Api-Key": {"g"}, "Anthropic-Version": {"2023-06-01"}, "Accept": {"*/*"}}
	got := sanitizeHeaders(hdr)
	for _, k := range []string{"Authorization", "X-Api-Key", "Cookie", "X-Goog-Api-Key"} {
		if got.Get(k) != "***" {
			t.Errorf("%s = %q, want ***", k, got.Get(k))
		}
	}
	if got.Get("Accept") != "*/*" || got.Get("Anthropic-Version") != "2023-06-01" {
		t.Errorf("harmless headers changed: %v", got)
	}
	if hdr.Get("Authorization") != "Bearer sk-secret" {
		t.Error("sanitizing changed the request's own headers")
	}
}

func TestBumpForwardsToTheDecidedPort(t *testing.T) {
	up := startUpstream(t)
	port := up.httpsPort
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), port),
		rules(port, fmt.Sprintf("api.allowed.test:%d/v1/*", port)))
	// Host without the port: the request must still go to the port the
	// connection was made to and decided for, not to 443.
	_, _, out, err := h.fetch(t, "GET", fmt.Sprintf("https://api.allowed.test:%d/v1/x", port), ca.CertFile(), http.Header{"Host": {"api.allowed.test"}})
	if err != nil || out != "internet" {
		t.Errorf("Host without port: %v %q", err, out)
	}
}

func TestBumpWebSocketPassesAfterItsRequestIsChecked(t *testing.T) {
	up, h, roots := newAPIHarness(t)
	port := up.httpsPort
	dial := func(path string) (string, *tls.Conn, *bufio.Reader) {
		c, err := tls.Dial("tcp4", h.proxy.Addr().String(), &tls.Config{ServerName: "api.allowed.test", RootCAs: roots, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: api.allowed.test:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", path, port)
		r := bufio.NewReader(c)
		status, _ := r.ReadString('\n')
		return status, c, r
	}
	status, c, r := dial("/v1/ws")
	defer c.Close()
	if !strings.Contains(status, "101") {
		t.Fatalf("allowed upgrade: %q", status)
	}
	// Skip the rest of the 101 head, then echo through the tunnel.
	for {
		l, err := r.ReadString('\n')
		if err != nil || l == "\r\n" {
			break
		}
	}
	c.Write([]byte("ping"))
	got := make([]byte, 4)
	if _, err := io.ReadFull(r, got); err != nil || string(got) != "ping" {
		t.Errorf("echo through the upgraded connection: %q %v", got, err)
	}
	// An upgrade to a path no rule allows is refused before it reaches the
	// upstream.
	if status, c2, _ := dial("/v2/ws"); !strings.Contains(status, "403") {
		t.Errorf("upgrade to /v2/ws: %q", status)
	} else {
		c2.Close()
	}
}

func TestBumpUntrustedUpstreamIs502(t *testing.T) {
	up := startUpstream(t)
	port := up.httpsPort
	ca, err := LoadOrCreateCA(filepath.Join(t.TempDir(), "ca"), "test")
	if err != nil {
		t.Fatal(err)
	}
	// Upstream roots that do not include the upstream's CA.
	h := newHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), port), rules(port, fmt.Sprintf("api.allowed.test:%d/v1/*", port)), func(c *Config) {
		c.CA, c.UpstreamRoots = ca, x509.NewCertPool()
	})
	status, _, out, err := h.fetch(t, "GET", fmt.Sprintf("https://api.allowed.test:%d/v1/x", port), ca.CertFile(), nil)
	if err != nil || status != 502 || !strings.Contains(out, "not signed by a trusted CA") {
		t.Errorf("untrusted upstream: %d %v %q", status, err, out)
	}
	if len(up.requests()) != 0 {
		t.Errorf("the request reached an unverified upstream: %v", up.requests())
	}
}

// TestBumpRecordsEveryRequestOnce: every intercepted request is recorded
// once, with its outcome, however it ends (answered, with a body sent,
// broken off by the client, upgraded, over HTTP/2); and over HTTP/1.1 the
// record is made once the answer has left, so a slow record never holds
// the member's answer back.
func TestBumpRecordsEveryRequestOnce(t *testing.T) {
	up := startUpstream(t)
	port := up.httpsPort
	var mu sync.Mutex
	var records []RequestRecord
	release := make(chan struct{})
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), port),
		rules(port, fmt.Sprintf("api.allowed.test:%d/v1/*", port)),
		func(c *Config) {
			c.OnRequest = func(r RequestRecord) {
				if strings.HasSuffix(r.URL, "/v1/slow-record") {
					<-release
				}
				mu.Lock()
				records = append(records, r)
				mu.Unlock()
			}
		})
	base := fmt.Sprintf("https://api.allowed.test:%d", port)
	h1 := h.client(ca.CertFile(), true)
	defer h1.CloseIdleConnections()

	// The answer arrives while its record is still being made.
	got := make(chan string, 1)
	go func() {
		resp, err := h1.Get(base + "/v1/slow-record")
		if err != nil {
			got <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- string(b)
	}()
	select {
	case body := <-got:
		if body != "internet" {
			t.Errorf("answer while its record is made: %q", body)
		}
	case <-time.After(5 * time.Second):
		t.Error("the answer waited for its record")
	}
	close(release)

	if resp, err := h1.Post(base+"/v1/echo", "text/plain", strings.NewReader("twelve bytes")); err != nil {
		t.Fatal(err)
	} else {
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	// A body the client stops reading: the request ends with its connection.
	if resp, err := h1.Get(base + "/v1/stream"); err != nil {
		t.Fatal(err)
	} else {
		io.ReadFull(resp.Body, make([]byte, 100<<10))
		resp.Body.Close()
	}
	h1.CloseIdleConnections()
	// Upgrades, recorded when their tunnels end: one switched at once, one
	// after 103 Early Hints (the member gets both; the record says 101).
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	for _, path := range []string{"/v1/ws", "/v1/ws-hints"} {
		c, r := dialAPI(t, h, roots)()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: api.allowed.test:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", path, port)
		var statuses []string
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				break
			}
			if strings.HasPrefix(l, "HTTP/1.1 ") {
				if statuses = append(statuses, strings.TrimSpace(l)); strings.Contains(l, " 101 ") {
					break
				}
			}
		}
		if len(statuses) == 0 || !strings.Contains(statuses[len(statuses)-1], " 101 ") {
			t.Errorf("upgrade %s: status lines %q", path, statuses)
		}
		c.Close()
	}
	h2 := h.client(ca.CertFile(), false)
	if resp, err := h2.Get(base + "/v1/over-h2"); err != nil || resp.ProtoMajor != 2 {
		t.Fatalf("HTTP/2: %v %v", resp, err)
	} else {
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}

	want := map[string]string{ // path: what its record says
		"/v1/slow-record": "GET 200 req=0 res=8",
		"/v1/echo":        "POST 200 req=12 res=12",
		"/v1/stream":      "GET 200",
		"/v1/ws":          "GET 101",
		"/v1/ws-hints":    "GET 101",
		"/v1/over-h2":     "GET 200 req=0 res=8",
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(records)
		mu.Unlock()
		if n >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // a second record of any would come now
	mu.Lock()
	defer mu.Unlock()
	seen := map[string]int{}
	for _, r := range records {
		p := strings.TrimPrefix(r.URL, base)
		seen[p]++
		w, ok := want[p]
		if !ok {
			t.Errorf("a record of %s", r.URL)
			continue
		}
		if said := fmt.Sprintf("%s %d req=%d res=%d", r.Method, r.Status, r.ReqBytes, r.ResBytes); !strings.HasPrefix(said, w) || r.Verdict != policy.Allow {
			t.Errorf("record of %s: %s, verdict %s; want %s, allow", p, said, r.Verdict, w)
		}
	}
	for p := range want {
		if seen[p] != 1 {
			t.Errorf("%s recorded %d times, want once", p, seen[p])
		}
	}
}
