package main

import (
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/visible"
)

// stdout and stderr carry everything the CLI prints of the API's answers.
// Fields a sandbox member controls (URLs, hosts, sources, reasons) are
// escaped where they are formatted (visible.String); these writers are the
// last line of defence, so that no terminal escape, separator or bidi
// control reaches the operator's terminal from anywhere (design §8,
// invariant 16). Lines and tab stops are the CLI's own layout. A member's
// own output (airlock run, airlock docker run) is the operator's program's
// output and is not filtered.
var (
	stdout io.Writer = terminalWriter{os.Stdout}
	stderr io.Writer = terminalWriter{os.Stderr}
	// jsonOut takes --json output, which visible.JSON has made safe.
	jsonOut io.Writer = os.Stdout
	// rawOut takes bytes that are no text (an archive), never for a
	// terminal (isTerminal).
	rawOut io.Writer = os.Stdout
)

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

type terminalWriter struct{ w io.Writer }

func (t terminalWriter) Write(p []byte) (int, error) {
	out := make([]byte, 0, len(p))
	start := 0
	for i, c := range p {
		if c == '\n' || c == '\t' {
			out = append(out, visible.Terminal(string(p[start:i]))...)
			out = append(out, c)
			start = i + 1
		}
	}
	out = append(out, visible.Terminal(string(p[start:]))...)
	if _, err := t.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// v escapes a field a sandbox member controls for a terminal.
func v(s string) string { return visible.String(s) }
