package visible

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "https://api.example.com/v1/x?q=1", "https://api.example.com/v1/x?q=1"},
		{"non-ASCII letters stay", "bücher.example/日本語/😀", "bücher.example/日本語/😀"},
		{"combining mark stays", "e\u0301", "e\u0301"},
		{"clear screen", "\x1b[2J\x1b[Hhost", `\x1b[2J\x1b[Hhost`},
		{"OSC 52 clipboard write", "\x1b]52;c;ZXZpbA==\a", `\x1b]52;c;ZXZpbA==\x07`},
		{"C1 CSI", "\u009b31mred", `\u{9b}31mred`},
		{"NUL, CR, LF, tab", "a\x00b\rc\nd\te", `a\x00b\x0dc\x0ad\x09e`},
		{"DEL", "a\x7f", `a\x7f`},
		{"line separators as padding", "http://real.test/" + strings.Repeat("\u2028", 3) + "http://decoy.test/", `http://real.test/\u{2028}\u{2028}\u{2028}http://decoy.test/`},
		{"paragraph separator", "a\u2029b", `a\u{2029}b`},
		{"right-to-left override", "evil\u202egpj.exe", `evil\u{202e}gpj.exe`},
		{"isolates", "\u2066a\u2069", `\u{2066}a\u{2069}`},
		{"arabic letter mark", "a\u061cb", `a\u{61c}b`},
		{"zero-width joiner and space", "a\u200db\u200bc", `a\u{200d}b\u{200b}c`},
		{"byte order mark", "\ufeffhost", `\u{feff}host`},
		{"soft hyphen", "ex\u00adample", `ex\u{ad}ample`},
		{"no-break and ideographic spaces", "a\u00a0b\u3000c", `a\u{a0}b\u{3000}c`},
		{"hangul filler", "a\u3164b", `a\u{3164}b`},
		{"variation selector", "a\ufe0fb", `a\u{fe0f}b`},
		{"tag characters", "a\U000e0041b", `a\u{e0041}b`},
		{"private use", "a\ue000b", `a\u{e000}b`},
		{"backslash cannot forge an escape", `a\u{2028}b`, `a\\u{2028}b`},
		{"invalid UTF-8", "a\xffb\xc3", `a\xffb\xc3`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := String(tc.in); got != tc.want {
				t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestJSON(t *testing.T) {
	in := map[string]string{"url": "http://real.test/\u2028\u202e\u009b\x1b[2J\ufeff\U000e0041\xff"}
	b, _ := json.Marshal(in)
	out := JSON(b)
	for i := 0; i < len(out); {
		r, n := utf8.DecodeRune(out[i:])
		if r < 0x20 || r >= 0x80 && Unsafe(r) || r == utf8.RuneError && n <= 1 {
			t.Fatalf("raw %U left at %d in %s", r, i, out)
		}
		i += n
	}
	var back map[string]string
	if err := json.Unmarshal(out, &back); err != nil || back["url"] != strings.ToValidUTF8(in["url"], "\ufffd") {
		t.Errorf("JSON(%s) = %s reads back as %q, %v", b, out, back["url"], err)
	}
}

func FuzzString(f *testing.F) {
	for _, s := range []string{"a", "\x1b[2J", "\u2028", "\\", "\xff", "bücher"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := String(s)
		if !utf8.ValidString(got) {
			t.Fatalf("String(%q) = %q is not valid UTF-8", s, got)
		}
		for _, r := range got {
			if Unsafe(r) {
				t.Fatalf("String(%q) = %q keeps %U", s, got, r)
			}
		}
		if strings.ContainsAny(got, "\x1b\u009b\u2028\u2029\u202e") {
			t.Fatalf("String(%q) = %q", s, got)
		}
	})
}
