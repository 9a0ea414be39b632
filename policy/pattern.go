package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"regexp/syntax"
	"strconv"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// MaxPatternLen caps the length of a pattern, and so of a regex, in bytes.
const MaxPatternLen = 1024

// Kind is the form of a pattern's host part.
type Kind uint8

const (
	// KindExact matches one host: "api.github.com".
	KindExact Kind = iota + 1
	// KindWildcard matches every name below a domain, not the domain itself:
	// "*.googleapis.com".
	KindWildcard
	// KindAny matches every host: "*". Accepted only when forced.
	KindAny
	// KindRegex matches hosts (and optionally paths) with an RE2 regex:
	// "regex:.*\.example\.com".
	KindRegex
	// KindCIDR matches raw-IP destinations: "cidr:203.0.113.0/24".
	KindCIDR
)

func (k Kind) String() string {
	switch k {
	case KindExact:
		return "exact"
	case KindWildcard:
		return "wildcard"
	case KindAny:
		return "any"
	case KindRegex:
		return "regex"
	case KindCIDR:
		return "cidr"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Pattern is a parsed, normalised pattern. The zero Pattern matches nothing.
type Pattern struct {
	canon  string
	kind   Kind
	method string // upper case; "" means any method
	host   string // KindExact: the host; KindWildcard: the suffix without "*."
	port   uint16 // 0 means the default ports 80 and 443
	path   string // glob starting with "/"; "" means any path
	// glob is path in the canonical form requests are decided in (escaped
	// unreserved characters decoded, see CanonicalTarget); foldGlob is
	// glob in lower case and foldRe pathRe ignoring case, for deny rules,
	// which are checked against the spellings servers take as the same.
	glob, foldGlob string
	hostRe         *regexp.Regexp
	pathRe, foldRe *regexp.Regexp
	prefix         netip.Prefix
}

// ErrBroad is wrapped by the error Parse returns for a pattern that allows
// everything or a whole public suffix. ParseOptions.Force accepts it.
var ErrBroad = errors.New("pattern is too broad")

// ParseOptions changes how Parse validates a pattern.
type ParseOptions struct {
	// Force accepts patterns that allow everything or a whole public suffix.
	Force bool
}

// Kind returns the form of the pattern's host part.
func (p Pattern) Kind() Kind { return p.kind }

// Method returns the method the pattern is limited to, or "".
func (p Pattern) Method() string { return p.method }

// Form names the pattern's form as the pattern language's table does, for
// people: "exact", "wildcard", "path" (a host and a path glob),
// "wildcard-path", "method", "regex", "cidr" or "any". A port does not
// change the form.
func (p Pattern) Form() string {
	switch {
	case p.kind == KindExact || p.kind == KindWildcard:
		form := p.kind.String()
		switch {
		case p.method != "":
			return "method"
		case !p.anyPath() && p.kind == KindExact:
			return "path"
		case !p.anyPath():
			return "wildcard-path"
		}
		return form
	}
	return p.kind.String()
}

// Host returns the exact host, or the domain under a "*." wildcard.
func (p Pattern) Host() string { return p.host }

// Prefix returns the addresses of a cidr: pattern; the zero Prefix for
// other kinds.
func (p Pattern) Prefix() netip.Prefix { return p.prefix }

// Port returns the port the pattern is limited to, or 0 for 80 and 443.
func (p Pattern) Port() uint16 { return p.port }

// Path returns the path glob, or "" when any path matches.
func (p Pattern) Path() string { return p.path }

// String returns the canonical form of the pattern: what Parse would read back
// to the same Pattern.
func (p Pattern) String() string { return p.canon }

// IsZero reports whether p is the zero Pattern.
func (p Pattern) IsZero() bool { return p.kind == 0 }

// NeedsL7 reports whether the pattern looks at the method or the path, so a
// connection it applies to must be intercepted to be decided request by
// request.
func (p Pattern) NeedsL7() bool {
	return p.method != "" || !p.anyPath() || p.pathRe != nil
}

// anyPath reports whether the pattern's path glob matches every path: none
// given, or "/*".
func (p Pattern) anyPath() bool { return p.path == "" || p.path == "/*" }

// Parse reads a pattern of the airlock pattern language:
//
//	api.github.com                 exact host, ports 80 and 443, any path
//	*.googleapis.com               any name below googleapis.com
//	api.example.com/v1/*           host and path glob ("*" matches any run, "/" included)
//	*.example.com/*                any subdomain, any path
//	regex:.*\.example\.(com|org)   RE2, fully anchored, against the host
//	regex:api\.example\.com/v[0-9]+/.*   a "/" splits host regex from path regex
//	GET api.github.com/repos/*     only that method
//	db.example.com:5432            that port only
//	cidr:203.0.113.0/24            raw-IP destinations, cidr:203.0.113.7/32:22 with a port
//
// Hosts are normalised to lower case, without a trailing dot, IDNA names to
// punycode. The canonical form round-trips: Parse(p.String(), Force)
// returns a pattern with the same String. Patterns that allow everything or a whole public suffix fail with
// an error wrapping ErrBroad unless opts.Force is set.
func Parse(s string, opts ParseOptions) (Pattern, error) {
	p, err := parse(s, opts)
	if err != nil {
		return Pattern{}, fmt.Errorf("pattern %q: %w", truncate(s, 80), err)
	}
	return p, nil
}

// MustParse is Parse for patterns known to be valid (tables, tests); it
// panics on error.
func MustParse(s string) Pattern {
	p, err := Parse(s, ParseOptions{Force: true})
	if err != nil {
		panic(err)
	}
	return p
}

func parse(s string, opts ParseOptions) (Pattern, error) {
	if len(s) > MaxPatternLen {
		return Pattern{}, fmt.Errorf("longer than %d bytes", MaxPatternLen)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return Pattern{}, errors.New("contains a control character")
		}
	}
	s = strings.Trim(s, " ")
	if s == "" {
		return Pattern{}, errors.New("empty")
	}
	var p Pattern
	if i := strings.IndexByte(s, ' '); i >= 0 {
		m := s[:i]
		if !isMethod(m) {
			return Pattern{}, fmt.Errorf("%q is not an HTTP method; a pattern holds no spaces except after a method such as GET", m)
		}
		p.method = m
		s = strings.TrimLeft(s[i+1:], " ")
		if strings.IndexByte(s, ' ') >= 0 {
			return Pattern{}, errors.New("holds a space; write spaces in a path as %20")
		}
	}
	var err error
	if rest, ok := cutKeyword(s, "regex:"); ok {
		err = p.parseRegex(rest, opts)
	} else if rest, ok := cutKeyword(s, "cidr:"); ok {
		if p.method != "" {
			return Pattern{}, errors.New("a method rule needs a host name, not a cidr")
		}
		err = p.parseCIDR(rest, opts)
	} else {
		err = p.parseHost(s, opts)
	}
	if err != nil {
		return Pattern{}, err
	}
	p.canon = p.canonical()
	return p, nil
}

// cutKeyword cuts a kind's keyword ("regex:", "cidr:", ASCII) from the
// start of s, in any case: "Regex:443" is a regex, never the host "regex"
// with port 443, whose canonical form "regex:443" would read back as a
// regex.
func cutKeyword(s, kw string) (string, bool) {
	if len(s) < len(kw) {
		return s, false
	}
	for i := range len(kw) {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != kw[i] {
			return s, false
		}
	}
	return s[len(kw):], true
}

func (p *Pattern) parseHost(s string, opts ParseOptions) error {
	hostport, path := s, ""
	if i := strings.IndexByte(s, '/'); i >= 0 {
		hostport, path = s[:i], s[i:]
	}
	if strings.Contains(hostport, "://") || strings.HasSuffix(hostport, ":") && path != "" && strings.HasPrefix(path, "//") {
		return errors.New("write the host without a scheme: api.example.com, not https://api.example.com")
	}
	if strings.HasPrefix(hostport, "[") || strings.Count(hostport, ":") > 1 {
		return fmt.Errorf("%q is an IPv6 address; sandboxes are IPv4-only", hostport)
	}
	host := hostport
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 {
		port, err := parsePort(hostport[i+1:])
		if err != nil {
			return err
		}
		host, p.port = hostport[:i], port
	}
	if path != "" {
		if err := checkPathGlob(path); err != nil {
			return err
		}
		// "host/*" is kept as written so the user sees the pattern they
		// chose; it matches every path, like the bare host (see anyPath).
		p.path = path
		p.glob, _ = decodeUnreserved(path)
		p.foldGlob = foldPath(p.glob)
	}
	switch {
	case strings.Trim(host, "*.") == "" && strings.Contains(host, "*"):
		// "*", "*.*", "*.*.*": every host.
		p.kind = KindAny
		if !opts.Force {
			return fmt.Errorf("%w: %q matches every host; add a domain, or force it", ErrBroad, host)
		}
		return nil
	case strings.HasPrefix(host, "*."):
		suffix, err := normalizePatternHost(host[2:])
		if err != nil {
			return err
		}
		p.kind, p.host = KindWildcard, suffix
		switch {
		case opts.Force:
		case isPublicSuffix(suffix):
			return fmt.Errorf("%w: %q covers the whole public suffix %q; name a registrable domain such as *.example.%s, or force it", ErrBroad, host, suffix, suffix)
		case ChildrenArePublicSuffixes(suffix):
			return fmt.Errorf("%w: %q covers whole public suffixes: the public suffix list makes every name under %s one (such as x.%s); name a registrable domain such as *.example.x.%s, or force it", ErrBroad, host, suffix, suffix, suffix)
		}
		return nil
	case strings.Contains(host, "*"):
		return fmt.Errorf("%q: a wildcard may only stand alone as the first label (*.example.com); use regex: for anything else", host)
	}
	h, err := normalizePatternHost(host)
	if err != nil {
		return err
	}
	if (h == "regex" || h == "cidr") && p.port != 0 {
		// Written back without the dot that set it apart here
		// ("regex.:8080"), it would read as a regex: or cidr: pattern.
		return fmt.Errorf("the host %q takes no port in a pattern: written back, %s:%d would read as a %s: pattern", h, h, p.port, h)
	}
	p.kind, p.host = KindExact, h
	return nil
}

func (p *Pattern) parseRegex(src string, opts ParseOptions) error {
	if src == "" {
		return errors.New("empty regex")
	}
	hostSrc, pathSrc := src, ""
	if i := strings.IndexByte(src, '/'); i >= 0 {
		hostSrc, pathSrc = src[:i], src[i:]
	}
	if hostSrc == "" {
		return errors.New("regex has no host part before the first /")
	}
	// Hosts are compared lower case, so the host part ignores case: a deny
	// regex written with capitals still denies.
	hre, err := regexp.Compile(`^(?i:` + hostSrc + `)$`)
	if err != nil {
		return fmt.Errorf("host regex %q does not compile as RE2: %w", hostSrc, unwrapSyntax(err))
	}
	p.kind, p.hostRe = KindRegex, hre
	if pathSrc != "" {
		pre, err := regexp.Compile(`^(?:` + pathSrc + `)$`)
		if err != nil {
			return fmt.Errorf("path regex %q does not compile as RE2: %w", pathSrc, unwrapSyntax(err))
		}
		p.pathRe = pre
		p.foldRe = regexp.MustCompile(`(?i)^(?:` + pathSrc + `)$`)
	}
	p.host = src
	if !opts.Force {
		if probe, ok := broadRegex(hre); ok {
			return fmt.Errorf("%w: regex %q matches unrelated domains such as %q; anchor it to your domain, or force it", ErrBroad, hostSrc, probe)
		}
	}
	return nil
}

func (p *Pattern) parseCIDR(s string, opts ParseOptions) error {
	// The prefix ends at the "/"; a port may follow the prefix length.
	slash := strings.IndexByte(s, '/')
	if slash < 0 {
		return fmt.Errorf("cidr %q needs a prefix length, such as %s/32", s, s)
	}
	rest := s[slash+1:]
	bits := rest
	if i := strings.IndexByte(rest, ':'); i >= 0 {
		port, err := parsePort(rest[i+1:])
		if err != nil {
			return err
		}
		bits, p.port = rest[:i], port
	}
	addr, err := netip.ParseAddr(s[:slash])
	if err != nil {
		return fmt.Errorf("cidr address %q: %w", s[:slash], err)
	}
	if !addr.Is4() {
		return fmt.Errorf("cidr %q is not IPv4; sandboxes are IPv4-only", s[:slash])
	}
	n, err := strconv.Atoi(bits)
	if err != nil || n < 0 || n > 32 || bits != strconv.Itoa(n) {
		return fmt.Errorf("cidr prefix length %q is not a number from 0 to 32", bits)
	}
	pfx := netip.PrefixFrom(addr, n)
	if pfx.Masked() != pfx {
		return fmt.Errorf("cidr %s/%d has host bits set; did you mean %s?", addr, n, pfx.Masked())
	}
	p.kind, p.prefix = KindCIDR, pfx
	if !opts.Force && n < 8 {
		return fmt.Errorf("%w: cidr %s covers more than a /8; narrow it, or force it", ErrBroad, pfx)
	}
	return nil
}

func (p Pattern) canonical() string {
	var b strings.Builder
	if p.method != "" {
		b.WriteString(p.method)
		b.WriteByte(' ')
	}
	switch p.kind {
	case KindExact:
		b.WriteString(p.host)
	case KindWildcard:
		b.WriteString("*.")
		b.WriteString(p.host)
	case KindAny:
		b.WriteString("*")
	case KindRegex:
		b.WriteString("regex:")
		b.WriteString(p.host)
		return b.String()
	case KindCIDR:
		b.WriteString("cidr:")
		b.WriteString(p.prefix.String())
	}
	if p.port != 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(int(p.port)))
	}
	b.WriteString(p.path)
	return b.String()
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 || s != strconv.Itoa(n) {
		return 0, fmt.Errorf("port %q is not a number from 1 to 65535", s)
	}
	return uint16(n), nil
}

func checkPathGlob(path string) error {
	for i := 0; i < len(path); i++ {
		switch c := path[i]; {
		case c == '?' || c == '#':
			return fmt.Errorf("path %q: patterns match the path without query or fragment; drop the %q", path, string(c))
		case c == '\\':
			return fmt.Errorf("path %q holds a backslash", path)
		case c >= 0x80:
			return fmt.Errorf("path %q holds non-ASCII bytes; percent-encode them", path)
		}
	}
	return nil
}

// isMethod reports whether s looks like an HTTP method: an upper-case token.
func isMethod(s string) bool {
	if s == "" || len(s) > 16 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

// isPublicSuffix reports whether "*.suffix" would cover a whole public suffix:
// a bare top-level label, or an ICANN public suffix such as com or co.uk.
// Suffixes from the list's private section (googleapis.com, github.io) are
// accepted: each is one company's namespace.
func isPublicSuffix(suffix string) bool {
	if !strings.Contains(suffix, ".") {
		return true
	}
	ps, icann := publicsuffix.PublicSuffix(suffix)
	return icann && ps == suffix
}

// ChildrenArePublicSuffixes reports whether the public suffix list makes
// every name one label under suffix an ICANN public suffix, by a wildcard
// rule (*.kawasaki.jp, *.nagoya.jp): "*.suffix" then covers whole public
// suffixes, as *.co.uk does. A label made up for the purpose stands for
// any: the list's exceptions (!city.kawasaki.jp) name only a few.
func ChildrenArePublicSuffixes(suffix string) bool {
	probe := "airlock-probe-k3." + suffix
	ps, icann := publicsuffix.PublicSuffix(probe)
	return icann && ps == probe
}

// broadProbes are hosts in unrelated registrable domains. A regex that
// matches two of them is not anchored to anyone's domain.
var broadProbes = []string{
	"airlock-probe-a7.com", "x.airlock-probe-b3.com",
	"airlock-probe-c9.net", "y.airlock-probe-d2.org",
	"airlock-probe-e5.co.uk", "airlock-probe-f1.io",
	"airlock-probe-g4.dev", "z.airlock-probe-h8.test",
}

func broadRegex(re *regexp.Regexp) (string, bool) {
	var first string
	for _, h := range broadProbes {
		if re.MatchString(h) {
			if first != "" {
				return first, true
			}
			first = h
		}
	}
	return "", false
}

// unwrapSyntax drops regexp's own "error parsing regexp:" prefix, which
// repeats what the caller's message says.
func unwrapSyntax(err error) error {
	var se *syntax.Error
	if errors.As(err, &se) {
		return se
	}
	return err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
