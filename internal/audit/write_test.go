package audit

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The journal's writes are raw while they return at once; one that waited
// longer than slowWrite sends the writes after it through the scheduler
// for slowPause; every byte arrives either way, in order.
func TestFileWriterFallsBackAfterASlowWrite(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	w := newFileWriter()
	w.use(pw)

	if n, err := w.write([]byte("quick\n")); n != 6 || err != nil {
		t.Fatalf("write = %d, %v", n, err)
	}
	// A full pipe (64 KiB): the next write waits until the reader drains
	// it.
	filler := make([]byte, 64<<10-6)
	pw.Write(filler)
	done := make(chan error, 1)
	go func() {
		_, err := w.write([]byte("waited\n"))
		done <- err
	}()
	time.Sleep(5 * slowWrite)
	want := "quick\n" + string(filler) + "waited\n" + "after\n"
	got := make(chan string, 1)
	go func() {
		b := make([]byte, len(want))
		io.ReadFull(pr, b)
		got <- string(b)
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if w.raw != 2 || w.slow != 0 {
		t.Fatalf("%d raw and %d ordinary writes, want 2 and 0", w.raw, w.slow)
	}
	if !w.slowUntil.After(time.Now().Add(slowPause / 2)) {
		t.Fatalf("after a write that waited, raw writes are off until %v", w.slowUntil)
	}
	if _, err := w.write([]byte("after\n")); err != nil {
		t.Fatal(err)
	}
	if w.slow != 1 {
		t.Errorf("the write after a slow one was raw")
	}
	if s := <-got; s != want {
		t.Errorf("the pipe carried %d bytes, not what was written", len(s))
	}
	w.slowUntil = time.Now()
	w.write([]byte("again\n"))
	if w.raw != 3 {
		t.Errorf("raw writes did not resume after the pause")
	}
}

// A write the file refuses returns its error, naming the file.
func TestFileWriterReportsErrors(t *testing.T) {
	name := filepath.Join(t.TempDir(), "f")
	os.WriteFile(name, nil, 0o600)
	ro, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	w := newFileWriter()
	w.use(ro)
	_, err = w.write([]byte("x"))
	var pe *os.PathError
	if err == nil || !errors.As(err, &pe) || pe.Path != name {
		t.Errorf("write to a read-only file: %v", err)
	}
}
