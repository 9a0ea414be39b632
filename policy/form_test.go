package policy

import "testing"

// TestPatternForm: the allowlist manager, the API and `airlock ls` name a
// rule's form as the pattern language's table does; a host with a path glob
// is not an exact host.
func TestPatternForm(t *testing.T) {
	for _, tc := range []struct {
		name, pattern, want string
	}{
		{"exact host", "api.github.com", "exact"},
		{"exact host with a port", "db.example.com:5432", "exact"},
		{"exact host, any path", "api.github.com/*", "exact"},
		{"wildcard", "*.googleapis.com", "wildcard"},
		{"full wildcard", "*.example.com/*", "wildcard"},
		{"host and path glob", "api.allowed.test/v1/*", "path"},
		{"wildcard and path glob", "*.example.com/api/*", "wildcard-path"},
		{"method", "GET api.github.com/repos/*", "method"},
		{"method, any path", "POST api.github.com", "method"},
		{"regex", `regex:.*\.example\.com`, "regex"},
		{"regex with a path", `regex:api\.example\.com/v[0-9]+/.*`, "regex"},
		{"cidr", "cidr:203.0.113.0/24", "cidr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse(tc.pattern, ParseOptions{})
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.pattern, err)
			}
			if got := p.Form(); got != tc.want {
				t.Errorf("Parse(%q).Form() = %q, want %q", tc.pattern, got, tc.want)
			}
		})
	}
}
