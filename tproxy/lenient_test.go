package tproxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/policy"
)

// werkzeugHTTP reads requests as Werkzeug's development server (3.1.8, the
// one used by Flask) does, verified against the real thing: Python's
// BaseHTTPRequestHandler.parse_request (readline to LF, Latin-1,
// str.split()), 3 words need a last one starting with "HTTP/", 2 words
// are HTTP/0.9 and need the method to be exactly "GET" - but the target
// may be anything and the headers (Host among them) are still parsed.
// Werkzeug's handler answers every "do_"+method attribute with run_wsgi,
// so ANY first word is a method the application is called with: "\x01GET",
// "G\x00ET", "\xef\xbb\xbfGET" (a UTF-8 BOM), "\x80GET".
type werkzeugHTTP struct {
	ln    net.Listener
	mu    sync.Mutex
	hosts []string
}

func startWerkzeugHTTP(t *testing.T) *werkzeugHTTP {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &werkzeugHTTP{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return s
}

func pySpace(c byte) bool { return c == '\n' || isLaxSpace(c) }

func (s *werkzeugHTTP) serve(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadBytes('\n')
	if err != nil {
		return
	}
	words := bytes.FieldsFunc(line, func(c rune) bool { return pySpace(byte(c)) })
	switch {
	case len(words) == 3 && bytes.HasPrefix(words[2], []byte("HTTP/")):
	case len(words) == 2 && string(words[0]) == "GET":
	default:
		return
	}
	host := ""
	for {
		h, err := r.ReadString('\n')
		if err != nil || strings.TrimSpace(h) == "" {
			break
		}
		if k, v, ok := strings.Cut(h, ":"); ok && strings.EqualFold(strings.TrimSpace(k), "Host") {
			host = strings.TrimSpace(v)
		}
	}
	s.mu.Lock()
	s.hosts = append(s.hosts, host)
	s.mu.Unlock()
	io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
}

func (s *werkzeugHTTP) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.hosts)
}

// werkzeugSpellings are requests for evil.test that Werkzeug 3.1.8 acts on
// (checked with a real make_server: the WSGI app was called with
// HTTP_HOST=evil.test for each) and that classify carries as "another
// protocol".
var werkzeugSpellings = []struct{ name, raw string }{
	{"UTF-8 BOM before the method", "\xef\xbb\xbfGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"},
	{"SOH before the method", "\x01GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"},
	{"NUL inside the method", "G\x00ET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"},
	{"0x80 before the method", "\x80GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"},
	{"DEL before the method", "\x7fGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"},
	{"HTTP/0.9 relative target, with headers", "GET x\r\nHost: evil.test\r\n\r\n"},
	{"HTTP/0.9 asterisk target, with headers", "GET *\r\nHost: evil.test\r\n\r\n"},
	{"HTTP/0.9 query target, with headers", "GET ?a=1\r\nHost: evil.test\r\n\r\n"},
}

// TestClassifyWerkzeugSpellings: each spelling is HTTP (read strictly) or
// refused, never another protocol.
func TestClassifyWerkzeugSpellings(t *testing.T) {
	for _, tc := range werkzeugSpellings {
		t.Run(tc.name, func(t *testing.T) {
			if got := classified([]byte(tc.raw)); got == "another protocol" {
				t.Errorf("%q: %s; a Werkzeug server reads a request for evil.test in it (invariant 10)", tc.raw, got)
			}
		})
	}
}

// TestWerkzeugSpellingsNotCarried: a member allowed allowed.test:<port> (a
// non-web port) with a Werkzeug-style server there never gets it to act on
// a request whose Host is evil.test.
func TestWerkzeugSpellingsNotCarried(t *testing.T) {
	srv := startWerkzeugHTTP(t)
	port := uint16(srv.ln.Addr().(*net.TCPAddr).Port)
	if isWebPort(port) {
		t.Skip("ephemeral port is a web port")
	}
	for _, tc := range werkzeugSpellings {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil, netip.AddrPortFrom(fake("allowed.test"), port), rules(port, fmt.Sprintf("allowed.test:%d", port)), nil)
			before := len(srv.seen())
			c := h.connect(t, 5*time.Second)
			io.WriteString(c, tc.raw)
			io.Copy(io.Discard, c)
			c.Close()
			waitRecords(t, h, 1)
			if got := srv.seen()[before:]; len(got) > 0 {
				t.Errorf("the upstream acted on a request for %q on a connection decided for allowed.test (record %+v)", got, h.Records()[0])
			}
		})
	}
}

// TestSilentClientKeptWhileServerSends: a server-first connection (the
// client silent past the sniff window) whose upstream keeps sending is not
// cut at IdleTimeout: only a connection idle both ways is, as the janitor
// cuts spliced ones.
func TestSilentClientKeptWhileServerSends(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // a feed: a line every 50 ms
				defer c.Close()
				for i := 0; ; i++ {
					if _, err := fmt.Fprintf(c, "tick %d\n", i); err != nil {
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}()
		}
	}()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	if isWebPort(port) {
		t.Skip("ephemeral port is a web port")
	}
	const idle = 600 * time.Millisecond
	h := newHarness(t, nil, netip.AddrPortFrom(fake("allowed.test"), port), rules(port, fmt.Sprintf("allowed.test:%d", port)), func(c *Config) {
		c.SniffTimeout = 20 * time.Millisecond
		c.IdleTimeout = idle
	})
	c := h.connect(t, 10*time.Second)
	start := time.Now()
	r := bufio.NewReader(c)
	for time.Since(start) < 3*idle {
		if _, err := r.ReadString('\n'); err != nil {
			c.Close()
			waitRecords(t, h, 1)
			rec := h.Records()[0]
			t.Fatalf("the feed was cut after %s (IdleTimeout %s) while it sent a line every 50 ms: %v; record %s / %s",
				time.Since(start).Round(10*time.Millisecond), idle, err, rec.Verdict, rec.Reason)
		}
	}
	c.Close()
	_ = policy.Deny
}

// TestSilentClientHalfClose: a server-first connection whose client never
// sends and shuts down its write side (nc -N, a script that closes stdin)
// gets the whole feed of its allowed upstream, and the record says allowed.
func TestSilentClientHalfClose(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // a feed: five lines 100 ms apart, then close
				defer c.Close()
				for i := 0; i < 5; i++ {
					fmt.Fprintf(c, "tick %d\n", i)
					time.Sleep(100 * time.Millisecond)
				}
			}()
		}
	}()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	if isWebPort(port) {
		t.Skip("ephemeral port is a web port")
	}
	h := newHarness(t, nil, netip.AddrPortFrom(fake("allowed.test"), port), rules(port, fmt.Sprintf("allowed.test:%d", port)), func(c *Config) {
		c.SniffTimeout = 20 * time.Millisecond
		c.IdleTimeout = 5 * time.Second
	})
	c := h.connect(t, 10*time.Second)
	time.Sleep(150 * time.Millisecond) // past the sniff window, the feed has begun
	c.(interface{ CloseWrite() error }).CloseWrite()
	got, err := io.ReadAll(c)
	c.Close()
	waitRecords(t, h, 1)
	rec := h.Records()[0]
	if err != nil || len(got) < len("tick 0\ntick 1\ntick 2\ntick 3\ntick 4\n") || rec.Verdict != policy.Allow {
		t.Errorf("half-closed silent client of an allowed feed: read %q, err %v; record %s / %q / close %q; want the whole feed and an allowed record",
			got, err, rec.Verdict, rec.Reason, rec.Close)
	}
}
