package tproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/policy"
)

// Attacks found in review; each must fail.

// A client of an allowed name's fake IP that stays silent past the sniff
// window and then sends a ClientHello for another name must not reach it,
// with or without inspect: all.
func TestSilentClientCannotFrontLater(t *testing.T) {
	for _, inspectAll := range []bool{false, true} {
		t.Run(fmt.Sprint("inspectAll=", inspectAll), func(t *testing.T) {
			up := startUpstream(t)
			port := up.httpsPort
			h, _ := newBumpHarness(t, up, netip.AddrPortFrom(fake("allowed.test"), port),
				rules(port, fmt.Sprintf("allowed.test:%d", port), fmt.Sprintf("other.test:%d", port)),
				func(c *Config) { c.InspectAll = func() bool { return inspectAll } })
			c := silentClient(t, h, up, "other.test")
			if err := c.Handshake(); err == nil {
				fmt.Fprintf(c, "GET /secret HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n")
				io.Copy(io.Discard, c)
			}
			c.Close()
			waitRecords(t, h, 1) // the proxy is done with the connection
			if got := up.requests(); len(got) != 0 {
				t.Errorf("the fronted request reached the upstream: %v", got)
			}
		})
	}
}

// A late but honest ClientHello (same name) still works when nothing
// requires interception: a client may be slow.
func TestSilentClientWithTheRightNameIsCarried(t *testing.T) {
	up := startUpstream(t)
	port := up.httpsPort
	h, _ := newBumpHarness(t, up, netip.AddrPortFrom(fake("allowed.test"), port), rules(port, fmt.Sprintf("allowed.test:%d", port)))
	c := silentClient(t, h, up, "allowed.test")
	if err := c.Handshake(); err != nil {
		t.Fatalf("late honest handshake: %v", err)
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
	st, _ := bufio.NewReader(c).ReadString('\n')
	if !strings.Contains(st, "200") {
		t.Errorf("status %q", st)
	}
}

// silentClient connects to the proxy and stays silent until the proxy has
// given up on its first bytes (the sniff window is over) and dialled the
// upstream to splice it; it returns a TLS client for serverName on the
// connection, trusting the upstream, that has not sent its ClientHello yet.
func silentClient(t *testing.T, h *harness, up *upstream, serverName string) *tls.Conn {
	t.Helper()
	raw := h.connect(t, 5*time.Second)
	testenv.WaitFor(t, 5*time.Second, "the proxy to end the sniff window and dial the upstream", func() bool { return up.tlsConns.Load() == 1 })
	return tls.Client(raw, &tls.Config{ServerName: serverName, RootCAs: up.roots(t), NextProtos: []string{"http/1.1"}})
}

// Plain HTTP is checked request by request: a second request on a kept-alive
// connection cannot name another host.
func TestPlainHTTPKeepAliveCannotSwitchHost(t *testing.T) {
	up := startUpstream(t)
	port := up.httpPort
	h := newHarness(t, up, netip.AddrPortFrom(fake("allowed.test"), port), rules(port, fmt.Sprintf("allowed.test:%d", port)), nil)
	c := h.connect(t, 5*time.Second)
	r := bufio.NewReader(c)
	fmt.Fprintf(c, "GET /one HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n", port)
	resp, err := readStatus(r)
	if err != nil || resp != 200 {
		t.Fatalf("first request: %d %v", resp, err)
	}
	fmt.Fprintf(c, "GET /two HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	if resp, _ := readStatus(r); resp != 403 {
		t.Errorf("second request with another Host: %d, want 403", resp)
	}
	for _, s := range up.requests() {
		if strings.Contains(s, "evil") {
			t.Errorf("the upstream saw %q", s)
		}
	}
}

// An h2c upgrade must not open a tunnel past path and method rules.
func TestNonWebSocketUpgradeIsNotATunnel(t *testing.T) {
	up := startUpstream(t)
	port := up.httpsPort
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), port), rules(port, fmt.Sprintf("api.allowed.test:%d/v1/*", port)))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	c, err := tls.Dial("tcp4", h.proxy.Addr().String(), &tls.Config{ServerName: "api.allowed.test", RootCAs: roots, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /v1/x HTTP/1.1\r\nHost: api.allowed.test:%d\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n", port)
	if st, _ := readStatus(bufio.NewReader(c)); st == 101 {
		t.Errorf("an h2c upgrade was switched: a tunnel past the rules")
	}
}

// A method override is decided like the method it names.
func TestMethodOverrideIsDecided(t *testing.T) {
	up := startUpstream(t)
	port := up.httpsPort
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), port),
		rules(port, fmt.Sprintf("api.allowed.test:%d", port))+fmt.Sprintf("  network_denylist:\n    - pattern: \"DELETE api.allowed.test:%d\"\n", port))
	status, _, _, err := h.fetch(t, "POST", fmt.Sprintf("https://api.allowed.test:%d/v1/x", port), ca.CertFile(), http.Header{"X-Http-Method-Override": {"DELETE"}})
	if err != nil || status != 403 {
		t.Errorf("POST overridden to DELETE: %d %v, want 403", status, err)
	}
	// Servers differ on which of several values they take: every one is
	// decided, not only the first.
	status, _, _, err = h.fetch(t, "POST", fmt.Sprintf("https://api.allowed.test:%d/v1/x", port), ca.CertFile(), http.Header{"X-Http-Method-Override": {"POST", "DELETE"}})
	if err != nil || status != 403 {
		t.Errorf("POST with overrides POST and DELETE: %d %v, want 403", status, err)
	}
	status, _, _, err = h.fetch(t, "POST", fmt.Sprintf("https://api.allowed.test:%d/v1/x", port), ca.CertFile(), http.Header{"X-Http-Method-Override": {"POST, DELETE"}})
	if err != nil || status != 403 {
		t.Errorf("POST with override \"POST, DELETE\": %d %v, want 403", status, err)
	}
	// Servers that read headers as CGI variables (Rack, WSGI) take "_"
	// for "-".
	for _, name := range []string{"X_Http_Method_Override", "x_http-method", "X-METHOD_OVERRIDE"} {
		status, _, _, err = h.fetch(t, "POST", fmt.Sprintf("https://api.allowed.test:%d/v1/x", port), ca.CertFile(), http.Header{name: {"DELETE"}})
		if err != nil || status != 403 {
			t.Errorf("POST with %s: DELETE: %d %v, want 403", name, status, err)
		}
	}
}

// The host's own addresses are refused like loopback.
func TestHostAddressesAreRefused(t *testing.T) {
	up := startUpstream(t)
	port := up.httpPort
	h := newHarness(t, up, netip.AddrPortFrom(fake("allowed.test"), port), "sandbox:\n  network_allowlist:\n    user:\n      - pattern: \"allowed.test:"+fmt.Sprint(port)+"\"\n", func(c *Config) {
		c.Resolve = func(_ context.Context, _ string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("203.0.113.254")}, nil
		}
		c.IsLocal = func(a netip.Addr) bool { return a == netip.MustParseAddr("203.0.113.254") }
	})
	out, _ := h.get(t, "http", "allowed.test", port)
	if !strings.Contains(out, "an address of this host") {
		t.Errorf("a name resolving to the host's own address: %q", out)
	}
}

func readStatus(r *bufio.Reader) (int, error) {
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// A "_method" parameter, in the query or in a form body, is decided like
// the method it names: a server that honours it (Rails, Laravel, Symfony)
// never gets a request it would act on as a method the rules refuse.
func TestMethodOverrideParameterIsDecided(t *testing.T) {
	up := startUpstream(t)
	port := up.httpsPort
	var mu sync.Mutex
	var recs []RequestRecord
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), port),
		rules(port, fmt.Sprintf("api.allowed.test:%d", port))+fmt.Sprintf("  network_denylist:\n    - pattern: \"DELETE api.allowed.test:%d\"\n", port),
		func(c *Config) {
			c.OnRequest = func(r RequestRecord) { mu.Lock(); recs = append(recs, r); mu.Unlock() }
		})
	url := fmt.Sprintf("https://api.allowed.test:%d/v1/form", port)
	multipart := func(method string, file int) (string, string) {
		return "multipart/form-data; boundary=XyZ", "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\n" +
			strings.Repeat("x", file) + "\r\n--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\n" + method + "\r\n--XyZ--\r\n"
	}
	for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		client := h.client(ca.CertFile(), proto == "HTTP/1.1")
		defer client.CloseIdleConnections()
		send := func(target, ctype, body string) (int, string) {
			t.Helper()
			req, _ := http.NewRequest("POST", target, strings.NewReader(body))
			if ctype != "" {
				req.Header.Set("Content-Type", ctype)
			}
			res, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s POST %s: %v", proto, target, err)
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			if res.Proto != proto {
				t.Fatalf("answered over %s, want %s", res.Proto, proto)
			}
			return res.StatusCode, string(b)
		}
		mpDelete, mpDeleteBody := multipart("DELETE", 300<<10)
		mpPut, mpPutBody := multipart("put", 300<<10)
		for _, c := range []struct {
			name, target, ctype, body string
			want                      int
			form                      string // what the server acted on
		}{
			{"query", url + "?_method=DELETE", "", "", 403, ""},
			{"query, another spelling", url + "?a=1;%5Fm%65thod=delete", "application/json", "{}", 403, ""},
			{"form", url, "application/x-www-form-urlencoded", "a=1&_method=DELETE", 403, ""},
			{"form without a type", url, "", "_method=DELETE&" + strings.Repeat("a=1&", 50000), 403, ""},
			{"multipart", url, mpDelete, mpDeleteBody, 403, ""},
			{"form, allowed", url, "application/x-www-form-urlencoded", "a=1&_method=PUT", 200, `POST "PUT" 0`},
			{"multipart, allowed", url, mpPut, mpPutBody, 200, fmt.Sprintf(`POST "put" %d`, 300<<10)},
			{"JSON", url, "application/json", `{"a":[1],"_method":"DELETE"}`, 403, ""},
			{"JSON, allowed", url, "application/json", `{"_method":"PUT"}`, 200, `POST "PUT" 0`},
			{"multipart, after the close", url, "multipart/form-data; boundary=XyZ",
				mpDeleteBody + strings.Repeat("epilogue ", 8000), 403, ""},
			{"bytes are not a form", url, "application/octet-stream", "_method=DELETE", 200, `POST "" 0`},
		} {
			up.mu.Lock()
			up.forms = nil
			up.mu.Unlock()
			// Each request says which case it is: a record may come
			// after the answer.
			sep := "?"
			if strings.Contains(c.target, "?") {
				sep = "&"
			}
			tag := fmt.Sprintf("case=%s-%d", proto, len(c.name)*1000+len(c.body))
			status, body := send(c.target+sep+tag, c.ctype, c.body)
			if status != c.want {
				t.Errorf("%s %s: %d %q, want %d", proto, c.name, status, body, c.want)
			}
			up.mu.Lock()
			forms := up.forms
			up.mu.Unlock()
			if want := []string{c.form}; c.form == "" && len(forms) != 0 || c.form != "" && !slices.Equal(forms, want) {
				t.Errorf("%s %s: the server acted on %q, want %q", proto, c.name, forms, c.form)
			}
			if c.want != 403 {
				continue
			}
			if !strings.Contains(body, "DELETE") {
				t.Errorf("%s %s: the refusal does not say why: %q", proto, c.name, body)
			}
			var r RequestRecord
			testenv.WaitFor(t, 5*time.Second, "the request's record", func() bool {
				mu.Lock()
				defer mu.Unlock()
				i := slices.IndexFunc(recs, func(r RequestRecord) bool { return strings.HasSuffix(r.URL, tag) })
				if i >= 0 {
					r = recs[i]
				}
				return i >= 0
			})
			if r.Verdict != policy.Deny || r.Status != 403 || !strings.Contains(r.Reason, "DELETE") && !strings.Contains(r.Reason, "deny rule") {
				t.Errorf("%s %s: recorded %s %d %q", proto, c.name, r.Verdict, r.Status, r.Reason)
			}
		}
	}
}
