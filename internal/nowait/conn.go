package nowait

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Conn is a TCP connection whose Read and Write are raw calls on its
// non-blocking socket. When one would block, the runtime's poller waits
// for the socket, as it does for a net.TCPConn, and deadlines and Close
// end the wait as they do there; errors are the ones net.TCPConn returns
// (a *net.OpError). Every other method is the net.TCPConn's, and like its
// Read and Write these may be called from several goroutines at once.
//
// An intercepted connection makes a read and a write on each side per
// request: made through net.TCPConn, each would wake sysmon again after
// every idle moment (see the package comment).
type Conn struct {
	*net.TCPConn
	rc   syscall.RawConn
	r, w call
}

// call is one direction's call in flight: its buffer, its result and the
// function the RawConn runs, made once so that a call allocates nothing.
type call struct {
	mu sync.Mutex
	b  []byte
	n  int
	e  syscall.Errno
	f  func(fd uintptr) bool
}

// maxRW is what one call reads or writes at most, as in internal/poll.
const maxRW = 1 << 30

// NewConn wraps c.
func NewConn(c *net.TCPConn) (*Conn, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	k := &Conn{TCPConn: c, rc: rc}
	k.r.f = func(fd uintptr) bool {
		for {
			b := k.r.b
			r, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
			switch e {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return false
			case 0:
				k.r.n = int(r)
			}
			k.r.e = e
			return true
		}
	}
	k.w.f = func(fd uintptr) bool {
		n, err := Write(int(fd), k.w.b[k.w.n:])
		k.w.n += n
		if err == unix.EAGAIN {
			return false
		}
		if e, ok := err.(syscall.Errno); ok {
			k.w.e = e
		} else if err != nil {
			k.w.e = unix.EIO // a write of 0 bytes: never on a socket
		}
		return true
	}
	return k, nil
}

// Read reads into b, waiting until the socket has something, its end or an
// error.
func (k *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if len(b) > maxRW {
		b = b[:maxRW]
	}
	k.r.mu.Lock()
	k.r.b, k.r.n, k.r.e = b, 0, 0
	err := k.rc.Read(k.r.f)
	n, e := k.r.n, k.r.e
	k.r.b = nil
	k.r.mu.Unlock()
	raceWrite(b, n)
	switch {
	case err != nil:
		return 0, k.opError("read", err)
	case e != 0:
		return 0, k.opError("read", os.NewSyscallError("read", e))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of b, waiting while the socket's buffer is full.
func (k *Conn) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	raceRead(b)
	k.w.mu.Lock()
	k.w.b, k.w.n, k.w.e = b, 0, 0
	var err error
	for err == nil && k.w.n < len(b) && k.w.e == 0 {
		end := min(len(b), k.w.n+maxRW)
		k.w.b = b[:end]
		err = k.rc.Write(k.w.f)
	}
	n, e := k.w.n, k.w.e
	k.w.b = nil
	k.w.mu.Unlock()
	switch {
	case err != nil:
		return n, k.opError("write", err)
	case e != 0:
		return n, k.opError("write", os.NewSyscallError("write", e))
	}
	return n, nil
}

// opError is err as net.TCPConn's Read or Write returns it: the RawConn
// names its operations "raw-read" and "raw-write".
func (k *Conn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		oe.Op = op
		return oe
	}
	return &net.OpError{Op: op, Net: "tcp", Source: k.LocalAddr(), Addr: k.RemoteAddr(), Err: err}
}
