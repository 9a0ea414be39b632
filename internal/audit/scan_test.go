package audit

import (
	"bytes"
	"io"
	"math/rand"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"
)

// refLines is what scanLines should report: every non-empty line (split
// on '\n', the '\n' dropped, a last line without one included) of at
// most maxLine bytes.
func refLines(b []byte) []string {
	var out []string
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		var line []byte
		if i < 0 {
			line, b = b, nil
		} else {
			line, b = b[:i], b[i+1:]
		}
		if len(line) > 0 && len(line) <= maxLine {
			out = append(out, string(line))
		}
	}
	return out
}

func gotLines(r io.Reader) []string {
	var out []string
	scanLines(r, func(l []byte) bool { out = append(out, string(l)); return true })
	return out
}

type chunkReader struct {
	b   []byte
	rnd *rand.Rand
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(c.b), 1+c.rnd.Intn(100<<10))
	copy(p, c.b[:n])
	c.b = c.b[n:]
	return n, nil
}

func sameLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d lines, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: line %d: %d bytes, want %d", what, i, len(got[i]), len(want[i]))
		}
	}
}

// TestScanLinesBoundaries: lines around the 64 KiB buffer and
// maxLine, with and without a last '\n', CRLF, read in any chunks.
func TestScanLinesBoundaries(t *testing.T) {
	const B = 64 << 10
	lens := []int{0, 1, B - 2, B - 1, B, B + 1, 2*B - 1, 2 * B, 2*B + 1, maxLine - 1, maxLine, maxLine + 1, maxLine + B, 2*maxLine + 3}
	rnd := rand.New(rand.NewSource(1))
	for _, n := range lens {
		for _, tail := range []string{"\n", "", "\r\n"} {
			var b []byte
			b = append(b, "a\n"...)
			b = append(b, bytes.Repeat([]byte{'x'}, n)...)
			b = append(b, tail...)
			if tail != "" {
				b = append(b, "z"...)
			}
			want := refLines(b)
			sameLines(t, "whole", gotLines(bytes.NewReader(b)), want)
			sameLines(t, "chunks", gotLines(&chunkReader{b: b, rnd: rnd}), want)
			if n < 3*B {
				sameLines(t, "half", gotLines(iotest.HalfReader(bytes.NewReader(b))), want)
				sameLines(t, "data+EOF", gotLines(iotest.DataErrReader(bytes.NewReader(b))), want)
			}
		}
	}
	// Several long lines in a row, the long buffer reused.
	var b []byte
	for _, n := range []int{maxLine + 1, 3 * B, 5, maxLine, 2*B + 7, maxLine + 2, 1} {
		b = append(b, bytes.Repeat([]byte{byte('a' + n%26)}, n)...)
		b = append(b, '\n')
	}
	sameLines(t, "mixed", gotLines(&chunkReader{b: b, rnd: rnd}), refLines(b))
}

func FuzzScanLines(f *testing.F) {
	f.Add([]byte("a\nb\r\n\nc"))
	f.Fuzz(func(t *testing.T, b []byte) {
		sameLines(t, "fuzz", gotLines(iotest.HalfReader(bytes.NewReader(b))), refLines(b))
	})
}

func FuzzCut(f *testing.F) {
	f.Add("héllo wörld", 5)
	f.Add(strings.Repeat("€", 10), 4)
	f.Fuzz(func(t *testing.T, s string, max int) {
		if max < 4 || max > 1<<16 {
			return
		}
		got := cut(s, max)
		if len(s) <= max {
			if got != s {
				t.Fatal("changed a short string")
			}
			return
		}
		kept, _, ok := strings.Cut(got, "…[cut: ")
		if !ok || !strings.HasPrefix(s, kept) || len(kept) > max || len(kept) < max-utf8.UTFMax {
			t.Fatalf("cut(%q, %d) = %q", s, max, got)
		}
		if utf8.ValidString(s) && !utf8.ValidString(kept) {
			t.Fatalf("cut split a character: %q", kept)
		}
	})
}

// TestJournalBoundsRecordsReadBack: records read back from the files (at
// Open, into memory; by Query) are bounded like those added now. A file
// written before records were bounded holds lines of up to maxLine; Open
// keeps Memory (10,000) of them in memory, Query up to Limit.
func TestJournalBoundsRecordsReadBack(t *testing.T) {
	dir := t.TempDir()
	var file []byte
	for i := range 3 {
		e := Entry{Seq: uint64(i + 1), Kind: KindRequest, Sandbox: "sb", Host: "x.example",
			URL:     "https://x.example/" + strings.Repeat("a", 1<<20),
			Headers: map[string][]string{"X-Big": {strings.Repeat("v", 1<<20)}}}
		file = appendEntry(file, &e)
		file = append(file, '\n')
	}
	j := openHistory(t, dir, file)
	for _, e := range j.Query(Filter{}) {
		if len(e.URL) > maxURL+64 || len(e.Headers["X-Big"]) > 0 && len(e.Headers["X-Big"][0]) > maxText+64 {
			t.Fatalf("record %d read back unbounded: URL %d bytes, X-Big %d bytes", e.Seq, len(e.URL), len(e.Headers["X-Big"][0]))
		}
	}
}

// TestJournalCutMarkerIsNotAMembers: the header that says what airlock cut
// is one a member can send itself; a record that was not cut must not
// carry it (or it must be told apart from the member's).
func TestJournalCutMarkerIsNotAMembers(t *testing.T) {
	h := map[string][]string{cutHeader: {"40 header values left out of 99999 bytes of headers"}, "Accept": {"*/*"}}
	got := boundHeaders(h)
	if v, ok := got[cutHeader]; ok {
		t.Errorf("a record nothing was cut from says %s: %q (sent by the member)", cutHeader, v)
	}
}
