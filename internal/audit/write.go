package audit

import (
	"os"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/nowait"
)

// A fileWriter writes the journal's records to its current file with raw
// write(2) calls (package nowait), which the Go scheduler does no
// bookkeeping for. Every intercepted request, connection and DNS answer is
// recorded before it goes on, so the journal writes once per request: an
// ordinary call there is what kept the runtime's monitor thread (sysmon)
// waking every 20 µs under load when every other call on the path was
// raw. In `make bench` that was about a tenth of airlockd's CPU per
// intercepted request.
//
// A raw call holds its processor until it returns. A write to the page
// cache returns at once unless the kernel throttles writers (the disk far
// behind, memory short); a write that took longer than slowWrite turns
// raw writes off for slowPause, and they go through the scheduler
// meanwhile, which hands the processor on while they wait.
type fileWriter struct {
	f         *os.File
	rc        syscall.RawConn
	b         []byte
	n         int
	err       error
	do        func(fd uintptr) bool // writes b, made once
	slowUntil time.Time
	raw, slow uint64 // writes made each way, for tests
}

const (
	slowWrite = time.Millisecond
	slowPause = time.Second
)

func newFileWriter() *fileWriter {
	w := &fileWriter{}
	w.do = func(fd uintptr) bool {
		n, err := nowait.Write(int(fd), w.b[w.n:])
		w.n += n
		if err == syscall.EAGAIN {
			return false // a descriptor the poller waits on (a test's pipe)
		}
		w.err = err
		return true
	}
	return w
}

// use makes f the file written, keeping what the writer learnt of the
// disk's speed.
func (w *fileWriter) use(f *os.File) {
	w.f, w.rc = f, nil
	if rc, err := f.SyscallConn(); err == nil {
		w.rc = rc
	}
}

// write writes all of b. One write is in flight at a time (the journal's
// writing flag).
func (w *fileWriter) write(b []byte) (int, error) {
	start := time.Now()
	if w.rc == nil || start.Before(w.slowUntil) {
		w.slow++
		return w.f.Write(b)
	}
	w.raw++
	w.b, w.n, w.err = b, 0, nil
	err := w.rc.Write(w.do)
	n := w.n
	if err == nil && w.err != nil {
		err = &os.PathError{Op: "write", Path: w.f.Name(), Err: w.err}
	}
	w.b, w.err = nil, nil
	if took := time.Since(start); took > slowWrite {
		w.slowUntil = start.Add(took + slowPause)
	}
	return n, err
}
