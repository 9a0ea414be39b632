package tproxy

// Spellings of "_method" that a server honouring it reads, found in
// review: each case names the server that reads it; each must be found
// (or the form refused).

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf16"
)

// scanAs runs the scanner bodyScanner picks for a POST of this
// Content-Type over body, in pieces of n bytes.
func scanAs(t *testing.T, ctype, body string, n int) ([]string, error, bool) {
	t.Helper()
	r, _ := http.NewRequest("POST", "https://a.test/", strings.NewReader(body))
	if ctype != "" {
		r.Header.Set("Content-Type", ctype)
	}
	s, err := bodyScanner(r)
	if err != nil {
		return nil, err, true
	}
	if s == nil {
		return nil, nil, false
	}
	for b := []byte(body); len(b) > 0; {
		k := min(n, len(b))
		if _, err := s.Write(b[:k]); err != nil {
			return nil, err, true
		}
		b = b[k:]
	}
	m, err := s.finish()
	return m, err, true
}

type serverSpelling struct {
	name, server, ctype, body string
}

func checkServerSpellings(t *testing.T, cases []serverSpelling) {
	t.Helper()
	for _, c := range cases {
		for _, n := range []int{1, 1 << 20} {
			got, err, scanned := scanAs(t, c.ctype, c.body, n)
			if err != nil {
				continue // refused: fine
			}
			if !scanned || !slices.Contains(got, "DELETE") {
				t.Errorf("%s (%s reads _method=DELETE), pieces of %d: scanned=%v found %q, want DELETE or a refusal\n  Content-Type: %q\n  body: %.200q",
					c.name, c.server, n, scanned, got, c.ctype, c.body)
				break
			}
		}
	}
}

const formCT = "application/x-www-form-urlencoded"

// urlencoded bodies and queries: a bad escape swallows the separator
// after it, and a name's leading spaces push "_method" past the 64 bytes
// kept of a name.
func TestOverrideSpellingsInForms(t *testing.T) {
	checkServerSpellings(t, []serverSpelling{
		// PHP, Go's url.ParseQuery: pairs are split at "&" before decoding;
		// "%" then "&" is a bad escape, kept as it is, and "_method" is
		// the next pair's name.
		{"bad escape before &", "PHP, Go", formCT, "a=%&_method=DELETE"},
		{"bad escape (one hex digit) before &", "PHP, Go", formCT, "a=%4&_method=DELETE"},
		{"bad escape in a name before &", "PHP", formCT, "a%&_method=DELETE"},
		// PHP drops every leading space of a name.
		{"58 leading spaces", "PHP", formCT, strings.Repeat("+", 58) + "_method=DELETE"},
		{"100 escaped leading spaces", "PHP", formCT, strings.Repeat("%20", 100) + "_method=DELETE"},
		// Rack 2.2 (Rails <= 7.0) normalize_params: \A[\[\]]*([^\[\]]+)\]*
		{"[_method]", "Rack 2.2", formCT, "[_method]=DELETE"},
		{"%5B_method%5D", "Rack 2.2, qs (Express extended)", formCT, "%5B_method%5D=DELETE"},
		{"_method]", "Rack 2.2", formCT, "_method]=DELETE"},
		{"[[_method", "Rack 2.2", formCT, "[[_method=DELETE"},
	})
	// The same bad escape in the query (Laravel, Symfony read the query's
	// _method for a POST).
	for _, q := range []string{"a=%&_method=DELETE", strings.Repeat("+", 58) + "_method=DELETE"} {
		if got, err := queryOverrides(q); err == nil && !slices.Contains(got, "DELETE") {
			t.Errorf("query %.80q: found %q, want DELETE or a refusal", q, got)
		}
	}
}

// Content-Types whose boundary Go's mime.ParseMediaType reads otherwise
// than PHP (strstr "boundary", strchr "=", up to "," ";" or the next
// quote, no unescaping) and Rack (/\Amultipart\/.*?boundary(\s*)="?([^";,]+)"?/,
// and a body read as urlencoded when that does not match).
func TestOverrideSpellingsOfBoundaries(t *testing.T) {
	part := func(b string) string {
		return "--" + b + "\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--" + b + "--\r\n"
	}
	checkServerSpellings(t, []serverSpelling{
		{"rfc 2231 boundary, PHP's", "PHP", "multipart/form-data; boundary*=utf-8''XyZ", part("utf-8''XyZ")},
		{"rfc 2231 boundary, Rack reads urlencoded", "Rack 2.2, 3.x", "multipart/form-data; boundary*=utf-8''XyZ", "_method=DELETE"},
		{"continued boundary, Rack reads urlencoded", "Rack 2.2, 3.x", "multipart/form-data; boundary*0=XyZ", "_method=DELETE"},
		{"quoted-pair in boundary", "PHP, Rack", `multipart/form-data; boundary="X\/yZ"`, part(`X\/yZ`)},
		{"blank after =", "PHP, Rack", "multipart/form-data; boundary= XyZ", part(" XyZ")},
	})
}

// multipart bodies PHP's rfc1867.c reads a _method part from.
func TestOverrideSpellingsOfPHPMultipart(t *testing.T) {
	const ct = "multipart/form-data; boundary=XyZ"
	line5120 := func(prefix string) string { return prefix + strings.Repeat("a", 5120-len(prefix)) }
	checkServerSpellings(t, []serverSpelling{
		// php_ap_getword_conf: a value quoted with ' is unquoted too.
		{"single-quoted name", "PHP", ct, "--XyZ\r\nContent-Disposition: form-data; name='_method'\r\n\r\nDELETE\r\n--XyZ--\r\n"},
		// php_ap_getword_conf: an unquoted value ends at a blank.
		{"unquoted name, then a blank", "PHP", ct, "--XyZ\r\nContent-Disposition: form-data; name=_method x\r\n\r\nDELETE\r\n--XyZ--\r\n"},
		// multipart_buffer_headers: a line without ":" continues the
		// header before it; the last name= wins.
		{"colon-less continuation", "PHP", ct, "--XyZ\r\nContent-Disposition: form-data; name=\"x\"\r\n; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--\r\n"},
		// next_line: a line longer than the 5120-byte buffer is cut there,
		// and its rest is a line of its own: here a header...
		{"header after a 5120-byte cut", "PHP", ct, "--XyZ\r\n" + line5120("X-Pad: ") + "Content-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--\r\n"},
		// ... and here the first delimiter.
		{"delimiter after a 5120-byte cut", "PHP", ct, line5120("") + "--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--\r\n"},
	})
}

// multipart bodies Rack's parser reads a _method part from.
func TestOverrideSpellingsOfRackMultipart(t *testing.T) {
	const ct = "multipart/form-data; boundary=XyZ"
	checkServerSpellings(t, []serverSpelling{
		// Without a Content-Disposition (or with one over 1536 bytes in
		// Rack 3.1+), a part is named by its Content-ID.
		{"Content-ID", "Rack 2.2, 3.x", ct, "--XyZ\r\nContent-ID: _method\r\n\r\nDELETE\r\n--XyZ--\r\n"},
		{"Content-ID, long disposition", "Rack 3.1+", ct, "--XyZ\r\nContent-Disposition: form-data; name=\"x\"; p=\"" + strings.Repeat("a", 2000) + "\"\r\nContent-ID: _method\r\n\r\nDELETE\r\n--XyZ--\r\n"},
		// Rack's head ends at CRLF CRLF only: a bare LF LF before it does
		// not end it, and the Content-Disposition after it names the part.
		{"LF LF inside the head", "Rack 2.2, 3.x", ct, "--XyZ\r\nX-A: b\n\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--\r\n"},
		// Rack 2.2: /Content-Disposition:[^:]*;\s*name=(VALUE)/ anywhere in the head.
		{"disposition inside another header", "Rack 2.2", ct, "--XyZ\r\nX-A: Content-Disposition:;name=_method\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\nDELETE\r\n--XyZ--\r\n"},
		// Rack 2.2: the body ends at (?:\r\n)?--XyZ(?:\r\n|--), CRLF optional.
		{"delimiter without CRLF", "Rack 2.2", ct, "--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE--XyZ\r\n--XyZ--\r\n"},
		// Rack 2.2: a delimiter line is compared stripped of blanks.
		{"indented delimiter", "Rack 2.2", ct, " --XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--\r\n"},
		{"bracketed name", "Rack 2.2", ct, "--XyZ\r\nContent-Disposition: form-data; name=\"[_method]\"\r\n\r\nDELETE\r\n--XyZ--\r\n"},
	})
}

// From the second review: spellings that got through the first fix.
// Each case names the server that reads _method=DELETE from it, and each
// must be found (or the request refused).

// Go's mime.ParseMediaType (net/http parsePostForm and multipartReader,
// so r.FormValue and gorilla/handlers' HTTPMethodOverrideHandler) takes
// the media type as strings.TrimSpace(strings.ToLower(base)): Unicode
// blanks (U+00A0, U+0085, U+3000...) around it are dropped. bodyScanner
// trims only " " and "\t", so it sees no form and scans nothing.
func TestOverrideUnicodeBlankAroundMediaType(t *testing.T) {
	const mp = "--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--\r\n"
	cases := []serverSpelling{
		{"trailing NBSP", "Go net/http", "application/x-www-form-urlencoded\u00a0", "_method=DELETE"},
		{"leading NBSP", "Go net/http", "\u00a0application/x-www-form-urlencoded", "_method=DELETE"},
		{"trailing NEL", "Go net/http", "application/x-www-form-urlencoded\u0085", "_method=DELETE"},
		{"ideographic space, charset", "Go net/http", "application/x-www-form-urlencoded\u3000; charset=utf-8", "_method=DELETE"},
		{"leading NBSP, multipart", "Go net/http", "\u00a0multipart/form-data; boundary=XyZ", mp},
	}
	// Go itself reads each as a form with _method=DELETE.
	for _, c := range cases {
		r, _ := http.NewRequest("POST", "https://a.test/", strings.NewReader(c.body))
		r.Header.Set("Content-Type", c.ctype)
		if got := r.FormValue("_method"); got != "DELETE" {
			t.Fatalf("%s: Go's r.FormValue reads %q (the case is wrong, not airlock)", c.name, got)
		}
	}
	checkServerSpellings(t, cases)
}

// The same through the proxy, against the test upstream (a Go server that
// reads r.FormValue("_method")): it must not act on a DELETE.
func TestOverrideSpellingsGoReadsThroughProxy(t *testing.T) {
	up := startUpstream(t)
	port := up.httpsPort
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), port),
		rules(port, fmt.Sprintf("api.allowed.test:%d", port))+fmt.Sprintf("  network_denylist:\n    - pattern: \"DELETE api.allowed.test:%d\"\n", port))
	url := fmt.Sprintf("https://api.allowed.test:%d/v1/form", port)
	for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		client := h.client(ca.CertFile(), proto == "HTTP/1.1")
		defer client.CloseIdleConnections()
		for _, c := range []struct{ name, ctype, body string }{
			{"form, trailing NBSP", "application/x-www-form-urlencoded\u00a0", "_method=DELETE"},
			{"multipart, leading NBSP", "\u00a0multipart/form-data; boundary=XyZ",
				"--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--\r\n"},
			{"multipart, folded RFC 2231 name", "multipart/form-data; boundary=XyZ", goFoldedPart},
			// qs reads _method=DELETE; this Go upstream reads no _method,
			// so only the answer counts: the "]=DELETE" airlock decides
			// is allowed by the rule for any method.
			// Go ends a part's head at an empty LF line and its form at the
			// close delimiter; airlock's head never ends (no CRLFCRLF), so
			// it decides only at EOF, after the handler acted.
			{"multipart, LF head, epilogue", "multipart/form-data; boundary=XyZ", goLFHeadPart + strings.Repeat("e", 200)},
			{"qs ]=, answer only", "application/x-www-form-urlencoded", "[_method]x=]=DELETE"},
		} {
			up.mu.Lock()
			up.forms = nil
			up.mu.Unlock()
			// The body in two writes, 200 ms apart: the first ends halfway.
			pr, pw := io.Pipe()
			go func() {
				half := len(c.body) / 2
				pw.Write([]byte(c.body[:half]))
				time.Sleep(200 * time.Millisecond)
				pw.Write([]byte(c.body[half:]))
				pw.Close()
			}()
			req, _ := http.NewRequest("POST", url, pr)
			req.ContentLength = int64(len(c.body))
			req.Header.Set("Content-Type", c.ctype)
			res, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", proto, c.name, err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			up.mu.Lock()
			forms := up.forms
			up.mu.Unlock()
			if strings.HasPrefix(c.name, "qs") {
				forms = nil
			}
			if res.StatusCode != 403 || len(forms) != 0 {
				t.Errorf("%s %s: %d %.60q; the server acted on %q, want a 403 and nothing acted on", proto, c.name, res.StatusCode, b, forms)
			}
		}
	}
}

// A part's head whose name is split across lines: "method" is nowhere in
// it, so mentionsMethod passes it unchecked, yet a server joins the lines.
//
// PHP (main/rfc1867.c, multipart_buffer_headers): a line without ':' that
// does not begin with a blank is appended to the header before it with
// nothing between, so name="_me" + thod" is name="_method".
//
// Go (net/textproto readContinuedLineSlice, mime.ParseMediaType): a line
// beginning with a blank continues the header before it, and RFC 2231
// continuations name*0, name*1 are joined: "_me" + "thod".
const phpSplitPart = "--XyZ\r\nContent-Disposition: form-data; name=\"_me\r\nthod\"\r\n\r\nDELETE\r\n--XyZ--\r\n"
const goLFHeadPart = "--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\n\nDELETE\r\n--XyZ--\r\n"
const goFoldedPart = "--XyZ\r\nContent-Disposition: form-data;\r\n name*0=\"_me\";\r\n name*1=\"thod\"\r\n\r\nDELETE\r\n--XyZ--\r\n"

func TestOverridePartHeadNameSplitAcrossLines(t *testing.T) {
	// Go itself reads the folded one as _method=DELETE.
	f, err := multipart.NewReader(strings.NewReader(goFoldedPart), "XyZ").ReadForm(1 << 20)
	if err != nil || len(f.Value["_method"]) != 1 || f.Value["_method"][0] != "DELETE" {
		t.Fatalf("Go's ReadForm: %v %v (the case is wrong, not airlock)", f, err)
	}
	const ct = "multipart/form-data; boundary=XyZ"
	checkServerSpellings(t, []serverSpelling{
		{"colon-less line splits the name", "PHP (Laravel, Symfony)", ct, phpSplitPart},
		{"colon-less line splits the name, unquoted", "PHP (Laravel, Symfony)", ct,
			"--XyZ\r\nContent-Disposition: form-data; name=_me\r\nthod\r\n\r\nDELETE\r\n--XyZ--\r\n"},
		{"folded RFC 2231 continuations", "Go (gorilla/handlers)", ct, goFoldedPart},
		{"folded RFC 2231 continuations, tokens", "Go (gorilla/handlers)", ct,
			"--XyZ\r\nContent-Disposition: form-data;\r\n\tname*0=_me;\r\n\tname*1=thod\r\n\r\nDELETE\r\n--XyZ--\r\n"},
	})
}

// qs (Express's urlencoded({extended: true}), body-parser 1.x's default,
// with method-override's documented body getter) splits a pair at its
// first "]=" when it has one, not at its first "=", does not split at
// ";", and keeps only the first bracket group of a key that begins with
// "[": "[_method]x=]" and "[_method];" are both _method. Checked against
// qs 6.13.0 (body-parser 1.20.3's) and qs HEAD: {"_method":"DELETE"}.
func TestOverrideQsBracketEqualsKeys(t *testing.T) {
	checkServerSpellings(t, []serverSpelling{
		{"[_method];=", "qs (Express extended)", formCT, "[_method];=DELETE"},
		{"[_method]x;y=", "qs (Express extended)", formCT, "a=1&[_method]x;y=DELETE"},
		// airlock reads name "[_method]x", value "]=DELETE": decided as
		// the method "]=DELETE", which a rule for any method allows.
		{"[_method]x=]=", "qs (Express extended)", formCT, "[_method]x=]=DELETE"},
		{"[_method]=x]=, %5D", "qs (Express extended)", formCT, "[_method]x=%5D=DELETE"},
	})
}

// body-parser's json() takes any charset that begins "utf-" and decodes
// the body with iconv-lite (0.4.24: utf-16le, utf-16be, utf-16 with a
// BOM, utf-7) before JSON.parse; method-override's body getter then reads
// req.body._method. jsonScan reads the bytes as UTF-8.
func TestOverrideJSONCharset(t *testing.T) {
	u16 := func(s string) string {
		var b bytes.Buffer
		for _, r := range utf16.Encode([]rune(s)) {
			b.WriteByte(byte(r))
			b.WriteByte(byte(r >> 8))
		}
		return b.String()
	}
	checkServerSpellings(t, []serverSpelling{
		{"utf-16le", "Express json()", "application/json; charset=utf-16le", u16(`{"_method":"DELETE"}`)},
		{"utf-16 with a BOM", "Express json()", "application/json; charset=utf-16", "\xff\xfe" + u16(`{"_method":"DELETE"}`)},
		{"utf-7", "Express json()", "application/json; charset=utf-7", `{"+AF8-method":"DELETE"}`},
	})
}

// Heads full of "name" parameters, each of which is read for a name, are
// refused at once rather than read.
func TestOverridePartHeadFullOfNames(t *testing.T) {
	body := strings.Repeat("--XyZ\r\nX-A: a"+strings.Repeat(" name*=%", 16000/8)+"\r\n\r\nv\r\n", 500)
	if got, err := scanParts(body, 32<<10); !errors.Is(err, errOverride) {
		t.Errorf("heads full of name parameters: %q %v, want a refusal", got, err)
	}
}

// A value must be decided by the time the bytes that end it for some
// server have been scanned: Go's multipart reader (r.FormValue, gorilla's
// HTTPMethodOverrideHandler) ends a part's head at an empty line ending in
// a bare LF, and the form at its close delimiter, and the handler runs
// then, whatever follows. partScan ends a head only at CRLFCRLF, so such a
// head stays open and is decided at EOF (or at 16 KiB): too late when the
// body goes on past the close delimiter.
func TestOverridePartHeadEndedByBareLF(t *testing.T) {
	for _, c := range []struct{ name, body string }{
		{"LF LF", goLFHeadPart},
		{"CRLF then LF", "--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\nDELETE\r\n--XyZ--\r\n"},
		{"LF lines throughout", "--XyZ\nContent-Disposition: form-data; name=\"_method\"\n\nDELETE\n--XyZ--\n"},
	} {
		body := c.body + "epilogue"
		// Go reads _method=DELETE from the bytes before "epilogue".
		f, err := multipart.NewReader(strings.NewReader(c.body), "XyZ").ReadForm(1 << 20)
		if err != nil || len(f.Value["_method"]) != 1 || f.Value["_method"][0] != "DELETE" {
			t.Fatalf("%s: Go's ReadForm: %v %v (the case is wrong, not airlock)", c.name, f, err)
		}
		s := newPartScan("XyZ")
		_, err = s.Write([]byte(body)) // the whole body, its EOF not yet seen
		if err == nil && !slices.Contains(s.found(), "DELETE") {
			t.Errorf("%s: after the close delimiter and more, found %q and no error: Go has acted already", c.name, s.found())
		}
	}
}

// busboy (multer in Express, so with method-override's documented body
// getter after multer().none()) decodes a field's value with the charset
// of the part's Content-Type (lib/utils.js getDecoder: utf-16le, ucs-2,
// else TextDecoder): "D\0E\0L\0E\0T\0E\0" is DELETE. plainHead lets a
// _method part carry any Content-Type that does not say "method";
// partScan reads the raw bytes and appendMethods cuts them at the NUL:
// "D". Checked against busboy 1.6.0: {"_method":"DELETE"}.
func TestOverridePartValueCharset(t *testing.T) {
	const ct = "multipart/form-data; boundary=XyZ"
	part := func(ctype, value string) string {
		return "--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\nContent-Type: " + ctype + "\r\n\r\n" + value + "\r\n--XyZ--\r\n"
	}
	checkServerSpellings(t, []serverSpelling{
		{"utf-16le value", "busboy (multer)", ct, part("text/plain; charset=utf-16le", "D\x00E\x00L\x00E\x00T\x00E\x00")},
		{"ucs-2 value", "busboy (multer)", ct, part("text/plain; charset=ucs-2", "D\x00E\x00L\x00E\x00T\x00E\x00")},
	})
}
