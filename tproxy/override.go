package tproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Method overrides: a request that tells the server to treat it as
// another method (Rails, Laravel, Symfony, Express's method-override and
// many API gateways honour one) is decided as that method too, and the
// stricter answer stands (design §5.4). A server takes an override from
// a header, from the "_method" parameter of the query, or from the
// "_method" field of a form body; all three are read here, in every
// spelling a server would take as the same name.

// methodOverrides are the headers with which clients tell servers to treat
// a request as another method.
// (in canonical form, the form a header map holds them in).
var methodOverrides = []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

const (
	// maxOverride is the longest override value taken: no method is
	// longer, and a longer one is refused rather than cut.
	maxOverride = 64
	// maxOverrides is how many override values one request may carry.
	maxOverrides = 16
	// maxPartLine bounds a line of a multipart part's header section.
	maxPartLine = 8 << 10
	// maxNameSpelling is the longest a part's name can be and still be
	// "_method": escaped, quoted, with RFC 2231's charset and language.
	maxNameSpelling = 128
)

// errOverride is wrapped by every refusal of an override that cannot be
// read to its end (too long, too many, a form airlock cannot frame).
var errOverride = errors.New("method override")

// overrideMethods returns the methods a request's override headers name,
// upper-cased: every value of each, and every item of a comma-separated
// value. A header named with "_" for "-" counts too.
func overrideMethods(h http.Header) []string {
	var out []string
	for k, vv := range h {
		// Servers that read headers as CGI variables take "_" for "-".
		name := strings.ReplaceAll(k, "_", "-")
		if !slices.ContainsFunc(methodOverrides, func(o string) bool { return strings.EqualFold(o, name) }) {
			continue
		}
		for _, v := range vv {
			out = appendMethods(out, v)
		}
	}
	return out
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
	var s formScan
	s.Write([]byte(query))
	return s.finish()
}

// isOverrideName reports whether a server would take a parameter or form
// field of this (decoded) name for "_method": whatever the case; PHP
// drops leading spaces, cuts a name at a NUL, reads "_method[...]" as
// "_method" and turns " ", "." and an unclosed "[" into "_".
func isOverrideName(name string) bool {
	if i := strings.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	name = strings.TrimLeft(name, " ")
	if i := strings.IndexByte(name, '['); i >= 0 {
		if strings.IndexByte(name[i:], ']') >= 0 {
			name = name[:i]
		} else {
			name = name[:i] + "_" + name[i+1:]
		}
	}
	return len(name) == len("_method") && strings.EqualFold(strings.NewReplacer(" ", "_", ".", "_").Replace(name), "_method")
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
	esc         []byte
	methods     []string
	err         error
}

func (s *formScan) Write(p []byte) (int, error) {
	for _, c := range p {
		if s.err != nil {
			return 0, s.err
		}
		switch {
		case len(s.esc) > 0:
			s.esc = append(s.esc, c)
			if !isHex(c) {
				s.emit(s.esc...) // not an escape: as it came
				s.esc = s.esc[:0]
			} else if len(s.esc) == 3 {
				s.emit(unhex(s.esc[1])<<4 | unhex(s.esc[2]))
				s.esc = s.esc[:0]
			}
		case c == '&' || c == ';':
			s.endPair()
		case c == '=' && !s.inValue:
			s.inValue = true
		case c == '%':
			s.esc = append(s.esc, c)
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
		// A longer name may still be "_method[...]".
		if n := maxOverride - len(s.name); n > 0 {
			s.name = append(s.name, bs[:min(n, len(bs))]...)
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
	if len(s.esc) > 0 {
		esc := s.esc
		s.esc = nil
		s.emit(esc...)
	}
	if isOverrideName(string(s.name)) {
		s.note(s.value, s.long)
	}
	s.name, s.value, s.inValue, s.long = s.name[:0], s.value[:0], false, false
}

// note takes an override's value; one that is too long, or one too many,
// is an error.
func (s *formScan) note(v []byte, long bool) {
	if long {
		s.err = fmt.Errorf("%w of over %d bytes", errOverride, maxOverride)
		return
	}
	if s.methods = appendMethods(s.methods, string(v)); len(s.methods) > maxOverrides {
		s.err = fmt.Errorf("%w: more than %d", errOverride, maxOverrides)
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
// It finds more parts than any server would rather than fewer: a delimiter
// is "--boundary" at the start of any line (after "\n", not only after
// "\r\n"), followed by anything; the close delimiter does not end the
// search; and a part is an override if any name its Content-Disposition
// headers give, read by Go's parser or leniently (every name= and name*=,
// quoted or not), is "_method". A part's value ends at the next delimiter.
type partScan struct {
	delim []byte // "\n--" + boundary
	buf   []byte // bytes that may begin a delimiter
	state int
	// The line being read, and the header it belongs to (with its folded
	// lines); each long if it passed maxPartLine.
	line, header         []byte
	lineLong, headerLong bool
	// lineStart says a value begins at the start of a line: a delimiter
	// may begin at once.
	lineStart bool
	named     bool // a Content-Disposition of the part names "_method"
	// The part's value, if it is an override's.
	capture bool
	value   []byte
	vlong   bool
	form    formScan // keeps the methods, the bounds and the error
}

// partScan's states.
const (
	inValue     = iota // before the first delimiter, or in a part's value
	inDelimLine        // on a delimiter's line, after the delimiter
	inHeaders          // in a part's header section
)

func newPartScan(boundary string) *partScan {
	// The stream begins at the start of a line.
	return &partScan{delim: []byte("\n--" + boundary), buf: []byte("\n")}
}

func (s *partScan) Write(p []byte) (int, error) {
	if s.form.err != nil {
		return 0, s.form.err
	}
	s.buf = append(s.buf, p...)
	rest := s.take(s.buf, false)
	s.buf = append(s.buf[:0], rest...)
	return len(p), s.form.err
}

// take reads b and returns what it keeps back: the bytes that may begin a
// delimiter, unless b is the stream's last.
func (s *partScan) take(b []byte, last bool) []byte {
	for len(b) > 0 && s.form.err == nil {
		switch s.state {
		case inValue:
			if s.lineStart {
				dash := s.delim[1:] // "--" + boundary
				if n := min(len(b), len(dash)); !bytes.Equal(b[:n], dash[:n]) {
					s.lineStart = false
				} else if n < len(dash) {
					if last {
						return nil
					}
					return b // more may make it a delimiter
				} else {
					s.endPart()
					b = b[n:]
					s.state, s.lineStart = inDelimLine, false
					continue
				}
			}
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
			// "--", padding: a part's headers begin on the next line.
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				return nil
			}
			b = b[i+1:]
			s.state, s.line, s.header, s.lineLong, s.headerLong, s.named = inHeaders, s.line[:0], s.header[:0], false, false, false
		case inHeaders:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				s.line, s.lineLong = bounded(s.line, b, s.lineLong)
				return nil
			}
			s.line, s.lineLong = bounded(s.line, b[:i], s.lineLong)
			b = b[i+1:]
			s.endLine()
		}
	}
	return nil
}

// bounded appends b to buf up to maxPartLine bytes, and says whether
// anything was left out.
func bounded(buf, b []byte, long bool) ([]byte, bool) {
	if len(buf)+len(b) > maxPartLine {
		return append(buf, b[:max(0, maxPartLine-len(buf))]...), true
	}
	return append(buf, b...), long
}

// endLine ends a header line: a folded one continues the header, an empty
// one ends the part's headers, any other begins a header.
func (s *partScan) endLine() {
	line := bytes.TrimSuffix(s.line, []byte("\r"))
	switch {
	case len(line) == 0:
		s.endHeader()
		s.state, s.lineStart = inValue, true
		s.capture = s.named
		s.value, s.vlong = s.value[:0], false
	case line[0] == ' ' || line[0] == '\t':
		s.header, s.headerLong = bounded(s.header, line, s.headerLong || s.lineLong)
	default:
		s.endHeader()
		s.header, s.headerLong = bounded(s.header[:0], line, s.lineLong)
	}
	s.line, s.lineLong = s.line[:0], false
}

// endHeader takes the names a Content-Disposition header gives.
func (s *partScan) endHeader() {
	name, value, _ := bytes.Cut(s.header, []byte(":"))
	if strings.EqualFold(string(bytes.TrimSpace(name)), "Content-Disposition") {
		if s.headerLong {
			s.form.err = fmt.Errorf("%w: a form part's Content-Disposition of over %d bytes", errOverride, maxPartLine)
			return
		}
		s.named = s.named || namesOverride(string(value))
	}
	s.header, s.headerLong = s.header[:0], false
}

// addValue adds bytes of a part's value, if it is an override's.
func (s *partScan) addValue(b []byte) {
	if !s.capture {
		return
	}
	if len(s.value)+len(b) > maxOverride+1 { // and a "\r"
		s.vlong = true
		return
	}
	s.value = append(s.value, b...)
}

// endPart ends a part's value at a delimiter (or the stream's end).
func (s *partScan) endPart() {
	if s.capture {
		s.form.note(bytes.TrimSuffix(s.value, []byte("\r")), s.vlong)
	}
	s.capture = false
}

// finish ends the stream and returns the methods it names.
func (s *partScan) finish() ([]string, error) {
	s.take(s.buf, true)
	s.buf = nil
	if s.state == inValue {
		s.endPart() // a part left open is read as far as it goes
	}
	return s.form.methods, s.form.err
}

// namesOverride reports whether a Content-Disposition value names a form
// part "_method", as Go reads it or as any of its name= and name*=
// parameters reads leniently: quoted (with and without its escapes), a
// token, an RFC 2231 value after its charset and language, each also
// percent-decoded.
func namesOverride(v string) bool {
	if _, params, err := mime.ParseMediaType(v); err == nil && isOverrideName(params["name"]) {
		return true
	}
	for i := 0; i+4 <= len(v); i++ {
		if !strings.EqualFold(v[i:i+4], "name") || i > 0 && !strings.ContainsRune("; \t", rune(v[i-1])) {
			continue
		}
		j := i + 4
		ext := false
		for j < len(v) && (v[j] == '*' || '0' <= v[j] && v[j] <= '9') {
			ext = ext || v[j] == '*'
			j++
		}
		j = skipBlanks(v, j)
		if j == len(v) || v[j] != '=' {
			continue
		}
		j = skipBlanks(v, j+1)
		quoted := j < len(v) && v[j] == '"'
		if quoted {
			j++
		}
		for j < len(v) && v[j] == ' ' { // PHP drops leading spaces
			j++
		}
		// Enough of the value for any spelling of "_method": a longer
		// one is not it.
		seg := v[j:min(len(v), j+maxNameSpelling)]
		var raw []string
		if quoted {
			k := 0
			for k < len(seg) && seg[k] != '"' {
				if seg[k] == '\\' {
					k++
				}
				k++
			}
			q := seg[:min(k, len(seg))]
			raw = []string{q, unquote(q)}
		} else {
			t, _, _ := strings.Cut(seg, ";")
			raw = []string{strings.TrimSpace(t)}
		}
		for _, r := range raw {
			if ext {
				// charset'language'value
				if parts := strings.SplitN(r, "'", 3); len(parts) == 3 {
					r = parts[2]
				}
			}
			if isOverrideName(r) || isOverrideName(pctDecode(r)) {
				return true
			}
		}
	}
	return false
}

func skipBlanks(v string, i int) int {
	for i < len(v) && (v[i] == ' ' || v[i] == '\t') {
		i++
	}
	return i
}

// unquote takes the escapes of a quoted string's content away.
func unquote(q string) string {
	var b strings.Builder
	for i := 0; i < len(q); i++ {
		if q[i] == '\\' && i+1 < len(q) {
			i++
		}
		b.WriteByte(q[i])
	}
	return b.String()
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
	finish() ([]string, error)
}

// bodyScanner returns the scanner of r's body's override fields, or nil if
// no server would read the body as a form: one of
// application/x-www-form-urlencoded or multipart/*, or of no type at all
// (Rack reads a POST without one as a form). A form airlock cannot read
// as every such server would is an error.
func bodyScanner(r *http.Request) (overrideScanner, error) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, nil
	}
	types := r.Header["Content-Type"]
	form, multipart := false, false
	for _, ct := range types {
		// As Rack and PHP take a media type: up to the first ";", ","
		// or blank, in any case.
		mt := strings.ToLower(strings.TrimLeft(ct, " \t"))
		if i := strings.IndexAny(mt, ";, \t"); i >= 0 {
			mt = mt[:i]
		}
		form = form || mt == "application/x-www-form-urlencoded" || mt == ""
		multipart = multipart || strings.HasPrefix(mt, "multipart/")
	}
	switch {
	case !form && !multipart && len(types) > 0:
		return nil, nil
	case form && multipart:
		return nil, fmt.Errorf("%w: Content-Type headers that disagree on how to read a form", errOverride)
	}
	for _, ce := range r.Header.Values("Content-Encoding") {
		if ce = strings.TrimSpace(ce); ce != "" && !strings.EqualFold(ce, "identity") {
			return nil, fmt.Errorf("%w: a form body with Content-Encoding %q cannot be read for it", errOverride, ce)
		}
	}
	if !multipart {
		return &formScan{}, nil
	}
	// One boundary that every parser finds the same: Rack takes the last
	// "boundary=" with a regular expression, Go the parameter.
	if len(types) > 1 || strings.Count(strings.ToLower(types[0]), "boundary") != 1 {
		return nil, fmt.Errorf("%w: a multipart Content-Type must give one boundary", errOverride)
	}
	_, params, err := mime.ParseMediaType(types[0])
	b := params["boundary"]
	if err != nil || b == "" || len(b) > 70 || strings.IndexFunc(b, func(c rune) bool {
		return !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || strings.ContainsRune("'()+_-./:=?", c))
	}) >= 0 {
		return nil, fmt.Errorf("%w: a multipart boundary of other than 1 to 70 letters, digits and '()+_-./:=?", errOverride)
	}
	return newPartScan(b), nil
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
		if _, serr := b.scan.Write(p[:n]); serr != nil {
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

// refusal returns the refusal the body ended with, if any.
func (b *overrideBody) refusal() *overrideRefusal {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refused
}
