package netns

import (
	"bytes"
	"unicode/utf8"
)

// LineWriter cuts what is written to it into lines for Emit, without the
// line break: a member's output, however long its lines, in bounded
// memory. A line longer than Max bytes is emitted in pieces of at most Max
// bytes, cut where a UTF-8 character starts, each but the last with
// partial set. An error from Emit is returned by Write.
type LineWriter struct {
	Max  int // bytes; at least utf8.UTFMax
	Emit func(line []byte, partial bool) error
	buf  []byte
}

func (w *LineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.buf = append(w.buf, p...)
			p = nil
		} else {
			w.buf = append(w.buf, p[:i]...)
			p = p[i+1:]
		}
		for len(w.buf) > w.Max {
			cut := w.Max
			for cut > w.Max-utf8.UTFMax && !utf8.RuneStart(w.buf[cut]) {
				cut--
			}
			if err := w.Emit(w.buf[:cut], true); err != nil {
				return 0, err
			}
			w.buf = append(w.buf[:0], w.buf[cut:]...)
		}
		if i >= 0 {
			err := w.Emit(w.buf, false)
			w.buf = w.buf[:0]
			if err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

// Flush emits what follows the last line break, if anything: the last
// line of an output that does not end with one.
func (w *LineWriter) Flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.Emit(w.buf, false)
	w.buf = w.buf[:0]
	return err
}
