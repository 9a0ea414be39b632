package policy

import (
	"errors"
	"fmt"
	"strings"
)

// ErrAmbiguousPath is wrapped by CanonicalTarget's errors for a request
// target that servers read in more than one way.
var ErrAmbiguousPath = errors.New("ambiguous request path")

// MaxTarget is the longest request target CanonicalTarget reads, as long
// as the request lines common servers take (nginx's and Apache's 8 KiB)
// twice over: deciding a target costs time in proportion to its length.
const MaxTarget = 16 << 10

// CanonicalTarget returns the one form of an HTTP request target that the
// proxy decides on and forwards, or an error for a target whose reading is
// ambiguous. Deciding on one spelling and forwarding another lets a path
// that passes a rule reach something else upstream (design §5.6), so a
// target is either rewritten to a form every server reads the same way, or
// refused:
//
//   - refused: anything but an absolute path (origin-form; the path of an
//     absolute-form target), empty segments ("//"), "." and ".." segments
//     (also with ";" parameters: Tomcat reads "/..;/" as "/../"), encoded
//     dots, slashes and backslashes ("%2e", "%2f", "%5c"), an encoded
//     percent ("%25": a second decoding would make any of them), an encoded
//     NUL, backslashes, control bytes, a stray "%" and a fragment;
//   - rewritten: escapes of letters, digits, "-", "_" and "~" are decoded
//     (they mean the same encoded or not), the hex of other escapes is upper
//     case, and bytes RFC 3986 does not allow in a path (outside ASCII,
//     quotes, braces, …) are escaped.
//
// The query is kept as it was sent, bytes outside ASCII escaped, and must
// hold no control bytes, spaces or "#". The result is path[?query].
func CanonicalTarget(target string) (string, error) {
	if target == "" {
		return "", fmt.Errorf("%w: empty request target", ErrAmbiguousPath)
	}
	if len(target) > MaxTarget {
		return "", fmt.Errorf("%w: a request target of %d bytes; at most %d are read", ErrAmbiguousPath, len(target), MaxTarget)
	}
	if rest, ok := cutHTTPScheme(target); ok {
		i := strings.IndexAny(rest, "/?#")
		if i < 0 {
			return "/", nil
		}
		if rest[i] != '/' {
			target = "/" + rest[i:]
		} else {
			target = rest[i:]
		}
	}
	if target[0] != '/' {
		return "", fmt.Errorf("%w: the request target %q is not an absolute path", ErrAmbiguousPath, truncate(target, 60))
	}
	path, query, hasQuery := strings.Cut(target, "?")
	var q strings.Builder
	for i := 0; i < len(query); i++ {
		switch c := query[i]; {
		case c <= ' ' || c == 0x7f || c == '#':
			return "", fmt.Errorf("%w: the query holds a control byte, a space or a fragment", ErrAmbiguousPath)
		case c >= 0x80:
			// Escaped as a browser would: the same bytes to a server, and
			// nothing raw for a person to misread.
			const hex = "0123456789ABCDEF"
			q.WriteByte('%')
			q.WriteByte(hex[c>>4])
			q.WriteByte(hex[c&15])
		default:
			q.WriteByte(c)
		}
	}
	query = q.String()
	var b strings.Builder
	b.Grow(len(target))
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case c == '%':
			if i+2 >= len(path) || !isHex(path[i+1]) || !isHex(path[i+2]) {
				return "", fmt.Errorf("%w: a %% that starts no escape", ErrAmbiguousPath)
			}
			v := unhex(path[i+1])<<4 | unhex(path[i+2])
			switch {
			case v == '.', v == '/', v == '\\', v == '%', v == 0:
				return "", fmt.Errorf("%w: an encoded %q (%%%c%c); send it unencoded, or not at all", ErrAmbiguousPath, rune(v), upperHex(path[i+1]), upperHex(path[i+2]))
			case 'a' <= v && v <= 'z', 'A' <= v && v <= 'Z', '0' <= v && v <= '9', v == '-', v == '_', v == '~':
				b.WriteByte(v)
			default:
				b.WriteByte('%')
				b.WriteByte(upperHex(path[i+1]))
				b.WriteByte(upperHex(path[i+2]))
			}
			i += 2
		case c == '\\':
			return "", fmt.Errorf("%w: a backslash, which some servers read as /", ErrAmbiguousPath)
		case c < ' ' || c == 0x7f:
			return "", fmt.Errorf("%w: a control byte", ErrAmbiguousPath)
		case c == ' ' || c == '#':
			return "", fmt.Errorf("%w: a space or a fragment", ErrAmbiguousPath)
		case isPathChar(c):
			b.WriteByte(c)
		default:
			const hex = "0123456789ABCDEF"
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	canon := b.String()
	if overlongUTF8(canon) {
		return "", fmt.Errorf("%w: an overlong UTF-8 escape, which some servers read as the ASCII byte it spells (%%C0%%AE as \".\")", ErrAmbiguousPath)
	}
	for _, seg := range strings.Split(canon[1:], "/")[:strings.Count(canon, "/")-1] {
		if seg == "" {
			return "", fmt.Errorf("%w: an empty segment (//), which servers fold differently", ErrAmbiguousPath)
		}
	}
	for _, seg := range strings.Split(canon[1:], "/") {
		name, _, _ := strings.Cut(seg, ";")
		if name == "." || name == ".." {
			return "", fmt.Errorf("%w: a %q segment; send the path it stands for", ErrAmbiguousPath, name)
		}
	}
	if hasQuery {
		canon += "?" + query
	}
	return canon, nil
}

// overlongUTF8 reports whether the bytes a canonical path's escapes stand
// for hold an overlong UTF-8 form: a 2-byte lead C0 or C1, E0 followed by
// 80–9F, or F0 followed by 80–8F. UTF-8 has none; a lenient decoder (old
// IIS, some Java servers) reads them as the shorter character they spell,
// "." or "/" among them.
func overlongUTF8(canon string) bool {
	var prev byte
	for i := 0; i+2 < len(canon); i++ {
		if canon[i] != '%' {
			prev = 0
			continue
		}
		v := unhex(canon[i+1])<<4 | unhex(canon[i+2])
		if v == 0xC0 || v == 0xC1 || prev == 0xE0 && v < 0xA0 || prev == 0xF0 && v < 0x90 {
			return true
		}
		prev = v
		i += 2
	}
	return false
}

func cutHTTPScheme(target string) (string, bool) {
	for _, s := range []string{"http://", "https://"} {
		if len(target) >= len(s) && strings.EqualFold(target[:len(s)], s) {
			return target[len(s):], true
		}
	}
	return "", false
}

// isPathChar reports a byte RFC 3986 allows unescaped in a path segment
// or as its separator: unreserved, sub-delims, ":", "@" and "/".
func isPathChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,;=:@/", c) >= 0
}
