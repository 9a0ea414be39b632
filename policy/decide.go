package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Verdict is the outcome of a decision.
type Verdict uint8

const (
	// Deny refuses the connection or request. It is the zero Verdict, so a
	// Decision nobody filled in denies.
	Deny Verdict = iota
	// Allow lets it through.
	Allow
	// Ask holds it until a person decides.
	Ask
	// NeedsL7 answers a connection-level question about a host that path or
	// method rules apply to: the proxy must intercept the connection and ask
	// again for each request.
	NeedsL7
)

func (v Verdict) String() string {
	switch v {
	case Deny:
		return "deny"
	case Allow:
		return "allow"
	case Ask:
		return "ask"
	case NeedsL7:
		return "needs-l7"
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// Reason says why a decision came out as it did.
type Reason uint8

const (
	// ReasonDenyRule: a deny rule matched.
	ReasonDenyRule Reason = iota + 1
	// ReasonAllowRule: an allow rule matched.
	ReasonAllowRule
	// ReasonPathRules: allow rules for this host look at the method or path.
	ReasonPathRules
	// ReasonDenyPathRule: the host is allowed, but a deny rule for some of
	// its paths or methods must be checked request by request.
	ReasonDenyPathRule
	// ReasonUnknown: no rule matched; the sandbox's unknown_action decided.
	ReasonUnknown
	// ReasonRawIP: the destination is a raw IP address and no cidr: rule
	// allows it.
	ReasonRawIP
	// ReasonBadHost: the host is not a valid name or address.
	ReasonBadHost
	// ReasonUntrusted: the member is user_added and no allow rule names
	// it as its member.
	ReasonUntrusted
	// ReasonAskEach: the member is a high-risk MCP server (it fetches any
	// URL it is given), so each of its requests is asked about unless a
	// rule naming it allows it.
	ReasonAskEach
	// ReasonLearn: no rule matched and the sandbox is learning
	// (unknown_action learn): let through, recorded as learned.
	ReasonLearn
	// ReasonReadOnly: a preset allows the host for reading only, and no
	// rule allows this method or path.
	ReasonReadOnly
)

func (r Reason) String() string {
	switch r {
	case ReasonDenyRule:
		return "a deny rule matched"
	case ReasonAllowRule:
		return "an allow rule matched"
	case ReasonPathRules:
		return "rules for this host look at the method or path; each request is decided on its own"
	case ReasonDenyPathRule:
		return "a deny rule for some paths or methods of this host is checked request by request"
	case ReasonUnknown:
		return "no rule matched; the sandbox's unknown_action decided"
	case ReasonRawIP:
		return "raw IP destination and no cidr: rule allows it"
	case ReasonBadHost:
		return "not a valid host name"
	case ReasonUntrusted:
		return "the member is user_added and no allow rule names it as member"
	case ReasonAskEach:
		return "the member is a high-risk MCP server: each request is asked about unless a rule naming it allows it"
	case ReasonLearn:
		return "learning: no rule matched; let through and recorded as learned (unknown_action learn)"
	case ReasonReadOnly:
		return "a preset allows this host for reading only (GET and HEAD); no rule allows this method or path"
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Query is what is known about a connection or a request.
type Query struct {
	Source string // the sandbox member asking ("agent", "mcp:github"); "" if unknown
	Host   string // a name or an IP literal; Decide normalises it
	Port   uint16
	// Method and Path are set for a request seen by the intercepting proxy
	// and empty for a connection-level question (DNS name, TLS SNI).
	Method string
	Path   string // the request target's path, query allowed; "/" when empty
	// MemberOnly says the member is user_added: only allow rules naming
	// Source as their member apply, and nothing else is asked or allowed.
	MemberOnly bool
	// AskEach says the member is a high-risk MCP server: only allow rules
	// naming it apply, and everything else is asked about request by
	// request (denied when unknown_action is deny).
	AskEach bool
}

// IsRequest reports whether q asks about one request rather than about a
// whole connection.
func (q *Query) IsRequest() bool { return q.Method != "" || q.Path != "" }

// Decision is the answer to a Query. It is a value: an error from policy
// means something is broken, never "denied".
type Decision struct {
	Verdict Verdict
	// Rule is the rule that decided, or nil when no rule did (unknown_action,
	// raw IP, bad host).
	Rule   *Rule
	Reason Reason
	// Unknown is the sandbox's unknown_action when it decided.
	Unknown Action
	// Until is when learn mode ends, for a decision learn mode made
	// (ReasonLearn): what it let through is let through until then.
	Until time.Time
}

// String explains the decision in one line, for logs and 403 pages.
func (d Decision) String() string {
	s := d.Verdict.String() + ": " + d.Reason.String()
	if d.Rule != nil {
		s += " (" + d.Rule.String() + ")"
	}
	if d.Reason == ReasonUnknown {
		s += " (unknown_action " + d.Unknown.String() + ")"
	}
	return s
}

// Detail is the reason in words, naming the preset when a preset's rule
// decided: what a 403 page says.
func (d Decision) Detail() string {
	if p := PresetOf(d.Rule); p != "" {
		return d.Reason.String() + " (rule " + d.Rule.Pattern.String() + " of preset " + p + ")"
	}
	return d.Reason.String()
}

// LearnedVerdict is the verdict a record of traffic learn mode let through
// carries in the journal.
const LearnedVerdict = "learned"

// RecordVerdict is the verdict a connection or request record is
// journalled with: the verdict, or LearnedVerdict for traffic learn mode
// let through (its reason is ReasonLearn, also behind "intercepted: ").
func RecordVerdict(v Verdict, reason string) string {
	if v == Allow && strings.TrimPrefix(reason, "intercepted: ") == ReasonLearn.String() {
		return LearnedVerdict
	}
	return v.String()
}

// Ruleset is an immutable, indexed set of rules and the action for traffic
// none of them match. It is safe for concurrent use. A decision costs about
// the same with a hundred thousand host rules as with ten: exact hosts are a
// map lookup, wildcards one map lookup per label of the host, and only
// regexes are scanned.
type Ruleset struct {
	deny  index
	allow index
	// presets indexes the allow rules of presets by host alone: a request
	// to such a host that no allow rule lets through is denied by it
	// (ReasonReadOnly), whatever unknown_action says.
	presets index
	unknown Action
	// learnUntil ends learn mode (unknown ActionLearn); zero: ended.
	learnUntil time.Time
	now        func() time.Time // nil: time.Now
	count      int
}

// NewRuleset indexes rules, which may be of both lists and any tier. For the
// rule a decision names, earlier rules win over later ones, so pass them in
// tier order: auto, preset, user, session. unknown decides traffic no rule matches;
// zero means ActionDeny.
func NewRuleset(unknown Action, rules ...[]*Rule) *Ruleset {
	if unknown == 0 {
		unknown = ActionDeny
	}
	rs := &Ruleset{unknown: unknown}
	for _, list := range rules {
		for _, r := range list {
			switch r.List {
			case Denylist:
				rs.deny.add(r)
			case Allowlist:
				rs.allow.add(r)
				if r.Tier == FromPreset {
					rs.presets.add(r)
				}
			default:
				continue
			}
			rs.count++
		}
	}
	return rs
}

// Len returns the number of rules in the set.
func (rs *Ruleset) Len() int { return rs.count }

// Unknown returns the action for traffic no rule matches.
func (rs *Ruleset) Unknown() Action { return rs.unknown }

// Learning returns a copy of rs that, with unknown action ActionLearn,
// learns until until by the clock now (nil: time.Now) and asks from then
// on.
func (rs *Ruleset) Learning(until time.Time, now func() time.Time) *Ruleset {
	c := *rs
	c.learnUntil, c.now = until, now
	return &c
}

// unknownNow is the unknown action in force now: learn mode past its end
// asks.
func (rs *Ruleset) unknownNow() Action {
	if rs.unknown != ActionLearn {
		return rs.unknown
	}
	now := time.Now
	if rs.now != nil {
		now = rs.now
	}
	if !now().Before(rs.learnUntil) {
		return ActionAsk
	}
	return rs.unknown
}

// Decide answers q. Deny rules win, then allow rules (auto, user, session),
// then the unknown action. A raw IP is allowed only by a cidr: rule. A
// connection-level question about a host that path or method rules apply to
// answers NeedsL7. Host-only questions do not allocate when the host is
// already normalised.
func (rs *Ruleset) Decide(q Query) Decision {
	host, err := NormalizeHost(q.Host)
	if err != nil {
		return Decision{Verdict: Deny, Reason: ReasonBadHost}
	}
	isIP := isIPLiteral(host)
	if q.IsRequest() {
		return rs.decideRequest(&q, host, isIP)
	}
	denyHost, denyL7 := rs.deny.matchHost(host, q.Source, q.Port, isIP, false)
	if denyHost != nil {
		return Decision{Verdict: Deny, Rule: denyHost, Reason: ReasonDenyRule}
	}
	allowHost, allowL7 := rs.allow.matchHost(host, q.Source, q.Port, isIP, q.MemberOnly || q.AskEach)
	unknown := rs.unknownNow() // once: learn mode may end between two reads of the clock
	switch {
	case allowHost != nil && denyL7 != nil:
		return Decision{Verdict: NeedsL7, Rule: denyL7, Reason: ReasonDenyPathRule}
	case allowHost != nil:
		return Decision{Verdict: Allow, Rule: allowHost, Reason: ReasonAllowRule}
	case allowL7 != nil:
		return Decision{Verdict: NeedsL7, Rule: allowL7, Reason: ReasonPathRules}
	case isIP:
		return Decision{Verdict: Deny, Reason: ReasonRawIP}
	case q.MemberOnly:
		return Decision{Verdict: Deny, Reason: ReasonUntrusted}
	case q.AskEach && rs.unknown == ActionDeny:
		return Decision{Verdict: Deny, Reason: ReasonAskEach, Unknown: rs.unknown}
	case q.AskEach:
		// Intercept, so that each request is seen and asked about.
		return Decision{Verdict: NeedsL7, Reason: ReasonAskEach}
	case denyL7 != nil && (unknown == ActionAllow || unknown == ActionLearn):
		return Decision{Verdict: NeedsL7, Rule: denyL7, Reason: ReasonDenyPathRule}
	}
	return rs.unknownDecision(unknown)
}

func (rs *Ruleset) decideRequest(q *Query, host string, isIP bool) Decision {
	rq := request{method: upperASCII(q.Method), raw: q.Path}
	rq.clean, rq.merged, rq.ambiguous = requestPaths(q.Path)
	if i := strings.IndexAny(rq.raw, "?#"); i >= 0 {
		rq.raw = rq.raw[:i]
	}
	if r := rs.deny.matchRequest(host, q.Source, q.Port, isIP, &rq, true, false); r != nil {
		return Decision{Verdict: Deny, Rule: r, Reason: ReasonDenyRule}
	}
	if r := rs.allow.matchRequest(host, q.Source, q.Port, isIP, &rq, false, q.MemberOnly || q.AskEach); r != nil {
		return Decision{Verdict: Allow, Rule: r, Reason: ReasonAllowRule}
	}
	if isIP {
		return Decision{Verdict: Deny, Reason: ReasonRawIP}
	}
	if r := rs.presets.forHost(host, q.Source, q.Port, q.MemberOnly || q.AskEach); r != nil {
		return Decision{Verdict: Deny, Rule: r, Reason: ReasonReadOnly}
	}
	return rs.noRuleDecision(q.MemberOnly, q.AskEach)
}

// noRuleDecision answers a request or a name no rule decided: a user_added
// member (memberOnly) is denied; a high-risk one (askEach) is asked, or
// denied when unknown_action is deny, whatever else unknown_action says;
// anyone else gets the unknown action.
func (rs *Ruleset) noRuleDecision(memberOnly, askEach bool) Decision {
	switch {
	case memberOnly:
		return Decision{Verdict: Deny, Reason: ReasonUntrusted}
	case askEach && rs.unknown == ActionDeny:
		return Decision{Verdict: Deny, Reason: ReasonAskEach, Unknown: rs.unknown}
	case askEach:
		return Decision{Verdict: Ask, Reason: ReasonAskEach, Unknown: rs.unknown}
	}
	return rs.unknownDecision(rs.unknownNow())
}

// unknownDecision is the decision of unknown, the unknown action in force
// (unknownNow), for traffic no rule matched.
func (rs *Ruleset) unknownDecision(unknown Action) Decision {
	d := Decision{Reason: ReasonUnknown, Unknown: unknown}
	switch d.Unknown {
	case ActionLearn:
		d.Verdict, d.Reason, d.Until = Allow, ReasonLearn, rs.learnUntil
	case ActionAllow:
		d.Verdict = Allow
	case ActionAsk:
		d.Verdict = Ask
	default:
		d.Verdict = Deny
	}
	return d
}

// request holds the forms of one request's method and path that rules are
// checked against.
type request struct {
	method    string
	raw       string // the path as sent, without query or fragment
	clean     string
	merged    string
	forms     []string // denyForms, once made
	ambiguous bool
}

// index finds the rules of one list whose host part matches a host.
type index struct {
	exact  map[string][]*Rule // host → rules
	suffix map[string][]*Rule // domain of a "*.domain" wildcard → rules
	any    []*Rule
	regex  []*Rule
	cidr   []*Rule
}

func (ix *index) add(r *Rule) {
	p := &r.Pattern
	switch p.kind {
	case KindExact:
		if ix.exact == nil {
			ix.exact = make(map[string][]*Rule)
		}
		ix.exact[p.host] = append(ix.exact[p.host], r)
	case KindWildcard:
		if ix.suffix == nil {
			ix.suffix = make(map[string][]*Rule)
		}
		ix.suffix[p.host] = append(ix.suffix[p.host], r)
	case KindAny:
		ix.any = append(ix.any, r)
	case KindRegex:
		ix.regex = append(ix.regex, r)
	case KindCIDR:
		ix.cidr = append(ix.cidr, r)
	}
}

// candidates calls f for every rule whose host part matches host, most
// specific first: exact, wildcards from the longest domain, "*", regexes.
// An IP literal is matched by cidr: rules only. f returns false to stop.
func (ix *index) candidates(host string, isIP bool, f func(*Rule) bool) {
	if isIP {
		for _, r := range ix.cidr {
			if r.Pattern.matchHost(host) && !f(r) {
				return
			}
		}
		return
	}
	for _, r := range ix.exact[host] {
		if !f(r) {
			return
		}
	}
	if len(ix.suffix) > 0 {
		for i := 0; i < len(host); i++ {
			if host[i] != '.' {
				continue
			}
			for _, r := range ix.suffix[host[i+1:]] {
				if !f(r) {
					return
				}
			}
		}
	}
	for _, r := range ix.any {
		if !f(r) {
			return
		}
	}
	for _, r := range ix.regex {
		if r.Pattern.matchHost(host) && !f(r) {
			return
		}
	}
}

// matchHost returns the first rule for host, source and port that needs no
// request to decide (hostOnly), and the first that looks at the method or
// path (l7). It stops at the first hostOnly rule.
func (ix *index) matchHost(host, source string, port uint16, isIP, memberOnly bool) (hostOnly, l7 *Rule) {
	// candidates does not keep f, so the matcher stays on the stack: a
	// host-level decision does not allocate.
	m := hostMatcher{source: source, port: port, memberOnly: memberOnly}
	ix.candidates(host, isIP, m.visit)
	return m.hostOnly, m.l7
}

type hostMatcher struct {
	source     string
	port       uint16
	memberOnly bool
	hostOnly   *Rule
	l7         *Rule
}

func (m *hostMatcher) visit(r *Rule) bool {
	if !appliesTo(r, m.source, m.port, m.memberOnly) {
		return true
	}
	if r.Pattern.NeedsL7() {
		if m.l7 == nil {
			m.l7 = r
		}
		return true
	}
	m.hostOnly = r
	return false
}

func (ix *index) matchRequest(host, source string, port uint16, isIP bool, rq *request, deny, memberOnly bool) *Rule {
	var found *Rule
	ix.candidates(host, isIP, func(r *Rule) bool {
		if !appliesTo(r, source, port, memberOnly) {
			return true
		}
		p := &r.Pattern
		var ok bool
		switch {
		case !p.NeedsL7():
			ok = true
		case deny:
			// A deny rule must not be slipped past with another spelling
			// of the same path.
			ok = p.denies(rq)
		case rq.ambiguous && (!p.anyPath() || p.pathRe != nil):
			ok = false
		default:
			ok = p.matchRequest(rq.method, rq.clean)
		}
		if ok {
			found = r
		}
		return !ok
	})
	return found
}

// forHost returns the first rule whose host part matches host and that
// applies to source and port, whatever its method or path.
func (ix *index) forHost(host, source string, port uint16, memberOnly bool) *Rule {
	var found *Rule
	ix.candidates(host, false, func(r *Rule) bool {
		if appliesTo(r, source, port, memberOnly) {
			found = r
		}
		return found == nil
	})
	return found
}

// appliesTo reports whether r speaks of a request from source to port; with
// memberOnly, only a rule naming source as its member does.
func appliesTo(r *Rule, source string, port uint16, memberOnly bool) bool {
	return (r.Member == source || r.Member == "" && !memberOnly) && r.Pattern.matchPort(port)
}

func isIPLiteral(host string) bool {
	// Normalised names never end in a numeric label, so a last byte that is
	// a digit or a colon means an address.
	if host == "" {
		return false
	}
	c := host[len(host)-1]
	if c >= '0' && c <= '9' || c == ':' || c == ']' {
		_, err := netip.ParseAddr(host)
		return err == nil
	}
	return false
}

func upperASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if 'a' <= s[i] && s[i] <= 'z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'a' <= b[j] && b[j] <= 'z' {
					b[j] -= 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// Explain returns a user-facing sentence for a decision about host.
func (d Decision) Explain(host string) string {
	switch {
	case d.Rule != nil:
		return fmt.Sprintf("%s %s: %s, pattern %q in the %s (%s)", d.Verdict, host, d.Reason, d.Rule.Pattern.String(), d.Rule.List, d.Rule.Tier)
	default:
		return fmt.Sprintf("%s %s: %s", d.Verdict, host, d.Reason)
	}
}

// DecideName answers a question about a DNS name, which has neither port nor
// path: Deny when a deny rule for the whole name matches (no method, path or
// port of its own), Allow when any allow rule's host part matches it (on any
// port, for any path), and otherwise the unknown action with ReasonUnknown.
// The DNS gate forwards a query upstream only on Allow with a Rule, so a name
// no rule allows never reaches an upstream server, whatever unknown_action
// says. IP literals are not names and are denied.
func (rs *Ruleset) DecideName(source, name string) Decision {
	return rs.decideName(source, name, false, false)
}

// decideName is DecideName; with memberOnly only allow rules naming source
// as their member apply (a user_added member).
func (rs *Ruleset) decideName(source, name string, memberOnly, askEach bool) Decision {
	host, err := NormalizeHost(name)
	if err != nil || isIPLiteral(host) {
		return Decision{Verdict: Deny, Reason: ReasonBadHost}
	}
	m := nameMatcher{source: source, deny: true}
	rs.deny.candidates(host, false, m.visit)
	if m.found != nil {
		return Decision{Verdict: Deny, Rule: m.found, Reason: ReasonDenyRule}
	}
	m = nameMatcher{source: source, memberOnly: memberOnly || askEach}
	rs.allow.candidates(host, false, m.visit)
	if m.found != nil {
		return Decision{Verdict: Allow, Rule: m.found, Reason: ReasonAllowRule}
	}
	// For a high-risk member, Ask means a fake address, so that its
	// requests come and are asked about.
	return rs.noRuleDecision(memberOnly, askEach)
}

type nameMatcher struct {
	source     string
	deny       bool
	memberOnly bool
	found      *Rule
}

func (m *nameMatcher) visit(r *Rule) bool {
	if r.Member != m.source && (r.Member != "" || m.memberOnly) {
		return true
	}
	if m.deny && (r.Pattern.NeedsL7() || r.Pattern.port != 0) {
		return true
	}
	m.found = r
	return false
}
