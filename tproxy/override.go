package tproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// Method overrides: a request that tells the server to treat it as
// another method (Rails, Laravel, Symfony, Express's method-override and
// many API gateways honour one) is decided as that method too, and the
// stricter answer stands (design §5.4). A server takes an override from
// a header, from the "_method" parameter of the query, or from the
// "_method" field of a form, multipart or JSON body; all are read here,
// in every spelling some server would take as the same name, and what
// servers could read differently is refused.

// methodOverrides are the headers with which clients tell servers to treat
// a request as another method (in canonical form, as a header map holds
// them).
var methodOverrides = []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// pathOverrides are the headers with which front proxies tell servers to
// route a request to another path than its own (IIS URL Rewrite, Symfony
// before 3.4.14, Zend/Laminas read X-Original-URL and X-Rewrite-URL; the
// widely copied Flask "ReverseProxied" middleware cuts X-Script-Name off
// the path). No
// client has a use for them, and the path decided is the request's own:
// they are dropped, in every spelling (case, "_" for "-").
var pathOverrides = []string{"X-Original-Url", "X-Original-Uri", "X-Original-Path", "X-Rewrite-Url", "X-Forwarded-Uri", "X-Forwarded-Path",
	"X-Forwarded-Prefix", "X-Script-Name", "X-Forwarded-Script-Name", "X-Envoy-Original-Path"}

// dropPathOverrides removes a request's path-override headers.
func dropPathOverrides(h http.Header) {
	for k := range h {
		if namedAs(k, pathOverrides...) {
			delete(h, k)
		}
	}
}

// namedAs reports whether header key k is one of names in a spelling some
// server takes as it: any case, and "_" for "-" (servers that read headers
// as CGI variables).
func namedAs(k string, names ...string) bool {
	k = strings.ReplaceAll(k, "_", "-")
	return slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(n, k) })
}

const (
	// maxOverride is the longest override value taken: no method is
	// longer, and a longer one is refused rather than cut.
	maxOverride = 64
	// maxOverrides is how many override values one request may carry.
	maxOverrides = 16
)

// errOverride is wrapped by every refusal of an override that cannot be
// read to its end (too long, too many, a form airlock cannot frame).
var errOverride = errors.New("method override")

// overrideMethods returns the methods a request's override headers name,
// upper-cased: every value of each, and every item of a comma-separated
// value. A header named with "_" for "-" counts too. As in the query and
// the body, an item of over maxOverride bytes, or more than maxOverrides
// methods, is an error: each method costs decisions.
func overrideMethods(h http.Header) ([]string, error) {
	var out []string
	for k, vv := range h {
		if !namedAs(k, methodOverrides...) {
			continue
		}
		for _, v := range vv {
			for item := range strings.SplitSeq(v, ",") {
				if len(item) > maxOverride {
					return nil, fmt.Errorf("%w header %s of over %d bytes", errOverride, k, maxOverride)
				}
				if out = appendMethods(out, item); len(out) > maxOverrides {
					return nil, fmt.Errorf("%w headers: more than %d methods", errOverride, maxOverrides)
				}
			}
		}
	}
	return out, nil
}

// appendMethods appends the methods an override value names: each item of
// a comma-separated value, trimmed and upper-cased, and cut at a NUL (as C
// strings end) as well as whole.
func appendMethods(out []string, v string) []string {
	for _, m := range strings.Split(v, ",") {
		m = strings.ToUpper(strings.TrimSpace(m))
		if m != "" && !slices.Contains(out, m) {
			out = append(out, m)
		}
		if i := strings.IndexByte(m, 0); i >= 0 {
			out = appendMethods(out, m[:i])
		}
	}
	return out
}

// queryOverrides returns the methods the "_method" parameters of a query
// name.
func queryOverrides(query string) ([]string, error) {
	s := multiScan{&formScan{}, &qsScan{}}
	s.Write([]byte(query))
	return s.finish()
}

// qsScan reads a form as qs does (Express's extended form and query
// parser): pairs split at "&" only, and a pair's key ends at its first
// "]=" if it has one ("[_method]x=]=DELETE" is _method=DELETE), else at
// its first "=". A pair is read whole up to maxQSPair bytes; a longer one
// that spells "method" (as written or percent-decoded) is refused.
type qsScan struct {
	pair  []byte
	long  bool
	watch methodWatch
	overrides
}

var qsBrackets = regexp.MustCompile(`%5[BbDd]`)

// maxQSPair bounds the pair a qsScan reads whole.
const maxQSPair = 4 << 10

func (s *qsScan) Write(p []byte) (int, error) {
	for len(p) > 0 && s.err == nil {
		i := bytes.IndexByte(p, '&')
		piece := p
		if i >= 0 {
			piece = p[:i]
		}
		n := min(max(0, maxQSPair-len(s.pair)), len(piece))
		s.pair = append(s.pair, piece[:n]...)
		if len(piece) > n && !s.long {
			// Past the bound: watched from the pair's start, in order.
			s.long = true
			for _, c := range s.pair {
				s.watch.add(c)
			}
		}
		if s.long {
			for _, c := range piece[n:] {
				s.watch.add(c)
			}
		}
		if i < 0 {
			break
		}
		s.endPair()
		p = p[i+1:]
	}
	return len(p), s.err
}

// endPair reads a pair as qs does.
func (s *qsScan) endPair() {
	pair := s.pair
	switch {
	case s.long:
		if s.watch.seen {
			s.err = fmt.Errorf("%w: a form pair of over %d bytes that spells \"method\"", errOverride, maxQSPair)
		}
	default:
		// qs reads %5B and %5D as brackets before anything else.
		pair = qsBrackets.ReplaceAllFunc(pair, func(b []byte) []byte {
			if b[2] == 'B' || b[2] == 'b' {
				return []byte("[")
			}
			return []byte("]")
		})
		key, value := pair, []byte(nil)
		if i := bytes.Index(pair, []byte("]=")); i >= 0 {
			key, value = pair[:i+1], pair[i+2:]
		} else if i := bytes.IndexByte(pair, '='); i >= 0 {
			key, value = pair[:i], pair[i+1:]
		}
		k := strings.ReplaceAll(string(key), "+", " ")
		if isOverrideName(k) || isOverrideName(pctDecode(k)) {
			// qs decodes a value whole, or leaves it as it is where
			// decodeURIComponent fails.
			v := strings.ReplaceAll(string(value), "+", " ")
			d := pctDecode(v)
			s.note([]byte(d), len(d) > maxOverride)
			if d != v && (strings.Count(v, "%") != (len(v)-len(d))/2 || !utf8.ValidString(d)) && s.err == nil {
				s.note([]byte(v), len(v) > maxOverride)
			}
		}
	}
	s.pair, s.long, s.watch = s.pair[:0], false, methodWatch{}
}

func (s *qsScan) finish() ([]string, error) {
	if s.err == nil && (len(s.pair) > 0 || s.long) {
		s.endPair()
	}
	return s.methods, s.err
}

// methodWatch watches a stream for "method" in any case, as written or
// percent-decoded.
type methodWatch struct {
	raw, dec uint64 // the last bytes, lower-cased, one per byte
	unesc    unescaper
	seen     bool
}

func (w *methodWatch) add(c byte) {
	w.raw = w.push(w.raw, c)
	var buf [3]byte
	for _, d := range w.unesc.feed(buf[:0], c) {
		w.dec = w.push(w.dec, d)
	}
}

// methodBytes is "method", a byte per byte of a methodWatch's window.
const methodBytes = uint64('m')<<40 | uint64('e')<<32 | uint64('t')<<24 | uint64('h')<<16 | uint64('o')<<8 | uint64('d')

func (w *methodWatch) push(win uint64, c byte) uint64 {
	if 'A' <= c && c <= 'Z' {
		c += 'a' - 'A'
	}
	win = win<<8 | uint64(c)
	if win&(1<<48-1) == methodBytes {
		w.seen = true
	}
	return win
}

// isOverrideName reports whether some server would take a parameter,
// form field or JSON key of this (decoded) name for "_method" (or
// Salesforce's "_HttpMethod"), in any case: PHP cuts a name at a NUL,
// drops its leading spaces, reads "_method[...]" as "_method" and " " and
// "." as "_"; Rack 2 and qs drop brackets around a name ("[_method]",
// "_method]").
func isOverrideName(name string) bool {
	if i := strings.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	name = strings.TrimLeft(name, " []")
	if i := strings.IndexAny(name, "[]"); i >= 0 {
		name = name[:i]
	}
	if len(name) != len("_method") && len(name) != len("_httpmethod") {
		return false
	}
	name = strings.NewReplacer(" ", "_", ".", "_").Replace(name)
	return strings.EqualFold(name, "_method") || strings.EqualFold(name, "_httpmethod")
}

// formScan reads an application/x-www-form-urlencoded stream (a query, or
// a form body written to it piece by piece) for its override fields.
// Pairs are split at "&" and ";" (servers differ), names and values
// decoded as servers decode them ("+" is a space, a bad escape stays as
// it is).
type formScan struct {
	name, value []byte
	inValue     bool
	long        bool // the value passed maxOverride
	// skip says nothing more of the pair can make it an override's: its
	// name is not, or as much of it as a decision needs is known not to be.
	skip  bool
	unesc unescaper
	overrides
}

func (s *formScan) Write(p []byte) (int, error) {
	for i := 0; i < len(p); i++ {
		if s.err != nil {
			return 0, s.err
		}
		if s.skip {
			// To the pair's end at once: a large body that is no form
			// (an upload without a type) passes at memory speed.
			j := bytes.IndexAny(p[i:], "&;")
			if j < 0 {
				break
			}
			i += j
		}
		c := p[i]
		switch {
		case c == '&' || c == ';':
			// Servers split pairs before they decode: a bad escape
			// ends with its pair.
			s.endPair()
		case c == '=' && !s.inValue:
			// Servers split a name from its value before they decode.
			s.flushEscape()
			s.inValue, s.skip = true, !isOverrideName(string(s.name))
		case s.unesc.open() || c == '%':
			var buf [3]byte
			s.emit(s.unesc.feed(buf[:0], c)...)
		case c == '+':
			s.emit(' ')
		default:
			s.emit(c)
		}
	}
	return len(p), s.err
}

// emit adds decoded bytes to the pair's name or value, keeping no more of
// either than a decision needs.
func (s *formScan) emit(bs ...byte) {
	if !s.inValue {
		for _, c := range bs {
			// What a server drops before a name does not count
			// towards its length; a longer name may still be
			// "_method[...]".
			if len(s.name) == 0 && (c == ' ' || c == '[' || c == ']') || len(s.name) >= maxOverride {
				continue
			}
			if s.name = append(s.name, c); len(s.name) == maxOverride {
				// What follows cannot change what the name is.
				s.skip = !isOverrideName(string(s.name))
			}
		}
		return
	}
	if len(s.value)+len(bs) > maxOverride {
		s.long = true
		return
	}
	s.value = append(s.value, bs...)
}

// endPair ends a name=value pair, noting its value if it overrides.
func (s *formScan) endPair() {
	s.flushEscape()
	if isOverrideName(string(s.name)) {
		s.note(s.value, s.long)
	}
	s.name, s.value, s.inValue, s.long, s.skip = s.name[:0], s.value[:0], false, false, false
}

// flushEscape emits an escape cut short as it came.
func (s *formScan) flushEscape() {
	if s.unesc.open() {
		var buf [2]byte
		s.emit(s.unesc.flush(buf[:0])...)
	}
}

// unescaper decodes %XX escapes a byte at a time, as a form's servers
// do: an escape cut short by a byte that is not a hex digit goes on as it
// came.
type unescaper struct {
	esc [3]byte
	n   int
}

func (u *unescaper) open() bool { return u.n > 0 }

// feed appends to out what c decodes to so far: nothing while an escape
// is open.
func (u *unescaper) feed(out []byte, c byte) []byte {
	switch {
	case u.n == 0 && c != '%':
		return append(out, c)
	case u.n > 0 && !isHex(c):
		out = append(out, u.esc[:u.n]...)
		u.n = 0
		return append(out, c)
	}
	u.esc[u.n] = c
	if u.n++; u.n < 3 {
		return out
	}
	u.n = 0
	return append(out, unhex(u.esc[1])<<4|unhex(u.esc[2]))
}

// flush appends an escape left open, as it came.
func (u *unescaper) flush(out []byte) []byte {
	out = append(out, u.esc[:u.n]...)
	u.n = 0
	return out
}

// overrides keeps the methods a scan has found, and its error.
type overrides struct {
	methods []string
	err     error
}

func (o *overrides) found() []string { return o.methods }

// note takes an override's value; one that is too long, or one too many,
// is an error.
func (o *overrides) note(v []byte, long bool) {
	if long {
		o.err = fmt.Errorf("%w of over %d bytes", errOverride, maxOverride)
		return
	}
	if o.methods = appendMethods(o.methods, string(v)); len(o.methods) > maxOverrides {
		o.err = fmt.Errorf("%w: more than %d", errOverride, maxOverrides)
	}
}

// finish ends the stream and returns the methods it names.
func (s *formScan) finish() ([]string, error) {
	if s.err == nil {
		s.endPair()
	}
	return s.methods, s.err
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// partScan reads a multipart body piece by piece for its override fields.
// Servers frame parts differently (Rack 2 finds "--boundary" after
// blanks or at the end of a line's text, PHP cuts long lines, Rack ends a
// part's head only at an empty CRLF line, Go at an LF one too), so it
// finds more than any of them: a delimiter is "--boundary" anywhere, a
// part's head runs from the line after it to the first empty CRLF line
// (at most maxPartHead bytes), and its value to the next delimiter. A head
// that mentions "method" in any case (as written, unescaped or
// percent-decoded) or names "_method" as Go or a lenient reading of its
// parameters sees it must be the plain head of a "_method" field, which
// every server reads alike: one Content-Disposition of form-data with only
// name="_method" and at most a Content-Type, on CRLF lines. Any other is
// refused, whatever its value: servers read such heads differently.
type partScan struct {
	delim []byte // "--" + boundary
	buf   []byte // bytes that may begin a delimiter
	state int
	head  []byte // the part's head so far
	// The part's value, if it is an override's.
	capture bool
	value   []byte
	vlong   bool
	overrides
}

// partScan's states.
const (
	inValue     = iota // before the first delimiter, or in a part's value
	inDelimLine        // on a delimiter's line, after the delimiter
	inHead             // in a part's head
)

// maxPartHead bounds a part's head: no client writes one this long.
const maxPartHead = 16 << 10

func newPartScan(boundary string) *partScan {
	return &partScan{delim: []byte("--" + boundary)}
}

func (s *partScan) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	s.buf = append(s.buf, p...)
	rest := s.take(s.buf, false)
	s.buf = append(s.buf[:0], rest...)
	return len(p), s.err
}

// take reads b and returns what it keeps back: the bytes that may begin a
// delimiter, unless b is the stream's last.
func (s *partScan) take(b []byte, last bool) []byte {
	for len(b) > 0 && s.err == nil {
		switch s.state {
		case inValue:
			i := bytes.Index(b, s.delim)
			if i < 0 {
				n := len(b)
				if !last {
					n = max(0, n-len(s.delim)+1)
				}
				s.addValue(b[:n])
				return b[n:]
			}
			s.addValue(b[:i])
			s.endPart()
			b = b[i+len(s.delim):]
			s.state = inDelimLine
		case inDelimLine:
			// "--", padding: a part's head begins on the next line.
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				return nil
			}
			b = b[i+1:]
			s.state, s.head = inHead, s.head[:0]
		case inHead:
			// The head ends at the first empty line, CRLF or LF (as
			// Go's reader ends it), which may have begun in the last
			// piece.
			from := len(s.head)
			n := min(len(b), maxPartHead-len(s.head))
			s.head = append(s.head, b[:n]...)
			end := headEnd(s.head, max(0, from-2))
			switch {
			case end >= 0:
				b = b[end-from:]
				s.head = s.head[:end]
				s.endHead(true)
			case len(s.head) < maxPartHead:
				return nil
			default:
				s.endHead(false)
			}
		}
	}
	return nil
}

// headEnd returns where the head in b ends, after its first empty line
// ("\n\n" or "\n\r\n"), looking from from on; or -1.
func headEnd(b []byte, from int) int {
	switch {
	case from > 0:
	case bytes.HasPrefix(b, []byte("\n")):
		return 1 // no header: the delimiter's line ended just before
	case bytes.HasPrefix(b, []byte("\r\n")):
		return 2
	}
	for i := from; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		switch {
		case i+1 < len(b) && b[i+1] == '\n':
			return i + 2
		case i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n':
			return i + 3
		}
	}
	return -1
}

// regularHead reports whether a part's head is written as every client
// writes one, and so read alike by every server: CRLF lines (no bare CR
// or LF: Go ends a head at an LF line, Rack only at a CRLF one), each a
// "Name: value" (PHP joins a line without a colon to the one before, Go
// a folded one), ending with an empty CRLF line; "name" not more often
// than a few parameters need.
func regularHead(head []byte) bool {
	if string(head) == "\r\n" {
		return true // no header at all
	}
	h, ok := bytes.CutSuffix(head, []byte("\r\n\r\n"))
	if !ok || bytes.Count(bytes.ToLower(head), []byte("name")) > 16 {
		return false
	}
	for line := range bytes.SplitSeq(h, []byte("\r\n")) {
		if bytes.ContainsAny(line, "\r\n") || len(line) == 0 || line[0] == ' ' || line[0] == '\t' || bytes.IndexByte(line, ':') <= 0 {
			return false
		}
	}
	return true
}

// endHead decides what a part's head makes of its value; complete says
// it ended with an empty line within maxPartHead bytes.
func (s *partScan) endHead(complete bool) {
	s.state = inValue
	s.capture, s.value, s.vlong = false, s.value[:0], false
	switch {
	case !complete:
		// No client writes such a head; a server may read on past the
		// bound, and find a name there.
		s.err = fmt.Errorf("%w: a form part's head of over %d bytes, or not ended by an empty line", errOverride, maxPartHead)
	case !regularHead(s.head):
		s.err = fmt.Errorf("%w: a form part's head not written as \"Name: value\" lines ending in CRLF", errOverride)
	case !mentionsMethod(s.head):
	default:
		name, plain := plainHead(s.head)
		if !plain {
			s.err = fmt.Errorf("%w: a form part's head names \"method\" in a way servers may read differently", errOverride)
			return
		}
		s.capture = isOverrideName(name)
	}
}

// mentionsMethod reports whether a part's head spells "method" in any
// case: as written, without its backslashes, percent-decoded, or both
// (whatever name some server reads as "_method" is spelt so in one of
// them), or in a name Go's parser joins from RFC 2231 pieces.
func mentionsMethod(head []byte) bool {
	h := strings.ToLower(string(head))
	unescaped := strings.ReplaceAll(h, "\\", "")
	for _, v := range []string{h, unescaped, pctDecode(h), pctDecode(unescaped)} {
		if strings.Contains(strings.ToLower(v), "method") {
			return true
		}
	}
	for line := range strings.SplitSeq(string(head), "\n") {
		if _, v, ok := strings.Cut(line, ":"); ok {
			if _, params, err := mime.ParseMediaType(v); err == nil && isOverrideName(params["name"]) {
				return true
			}
		}
	}
	return false
}

// plainHead returns the field name of a part's head that every server
// reads alike: CRLF lines, one Content-Disposition of form-data with a
// name and perhaps a filename, quoted, without escapes, and at most a
// Content-Type; nothing else.
func plainHead(head []byte) (name string, plain bool) {
	h, ok := strings.CutSuffix(string(head), "\r\n\r\n")
	if !ok {
		return "", false
	}
	disposition := false
	for line := range strings.SplitSeq(h, "\r\n") {
		key, value, ok := strings.Cut(line, ":")
		if !ok || strings.ContainsAny(line, "\r\n\\%*'") {
			return "", false
		}
		switch {
		case strings.EqualFold(key, "Content-Disposition") && !disposition:
			disposition = true
			d, params, err := mime.ParseMediaType(value)
			name = params["name"]
			_, file := params["filename"]
			if err != nil || d != "form-data" || name == "" || len(params) != 1 && !(len(params) == 2 && file) ||
				strings.Count(value, "name=") != len(params) || !strings.Contains(value, ` name="`+name+`"`) && !strings.Contains(value, `;name="`+name+`"`) {
				return "", false
			}
		case strings.EqualFold(key, "Content-Type"):
			// A value in another charset may be read as it says
			// (busboy decodes UTF-16).
			_, params, err := mime.ParseMediaType(value)
			if err != nil || len(params) > 1 || len(params) == 1 && !plainCharset(params["charset"]) {
				return "", false
			}
		default:
			return "", false
		}
	}
	return name, disposition
}

// plainCharset reports whether a charset reads ASCII as ASCII, every
// byte for itself.
func plainCharset(cs string) bool {
	return strings.EqualFold(cs, "utf-8") || strings.EqualFold(cs, "utf8") || strings.EqualFold(cs, "us-ascii")
}

// addValue adds bytes of a part's value, if it is an override's.
func (s *partScan) addValue(b []byte) {
	if !s.capture {
		return
	}
	if len(s.value)+len(b) > maxOverride+2 { // and a CRLF
		s.vlong = true
		return
	}
	s.value = append(s.value, b...)
}

// endPart ends a part's value at a delimiter (or the stream's end).
func (s *partScan) endPart() {
	if s.capture {
		v := bytes.TrimSuffix(s.value, []byte("\n"))
		s.note(bytes.TrimSuffix(v, []byte("\r")), s.vlong)
	}
	s.capture = false
}

// finish ends the stream and returns the methods it names.
func (s *partScan) finish() ([]string, error) {
	s.take(s.buf, true)
	s.buf = nil
	switch s.state {
	case inValue:
		s.endPart() // a part left open is read as far as it goes
	case inHead:
		if s.err == nil && mentionsMethod(s.head) {
			s.err = fmt.Errorf("%w: a form part's head names \"method\" and does not end", errOverride)
		}
	case inDelimLine:
		// A delimiter's line the body ends on: nothing follows.
	}
	return s.methods, s.err
}

// pctDecode decodes %XX escapes; a bad one stays as it is.
func pctDecode(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
			continue
		}
		b = append(b, s[i])
	}
	return string(b)
}

// overrideScanner reads a body, written to it piece by piece, for its
// override fields.
type overrideScanner interface {
	io.Writer
	// found returns the methods found so far: a value is found once the
	// bytes that end it have been written.
	found() []string
	// finish ends the body and returns every method it names.
	finish() ([]string, error)
}

// bodyScanner returns the scanner of r's body's override fields, or nil if
// no server would read one from it: a form (application/x-www-form-urlencoded,
// or no type at all, which Rack reads as a form), a multipart body, or
// JSON (a type that says "json" anywhere, as Laravel takes it). A body
// airlock cannot read as every such server would is an error.
func bodyScanner(r *http.Request) (overrideScanner, error) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, nil
	}
	types := r.Header["Content-Type"]
	if len(types) > 1 {
		return nil, fmt.Errorf("%w: a body with more than one Content-Type", errOverride)
	}
	ct := ""
	if len(types) == 1 {
		ct = types[0]
	}
	if strings.IndexFunc(ct, func(c rune) bool { return c != '\t' && (c < ' ' || c > '~') }) >= 0 {
		// Go trims Unicode blanks around a media type; others do not.
		return nil, fmt.Errorf("%w: a body whose Content-Type is not printable ASCII", errOverride)
	}
	// As Rack and PHP take a media type: up to the first ";", "," or
	// blank, in any case; and as Go's parser does.
	mt := strings.ToLower(strings.TrimLeft(ct, " \t"))
	if i := strings.IndexAny(mt, ";, \t"); i >= 0 {
		mt = mt[:i]
	}
	goMT, _, _ := mime.ParseMediaType(ct)
	var scans multiScan
	switch {
	case mt == "" || mt == "application/x-www-form-urlencoded" || goMT == "application/x-www-form-urlencoded":
		// Express's extended parser (qs) reads a form its own way too.
		scans = append(scans, &formScan{}, &qsScan{})
	case strings.HasPrefix(mt, "multipart/") || strings.HasPrefix(goMT, "multipart/"):
		b, err := multipartBoundary(ct)
		if err != nil {
			return nil, err
		}
		scans = append(scans, newPartScan(b))
	}
	if strings.Contains(strings.ToLower(ct), "json") {
		// JSON in another charset is read as it says (Express
		// decodes UTF-16 and UTF-7).
		lower := strings.ToLower(ct)
		if strings.Count(lower, "charset") > 1 || strings.Contains(lower, "charset") && !plainJSONCharset.MatchString(lower) {
			return nil, fmt.Errorf("%w: a JSON body in a charset other than UTF-8", errOverride)
		}
		scans = append(scans, &jsonScan{})
	}
	if len(scans) == 0 {
		return nil, nil
	}
	for _, ce := range r.Header.Values("Content-Encoding") {
		if ce = strings.TrimSpace(ce); ce != "" && !strings.EqualFold(ce, "identity") {
			return nil, fmt.Errorf("%w: a body with Content-Encoding %q cannot be read for one", errOverride, ce)
		}
	}
	if len(scans) == 1 {
		return scans[0], nil
	}
	return scans, nil
}

// plainJSONCharset is a (lower-cased) Content-Type's charset parameter
// of UTF-8.
var plainJSONCharset = regexp.MustCompile(`;[ \t]*charset[ \t]*=[ \t]*"?utf-?8"?[ \t]*(;|$)`)

// plainMultipart is the one form of a multipart Content-Type whose
// boundary Go, PHP and Rack all read alike: a boundary of RFC 2046's
// characters (no blank), quoted or not, and perhaps a charset.
var plainMultipart = regexp.MustCompile(`^(?i:multipart/[a-z0-9.+-]+)[ \t]*;[ \t]*(?i:boundary)=(?:"(` + bchars + `)"|(` + bchars + `))[ \t]*(?:;[ \t]*(?i:charset)=[A-Za-z0-9_-]+[ \t]*)?$`)

const bchars = `[0-9A-Za-z'()+_\-./:=?]{1,70}`

// multipartBoundary returns a multipart Content-Type's boundary, if it is
// written as plainMultipart says and names "boundary" once (Rack takes
// the last "boundary=" of the header, PHP the first "boundary").
func multipartBoundary(ct string) (string, error) {
	m := plainMultipart.FindStringSubmatch(ct)
	if m == nil || strings.Count(strings.ToLower(ct), "boundary") != 1 {
		return "", fmt.Errorf("%w: a multipart Content-Type must be \"multipart/TYPE; boundary=B\" with one boundary of 1 to 70 letters, digits and '()+_-./:=?", errOverride)
	}
	return m[1] + m[2], nil
}

// multiScan reads a body that servers could take for more than one kind
// (JSON, say, in a type that also names a form): every override any of
// them finds counts.
type multiScan []overrideScanner

func (m multiScan) Write(p []byte) (int, error) {
	for _, s := range m {
		if _, err := s.Write(p); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (m multiScan) found() []string {
	var out []string
	for _, s := range m {
		out = union(out, s.found())
	}
	return out
}

func (m multiScan) finish() ([]string, error) {
	var out []string
	for _, s := range m {
		methods, err := s.finish()
		if err != nil {
			return nil, err
		}
		out = union(out, methods)
	}
	return out, nil
}

// union appends to out the methods it does not hold yet.
func union(out, methods []string) []string {
	for _, m := range methods {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// jsonScan reads a JSON body piece by piece for the string values of its
// top-level "_method" keys (Laravel and Symfony read a JSON body's
// "_method"; so does Express's method-override as its README shows it).
// Keys are unescaped as a JSON parser does; a "_method" whose value is not
// a string (an array's first item counts in Express) is refused.
type jsonScan struct {
	depth    int
	object   bool // the top level is an object
	inString bool
	esc      int // 0, or the escape's bytes read so far ("\\" is 1, "\\u" 2 to 5)
	hex      rune
	str      []byte
	long     bool
	// At the top level: a key is next, a key has been read, its value is
	// next; match says the key is an override's.
	role  int
	match bool
	overrides
}

// jsonScan's roles at the top level.
const (
	jsonKey = iota
	jsonColon
	jsonValue
	jsonAfter
)

func (s *jsonScan) Write(p []byte) (int, error) {
	for i := 0; i < len(p); i++ {
		if s.err != nil {
			return 0, s.err
		}
		if s.inString && s.esc == 0 && s.depth != 1 {
			// A string below the top level: only its end matters.
			j := bytes.IndexAny(p[i:], "\"\\")
			if j < 0 {
				break
			}
			i += j
		}
		c := p[i]
		if s.inString {
			s.stringByte(c)
			continue
		}
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		if s.depth == 1 && s.object && s.role == jsonValue && s.match && c != '"' {
			s.err = fmt.Errorf("%w: a JSON \"_method\" whose value is not a string", errOverride)
			return 0, s.err
		}
		switch c {
		case '"':
			s.inString, s.str, s.long = true, s.str[:0], false
		case '{', '[':
			if s.depth == 0 && c == '{' {
				s.object, s.role = true, jsonKey
			}
			s.depth++
		case '}', ']':
			s.depth--
			if s.depth == 1 {
				s.role = jsonAfter
			}
		case ':':
			if s.depth == 1 && s.role == jsonColon {
				s.role = jsonValue
			}
		case ',':
			if s.depth == 1 {
				s.role, s.match = jsonKey, false
			}
		default:
			if s.depth == 1 && s.role == jsonValue {
				s.role = jsonAfter
			}
		}
	}
	return len(p), s.err
}

// stringByte reads a byte of a string, unescaping it.
func (s *jsonScan) stringByte(c byte) {
	switch {
	case s.esc == 1:
		s.esc = 0
		switch c {
		case 'u':
			s.esc, s.hex = 2, 0
		case 'b':
			s.add('\b')
		case 'f':
			s.add('\f')
		case 'n':
			s.add('\n')
		case 'r':
			s.add('\r')
		case 't':
			s.add('\t')
		default:
			s.add(c)
		}
	case s.esc >= 2:
		s.hex = s.hex<<4 | rune(unhex(c))
		if s.esc++; s.esc == 6 {
			s.esc = 0
			var b [4]byte
			for _, x := range b[:utf8.EncodeRune(b[:], s.hex)] {
				s.add(x)
			}
		}
	case c == '\\':
		s.esc = 1
	case c == '"':
		s.inString = false
		s.endString()
	default:
		s.add(c)
	}
}

func (s *jsonScan) add(c byte) {
	if len(s.str) >= maxOverride {
		s.long = true
		return
	}
	s.str = append(s.str, c)
}

// endString takes a string at the top level: a key, or a key's value.
func (s *jsonScan) endString() {
	if s.depth != 1 || !s.object {
		return
	}
	switch s.role {
	case jsonKey:
		s.role, s.match = jsonColon, !s.long && isOverrideName(string(s.str))
	case jsonValue:
		if s.match {
			s.note(s.str, s.long)
		}
		s.role = jsonAfter
	}
}

func (s *jsonScan) finish() ([]string, error) {
	return s.methods, s.err
}

// overrideRefusal ends a request body whose form names a method override
// that is not allowed.
type overrideRefusal struct {
	reason, rule string
	suggest      string // a pattern that would allow it
}

func (e *overrideRefusal) Error() string { return e.reason }

// overrideBody is a request body read for its form's override fields on
// its way upstream. Its last byte is held back until the whole body has
// been read and the overrides decided, so a server that reads a form to
// its end before acting on it (as Rack, PHP and Go do) never gets one
// whose override is refused: the body ends with the refusal instead.
type overrideBody struct {
	io.ReadCloser
	scan overrideScanner
	// decide returns the refusal of the methods a body names, if any.
	decide  func([]string) *overrideRefusal
	decided int // how many methods had been found when last decided
	held    byte
	holding bool
	ended   bool // read to its end and allowed
	err     error
	refused *overrideRefusal // set once, read after the exchange
	mu      sync.Mutex       // guards refused
}

func (b *overrideBody) Read(p []byte) (int, error) {
	switch {
	case b.err != nil:
		return 0, b.err
	case len(p) == 0:
		return 0, nil
	case b.ended:
		if !b.holding {
			return 0, io.EOF
		}
		p[0], b.holding = b.held, false
		return 1, io.EOF
	}
	n, err := b.ReadCloser.Read(p)
	out := 0
	if n > 0 {
		_, serr := b.scan.Write(p[:n])
		// A value whose end is in these bytes is decided before any of
		// them goes on: a server that reads a form as it comes (Go's
		// stops at a multipart form's close delimiter) never has it.
		if found := b.scan.found(); len(found) > b.decided {
			ref := b.decide(found)
			b.decided = len(found)
			if ref != nil {
				b.refuse(ref)
				return 0, b.err
			}
		}
		if serr != nil {
			b.refuse(&overrideRefusal{reason: serr.Error()})
			return 0, b.err
		}
		// Hold the last byte back, giving the one held before.
		last := p[n-1]
		if b.holding {
			copy(p[1:n], p[:n-1])
			p[0] = b.held
			out = n
		} else {
			out = n - 1
		}
		b.held, b.holding = last, true
	}
	switch {
	case err == io.EOF:
		methods, serr := b.scan.finish()
		if serr != nil {
			b.refuse(&overrideRefusal{reason: serr.Error()})
			return out, b.err
		}
		if ref := b.decide(methods); ref != nil {
			b.refuse(ref)
			return out, b.err
		}
		b.ended = true
		return out, nil
	case err != nil:
		b.err = err
	}
	return out, err
}

func (b *overrideBody) refuse(r *overrideRefusal) {
	b.mu.Lock()
	b.refused = r
	b.mu.Unlock()
	b.err = r
}

// refusal returns the refusal the body ended with, if any (none for a nil
// body: a request without an override scan).
func (b *overrideBody) refusal() *overrideRefusal {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refused
}
