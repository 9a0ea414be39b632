package netns

// TailWriter keeps the last Max bytes written to it: a member's output,
// however much it writes, in bounded memory.
type TailWriter struct {
	Max int
	b   []byte
}

func (w *TailWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	if len(w.b) > 2*w.Max {
		w.b = append(w.b[:0], w.b[len(w.b)-w.Max:]...)
	}
	return len(p), nil
}

// Bytes returns the last Max bytes written.
func (w *TailWriter) Bytes() []byte {
	if len(w.b) > w.Max {
		return w.b[len(w.b)-w.Max:]
	}
	return w.b
}
