package tproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

// Every spelling of "_method" a server takes is found, and only those.
func TestQueryOverrides(t *testing.T) {
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"_method=DELETE", []string{"DELETE"}},
		{"_method=delete", []string{"DELETE"}},
		{"a=1&_method=DELETE&b=2", []string{"DELETE"}},
		{"a=1;_method=DELETE", []string{"DELETE"}},
		{"%5Fmethod=DELETE", []string{"DELETE"}},
		{"%5fm%65thod=%44ELETE", []string{"DELETE"}},
		{"_METHOD=DELETE", []string{"DELETE"}},
		{".method=DELETE", []string{"DELETE"}},       // PHP: "." is "_"
		{"+method=DELETE", nil},                      // PHP drops leading spaces: "method"
		{"+_method=DELETE", []string{"DELETE"}},      // PHP drops leading spaces
		{"%20%20_method=DELETE", []string{"DELETE"}}, // PHP drops leading spaces
		{"[method=DELETE", []string{"DELETE"}},       // PHP: an unclosed "[" is "_"
		{"_method[]=DELETE", []string{"DELETE"}},
		{"_method[a]=DELETE", []string{"DELETE"}},
		{"_method%00junk=DELETE", []string{"DELETE"}}, // a C string ends at NUL
		{"_method=DELETE%00x", []string{"DELETE\x00X", "DELETE"}},
		{"_method=PUT,+DELETE", []string{"PUT", "DELETE"}},
		{"_method=PUT&_method=DELETE", []string{"PUT", "DELETE"}},
		{"_method=%zzDELETE", []string{"%ZZDELETE"}},
		{"_method==DELETE", []string{"=DELETE"}},
		{"_method", nil},
		{"_method=", nil},
		{"method=DELETE", nil},
		{"payment_method=DELETE", nil},
		{"_method2=DELETE", nil},
		{"_methods=DELETE", nil},
		{"x=_method%3DDELETE", nil},
		{"", nil},
	} {
		got, err := queryOverrides(c.query)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%q: %q %v, want %q", c.query, got, err, c.want)
		}
	}
	for _, q := range []string{
		"_method=" + strings.Repeat("A", maxOverride+1),
		"_method=" + strings.Repeat("%41", maxOverride+1),
		strings.Repeat("_method=A&", 0) + manyOverrides(maxOverrides+1),
	} {
		if got, err := queryOverrides(q); !errors.Is(err, errOverride) {
			t.Errorf("%.40q...: %q %v, want an error", q, got, err)
		}
	}
}

// manyOverrides is a query of n different overrides.
func manyOverrides(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "_method=M%d&", i)
	}
	return b.String()
}

// multipart writes a multipart body of boundary "XyZ" from parts, each a
// header section and a value.
func multipartBody(parts ...[2]string) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString("--XyZ\r\n" + p[0] + "\r\n\r\n" + p[1] + "\r\n")
	}
	b.WriteString("--XyZ--\r\n")
	return b.String()
}

// scanParts feeds body to a partScan in pieces of n bytes.
func scanParts(body string, n int) ([]string, error) {
	s := newPartScan("XyZ")
	for b := []byte(body); len(b) > 0; {
		k := min(n, len(b))
		if _, err := s.Write(b[:k]); err != nil {
			return nil, err
		}
		b = b[k:]
	}
	return s.finish()
}

// A multipart form's override field is found however its part is
// written, and wherever the body is cut into pieces.
func TestPartScanFindsOverrides(t *testing.T) {
	file := [2]string{`Content-Disposition: form-data; name="file"; filename="a.bin"` + "\r\nContent-Type: application/octet-stream",
		strings.Repeat("\x00--XyY\r\n_method=GET&", 300)}
	for _, c := range []struct {
		name string
		body string
		want []string
	}{
		{"plain", multipartBody(file, [2]string{`Content-Disposition: form-data; name="_method"`, "DELETE"}), []string{"DELETE"}},
		{"first", multipartBody([2]string{`Content-Disposition: form-data; name="_method"`, "delete"}, file), []string{"DELETE"}},
		{"token", multipartBody([2]string{`content-disposition: form-data; name=_method`, "DELETE"}), []string{"DELETE"}},
		{"rfc 2231", multipartBody([2]string{`Content-Disposition: form-data; name*=utf-8''%5Fmethod`, "DELETE"}), []string{"DELETE"}},
		{"continued", multipartBody([2]string{`Content-Disposition: form-data; name*0="_me"; name*1="thod"`, "DELETE"}), []string{"DELETE"}},
		{"escaped", multipartBody([2]string{`Content-Disposition: form-data; name="_met\hod"`, "DELETE"}), []string{"DELETE"}},
		{"two names", multipartBody([2]string{`Content-Disposition: form-data; name="x"; name="_method"`, "DELETE"}), []string{"DELETE"}},
		{"two headers", multipartBody([2]string{"Content-Disposition: form-data; name=\"x\"\r\nContent-Disposition: form-data; name=\"_method\"", "DELETE"}), []string{"DELETE"}},
		{"folded", multipartBody([2]string{"Content-Disposition: form-data;\r\n name=\"_method\"", "DELETE"}), []string{"DELETE"}},
		{"php", multipartBody([2]string{`Content-Disposition: form-data; name="_method[]"`, "DELETE"}), []string{"DELETE"}},
		{"lf only", "--XyZ\nContent-Disposition: form-data; name=\"_method\"\n\nDELETE\n--XyZ--\n", []string{"DELETE"}},
		{"after the close", multipartBody(file) + "\n--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n", []string{"DELETE"}},
		{"preamble", "junk\r\n" + multipartBody([2]string{`Content-Disposition: form-data; name="_method"`, "DELETE"}), []string{"DELETE"}},
		{"padding", "--XyZ   \r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--", []string{"DELETE"}},
		{"unended", "--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE", []string{"DELETE"}},
		{"other fields", multipartBody(file, [2]string{`Content-Disposition: form-data; name="payment_method"`, "DELETE"},
			[2]string{`Content-Disposition: form-data; name="x"; filename="_method"`, "DELETE"}), nil},
		{"none", multipartBody(file), nil},
		{"empty", "", nil},
	} {
		for _, n := range []int{1, 2, 7, 1 << 20} {
			got, err := scanParts(c.body, n)
			if err != nil || !slices.Equal(got, c.want) {
				t.Errorf("%s, in pieces of %d: %q %v, want %q", c.name, n, got, err, c.want)
			}
		}
	}
	for _, c := range []struct{ name, body string }{
		{"long value", multipartBody([2]string{`Content-Disposition: form-data; name="_method"`, strings.Repeat("A", maxOverride+1)})},
		{"long disposition", multipartBody([2]string{`Content-Disposition: form-data; name="x"; ` + strings.Repeat("a", maxPartLine), "x"})},
	} {
		for _, n := range []int{1, 1 << 20} {
			if got, err := scanParts(c.body, n); !errors.Is(err, errOverride) {
				t.Errorf("%s, in pieces of %d: %q %v, want an error", c.name, n, got, err)
			}
		}
	}
	// Long headers other than Content-Disposition are passed over.
	body := multipartBody([2]string{"X-Pad: " + strings.Repeat("a", 3*maxPartLine) + "\r\nContent-Disposition: form-data; name=\"_method\"", "DELETE"})
	if got, err := scanParts(body, 1000); err != nil || !slices.Equal(got, []string{"DELETE"}) {
		t.Errorf("after a long header: %q %v", got, err)
	}
}

// Which bodies are read as forms, and which forms cannot be read.
func TestBodyScanner(t *testing.T) {
	body := func(ct ...string) *http.Request {
		r, _ := http.NewRequest("POST", "https://a.test/", strings.NewReader("x"))
		for _, v := range ct {
			r.Header.Add("Content-Type", v)
		}
		return r
	}
	for _, c := range []struct {
		ct   []string
		want string // "form", "multipart", "" or "error"
	}{
		{nil, "form"},
		{[]string{""}, "form"},
		{[]string{"application/x-www-form-urlencoded"}, "form"},
		{[]string{"Application/X-WWW-Form-Urlencoded; charset=utf-8"}, "form"},
		{[]string{"application/x-www-form-urlencoded, application/json"}, "form"},
		{[]string{"application/json"}, ""},
		{[]string{"application/octet-stream"}, ""},
		{[]string{"multipart/form-data; boundary=XyZ"}, "multipart"},
		{[]string{`multipart/mixed; boundary="XyZ"`}, "multipart"},
		{[]string{"multipart/form-data"}, "error"},
		{[]string{"multipart/form-data; boundary=a; xboundary=b"}, "error"},
		{[]string{`multipart/form-data; boundary="a;b"`}, "error"},
		{[]string{"multipart/form-data; boundary=" + strings.Repeat("a", 71)}, "error"},
		{[]string{"multipart/form-data; boundary=a", "multipart/form-data; boundary=b"}, "error"},
		{[]string{"multipart/form-data; boundary=a", "application/x-www-form-urlencoded"}, "error"},
	} {
		s, err := bodyScanner(body(c.ct...))
		got := ""
		switch s.(type) {
		case *formScan:
			got = "form"
		case *partScan:
			got = "multipart"
		}
		if err != nil {
			got = "error"
		}
		if got != c.want {
			t.Errorf("Content-Type %q: %s (%v), want %s", c.ct, got, err, c.want)
		}
	}
	r := body("application/x-www-form-urlencoded")
	r.Header.Set("Content-Encoding", "gzip")
	if _, err := bodyScanner(r); err == nil {
		t.Error("a gzipped form was passed unread")
	}
	r, _ = http.NewRequest("POST", "https://a.test/", nil)
	if s, err := bodyScanner(r); s != nil || err != nil {
		t.Errorf("no body: %v %v", s, err)
	}
}

// An overrideBody gives every byte of an allowed body, and all but the
// last of a refused one, whatever pieces it is read in.
func TestOverrideBodyHoldsTheLastByte(t *testing.T) {
	for _, c := range []struct {
		body    string
		refused bool
	}{
		{"a=1&_method=PUT&b=2", false},
		{"a=1&_method=DELETE&b=2", true},
		{"x", false},
		{strings.Repeat("a=1&", 10000) + "_method=DELETE", true},
	} {
		for name, wrap := range map[string]func(io.Reader) io.Reader{
			"whole": func(r io.Reader) io.Reader { return r }, "one byte": iotest.OneByteReader,
			"half": iotest.HalfReader, "data and EOF": iotest.DataErrReader,
		} {
			b := &overrideBody{ReadCloser: io.NopCloser(wrap(strings.NewReader(c.body))), scan: &formScan{},
				decide: func(methods []string) *overrideRefusal {
					if slices.Contains(methods, "DELETE") {
						return &overrideRefusal{reason: "no DELETE"}
					}
					return nil
				}}
			got, err := io.ReadAll(b)
			if c.refused {
				var ref *overrideRefusal
				if !errors.As(err, &ref) || b.refusal() == nil || string(got) != c.body[:len(c.body)-1] {
					t.Errorf("%.30q read %s: %d bytes, %v; want all but the last and the refusal", c.body, name, len(got), err)
				}
				continue
			}
			if err != nil || !bytes.Equal(got, []byte(c.body)) || b.refusal() != nil {
				t.Errorf("%.30q read %s: %q, %v; want it all", c.body, name, got, err)
			}
		}
	}
}

// FuzzFormOverrides: whatever a form body holds and however it is cut
// into pieces, every "_method" value Go's own form parsers find is
// found (or the form refused), and the pieces change nothing.
func FuzzFormOverrides(f *testing.F) {
	f.Add("a=1&_method=DELETE", multipartBody([2]string{`Content-Disposition: form-data; name="_method"`, "DELETE"}), uint8(3))
	f.Add("%5Fmethod=put;x", "--XyZ\nContent-Disposition: form-data; name*=utf-8''_method\n\nPATCH\n--XyZ--", uint8(1))
	f.Add("_method[]=a,b", "junk\r\n--XyZ\r\nContent-Disposition: form-data;\r\n name=\"_method\"\r\n\r\n\r\n--XyZ--\r\n", uint8(7))
	f.Fuzz(func(t *testing.T, query, parts string, n uint8) {
		pieces := max(1, int(n))
		for _, c := range []struct {
			body string
			scan func() overrideScanner
			go_  func(string) map[string][]string
		}{
			{query, func() overrideScanner { return &formScan{} }, func(b string) map[string][]string {
				v, err := url.ParseQuery(b)
				if err != nil {
					return nil
				}
				return v
			}},
			{parts, func() overrideScanner { return newPartScan("XyZ") }, func(b string) map[string][]string {
				form, err := multipart.NewReader(strings.NewReader(b), "XyZ").ReadForm(1 << 20)
				if err != nil {
					return nil
				}
				return form.Value
			}},
		} {
			whole := c.scan()
			whole.Write([]byte(c.body))
			want, wantErr := whole.finish()
			cut := c.scan()
			for b := []byte(c.body); len(b) > 0; b = b[min(pieces, len(b)):] {
				cut.Write(b[:min(pieces, len(b))])
			}
			got, err := cut.finish()
			if !slices.Equal(got, want) || (err == nil) != (wantErr == nil) {
				t.Fatalf("%q in pieces of %d: %q %v; whole: %q %v", c.body, pieces, got, err, want, wantErr)
			}
			if err != nil {
				continue // refused: nothing goes upstream
			}
			for k, vv := range c.go_(c.body) {
				if !isOverrideName(k) {
					continue
				}
				for _, v := range vv {
					for _, m := range appendMethods(nil, v) {
						if !slices.Contains(got, m) {
							t.Fatalf("%q: Go reads %s=%q, the scan found %q", c.body, k, v, got)
						}
					}
				}
			}
		}
	})
}
