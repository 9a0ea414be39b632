package tproxy

import (
	"crypto/tls"
	"errors"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"
)

// clientHello returns the first flight a Go TLS client sends for sni.
func clientHello(t testing.TB, sni string, alpn ...string) []byte {
	c, s := net.Pipe()
	go func() {
		tc := tls.Client(c, &tls.Config{ServerName: sni, NextProtos: alpn, InsecureSkipVerify: sni == ""})
		tc.SetDeadline(time.Now().Add(2 * time.Second))
		tc.Handshake()
		c.Close()
	}()
	buf := make([]byte, MaxPeek)
	s.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := s.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	return buf[:n]
}

func TestParseClientHello(t *testing.T) {
	b := clientHello(t, "Allowed.Test", "h2", "http/1.1")
	h, err := parseClientHello(b)
	if err != nil {
		t.Fatal(err)
	}
	if h.SNI != "Allowed.Test" || !reflect.DeepEqual(h.ALPN, []string{"h2", "http/1.1"}) {
		t.Errorf("hello = %+v", h)
	}
	// Every truncation needs more; never a wrong answer.
	for i := 0; i < len(b); i++ {
		if _, err := parseClientHello(b[:i]); err != errNeedMore {
			t.Fatalf("prefix of %d/%d bytes: %v, want errNeedMore", i, len(b), err)
		}
	}
	// The same handshake split over two records.
	body := b[5:]
	cut := len(body) / 3
	rec := func(p []byte) []byte { return append([]byte{0x16, 0x03, 0x01, byte(len(p) >> 8), byte(len(p))}, p...) }
	split := append(rec(body[:cut]), rec(body[cut:])...)
	if h2, err := parseClientHello(split); err != nil || h2.SNI != "Allowed.Test" {
		t.Errorf("split over records: %+v %v", h2, err)
	}
	// No SNI (an IP literal client).
	if h, err := parseClientHello(clientHello(t, "")); err != nil || h.SNI != "" {
		t.Errorf("no SNI: %+v %v", h, err)
	}
}

func TestParseClientHelloRejects(t *testing.T) {
	for name, b := range map[string][]byte{
		"http":          []byte("GET / HTTP/1.1\r\n"),
		"ssh":           []byte("SSH-2.0-OpenSSH_9.2\r\n"),
		"zero record":   {0x16, 0x03, 0x01, 0x00, 0x00},
		"server hello":  {0x16, 0x03, 0x03, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00},
		"bad version":   {0x16, 0x02, 0x00, 0x00, 0x05, 1, 2, 3, 4, 5},
		"garbage hello": append([]byte{0x16, 0x03, 0x01, 0x00, 0x08, 0x01, 0x00, 0x00, 0x04}, 1, 2, 3, 4),
	} {
		if _, err := parseClientHello(b); err == nil || err == errNeedMore {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
}

func TestParseHTTPHead(t *testing.T) {
	tests := []struct {
		name, in string
		want     Head
		err      string
	}{
		{name: "simple", in: "GET /x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", want: Head{"GET", "/x", "allowed.test"}},
		{name: "port and case", in: "POST /x HTTP/1.1\r\nhOsT:  Allowed.Test:8080 \r\nA: b\r\n\r\nbody", want: Head{"POST", "/x", "Allowed.Test"}},
		{name: "absolute form", in: "GET http://allowed.test:80/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", want: Head{"GET", "http://allowed.test:80/x", "allowed.test"}},
		{name: "no host", in: "GET / HTTP/1.0\r\n\r\n", want: Head{"GET", "/", ""}},
		{name: "incomplete", in: "GET / HTTP/1.1\r\nHost: a", err: "need more"},
		{name: "short", in: "GE", err: "need more"},
		{name: "two hosts", in: "GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n", err: "two Host"},
		{name: "target host differs", in: "GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", err: "different hosts"},
		{name: "userinfo", in: "GET http://allowed.test@evil.test/ HTTP/1.1\r\n\r\n", err: "userinfo"},
		{name: "folding", in: "GET / HTTP/1.1\r\nHost: a.test\r\n x\r\n\r\n", err: "folding"},
		{name: "ssh", in: "SSH-2.0-OpenSSH\r\n", err: "not an HTTP"},
		{name: "a word so far", in: "echo", err: "need more"},
		{name: "upper-case word so far", in: "PROPFIN", err: "need more"},
		{name: "a line of one word", in: "echo\r\n", err: "not an HTTP"},
		{name: "ssh banner with a space", in: "SSH-2.0-OpenSSH_9.6 Ubuntu-3\r\n", err: "not an HTTP"},
		{name: "lower-case method", in: "get / HTTP/1.1\r\nHost: a.test\r\n\r\n", want: Head{"get", "/", "a.test"}},
		{name: "uncommon method", in: "M-SEARCH * HTTP/1.1\r\nHost: a.test\r\n\r\n", want: Head{"M-SEARCH", "*", "a.test"}},
		{name: "long method", in: strings.Repeat("X", 40) + " / HTTP/1.1\r\nHost: a.test\r\n\r\n", want: Head{strings.Repeat("X", 40), "/", "a.test"}},
		{name: "method of symbols", in: "!#$%&'*+-.^_`|~ / HTTP/1.1\r\nHost: a.test\r\n\r\n", want: Head{"!#$%&'*+-.^_`|~", "/", "a.test"}},
		{name: "binary", in: "\x16\x03\x01\x00", err: "not an HTTP"},
		{name: "http2 preface is no HTTP/1", in: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", err: "malformed"},
		{name: "bad header", in: "GET / HTTP/1.1\r\nno colon\r\n\r\n", err: "malformed"},
		{name: "bare LF lines", in: "GET / HTTP/1.1\nHost: other.test\n\nXX\r\n\r\n", err: "LF without CR"},
		{name: "bare LF, head unfinished", in: "GET / HTTP/1.1\nHost: other.test\n", err: "LF without CR"},
		{name: "bare CR", in: "GET / HTTP/1.1\rHost: other.test\r\n\r\n", err: "CR not followed"},
		{name: "empty lines first", in: "\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n", err: "empty lines"},
		{name: "tab separators", in: "GET\t/\tHTTP/1.1\r\nHost: other.test\r\n\r\n", err: "request line"},
		{name: "two spaces", in: "GET  / HTTP/1.1\r\nHost: other.test\r\n\r\n", err: "request line"},
		{name: "HTTP/0.9-looking version", in: "GET / HTTP/0.9\r\nHost: other.test\r\n\r\n", err: "request line"},
		{name: "lower-case version", in: "GET / http/1.1\r\nHost: other.test\r\n\r\n", err: "request line"},
		{name: "space before colon", in: "GET / HTTP/1.1\r\nHost : other.test\r\n\r\n", err: "malformed"},
		{name: "NUL in a header", in: "GET / HTTP/1.1\r\nHost: a.test\x00other.test\r\n\r\n", err: "control byte"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := parseHTTPHead([]byte(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || h != tt.want {
				t.Errorf("= %+v, %v; want %+v", h, err, tt.want)
			}
		})
	}
	big := "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", MaxPeek) + "\r\n"
	if _, err := parseHTTPHead([]byte(big)); err == nil || errors.Is(err, errNeedMore) || err == errNeedMore {
		t.Errorf("oversized head: %v", err)
	}
}

func FuzzClientHello(f *testing.F) {
	f.Add(clientHello(f, "allowed.test", "h2"))
	f.Add(clientHello(f, ""))
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseClientHello(b)
		if err == nil && strings.IndexByte(h.SNI, 0) >= 0 {
			t.Fatalf("SNI with NUL: %q", h.SNI)
		}
		// More bytes never turn an answer into a different answer.
		if err == nil {
			h2, err2 := parseClientHello(append(append([]byte(nil), b...), 0x17, 0x03, 0x03))
			if err2 != nil || h2.SNI != h.SNI {
				t.Fatalf("appending bytes changed %q/%v to %q/%v", h.SNI, err, h2.SNI, err2)
			}
		}
	})
}

func FuzzHTTPHead(f *testing.F) {
	for _, s := range []string{"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", "GET http://a.test/ HTTP/1.1\r\n\r\n", "CONNECT a:443 HTTP/1.1\r\n\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHTTPHead(b)
		if err == nil && (strings.ContainsAny(h.Host, "\r\n") || h.Method == "") {
			t.Fatalf("head %+v from %q", h, b)
		}
	})
}

// TestExtSetRepeats: a repeated extension type is found among the first
// few and among the many beyond them.
func TestExtSetRepeats(t *testing.T) {
	var s extSet
	for typ := range uint16(200) {
		if !s.add(typ * 7) {
			t.Fatalf("extension %d taken for a repeat", typ*7)
		}
	}
	for typ := range uint16(200) {
		if s.add(typ * 7) {
			t.Fatalf("repeated extension %d not found", typ*7)
		}
	}
	if !s.add(1) {
		t.Error("a new extension after many taken for a repeat")
	}
}
