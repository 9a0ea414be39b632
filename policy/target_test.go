package policy

import (
	"errors"
	"strings"
	"testing"
)

func TestCanonicalTarget(t *testing.T) {
	for _, tc := range []struct {
		name, target, want string // want "" means refused
	}{
		{"plain", "/v1/items", "/v1/items"},
		{"root", "/", "/"},
		{"trailing slash", "/v1/", "/v1/"},
		{"query kept as sent", "/v1/x?a=%2e%2e/..&b=%2F", "/v1/x?a=%2e%2e/..&b=%2F"},
		{"non-ASCII in the query escaped", "/v1/x?q=\xe2\x80\xa8", "/v1/x?q=%E2%80%A8"},
		{"escaped letters decoded", "/%61dmin/%7Eme", "/admin/~me"},
		{"other escapes upper-cased", "/a%3ab%2b", "/a%3Ab%2B"},
		{"non-ASCII escaped", "/caf\xc3\xa9", "/caf%C3%A9"},
		{"UTF-8 escapes kept", "/caf%c3%a9/%E0%A4%85/%F0%9F%98%80", "/caf%C3%A9/%E0%A4%85/%F0%9F%98%80"},
		{"overlong dots and slash", "/v1/%C0%AE%C0%AE%C0%AFadmin", ""},
		{"overlong in lower case", "/v1/%c1%9c", ""},
		{"overlong, 3 bytes", "/v1/%E0%80%AE%E0%80%AE/admin", ""},
		{"overlong, 4 bytes", "/v1/%F0%80%80%AF", ""},
		{"overlong, raw bytes", "/v1/\xc0\xae\xc0\xae/admin", ""},
		{"bytes a path may not hold escaped", "/a\"b<c>{d}|^`[e]", "/a%22b%3Cc%3E%7Bd%7D%7C%5E%60%5Be%5D"},
		{"sub-delims kept", "/a!$&'()*+,;=:@b", "/a!$&'()*+,;=:@b"},
		{"absolute-form", "http://api.test/v1/x?q=1", "/v1/x?q=1"},
		{"absolute-form, no path", "https://api.test", "/"},
		{"absolute-form, query only", "http://api.test?q=1", "/?q=1"},
		{"segment parameters kept", "/v1;jsessionid=1/x", "/v1;jsessionid=1/x"},

		{"empty segment before dot-dot", "/v1//../admin", ""},
		{"empty segment", "/v1//x", ""},
		{"leading double slash", "//admin", ""},
		{"dot-dot", "/v1/../admin", ""},
		{"dot", "/v1/./x", ""},
		{"trailing dot-dot", "/v1/..", ""},
		{"dot-dot with parameters", "/v1/..;/admin", ""},
		{"dot with parameters", "/v1/.;x/y", ""},
		{"encoded dot", "/v1/%2e%2e/admin", ""},
		{"encoded dot, lower and upper", "/v1/%2E./admin", ""},
		{"encoded slash", "/v1%2f..%2fadmin", ""},
		{"encoded backslash", "/v1/..%5cadmin", ""},
		{"double-encoded dot", "/v1/%252e%252e/admin", ""},
		{"encoded NUL", "/v1/x%00.json", ""},
		{"backslash", "/v1\\..\\admin", ""},
		{"stray percent", "/v1/100%", ""},
		{"bad escape", "/v1/%zz", ""},
		{"control byte", "/v1/\x01x", ""},
		{"tab", "/v1/\tx", ""},
		{"DEL", "/v1/\x7f", ""},
		{"fragment", "/v1/x#frag", ""},
		{"space", "/v1/a b", ""},
		{"asterisk-form", "*", ""},
		{"authority-form", "api.test:443", ""},
		{"relative", "v1/x", ""},
		{"empty", "", ""},
		{"control in query", "/v1?a=\x1b", ""},
		{"fragment in query", "/v1?a#b", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CanonicalTarget(tc.target)
			switch {
			case tc.want == "" && err == nil:
				t.Errorf("CanonicalTarget(%q) = %q, want it refused", tc.target, got)
			case tc.want == "" && !errors.Is(err, ErrAmbiguousPath):
				t.Errorf("CanonicalTarget(%q) error %v does not wrap ErrAmbiguousPath", tc.target, err)
			case tc.want != "" && (err != nil || got != tc.want):
				t.Errorf("CanonicalTarget(%q) = %q, %v; want %q", tc.target, got, err, tc.want)
			}
			if err == nil {
				// Canonical is a fixed point: deciding twice changes nothing.
				if again, err := CanonicalTarget(got); err != nil || again != got {
					t.Errorf("CanonicalTarget(%q) = %q, %v; not a fixed point", got, again, err)
				}
			}
		})
	}
}

func FuzzCanonicalTarget(f *testing.F) {
	for _, s := range []string{"/v1/x", "/v1//../a", "/%2e/", "http://h/a?b", "/a;b/..;/c", "/%61"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := CanonicalTarget(s)
		if err != nil {
			return
		}
		if again, err := CanonicalTarget(got); err != nil || again != got {
			t.Fatalf("%q → %q → %q, %v", s, got, again, err)
		}
		// What is decided on is what servers see: dot segments removed and
		// slashes folded change nothing.
		path := got
		if i := strings.IndexByte(path, '?'); i >= 0 {
			path = path[:i]
		}
		if clean, merged, _ := requestPaths(path); clean != path || merged != path {
			t.Fatalf("%q → %q, but servers read it as %q / %q", s, got, clean, merged)
		}
	})
}

// TestCanonicalTargetLength: a target over MaxTarget is refused, one of
// MaxTarget is read.
func TestCanonicalTargetLength(t *testing.T) {
	if _, err := CanonicalTarget("/" + strings.Repeat("a", MaxTarget-1)); err != nil {
		t.Errorf("a target of MaxTarget bytes: %v", err)
	}
	if _, err := CanonicalTarget("/" + strings.Repeat("a", MaxTarget)); !errors.Is(err, ErrAmbiguousPath) {
		t.Errorf("a target over MaxTarget: %v, want it refused", err)
	}
}
