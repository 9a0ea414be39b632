package tproxy

import (
	"crypto/tls"
	"errors"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode"
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

// classified names what classify makes of b.
func classified(b []byte) string {
	var c conn
	done, err := c.classify(b)
	switch {
	case err != nil:
		return "refused"
	case !done:
		return "more"
	case c.hello != nil:
		return "TLS"
	case c.h2c:
		return "h2c"
	case c.head != nil:
		return "HTTP"
	}
	return "another protocol"
}

// TestClassifyFirstBytes: first bytes a lenient server reads as an HTTP
// request (lenientSpellings) are HTTP read strictly or refused, never
// another protocol; those of other protocols (otherProtocols) are
// another protocol. No prefix of them is classified otherwise than the
// whole: the silent client's first bytes (firstBytes) and every peek go
// through classify one read at a time.
func TestClassifyFirstBytes(t *testing.T) {
	type test struct{ name, in, want string }
	tests := []test{
		{"TLS", string(clientHello(t, "allowed.test")), "TLS"},
		{"h2c", h2cPreface, "h2c"},
		{"HTTP", "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", "HTTP"},
		{"lower-case method", "get / HTTP/1.1\r\nHost: a.test\r\n\r\n", "HTTP"},
		{"PROPFIND", "PROPFIND / HTTP/1.1\r\nHost: a.test\r\n\r\n", "HTTP"},
		{"HTTP/1.0 absolute form", "GET http://a.test/ HTTP/1.0\r\n\r\n", "HTTP"},
		{"HTTP/0.9", "GET /\r\n", "refused"},
		{"HTTP/0.9 of another method", "HEAD /x\r\n", "another protocol"},
		{"HTTP/0.9, any target", "GET x\r\nHost: evil.test\r\n\r\n", "refused"},
		{"HTTP/0.9, a star", "GET *\r\n", "refused"},
		{"a byte-order mark before the method", "\xef\xbb\xbfGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", "refused"},
		{"a control byte before the method", "\x01GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", "refused"},
		{"DEL as the method", "\x7f / HTTP/1.1\r\n\r\n", "refused"},
		{"a byte outside ASCII in the method", "G\x80ET / HTTP/1.1\r\n\r\n", "refused"},
		{"version in any case", "GET / hTtP/1.1\r\n\r\n", "refused"},
		{"version not last", "GET / HTTP/1.1 x\r\n\r\n", "refused"},
		{"target with a space", "GET /a b HTTP/1.1\r\n\r\n", "refused"},
		{"version before a bare CR line end", "GET / HTTP/1.1\rHost: evil.test\r\r", "refused"},
		{"PROXY v1 before SSH", "PROXY TCP4 10.0.0.1 10.0.0.2 1234 22\r\nSSH-2.0-x\r\n", "refused"},
		{"PROXY v2 before TLS", proxyV2Sig + "\x21\x11\x00\x00" + string(clientHello(t, "evil.test")), "refused"},
		{"a PROXY-like word", "PROXYING now\r\n", "another protocol"},
		{"two empty lines, then binary", "\r\n\r\n\x00\x01", "another protocol"},
		{"one word", "HELLO\r\n", "another protocol"},
		{"a word, then a control byte", "GET\x00/ HTTP/1.1\r\n\r\n", "refused"},
		{"three words", "GET / FOO\r\n", "another protocol"},
	}
	for _, tc := range lenientSpellings {
		if tc.name != "strict" {
			tests = append(tests, test{"lenient: " + tc.name, tc.raw, "refused"})
		}
	}
	for _, tc := range otherProtocols {
		tests = append(tests, test{"other: " + tc.name, tc.raw, "another protocol"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := classified([]byte(tt.in)); got != tt.want {
				t.Fatalf("%q: %s, want %s", tt.in, got, tt.want)
			}
			for i := 1; i < len(tt.in); i++ {
				got := classified([]byte(tt.in[:i]))
				if got == "another protocol" && exoticLine(tt.in[:i]) {
					// Before its line end, a line whose method is not
					// visible ASCII or whose words hold control bytes is
					// not waited for (httpShaped; docs/security.md).
					continue
				}
				if got != "more" && got != tt.want {
					t.Fatalf("the first %d bytes %q: %s, want more or %s", i, tt.in[:i], got, tt.want)
				}
			}
		})
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
	for _, tc := range lenientSpellings {
		f.Add([]byte(tc.raw))
	}
	for _, tc := range otherProtocols {
		f.Add([]byte(tc.raw))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHTTPHead(b)
		if err == nil && (strings.ContainsAny(h.Host, "\r\n") || h.Method == "") {
			t.Fatalf("head %+v from %q", h, b)
		}
		// Once the first line is whole, bytes a lenient server reads as a
		// request line are never "not HTTP", and others always are.
		if lax, whole := laxRequestLine(b); whole && lax == errors.Is(err, errNotHTTP) {
			t.Fatalf("%q: %v, but a lenient server reads a request line: %v", b, err, lax)
		}
	})
}

// exoticLine reports bytes without a line end that hold, past leading
// blanks, a byte outside visible ASCII other than white space.
func exoticLine(s string) bool {
	s = strings.TrimLeftFunc(s, func(r rune) bool { return r < 0x80 && (isLaxSpace(byte(r)) || r == '\n') })
	if strings.Contains(s, "\n") {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '!' || c > '~') && !isLaxSpace(c) {
			return true
		}
	}
	return false
}

// laxRequestLine is the lenient reading httpShaped stands for, written
// as Python's http.server makes it: past leading white space and empty
// lines, the first line, decoded as Latin-1, split by str.split() (Go's
// unicode.IsSpace, and 0x1c-0x1f) is any first word (Werkzeug takes any
// for the method) and a later word starting with "HTTP/" (in any case
// here), or "GET target" (HTTP/0.9, GET only). whole is false while the
// first line has no end.
func laxRequestLine(b []byte) (lax, whole bool) {
	latin1 := make([]rune, len(b))
	for i, c := range b {
		latin1[i] = rune(c)
	}
	space := func(r rune) bool { return unicode.IsSpace(r) || 0x1c <= r && r <= 0x1f }
	line, _, whole := strings.Cut(strings.TrimLeftFunc(string(latin1), space), "\n")
	if !whole {
		return false, false
	}
	words := strings.FieldsFunc(line, space)
	if len(words) < 2 {
		return false, true
	}
	for _, w := range words[1:] {
		if len(w) >= 5 && strings.EqualFold(w[:5], "HTTP/") {
			return true, true
		}
	}
	return len(words) == 2 && words[0] == "GET", true
}
