package netns

import (
	"bytes"
	"strings"
	"testing"
)

func TestTailWriter(t *testing.T) {
	w := &TailWriter{Max: 10}
	var all bytes.Buffer
	for i := range 50 {
		chunk := strings.Repeat(string(rune('a'+i%26)), i%7+1)
		w.Write([]byte(chunk))
		all.WriteString(chunk)
	}
	want := all.Bytes()[all.Len()-10:]
	if !bytes.Equal(w.Bytes(), want) {
		t.Errorf("kept %q, want %q", w.Bytes(), want)
	}
}
