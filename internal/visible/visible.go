// Package visible shows text a sandbox member controls (host names, URLs,
// headers, reasons that quote them) so that a person reads exactly what is
// there: every character that could hide, reorder or rewrite what is around
// it (controls, terminal escapes, line and paragraph separators, bidi
// controls, zero-width and other invisible characters, invalid UTF-8)
// becomes a visible escape (design §8, invariant 16).
package visible

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// String returns s with every unsafe character escaped: bytes of invalid
// UTF-8 as \xNN, ASCII controls as \xNN (\t and \n too), other unsafe runes
// as \u{XXXX}, and a backslash as \\ so that the escaping cannot be forged.
// Printable text, non-ASCII letters and symbols included, is left alone. A
// string that needs no escape is returned as it is, without allocating.
func String(s string) string { return escape(s, true) }

// Terminal is String that leaves backslashes alone: the last line of
// defence of a terminal writer, over text whose member-controlled parts
// went through String already, where doubling their backslashes again
// would only blur them. Nothing unsafe gets through it either.
func Terminal(s string) string { return escape(s, false) }

func escape(s string, backslash bool) string {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == '\\' && backslash || r == utf8.RuneError && n <= 1 || Unsafe(r) {
			break
		}
		i += n
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\' && backslash:
			b.WriteString(`\\`)
		case r < 0x80 && Unsafe(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case Unsafe(r):
			fmt.Fprintf(&b, `\u{%x}`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// Unsafe reports a rune that String escapes (the backslash aside): C0 and
// C1 controls and DEL; format characters (bidi controls, zero-width
// characters, the soft hyphen, tags: Unicode category Cf); line and
// paragraph separators and every space but the ASCII one (Zl, Zp, Zs);
// characters that draw as nothing (Hangul fillers, the combining grapheme
// joiner, variation selectors); private-use, surrogate, unassigned and
// noncharacter code points.
func Unsafe(r rune) bool {
	switch {
	case r == ' ':
		return false
	case r < 0x20, r == 0x7f, 0x80 <= r && r <= 0x9f:
		return true
	case r < 0x7f:
		return false
	}
	switch r {
	case 0x115f, 0x1160, 0x3164, 0xffa0, 0x034f, 0x180e, 0x2800, 0xfffc, 0xfffd:
		return true
	}
	switch {
	case 0xfe00 <= r && r <= 0xfe0f, 0xe0100 <= r && r <= 0xe01ef: // variation selectors
		return true
	case r&0xfffe == 0xfffe, 0xfdd0 <= r && r <= 0xfdef: // noncharacters
		return true
	}
	// Unassigned code points are not graphic.
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs, unicode.Zl, unicode.Zp, unicode.Zs) || !unicode.IsGraphic(r)
}

// JSON rewrites JSON text so that no unsafe rune is left raw in it: each
// becomes a \uXXXX escape (a surrogate pair beyond the BMP), which any JSON
// reader decodes to the same string. Go's encoder already escapes ASCII
// controls and U+2028/U+2029; this catches the rest (C1 controls, bidi and
// zero-width characters, …). Invalid UTF-8 becomes U+FFFD, as Go's encoder
// writes it.
func JSON(b []byte) []byte {
	clean := true
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r >= 0x80 && Unsafe(r) || r == utf8.RuneError && n <= 1 {
			clean = false
			break
		}
		i += n
	}
	if clean {
		return b
	}
	out := make([]byte, 0, len(b)+32)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			out = append(out, `\ufffd`...)
		case r >= 0x80 && Unsafe(r):
			if r > 0xffff {
				r -= 0x10000
				out = fmt.Appendf(out, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			} else {
				out = fmt.Appendf(out, `\u%04x`, r)
			}
		default:
			out = append(out, b[i:i+n]...)
		}
		i += n
	}
	return out
}
