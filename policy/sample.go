package policy

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// SampleQuery turns a sample URL, as a person types it into the pattern
// tester, into the request Query it stands for. It accepts
// "https://host/path", "http://host:8080/path", "host/path" (https assumed)
// and a method before any of them ("POST https://host/path"); the method is
// GET when none is given.
func SampleQuery(sample string) (Query, error) {
	s := strings.TrimSpace(sample)
	method := "GET"
	if i := strings.IndexByte(s, ' '); i >= 0 {
		if !isMethod(s[:i]) {
			return Query{}, fmt.Errorf("sample %q: %q is not an HTTP method", truncate(sample, 80), s[:i])
		}
		method, s = s[:i], strings.TrimSpace(s[i+1:])
	}
	if s == "" {
		return Query{}, errors.New("empty sample URL")
	}
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return Query{}, fmt.Errorf("sample %q: %w", truncate(sample, 80), err)
	}
	var port uint16
	switch u.Scheme {
	case "https":
		port = 443
	case "http":
		port = 80
	default:
		return Query{}, fmt.Errorf("sample %q: scheme %q is not http or https", truncate(sample, 80), u.Scheme)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return Query{}, fmt.Errorf("sample %q: bad port %q", truncate(sample, 80), p)
		}
		port = uint16(n)
	}
	host, err := NormalizeHost(u.Hostname())
	if err != nil {
		return Query{}, fmt.Errorf("sample %q: %w", truncate(sample, 80), err)
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	if u.RawQuery != "" {
		path += "?" + u.RawQuery
	}
	return Query{Host: host, Port: port, Method: method, Path: path}, nil
}

// Matches reports whether the pattern alone matches q, ignoring which list
// it would sit in and which member it is for. A connection-level q matches
// when the host and port do; a request also needs the method and path to.
func (p Pattern) Matches(q Query) bool {
	if p.kind == 0 {
		return false
	}
	host, err := NormalizeHost(q.Host)
	if err != nil {
		return false
	}
	if isIPLiteral(host) != (p.kind == KindCIDR) || !p.matchHost(host) || !p.matchPort(q.Port) {
		return false
	}
	if !q.IsRequest() || !p.NeedsL7() {
		return true
	}
	clean, _, ambiguous := requestPaths(q.Path)
	if ambiguous && (!p.anyPath() || p.pathRe != nil) {
		return false
	}
	return p.matchRequest(upperASCII(q.Method), clean)
}
