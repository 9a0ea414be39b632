package netns

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

type emitted struct {
	Line    string
	Partial bool
}

func TestLineWriter(t *testing.T) {
	tests := []struct {
		name   string
		max    int
		writes []string
		want   []emitted
	}{
		{name: "lines", max: 16, writes: []string{"one\ntwo\n"}, want: []emitted{{"one", false}, {"two", false}}},
		{name: "split across writes", max: 16, writes: []string{"on", "e\ntw", "o", "\n"}, want: []emitted{{"one", false}, {"two", false}}},
		{name: "empty lines", max: 16, writes: []string{"\n\nx\n"}, want: []emitted{{"", false}, {"", false}, {"x", false}}},
		{name: "last line without a break", max: 16, writes: []string{"a\nb"}, want: []emitted{{"a", false}, {"b", false}}},
		{name: "long line in pieces", max: 4, writes: []string{"abcdefghij\nk\n"}, want: []emitted{{"abcd", true}, {"efgh", true}, {"ij", false}, {"k", false}}},
		{name: "exactly max", max: 4, writes: []string{"abcd\n"}, want: []emitted{{"abcd", false}}},
		{name: "long line over writes", max: 4, writes: []string{"abc", "def", "ghi"}, want: []emitted{{"abcd", true}, {"efgh", true}, {"i", false}}},
		// "é" is two bytes, "€" three: a piece never ends inside one.
		{name: "cut at a character", max: 5, writes: []string{"aaaa€bb\n"}, want: []emitted{{"aaaa", true}, {"€bb", false}}},
		{name: "cut at a character, two-byte", max: 4, writes: []string{"abcéé\n"}, want: []emitted{{"abc", true}, {"éé", false}}},
		{name: "carriage returns stay", max: 16, writes: []string{"a\r\nb\rc\n"}, want: []emitted{{"a\r", false}, {"b\rc", false}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []emitted
			w := &LineWriter{Max: tt.max, Emit: func(l []byte, partial bool) error {
				if len(l) > tt.max {
					t.Errorf("emitted %d bytes, more than Max %d", len(l), tt.max)
				}
				if !utf8.Valid(l) {
					t.Errorf("emitted %q: a character was cut", l)
				}
				got = append(got, emitted{string(l), partial})
				return nil
			}}
			for _, s := range tt.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", s, n, err)
				}
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("lines (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLineWriterStopsOnEmitError(t *testing.T) {
	gone := errors.New("client gone")
	calls := 0
	w := &LineWriter{Max: 8, Emit: func([]byte, bool) error { calls++; return gone }}
	if _, err := w.Write([]byte(strings.Repeat("line\n", 10))); !errors.Is(err, gone) {
		t.Errorf("Write = %v, want the Emit error", err)
	}
	if calls != 1 {
		t.Errorf("Emit called %d times after it failed", calls)
	}
}
