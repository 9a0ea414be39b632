package policy

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// conn is a recorded connection airlock did not look inside.
func conn(source, host string, port uint16) Hit {
	return Hit{Source: source, Host: host, Port: port, Shown: host}
}

// req is a recorded intercepted request.
func req(source, method, host, path string) Hit {
	return Hit{Source: source, Host: host, Port: 80, Method: method, Path: path, Shown: method + " http://" + host + path}
}

func TestPropose(t *testing.T) {
	// The rules in force: a user rule, a preset, and learn mode for the
	// rest (which covers nothing).
	rs := NewRuleset(ActionLearn,
		PresetRules([]string{"python"}),
		[]*Rule{NewRule(Allowlist, User, MustParse("api.known.test"), "", "manually added", timeZero)})
	type short struct {
		Pattern, Member, CoveredBy string
		Hits                       int
		Hosts, Flags               []string
	}
	for _, tc := range []struct {
		name string
		hits []Hit
		want []short
	}{
		{
			name: "one host",
			hits: []Hit{conn("agent", "api.example.com", 443), conn("agent", "API.example.com.", 443)},
			want: []short{{Pattern: "api.example.com", Member: "agent", Hits: 2, Hosts: []string{"api.example.com"}}},
		},
		{
			name: "many subdomains make a wildcard, a few do not",
			hits: []Hit{
				conn("agent", "a.cdn.test", 443), conn("agent", "b.cdn.test", 443), conn("agent", "c.cdn.test", 443),
				conn("agent", "cdn.test", 443),
				conn("agent", "x.two.test", 443), conn("agent", "y.two.test", 443),
			},
			want: []short{
				{Pattern: "*.cdn.test", Member: "agent", Hits: 3, Hosts: []string{"a.cdn.test", "b.cdn.test", "c.cdn.test"}},
				{Pattern: "cdn.test", Member: "agent", Hits: 1, Hosts: []string{"cdn.test"}},
				{Pattern: "x.two.test", Member: "agent", Hits: 1, Hosts: []string{"x.two.test"}},
				{Pattern: "y.two.test", Member: "agent", Hits: 1, Hosts: []string{"y.two.test"}},
			},
		},
		{
			name: "private public suffixes: one owner's subtree each",
			hits: []Hit{conn("agent", "a.one.github.io", 443), conn("agent", "b.one.github.io", 443), conn("agent", "c.one.github.io", 443),
				conn("agent", "two.github.io", 443)},
			want: []short{
				{Pattern: "*.one.github.io", Member: "agent", Hits: 3, Hosts: []string{"a.one.github.io", "b.one.github.io", "c.one.github.io"}},
				{Pattern: "two.github.io", Member: "agent", Hits: 1, Hosts: []string{"two.github.io"}},
			},
		},
		{
			name: "mixed members: scoped only when one member used it",
			hits: []Hit{
				conn("agent", "shared.test", 443), conn("mcp:github", "shared.test", 443),
				conn("mcp:github", "api.github.test", 443),
				conn("10.88.0.2", "byaddress.test", 443),
			},
			want: []short{
				{Pattern: "api.github.test", Member: "mcp:github", Hits: 1, Hosts: []string{"api.github.test"}},
				{Pattern: "byaddress.test", Hits: 1, Hosts: []string{"byaddress.test"}},
				{Pattern: "shared.test", Hits: 2, Hosts: []string{"shared.test"}},
			},
		},
		{
			name: "intercepted hosts get the path they share",
			hits: []Hit{
				req("agent", "GET", "pkgs.test", "/simple/requests/"), req("agent", "GET", "pkgs.test", "/simple/flask/index.html?x=1"),
				req("agent", "POST", "api.test", "/v1/chat"), req("agent", "GET", "api.test", "/v1/models"),
				req("agent", "GET", "root.test", "/"), req("agent", "GET", "root.test", "/a/b"),
				req("agent", "GET", "mixed.test", "/dl/x"), conn("agent", "mixed.test", 443),
			},
			want: []short{
				{Pattern: "api.test/v1/*", Member: "agent", Hits: 2, Hosts: []string{"api.test"}},
				{Pattern: "mixed.test", Member: "agent", Hits: 2, Hosts: []string{"mixed.test"}},
				{Pattern: "pkgs.test/simple/*", Member: "agent", Hits: 2, Hosts: []string{"pkgs.test"}},
				{Pattern: "root.test", Member: "agent", Hits: 2, Hosts: []string{"root.test"}},
			},
		},
		{
			name: "other ports",
			hits: []Hit{conn("agent", "db.test", 5432), conn("agent", "db.test", 443)},
			want: []short{
				{Pattern: "db.test", Member: "agent", Hits: 1, Hosts: []string{"db.test"}},
				{Pattern: "db.test:5432", Member: "agent", Hits: 1, Hosts: []string{"db.test"}},
			},
		},
		{
			name: "covered by a rule or a preset",
			hits: []Hit{
				conn("agent", "api.known.test", 443),
				req("agent", "GET", "pypi.org", "/simple/x/"), req("agent", "HEAD", "pypi.org", "/simple/y/"),
				req("agent", "POST", "files.pythonhosted.org", "/upload/x"),
			},
			want: []short{
				{Pattern: "api.known.test", Member: "agent", Hits: 1, Hosts: []string{"api.known.test"}, CoveredBy: "api.known.test (manually added)"},
				// A POST the preset does not allow is not covered.
				{Pattern: "files.pythonhosted.org/upload/*", Member: "agent", Hits: 1, Hosts: []string{"files.pythonhosted.org"}},
				{Pattern: "pypi.org", Member: "agent", Hits: 2, Hosts: []string{"pypi.org"}, CoveredBy: "GET pypi.org (preset:python)"},
			},
		},
		{
			name: "raw IPs are flagged",
			hits: []Hit{conn("agent", "203.0.113.9", 443), conn("agent", "203.0.113.9", 8080), conn("agent", "2001:db8::1", 443)},
			want: []short{
				{Pattern: "cidr:203.0.113.9/32", Member: "agent", Hits: 1, Hosts: []string{"203.0.113.9"}, Flags: []string{"raw IP address: no name says whose it is"}},
				{Pattern: "cidr:203.0.113.9/32:8080", Member: "agent", Hits: 1, Hosts: []string{"203.0.113.9"}, Flags: []string{"raw IP address: no name says whose it is"}},
			},
		},
		{
			name: "random-looking names and sharing sites are flagged",
			hits: []Hit{
				conn("agent", "x7f3k9q2m8z1.evil.test", 443),
				conn("agent", "4f6a2b9c8d7e1f3a5b6c.tunnel.test", 443),
				conn("agent", "objects.githubusercontent.com", 443),
				conn("agent", "generativelanguage.googleapis.com", 443),
				conn("agent", "pastebin.com", 443),
				conn("agent", "transfer.sh", 443),
			},
			want: []short{
				{Pattern: "4f6a2b9c8d7e1f3a5b6c.tunnel.test", Member: "agent", Hits: 1, Hosts: []string{"4f6a2b9c8d7e1f3a5b6c.tunnel.test"},
					Flags: []string{`random-looking name ("4f6a2b9c8d7e1f3a5b6c"): generated names can carry data out`}},
				{Pattern: "generativelanguage.googleapis.com", Member: "agent", Hits: 1, Hosts: []string{"generativelanguage.googleapis.com"}},
				{Pattern: "objects.githubusercontent.com", Member: "agent", Hits: 1, Hosts: []string{"objects.githubusercontent.com"}},
				{Pattern: "pastebin.com", Member: "agent", Hits: 1, Hosts: []string{"pastebin.com"}, Flags: []string{"paste site: anything can be carried out through it"}},
				{Pattern: "transfer.sh", Member: "agent", Hits: 1, Hosts: []string{"transfer.sh"}, Flags: []string{"file-sharing site: anything can be carried out through it"}},
				{Pattern: "x7f3k9q2m8z1.evil.test", Member: "agent", Hits: 1, Hosts: []string{"x7f3k9q2m8z1.evil.test"},
					Flags: []string{`random-looking name ("x7f3k9q2m8z1"): generated names can carry data out`}},
			},
		},
		{
			name: "bad hosts are left out",
			hits: []Hit{conn("agent", "bad host", 443), conn("agent", "3405803783", 443), conn("agent", "ok.test", 0)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []short
			for _, p := range Propose(tc.hits, rs.Decide) {
				got = append(got, short{Pattern: p.Pattern, Member: p.Member, CoveredBy: p.CoveredBy, Hits: p.Hits, Hosts: p.Hosts, Flags: p.Flags})
				if _, err := Parse(p.Pattern, ParseOptions{}); err != nil {
					t.Errorf("proposed pattern %q does not parse: %v", p.Pattern, err)
				}
				if len(p.Examples) == 0 || len(p.Examples) > MaxProposalExamples {
					t.Errorf("%s: examples %q", p.Pattern, p.Examples)
				}
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Propose (-want +got):\n%s", diff)
			}
		})
	}
}

// TestProposalCoversItsHits checks the promise behind a proposal: once its
// patterns are rules, every hit they came from is allowed by one of them.
func TestProposalCoversItsHits(t *testing.T) {
	hits := []Hit{
		conn("agent", "a.cdn.test", 443), conn("agent", "b.cdn.test", 443), conn("agent", "c.cdn.test", 443),
		req("agent", "GET", "pkgs.test", "/simple/requests/"), req("agent", "POST", "pkgs.test", "/simple/flask/"),
		conn("mcp:x", "db.test", 5432), conn("agent", "203.0.113.9", 443), conn("agent", "one.test", 443),
	}
	var rules []*Rule
	for _, p := range Propose(hits, nil) {
		rules = append(rules, NewRule(Allowlist, User, MustParse(p.Pattern), p.Member, "learned", timeZero))
	}
	rs := NewRuleset(ActionAsk, rules)
	for _, h := range hits {
		d := rs.Decide(Query{Source: h.Source, Host: h.Host, Port: h.Port, Method: h.Method, Path: h.Path})
		if d.Verdict != Allow && !(d.Verdict == NeedsL7 && h.Method == "") {
			t.Errorf("%s from %s: %v", h.Shown, h.Source, d)
		}
		if d.Verdict == NeedsL7 {
			t.Errorf("%s: a connection proposal needs L7: %v", h.Shown, d)
		}
	}
	if d := rs.Decide(Query{Source: "agent", Host: "never.test", Port: 443}); d.Verdict != Ask {
		t.Errorf("a host never used: %v", d)
	}
	if d := rs.Decide(Query{Source: "agent", Host: "db.test", Port: 5432}); d.Verdict != Ask || !strings.Contains(d.String(), "unknown_action") {
		t.Errorf("another member's host: %v", d)
	}
}

// FuzzPropose feeds Propose hosts and paths a member chose: it must not
// panic, and every pattern it proposes must parse without force.
func FuzzPropose(f *testing.F) {
	f.Add("a.cdn.test", "/simple/x/", "b.cdn.test", "/v1/*/y", uint16(443))
	f.Add("203.0.113.9", "", "xn--bcher-kva.example", "//..;/", uint16(5432))
	f.Fuzz(func(t *testing.T, h1, p1, h2, p2 string, port uint16) {
		hits := []Hit{
			{Source: "agent", Host: h1, Port: port, Method: "GET", Path: p1},
			{Source: "agent", Host: h2, Port: 443, Method: "POST", Path: p2},
			{Source: "other", Host: "c." + h2, Port: 80},
			{Source: "agent", Host: "d." + h2, Port: 443},
		}
		for _, p := range Propose(hits, nil) {
			if _, err := Parse(p.Pattern, ParseOptions{}); err != nil {
				t.Errorf("proposed %q: %v", p.Pattern, err)
			}
		}
	})
}
