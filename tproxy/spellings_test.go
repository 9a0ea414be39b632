package tproxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testcerts"
	"github.com/airlockhq/airlock/policy"
)

// recordingUpstream is a TLS server for api.allowed.test that keeps the raw bytes
// of each connection and answers every request head with 200 "ok", reading
// a chunked or Content-Length body first.
type recordingUpstream struct {
	*upstream
	mu  sync.Mutex
	raw []*bytes.Buffer
}

func startRecordingUpstream(t *testing.T) *recordingUpstream {
	ca, leaf, err := testcerts.New([]string{"api.allowed.test", "allowed.test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	u := &recordingUpstream{upstream: &upstream{caFile: filepath.Join(t.TempDir(), "ca.pem")}}
	os.WriteFile(u.caFile, ca, 0o644)
	l, _ := tls.Listen("tcp4", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{leaf}, NextProtos: []string{"http/1.1"}})
	u.httpsPort = uint16(l.Addr().(*net.TCPAddr).Port)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			buf := &bytes.Buffer{}
			u.mu.Lock()
			u.raw = append(u.raw, buf)
			u.mu.Unlock()
			go func() {
				defer c.Close()
				br := bufio.NewReader(io.TeeReader(c, lockedWriter{&u.mu, buf}))
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			}()
		}
	}()
	return u
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (u *recordingUpstream) all() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var s strings.Builder
	for _, b := range u.raw {
		s.Write(b.Bytes())
	}
	return s.String()
}

// exchangeRaw opens an intercepted HTTP/1.1 connection, writes req as it
// is, and returns the status line of the answer.
func exchangeRaw(t *testing.T, h *harness, roots *x509.CertPool, req string) string {
	t.Helper()
	c, err := tls.Dial("tcp4", h.proxy.Addr().String(), &tls.Config{ServerName: "api.allowed.test", RootCAs: roots, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, req)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "error: " + err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, strings.SplitN(string(b), "\n", 2)[0])
}

func recordingHarness(t *testing.T, policyYAML func(port uint16) string) (*recordingUpstream, *harness, *x509.CertPool) {
	up := startRecordingUpstream(t)
	h, ca := newBumpHarness(t, up.upstream, netip.AddrPortFrom(fake("api.allowed.test"), up.httpsPort), policyYAML(up.httpsPort))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	return up, h, roots
}

// allowDenyPolicy: unknown_action deny, the host allowed as the extra rules say,
// with deny rules.
func allowDenyPolicy(allow []string, deny []string) func(uint16) string {
	return func(port uint16) string {
		var b strings.Builder
		fmt.Fprintf(&b, "sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user:\n      - pattern: \"cidr:127.0.0.1/32:%d\"\n", port)
		for _, a := range allow {
			fmt.Fprintf(&b, "      - pattern: \"%s\"\n", fmt.Sprintf(a, port))
		}
		if len(deny) > 0 {
			b.WriteString("  network_denylist:\n")
			for _, d := range deny {
				fmt.Fprintf(&b, "    - pattern: \"%s\"\n", fmt.Sprintf(d, port))
			}
		}
		return b.String()
	}
}

// reachedUpstream sends req and reports whether its request line reached the
// upstream, with airlock's answer.
func reachedUpstream(t *testing.T, up *recordingUpstream, h *harness, roots *x509.CertPool, method, target, extra string) (bool, string) {
	t.Helper()
	a := fmt.Sprintf("api.allowed.test:%d", up.httpsPort)
	status := exchangeRaw(t, h, roots, method+" "+target+" HTTP/1.1\r\nHost: "+a+"\r\n"+extra+"Connection: close\r\n\r\n")
	time.Sleep(50 * time.Millisecond)
	return strings.Contains(up.all(), method+" "+target+" HTTP/1.1\r\n"), status
}

// TestDenyPathAnyCaseAndEscapes: a deny rule's path is compared in any case
// (IIS and Express serve /admin and /ADMIN alike), whatever case it is
// written in, and in the canonical form requests are decided in (a
// "%7E" in the rule stands for "~").
func TestDenyPathAnyCaseAndEscapes(t *testing.T) {
	up, h, roots := recordingHarness(t, allowDenyPolicy(
		[]string{"api.allowed.test:%d"},
		[]string{"api.allowed.test:%d/Admin/*", "api.allowed.test:%d/%%7Euser/*"}))
	if ok, st := reachedUpstream(t, up, h, roots, "GET", "/Admin/x", ""); ok {
		t.Fatalf("control: /Admin/x reached the upstream (%s)", st)
	}
	for _, target := range []string{"/admin/x", "/ADMIN/x", "/~user/secret", "/%7Euser/secret"} {
		if ok, st := reachedUpstream(t, up, h, roots, "GET", target, ""); ok {
			t.Errorf("GET %s reached the upstream past a deny rule (%s); a case-insensitive server serves it as the denied path", target, st)
		}
	}
}

// TestDenyExactPathOtherSpellings: a deny rule for an exact path also
// denies the spellings upstreams route to the same handler: a trailing
// slash (Express, Rails, Spring 5), a format suffix (Rails), a trailing dot
// and an NTFS stream (IIS).
func TestDenyExactPathOtherSpellings(t *testing.T) {
	up, h, roots := recordingHarness(t, allowDenyPolicy(
		[]string{"api.allowed.test:%d"},
		[]string{"api.allowed.test:%d/v1/admin"}))
	if ok, st := reachedUpstream(t, up, h, roots, "GET", "/v1/admin", ""); ok {
		t.Fatalf("control: /v1/admin reached the upstream (%s)", st)
	}
	for _, target := range []string{"/v1/admin/", "/v1/admin.json", "/v1/admin.", "/v1/admin::$DATA"} {
		if ok, st := reachedUpstream(t, up, h, roots, "GET", target, ""); ok {
			t.Errorf("GET %s reached the upstream past deny \"/v1/admin\" (%s)", target, st)
		}
	}
}

// TestDenyGetDeniesHead: a deny rule for GET denies HEAD, which Go's
// ServeMux, Express, Rails, Flask and Django serve with the GET handler.
func TestDenyGetDeniesHead(t *testing.T) {
	up, h, roots := recordingHarness(t, allowDenyPolicy(
		[]string{"api.allowed.test:%d"},
		[]string{"GET api.allowed.test:%d/v1/trigger/*"}))
	if ok, st := reachedUpstream(t, up, h, roots, "GET", "/v1/trigger/x", ""); ok {
		t.Fatalf("control: GET reached the upstream (%s)", st)
	}
	if ok, st := reachedUpstream(t, up, h, roots, "HEAD", "/v1/trigger/x", ""); ok {
		t.Errorf("HEAD /v1/trigger/x reached the upstream past deny GET (%s)", st)
	}
}

// TestPathOverrideHeadersDropped: headers that make a server route to
// another path than the request's (X-Original-URL, X-Rewrite-URL: IIS URL
// Rewrite, Symfony before 3.4.14, Zend/Laminas) never reach the upstream,
// in any spelling.
func TestPathOverrideHeadersDropped(t *testing.T) {
	up, h, roots := recordingHarness(t, allowDenyPolicy([]string{"GET api.allowed.test:%d/v1/*"}, nil))
	ok, st := reachedUpstream(t, up, h, roots, "GET", "/v1/x", "X-Original-URL: /admin/delete-all\r\nX-Rewrite-URL: /admin/delete-all\r\n"+
		"x_original_url: /admin/delete-all\r\nX-ORIGINAL-URI: /admin/delete-all\r\nX-Forwarded-Prefix: /admin\r\n"+
		"X-Script-Name: /admin\r\nx_script_name: /admin\r\n")
	if !ok {
		t.Fatalf("GET /v1/x did not reach the upstream (%s)", st)
	}
	if all := up.all(); strings.Contains(strings.ToLower(all), "/admin") {
		t.Errorf("GET /v1/x went upstream with a path override:\n%s", all)
	}
}

// TestWebDAVDestinationDecided: a COPY or MOVE acts on the path its
// Destination header names too: it must be on the connection's host, read
// as request targets are, and allowed by a rule.
func TestWebDAVDestinationDecided(t *testing.T) {
	up, h, roots := recordingHarness(t, allowDenyPolicy([]string{"api.allowed.test:%d"}, []string{"api.allowed.test:%d/admin/*"}))
	a := fmt.Sprintf("api.allowed.test:%d", up.httpsPort)
	for i, c := range []struct {
		name, header string
		reaches      bool
	}{
		{"allowed", "Destination: /tmp/y\r\n", true},
		{"allowed, a URL on this host", "Destination: https://" + a + "/tmp/z\r\n", true},
		{"denied path", "Destination: /admin/x\r\n", false},
		{"denied path, a URL", "Destination: HTTPS://API.allowed.test:" + strconv.Itoa(int(up.httpsPort)) + "/Admin/x\r\n", false},
		{"denied path, another spelling", "Destination: /%61dmin/x\r\n", false},
		{"another host", "Destination: https://evil.test/tmp/x\r\n", false},
		{"userinfo", "Destination: https://" + a + "@evil.test/tmp/x\r\n", false},
		{"ambiguous", "Destination: /tmp/../admin/x\r\n", false},
		{"relative", "Destination: admin/x\r\n", false},
		{"two", "Destination: /tmp/y\r\nDestination: /admin/x\r\n", false},
		{"CGI spelling", "Destination: /tmp/y\r\ndestination_: /x\r\nDESTINATION: /admin/x\r\n", false},
	} {
		src := "/src/" + strconv.Itoa(i)
		ok, st := reachedUpstream(t, up, h, roots, "MOVE", src, c.header)
		if ok != c.reaches {
			t.Errorf("%s: MOVE with %q reached the upstream: %v (%s), want %v", c.name, c.header, ok, st, c.reaches)
		}
	}
}

// TestOverlongUTF8Refused: overlong UTF-8 forms of "." and "/" (%C0%AE,
// %C0%AF, %E0%80%AE), which lenient decoders read as /v1/../admin, are
// refused as %2E and %2F are.
func TestOverlongUTF8Refused(t *testing.T) {
	up, h, roots := recordingHarness(t, allowDenyPolicy([]string{"GET api.allowed.test:%d/v1/*"}, nil))
	for _, target := range []string{"/v1/%C0%AE%C0%AE%C0%AFadmin", "/v1/%E0%80%AE%E0%80%AE/admin"} {
		if ok, st := reachedUpstream(t, up, h, roots, "GET", target, ""); ok {
			t.Errorf("GET %s reached the upstream (%s); an overlong '.'/'/' should be refused as %%2E/%%2F are", target, st)
		}
	}
}

// TestSalesforceHTTPMethodQueryDecided: Salesforce's REST API acts on
// "?_HttpMethod=DELETE" on a POST; it is decided as _method is.
func TestSalesforceHTTPMethodQueryDecided(t *testing.T) {
	up, h, roots := recordingHarness(t, allowDenyPolicy([]string{"POST api.allowed.test:%d/v1/*"}, nil))
	if ok, st := reachedUpstream(t, up, h, roots, "POST", "/v1/sobjects/Account/1?_HttpMethod=DELETE", "Content-Length: 0\r\n"); ok {
		t.Errorf("POST ?_HttpMethod=DELETE reached the upstream (%s); no rule allows DELETE", st)
	}
}

// TestHeldOverrideIsAskedAsItsMethod: a request whose method override is
// what no rule decides (GET allowed, the DELETE it names unknown; in a
// header, or in the query as Laravel and Symfony read "_method") is held
// and shown as the DELETE the server will act on. Releasing held requests
// after an unrelated rule is added does not let it go; allowing the DELETE
// shown does.
func TestHeldOverrideIsAskedAsItsMethod(t *testing.T) {
	for _, c := range []struct{ name, target, header, sent string }{
		{"header", "/v1/repo", "X-HTTP-Method-Override: DELETE\r\n", "X-Http-Method-Override: DELETE"},
		{"query", "/v1/repo?_method=DELETE", "", "?_method=DELETE"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up, h, roots := recordingHarness(t, func(port uint16) string {
				return fmt.Sprintf(`sandbox:
  unknown_action: ask
  approval_timeout: 20
  network_allowlist:
    user:
      - pattern: "cidr:127.0.0.1/32:%[1]d"
      - pattern: "GET api.allowed.test:%[1]d/v1/*"
`, port)
			})
			a := fmt.Sprintf("api.allowed.test:%d", up.httpsPort)
			done := make(chan string, 1)
			go func() {
				done <- exchangeRaw(t, h, roots, "GET "+c.target+" HTTP/1.1\r\nHost: "+a+"\r\n"+c.header+"Connection: close\r\n\r\n")
			}()
			p := h.waitPending(t, 1)
			if p.Method != "DELETE" {
				t.Errorf("the held request is shown as %q %s; the upstream will act on DELETE", p.Method, p.URL)
			}
			// A person allows something else (another approval, or a
			// rule added on the page): held requests the rules now allow
			// are released.
			if _, err := h.sandbox.Add(policy.AddRequest{Pattern: fmt.Sprintf("GET %s/v2/*", a), List: policy.Allowlist, Source: "approved during run"}); err != nil {
				t.Fatal(err)
			}
			h.broker.ReleaseAllowed()
			if got := h.broker.List(); len(got) != 1 || got[0].ID != p.ID {
				t.Fatalf("pending after an unrelated rule = %+v, want the DELETE still held", got)
			}
			if all := up.all(); strings.Contains(all, c.sent) {
				t.Fatalf("the held DELETE went upstream without anyone allowing DELETE:\n%s", all)
			}
			if _, err := h.broker.Decide(p.ID, policy.Choice{Action: policy.ResolveAllowOnce}); err != nil {
				t.Fatal(err)
			}
			if st := <-done; st != "200 ok" {
				t.Errorf("allowed once: %s, want the upstream's 200", st)
			}
			if all := up.all(); !strings.Contains(all, c.sent) {
				t.Errorf("allowed once, the upstream did not get the request:\n%s", all)
			}
		})
	}
}

// TestDestinationUnderOverride: a POST whose method override names MOVE
// has its Destination decided for MOVE too, as a plain MOVE has.
func TestDestinationUnderOverride(t *testing.T) {
	for _, c := range []struct {
		name        string
		allow, deny []string
		header      string
	}{
		{"deny MOVE into /admin, header override", []string{"api.allowed.test:%d"}, []string{"MOVE api.allowed.test:%d/admin/*"},
			"X-HTTP-Method-Override: MOVE\r\nDestination: /admin/x\r\nContent-Length: 0\r\n"},
		{"MOVE allowed in /tmp only, header override", []string{"POST api.allowed.test:%d/*", "MOVE api.allowed.test:%d/tmp/*"}, nil,
			"X-HTTP-Method-Override: MOVE\r\nDestination: /admin/x\r\nContent-Length: 0\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up, h, roots := recordingHarness(t, allowDenyPolicy(c.allow, c.deny))
			// Control: the plain MOVE is refused for its Destination.
			if ok, st := reachedUpstream(t, up, h, roots, "MOVE", "/tmp/x", "Destination: /admin/x\r\n"); ok {
				t.Fatalf("control: MOVE /tmp/x to /admin/x reached the upstream (%s)", st)
			}
			if ok, st := reachedUpstream(t, up, h, roots, "POST", "/tmp/x", c.header); ok {
				t.Errorf("POST /tmp/x with %q reached the upstream (%s); the MOVE it names to /admin/x is not allowed", c.header, st)
			}
		})
	}
}

// TestOverrideHeadersBounded: override headers name at most maxOverrides
// methods of at most maxOverride bytes, as the query and the body do: each
// method costs decisions, and a head may hold 1 MiB of them.
func TestOverrideHeadersBounded(t *testing.T) {
	list := func(n int) string {
		items := make([]string, n)
		for i := range items {
			items[i] = fmt.Sprintf("M%x", i)
		}
		return strings.Join(items, ",")
	}
	for _, c := range []struct {
		name  string
		h     http.Header
		error bool
	}{
		{"16 methods", http.Header{"X-Http-Method-Override": {list(16)}}, false},
		{"17 methods", http.Header{"X-Http-Method-Override": {list(17)}}, true},
		{"17 over two headers", http.Header{"X-Http-Method-Override": {list(9)}, "X-Http-Method": {strings.ReplaceAll(list(17), "M", "N")[len(list(9))+1:]}}, true},
		{"10,000 methods", http.Header{"X_http_method_override": {list(10000)}}, true},
		{"repeats count once", http.Header{"X-Method-Override": {strings.Repeat("DELETE,", 1000)}}, false},
		{"a method of 65 bytes", http.Header{"X-Http-Method": {strings.Repeat("D", 65)}}, true},
	} {
		if _, err := overrideMethods(c.h); (err != nil) != c.error {
			t.Errorf("%s: %v, want an error: %v", c.name, err, c.error)
		}
	}
	up, h, roots := recordingHarness(t, allowDenyPolicy([]string{"api.allowed.test:%d/v1/*"}, nil))
	if ok, st := reachedUpstream(t, up, h, roots, "POST", "/v1/x", "X-HTTP-Method-Override: "+list(1000)+"\r\nContent-Length: 0\r\n"); ok || !strings.HasPrefix(st, "403") {
		t.Errorf("1,000 override methods: reached %v (%s), want a 403", ok, st)
	}
}
