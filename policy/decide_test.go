package policy

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// ruleset builds a Ruleset from patterns; a pattern prefixed "deny " goes to
// the denylist, "auto "/"session " choose the tier, "@member " restricts it.
func ruleset(t testing.TB, unknown Action, specs ...string) *Ruleset {
	t.Helper()
	var rules []*Rule
	for _, s := range specs {
		list, tier, member := Allowlist, User, ""
		for {
			switch {
			case len(s) > 5 && s[:5] == "deny ":
				list, s = Denylist, s[5:]
				continue
			case len(s) > 5 && s[:5] == "auto ":
				tier, s = Auto, s[5:]
				continue
			case len(s) > 8 && s[:8] == "session ":
				tier, s = Session, s[8:]
				continue
			case len(s) > 1 && s[0] == '@':
				i := 0
				for i < len(s) && s[i] != ' ' {
					i++
				}
				member, s = s[1:i], s[i+1:]
				continue
			}
			break
		}
		p, err := Parse(s, ParseOptions{Force: true})
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, NewRule(list, tier, p, member, "test", timeZero))
	}
	return NewRuleset(unknown, rules)
}

func TestDecide(t *testing.T) {
	type want struct {
		verdict Verdict
		rule    string // canonical pattern of the deciding rule, "" for none
		reason  Reason
	}
	tests := []struct {
		name    string
		unknown Action
		rules   []string
		q       Query
		want    want
	}{
		{
			name:  "exact allow",
			rules: []string{"api.github.com"},
			q:     Query{Host: "api.github.com", Port: 443},
			want:  want{Allow, "api.github.com", ReasonAllowRule},
		},
		{
			name:  "mixed case and trailing dot allowed",
			rules: []string{"api.github.com"},
			q:     Query{Host: "API.GitHub.com.", Port: 443},
			want:  want{Allow, "api.github.com", ReasonAllowRule},
		},
		{
			name:    "unknown asks",
			unknown: ActionAsk,
			rules:   []string{"api.github.com"},
			q:       Query{Host: "unknown.test", Port: 443},
			want:    want{Ask, "", ReasonUnknown},
		},
		{
			name:    "unknown denies",
			unknown: ActionDeny,
			q:       Query{Host: "unknown.test", Port: 443},
			want:    want{Deny, "", ReasonUnknown},
		},
		{
			name:    "unknown allows",
			unknown: ActionAllow,
			q:       Query{Host: "unknown.test", Port: 443},
			want:    want{Allow, "", ReasonUnknown},
		},
		{
			name:  "deny wins over allow",
			rules: []string{"*.example.com", "deny evil.example.com"},
			q:     Query{Host: "evil.example.com", Port: 443},
			want:  want{Deny, "evil.example.com", ReasonDenyRule},
		},
		{
			name:  "deny wins over session allow",
			rules: []string{"session pastebin.com", "deny pastebin.com"},
			q:     Query{Host: "pastebin.com", Port: 443},
			want:  want{Deny, "pastebin.com", ReasonDenyRule},
		},
		{
			name:    "deny wins over unknown allow",
			unknown: ActionAllow,
			rules:   []string{"deny *.pastebin.com"},
			q:       Query{Host: "x.PASTEBIN.com", Port: 80},
			want:    want{Deny, "*.pastebin.com", ReasonDenyRule},
		},
		{
			name:  "deny regex ignores case",
			rules: []string{"*.example.com", `deny regex:.*\.Evil\.example\.com`},
			q:     Query{Host: "a.evil.example.com", Port: 443},
			want:  want{Deny, `regex:.*\.Evil\.example\.com`, ReasonDenyRule},
		},
		{
			name:  "auto named before user",
			rules: []string{"auto api.anthropic.com", "api.anthropic.com"},
			q:     Query{Host: "api.anthropic.com", Port: 443},
			want:  want{Allow, "api.anthropic.com", ReasonAllowRule},
		},
		{
			name:  "most specific wildcard named",
			rules: []string{"*.example.com", "*.api.example.com"},
			q:     Query{Host: "v1.api.example.com", Port: 443},
			want:  want{Allow, "*.api.example.com", ReasonAllowRule},
		},
		{
			name:    "wildcard does not match its domain",
			unknown: ActionDeny,
			rules:   []string{"*.example.com"},
			q:       Query{Host: "example.com", Port: 443},
			want:    want{Deny, "", ReasonUnknown},
		},
		{
			name:  "path rule needs L7",
			rules: []string{"api.example.com/v1/*"},
			q:     Query{Host: "api.example.com", Port: 443},
			want:  want{NeedsL7, "api.example.com/v1/*", ReasonPathRules},
		},
		{
			name:  "method rule needs L7",
			rules: []string{"GET api.github.com/repos/*"},
			q:     Query{Host: "api.github.com", Port: 443},
			want:  want{NeedsL7, "GET api.github.com/repos/*", ReasonPathRules},
		},
		{
			name:  "host allow with a path deny needs L7",
			rules: []string{"api.example.com", "deny api.example.com/admin/*"},
			q:     Query{Host: "api.example.com", Port: 443},
			want:  want{NeedsL7, "api.example.com/admin/*", ReasonDenyPathRule},
		},
		{
			name:    "unknown allow with a path deny needs L7",
			unknown: ActionAllow,
			rules:   []string{"deny api.example.com/admin/*"},
			q:       Query{Host: "api.example.com", Port: 443},
			want:    want{NeedsL7, "api.example.com/admin/*", ReasonDenyPathRule},
		},
		{
			name:  "host/* is host level",
			rules: []string{"api.example.com/*"},
			q:     Query{Host: "api.example.com", Port: 443},
			want:  want{Allow, "api.example.com/*", ReasonAllowRule},
		},
		{
			name:  "request under allowed path",
			rules: []string{"api.example.com/v1/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/users"},
			want:  want{Allow, "api.example.com/v1/*", ReasonAllowRule},
		},
		{
			name:    "request outside allowed path",
			unknown: ActionAsk,
			rules:   []string{"api.example.com/v1/*"},
			q:       Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v2/users"},
			want:    want{Ask, "", ReasonUnknown},
		},
		{
			name:    "dot segments do not escape an allowed path",
			unknown: ActionDeny,
			rules:   []string{"api.example.com/v1/*"},
			q:       Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/../admin"},
			want:    want{Deny, "", ReasonUnknown},
		},
		{
			name:    "encoded slash is not allowed by a path rule",
			unknown: ActionDeny,
			rules:   []string{"api.example.com/v1/*"},
			q:       Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/..%2fadmin"},
			want:    want{Deny, "", ReasonUnknown},
		},
		{
			name:  "deny path matched through dot segments",
			rules: []string{"api.example.com", "deny api.example.com/admin/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/public/../admin/x"},
			want:  want{Deny, "api.example.com/admin/*", ReasonDenyRule},
		},
		{
			name:  "deny path matched through doubled slashes",
			rules: []string{"api.example.com", "deny api.example.com/admin/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "//admin//x"},
			want:  want{Deny, "api.example.com/admin/*", ReasonDenyRule},
		},
		{
			name:  "deny path matched through encoding",
			rules: []string{"api.example.com", "deny api.example.com/admin/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/%61dmin/x"},
			want:  want{Deny, "api.example.com/admin/*", ReasonDenyRule},
		},
		{
			name:  "deny path matched through segment parameters",
			rules: []string{"api.example.com", "deny api.example.com/admin/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/admin;jsessionid=1/x"},
			want:  want{Deny, "api.example.com/admin/*", ReasonDenyRule},
		},
		{
			name:  "deny path matched through case",
			rules: []string{"api.example.com", "deny api.example.com/admin/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/ADMIN/x"},
			want:  want{Deny, "api.example.com/admin/*", ReasonDenyRule},
		},
		{
			name:  "a deny path with capitals matches lower case",
			rules: []string{"api.example.com", "deny api.example.com/Admin/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/admin/x"},
			want:  want{Deny, "api.example.com/Admin/*", ReasonDenyRule},
		},
		{
			name:  "a deny path with capitals matches upper case",
			rules: []string{"api.example.com", "deny api.example.com/Admin/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/ADMIN/x"},
			want:  want{Deny, "api.example.com/Admin/*", ReasonDenyRule},
		},
		{
			name:  "a deny regex path matches any case",
			rules: []string{"api.example.com", "deny regex:api\\.example\\.com/Admin/.*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/aDmIn/x"},
			want:  want{Deny, "regex:api\\.example\\.com/Admin/.*", ReasonDenyRule},
		},
		{
			name:  "a deny path with an escaped unreserved character",
			rules: []string{"api.example.com", "deny api.example.com/%7Euser/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/~user/x"},
			want:  want{Deny, "api.example.com/%7Euser/*", ReasonDenyRule},
		},
		{
			name:  "an exact deny path matches a trailing slash",
			rules: []string{"api.example.com", "deny api.example.com/v1/admin"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/admin/"},
			want:  want{Deny, "api.example.com/v1/admin", ReasonDenyRule},
		},
		{
			name:  "an exact deny path matches a format suffix",
			rules: []string{"api.example.com", "deny api.example.com/v1/admin"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/admin.json"},
			want:  want{Deny, "api.example.com/v1/admin", ReasonDenyRule},
		},
		{
			name:  "an exact deny path matches trailing dots",
			rules: []string{"api.example.com", "deny api.example.com/v1/admin"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/Admin.."},
			want:  want{Deny, "api.example.com/v1/admin", ReasonDenyRule},
		},
		{
			name:  "an exact deny path matches a trailing space",
			rules: []string{"api.example.com", "deny api.example.com/v1/admin"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/admin%20"},
			want:  want{Deny, "api.example.com/v1/admin", ReasonDenyRule},
		},
		{
			name:  "an exact deny path matches an NTFS stream",
			rules: []string{"api.example.com", "deny api.example.com/v1/admin"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/admin::$DATA"},
			want:  want{Deny, "api.example.com/v1/admin", ReasonDenyRule},
		},
		{
			name:  "an exact deny path matches them together",
			rules: []string{"api.example.com", "deny api.example.com/v1/admin"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/ADMIN.json/"},
			want:  want{Deny, "api.example.com/v1/admin", ReasonDenyRule},
		},
		{
			name:  "an exact deny path does not match a longer name",
			rules: []string{"api.example.com", "deny api.example.com/v1/admin"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/administrator"},
			want:  want{Allow, "api.example.com", ReasonAllowRule},
		},
		{
			name:  "an exact deny path does not match what is under it",
			rules: []string{"api.example.com", "deny api.example.com/v1/admin"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/admin/x"},
			want:  want{Allow, "api.example.com", ReasonAllowRule},
		},
		{
			name:  "a GET deny denies HEAD",
			rules: []string{"api.example.com", "deny GET api.example.com/v1/trigger/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "HEAD", Path: "/v1/trigger/x"},
			want:  want{Deny, "GET api.example.com/v1/trigger/*", ReasonDenyRule},
		},
		{
			name:  "a GET deny does not deny POST",
			rules: []string{"api.example.com", "deny GET api.example.com/v1/trigger/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "POST", Path: "/v1/trigger/x"},
			want:  want{Allow, "api.example.com", ReasonAllowRule},
		},
		{
			name:  "a HEAD deny does not deny GET",
			rules: []string{"api.example.com", "deny HEAD api.example.com/v1/trigger/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/trigger/x"},
			want:  want{Allow, "api.example.com", ReasonAllowRule},
		},
		{
			name:  "an allow path with an escaped unreserved character",
			rules: []string{"api.example.com/%7Euser/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/~user/x"},
			want:  want{Allow, "api.example.com/%7Euser/*", ReasonAllowRule},
		},
		{
			name:    "segment parameters do not escape an allowed path",
			unknown: ActionDeny,
			rules:   []string{"api.example.com/v1/*"},
			q:       Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/..;/admin"},
			want:    want{Deny, "", ReasonUnknown},
		},
		{
			name:    "encoded segment parameters do not escape an allowed path",
			unknown: ActionDeny,
			rules:   []string{"api.example.com/v1/*"},
			q:       Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/%2e%2e%3b/admin"},
			want:    want{Deny, "", ReasonUnknown},
		},
		{
			name:    "a regex path rule does not allow an ambiguous path",
			unknown: ActionDeny,
			rules:   []string{`regex:api\.example\.com/v1/.*`},
			q:       Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/..%2fadmin"},
			want:    want{Deny, "", ReasonUnknown},
		},
		{
			name:  "other paths of a host with a path deny pass",
			rules: []string{"api.example.com", "deny api.example.com/admin/*"},
			q:     Query{Host: "api.example.com", Port: 443, Method: "GET", Path: "/public/x"},
			want:  want{Allow, "api.example.com", ReasonAllowRule},
		},
		{
			name:  "method rule allows its method",
			rules: []string{"GET api.github.com/repos/*"},
			q:     Query{Host: "api.github.com", Port: 443, Method: "GET", Path: "/repos/a/b"},
			want:  want{Allow, "GET api.github.com/repos/*", ReasonAllowRule},
		},
		{
			name:    "method rule refuses other methods",
			unknown: ActionAsk,
			rules:   []string{"GET api.github.com/repos/*"},
			q:       Query{Host: "api.github.com", Port: 443, Method: "DELETE", Path: "/repos/a/b"},
			want:    want{Ask, "", ReasonUnknown},
		},
		{
			name:  "deny method rule",
			rules: []string{"api.github.com", "deny DELETE api.github.com"},
			q:     Query{Host: "api.github.com", Port: 443, Method: "delete", Path: "/repos/a/b"},
			want:  want{Deny, "DELETE api.github.com", ReasonDenyRule},
		},
		{
			name:    "port rule admits its port",
			unknown: ActionDeny,
			rules:   []string{"db.example.com:5432"},
			q:       Query{Host: "db.example.com", Port: 5432},
			want:    want{Allow, "db.example.com:5432", ReasonAllowRule},
		},
		{
			name:    "port rule does not admit 443",
			unknown: ActionDeny,
			rules:   []string{"db.example.com:5432"},
			q:       Query{Host: "db.example.com", Port: 443},
			want:    want{Deny, "", ReasonUnknown},
		},
		{
			name:    "no port means 80 and 443 only",
			unknown: ActionDeny,
			rules:   []string{"api.github.com"},
			q:       Query{Host: "api.github.com", Port: 22},
			want:    want{Deny, "", ReasonUnknown},
		},
		{
			name:    "member rule for its member",
			unknown: ActionDeny,
			rules:   []string{"@mcp:github api.github.com"},
			q:       Query{Source: "mcp:github", Host: "api.github.com", Port: 443},
			want:    want{Allow, "api.github.com", ReasonAllowRule},
		},
		{
			name:    "member rule not for others",
			unknown: ActionDeny,
			rules:   []string{"@mcp:github api.github.com"},
			q:       Query{Source: "agent", Host: "api.github.com", Port: 443},
			want:    want{Deny, "", ReasonUnknown},
		},
		{
			name:  "member deny only for its member",
			rules: []string{"api.github.com", "deny @agent api.github.com"},
			q:     Query{Source: "mcp:github", Host: "api.github.com", Port: 443},
			want:  want{Allow, "api.github.com", ReasonAllowRule},
		},
		{
			name:    "raw IP denied even when unknown allows",
			unknown: ActionAllow,
			q:       Query{Host: "203.0.113.7", Port: 443},
			want:    want{Deny, "", ReasonRawIP},
		},
		{
			name:    "raw IP not matched by host rules",
			unknown: ActionAsk,
			rules:   []string{"*", `regex:.*`},
			q:       Query{Host: "203.0.113.7", Port: 443},
			want:    want{Deny, "", ReasonRawIP},
		},
		{
			name:  "cidr allows raw IP",
			rules: []string{"cidr:203.0.113.0/24"},
			q:     Query{Host: "203.0.113.7", Port: 443},
			want:  want{Allow, "cidr:203.0.113.0/24", ReasonAllowRule},
		},
		{
			name:  "cidr with port",
			rules: []string{"cidr:203.0.113.7/32:22"},
			q:     Query{Host: "203.0.113.7", Port: 22},
			want:  want{Allow, "cidr:203.0.113.7/32:22", ReasonAllowRule},
		},
		{
			name:  "cidr deny wins",
			rules: []string{"cidr:203.0.113.0/24", "deny cidr:203.0.113.128/25"},
			q:     Query{Host: "203.0.113.200", Port: 443},
			want:  want{Deny, "cidr:203.0.113.128/25", ReasonDenyRule},
		},
		{
			name:  "cidr does not match names",
			rules: []string{"cidr:203.0.113.0/24"},
			q:     Query{Host: "allowed.test", Port: 443},
			want:  want{Ask, "", ReasonUnknown},
		},
		{
			name:    "numeric host is not a name",
			unknown: ActionAllow,
			q:       Query{Host: "3405803783", Port: 80},
			want:    want{Deny, "", ReasonBadHost},
		},
		{
			name:    "garbage host",
			unknown: ActionAllow,
			q:       Query{Host: "a b\x00c", Port: 80},
			want:    want{Deny, "", ReasonBadHost},
		},
		{
			name:  "IDNA host matches punycode rule",
			rules: []string{"xn--bcher-kva.example"},
			q:     Query{Host: "BÜCHER.example", Port: 443},
			want:  want{Allow, "xn--bcher-kva.example", ReasonAllowRule},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			unknown := tt.unknown
			if unknown == 0 {
				unknown = ActionAsk
			}
			d := ruleset(t, unknown, tt.rules...).Decide(tt.q)
			got := want{d.Verdict, "", d.Reason}
			if d.Rule != nil {
				got.rule = d.Rule.Pattern.String()
			}
			if got != tt.want {
				t.Errorf("Decide(%+v) = %+v, want %+v (%s)", tt.q, got, tt.want, d)
			}
		})
	}
}

func TestDecisionZeroValueDenies(t *testing.T) {
	var d Decision
	if d.Verdict != Deny {
		t.Fatalf("zero Decision has verdict %v, want deny", d.Verdict)
	}
	if rs := NewRuleset(0); rs.Decide(Query{Host: "x.test", Port: 443}).Verdict != Deny {
		t.Fatal("a Ruleset with no unknown action must deny unknown hosts")
	}
}

func TestDecisionExplainNamesRule(t *testing.T) {
	d := ruleset(t, ActionAsk, "deny pastebin.com").Decide(Query{Host: "pastebin.com", Port: 443})
	got := d.Explain("pastebin.com")
	want := `deny pastebin.com: a deny rule matched, pattern "pastebin.com" in the denylist (user)`
	if got != want {
		t.Errorf("Explain = %q, want %q", got, want)
	}
}

func TestDecideHostOnlyDoesNotAllocate(t *testing.T) {
	rs := ruleset(t, ActionAsk, "api.github.com", "*.googleapis.com", "deny pastebin.com",
		`regex:.*\.internal\.company\.com`, "api.example.com/v1/*", "cidr:203.0.113.0/24")
	for _, q := range []Query{
		{Host: "api.github.com", Port: 443},
		{Host: "storage.googleapis.com", Port: 443},
		{Host: "pastebin.com", Port: 443},
		{Host: "git.internal.company.com", Port: 443},
		{Host: "api.example.com", Port: 443},
		{Host: "unknown.test", Port: 443},
		{Host: "203.0.113.9", Port: 443},
	} {
		allocs := testing.AllocsPerRun(100, func() { rs.Decide(q) })
		if allocs != 0 {
			t.Errorf("Decide(%s) allocates %v times, want 0", q.Host, allocs)
		}
	}
}

func TestSuggest(t *testing.T) {
	tests := []struct {
		host string
		want []string
	}{
		{"api.unknown.com", []string{"api.unknown.com", "api.unknown.com/*", "*.unknown.com", "*.unknown.com/*"}},
		{"API.Unknown.COM.", []string{"api.unknown.com", "api.unknown.com/*", "*.unknown.com", "*.unknown.com/*"}},
		{"a.b.example.co.uk", []string{"a.b.example.co.uk", "a.b.example.co.uk/*", "*.example.co.uk", "*.example.co.uk/*"}},
		{"storage.googleapis.com", []string{"storage.googleapis.com", "storage.googleapis.com/*", "*.storage.googleapis.com", "*.storage.googleapis.com/*"}},
		{"com", []string{"com", "com/*"}},
		{"kawasaki.jp", []string{"kawasaki.jp", "kawasaki.jp/*"}}, // every x.kawasaki.jp is a public suffix
		{"a.b.x.kawasaki.jp", []string{"a.b.x.kawasaki.jp", "a.b.x.kawasaki.jp/*", "*.b.x.kawasaki.jp", "*.b.x.kawasaki.jp/*"}},
		{"203.0.113.7", []string{"cidr:203.0.113.7/32"}},
	}
	for _, tt := range tests {
		s, err := Suggest(tt.host)
		if err != nil {
			t.Fatalf("Suggest(%q): %v", tt.host, err)
		}
		var got []string
		for _, x := range s {
			got = append(got, x.Pattern)
			if _, err := Parse(x.Pattern, ParseOptions{}); err != nil {
				t.Errorf("Suggest(%q) offers %q, which Parse refuses: %v", tt.host, x.Pattern, err)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("Suggest(%q) = %q, want %q", tt.host, got, tt.want)
		}
	}
	if _, err := Suggest("not a host"); err == nil {
		t.Error("Suggest of a bad host succeeded")
	}
}

// benchRules returns n rules: mostly exact hosts, a tenth wildcards and a
// tenth path rules, as a large real allowlist would hold.
func benchRules(n int) ([]*Rule, []string) {
	rules := make([]*Rule, 0, n)
	hosts := make([]string, 0, n)
	for i := 0; i < n; i++ {
		var s, h string
		switch i % 10 {
		case 0:
			s, h = fmt.Sprintf("*.svc%d.example.com", i), fmt.Sprintf("api.svc%d.example.com", i)
		case 1:
			s, h = fmt.Sprintf("api%d.example.net/v1/*", i), fmt.Sprintf("api%d.example.net", i)
		default:
			s, h = fmt.Sprintf("host%d.example.org", i), fmt.Sprintf("host%d.example.org", i)
		}
		rules = append(rules, NewRule(Allowlist, User, MustParse(s), "", "bench", timeZero))
		hosts = append(hosts, h)
	}
	return rules, hosts
}

func BenchmarkDecideHost(b *testing.B) {
	for _, n := range []int{10, 1000, 100000} {
		rules, hosts := benchRules(n)
		rs := NewRuleset(ActionAsk, rules)
		r := rand.New(rand.NewPCG(1, 2))
		qs := make([]Query, 1024)
		for i := range qs {
			h := hosts[r.IntN(len(hosts))]
			if i%4 == 3 {
				h = fmt.Sprintf("unknown%d.test", i)
			}
			qs[i] = Query{Host: h, Port: 443}
		}
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				rs.Decide(qs[i&1023])
			}
		})
	}
}

func BenchmarkDecideRequest(b *testing.B) {
	for _, n := range []int{10, 1000, 100000} {
		rules, hosts := benchRules(n)
		rs := NewRuleset(ActionAsk, rules)
		r := rand.New(rand.NewPCG(1, 2))
		qs := make([]Query, 1024)
		for i := range qs {
			qs[i] = Query{Host: hosts[r.IntN(len(hosts))], Port: 443, Method: "GET", Path: "/v1/users/7?page=2"}
		}
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				rs.Decide(qs[i&1023])
			}
		})
	}
}

func TestDecideName(t *testing.T) {
	type want struct {
		verdict Verdict
		rule    string
	}
	rs := ruleset(t, ActionAsk, "*.example.com", "api.example.net/v1/*", "db.example.org:5432",
		"deny pastebin.com", "deny ssh.example.com:22", "deny api.example.com/admin/*", "@mcp:github api.github.com")
	tests := []struct {
		name, source, host string
		want               want
	}{
		{name: "wildcard allows", host: "cdn.example.com", want: want{Allow, "*.example.com"}},
		{name: "path rule allows the name", host: "api.example.net", want: want{Allow, "api.example.net/v1/*"}},
		{name: "port rule allows the name", host: "DB.example.org.", want: want{Allow, "db.example.org:5432"}},
		{name: "deny", host: "pastebin.com", want: want{Deny, "pastebin.com"}},
		{name: "port deny does not deny the name", host: "ssh.example.com", want: want{Allow, "*.example.com"}},
		{name: "path deny does not deny the name", host: "api.example.com", want: want{Allow, "*.example.com"}},
		{name: "unknown", host: "unknown.test", want: want{Ask, ""}},
		{name: "member rule for its member", source: "mcp:github", host: "api.github.com", want: want{Allow, "api.github.com"}},
		{name: "member rule not for others", source: "agent", host: "api.github.com", want: want{Ask, ""}},
		{name: "ip literal is not a name", host: "203.0.113.7", want: want{Deny, ""}},
		{name: "garbage", host: "a\x00b", want: want{Deny, ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := rs.DecideName(tt.source, tt.host)
			got := want{verdict: d.Verdict}
			if d.Rule != nil {
				got.rule = d.Rule.Pattern.String()
			}
			if got != tt.want {
				t.Errorf("DecideName(%q, %q) = %+v, want %+v", tt.source, tt.host, got, tt.want)
			}
		})
	}
	if a := testing.AllocsPerRun(100, func() { rs.DecideName("", "cdn.example.com") }); a != 0 {
		t.Errorf("DecideName allocates %v times, want 0", a)
	}
}

// TestDenyRuleSpellings: a deny rule denies the spellings servers take as
// the path it names; TestDenyRuleSpellingsControl: and no other path.
func TestDenyRuleSpellings(t *testing.T) {
	for _, c := range []struct{ name, deny, path, why string }{
		// A regex that tells case apart still matches the path as sent.
		{"regex (?-i) exact request", `regex:api\.example\.com/(?-i)Admin/.*`, "/Admin/x", "the path as sent"},
		{"regex negated class", `regex:api\.example\.com/.*[^a-z0-9/].*`, "/Admin", "[^a-z] under (?i) excludes A-Z, and the form is lower-cased"},
		{"regex \\P{Ll}", `regex:api\.example\.com/v1/\P{Ll}.*`, "/v1/Xyz", "not a lower-case letter: matched /v1/Xyz before"},
		// Unicode case: Java's String.equalsIgnoreCase (Spring
		// AntPathMatcher with caseSensitive=false), Go's strings.EqualFold
		// and Python's re.IGNORECASE take these as the ASCII letter.
		{"dotless i", "api.example.com/admin/*", "/adm%C4%B1n/x", "Java equalsIgnoreCase: ı = i"},
		{"dotted capital I", "api.example.com/admin/*", "/ADM%C4%B0N/x", "Java equalsIgnoreCase: İ = i"},
		{"Kelvin sign", "api.example.com/keys/*", "/%E2%84%AAeys/x", "Java equalsIgnoreCase, Go EqualFold: K = k"},
		{"long s", "api.example.com/secrets/*", "/%C5%BFecrets/x", "Java equalsIgnoreCase, Go EqualFold: ſ = s"},
		// IIS/NTFS: trailing dots, spaces and streams are cut from every
		// path component, not only the last (Win32 path normalisation;
		// "::$INDEX_ALLOCATION" names a directory's own stream).
		{"NTFS directory stream", "api.example.com/admin/*", "/admin::$INDEX_ALLOCATION/x", "IIS opens admin\\x"},
		{"inner trailing dot", "api.example.com/admin/*", "/admin./x", "Win32 strips a component's trailing dot"},
		{"inner trailing space", "api.example.com/admin/*", "/admin%20/x", "Win32 strips a component's trailing space"},
		// A tree deny covers "/admin/" (the * matches nothing), which
		// Express (strict: false), Rails and Spring 5 route as "/admin".
		{"tree root without slash", "api.example.com/admin/*", "/admin", "/admin/ is denied; servers take /admin as it"},
		{"tree root with format", "api.example.com/admin/*", "/admin.json", "Rails: /admin(.:format)"},
		// PHP runs /admin.php for /admin.php/anything (PATH_INFO).
		{"PHP PATH_INFO", "api.example.com/admin.php", "/admin.php/x", "Apache/nginx+PHP run admin.php"},
		{"ligature", "api.example.com/config/*", "/con%EF%AC%81g/x", "full case folding: ﬁ = fi"},
		{"a rule written with a folded letter", "api.example.com/adm%C4%B1n/*", "/admin/x", "the rule folds as requests do"},
		{"a rule with ı, as written", "api.example.com/kullan%C4%B1c%C4%B1/*", "/kullan%C4%B1c%C4%B1/x", "Turkish kullanıcı"},
		{"a rule with İ, as written", "api.example.com/%C4%B0stanbul", "/%C4%B0stanbul", "İstanbul"},
		{"a rule with the Kelvin sign, as written", "api.example.com/%E2%84%AA/*", "/%E2%84%AA/x", "K"},
		{"a rule with a ligature, as written", "api.example.com/%EF%AC%81les/*", "/%EF%AC%81les/x", "ﬁles"},
		{"a rule with ſ, as written", "api.example.com/%C5%BF*", "/%C5%BFx", "ſ"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := ruleset(t, ActionAllow, "api.example.com", "deny "+c.deny)
			d := rs.Decide(Query{Host: "api.example.com", Port: 443, Method: "GET", Path: c.path})
			if d.Verdict == Allow {
				t.Errorf("deny %s: GET %s is %v (%v); want denied (%s)", c.deny, c.path, d.Verdict, d.Rule, c.why)
			}
		})
	}
}

func TestDenyRuleSpellingsControl(t *testing.T) {
	for _, c := range []struct{ deny, path string }{
		{"api.example.com/admin/*", "/administrator"},
		{"api.example.com/admin/*", "/adminx/y"},
		{"api.example.com/admin/*", "/v1/admin/x"},
		{"api.example.com/admin/*", "/adm%C3%AFn/x"},
		{"api.example.com/admin.php", "/admin.phps"},
		{"api.example.com/admin.php", "/x/admin.php"},
		{"api.example.com/v1/admin", "/v1/admins"},
		{`regex:api\.example\.com/(?-i)Admin/.*`, "/public/x"},
	} {
		rs := ruleset(t, ActionDeny, "api.example.com", "deny "+c.deny)
		if d := rs.Decide(Query{Host: "api.example.com", Port: 443, Method: "GET", Path: c.path}); d.Verdict != Allow {
			t.Errorf("deny %s: GET %s is %v (%v); want allowed", c.deny, c.path, d.Verdict, d.Rule)
		}
	}
}

// BenchmarkDecideDenyPathRule: a request to a host with a deny path rule,
// whose spellings are made for it (BenchmarkDecideRequest's rules have
// none).
func BenchmarkDecideDenyPathRule(b *testing.B) {
	rs := ruleset(b, ActionAsk, "api.example.com", "deny api.example.com/admin/*")
	for _, p := range []string{"/v1/users/7?page=2", "/V1/Users;x/7.json"} {
		q := Query{Host: "api.example.com", Port: 443, Method: "GET", Path: p}
		b.Run(fmt.Sprintf("path=%s", p), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				rs.Decide(q)
			}
		})
	}
}

// BenchmarkDecideDenyDottedPath: a path of many segments with a dot, each
// of which could make a PATH_INFO form, costs time in proportion to its
// length.
func BenchmarkDecideDenyDottedPath(b *testing.B) {
	for _, n := range []int{100, 1000, 4000} {
		path := strings.Repeat("/a.b", n)
		rs := ruleset(b, ActionAllow, "api.example.com", "deny api.example.com/admin/*")
		b.Run(fmt.Sprintf("segments=%d,len=%d", n, len(path)), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				rs.Decide(Query{Host: "api.example.com", Port: 443, Method: "GET", Path: path})
			}
		})
	}
}

// TestDenyFormsBounded: deciding a path of 32 KiB made of segments with a
// dot allocates in proportion to its length, not its square (one PATH_INFO
// form per dotted segment made hundreds of MiB).
func TestDenyFormsBounded(t *testing.T) {
	path := strings.Repeat("/a.b", 8192) // 32 KiB
	rs := ruleset(t, ActionAllow, "api.example.com", "deny api.example.com/admin/*")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	d := rs.Decide(Query{Host: "api.example.com", Port: 443, Method: "GET", Path: path})
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("verdict %v, %d MiB allocated, %v", d.Verdict, alloc>>20, took)
	if alloc > 8<<20 {
		t.Errorf("deciding one GET of a %d-byte path allocated %d MiB (%v); want a bound linear in the path", len(path), alloc>>20, took)
	}
}

// TestGlobMatchAgreesWithRegexp: globMatch matches as the regular
// expression its glob stands for ("*" any run, every other byte itself),
// on random globs and strings over a small alphabet, where runs repeat
// and overlap.
func TestGlobMatchAgreesWithRegexp(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	word := func(alphabet string, max int) string {
		b := make([]byte, r.IntN(max+1))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	for range 20000 {
		glob, s := word("ab/*", 8), word("ab/", 12)
		parts := strings.Split(glob, "*")
		for i, p := range parts {
			parts[i] = regexp.QuoteMeta(p)
		}
		want := regexp.MustCompile(`^(?s:` + strings.Join(parts, ".*") + `)$`).MatchString(s)
		if got := globMatch(glob, s); got != want {
			t.Fatalf("globMatch(%q, %q) = %v, want %v", glob, s, got, want)
		}
	}
}

// TestDenyPathInfoPastDottedDirectories: PHP's PATH_INFO split (nginx
// fastcgi_split_path_info "^(.+?\.php)(/.*)$", Apache AcceptPathInfo, PHP
// cgi.fix_pathinfo) runs the script at the first ".php" segment whatever
// comes before it: a denied script after many dotted directories (versions,
// vendor directories) is denied with any PATH_INFO.
func TestDenyPathInfoPastDottedDirectories(t *testing.T) {
	for _, c := range []struct{ deny, path string }{
		{"api.example.com/app/v1.0/lib.d/mod.x/pkg.y/admin.php", "/app/v1.0/lib.d/mod.x/pkg.y/admin.php/x"},
		{"api.example.com/*/admin.php", "/a.b/c.d/e.f/g.h/admin.php/x"},
	} {
		rs := ruleset(t, ActionAllow, "api.example.com", "deny "+c.deny)
		// Control: without PATH_INFO it is denied.
		ctl := strings.TrimSuffix(c.path, "/x")
		if d := rs.Decide(Query{Host: "api.example.com", Port: 443, Method: "GET", Path: ctl}); d.Verdict != Deny {
			t.Fatalf("control: %s not denied by %s: %v", ctl, c.deny, d.Verdict)
		}
		if d := rs.Decide(Query{Host: "api.example.com", Port: 443, Method: "GET", Path: c.path}); d.Verdict != Deny {
			t.Errorf("GET %s: %v past deny %s; PHP runs %s with PATH_INFO /x", c.path, d.Verdict, c.deny, ctl)
		}
	}
}
