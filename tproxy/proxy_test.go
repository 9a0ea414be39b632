package tproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/internal/testcerts"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
	"github.com/airlockhq/airlock/policy"
)

var fakePool = netip.MustParsePrefix("198.18.0.0/15")

// fakeNames maps a few fake IPs to names, like the gate's pool.
type fakeNames map[netip.Addr]string

func (f fakeNames) Contains(a netip.Addr) bool { return fakePool.Contains(a) }
func (f fakeNames) Name(a netip.Addr) (string, bool) {
	n, ok := f[a]
	return n, ok
}

var names = fakeNames{
	netip.MustParseAddr("198.18.0.5"): "allowed.test",
	netip.MustParseAddr("198.18.0.6"): "unknown.test",
	netip.MustParseAddr("198.18.0.7"): "private.test",
	netip.MustParseAddr("198.18.0.8"): "ssh.test",
	netip.MustParseAddr("198.18.0.9"): "api.allowed.test",
}

func fake(name string) netip.Addr {
	for a, n := range names {
		if n == name {
			return a
		}
	}
	panic(name)
}

// upstream is a local HTTPS and HTTP server that stands for the internet.
type upstream struct {
	httpsPort, httpPort uint16
	caFile              string
	mu                  sync.Mutex
	seen                []string // "Host path" of each request
	uris                []string // the request target of each, as received
	seenAt              []time.Time
	forms               []string // of each whole form: method, _method, length of field "file"
	tlsSrv              *http.Server
	tlsConns            atomic.Int32 // TLS connections accepted
	tlsClosed           atomic.Int32 // TLS connections closed
}

// roots returns a pool that trusts the upstream's test CA.
func (u *upstream) roots(t testing.TB) *x509.CertPool {
	t.Helper()
	pem, err := os.ReadFile(u.caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", u.caFile)
	}
	return roots
}

func (u *upstream) handler(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Upgrade") == "websocket" {
		// Enough of a WebSocket server: switch, then echo.
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		if path.Base(r.URL.Path) == "ws-hints" { // an Early Hints before the switch
			brw.WriteString("HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
		}
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw)
		return
	}
	u.mu.Lock()
	u.seen = append(u.seen, r.Host+" "+r.URL.Path)
	u.uris = append(u.uris, r.RequestURI)
	u.seenAt = append(u.seenAt, time.Now())
	u.mu.Unlock()
	switch path.Base(r.URL.Path) {
	case "echo":
		io.Copy(w, r.Body)
		return
	case "early":
		// Answers at once without reading the body (a server refusing
		// an upload by its headers).
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		io.WriteString(w, "too large")
		return
	case "form":
		// A form's server: it acts on a form once it has all of it,
		// noting the _method it names; like Rack, it reads a POST
		// without a type as a form.
		if r.Header.Get("Content-Type") == "" {
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if strings.Contains(r.Header.Get("Content-Type"), "json") {
			// And like Laravel, it reads a JSON body's "_method".
			var v struct {
				Method string `json:"_method"`
			}
			if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Form = url.Values{"_method": {v.Method}}
		}
		err := r.ParseForm()
		if err == nil {
			if err = r.ParseMultipartForm(1 << 20); errors.Is(err, http.ErrNotMultipart) {
				err = nil
			}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var file int64
		if r.MultipartForm != nil && len(r.MultipartForm.File["file"]) > 0 {
			file = r.MultipartForm.File["file"][0].Size
		}
		u.mu.Lock()
		u.forms = append(u.forms, fmt.Sprintf("%s %q %d", r.Method, r.FormValue("_method"), file))
		u.mu.Unlock()
		io.WriteString(w, "done")
		return
	case "expect":
		// Says what Expect it was sent.
		io.WriteString(w, r.Header.Get("Expect"))
		return
	case "close":
		w.Header().Set("Connection", "close")
	case "events", "ndjson":
		// A first event at once, the rest 5 s later: a proxy that held
		// the first back would deliver it late.
		if path.Base(r.URL.Path) == "events" {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/x-ndjson")
		}
		io.WriteString(w, "data: first\n\n")
		http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
		io.WriteString(w, "data: last\n\n")
		return
	case "stream":
		// Until the client goes away.
		for r.Context().Err() == nil {
			if _, err := w.Write(make([]byte, 64<<10)); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
		}
		return
	}
	fmt.Fprint(w, "internet")
}

func (u *upstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

func startUpstream(t *testing.T) *upstream {
	ca, leaf, err := testcerts.New([]string{"allowed.test", "unknown.test", "other.test", "api.allowed.test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{caFile: filepath.Join(t.TempDir(), "ca.pem")}
	os.WriteFile(u.caFile, ca, 0o644)
	tl, _ := net.Listen("tcp4", "127.0.0.1:0")
	pl, _ := net.Listen("tcp4", "127.0.0.1:0")
	u.httpsPort = uint16(tl.Addr().(*net.TCPAddr).Port)
	u.httpPort = uint16(pl.Addr().(*net.TCPAddr).Port)
	s1 := &http.Server{Handler: http.HandlerFunc(u.handler), TLSConfig: &tls.Config{Certificates: []tls.Certificate{leaf}}, ErrorLog: nil,
		ConnState: func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				u.tlsConns.Add(1)
			case http.StateClosed:
				u.tlsClosed.Add(1)
			}
		}}
	u.tlsSrv = s1
	s2 := &http.Server{Handler: http.HandlerFunc(u.handler)}
	go s1.ServeTLS(tl, "", "")
	go s2.Serve(pl)
	t.Cleanup(func() { s1.Close(); s2.Close() })
	return u
}

type harness struct {
	proxy   *Proxy
	sandbox *policy.Sandbox
	broker  *policy.Broker
	up      *upstream
	mu      sync.Mutex
	records []Record
}

func (h *harness) Records() []Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Record(nil), h.records...)
}

// connect opens a connection to the proxy as a member would, with a
// deadline timeout from now; it is closed when the test ends.
func (h *harness) connect(t *testing.T, timeout time.Duration) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp4", h.proxy.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(timeout))
	return c
}

// waitPending waits until the broker holds exactly one approval, with
// waiting connections or requests waiting on it, and returns it.
func (h *harness) waitPending(t *testing.T, waiting int) policy.Pending {
	t.Helper()
	var p []policy.Pending
	if !testenv.Poll(5*time.Second, func() bool { p = h.broker.List(); return len(p) == 1 && p[0].Waiting == waiting }) {
		t.Fatalf("pending = %+v, want one approval with %d waiting", p, waiting)
	}
	return p[0]
}

// newHarness starts a proxy whose every connection claims to have been
// going to dst, with the rules of a policy file.
func newHarness(t testing.TB, up *upstream, dst netip.AddrPort, policyYAML string, tune func(*Config)) *harness {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	path := filepath.Join(t.TempDir(), "app.yaml")
	os.WriteFile(path, []byte(policyYAML), 0o644)
	sb, err := policy.OpenSandbox(policy.SandboxConfig{Name: "test", Path: path})
	if err != nil {
		t.Fatal(err)
	}
	br, _ := policy.NewBroker(policy.BrokerConfig{Sandbox: sb})
	h := &harness{sandbox: sb, broker: br, up: up}
	cfg := Config{
		Sandbox:   "test",
		Listen:    netip.MustParseAddrPort("127.0.0.1:0"),
		Policy:    sb,
		Approvals: br,
		Names:     names,
		Resolve: func(_ context.Context, name string) ([]netip.Addr, error) {
			switch name {
			case "private.test":
				return []netip.Addr{netip.MustParseAddr("10.255.0.1")}, nil
			case "metadata.test":
				return []netip.Addr{netip.MustParseAddr("169.254.169.254")}, nil
			}
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		},
		OnRecord:    func(r Record) { h.mu.Lock(); h.records = append(h.records, r); h.mu.Unlock() },
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		ApprovalURL: "http://127.0.0.1:7433/",
		OrigDst:     func(*net.TCPConn) (netip.AddrPort, error) { return dst, nil },
	}
	if tune != nil {
		tune(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	h.proxy = p
	return h
}

// fetch makes one request through the proxy as a member's client would:
// it connects to the proxy whatever the URL's host resolves to, speaks TLS
// for https (trusting caFile, or the upstream's test CA when caFile is "")
// with the URL's host as the server name, and returns the status, the
// response head as text and the body, or the error the client got. A
// "Host" in header replaces the request's Host.
func (h *harness) fetch(t *testing.T, method, rawURL, caFile string, header http.Header) (status int, head, body string, err error) {
	t.Helper()
	if caFile == "" {
		caFile = h.up.caFile
	}
	client := h.client(caFile, false)
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(method, rawURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		if strings.EqualFold(k, "Host") {
			req.Host = v[0]
			continue
		}
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	var hb strings.Builder
	fmt.Fprintf(&hb, "%s %s\n", resp.Proto, resp.Status)
	resp.Header.Write(&hb)
	return resp.StatusCode, hb.String(), string(b), err
}

// client is a member's HTTP client: it connects to the proxy whatever a
// URL's host resolves to and trusts caFile; keepAlive keeps connections
// for the next request (HTTP/1.1 then), else each request has its own and
// HTTP/2 is offered.
func (h *harness) client(caFile string, keepAlive bool) *http.Client {
	roots := x509.NewCertPool()
	if pem, err := os.ReadFile(caFile); err == nil {
		roots.AppendCertsFromPEM(pem)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp4", h.proxy.Addr().String())
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: !keepAlive,
		DisableKeepAlives: !keepAlive,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// get fetches scheme://host:port/ through the proxy and returns the body.
func (h *harness) get(t *testing.T, scheme, host string, port uint16) (string, error) {
	t.Helper()
	_, _, body, err := h.fetch(t, "GET", fmt.Sprintf("%s://%s:%d/", scheme, host, port), "", nil)
	return body, err
}

// getPath fetches https://host:port/path through the proxy, trusting
// caFile, and returns the body.
func (h *harness) getPath(t *testing.T, caFile, host string, port uint16, path string) (string, error) {
	t.Helper()
	_, _, body, err := h.fetch(t, "GET", fmt.Sprintf("https://%s:%d%s", host, port, path), caFile, nil)
	return body, err
}

// rules allows the local test server: by name and port, and its loopback
// address explicitly (the SSRF guard refuses loopback otherwise).
func rules(port uint16, names ...string) string {
	var b strings.Builder
	b.WriteString("sandbox:\n  approval_timeout: 2\n  network_allowlist:\n    user:\n")
	fmt.Fprintf(&b, "      - pattern: \"cidr:127.0.0.1/32:%d\"\n", port)
	for _, n := range names {
		fmt.Fprintf(&b, "      - pattern: \"%s\"\n", n)
	}
	return b.String()
}

func TestProxyAllowedIsSpliced(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, up, netip.AddrPortFrom(fake("allowed.test"), up.httpsPort), rules(up.httpsPort, fmt.Sprintf("allowed.test:%d", up.httpsPort)), nil)
	// A client that reads to the end and closes without a close_notify of
	// its own: either end that closes with the other's last bytes unread
	// resets the connection, and the record would rightly say so (Go's
	// server sends close_notify, waits, then closes, so a client's
	// close_notify is still unread there).
	raw := h.connect(t, 10*time.Second)
	c := tls.Client(raw, &tls.Config{ServerName: "allowed.test", RootCAs: up.roots(t), NextProtos: []string{"http/1.1"}})
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: allowed.test:%d\r\nConnection: close\r\n\r\n", up.httpsPort)
	out, err := io.ReadAll(c)
	raw.Close()
	if err != nil || !strings.HasPrefix(string(out), "HTTP/1.1 200 ") || !strings.HasSuffix(string(out), "\r\n\r\ninternet") {
		t.Fatalf("get: %v %q", err, out)
	}
	waitRecords(t, h, 1) // written when the connection ends
	r := h.Records()
	if len(r) != 1 || r[0].Verdict != policy.Allow || r[0].Rule != fmt.Sprintf("allowed.test:%d", up.httpsPort) ||
		r[0].Host != "allowed.test" || !r[0].Fake || r[0].Up == 0 || r[0].Down == 0 || r[0].Close != "closed" {
		t.Errorf("record = %+v", r)
	}
}

func TestProxyHTTPDenied403(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, up, netip.AddrPortFrom(fake("allowed.test"), up.httpPort), "sandbox:\n  unknown_action: deny\n  network_denylist:\n    - pattern: allowed.test\n", nil)
	_, head, body, err := h.fetch(t, "GET", fmt.Sprintf("http://allowed.test:%d/", up.httpPort), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	out := head + "\n" + body
	for _, want := range []string{"403 Forbidden", "airlock blocked this request", "sandbox: test", "host:    allowed.test", "http://127.0.0.1:7433/", "unknown_action"} {
		if !strings.Contains(out, want) {
			t.Errorf("403 page lacks %q:\n%s", want, out)
		}
	}
	if len(up.requests()) != 0 {
		t.Errorf("denied request reached the upstream: %v", up.requests())
	}
}

func TestProxySNIMustMatchName(t *testing.T) {
	up := startUpstream(t)
	// The client resolved allowed.test but sends SNI other.test.
	h := newHarness(t, up, netip.AddrPortFrom(fake("allowed.test"), up.httpsPort), rules(up.httpsPort, fmt.Sprintf("allowed.test:%d", up.httpsPort), fmt.Sprintf("other.test:%d", up.httpsPort)), nil)
	if out, err := h.get(t, "https", "other.test", up.httpsPort); err == nil {
		t.Fatalf("fronted connection succeeded: %q", out)
	}
	waitRecords(t, h, 1)
	if r := h.Records(); len(r) != 1 || r[0].Verdict != policy.Deny || !strings.Contains(r[0].Reason, "resolved for allowed.test but asks for other.test") {
		t.Errorf("record = %+v", r)
	}
}

func TestProxyAskAllowOnceReleasesFast(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, up, netip.AddrPortFrom(fake("unknown.test"), up.httpsPort), rules(up.httpsPort), nil)
	// Three parallel connections share one pending approval.
	type res struct {
		out string
		err error
	}
	done := make(chan res, 3)
	for i := 0; i < 3; i++ {
		go func() { o, e := h.get(t, "https", "unknown.test", up.httpsPort); done <- res{o, e} }()
	}
	if p := h.waitPending(t, 3); p.Host != "unknown.test" || p.Port != up.httpsPort {
		t.Errorf("pending = %+v", p)
	}
	decided := time.Now()
	// Allow once lets one connection through; the others are asked about
	// again, one approval each time.
	for waiting := 3; waiting > 0; waiting-- {
		q := h.waitPending(t, waiting)
		if _, err := h.broker.Decide(q.ID, policy.Choice{Action: policy.ResolveAllowOnce}); err != nil {
			t.Fatal(err)
		}
		if r := <-done; r.err != nil || r.out != "internet" {
			t.Errorf("held connection after allow once: %v %q", r.err, r.out)
		}
		select {
		case r := <-done:
			t.Errorf("a second connection went through on one allow once: %v %q", r.err, r.out)
		case <-time.After(50 * time.Millisecond):
		}
	}
	up.mu.Lock()
	first := up.seenAt[0]
	up.mu.Unlock()
	if d := first.Sub(decided); d > 100*time.Millisecond {
		t.Errorf("first request reached the upstream %v after the decision, want < 100ms", d)
	}
	// Allow once adds no rule: the next connection is held again.
	if rs := h.sandbox.Rules(); len(rs) != 1 {
		t.Errorf("rules after allow once: %v", rs)
	}
}

func TestProxyAskDenyAndTimeout(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, up, netip.AddrPortFrom(fake("unknown.test"), up.httpPort), rules(up.httpPort), nil)
	done := make(chan string, 1)
	go func() { o, _ := h.get(t, "http", "unknown.test", up.httpPort); done <- o }()
	h.broker.Decide(h.waitPending(t, 1).ID, policy.Choice{Action: policy.ResolveDeny})
	if out := <-done; !strings.Contains(out, "denied by a person") {
		t.Errorf("denied held request got %q", out)
	}
	start := time.Now()
	out, _ := h.get(t, "http", "unknown.test", up.httpPort)
	if !strings.Contains(out, "no decision within 2s") || time.Since(start) < 1500*time.Millisecond {
		t.Errorf("after %v: %q; want a 403 after the 2 s approval timeout", time.Since(start), out)
	}
	if len(up.requests()) != 0 {
		t.Errorf("upstream saw %v", up.requests())
	}
}

func TestProxySSRFGuard(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, up, netip.AddrPortFrom(fake("private.test"), 80), "sandbox:\n  network_allowlist:\n    user:\n      - pattern: private.test\n", nil)
	out, err := h.get(t, "http", "private.test", 80)
	if err != nil || !strings.Contains(out, "airlock blocked") || !strings.Contains(out, "SSRF guard refuses: 10.255.0.1 (private network)") {
		t.Errorf("private.test: %v %q", err, out)
	}
}

func TestProxyRawIP(t *testing.T) {
	up := startUpstream(t)
	// A raw IP without a name: denied unless a cidr rule allows it.
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), up.httpPort)
	h := newHarness(t, up, dst, "sandbox:\n  unknown_action: allow\n", nil)
	out, _ := h.get(t, "http", "127.0.0.1", up.httpPort)
	if !strings.Contains(out, "raw IP destination") {
		t.Errorf("raw IP with unknown_action allow: %q", out)
	}
	h2 := newHarness(t, up, dst, rules(up.httpPort), nil)
	if out, err := h2.get(t, "http", "127.0.0.1", up.httpPort); err != nil || out != "internet" {
		t.Errorf("raw IP with a cidr rule: %v %q", err, out)
	}
}

func TestProxyServerSpeaksFirst(t *testing.T) {
	ln, _ := net.Listen("tcp4", "127.0.0.1:0")
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Write([]byte("SSH-2.0-test\r\n"))
			io.Copy(c, c)
			c.Close()
		}
	}()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	h := newHarness(t, &upstream{}, netip.AddrPortFrom(fake("ssh.test"), port), rules(port, fmt.Sprintf("ssh.test:%d", port)), nil)
	c := h.connect(t, 5*time.Second)
	banner := make([]byte, 14)
	if _, err := io.ReadFull(c, banner); err != nil || string(banner) != "SSH-2.0-test\r\n" {
		t.Fatalf("banner %q %v", banner, err)
	}
	// A line: a lone word could still become an HTTP request line, which
	// the proxy must read before anything goes upstream.
	c.Write([]byte("echo\r\n"))
	got := make([]byte, 6)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "echo\r\n" {
		t.Errorf("echo %q %v", got, err)
	}
}

func TestProxyBadClients(t *testing.T) {
	up := startUpstream(t)
	dst := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.10"), up.httpsPort) // raw IP: the proxy must peek
	h := newHarness(t, up, dst, rules(up.httpsPort, fmt.Sprintf("allowed.test:%d", up.httpsPort)), func(c *Config) {
		c.PeekTimeout = 300 * time.Millisecond
	})
	hello := clientHello(t, "allowed.test")
	tests := []struct {
		name string
		send func(c net.Conn)
	}{
		{"half a ClientHello", func(c net.Conn) { c.Write(hello[:len(hello)/2]) }},
		{"64 KiB of garbage", func(c net.Conn) { c.Write(bytes.Repeat([]byte{0x16, 0x03, 0x01, 0xff}, 16<<10)) }},
		{"random garbage", func(c net.Conn) { c.Write(bytes.Repeat([]byte("\x00garbage"), 8<<10)) }},
		{"silence", func(c net.Conn) {}},
		{"slowloris", func(c net.Conn) {
			for _, b := range []byte("GET / HTTP/1.1\r\nHost: allowed.test\r\nX-Slow: yes") {
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
				time.Sleep(30 * time.Millisecond) // not a wait: the slowloris sends a byte at a time
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp4", h.proxy.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			go tt.send(c)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			io.Copy(io.Discard, c) // returns when the proxy closes
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("closed after %v, want within about the 300ms peek timeout (+300ms after first bytes)", d)
			}
		})
	}
	if len(up.requests()) != 0 {
		t.Errorf("bad clients reached the upstream: %v", up.requests())
	}
	// Still serving: a proper client gets through.
	if out, err := h.get(t, "https", "allowed.test", up.httpsPort); err != nil || out != "internet" {
		t.Errorf("after the bad clients: %v %q", err, out)
	}
}

func TestProxyIdleTimeoutAndDrain(t *testing.T) {
	ln, _ := net.Listen("tcp4", "127.0.0.1:0")
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	h := newHarness(t, &upstream{}, netip.AddrPortFrom(fake("ssh.test"), port), rules(port, fmt.Sprintf("ssh.test:%d", port)), func(c *Config) {
		c.IdleTimeout = 200 * time.Millisecond
		c.SniffTimeout = 10 * time.Millisecond
	})
	c, _ := net.Dial("tcp4", h.proxy.Addr().String())
	defer c.Close()
	// A first message that is neither TLS nor HTTP. (A lone "x" could
	// start an HTTP method, and the proxy would rightly wait for the rest
	// of the head before letting it through.)
	c.Write([]byte("SSH-2.0-client\r\n"))
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.Copy(io.Discard, c)
	if d := time.Since(start); d < 150*time.Millisecond || d > 2*time.Second {
		t.Errorf("idle connection closed after %v, want about 200ms", d)
	}
	// Close drains: an active connection is cut after DrainTimeout.
	h.proxy.cfg.DrainTimeout = 100 * time.Millisecond
	c2, _ := net.Dial("tcp4", h.proxy.Addr().String())
	defer c2.Close()
	c2.Write([]byte("SSH-2.0-client\r\n"))
	testenv.WaitFor(t, 5*time.Second, "the proxy to take the connection", func() bool { return h.proxy.Active() > 0 })
	start = time.Now()
	h.proxy.Close()
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
}

func TestProxyLogAllowed(t *testing.T) {
	for _, tt := range []struct {
		logAllowed bool
		verdict    policy.Verdict
		want       slog.Level
	}{
		{false, policy.Allow, slog.LevelDebug},
		{true, policy.Allow, slog.LevelInfo},
		{false, policy.Deny, slog.LevelInfo},
		{true, policy.Deny, slog.LevelInfo},
	} {
		p := &Proxy{cfg: Config{LogAllowed: tt.logAllowed}}
		if got := p.level(tt.verdict); got != tt.want {
			t.Errorf("LogAllowed %v, verdict %s: level %v, want %v", tt.logAllowed, tt.verdict, got, tt.want)
		}
	}
}

// TestProxyRefusesWhatItCannotRecord: while Recording reports that records
// are not kept, a new connection is reset before anything of it reaches
// the upstream, and an intercepted request on a connection made before is
// answered 503 without being forwarded, in plain words that name no path
// on the host; once records are kept again both go through.
func TestProxyRefusesWhatItCannotRecord(t *testing.T) {
	up := startUpstream(t)
	var failing atomic.Bool
	var requestRecords atomic.Int32
	var logs *testworld.SyncBuffer // the running subtest's proxy's
	recording := func(c *Config) {
		c.Recording = func() error {
			if failing.Load() {
				return fmt.Errorf("write /var/lib/airlock/audit/test/current.jsonl: no space left on device")
			}
			return nil
		}
		logs = &testworld.SyncBuffer{}
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
		c.OnRequest = func(RequestRecord) { requestRecords.Add(1) }
	}
	// What is refused so has no record of its own (a member's refusals
	// would take the room of records that wait for the file); once records
	// are kept again, the log counts them, once.
	const said = "connections and requests were refused, unrecorded, while records could not be written"
	counted := func(t *testing.T, want ...int) {
		t.Helper()
		var got []int
		for _, l := range strings.Split(logs.String(), "\n") {
			if _, n, ok := strings.Cut(l, " refused="); ok && strings.Contains(l, said) {
				c, _ := strconv.Atoi(n)
				got = append(got, c)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("refusals counted in the log: %v, want %v:\n%s", got, want, logs.String())
		}
	}
	t.Run("spliced", func(t *testing.T) {
		h := newHarness(t, up, netip.AddrPortFrom(fake("allowed.test"), up.httpsPort), rules(up.httpsPort, fmt.Sprintf("allowed.test:%d", up.httpsPort)), recording)
		failing.Store(true)
		defer failing.Store(false)
		before := len(up.requests())
		if body, err := h.get(t, "https", "allowed.test", up.httpsPort); err == nil {
			t.Fatalf("fetched %q while records could not be written", body)
		}
		if got := len(up.requests()); got != before {
			t.Errorf("the upstream got %d requests while records could not be written", got-before)
		}
		failing.Store(false)
		if body, err := h.get(t, "https", "allowed.test", up.httpsPort); err != nil || body != "internet" {
			t.Errorf("once recording again: %v %q", err, body)
		}
		waitRecords(t, h, 1)
		if rs := h.Records(); len(rs) != 1 || rs[0].Verdict != policy.Allow {
			t.Errorf("records: %+v, want only the connection once recording again", rs)
		}
		counted(t, 1)
	})
	t.Run("counted at close", func(t *testing.T) {
		// Refused, and the proxy closes before anything else comes: the
		// count is logged all the same.
		h := newHarness(t, up, netip.AddrPortFrom(fake("allowed.test"), up.httpsPort), rules(up.httpsPort, fmt.Sprintf("allowed.test:%d", up.httpsPort)), recording)
		failing.Store(true)
		defer failing.Store(false)
		if body, err := h.get(t, "https", "allowed.test", up.httpsPort); err == nil {
			t.Fatalf("fetched %q while records could not be written", body)
		}
		h.proxy.Close()
		counted(t, 1)
	})
	t.Run("intercepted", func(t *testing.T) {
		port := up.httpsPort
		h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), port),
			rules(port, fmt.Sprintf("api.allowed.test:%d/v1/*", port)), recording)
		// One connection, kept alive: made while records are kept, asked
		// on while they are not.
		client := h.client(ca.CertFile(), true)
		defer client.CloseIdleConnections()
		url := fmt.Sprintf("https://api.allowed.test:%d/v1/x", port)
		get := func() (int, string) {
			resp, err := client.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if code, body := get(); code != 200 || body != "internet" {
			t.Fatalf("before: %d %q", code, body)
		}
		before := len(up.requests())
		failing.Store(true)
		code, body := get()
		failing.Store(false)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "cannot write its audit records") || strings.Contains(body, "/var/lib") {
			t.Errorf("while not recording: %d %q", code, body)
		}
		if got := len(up.requests()); got != before {
			t.Errorf("the upstream got %d requests while records could not be written", got-before)
		}
		if code, body := get(); code != 200 || body != "internet" {
			t.Errorf("after: %d %q", code, body)
		}
		// (A request is recorded once its answer has left.)
		if !testenv.Poll(5*time.Second, func() bool { return requestRecords.Load() >= 2 }) || requestRecords.Load() != 2 {
			t.Errorf("%d requests recorded, want the two answered", requestRecords.Load())
		}
		counted(t, 1)
		// A request held for a person while records stop is not
		// forwarded when the person allows it.
		done := make(chan int, 1)
		go func() {
			resp, err := client.Get(fmt.Sprintf("https://api.allowed.test:%d/v2/x", port))
			if err != nil {
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		pend := h.waitPending(t, 1)
		before = len(up.requests())
		failing.Store(true)
		if _, err := h.broker.Decide(pend.ID, policy.Choice{Action: policy.ResolveAllowOnce}); err != nil {
			t.Fatal(err)
		}
		code = <-done
		failing.Store(false)
		if code != http.StatusServiceUnavailable || len(up.requests()) != before {
			t.Errorf("held request allowed while not recording: %d, %d requests upstream", code, len(up.requests())-before)
		}
		if code, body := get(); code != 200 || body != "internet" {
			t.Errorf("after the held one: %d %q", code, body)
		}
		if !testenv.Poll(5*time.Second, func() bool { return requestRecords.Load() >= 3 }) || requestRecords.Load() != 3 {
			t.Errorf("%d requests recorded, want the three answered", requestRecords.Load())
		}
		counted(t, 1, 1)
	})
	t.Run("member API, kept alive", func(t *testing.T) {
		api := &memberAPI{}
		policyYAML := "sandbox:\n  network_allowlist:\n    user:\n      - pattern: airlock.internal\n"
		h := newHarness(t, up, netip.MustParseAddrPort("127.0.0.1:80"), policyYAML, func(c *Config) {
			recording(c)
			c.MemberAPI = api
		})
		client := h.client("", true)
		defer client.CloseIdleConnections()
		var conns atomic.Int32
		client.Transport.(*http.Transport).DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			conns.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, "tcp4", h.proxy.Addr().String())
		}
		get := func() (int, string, string) {
			resp, err := client.Get("http://airlock.internal/v1/requests/x")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, resp.Header.Get("X-Airlock-Verdict"), string(b)
		}
		if code, _, body := get(); code != 200 || !strings.Contains(body, "member api") {
			t.Fatalf("before: %d %q", code, body)
		}
		failing.Store(true)
		code, verdict, body := get()
		failing.Store(false)
		if code != http.StatusServiceUnavailable || verdict != "unrecorded" || !strings.Contains(body, "cannot write its audit records") || strings.Contains(body, "/var/lib") {
			t.Errorf("while not recording, on a connection kept alive: %d %s %q", code, verdict, body)
		}
		if n := conns.Load(); n != 1 {
			t.Errorf("%d connections, want the refused request on the one kept alive", n)
		}
		if n := api.calls.Load(); n != 1 {
			t.Errorf("the member API served %d requests, want only the one before", n)
		}
		if code, _, body := get(); code != 200 || !strings.Contains(body, "member api") {
			t.Errorf("after: %d %q", code, body)
		}
		counted(t, 1)
	})
}
