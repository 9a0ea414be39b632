package tproxy

import (
	"bytes"
	"encoding/json"
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
		{"_HttpMethod=DELETE", []string{"DELETE"}},
		{"_httpmethod=patch&a=1", []string{"PATCH"}},
		{"x_HttpMethod=DELETE&_HttpMethods=DELETE", nil},
		{".method=DELETE", []string{"DELETE"}},       // PHP: "." is "_"
		{"+method=DELETE", nil},                      // PHP drops leading spaces: "method"
		{"+_method=DELETE", []string{"DELETE"}},      // PHP drops leading spaces
		{"%20%20_method=DELETE", []string{"DELETE"}}, // PHP drops leading spaces
		{"[_method]=DELETE", []string{"DELETE"}},     // Rack 2 and qs drop the brackets
		{"[method=DELETE", nil},                      // PHP skips a name that begins with "["
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

// A multipart form's override field is found wherever the body is cut
// into pieces, when its part's head is one every server reads alike; a
// head that names "method" otherwise is refused.
func TestPartScanFindsOverrides(t *testing.T) {
	file := [2]string{`Content-Disposition: form-data; name="file"; filename="a.bin"` + "\r\nContent-Type: application/octet-stream",
		strings.Repeat("\x00--XyY\r\n_method=GET&", 300)}
	override := func(head string) string { return multipartBody([2]string{head, "DELETE"}) }
	for _, c := range []struct {
		name string
		body string
		want []string
	}{
		{"plain", multipartBody(file, [2]string{`Content-Disposition: form-data; name="_method"`, "DELETE"}), []string{"DELETE"}},
		{"first", multipartBody([2]string{`Content-Disposition: form-data; name="_method"`, "delete"}, file), []string{"DELETE"}},
		{"typed", override("content-disposition: form-data; name=\"_method\"\r\nContent-Type: text/plain"), []string{"DELETE"}},
		{"php", override(`Content-Disposition: form-data; name="_method[]"`), []string{"DELETE"}},
		{"rack 2", override(`Content-Disposition: form-data; name="[_method]"`), []string{"DELETE"}},
		{"preamble", "junk\r\n" + override(`Content-Disposition: form-data; name="_method"`), []string{"DELETE"}},
		{"padding", "--XyZ   \r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--", []string{"DELETE"}},
		{"no line end before the delimiter", "--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE--XyZ--", []string{"DELETE"}},
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
		{"token", override(`content-disposition: form-data; name=_method`)},
		{"after the close", multipartBody(file) + "\n--XyZ\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n"},
		{"single quotes", override(`Content-Disposition: form-data; name='_method'`)},
		{"rfc 2231", override(`Content-Disposition: form-data; name*=utf-8''%5Fmethod`)},
		{"continued", override(`Content-Disposition: form-data; name*0="_me"; name*1="thod"`)},
		{"escaped", override(`Content-Disposition: form-data; name="_met\hod"`)},
		{"escaped escape", override(`Content-Disposition: form-data; name="_%6\Dethod"`)},
		{"two names", override(`Content-Disposition: form-data; name="x"; name="_method"`)},
		{"two headers", override("Content-Disposition: form-data; name=\"x\"\r\nContent-Disposition: form-data; name=\"_method\"")},
		{"folded", override("Content-Disposition: form-data;\r\n name=\"_method\"")},
		{"a line without a colon", override("Content-Disposition: form-data; name=\"x\"\r\n; name=\"_method\"")},
		{"content-id", override("Content-ID: _method")},
		{"in another header", override("X-A: Content-Disposition:;name=_method")},
		{"lf only", "--XyZ\nContent-Disposition: form-data; name=\"_method\"\n\nDELETE\n--XyZ--\n"},
		{"lf blank line first", override("X-A: b\n\nContent-Disposition: form-data; name=\"_method\"")},
		{"long value", multipartBody([2]string{`Content-Disposition: form-data; name="_method"`, strings.Repeat("A", maxOverride+1)})},
		{"long head", override("X-Pad: " + strings.Repeat("a", maxPartHead) + "\r\nContent-Disposition: form-data; name=\"_method\"")},
		{"long head, no method", multipartBody([2]string{"X-Pad: " + strings.Repeat("a", maxPartHead), "x"})},
	} {
		for _, n := range []int{1, 1 << 20} {
			if got, err := scanParts(c.body, n); !errors.Is(err, errOverride) {
				t.Errorf("%s, in pieces of %d: %q %v, want an error", c.name, n, got, err)
			}
		}
	}
}

// A JSON body's top-level "_method" strings are found, however escaped,
// and one that is not a string is refused.
func TestJSONScan(t *testing.T) {
	for _, c := range []struct {
		body string
		want []string
	}{
		{`{"_method":"DELETE"}`, []string{"DELETE"}},
		{` { "a" : [1, {"_method": "GET"}], "_method" : "delete" } `, []string{"DELETE"}},
		{`{"\u005fmethod":"\u0044ELETE"}`, []string{"DELETE"}},
		{`{"_method":"PUT","_method":"DELETE"}`, []string{"PUT", "DELETE"}},
		{`{"a":"_method","b":"\"_method\":"}`, nil},
		{`{"x":{"_method":"DELETE"}}`, nil},
		{`["_method","DELETE"]`, nil},
		{`{"payment_method":"DELETE"}`, nil},
		{`{"_HttpMethod":"DELETE"}`, []string{"DELETE"}},
		{`not json _method=DELETE`, nil},
	} {
		for _, n := range []int{1, 3, 1 << 20} {
			var s jsonScan
			for b := []byte(c.body); len(b) > 0; b = b[min(n, len(b)):] {
				s.Write(b[:min(n, len(b))])
			}
			got, err := s.finish()
			if err != nil || !slices.Equal(got, c.want) {
				t.Errorf("%s in pieces of %d: %q %v, want %q", c.body, n, got, err, c.want)
			}
		}
	}
	for _, body := range []string{`{"_method":["DELETE"]}`, `{"_method":{"a":"DELETE"}}`, `{"_method":1}`, `{"_method":"` + strings.Repeat("A", maxOverride+1) + `"}`} {
		var s jsonScan
		s.Write([]byte(body))
		if got, err := s.finish(); !errors.Is(err, errOverride) {
			t.Errorf("%.40s: %q %v, want an error", body, got, err)
		}
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
		{[]string{"application/x-www-form-urlencoded, application/json"}, "form+json"},
		{[]string{"application/json"}, "json"},
		{[]string{"application/vnd.api+json; charset=utf-8"}, "json"},
		{[]string{"application/octet-stream"}, ""},
		{[]string{"multipart/form-data; boundary=XyZ"}, "multipart"},
		{[]string{`multipart/mixed; boundary="XyZ"`}, "multipart"},
		{[]string{"multipart/form-data"}, "error"},
		{[]string{"multipart/form-data; boundary=a; xboundary=b"}, "error"},
		{[]string{"multipart/form-data; boundary*=utf-8''XyZ"}, "error"},
		{[]string{`multipart/form-data; boundary="X\/yZ"`}, "error"},
		{[]string{"multipart/form-data; boundary= XyZ"}, "error"},
		{[]string{"multipart/form-data; boundary=XyZ; charset=utf-8"}, "multipart"},
		{[]string{`multipart/form-data; boundary="a;b"`}, "error"},
		{[]string{"multipart/form-data; boundary=" + strings.Repeat("a", 71)}, "error"},
		{[]string{"multipart/form-data; boundary=a", "multipart/form-data; boundary=b"}, "error"},
		{[]string{"multipart/form-data; boundary=a", "application/x-www-form-urlencoded"}, "error"},
		{[]string{"application/json", "application/json"}, "error"},
	} {
		s, err := bodyScanner(body(c.ct...))
		got := ""
		switch s := s.(type) {
		case *formScan:
			got = "form"
		case *partScan:
			got = "multipart"
		case *jsonScan:
			got = "json"
		case multiScan:
			var kinds []string
			for _, x := range s {
				switch x.(type) {
				case *formScan:
					kinds = append(kinds, "form")
				case *jsonScan:
					kinds = append(kinds, "json")
				}
			}
			got = strings.Join(kinds, "+")
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

// An overrideBody gives every byte of an allowed body. Of a refused one
// it never gives the bytes that end the refused value (the "&" after it,
// or the body's last byte), whatever pieces it is read in.
func TestOverrideBodyHoldsTheEnd(t *testing.T) {
	for _, c := range []struct {
		body string
		end  int // where the refused value's end is, or -1
	}{
		{"a=1&_method=PUT&b=2", -1},
		{"a=1&_method=DELETE&b=2", len("a=1&_method=DELETE")},
		{"x", -1},
		{strings.Repeat("a=1&", 10000) + "_method=DELETE", 40000 + len("_method=DELETE") - 1},
		{"_method=DELETE&" + strings.Repeat("a=1&", 10000), len("_method=DELETE")},
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
			if c.end >= 0 {
				var ref *overrideRefusal
				if !errors.As(err, &ref) || b.refusal() == nil || len(got) > c.end || !strings.HasPrefix(c.body, string(got)) {
					t.Errorf("%.30q read %s: %d bytes, %v; want at most %d and the refusal", c.body, name, len(got), err, c.end)
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
	f.Add(`{"_method":"DELETE"}`, multipartBody([2]string{`Content-Disposition: form-data; name="_method"`, "DELETE"}), uint8(3))
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
				v, _ := url.ParseQuery(b) // the pairs it could read, whatever the others
				return v
			}},
			{query, func() overrideScanner { return &jsonScan{} }, func(b string) map[string][]string {
				var v map[string]any
				if json.Unmarshal([]byte(b), &v) != nil {
					return nil
				}
				out := map[string][]string{}
				for k, x := range v {
					if s, ok := x.(string); ok {
						out[k] = []string{s}
					}
				}
				return out
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

// BenchmarkOverrideScan: what reading a body for its overrides costs per
// byte, for an upload without a type (read as a form), a multipart file
// and a JSON document.
func BenchmarkOverrideScan(b *testing.B) {
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i*7919 + i>>8) // every byte value, "&" and ";" among them
	}
	file := multipartBody([2]string{`Content-Disposition: form-data; name="file"; filename="a.bin"`, string(data)})
	doc := `{"items":[` + strings.Repeat(`{"name":"a \"quoted\" name","n":12345,"ok":true},`, 20000) + `{}],"_method":"PUT"}`
	for _, c := range []struct {
		name string
		body []byte
		scan func() overrideScanner
	}{
		{"untyped", data, func() overrideScanner { return &formScan{} }},
		{"multipart", []byte(file), func() overrideScanner { return newPartScan("XyZ") }},
		{"json", []byte(doc), func() overrideScanner { return &jsonScan{} }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				s := c.scan()
				for p := c.body; len(p) > 0; p = p[min(32<<10, len(p)):] {
					s.Write(p[:min(32<<10, len(p))])
				}
				if _, err := s.finish(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A qs pair too long to read whole is refused if it spells "method"
// anywhere, however it arrives.
func TestQSLongPairSpellingMethod(t *testing.T) {
	for _, at := range []int{0, maxQSPair - 3, maxQSPair, maxQSPair + 100} {
		body := strings.Repeat("x", at) + "m%65thod" + strings.Repeat("y", maxQSPair)
		for _, n := range []int{1, 7, 1 << 20} {
			var s qsScan
			for b := []byte(body); len(b) > 0; b = b[min(n, len(b)):] {
				s.Write(b[:min(n, len(b))])
			}
			if _, err := s.finish(); !errors.Is(err, errOverride) {
				t.Errorf("\"method\" at %d, in pieces of %d: %v, want a refusal", at, n, err)
			}
		}
	}
	var s qsScan
	s.Write([]byte(strings.Repeat("x", 2*maxQSPair) + "&a=1"))
	if _, err := s.finish(); err != nil {
		t.Errorf("a long pair without it: %v", err)
	}
}
