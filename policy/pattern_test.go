package policy

import (
	"errors"
	"strings"
	"testing"
)

func TestParseCanonical(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		want  string
		kind  Kind
		needs bool // NeedsL7
	}{
		{name: "exact", in: "api.github.com", want: "api.github.com", kind: KindExact},
		{name: "wildcard", in: "*.googleapis.com", want: "*.googleapis.com", kind: KindWildcard},
		{name: "host path glob", in: "api.example.com/v1/*", want: "api.example.com/v1/*", kind: KindExact, needs: true},
		{name: "full wildcard", in: "*.example.com/*", want: "*.example.com/*", kind: KindWildcard},
		{name: "regex host", in: `regex:.*\.example\.(com|org)`, want: `regex:.*\.example\.(com|org)`, kind: KindRegex},
		{name: "regex host and path", in: `regex:api\.example\.com/v[0-9]+/.*`, want: `regex:api\.example\.com/v[0-9]+/.*`, kind: KindRegex, needs: true},
		{name: "method prefix", in: "GET api.github.com/repos/*", want: "GET api.github.com/repos/*", kind: KindExact, needs: true},
		{name: "method only", in: "POST api.example.com", want: "POST api.example.com", kind: KindExact, needs: true},
		{name: "port", in: "db.example.com:5432", want: "db.example.com:5432", kind: KindExact},
		{name: "wildcard port", in: "*.example.com:8443", want: "*.example.com:8443", kind: KindWildcard},
		{name: "cidr", in: "cidr:203.0.113.0/24", want: "cidr:203.0.113.0/24", kind: KindCIDR},
		{name: "cidr port", in: "cidr:203.0.113.7/32:22", want: "cidr:203.0.113.7/32:22", kind: KindCIDR},
		// A keyword in any case is the keyword, never a host of that name
		// with a port, whose canonical form would read back as the keyword.
		{name: "keyword case regex", in: `REGEX:api\.example\.com`, want: `regex:api\.example\.com`, kind: KindRegex},
		{name: "keyword case cidr", in: "Cidr:203.0.113.0/24", want: "cidr:203.0.113.0/24", kind: KindCIDR},
		{name: "policy example regex", in: `regex:.*\.internal\.company\.com`, want: `regex:.*\.internal\.company\.com`, kind: KindRegex},
		{name: "seed path wildcard", in: "*.unknown.com/api/v*", want: "*.unknown.com/api/v*", kind: KindWildcard, needs: true},
		{name: "mixed case", in: "API.GitHub.COM", want: "api.github.com", kind: KindExact},
		{name: "trailing dot", in: "api.github.com.", want: "api.github.com", kind: KindExact},
		{name: "wildcard mixed case trailing dot", in: "*.GoogleAPIs.com.", want: "*.googleapis.com", kind: KindWildcard},
		{name: "idna", in: "bücher.example", want: "xn--bcher-kva.example", kind: KindExact},
		{name: "idna wildcard", in: "*.münchen.de", want: "*.xn--mnchen-3ya.de", kind: KindWildcard},
		{name: "punycode kept", in: "xn--bcher-kva.example", want: "xn--bcher-kva.example", kind: KindExact},
		{name: "fullwidth dot", in: "api．example．com", want: "api.example.com", kind: KindExact},
		{name: "underscore", in: "_dmarc.example.com", want: "_dmarc.example.com", kind: KindExact},
		{name: "spaces around", in: "  api.github.com  ", want: "api.github.com", kind: KindExact},
		{name: "private suffix wildcard", in: "*.github.io", want: "*.github.io", kind: KindWildcard},
		{name: "wildcard under a public suffix by a wildcard rule", in: "*.example.x.kawasaki.jp", want: "*.example.x.kawasaki.jp", kind: KindWildcard},
		{name: "wildcard under an exception to a wildcard rule", in: "*.city.kawasaki.jp", want: "*.city.kawasaki.jp", kind: KindWildcard},
		{name: "host slash star is any path", in: "api.example.com/*", want: "api.example.com/*", kind: KindExact},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse(tt.in, ParseOptions{})
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in, err)
			}
			if got := p.String(); got != tt.want {
				t.Errorf("Parse(%q).String() = %q, want %q", tt.in, got, tt.want)
			}
			if p.Kind() != tt.kind {
				t.Errorf("Kind = %v, want %v", p.Kind(), tt.kind)
			}
			if p.NeedsL7() != tt.needs {
				t.Errorf("NeedsL7 = %v, want %v", p.NeedsL7(), tt.needs)
			}
			again, err := Parse(p.String(), ParseOptions{})
			if err != nil || again.String() != p.String() {
				t.Errorf("canonical form %q does not parse back to itself: %v %q", p.String(), err, again.String())
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		want  string // substring of the error
		broad bool   // the error wraps ErrBroad and Force accepts the pattern
	}{
		{name: "star", in: "*", want: "matches every host", broad: true},
		{name: "host named like a keyword", in: "Cidr:1", want: "needs a prefix length"},
		{name: "host regex with a port", in: "regex.:8080", want: "takes no port"},
		{name: "host cidr with a port and a path", in: "CIDR.:8443/x", want: "takes no port"},
		{name: "star dot star", in: "*.*", want: "matches every host", broad: true},
		{name: "public suffix com", in: "*.com", want: "whole public suffix", broad: true},
		{name: "public suffix co.uk", in: "*.co.uk", want: "whole public suffix", broad: true},
		{name: "public suffix any path", in: "*.com/*", want: "whole public suffix", broad: true},
		{name: "bare tld", in: "*.test", want: "whole public suffix", broad: true},
		{name: "bare tld with a wildcard rule", in: "*.ck", want: "whole public suffix", broad: true},
		{name: "public suffix by a wildcard rule", in: "*.x.kawasaki.jp", want: "whole public suffix", broad: true},
		{name: "every child a public suffix", in: "*.kawasaki.jp", want: "whole public suffixes", broad: true},
		{name: "every child a public suffix, any path", in: "*.Nagoya.JP/*", want: "whole public suffixes", broad: true},
		{name: "regex everything", in: "regex:.*", want: "matches unrelated domains", broad: true},
		{name: "regex every com", in: `regex:.*\.com`, want: "matches unrelated domains", broad: true},
		{name: "regex any label", in: `regex:[a-z0-9.-]+`, want: "matches unrelated domains", broad: true},
		{name: "cidr everything", in: "cidr:0.0.0.0/0", want: "more than a /8", broad: true},
		{name: "empty", in: "", want: "empty"},
		{name: "blank", in: "   ", want: "empty"},
		{name: "scheme", in: "https://api.github.com", want: "without a scheme"},
		{name: "inner wildcard", in: "api.*.example.com", want: "use regex:"},
		{name: "suffix wildcard", in: "api.example.*", want: "use regex:"},
		{name: "partial label wildcard", in: "api*.example.com", want: "use regex:"},
		{name: "bad regex", in: "regex:(", want: "does not compile as RE2"},
		{name: "bad path regex", in: `regex:api\.example\.com/(`, want: "path regex"},
		{name: "regex no host", in: "regex:/v1/.*", want: "no host part"},
		{name: "ip host", in: "203.0.113.7", want: "cidr:203.0.113.7/32"},
		{name: "ipv6 host", in: "[2001:db8::1]", want: "IPv4-only"},
		{name: "port zero", in: "api.example.com:0", want: "port"},
		{name: "port too big", in: "api.example.com:65536", want: "port"},
		{name: "port text", in: "api.example.com:https", want: "port"},
		{name: "port leading zero", in: "api.example.com:0443", want: "port"},
		{name: "lower method", in: "get api.github.com", want: "not an HTTP method"},
		{name: "two spaces in", in: "GET api.github.com /x", want: "space"},
		{name: "query in path", in: "api.example.com/v1?x=1", want: "query"},
		{name: "control char", in: "api.example.com\n", want: "control character"},
		{name: "cidr no length", in: "cidr:203.0.113.7", want: "prefix length"},
		{name: "cidr host bits", in: "cidr:203.0.113.7/24", want: "did you mean 203.0.113.0/24"},
		{name: "cidr v6", in: "cidr:2001:db8::/32", want: "not IPv4"},
		{name: "cidr bad length", in: "cidr:203.0.113.0/33", want: "0 to 32"},
		{name: "cidr with method", in: "GET cidr:203.0.113.0/24", want: "needs a host name"},
		{name: "numeric last label", in: "example.123", want: "not a host name"},
		{name: "hex last label", in: "foo.0x7f", want: "not a host name"},
		{name: "decimal ip", in: "3405803783", want: "not a host name"},
		{name: "label too long", in: strings.Repeat("a", 64) + ".com", want: "not a host name"},
		{name: "bad char", in: "api$.example.com", want: "not a host name"},
		{name: "leading hyphen", in: "-api.example.com", want: "not a host name"},
		{name: "empty label", in: "api..example.com", want: "not a host name"},
		{name: "too long", in: "regex:" + strings.Repeat("a", MaxPatternLen), want: "longer than"},
		{name: "backslash in path", in: `api.example.com/a\b`, want: "backslash"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.in, ParseOptions{})
			if err == nil {
				t.Fatalf("Parse(%q) succeeded, want error containing %q", tt.in, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%q) error = %q, want it to contain %q", tt.in, err, tt.want)
			}
			if got := errors.Is(err, ErrBroad); got != tt.broad {
				t.Errorf("errors.Is(err, ErrBroad) = %v, want %v", got, tt.broad)
			}
			_, ferr := Parse(tt.in, ParseOptions{Force: true})
			if tt.broad && ferr != nil {
				t.Errorf("Parse(%q, Force) = %v, want it accepted", tt.in, ferr)
			}
			if !tt.broad && ferr == nil {
				t.Errorf("Parse(%q, Force) succeeded; force must only accept broad patterns", tt.in)
			}
		})
	}
}

// TestPatternMatches covers every example of docs/design.md §3.1, the policy file
// example and the seed examples, each as a user would test it: a pattern and
// a sample URL.
func TestPatternMatches(t *testing.T) {
	tests := []struct {
		pattern string
		sample  string
		want    bool
	}{
		// exact host: that host only, any path
		{"api.github.com", "https://api.github.com/", true},
		{"api.github.com", "https://api.github.com/repos/x/y", true},
		{"api.github.com", "http://api.github.com/", true},
		{"api.github.com", "https://github.com/", false},
		{"api.github.com", "https://x.api.github.com/", false},
		{"api.github.com", "https://api.github.com.evil.com/", false},
		{"api.github.com", "https://API.GitHub.com./", true},
		// wildcard subdomain: one or more labels, not the domain itself
		{"*.googleapis.com", "https://storage.googleapis.com/b/o", true},
		{"*.googleapis.com", "https://a.b.googleapis.com/", true},
		{"*.googleapis.com", "https://googleapis.com/", false},
		{"*.googleapis.com", "https://evilgoogleapis.com/", false},
		{"*.googleapis.com", "https://googleapis.com.evil.com/", false},
		// host + path glob
		{"api.example.com/v1/*", "https://api.example.com/v1/", true},
		{"api.example.com/v1/*", "https://api.example.com/v1/users/7", true},
		{"api.example.com/v1/*", "https://api.example.com/v1/a/b/c?q=1", true},
		{"api.example.com/v1/*", "https://api.example.com/v2/users", false},
		{"api.example.com/v1/*", "https://api.example.com/v1", false},
		{"api.example.com/v1/*", "https://api.example.com/v1/../admin", false},
		{"api.example.com/v1/*", "https://api.example.com/v1/%2e%2e/admin", false},
		{"api.example.com/v1/*", "https://api.example.com/v1%2F..%2Fadmin", false},
		{"api.example.com/v1/*", "https://api.example.com/%76%31/x", true},
		{"api.example.com/v1/*", "https://cdn.example.com/v1/x", false},
		// full wildcard
		{"*.example.com/*", "https://cdn.example.com/anything/at/all", true},
		{"*.example.com/*", "https://example.com/", false},
		// regex, fully anchored, against the host
		{`regex:.*\.example\.(com|org)`, "https://api.example.com/", true},
		{`regex:.*\.example\.(com|org)`, "https://cdn.example.org/x", true},
		{`regex:.*\.example\.(com|org)`, "https://api.example.net/", false},
		{`regex:.*\.example\.(com|org)`, "https://api.example.com.evil.io/", false},
		{`regex:.*\.example\.(com|org)`, "https://API.EXAMPLE.COM/", true},
		{`regex:.*\.internal\.company\.com`, "https://git.internal.company.com/", true},
		{`regex:.*\.internal\.company\.com`, "https://internal.company.com/", false},
		// regex against host+path
		{`regex:api\.example\.com/v[0-9]+/.*`, "https://api.example.com/v2/x", true},
		{`regex:api\.example\.com/v[0-9]+/.*`, "https://api.example.com/beta/x", false},
		// method prefix
		{"GET api.github.com/repos/*", "GET https://api.github.com/repos/a/b", true},
		{"GET api.github.com/repos/*", "https://api.github.com/repos/a/b", true},
		{"GET api.github.com/repos/*", "POST https://api.github.com/repos/a/b", false},
		{"GET api.github.com/repos/*", "GET https://api.github.com/user", false},
		// port: without one, 80 and 443
		{"db.example.com:5432", "http://db.example.com:5432/", true},
		{"db.example.com:5432", "https://db.example.com/", false},
		{"*.example.com:8443", "https://api.example.com:8443/", true},
		{"*.example.com:8443", "https://api.example.com/", false},
		{"api.github.com", "https://api.github.com:8443/", false},
		{"api.github.com", "http://api.github.com:80/", true},
		// cidr: raw IP destinations only
		{"cidr:203.0.113.0/24", "https://203.0.113.9/", true},
		{"cidr:203.0.113.0/24", "https://203.0.114.9/", false},
		{"cidr:203.0.113.7/32:22", "http://203.0.113.7:22/", true},
		{"cidr:203.0.113.7/32:22", "https://203.0.113.7/", false},
		// policy file example
		{"generativelanguage.googleapis.com", "https://generativelanguage.googleapis.com/v1beta/models", true},
		{"api.anthropic.com", "https://api.anthropic.com/v1/messages", true},
		{"pastebin.com", "https://pastebin.com/raw/x", true},
		// seed examples
		{"*.unknown.com/api/v*", "https://api.unknown.com/api/v1/data", true},
		{"*.unknown.com/api/v*", "https://cdn.unknown.com/api/v2/files", true},
		{"*.unknown.com/api/v*", "https://api.unknown.com/other/path", false},
		// IDNA
		{"bücher.example", "https://xn--bcher-kva.example/", true},
		{"xn--bcher-kva.example", "https://bücher.example/", true},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+" "+tt.sample, func(t *testing.T) {
			p, err := Parse(tt.pattern, ParseOptions{})
			if err != nil {
				t.Fatal(err)
			}
			q, err := SampleQuery(tt.sample)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Matches(q); got != tt.want {
				t.Errorf("%q matches %q = %v, want %v", tt.pattern, tt.sample, got, tt.want)
			}
		})
	}
}

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		glob, s string
		want    bool
	}{
		{"/v1/*", "/v1/", true},
		{"/v1/*", "/v1/a/b", true},
		{"/v1/*", "/v1", false},
		{"/api/v*", "/api/v1/data", true},
		{"/api/v*", "/api/x", false},
		{"/*/x/*", "/a/b/x/c", true},
		{"/*/x/*", "/a/b/y/c", false},
		{"/a*b*c", "/aXXbYYc", true},
		{"/a*b*c", "/aXXbYYcd", false},
		{"/exact", "/exact", true},
		{"/exact", "/exactly", false},
		{"*", "", true},
		{"/**", "/", true},
	}
	for _, tt := range tests {
		if got := globMatch(tt.glob, tt.s); got != tt.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tt.glob, tt.s, got, tt.want)
		}
	}
}

func TestRequestPaths(t *testing.T) {
	tests := []struct {
		raw, clean, merged string
		ambiguous          bool
	}{
		{"/v1/x?q=1#f", "/v1/x", "/v1/x", false},
		{"", "/", "/", false},
		{"/a/./b/../c", "/a/c", "/a/c", false},
		{"/a/..", "/", "/", false},
		{"/../../etc", "/etc", "/etc", false},
		{"/%2e%2e/admin", "/admin", "/admin", false},
		{"/%41%7e", "/A~", "/A~", false},
		{"/a%2fb", "/a%2Fb", "/a%2Fb", true},
		{"/a%5cb", "/a%5Cb", "/a%5Cb", true},
		{`/a\b`, `/a\b`, `/a\b`, true},
		{"/a%00", "/a%00", "/a%00", true},
		{"/a%zz", "/a%zz", "/a%zz", true},
		{"//admin//x", "//admin//x", "/admin/x", false},
		{"/caf%C3%A9", "/caf%C3%A9", "/caf%C3%A9", false},
	}
	for _, tt := range tests {
		clean, merged, amb := requestPaths(tt.raw)
		if clean != tt.clean || merged != tt.merged || amb != tt.ambiguous {
			t.Errorf("requestPaths(%q) = %q, %q, %v; want %q, %q, %v", tt.raw, clean, merged, amb, tt.clean, tt.merged, tt.ambiguous)
		}
	}
}

func TestNormalizeHost(t *testing.T) {
	tests := []struct {
		in, want string
		err      bool
	}{
		{in: "api.github.com", want: "api.github.com"},
		{in: "API.GitHub.Com", want: "api.github.com"},
		{in: "api.github.com.", want: "api.github.com"},
		{in: "ApI.gItHuB.cOm.", want: "api.github.com"},
		{in: "bücher.example", want: "xn--bcher-kva.example"},
		{in: "BÜCHER.example", want: "xn--bcher-kva.example"},
		{in: "203.0.113.7", want: "203.0.113.7"},
		{in: "[2001:db8::1]", want: "2001:db8::1"},
		{in: "::ffff:203.0.113.7", want: "203.0.113.7"},
		{in: "3405803783", err: true},
		{in: "0x7f.0.0.1", err: true},
		{in: "127.1", err: true},
		{in: "", err: true},
		{in: ".", err: true},
		{in: "a..b", err: true},
		{in: "evil.com\x00.good.com", err: true},
		{in: "a b.com", err: true},
		{in: strings.Repeat("a.", 127) + "com", err: true},
	}
	for _, tt := range tests {
		got, err := NormalizeHost(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("NormalizeHost(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

func TestNormalizeHostDoesNotAllocateForNormalNames(t *testing.T) {
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := NormalizeHost("storage.googleapis.com"); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("NormalizeHost allocates %v times for a normal name, want 0", allocs)
	}
}

func TestSampleQueryErrors(t *testing.T) {
	for _, s := range []string{"", "ftp://x.com/", "get https://x.com/", "https://x.com:99999/", "https://3405803783/"} {
		if _, err := SampleQuery(s); err == nil {
			t.Errorf("SampleQuery(%q) succeeded, want an error", s)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"api.github.com", "*.googleapis.com", "api.example.com/v1/*", "*.example.com/*",
		`regex:.*\.example\.(com|org)`, "GET api.github.com/repos/*", "db.example.com:5432",
		"*.example.com:8443", "cidr:203.0.113.0/24", "cidr:203.0.113.7/32:22", "*", "*.com",
		"bücher.example", "regex:a/b", "POST *.x.io:81/a*b", "Cidr:1", "Regex:443",
	} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, force bool) {
		p, err := Parse(s, ParseOptions{Force: force})
		if err != nil {
			if !p.IsZero() {
				t.Fatalf("Parse(%q) returned an error and a pattern", s)
			}
			return
		}
		again, err := Parse(p.String(), ParseOptions{Force: true})
		if err != nil {
			t.Fatalf("canonical %q of %q does not parse: %v", p.String(), s, err)
		}
		if again.String() != p.String() {
			t.Fatalf("canonical form not stable: %q → %q → %q", s, p.String(), again.String())
		}
		// Matching never panics, whatever the pattern.
		p.Matches(Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/x"})
		p.Matches(Query{Host: "203.0.113.7", Port: 80})
	})
}
