//go:build race

package nowait

import (
	"runtime"
	"unsafe"
)

// The race detector does not see what a raw call reads or writes: tell it,
// as package syscall does for its own calls.

func raceWrite(b []byte, n int) {
	if n > 0 {
		runtime.RaceWriteRange(unsafe.Pointer(&b[0]), n)
		runtime.RaceAcquire(unsafe.Pointer(&ioSync))
	}
}

func raceRead(b []byte) {
	runtime.RaceReleaseMerge(unsafe.Pointer(&ioSync))
	runtime.RaceReadRange(unsafe.Pointer(&b[0]), len(b))
}

// ioSync stands for the kernel, through which a write happens before the
// read that returns its bytes.
var ioSync int64
