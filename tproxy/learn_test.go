package tproxy

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/policy"
)

// A connection learn mode let through is cut when learn mode ends: a
// member that opened it while learning cannot keep using it once the
// sandbox asks.
func TestProxyLearnedSpliceEndsWithLearnMode(t *testing.T) {
	up := startUpstream(t)
	until := time.Now().Add(2 * time.Second).UTC().Truncate(time.Second).Add(time.Second)
	yaml := strings.Replace(rules(up.httpsPort), "sandbox:\n", fmt.Sprintf("sandbox:\n  unknown_action: learn\n  learn_until: %q\n", until.Format(time.RFC3339)), 1)
	h := newHarness(t, up, netip.AddrPortFrom(fake("unknown.test"), up.httpsPort), yaml, nil)

	raw := h.connect(t, 30*time.Second)
	tc := tls.Client(raw, &tls.Config{ServerName: "unknown.test", RootCAs: up.roots(t), NextProtos: []string{"http/1.1"}})
	br := bufio.NewReader(tc)
	get := func() error {
		if _, err := io.WriteString(tc, "GET / HTTP/1.1\r\nHost: unknown.test\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return err
	}
	if err := get(); err != nil {
		waitRecords(t, h, 1)
		t.Fatalf("request while learning: %v; %+v", err, h.Records())
	}
	if !testenv.Poll(10*time.Second, func() bool { return h.sandbox.LearnUntil().IsZero() }) {
		t.Fatal("learn mode did not end")
	}
	// The proxy may need a moment to cut it; a request that still goes
	// through after that is the failure.
	ok := testenv.Poll(5*time.Second, func() bool { return get() != nil })
	if !ok {
		t.Errorf("a connection learn mode let through still carries requests after learn mode ended")
	}
}

// learnedSplice opens a connection to unknown.test, which no rule decides,
// in a sandbox that learns until an hour from now, and returns the
// harness and a func that makes one request over it.
func learnedSplice(t *testing.T) (*harness, uint16, func() error) {
	t.Helper()
	up := startUpstream(t)
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	yaml := strings.Replace(rules(up.httpsPort), "sandbox:\n", fmt.Sprintf("sandbox:\n  unknown_action: learn\n  learn_until: %q\n", until.Format(time.RFC3339)), 1)
	h := newHarness(t, up, netip.AddrPortFrom(fake("unknown.test"), up.httpsPort), yaml, nil)
	raw := h.connect(t, 30*time.Second)
	tc := tls.Client(raw, &tls.Config{ServerName: "unknown.test", RootCAs: up.roots(t), NextProtos: []string{"http/1.1"}})
	br := bufio.NewReader(tc)
	get := func() error {
		tc.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(tc, "GET / HTTP/1.1\r\nHost: unknown.test\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return err
	}
	if err := get(); err != nil {
		t.Fatalf("request while learning: %v", err)
	}
	if n := h.proxy.checkLearned(); n != 1 {
		t.Fatalf("%d connections watched as learned, want 1", n)
	}
	return h, up.httpsPort, get
}

// A connection learn mode let through is cut as soon as learn mode ends
// early: turned off (unknown_action deny or ask, by a person's settings or
// an edit of the file put in force by a reload) or its end moved to a time
// that has passed. It is not left to run until the end learn mode had
// when it was let through.
func TestLearnedSpliceCutWhenLearnModeTurnedOff(t *testing.T) {
	deny, ask := policy.ActionDeny, policy.ActionAsk
	past := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, sb *policy.Sandbox)
	}{
		{"unknown_action deny", func(t *testing.T, sb *policy.Sandbox) {
			if _, err := sb.SetSettings(policy.Settings{UnknownAction: &deny}); err != nil {
				t.Fatal(err)
			}
		}},
		{"unknown_action ask", func(t *testing.T, sb *policy.Sandbox) {
			if _, err := sb.SetSettings(policy.Settings{UnknownAction: &ask}); err != nil {
				t.Fatal(err)
			}
		}},
		{"learn_until moved earlier", func(t *testing.T, sb *policy.Sandbox) {
			if _, err := sb.SetSettings(policy.Settings{LearnUntil: &past}); err != nil {
				t.Fatal(err)
			}
		}},
		{"file edited and reloaded", func(t *testing.T, sb *policy.Sandbox) {
			b, err := os.ReadFile(sb.Path())
			if err != nil {
				t.Fatal(err)
			}
			edited := strings.Replace(string(b), "unknown_action: learn", "unknown_action: deny", 1)
			if edited == string(b) {
				t.Fatalf("no unknown_action: learn in %q", b)
			}
			if err := os.WriteFile(sb.Path(), []byte(edited), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := sb.Reload(); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, port, get := learnedSplice(t)
			tc.end(t, h.sandbox)
			if !h.sandbox.LearnUntil().IsZero() {
				t.Fatal("learn mode did not end")
			}
			if d := h.sandbox.Decide(policy.Query{Host: "unknown.test", Port: port}); d.Verdict == policy.Allow {
				t.Fatalf("a new connection is still allowed: %+v", d)
			}
			if !testenv.Poll(5*time.Second, func() bool { return get() != nil }) {
				t.Errorf("learn mode ended (%s) but the connection it let through still carries requests", tc.name)
			}
		})
	}
}

// A rule that allows a learned connection by the time learn mode is
// turned off keeps it open; it is still watched, and cut once the rule is
// removed.
func TestLearnedSpliceKeptByRuleWhenLearnModeTurnedOff(t *testing.T) {
	h, port, get := learnedSplice(t)
	rule, err := h.sandbox.Add(policy.AddRequest{Pattern: fmt.Sprintf("unknown.test:%d", port), List: policy.Allowlist})
	if err != nil {
		t.Fatal(err)
	}
	deny := policy.ActionDeny
	if _, err := h.sandbox.SetSettings(policy.Settings{UnknownAction: &deny}); err != nil {
		t.Fatal(err)
	}
	// Decided again here, as the proxy does on every change: a cut, were
	// there one, has happened when this returns.
	if n := h.proxy.checkLearned(); n != 1 {
		t.Fatalf("%d connections watched as learned, want 1", n)
	}
	if err := get(); err != nil {
		t.Fatalf("a rule allows the connection, yet it was cut: %v", err)
	}
	if _, err := h.sandbox.Remove(rule.ID); err != nil {
		t.Fatal(err)
	}
	if !testenv.Poll(5*time.Second, func() bool { return get() != nil }) {
		t.Errorf("the rule that kept a learned connection open was removed after learn mode ended, but the connection still carries requests")
	}
}

// A WebSocket learn mode let through on an intercepted connection is a
// tunnel no later request is decided on: it is cut like a spliced
// connection when learn mode is turned off.
func TestLearnedWebSocketCutWhenLearnModeTurnedOff(t *testing.T) {
	up := startUpstream(t)
	port := up.httpsPort
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	yaml := strings.Replace(rules(port, fmt.Sprintf("api.allowed.test:%d/v1/*", port)), "sandbox:\n",
		fmt.Sprintf("sandbox:\n  unknown_action: learn\n  learn_until: %q\n", until.Format(time.RFC3339)), 1)
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), port), yaml)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	c, err := tls.Dial("tcp4", h.proxy.Addr().String(), &tls.Config{ServerName: "api.allowed.test", RootCAs: roots, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "GET /v2/ws HTTP/1.1\r\nHost: api.allowed.test:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", port)
	r := bufio.NewReader(c)
	if status, _ := r.ReadString('\n'); !strings.Contains(status, "101") {
		t.Fatalf("learned upgrade: %q", status)
	}
	for {
		l, err := r.ReadString('\n')
		if err != nil || l == "\r\n" {
			break
		}
	}
	echo := func() error {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		got := make([]byte, 4)
		if _, err := io.ReadFull(r, got); err != nil {
			return err
		}
		if string(got) != "ping" {
			return fmt.Errorf("echo %q", got)
		}
		return nil
	}
	if err := echo(); err != nil {
		t.Fatalf("echo while learning: %v", err)
	}
	if n := h.proxy.checkLearned(); n != 1 {
		t.Fatalf("%d requests watched as learned, want 1", n)
	}
	deny := policy.ActionDeny
	if _, err := h.sandbox.SetSettings(policy.Settings{UnknownAction: &deny}); err != nil {
		t.Fatal(err)
	}
	if !testenv.Poll(5*time.Second, func() bool { return echo() != nil }) {
		t.Errorf("learn mode was turned off but the WebSocket it let through still carries data")
	}
}

// A request a rule lets through in part, and learn mode in part, is
// watched for every question it was let through on: its target, each
// override (header, query, body) and its Destination, for its method and
// each override's. Turning learn mode off cuts it, its body streaming
// upstream, once the part learn mode allowed is denied (review 47).
func TestLearnedPartOfRequestCutWhenLearnModeTurnedOff(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rules []string // each with the port to fill in
		head  string   // the request line and headers, without Host
		body  string   // its first bytes
		// learned is the question only learn mode allows.
		learned policy.Query
	}{
		{"Destination", []string{"api.allowed.test:%d/v1/*"},
			"MOVE /v1/echo HTTP/1.1\r\nDestination: /v2/moved\r\n", "hello",
			policy.Query{Method: "MOVE", Path: "/v2/moved"}},
		{"header override", []string{"POST api.allowed.test:%d/v1/*"},
			"POST /v1/echo HTTP/1.1\r\nX-HTTP-Method-Override: DELETE\r\nContent-Type: application/octet-stream\r\n", "hello",
			policy.Query{Method: "DELETE", Path: "/v1/echo"}},
		{"query override", []string{"POST api.allowed.test:%d/v1/*"},
			"POST /v1/echo?_method=DELETE HTTP/1.1\r\nContent-Type: application/octet-stream\r\n", "hello",
			policy.Query{Method: "DELETE", Path: "/v1/echo?_method=DELETE"}},
		{"form override", []string{"POST api.allowed.test:%d/v1/*"},
			"POST /v1/echo HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\n", "_method=DELETE&a=",
			policy.Query{Method: "DELETE", Path: "/v1/echo"}},
		{"Destination of a form override", []string{"api.allowed.test:%d/v1/*", "POST api.allowed.test:%d/v2/*"},
			"POST /v1/echo HTTP/1.1\r\nDestination: /v2/moved\r\nContent-Type: application/x-www-form-urlencoded\r\n", "_method=MOVE&a=",
			policy.Query{Method: "MOVE", Path: "/v2/moved"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startUpstream(t)
			port := up.httpsPort
			until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
			var patterns []string
			for _, r := range tc.rules {
				patterns = append(patterns, strings.ReplaceAll(r, "%d", fmt.Sprint(port)))
			}
			yaml := strings.Replace(rules(port, patterns...), "sandbox:\n",
				fmt.Sprintf("sandbox:\n  unknown_action: learn\n  learn_until: %q\n", until.Format(time.RFC3339)), 1)
			h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), port), yaml)
			q := tc.learned
			q.Host, q.Port = "api.allowed.test", port
			if d := h.sandbox.Decide(q); d.Reason != policy.ReasonLearn {
				t.Fatalf("%s %s is not learned: %+v", q.Method, q.Path, d)
			}
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(ca.CertPEM())
			c, err := tls.Dial("tcp4", h.proxy.Addr().String(), &tls.Config{ServerName: "api.allowed.test", RootCAs: roots, NextProtos: []string{"http/1.1"}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "%sHost: api.allowed.test:%d\r\nContent-Length: 10000000\r\n\r\n%s", tc.head, port, tc.body)
			// Under way: more of the body is taken, and the connection
			// neither answers (the echo is still buffered upstream) nor
			// ends.
			alive := func() bool {
				c.SetDeadline(time.Now().Add(300 * time.Millisecond))
				if _, err := c.Write([]byte("more body")); err != nil {
					return false
				}
				buf := make([]byte, 1)
				_, err := c.Read(buf)
				var ne net.Error
				return err == nil || errors.As(err, &ne) && ne.Timeout()
			}
			if !alive() {
				t.Fatal("the request is not under way while learning")
			}
			if !testenv.Poll(5*time.Second, func() bool { return h.proxy.checkLearned() == 1 }) {
				t.Fatalf("%d requests watched as learned, want 1", h.proxy.checkLearned())
			}
			if !alive() {
				t.Fatal("the request was cut while learning")
			}
			deny := policy.ActionDeny
			if _, err := h.sandbox.SetSettings(policy.Settings{UnknownAction: &deny}); err != nil {
				t.Fatal(err)
			}
			if d := h.sandbox.Decide(q); d.Verdict == policy.Allow {
				t.Fatalf("%s %s is still allowed: %+v", q.Method, q.Path, d)
			}
			if !testenv.Poll(5*time.Second, func() bool { return !alive() }) {
				t.Errorf("learn mode was turned off and the %s %s it let through is denied, but the request still streams its body upstream", q.Method, q.Path)
			}
		})
	}
}
