package policy

import (
	"slices"
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
				// No directory shared: every path and method, flagged.
				{Pattern: "root.test", Member: "agent", Hits: 2, Hosts: []string{"root.test"}, Flags: []string{FlagWholeHost}},
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
			name: "hosts named like a keyword: as written on 80 and 443, on no other port",
			hits: []Hit{conn("agent", "regex", 8080), conn("agent", "Cidr", 8080), conn("agent", "regex", 443), conn("agent", "cidr", 80)},
			want: []short{
				{Member: "agent", Hits: 1, Hosts: []string{"cidr"}, Flags: []string{FlagNoPattern}},
				{Member: "agent", Hits: 1, Hosts: []string{"regex"}, Flags: []string{FlagNoPattern}},
				{Pattern: "cidr", Member: "agent", Hits: 1, Hosts: []string{"cidr"}},
				{Pattern: "regex", Member: "agent", Hits: 1, Hosts: []string{"regex"}},
			},
		},
		{
			name: "a path prefix too long for a pattern is shortened, keeping the port",
			hits: []Hit{
				{Source: "agent", Host: "api.test", Port: 8080, Method: "GET", Path: "/v1/" + strings.Repeat("a", MaxPatternLen) + "/x", Shown: "x"},
				{Source: "agent", Host: "api.test", Port: 8080, Method: "GET", Path: "/v1/" + strings.Repeat("a", MaxPatternLen) + "/y", Shown: "y"},
				// The first segment alone is too long: the host and port, flagged.
				{Source: "agent", Host: "long.test", Port: 8080, Method: "GET", Path: "/" + strings.Repeat("b", MaxPatternLen) + "/x", Shown: "x"},
				// A segment a pattern cannot hold (a space) ends the prefix.
				{Source: "agent", Host: "space.test", Port: 443, Method: "GET", Path: "/v2/a b/x", Shown: "x"},
			},
			want: []short{
				{Pattern: "api.test:8080/v1/*", Member: "agent", Hits: 2, Hosts: []string{"api.test"}},
				{Pattern: "long.test:8080", Member: "agent", Hits: 1, Hosts: []string{"long.test"}, Flags: []string{FlagWholeHost}},
				{Pattern: "space.test/v2/*", Member: "agent", Hits: 1, Hosts: []string{"space.test"}},
			},
		},
		{
			name: "the path prefix is the one rules match",
			hits: []Hit{
				// Dot segments removed, unreserved characters decoded: a
				// prefix from the raw paths (/v1/../admin/) would match neither.
				req("agent", "GET", "dots.test", "/v1/../admin/a"), req("agent", "GET", "dots.test", "/%61dmin/b"),
				// An ambiguous path no path rule allows: the host, flagged,
				// also when one path among unambiguous ones is.
				req("agent", "GET", "semi.test", "/v1;x/a"), req("agent", "GET", "semi.test", "/v1;x/b"),
				req("agent", "GET", "one.test", "/v1/users/1"), req("agent", "GET", "one.test", "/v1/users/2"),
				req("agent", "GET", "one.test", "/v1;jsessionid=1/users/3"),
			},
			want: []short{
				{Pattern: "dots.test/admin/*", Member: "agent", Hits: 2, Hosts: []string{"dots.test"}},
				{Pattern: "one.test", Member: "agent", Hits: 3, Hosts: []string{"one.test"}, Flags: []string{FlagWholeHost}},
				{Pattern: "semi.test", Member: "agent", Hits: 2, Hosts: []string{"semi.test"}, Flags: []string{FlagWholeHost}},
			},
		},
		{
			name: "an intercepted group keeps the path its hosts share, or is flagged",
			hits: []Hit{
				req("agent", "GET", "a.api.test", "/v1/items/1"), req("agent", "POST", "b.api.test", "/v1/items/2"),
				req("agent", "GET", "c.api.test", "/v1/orders/3"),
				req("agent", "GET", "a.www.test", "/x"), req("agent", "GET", "b.www.test", "/y/z"), req("agent", "GET", "c.www.test", "/y/w"),
				// One connection in the group: the hosts whole, unflagged.
				req("agent", "GET", "a.mix.test", "/v1/a"), req("agent", "GET", "b.mix.test", "/v1/b"), conn("agent", "c.mix.test", 443),
			},
			want: []short{
				{Pattern: "*.api.test/v1/*", Member: "agent", Hits: 3, Hosts: []string{"a.api.test", "b.api.test", "c.api.test"}},
				{Pattern: "*.mix.test", Member: "agent", Hits: 3, Hosts: []string{"a.mix.test", "b.mix.test", "c.mix.test"}},
				{Pattern: "*.www.test", Member: "agent", Hits: 3, Hosts: []string{"a.www.test", "b.www.test", "c.www.test"}, Flags: []string{FlagWholeHost}},
			},
		},
		{
			name: "requests to a raw IP: a cidr pattern takes no path",
			hits: []Hit{req("agent", "GET", "203.0.113.9", "/v1/x")},
			want: []short{
				{Pattern: "cidr:203.0.113.9/32", Member: "agent", Hits: 1, Hosts: []string{"203.0.113.9"}, Flags: []string{FlagWholeHost, "raw IP address: no name says whose it is"}},
			},
		},
		{
			name: "what a person denied is flagged",
			hits: []Hit{conn("agent", "exfil.test", 443), {Source: "agent", Host: "exfil.test", Port: 443, Shown: "exfil.test", Denied: true}},
			want: []short{{Pattern: "exfil.test", Member: "agent", Hits: 2, Hosts: []string{"exfil.test"}, Flags: []string{FlagDenied}}},
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
				if p.Pattern == "" && slices.Contains(p.Flags, FlagNoPattern) {
					// No pattern says it; it is flagged so.
				} else if _, err := Parse(p.Pattern, ParseOptions{}); err != nil {
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
// panic, every pattern it proposes must parse without force (or be "" and
// flagged so), every hit of a proposed host must be matched by a proposed
// pattern, or belong to a host proposed without one, and a pattern whose
// hits are all intercepted requests allows no path outside the first
// directory of every one of them unless it is flagged FlagWholeHost.
func FuzzPropose(f *testing.F) {
	f.Add("a.cdn.test", "/simple/x/", "b.cdn.test", "/v1/*/y", uint16(443))
	f.Add("203.0.113.9", "", "xn--bcher-kva.example", "//..;/", uint16(5432))
	f.Add("regex", "/v1/"+strings.Repeat("a", MaxPatternLen)+"/x", "cidr", "/a/../b/c", uint16(8080))
	f.Add("a.d.test", "/v1/x", "d.test", "/v1;x/y", uint16(443))
	f.Add("b.d.test", "/v1/a/x", "a.d.test", "/v1/b/y", uint16(80))
	f.Fuzz(func(t *testing.T, h1, p1, h2, p2 string, port uint16) {
		hits := []Hit{
			{Source: "agent", Host: h1, Port: port, Method: "GET", Path: p1},
			{Source: "agent", Host: h2, Port: 443, Method: "POST", Path: p2},
			{Source: "other", Host: "c." + h2, Port: 80},
			{Source: "agent", Host: "d." + h2, Port: 443},
		}
		props := Propose(hits, nil)
		var pats []Pattern
		for _, p := range props {
			if p.Pattern == "" {
				if !slices.Contains(p.Flags, FlagNoPattern) {
					t.Errorf("no pattern, not flagged so: %+v", p)
				}
				continue
			}
			pat, err := Parse(p.Pattern, ParseOptions{})
			if err != nil {
				t.Errorf("proposed %q: %v", p.Pattern, err)
				continue
			}
			pats = append(pats, pat)
		}
		for _, h := range hits {
			host, err := NormalizeHost(h.Host)
			if err != nil || !slices.ContainsFunc(props, func(p Proposed) bool { return slices.Contains(p.Hosts, host) }) {
				continue
			}
			q := Query{Source: h.Source, Host: h.Host, Port: h.Port, Method: h.Method, Path: h.Path}
			if !slices.ContainsFunc(pats, func(p Pattern) bool { return p.Matches(q) }) &&
				!slices.ContainsFunc(props, func(p Proposed) bool { return p.Pattern == "" && slices.Contains(p.Hosts, host) }) {
				t.Errorf("%s:%d %s %q is covered by no proposal: %+v", h.Host, h.Port, h.Method, h.Path, props)
			}
		}
		// A first path segment no hit's path has, in the form rules match.
		first := map[string]bool{}
		for _, h := range hits {
			if clean, _, _ := requestPaths(h.Path); strings.HasPrefix(clean, "/") {
				seg, _, _ := strings.Cut(clean[1:], "/")
				first[seg] = true
			}
		}
		probe := "zz-probe"
		for first[probe] {
			probe += "z"
		}
		for i, p := range props {
			if p.Pattern == "" || slices.Contains(p.Flags, FlagWholeHost) {
				continue
			}
			pat := MustParse(p.Pattern)
			var mine []Query
			requests := true
			for _, h := range hits {
				host, err := NormalizeHost(h.Host)
				q := Query{Source: h.Source, Host: host, Port: h.Port, Method: h.Method, Path: h.Path}
				if err == nil && slices.Contains(p.Hosts, host) && pat.Matches(q) {
					mine = append(mine, q)
					requests = requests && h.Method != ""
				}
			}
			if len(mine) == 0 || !requests {
				continue
			}
			for _, q := range mine {
				q.Method, q.Path = "DELETE", "/"+probe+"/x"
				if pat.Matches(q) {
					t.Errorf("proposal %d %q (flags %q) over requests only allows %s:%d %s %s", i, p.Pattern, p.Flags, q.Host, q.Port, q.Method, q.Path)
				}
			}
		}
	})
}

// TestProposeNeverWiderThanItsTraffic: member-chosen paths and names must
// not turn a proposal into a pattern broader than the traffic it stands
// for (the whole host, or ports 80 and 443 for traffic on 8080), nor one
// that misses it.
func TestProposeNeverWiderThanItsTraffic(t *testing.T) {
	long := strings.Repeat("a", MaxPatternLen)
	for _, tc := range []struct {
		name    string
		hits    []Hit
		outside []Query // what no proposed pattern may allow
	}{
		{
			name: "path prefix longer than a pattern",
			hits: []Hit{
				{Source: "agent", Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/" + long + "/x"},
				{Source: "agent", Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/" + long + "/y"},
			},
			outside: []Query{{Source: "agent", Host: "api.example.com", Port: 443, Method: "DELETE", Path: "/admin/users"}},
		},
		{
			name:    "path prefix longer than a pattern, on another port",
			hits:    []Hit{{Source: "agent", Host: "api.example.com", Port: 8080, Method: "GET", Path: "/v1/" + long + "/x"}},
			outside: []Query{{Source: "agent", Host: "api.example.com", Port: 443}, {Source: "agent", Host: "api.example.com", Port: 8080, Method: "GET", Path: "/v2/x"}},
		},
		{
			name:    "first path segment longer than a pattern, on another port",
			hits:    []Hit{{Source: "agent", Host: "api.example.com", Port: 8080, Method: "GET", Path: "/" + long + "/x"}},
			outside: []Query{{Source: "agent", Host: "api.example.com", Port: 443}, {Source: "agent", Host: "api.example.com", Port: 80}},
		},
		{
			name: "an ambiguous path among paths under one prefix",
			hits: []Hit{
				{Source: "agent", Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/users/1"},
				{Source: "agent", Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1/users/2"},
				{Source: "agent", Host: "api.example.com", Port: 443, Method: "GET", Path: "/v1;jsessionid=1/users/3"},
			},
			outside: []Query{{Source: "agent", Host: "api.example.com", Port: 443, Method: "DELETE", Path: "/admin/all"}},
		},
		{
			name: "subdomains grouped under a wildcard",
			hits: []Hit{
				{Source: "agent", Host: "a.example.com", Port: 443, Method: "GET", Path: "/v1/items/1"},
				{Source: "agent", Host: "b.example.com", Port: 443, Method: "GET", Path: "/v1/items/1"},
				{Source: "agent", Host: "c.example.com", Port: 443, Method: "GET", Path: "/v1/items/1"},
			},
			outside: []Query{
				{Source: "agent", Host: "a.example.com", Port: 443, Method: "DELETE", Path: "/admin/all"},
				{Source: "agent", Host: "new.example.com", Port: 443, Method: "GET", Path: "/v2/items/1"},
			},
		},
		{
			name: "subdomains grouped under a wildcard, sharing no path",
			hits: []Hit{
				{Source: "agent", Host: "a.example.com", Port: 443, Method: "GET", Path: "/v1/items/1"},
				{Source: "agent", Host: "b.example.com", Port: 443, Method: "GET", Path: "/v2/items/1"},
				{Source: "agent", Host: "c.example.com", Port: 443, Method: "GET", Path: "/v3/items/1"},
			},
			outside: []Query{{Source: "agent", Host: "a.example.com", Port: 443, Method: "DELETE", Path: "/admin/all"}},
		},
		{
			name:    "a host named regex on another port",
			hits:    []Hit{{Source: "agent", Host: "regex", Port: 8080}},
			outside: []Query{{Source: "agent", Host: "regex", Port: 443}, {Source: "agent", Host: "8080", Port: 443}},
		},
		{
			name:    "a host named cidr on another port",
			hits:    []Hit{{Source: "agent", Host: "CIDR", Port: 8080}},
			outside: []Query{{Source: "agent", Host: "cidr", Port: 443}, {Source: "agent", Host: "cidr", Port: 80}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			props := Propose(tc.hits, nil)
			if len(props) != 1 {
				t.Fatalf("got %d proposals: %+v", len(props), props)
			}
			got := props[0]
			if got.Pattern == "" {
				if !slices.Contains(got.Flags, FlagNoPattern) {
					t.Errorf("no pattern, and not flagged so: %+v", got)
				}
				return
			}
			// As proposed, and as a save writes it back.
			p := MustParse(got.Pattern)
			saved := MustParse(p.String())
			for _, h := range tc.hits {
				q := Query{Source: h.Source, Host: h.Host, Port: h.Port, Method: h.Method, Path: h.Path}
				if !p.Matches(q) || !saved.Matches(q) {
					t.Errorf("proposal %q does not cover %s:%d%s", got.Pattern, h.Host, h.Port, truncate(h.Path, 20))
				}
			}
			for _, q := range tc.outside {
				if (p.Matches(q) || saved.Matches(q)) && !slices.Contains(got.Flags, FlagWholeHost) {
					t.Errorf("proposal %q (flags %q) also allows %s:%d %s %s", got.Pattern, got.Flags, q.Host, q.Port, q.Method, q.Path)
				}
				if q.Port != 8080 && tc.hits[0].Port == 8080 && p.Matches(q) {
					t.Errorf("proposal %q for traffic on 8080 allows port %d", got.Pattern, q.Port)
				}
			}
		})
	}
}

func TestCheckProposed(t *testing.T) {
	on := func(host string, port uint16) []Hit { return []Hit{{Source: "agent", Host: host, Port: port}} }
	for _, tc := range []struct {
		pattern string
		hits    []Hit
		want    string // canonical form, or "" when refused
	}{
		{"API.test", on("api.test", 443), "api.test"},
		{"api.test:8080", on("api.test", 8080), "api.test:8080"},
		{"cidr:203.0.113.9/32:8080", on("203.0.113.9", 8080), "cidr:203.0.113.9/32:8080"},
		{"*.cdn.test", append(on("a.cdn.test", 443), on("b.cdn.test", 80)...), "*.cdn.test"},
		// Ports 80 and 443 for traffic on 8080: wider, and missing it.
		{"api.test", on("api.test", 8080), ""},
		// Reads back as a regex on the host "8080", or does not parse.
		{"regex:8080", on("regex", 8080), ""},
		{"regex.:8080", on("regex", 8080), ""},
		{"cidr.:8080", on("cidr", 8080), ""},
		{"cidr:8080", on("cidr", 8080), ""},
		// Misses a hit, or is broad.
		{"api.test/v1/*", []Hit{{Source: "agent", Host: "api.test", Port: 80, Method: "GET", Path: "/v2/x"}}, ""},
		{"*.com", on("a.com", 443), ""},
	} {
		got, err := checkProposed(tc.pattern, tc.hits)
		if err != nil {
			got = ""
		}
		if got != tc.want {
			t.Errorf("checkProposed(%q) = %q, %v; want %q", tc.pattern, got, err, tc.want)
		}
	}
}
