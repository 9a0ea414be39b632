package tproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/airlockhq/airlock/policy"
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
// errNotTLS when the first byte is not that of a TLS record. Bytes that
// start like TLS are read strictly, because a server may act on a first
// flight the proxy could not read (design §8, invariant 11): the first
// record must be a handshake record of version 3.1 to 3.3, the handshake
// may span several such records and must end where a record ends, and the
// message must be a ClientHello.
func parseClientHello(b []byte) (Hello, error) {
	if len(b) == 0 {
		return Hello{}, errNeedMore
	}
	if !tlsShaped(b[0]) {
		return Hello{}, errNotTLS
	}
	// Reassemble the handshake bytes from consecutive records.
	var hs []byte
	declared := 0 // handshake bytes the records so far announce
	for rest := b; ; {
		if len(rest) < 5 {
			if len(rest) > 0 && rest[0] != 0x16 {
				return Hello{}, fmt.Errorf("a TLS record of type %d before the ClientHello was whole", rest[0])
			}
			return Hello{}, errNeedMore
		}
		if rest[0] != 0x16 {
			return Hello{}, fmt.Errorf("a TLS record of type %d where the ClientHello was expected", rest[0])
		}
		if rest[1] != 0x03 || rest[2] < 0x01 || rest[2] > 0x03 {
			return Hello{}, fmt.Errorf("TLS record version %d.%d; clients send 3.1 to 3.3", rest[1], rest[2])
		}
		n := int(rest[3])<<8 | int(rest[4])
		if n == 0 || n > 1<<14 {
			return Hello{}, fmt.Errorf("TLS handshake record of %d bytes", n)
		}
		declared += n
		whole := len(rest) >= 5+n
		if whole {
			hs = append(hs, rest[5:5+n]...)
		} else {
			hs = append(hs, rest[5:]...)
		}
		h, size, err := parseHandshake(hs)
		if err == nil && size != declared {
			// A server would read what follows the hello in its records
			// as another handshake message.
			return Hello{}, fmt.Errorf("%d bytes after the ClientHello in its TLS record", declared-size)
		}
		if err != errNeedMore {
			return h, err
		}
		if !whole {
			return Hello{}, errNeedMore
		}
		rest = rest[5+n:]
	}
}

// tlsShaped reports a first byte that a TLS server takes for the type of a
// record: change_cipher_spec, alert, handshake, application_data or
// heartbeat.
func tlsShaped(b byte) bool { return 0x14 <= b && b <= 0x18 }

// parseHandshake reads the ClientHello at the start of hs and returns it
// with its size, header included.
func parseHandshake(hs []byte) (Hello, int, error) {
	if len(hs) < 4 {
		return Hello{}, 0, errNeedMore
	}
	if hs[0] != 1 { // client_hello
		return Hello{}, 0, fmt.Errorf("TLS handshake message of type %d where the ClientHello was expected", hs[0])
	}
	n := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
	if n > MaxPeek {
		return Hello{}, 0, fmt.Errorf("ClientHello of %d bytes is larger than %d", n, MaxPeek)
	}
	if len(hs) < 4+n {
		return Hello{}, 0, errNeedMore
	}
	h, err := parseHelloBody(hs[4 : 4+n])
	return h, 4 + n, err
}

func parseHelloBody(body []byte) (Hello, error) {
	s := cryptobyte.String(body)
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
	if version < 0x0301 || version > 0x0303 {
		return Hello{}, fmt.Errorf("ClientHello of version %#04x; clients send 0x0301 to 0x0303", version)
	}
	var h Hello
	if s.Empty() {
		return h, nil // no extensions
	}
	if !s.ReadUint16LengthPrefixed(&exts) || !s.Empty() {
		return Hello{}, errors.New("malformed ClientHello extensions")
	}
	var seen extSet
	for !exts.Empty() {
		var typ uint16
		var data cryptobyte.String
		if !exts.ReadUint16(&typ) || !exts.ReadUint16LengthPrefixed(&data) {
			return Hello{}, errors.New("malformed ClientHello extension")
		}
		if !seen.add(typ) {
			return Hello{}, fmt.Errorf("ClientHello repeats extension %d", typ)
		}
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

// extSet is a set of TLS extension types. The few dozen a ClientHello
// carries are kept in an array; a map takes those beyond, so that a hello
// made of thousands of extensions costs no more than a map.
type extSet struct {
	few  [48]uint16
	n    int
	many map[uint16]bool
}

// add adds typ and reports whether it was not in the set.
func (s *extSet) add(typ uint16) bool {
	for _, t := range s.few[:s.n] {
		if t == typ {
			return false
		}
	}
	if s.n < len(s.few) {
		s.few[s.n] = typ
		s.n++
		return true
	}
	if s.many[typ] {
		return false
	}
	if s.many == nil {
		s.many = map[uint16]bool{}
	}
	s.many[typ] = true
	return true
}

// Head is what the proxy learns from the head of an HTTP/1.x request.
type Head struct {
	Method string
	Target string // as sent: origin-form path or absolute-form URL
	Host   string // from the Host header, or the absolute-form target; port removed
}

// h2cPreface starts an HTTP/2 connection with prior knowledge (RFC 9113
// §3.4).
const h2cPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// parseH2CPreface reports whether b starts with the HTTP/2 preface; it
// returns errNeedMore while b is a shorter part of it.
func parseH2CPreface(b []byte) (bool, error) {
	if len(b) < len(h2cPreface) {
		if string(b) == h2cPreface[:len(b)] {
			return false, errNeedMore
		}
		return false, nil
	}
	return string(b[:len(h2cPreface)]) == h2cPreface, nil
}

// httpShaped reports whether b starts like an HTTP/1.x request under the
// most lenient reading a server makes of one (design §8, invariant 10),
// so that bytes a server could act on as a request are never carried as
// another protocol. After any white space and empty lines (RFC 9112 §2.2
// lets a server skip empty lines; Python's http.server skips white space),
// a whole first line is one if a word after its first starts with "HTTP/"
// (any case), whatever the first (Werkzeug hands any word to the
// application as the method, a byte-order mark or control bytes
// included), or if it is "GET" and one more word (HTTP/0.9, which Python
// and nginx take for GET only). White space is any byte a server may
// split the line on (isLaxSpace); the line ends at LF. Bytes shaped so
// are then read strictly (parseHTTPHead).
//
// Before its line end has come, a line is waited for (more) only while it
// reads as a method of visible ASCII, white space and words without
// control bytes: other protocols (git's pkt-lines, binary ones) send no
// line end and wait for an answer. So a request line whose method holds
// other bytes, or whose words hold control bytes, and that a client sends
// in pieces, pausing before its end, is carried (docs/security.md says so).
func httpShaped(b []byte) (shaped, more bool) {
	i := 0
	for i < len(b) && (isLaxSpace(b[i]) || b[i] == '\n') {
		i++
	}
	if i == len(b) {
		return false, true // blanks so far
	}
	line := b[i:]
	if end := bytes.IndexByte(line, '\n'); end >= 0 {
		return requestLine(line[:end]), false
	}
	// Not whole: wait only for what reads as a request line so far.
	m := 0
	for m < len(line) && '!' <= line[m] && line[m] <= '~' {
		m++
	}
	switch {
	case m == len(line):
		return false, true // a method so far
	case m == 0, !isLaxSpace(line[m]):
		return false, false
	}
	for _, c := range line[m:] {
		if c < ' ' && !isLaxSpace(c) || c == 0x7f {
			return false, false
		}
	}
	if requestLine(line) {
		return true, false // a version word already: HTTP whatever follows
	}
	return false, true
}

// requestLine reports whether a first line (without its LF) is a request
// line under the most lenient reading: a word after the first that starts
// with "HTTP/", or "GET" and one more word.
func requestLine(line []byte) bool {
	words := 0
	first := []byte(nil)
	for i := 0; i < len(line); {
		for i < len(line) && isLaxSpace(line[i]) {
			i++
		}
		if i == len(line) {
			break
		}
		w := i
		for i < len(line) && !isLaxSpace(line[i]) {
			i++
		}
		word := line[w:i]
		if words++; words == 1 {
			first = word
			continue
		}
		if len(word) >= 5 && strings.EqualFold(string(word[:5]), "HTTP/") {
			return true
		}
	}
	return words == 2 && string(first) == "GET"
}

// isLaxSpace reports a byte some server splits a request line on: SP and
// HTAB (RFC 9112), VT, FF and a bare CR (which RFC 9112 §3 lets a server
// take for white space too), and what Python's str.split() takes for white
// space in a Latin-1 line (0x1c-0x1f, 0x85, 0xa0). LF, which ends the
// line, is not one.
func isLaxSpace(c byte) bool {
	switch c {
	case ' ', '\t', '\v', '\f', '\r', 0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0:
		return true
	}
	return false
}

// parseHTTPHead reads an HTTP/1.x request head. It returns errNeedMore until
// the blank line that ends the head has arrived, and errNotHTTP for bytes
// that do not start like a request (httpShaped). Bytes that do are read
// strictly: the request line is METHOD SP TARGET SP HTTP/1.0 or HTTP/1.1
// with any method token, every line ends in CRLF, header names are tokens
// followed at once by ":", values hold no control bytes. Two Host headers,
// a Host that disagrees with an absolute-form target, or obsolete line
// folding are errors too: a proxy and a server could read them differently.
// A bad request line is an error as soon as its line end has arrived.
func parseHTTPHead(b []byte) (Head, error) {
	shaped, more := httpShaped(b)
	if more {
		if len(b) >= MaxPeek {
			return Head{}, fmt.Errorf("HTTP request line longer than %d bytes", MaxPeek)
		}
		return Head{}, errNeedMore
	}
	if !shaped {
		return Head{}, errNotHTTP
	}
	if isLaxSpace(b[0]) || b[0] == '\n' {
		return Head{}, errors.New("malformed HTTP request: white space or empty lines before the request line")
	}
	end := bytes.Index(b, []byte("\r\n\r\n"))
	head := b
	if end >= 0 {
		head = b[:end+2]
	}
	for i, c := range head {
		switch {
		case c == '\n' && (i == 0 || head[i-1] != '\r'):
			return Head{}, errors.New("malformed HTTP request: a line ends in LF without CR")
		case c == '\r' && i+1 < len(head) && head[i+1] != '\n':
			return Head{}, errors.New("malformed HTTP request: a CR not followed by LF")
		case c < ' ' && c != '\t' && c != '\r' && c != '\n', c == 0x7f:
			return Head{}, fmt.Errorf("malformed HTTP request: control byte %#x", c)
		}
	}
	lineEnd := bytes.Index(head, []byte("\r\n"))
	if lineEnd < 0 { // shaped by a version before the line end
		if len(b) >= MaxPeek {
			return Head{}, fmt.Errorf("HTTP request line longer than %d bytes", MaxPeek)
		}
		return Head{}, errNeedMore
	}
	line := string(b[:lineEnd])
	parts := strings.Split(line, " ")
	if len(parts) != 3 || !isToken([]byte(parts[0])) || parts[1] == "" || parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0" {
		return Head{}, fmt.Errorf("malformed HTTP request line %q: want METHOD SP TARGET SP HTTP/1.1", truncate(line, 60))
	}
	for _, c := range []byte(parts[1]) {
		if c <= ' ' || c >= 0x7f {
			return Head{}, errors.New("malformed HTTP request target")
		}
	}
	if end < 0 {
		if len(b) >= MaxPeek {
			return Head{}, fmt.Errorf("HTTP request head longer than %d bytes", MaxPeek)
		}
		return Head{}, errNeedMore
	}
	var lines []string
	if end > lineEnd {
		lines = strings.Split(string(b[lineEnd+2:end]), "\r\n")
	}
	h := Head{Method: parts[0], Target: parts[1]}
	var hosts []string
	for _, l := range lines {
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
		if !isTChar(c) {
			return false
		}
	}
	return true
}

// isTChar reports a byte of an RFC 9110 token (a method, a header name).
func isTChar(c byte) bool {
	return c > ' ' && c < 0x7f && strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) < 0
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// peek reads the client's first bytes until they are a whole ClientHello or
// HTTP request head, are neither, or MaxPeek is reached. With optional set,
// a client that sends nothing within wait is fine (a server-first protocol);
// otherwise silence is an error.
// errClientSilent is peek's error for a client that sent nothing in time;
// errClientClosed for one that ended its side without sending anything.
var (
	errClientSilent = errors.New("client sent nothing")
	errClientClosed = errors.New("client closed before sending anything")
)

func (p *Proxy) peek(c *conn, wait time.Duration, optional bool) error {
	bp, _ := p.peekBufs.Get().(*[]byte)
	if bp == nil {
		b := make([]byte, MaxPeek)
		bp = &b
	}
	defer p.peekBufs.Put(bp)
	buf := *bp
	n := 0
	// Whatever the outcome, the connection keeps the bytes read, and not
	// the pooled buffer (deferred calls run last first: before the Put).
	defer func() { c.peeked = bytes.Clone(buf[:n]) }()
	deadline := time.Now().Add(wait)
	extended := false
	for {
		c.client.SetReadDeadline(deadline)
		m, err := c.client.Read(buf[n:])
		n += m
		if n > 0 {
			done, err := c.classify(buf[:n])
			if err != nil {
				return err
			}
			if done {
				break
			}
			if n == len(buf) {
				return fmt.Errorf("no complete ClientHello or HTTP head in %d bytes", n)
			}
			// The first bytes arrived: give the rest the full peek time,
			// once. Later bytes never extend it, so a client dribbling a
			// byte at a time is still cut off.
			if !extended {
				deadline, extended = time.Now().Add(p.cfg.PeekTimeout), true
			}
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if n == 0 && optional {
					c.silent = true
					break
				}
				if n == 0 {
					return fmt.Errorf("%w within %s", errClientSilent, wait)
				}
				return fmt.Errorf("client stalled after %d bytes", n)
			}
			if n == 0 && errors.Is(err, io.EOF) {
				return errClientClosed
			}
			if n == 0 {
				return fmt.Errorf("client broke off before sending anything: %v", err)
			}
			return fmt.Errorf("client closed after %d bytes", n)
		}
	}
	c.client.SetReadDeadline(time.Time{})
	return nil
}

// classify reads the client's first bytes as a TLS ClientHello, the HTTP/2
// preface, an HTTP/1.x request head or another protocol, and reports
// whether they are whole. Bytes that start like TLS or HTTP must be read to
// the end: a server may act on what the proxy could not read, so a
// malformed one is an error, never "another protocol" (design §8,
// invariants 10 and 11). A PROXY protocol header is refused whatever
// follows it.
func (c *conn) classify(b []byte) (bool, error) {
	switch proxy, more := proxyShaped(b); {
	case more:
		return false, nil
	case proxy:
		return false, errors.New("a PROXY protocol header: a server that accepts one would take the connection for another client's and read a request after it that airlock has not read")
	}
	if tlsShaped(b[0]) {
		h, err := parseClientHello(b)
		switch {
		case err == errNeedMore:
			return false, nil
		case err != nil:
			return false, fmt.Errorf("bad TLS first flight: %v", err)
		}
		c.hello = &h
		return true, nil
	}
	if b[0]&0x80 != 0 {
		// An SSL 2 record header, maybe: its third byte says.
		if len(b) < 3 {
			return false, nil
		}
		if b[2] == 1 {
			return false, errors.New("bad TLS first flight: an SSL 2 ClientHello")
		}
	}
	switch h2c, err := parseH2CPreface(b); {
	case err == errNeedMore:
		return false, nil
	case h2c:
		c.h2c = true
		return true, nil
	}
	hd, err := parseHTTPHead(b)
	switch {
	case err == errNeedMore:
		return false, nil
	case errors.Is(err, errNotHTTP):
		return true, nil // another protocol: no name in it
	case err != nil:
		return false, fmt.Errorf("bad HTTP request: %v", err)
	}
	c.head = &hd
	return true, nil
}

// proxyV2Sig starts a PROXY protocol version 2 header.
const proxyV2Sig = "\r\n\r\n\x00\r\nQUIT\n"

// proxyShaped reports whether b starts with a PROXY protocol header:
// version 1 ("PROXY" and white space) or version 2 (its signature). more
// is set while b is a shorter part of one.
func proxyShaped(b []byte) (shaped, more bool) {
	for _, sig := range []string{"PROXY", proxyV2Sig} {
		n := min(len(b), len(sig))
		switch {
		case string(b[:n]) != sig[:n]:
			continue
		case n < len(sig):
			return false, true
		case sig == proxyV2Sig:
			return true, false
		case len(b) == n:
			return false, true
		}
		return isLaxSpace(b[n]), false
	}
	return false, false
}

// readable reports whether the first bytes were read as TLS or HTTP.
func (c *conn) readable() bool { return c.hello != nil || c.head != nil || c.h2c }

// claimedName is the name the client's first bytes ask for: the SNI, or
// the HTTP Host.
func (c *conn) claimedName() string {
	switch {
	case c.hello != nil:
		return c.hello.SNI
	case c.head != nil:
		return c.head.Host
	}
	return ""
}

// fronting says why the name the client's bytes claim (SNI or Host), if
// any, is not name, the one its connection was resolved for: asking for
// another host there is an attempt to reach it (domain fronting).
func (c *conn) fronting(name string) error {
	if claimed := c.claimedName(); claimed != "" {
		if n, err := policy.NormalizeHost(claimed); err != nil || n != name {
			return fmt.Errorf("the connection was resolved for %s but asks for %s", name, claimed)
		}
	}
	return nil
}

// isWebPort reports a port where clients speak first, and speak HTTP or
// TLS.
func isWebPort(port uint16) bool {
	switch port {
	case 80, 443, 8080, 8443:
		return true
	}
	return false
}

// sniffWindow is SniffTimeout, or ten times it on a port where the client
// always speaks first.
func (p *Proxy) sniffWindow(port uint16) time.Duration {
	if isWebPort(port) {
		return 10 * p.cfg.SniffTimeout
	}
	return p.cfg.SniffTimeout
}
