package policy

import (
	"net/netip"
	"slices"
	"strings"
)

// matchPort reports whether a pattern's port admits port: a pattern without a
// port admits 80 and 443.
func (p *Pattern) matchPort(port uint16) bool {
	if p.port == 0 {
		return port == 80 || port == 443
	}
	return p.port == port
}

// matchHost reports whether the pattern's host part matches a normalised
// host. CIDR patterns match only IP literals.
func (p *Pattern) matchHost(host string) bool {
	switch p.kind {
	case KindExact:
		return p.host == host
	case KindWildcard:
		return len(host) > len(p.host) && strings.HasSuffix(host, p.host) && host[len(host)-len(p.host)-1] == '.'
	case KindAny:
		return true
	case KindRegex:
		return p.hostRe.MatchString(host)
	case KindCIDR:
		a, err := netip.ParseAddr(host)
		return err == nil && p.prefix.Contains(a)
	}
	return false
}

// matchRequest reports whether the pattern's method and path parts admit a
// request. path is a normalised path (see cleanPath).
func (p *Pattern) matchRequest(method, path string) bool {
	if p.method != "" && p.method != method {
		return false
	}
	if p.pathRe != nil {
		return p.pathRe.MatchString(path)
	}
	return p.anyPath() || globMatch(p.glob, path)
}

// denies reports whether deny pattern p matches a request in any spelling
// a server may take as the same (see request.denyForms). A deny rule on
// GET also denies HEAD, which servers answer with the GET handler: its
// side effects run, and the URL reaches the server. A path regex is also
// tried as written on the path as sent, so one that tells case apart
// denies what it did.
func (p *Pattern) denies(rq *request) bool {
	if p.method != "" && p.method != rq.method && (p.method != "GET" || rq.method != "HEAD") {
		return false
	}
	if p.anyPath() && p.pathRe == nil {
		return true
	}
	if p.pathRe != nil && (p.pathRe.MatchString(rq.clean) || p.pathRe.MatchString(rq.merged) || p.pathRe.MatchString(rq.raw)) {
		return true
	}
	for _, form := range rq.denyForms() {
		if p.foldRe != nil && p.foldRe.MatchString(form) || p.foldRe == nil && globMatch(p.foldGlob, form) {
			return true
		}
	}
	return false
}

// globMatch reports whether s matches glob, where "*" matches any run of
// bytes, "/" included, and every other byte matches itself. It does not
// allocate, and costs time in proportion to len(s) for each run of glob
// between stars: the text before the first star must start s, the text
// after the last end it, and each run between is found, in order, at its
// leftmost place (which is always as good as any later one).
func globMatch(glob, s string) bool {
	star := strings.IndexByte(glob, '*')
	if star < 0 {
		return glob == s
	}
	if !strings.HasPrefix(s, glob[:star]) {
		return false
	}
	s, glob = s[star:], glob[star+1:]
	last := strings.LastIndexByte(glob, '*')
	suffix := glob[last+1:]
	if last < 0 {
		glob = ""
	} else {
		glob = glob[:last]
	}
	if !strings.HasSuffix(s, suffix) {
		return false
	}
	s = s[:len(s)-len(suffix)]
	for glob != "" {
		run := glob
		if i := strings.IndexByte(glob, '*'); i >= 0 {
			run, glob = glob[:i], glob[i+1:]
		} else {
			glob = ""
		}
		if run == "" {
			continue
		}
		i := strings.Index(s, run)
		if i < 0 {
			return false
		}
		s = s[i+len(run):]
	}
	return true
}

// requestPaths returns the forms of a request path that rules are checked
// against. clean has the query and fragment cut off, percent-encoded
// unreserved characters decoded, and dot segments removed, as an upstream
// server would see it. merged is clean with runs of "/" folded to one, as
// some servers see it. ambiguous reports a path an upstream may read in more
// than one way (an encoded "/" or "\", a backslash, an encoded NUL, a ";"
// that Java and other servers cut segment parameters at): allow rules with a
// path never match such a path, and deny rules are checked against every
// form (see denyForms), so neither can be slipped past.
func requestPaths(raw string) (clean, merged string, ambiguous bool) {
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		raw = raw[:i]
	}
	if raw == "" || raw[0] != '/' {
		raw = "/" + raw
	}
	dec, amb := decodeUnreserved(raw)
	if strings.Contains(dec, ";") || strings.Contains(dec, "%3B") {
		amb = true
	}
	clean = removeDotSegments(dec)
	merged = foldSlashes(clean)
	return clean, merged, amb
}

func foldSlashes(p string) string {
	if !strings.Contains(p, "//") {
		return p
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == '/' && i > 0 && p[i-1] == '/' {
			continue
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

// denyForms returns the spellings of the request's path that deny rules
// are checked against, in lower case (deny globs and regexes are compared
// in lower case too): the path as sent, cleaned and with runs of "/"
// folded, and the other spellings servers may take as the same:
//   - segment parameters cut (Tomcat, Spring: "/admin;x/y" is "/admin/y");
//   - any case (IIS, Express by default), also letters outside ASCII that
//     case-insensitive comparisons take for ASCII ones (Java's
//     equalsIgnoreCase: "ı" and "İ" are "i", "ſ" is "s", the Kelvin sign
//     is "k"; full case folding: "ﬁ" is "fi");
//   - NTFS streams, trailing dots and spaces cut from every segment (IIS:
//     "/admin::$DATA", "/admin./x" and "/admin%20" are "/admin...");
//   - a trailing "/" cut, or added (Express, Rails, Spring 5: "/admin/" is
//     "/admin", and "/admin" what "/admin/*" guards);
//   - a format suffix cut from the last segment (Rails, Spring's suffix
//     matching: "/admin.json" is "/admin");
//   - the path up to a segment with an extension (PHP and CGI's PATH_INFO:
//     "/admin.php/x" runs "/admin.php").
//
// They are made the first time a deny rule with a path is checked, once
// per request.
func (rq *request) denyForms() []string {
	if rq.forms != nil {
		return rq.forms
	}
	forms := make([]string, 0, 12)
	add := func(f string) {
		if !slices.Contains(forms, f) {
			forms = append(forms, f)
		}
	}
	for _, f := range []string{rq.clean, rq.merged, rq.raw} {
		add(foldPath(f))
	}
	stripped := rq.merged
	if strings.Contains(stripped, ";") || strings.Contains(stripped, "%3B") {
		segs := strings.Split(strings.ReplaceAll(stripped, "%3B", ";"), "/")
		for i, s := range segs {
			if j := strings.IndexByte(s, ';'); j >= 0 {
				segs[i] = s[:j]
			}
		}
		stripped = removeDotSegments(strings.Join(segs, "/"))
	}
	f := foldPath(stripped)
	add(f)
	// NTFS: each segment without its stream and trailing dots and spaces.
	segs := strings.Split(f, "/")
	for i, seg := range segs {
		if j := strings.Index(seg, "::"); j >= 0 {
			seg = seg[:j]
		}
		for {
			t := strings.TrimSuffix(strings.TrimRight(seg, ". "), "%20")
			if t == seg {
				break
			}
			seg = t
		}
		segs[i] = seg
	}
	// PATH_INFO: the path up to a segment with an extension, which a
	// server may run with the rest as PATH_INFO (nginx's usual split takes
	// the first ".php"; Apache the first file that exists): the first few
	// segments with a dot, and the first few with a script's extension,
	// however many dotted directories come before them; no more, so that
	// a path of many dotted segments costs no more than a few.
	dotted, scripts := 0, 0
	for i := 1; i < len(segs)-1; i++ {
		dot := strings.LastIndexByte(segs[i], '.')
		if dot <= 0 {
			continue
		}
		script := slices.Contains(scriptExtensions, segs[i][dot+1:])
		if dotted < maxPathInfoForms || script && scripts < maxPathInfoForms {
			add(strings.Join(segs[:i+1], "/"))
		}
		dotted++
		if script {
			scripts++
		}
	}
	f = strings.Join(segs, "/")
	if len(f) > 1 {
		f = strings.TrimRight(f, "/")
	}
	add(f)
	add(f + "/")
	last := strings.LastIndexByte(f, '/') + 1
	if i := strings.IndexByte(f[last:], '.'); i > 0 {
		add(f[:last+i])
		add(f[:last+i] + "/")
	}
	rq.forms = forms
	return forms
}

// maxPathInfoForms bounds the PATH_INFO forms of one request, of each of
// its two kinds.
const maxPathInfoForms = 4

// scriptExtensions are the extensions, in lower case, of files servers run
// with the rest of a path as PATH_INFO.
var scriptExtensions = []string{"php", "php3", "php4", "php5", "php7", "phtml", "phar", "cgi", "fcgi", "pl", "py", "rb",
	"asp", "aspx", "asmx", "ashx", "axd", "svc", "jsp", "jspx", "do", "action", "cfm", "dll", "exe", "shtml"}

// foldPath lower-cases a canonical path, and writes the escaped letters
// outside ASCII that case-insensitive comparisons take for ASCII letters
// as those letters.
func foldPath(p string) string {
	p = strings.ToLower(p)
	if strings.Contains(p, "%") {
		p = asciiFolds.Replace(p)
	}
	return p
}

// asciiFolds are the letters outside ASCII, escaped as a canonical path in
// lower case holds them, that case-insensitive comparisons match with
// ASCII letters: by simple case mapping (Java's equalsIgnoreCase, Go's
// EqualFold) or full case folding (ligatures).
var asciiFolds = strings.NewReplacer(
	"%c4%b1", "i", // ı dotless i
	"%c4%b0", "i", // İ capital I with dot
	"%c5%bf", "s", // ſ long s
	"%e2%84%aa", "k", // K Kelvin sign
	"%ef%ac%80", "ff", "%ef%ac%81", "fi", "%ef%ac%82", "fl", "%ef%ac%83", "ffi",
	"%ef%ac%84", "ffl", "%ef%ac%85", "st", "%ef%ac%86", "st",
)

// decodeUnreserved decodes %XX escapes of unreserved characters
// (ALPHA / DIGIT / "-" / "." / "_" / "~"), which mean the same encoded or not,
// and upper-cases the hex of every other escape. It reports whether the path
// holds escapes or bytes that servers disagree on.
func decodeUnreserved(s string) (string, bool) {
	amb := strings.ContainsRune(s, '\\')
	if strings.IndexByte(s, '%') < 0 {
		return s, amb
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' || i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			if c == '%' {
				amb = true // a stray "%": servers differ on what it means
			}
			b.WriteByte(c)
			continue
		}
		v := unhex(s[i+1])<<4 | unhex(s[i+2])
		switch {
		case 'a' <= v && v <= 'z', 'A' <= v && v <= 'Z', '0' <= v && v <= '9', v == '-', v == '.', v == '_', v == '~':
			b.WriteByte(v)
		default:
			if v == '/' || v == '\\' || v == 0 || v == '%' {
				amb = true
			}
			b.WriteByte('%')
			b.WriteByte(upperHex(s[i+1]))
			b.WriteByte(upperHex(s[i+2]))
		}
		i += 2
	}
	return b.String(), amb
}

// removeDotSegments applies RFC 3986 §5.2.4 to an absolute path.
func removeDotSegments(p string) string {
	if !strings.Contains(p, ".") {
		return p
	}
	segs := strings.Split(p[1:], "/")
	out := make([]string, 0, len(segs))
	for i, s := range segs {
		last := i == len(segs)-1
		switch s {
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, s)
		}
	}
	return "/" + strings.Join(out, "/")
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func upperHex(c byte) byte {
	if 'a' <= c && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}
