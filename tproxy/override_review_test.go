package tproxy

// Spellings of "_method" that a server honouring it reads, found in
// review: each case names the server that reads it; each must be found
// (or the form refused).

import (
	"net/http"
	"slices"
	"strings"
	"testing"
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
