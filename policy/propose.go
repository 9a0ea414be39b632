package policy

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// Hit is one thing a sandbox member reached (or tried to reach), as the
// journal recorded it: a connection, or an intercepted request.
type Hit struct {
	Source string // the member
	Host   string // a name or an IPv4 address
	Port   uint16
	// Method and Path are set for an intercepted request; a connection
	// airlock did not look inside has neither.
	Method string
	Path   string
	// Shown is how a person reads it: "GET http://host/path" or
	// "host:port".
	Shown string
	// Denied says a person denied it when it was held: a proposal that
	// covers it is flagged (FlagDenied).
	Denied bool
}

// Proposed is one pattern of a proposal.
type Proposed struct {
	// Pattern matches every hit it stands for, as written and as saved
	// (its canonical form), and parses without force. It is "" when no
	// pattern says that traffic (a host named regex or cidr on a port
	// other than 80 and 443); such an entry is flagged (FlagNoPattern).
	Pattern string `json:"pattern"`
	// Member scopes the rule to the one member that used it; "" for all.
	Member string `json:"member,omitempty"`
	// Hosts are the hosts it covers, sorted.
	Hosts []string `json:"hosts"`
	// Hits counts the records it covers; Examples shows up to
	// MaxProposalExamples of them.
	Hits     int      `json:"hits"`
	Examples []string `json:"examples"`
	// CoveredBy names the rule that allows all of it already ("GET
	// pypi.org (preset:python)"); such a pattern need not be saved.
	CoveredBy string `json:"covered_by,omitempty"`
	// Flags say why a person should look twice before saving it.
	Flags []string `json:"flags,omitempty"`
}

// Proposal constants.
const (
	// WildcardMinHosts is how many subdomains of one registrable domain
	// make a "*.domain" pattern instead of one pattern each.
	WildcardMinHosts = 3
	// MaxProposalExamples caps Proposed.Examples.
	MaxProposalExamples = 5
)

// Proposal flags that are not about a host's name.
const (
	// FlagDenied: a person denied some of the traffic when it was held.
	FlagDenied = "a person denied this when it was held"
	// FlagWholeHost: every hit is an intercepted request, so a pattern
	// with a path could have said less, but the pattern allows every path
	// and method on its host and port (or on every host of a "*.domain"):
	// the requests share no path prefix, one of their paths is ambiguous
	// (no path rule allows it), no prefix they share fits in a pattern,
	// or the host is a raw IP (a cidr pattern takes no path).
	FlagWholeHost = "its requests share no path a pattern can say: this allows every path and method there"
	// FlagNoPattern: no pattern says this traffic without saying more
	// (a host named regex or cidr cannot take a port); Pattern is "".
	FlagNoPattern = "no pattern says this host on this port: add a rule by hand if you mean it"
)

// Propose computes the smallest set of patterns that covers hits, in the
// pattern language: each name on the default ports as its exact host, or
// as "*.domain" when WildcardMinHosts or more subdomains of one
// registrable domain (public suffix list, private section included)
// appear; an intercepted host or group (every hit a request) with the
// longest path directory its requests share that fits in a pattern
// ("host/v1/*", "*.domain/v1/*", shortened segment by segment when the
// whole does not fit); other ports as "host:port"; raw IPv4 addresses as
// "cidr:IP/32". A pattern that allows every path and method although
// every hit it stands for is an intercepted request is flagged
// FlagWholeHost, whatever the reason (see proposeFor). A pattern is
// scoped to a member when exactly one named member used it. Hosts whose
// every hit decide allows with a rule already are proposed as covered
// (CoveredBy), one each. Raw IPs, random-looking names, paste or
// file-sharing sites and traffic a person denied are flagged.
//
// Every pattern is checked last (see checkProposed): it parses without
// force, its canonical form parses back to the same kind, host and port,
// both match every hit it stands for, and it admits ports 80 and 443 only
// when some hit used one of them. A pattern that fails is never replaced
// by a broader one: a "*.domain" group falls apart into its hosts, and a
// host no pattern can say is proposed with Pattern "" and FlagNoPattern.
// decide may be nil (nothing is covered). The result is sorted by pattern.
func Propose(hits []Hit, decide func(Query) Decision) []Proposed {
	type hostHits struct {
		host    string
		port    uint16
		ip      bool
		hits    []Hit
		covered string // the rule covering every hit, or ""
	}
	byHost := map[string]*hostHits{}
	var keys []string
	for _, h := range hits {
		host, err := NormalizeHost(h.Host)
		if err != nil || h.Port == 0 || IsInternalName(host) {
			// airlock.internal is airlock's own: the member API needs no rule.
			continue
		}
		ip := isIPLiteral(host)
		if ip && !isIPv4(host) {
			continue
		}
		h.Host = host
		key := host + ":" + strconv.Itoa(int(h.Port))
		if !ip && defaultPort(h.Port) {
			key = host
		}
		hh := byHost[key]
		if hh == nil {
			hh = &hostHits{host: host, port: h.Port, ip: ip}
			byHost[key] = hh
			keys = append(keys, key)
		}
		hh.hits = append(hh.hits, h)
	}
	var out []Proposed
	// Hosts an existing rule covers, one by one.
	var open []*hostHits
	for _, k := range keys {
		hh := byHost[k]
		if decide != nil {
			hh.covered = coveredBy(hh.hits, decide)
		}
		if hh.covered != "" {
			out = append(out, proposeFor([]string{hostPattern(hh.host, hh.port, hh.ip)}, []string{hh.host}, hh.hits, hh.covered))
			continue
		}
		open = append(open, hh)
	}
	// Subdomains of one registrable domain on the default ports.
	groups := map[string][]*hostHits{}
	for _, hh := range open {
		if hh.ip || !defaultPort(hh.port) {
			continue
		}
		if d, err := publicsuffix.EffectiveTLDPlusOne(hh.host); err == nil && d != hh.host && !sharedDomain(d) {
			groups[d] = append(groups[d], hh)
		}
	}
	grouped := map[*hostHits]bool{}
	for d, g := range groups {
		if len(g) < WildcardMinHosts {
			continue
		}
		var hosts []string
		var all []Hit
		for _, hh := range g {
			hosts = append(hosts, hh.host)
			all = append(all, hh.hits...)
		}
		if _, err := checkProposed("*."+d, all); err != nil {
			// Each host is proposed on its own instead.
			continue
		}
		for _, hh := range g {
			grouped[hh] = true
		}
		// The path its hosts' requests share, as for one host; "*.d"
		// (checked above) when none fits.
		candidates := pathCandidates("*."+d, pathPrefix(all))
		candidates = append(candidates, "*."+d)
		out = append(out, proposeFor(candidates, hosts, all, ""))
	}
	for _, hh := range open {
		if grouped[hh] {
			continue
		}
		var candidates []string
		if !hh.ip {
			candidates = pathCandidates(hostPort(hh.host, hh.port), pathPrefix(hh.hits))
		}
		candidates = append(candidates, hostPattern(hh.host, hh.port, hh.ip))
		out = append(out, proposeFor(candidates, []string{hh.host}, hh.hits, ""))
	}
	// By pattern, then by hosts: entries without a pattern (FlagNoPattern)
	// come first.
	slices.SortStableFunc(out, func(a, b Proposed) int {
		if c := strings.Compare(a.Pattern, b.Pattern); c != 0 {
			return c
		}
		return slices.Compare(a.Hosts, b.Hosts)
	})
	return out
}

func defaultPort(p uint16) bool { return p == 80 || p == 443 }

func hostPort(host string, port uint16) string {
	if defaultPort(port) {
		return host
	}
	return host + ":" + strconv.Itoa(int(port))
}

// hostPattern is the pattern for one host on one port.
func hostPattern(host string, port uint16, ip bool) string {
	if ip {
		p := "cidr:" + host + "/32"
		if !defaultPort(port) {
			p += ":" + strconv.Itoa(int(port))
		}
		return p
	}
	return hostPort(host, port)
}

// coveredBy names the allow rule that decides every hit already, or "".
// A connection airlock did not look inside is covered only by a rule that
// allows it whole.
func coveredBy(hits []Hit, decide func(Query) Decision) string {
	var first *Rule
	for _, h := range hits {
		d := decide(Query{Source: h.Source, Host: h.Host, Port: h.Port, Method: h.Method, Path: h.Path})
		if d.Verdict != Allow || d.Rule == nil || d.Rule.List != Allowlist {
			return ""
		}
		if first == nil {
			first = d.Rule
		}
	}
	if first == nil {
		return ""
	}
	s := first.Pattern.String()
	if first.Source != "" {
		s += " (" + first.Source + ")"
	} else {
		s += " (" + first.Tier.String() + ")"
	}
	return s
}

// pathPrefix returns the segments of the longest directory ("/v1/" is
// ["v1"]) every hit's path lies under, in the form rules match (query cut,
// unreserved characters decoded, dot segments removed), when every hit is
// an intercepted request whose path is not ambiguous (no path rule allows
// those); nil when some hit is not, or the prefix is "/".
func pathPrefix(hits []Hit) []string {
	var common []string
	for i, h := range hits {
		if h.Method == "" || !strings.HasPrefix(h.Path, "/") {
			return nil
		}
		clean, _, ambiguous := requestPaths(h.Path)
		if ambiguous {
			return nil
		}
		segs := strings.Split(clean, "/")
		dir := segs[1 : len(segs)-1] // drop the leading "" and the last name
		if i == 0 {
			common = dir
			continue
		}
		n := 0
		for n < len(common) && n < len(dir) && common[n] == dir[n] {
			n++
		}
		common = common[:n]
	}
	// A "*" in a path would read as a glob; stop before it.
	for i, s := range common {
		if strings.Contains(s, "*") || s == "" {
			common = common[:i]
			break
		}
	}
	return common
}

// pathCandidates returns the patterns "hostport/s1/.../sn/*" for the
// prefixes of segs, longest first, leaving out those longer than a pattern
// may be.
func pathCandidates(hostport string, segs []string) []string {
	var out []string
	n := len(hostport) + 2 // the leading "/" and the trailing "*"
	lens := make([]int, len(segs)+1)
	for i, s := range segs {
		n += len(s) + 1
		lens[i+1] = n
	}
	for k := len(segs); k > 0; k-- {
		if lens[k] <= MaxPatternLen {
			out = append(out, hostport+"/"+strings.Join(segs[:k], "/")+"/*")
		}
	}
	return out
}

// checkProposed checks that pattern may stand for hits, and returns its
// canonical form, which is what a save writes: pattern parses without
// force; its canonical form parses back to a pattern of the same kind,
// host and port (a host named regex on port 8080 written "regex.:8080"
// would read back as a regex); both match every hit; and a pattern without
// a port, which admits 80 and 443, stands for some traffic on one of
// them.
func checkProposed(pattern string, hits []Hit) (string, error) {
	p, q, err := parseProposed(pattern)
	if err != nil {
		return "", err
	}
	return q.String(), covers(p, q, hits)
}

// parseProposed parses pattern without force, and its canonical form,
// which must read back as the same pattern.
func parseProposed(pattern string) (p, q Pattern, err error) {
	p, err = Parse(pattern, ParseOptions{})
	if err != nil {
		return p, q, err
	}
	canon := p.String()
	q, err = Parse(canon, ParseOptions{})
	if err != nil {
		return p, q, fmt.Errorf("%q written as %q: %w", truncate(pattern, 80), truncate(canon, 80), err)
	}
	if q.String() != canon || q.Kind() != p.Kind() || q.Host() != p.Host() || q.Port() != p.Port() || q.Method() != p.Method() || q.Path() != p.Path() {
		return p, q, fmt.Errorf("%q written as %q reads back as another pattern", truncate(pattern, 80), truncate(canon, 80))
	}
	return p, q, nil
}

// covers reports why p, or q (its canonical form read back), does not
// cover every hit, or admits ports 80 and 443 when no hit used either.
func covers(p, q Pattern, hits []Hit) error {
	defaults := false
	for _, h := range hits {
		hq := Query{Source: h.Source, Host: h.Host, Port: h.Port, Method: h.Method, Path: h.Path}
		if !p.Matches(hq) || !q.Matches(hq) {
			return fmt.Errorf("%q does not match %s", truncate(q.String(), 80), truncate(h.Host+":"+strconv.Itoa(int(h.Port))+h.Path, 120))
		}
		defaults = defaults || defaultPort(h.Port)
	}
	if p.Port() == 0 && !defaults {
		return fmt.Errorf("%q allows ports 80 and 443, which none of its traffic used", truncate(q.String(), 80))
	}
	return nil
}

// proposeFor builds the proposal for hosts and their hits: the first of
// candidates that checkProposed accepts, member scope, examples, flags.
// When none is accepted the pattern is "", flagged FlagNoPattern: never
// one broader than the candidates, nor one that misses a hit. covered, if
// not "", names the rule that allows all of it already (CoveredBy).
//
// Whatever the candidates were, a pattern that is not covered and allows
// every path and method (it needs no look inside a connection) although
// every hit is an intercepted request is flagged FlagWholeHost: a pattern
// with a path could have said less, or a person should see why not.
func proposeFor(candidates []string, hosts []string, hits []Hit, covered string) Proposed {
	pattern := ""
	var flags []string
	for i := 0; i < len(candidates); i++ {
		p, q, err := parseProposed(candidates[i])
		if err != nil {
			continue // too long, or a character a pattern cannot hold
		}
		if covers(p, q, hits) != nil {
			// A shorter path would not mend it (the prefix is in the form
			// rules match): go to the last candidate at once, so that
			// hostile paths cannot make this cost candidates × hits.
			if last := len(candidates) - 1; i < last {
				i = last - 1
			}
			continue
		}
		pattern = q.String()
		if covered == "" && !q.NeedsL7() && allRequests(hits) {
			flags = append(flags, FlagWholeHost)
		}
		break
	}
	if pattern == "" {
		flags = append(flags, FlagNoPattern)
	}
	slices.Sort(hosts)
	p := Proposed{Pattern: pattern, Hosts: slices.Compact(hosts), Hits: len(hits), Examples: []string{}, CoveredBy: covered, Flags: flags}
	members := map[string]bool{}
	denied := false
	for _, h := range hits {
		members[h.Source] = true
		denied = denied || h.Denied
		if len(p.Examples) < MaxProposalExamples && !slices.Contains(p.Examples, h.Shown) && h.Shown != "" {
			p.Examples = append(p.Examples, h.Shown)
		}
	}
	if len(members) == 1 {
		for m := range members {
			// A member known only by its address is no name to scope a
			// rule to: the address goes to another member later.
			if _, err := netip.ParseAddr(m); err != nil && m != "" && checkMember(m) == nil {
				p.Member = m
			}
		}
	}
	if denied {
		p.Flags = append(p.Flags, FlagDenied)
	}
	for _, h := range p.Hosts {
		for _, f := range hostFlags(h) {
			if !slices.Contains(p.Flags, f) {
				p.Flags = append(p.Flags, f)
			}
		}
	}
	return p
}

// allRequests reports whether every hit is an intercepted request (and
// there is one).
func allRequests(hits []Hit) bool {
	for _, h := range hits {
		if h.Method == "" {
			return false
		}
	}
	return len(hits) > 0
}

// hostFlags says why a host deserves a second look before it is allowed.
func hostFlags(host string) []string {
	if isIPLiteral(host) {
		return []string{"raw IP address: no name says whose it is"}
	}
	var out []string
	if what, ok := underSharingSite(host); ok {
		out = append(out, what+" site: anything can be carried out through it")
	}
	for _, l := range strings.Split(host, ".") {
		if randomLabel(l) {
			out = append(out, fmt.Sprintf("random-looking name (%q): generated names can carry data out", truncate(l, 40)))
			break
		}
	}
	return out
}

// sharingSites are registrable domains where anyone can put anything for
// anyone to fetch: a member that reaches them can carry data out.
var sharingSites = map[string]string{
	"pastebin.com": "paste", "paste.ee": "paste", "hastebin.com": "paste", "dpaste.com": "paste",
	"dpaste.org": "paste", "termbin.com": "paste", "ix.io": "paste", "sprunge.us": "paste",
	"rentry.co": "paste", "controlc.com": "paste", "justpaste.it": "paste", "privatebin.net": "paste",
	"ghostbin.co": "paste", "pastes.dev": "paste",
	"0x0.st": "file-sharing", "transfer.sh": "file-sharing", "file.io": "file-sharing",
	"catbox.moe": "file-sharing", "gofile.io": "file-sharing", "wetransfer.com": "file-sharing",
	"we.tl": "file-sharing", "mega.nz": "file-sharing", "mediafire.com": "file-sharing",
	"sendspace.com": "file-sharing", "filebin.net": "file-sharing", "temp.sh": "file-sharing",
	"bashupload.com": "file-sharing", "anonfiles.com": "file-sharing",
	"webhook.site": "request-catching", "requestbin.net": "request-catching", "pipedream.net": "request-catching",
	"requestcatcher.com": "request-catching", "interact.sh": "request-catching", "oast.fun": "request-catching",
	"oast.pro": "request-catching", "oast.live": "request-catching", "oast.site": "request-catching",
	"oast.online": "request-catching", "oast.me": "request-catching", "oastify.com": "request-catching",
	"burpcollaborator.net": "request-catching", "dnslog.cn": "request-catching", "ceye.io": "request-catching",
	"canarytokens.com": "request-catching",
	"ngrok.io":         "tunnel", "ngrok.app": "tunnel", "ngrok-free.app": "tunnel", "ngrok-free.dev": "tunnel",
	"trycloudflare.com": "tunnel", "loca.lt": "tunnel", "serveo.net": "tunnel", "localhost.run": "tunnel",
	"lhr.life": "tunnel", "pinggy.link": "tunnel", "nip.io": "tunnel", "sslip.io": "tunnel",
}

// sharedClouds are registrable domains (by the public suffix list) whose
// subdomains belong to many unrelated customers (buckets, CDN and app
// endpoints) without the list saying so: a "*.domain" over one would open
// every customer's, so Propose never groups under them. Shared domains the
// list knows (github.io, s3.amazonaws.com) need no entry: their registrable
// domains are one owner's already.
var sharedClouds = map[string]bool{
	"amazonaws.com": true, "googleapis.com": true, "storage.googleapis.com": true,
	"googleusercontent.com": true, "cloudflarestorage.com": true, "fastly.net": true,
	"akamaihd.net": true, "edgekey.net": true, "edgesuite.net": true, "azure.com": true,
	"windows.net": true, "azurefd.net": true, "firebaseio.com": true, "glitch.me": true,
	"digitaloceanspaces.com": true, "linodeobjects.com": true, "backblazeb2.com": true,
	"wasabisys.com": true, "oraclecloud.com": true,
}

// underSharingSite returns what kind of sharing site host is under, if
// it is under one (at any depth: "x.ngrok-free.app" is its own
// registrable domain but still a tunnel).
func underSharingSite(host string) (string, bool) {
	for d := host; d != ""; {
		if what, ok := sharingSites[d]; ok {
			return what, true
		}
		_, rest, ok := strings.Cut(d, ".")
		if !ok {
			break
		}
		d = rest
	}
	return "", false
}

// sharedDomain reports whether "*.d", for a registrable domain d, would
// open many unrelated owners' hosts: d is a shared cloud domain or a
// sharing site.
func sharedDomain(d string) bool {
	_, sharing := sharingSites[d]
	return sharing || sharedClouds[d]
}

// IsSharingSite reports whether host is under a paste, file-sharing,
// request-catching or tunnel site's domain.
func IsSharingSite(host string) bool {
	_, ok := underSharingSite(host)
	return ok
}

// randomLabel reports whether a DNS label looks generated rather than
// named: very long, long and hex- or base32-like, or mixing many digits
// into letters with high entropy.
func randomLabel(l string) bool {
	var digits, letters int
	for i := 0; i < len(l); i++ {
		switch c := l[i]; {
		case '0' <= c && c <= '9':
			digits++
		case 'a' <= c && c <= 'z':
			letters++
		}
	}
	e := LabelEntropy(l)
	switch {
	case len(l) > 40:
		return true
	case len(l) >= 10 && digits >= 3 && letters >= 3 && e >= 3.0:
		return true
	case len(l) >= 20 && e >= 3.8:
		return true
	}
	return false
}

// LabelEntropy is the Shannon entropy of s in bits per byte.
func LabelEntropy(s string) float64 {
	var counts [256]int
	for i := 0; i < len(s); i++ {
		counts[s[i]]++
	}
	n := float64(len(s))
	var e float64
	for _, c := range counts {
		if c > 0 {
			p := float64(c) / n
			e -= p * math.Log2(p)
		}
	}
	return e
}
