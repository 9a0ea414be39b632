package tproxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/policy"
)

// memberAPI stands for the member API: it answers "member api from
// SOURCE", or, on /wait, waits until its request ends.
type memberAPI struct{ calls atomic.Int32 }

func (m *memberAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.calls.Add(1)
	if r.URL.Path == "/wait" {
		<-r.Context().Done()
		return
	}
	fmt.Fprintf(w, "member api from %s", r.RemoteAddr)
}

// Connections to the sandbox's own gateway, port 80, go to the member API,
// whatever the rules say; airlock.internal anywhere else, in an SNI or a
// Host, is refused and never asked about or dialled.
func TestProxyMemberAPI(t *testing.T) {
	up := startUpstream(t)
	policyYAML := "sandbox:\n  unknown_action: allow\n  network_allowlist:\n    user:\n      - pattern: airlock.internal\n      - pattern: \"*.airlock.internal\"\n"
	tests := []struct {
		name  string
		dst   netip.AddrPort
		url   string
		host  string // a Host header other than the URL's
		calls int32  // of the member API
		want  string // in the body, or the client's error
	}{
		{name: "the gateway's port 80", dst: netip.MustParseAddrPort("127.0.0.1:80"), url: "http://airlock.internal/v1/requests/x", calls: 1, want: "member api from 127.0.0.1:"},
		{name: "the gateway by address", dst: netip.MustParseAddrPort("127.0.0.1:80"), url: "http://127.0.0.1/", calls: 1, want: "member api from"},
		{name: "another address's port 80", dst: netip.MustParseAddrPort("10.99.0.1:80"), url: "http://airlock.internal/", want: "airlock's member API, served only at http://airlock.internal/"},
		{name: "a name under it", dst: netip.MustParseAddrPort("10.99.0.1:80"), url: "http://x.AIRLOCK.internal/", want: "airlock's member API"},
		{name: "a fake IP's Host", dst: netip.AddrPortFrom(fake("allowed.test"), 80), url: "http://allowed.test/", host: "airlock.internal", want: "403"},
		{name: "HTTPS to the gateway", dst: netip.MustParseAddrPort("127.0.0.1:443"), url: "https://airlock.internal/", want: "reset"},
		{name: "another port of the gateway", dst: netip.MustParseAddrPort("127.0.0.1:8080"), url: "http://airlock.internal:8080/", want: "airlock's member API"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := &memberAPI{}
			h := newHarness(t, up, tt.dst, policyYAML, func(c *Config) { c.MemberAPI = api })
			var header http.Header
			if tt.host != "" {
				header = http.Header{"Host": {tt.host}}
			}
			status, _, body, err := h.fetch(t, "GET", tt.url, "", header)
			got := fmt.Sprintf("%d %s", status, body)
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if n := api.calls.Load(); n != tt.calls {
				t.Errorf("the member API served %d requests, want %d", n, tt.calls)
			}
			if p := h.broker.List(); len(p) != 0 {
				t.Errorf("asked about %+v", p)
			}
			waitRecords(t, h, 1)
			r := h.Records()[0]
			if tt.calls > 0 && (r.Verdict != policy.Allow || r.Host != policy.InternalName || r.Reason != "the member API") {
				t.Errorf("record %+v", r)
			}
			if tt.calls == 0 && r.Verdict != policy.Deny {
				t.Errorf("record %+v, want a denial", r)
			}
		})
	}
}

// Without a member API the gateway's port 80 is a raw IP like any.
func TestProxyNoMemberAPI(t *testing.T) {
	up := startUpstream(t)
	h := newHarness(t, up, netip.MustParseAddrPort("127.0.0.1:80"), "sandbox:\n  unknown_action: deny\n", nil)
	status, _, body, err := h.fetch(t, "GET", "http://127.0.0.1/", "", nil)
	if err != nil || status != 403 {
		t.Errorf("= %d %q %v, want a 403", status, body, err)
	}
}

// Close ends a member API request that waits (for a person), and the
// connection with it.
func TestProxyCloseEndsMemberAPIRequests(t *testing.T) {
	up := startUpstream(t)
	api := &memberAPI{}
	h := newHarness(t, up, netip.MustParseAddrPort("127.0.0.1:80"), "sandbox: {}\n", func(c *Config) {
		c.MemberAPI = api
		c.DrainTimeout = 100 * time.Millisecond
	})
	c := h.connect(t, 10*time.Second)
	fmt.Fprint(c, "GET /wait HTTP/1.1\r\nHost: airlock.internal\r\n\r\n")
	for api.calls.Load() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	h.proxy.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Close took %s", d)
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.Copy(io.Discard, c); isTimeout(err) {
		t.Errorf("the connection is still open after Close: %v", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
