package tproxy

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/cryptobyte"
)

// MaxPeek caps how many bytes the proxy reads from a client before it knows
// what the connection is for.
const MaxPeek = 16 << 10

var (
	errNeedMore = errors.New("need more bytes")
	errNotTLS   = errors.New("not a TLS handshake")
	errNotHTTP  = errors.New("not an HTTP request")
)

// Hello is what the proxy learns from a TLS ClientHello.
type Hello struct {
	SNI  string   // server_name, "" when absent
	ALPN []string // offered protocols
	ECH  bool     // an encrypted_client_hello extension is present
}

// parseClientHello reads a ClientHello from the start of a TLS stream. It
// returns errNeedMore while the handshake message is incomplete and
// errNotTLS when the bytes are not a TLS handshake. The handshake may span
// several records.
func parseClientHello(b []byte) (Hello, error) {
	if len(b) == 0 {
		return Hello{}, errNeedMore
	}
	if b[0] != 0x16 {
		return Hello{}, errNotTLS
	}
	// Reassemble the handshake bytes from consecutive records.
	var hs []byte
	for rest := b; ; {
		if len(rest) < 5 {
			return Hello{}, errNeedMore
		}
		if rest[0] != 0x16 || rest[1] != 0x03 {
			return Hello{}, errNotTLS
		}
		n := int(rest[3])<<8 | int(rest[4])
		if n == 0 || n > 1<<14+256 {
			return Hello{}, fmt.Errorf("%w: record length %d", errNotTLS, n)
		}
		if len(rest) < 5+n {
			// Use what has arrived; the message may already be whole.
			hs = append(hs, rest[5:]...)
			if h, err := parseHandshake(hs); err != errNeedMore {
				return h, err
			}
			return Hello{}, errNeedMore
		}
		hs = append(hs, rest[5:5+n]...)
		if h, err := parseHandshake(hs); err != errNeedMore {
			return h, err
		}
		rest = rest[5+n:]
	}
}

func parseHandshake(hs []byte) (Hello, error) {
	if len(hs) < 4 {
		return Hello{}, errNeedMore
	}
	if hs[0] != 1 { // client_hello
		return Hello{}, fmt.Errorf("%w: handshake type %d", errNotTLS, hs[0])
	}
	n := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
	if n > MaxPeek {
		return Hello{}, fmt.Errorf("ClientHello of %d bytes is larger than %d", n, MaxPeek)
	}
	if len(hs) < 4+n {
		return Hello{}, errNeedMore
	}
	s := cryptobyte.String(hs[4 : 4+n])
	var (
		version             uint16
		random, sid, suites cryptobyte.String
		comp, exts          cryptobyte.String
	)
	if !s.ReadUint16(&version) || !s.ReadBytes((*[]byte)(&random), 32) ||
		!s.ReadUint8LengthPrefixed(&sid) || !s.ReadUint16LengthPrefixed(&suites) ||
		!s.ReadUint8LengthPrefixed(&comp) {
		return Hello{}, errors.New("malformed ClientHello")
	}
	var h Hello
	if s.Empty() {
		return h, nil // no extensions
	}
	if !s.ReadUint16LengthPrefixed(&exts) || !s.Empty() {
		return Hello{}, errors.New("malformed ClientHello extensions")
	}
	seen := map[uint16]bool{}
	for !exts.Empty() {
		var typ uint16
		var data cryptobyte.String
		if !exts.ReadUint16(&typ) || !exts.ReadUint16LengthPrefixed(&data) {
			return Hello{}, errors.New("malformed ClientHello extension")
		}
		if seen[typ] {
			return Hello{}, fmt.Errorf("ClientHello repeats extension %d", typ)
		}
		seen[typ] = true
		switch typ {
		case 0: // server_name
			var list cryptobyte.String
			if !data.ReadUint16LengthPrefixed(&list) || !data.Empty() {
				return Hello{}, errors.New("malformed server_name")
			}
			for !list.Empty() {
				var kind uint8
				var name cryptobyte.String
				if !list.ReadUint8(&kind) || !list.ReadUint16LengthPrefixed(&name) {
					return Hello{}, errors.New("malformed server_name")
				}
				if kind != 0 {
					continue
				}
				if h.SNI != "" {
					return Hello{}, errors.New("ClientHello names two servers")
				}
				if len(name) == 0 || bytes.IndexByte(name, 0) >= 0 {
					return Hello{}, errors.New("malformed server_name")
				}
				h.SNI = string(name)
			}
		case 16: // application_layer_protocol_negotiation
			var list cryptobyte.String
			if !data.ReadUint16LengthPrefixed(&list) {
				return Hello{}, errors.New("malformed ALPN")
			}
			for !list.Empty() {
				var p cryptobyte.String
				if !list.ReadUint8LengthPrefixed(&p) || len(p) == 0 {
					return Hello{}, errors.New("malformed ALPN")
				}
				h.ALPN = append(h.ALPN, string(p))
			}
		case 0xfe0d: // encrypted_client_hello
			h.ECH = true
		}
	}
	return h, nil
}

// Head is what the proxy learns from the head of an HTTP/1.x request.
type Head struct {
	Method string
	Target string // as sent: origin-form path or absolute-form URL
	Host   string // from the Host header, or the absolute-form target; port removed
}

// parseHTTPHead reads an HTTP/1.x request head. It returns errNeedMore until
// the blank line that ends the head has arrived, and errNotHTTP for bytes
// that are not a request. Two Host headers, a Host that disagrees with an
// absolute-form target, or obsolete line folding are errors: a proxy and a
// server could read them differently.
func parseHTTPHead(b []byte) (Head, error) {
	// The request line must look like one as soon as it starts, so that
	// other protocols are told apart without waiting for a blank line:
	// methods are upper-case letters (GET, POST, PROPFIND), at most 16.
	i := 0
	for i < len(b) && i < 17 && 'A' <= b[i] && b[i] <= 'Z' {
		i++
	}
	switch {
	case i == len(b) && i <= 16:
		return Head{}, errNeedMore // an upper-case word so far: maybe a method
	case i == 0 || i > 16 || b[i] != ' ':
		return Head{}, errNotHTTP
	}
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) >= MaxPeek {
			return Head{}, fmt.Errorf("HTTP request head longer than %d bytes", MaxPeek)
		}
		return Head{}, errNeedMore
	}
	lines := strings.Split(string(b[:end]), "\r\n")
	parts := strings.Split(lines[0], " ")
	if len(parts) != 3 || !strings.HasPrefix(parts[2], "HTTP/1.") || parts[1] == "" {
		return Head{}, errNotHTTP
	}
	h := Head{Method: parts[0], Target: parts[1]}
	var hosts []string
	for _, l := range lines[1:] {
		if l == "" || l[0] == ' ' || l[0] == '\t' {
			return Head{}, errors.New("malformed HTTP header (obsolete line folding)")
		}
		k, v, ok := strings.Cut(l, ":")
		if !ok || k == "" || !isToken([]byte(k)) {
			return Head{}, fmt.Errorf("malformed HTTP header %q", truncate(l, 40))
		}
		if strings.EqualFold(k, "Host") {
			hosts = append(hosts, strings.TrimSpace(v))
		}
	}
	if len(hosts) > 1 {
		return Head{}, errors.New("two Host headers")
	}
	if len(hosts) == 1 {
		h.Host = stripPort(hosts[0])
	}
	if rest, ok := cutScheme(h.Target); ok {
		authority, _, _ := strings.Cut(rest, "/")
		if i := strings.LastIndexByte(authority, '@'); i >= 0 {
			return Head{}, errors.New("userinfo in the request target")
		}
		th := stripPort(authority)
		if h.Host != "" && !strings.EqualFold(h.Host, th) {
			return Head{}, errors.New("Host header and request target name different hosts")
		}
		h.Host = th
	}
	return h, nil
}

func cutScheme(target string) (string, bool) {
	for _, s := range []string{"http://", "https://"} {
		if len(target) > len(s) && strings.EqualFold(target[:len(s)], s) {
			return target[len(s):], true
		}
	}
	return "", false
}

func stripPort(hostport string) string {
	if strings.HasPrefix(hostport, "[") {
		if i := strings.IndexByte(hostport, ']'); i > 0 {
			return hostport[:i+1]
		}
		return hostport
	}
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 && strings.Count(hostport, ":") == 1 {
		return hostport[:i]
	}
	return hostport
}

func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
