// Package nowait makes system calls that cannot wait, on non-blocking
// descriptors, as raw calls: without the bookkeeping the Go scheduler does
// around a call that might block.
//
// That bookkeeping is not free, and most of its cost is not in the call.
// The first system call a Go program makes after a moment with nothing to
// do wakes the runtime's monitor thread (sysmon), which then wakes every
// 20 µs, to take the processor back from calls that block, until the
// program is idle again. A proxied connection goes idle at every round
// trip, and so does the DNS gate between bursts of queries: in a profile of
// the connection benchmark, sysmon's wakeups were a quarter of airlockd's
// CPU. The runtime's own poller makes its calls raw for the same reason.
//
// Only a call that returns at once may be made here: the descriptor must be
// non-blocking (the runtime's poller does the waiting, through a
// syscall.RawConn) and the call one that does no disk I/O. A write to a
// regular file is not one: it usually returns at once, but a frozen or
// throttled filesystem can hold it for seconds, and a raw call that waits
// stops the whole program at the next garbage collection, so the audit
// journal writes through the scheduler. A raw call holds
// its processor, and a stop of the world waits for it, until it returns: a
// splice that hands a full 1 MiB pipe to a socket over a veth runs the
// receiver's network stack too, and took up to a few milliseconds on a
// loaded 2-core machine, which a garbage collection's pauses can then take
// in the middle of a bulk transfer (about a millisecond more at the 99th
// percentile, measured). Other processors keep running meanwhile.
// Every function retries a call a signal interrupted (EINTR) and returns
// the call's errno as its error, so that callers compare it with
// unix.EAGAIN without allocating.
package nowait

import (
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Splice moves up to n bytes from in to out with splice(2), without
// waiting on a pipe (SPLICE_F_NONBLOCK) and moving pages where it can
// (SPLICE_F_MOVE).
func Splice(in, out, n int) (int, error) {
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_SPLICE, uintptr(in), 0, uintptr(out), 0, uintptr(n), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		if e != unix.EINTR {
			return result(r, e)
		}
	}
}

// Read reads into b from the non-blocking fd.
func Read(fd int, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	for {
		r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e != unix.EINTR {
			return result(r, e)
		}
	}
}

// Recvmmsg reads datagrams into msgs from the non-blocking socket fd and
// returns how many it read.
func Recvmmsg(fd uintptr, msgs []unix.Mmsghdr) (int, error) {
	return mmsg(unix.SYS_RECVMMSG, fd, msgs)
}

// Sendmmsg sends msgs on the non-blocking socket fd and returns how many
// it sent.
func Sendmmsg(fd uintptr, msgs []unix.Mmsghdr) (int, error) {
	return mmsg(unix.SYS_SENDMMSG, fd, msgs)
}

func mmsg(trap, fd uintptr, msgs []unix.Mmsghdr) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	for {
		r, _, e := unix.RawSyscall6(trap, fd, uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), 0, 0, 0)
		if e != unix.EINTR {
			return result(r, e)
		}
	}
}

// result is a system call's result r, or its errno e as the error. (Each
// call is written out where its arguments are made: a pointer turned into
// a uintptr is kept alive, and in place, only in the call expression of a
// syscall function itself.)
func result(r uintptr, e syscall.Errno) (int, error) {
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// CloseWrite shuts down the writing side of the socket rc (shutdown(2)
// with SHUT_WR: a TCP connection sends its FIN), like net.TCPConn's
// CloseWrite, and like it allocates nothing: the function handed to
// rc.Control, which escapes, is made once per pooled shutter, not per call.
func CloseWrite(rc syscall.RawConn) error {
	s := shutters.Get().(*shutter)
	err := rc.Control(s.f)
	e := s.e
	s.e = 0
	shutters.Put(s)
	if err != nil {
		return err
	}
	if e != 0 {
		return e
	}
	return nil
}

// A shutter holds the function CloseWrite hands rc.Control, and its errno.
type shutter struct {
	e syscall.Errno
	f func(fd uintptr)
}

var shutters = sync.Pool{New: func() any {
	s := new(shutter)
	s.f = func(fd uintptr) {
		for {
			_, _, e := unix.RawSyscall(unix.SYS_SHUTDOWN, fd, unix.SHUT_WR, 0)
			if e != unix.EINTR {
				s.e = e
				return
			}
		}
	}
	return s
}}
