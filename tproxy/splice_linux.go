package tproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/airlockhq/airlock/internal/nowait"
	"github.com/airlockhq/airlock/policy"
	"golang.org/x/sys/unix"
)

// maxSplice is how much one splice(2) call moves at most: a pipe's
// default size. Go's own splice path asks for pipes of 1 MiB and moves up
// to that at once; in BenchmarkProxy/download bursts of 1 MiB carried
// 5-10% less than bursts of 64 KiB, on one stream and on eight (while a
// burst is moved on, nothing more is taken from the sending socket), and
// a slow receiver holds at most 64 KiB of a connection in a pipe.
const maxSplice = 64 << 10

// pipePool lends pipes to splice(2) for a burst of data at a time, so that
// an idle connection holds none. (io.Copy between two TCP sockets keeps a
// pipe, two descriptors, per direction for the connection's whole life:
// six descriptors per idle spliced connection instead of two.) The zero
// value is unusable; see newPipePool.
type pipePool struct {
	free    chan *pipe
	copiers sync.Pool // of *copier
}

type pipe struct {
	r, w int
	n    int64 // bytes in the pipe not yet moved on
}

// newPipePool keeps up to n idle pipes.
func newPipePool(n int) *pipePool {
	pp := &pipePool{free: make(chan *pipe, n)}
	pp.copiers.New = func() any { return newCopier(pp) }
	return pp
}

func (pp *pipePool) get() (*pipe, error) {
	select {
	case p := <-pp.free:
		return p, nil
	default:
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, os.NewSyscallError("pipe2", err)
	}
	return &pipe{r: fds[0], w: fds[1]}, nil
}

// put keeps p for the next burst, unless it still holds data or the pool
// is full.
func (pp *pipePool) put(p *pipe) {
	if p.n == 0 {
		select {
		case pp.free <- p:
			return
		default:
		}
	}
	p.close()
}

// close closes the idle pipes. Pipes lent out are closed when they come
// back, or by whoever holds them.
func (pp *pipePool) close() {
	for {
		select {
		case p := <-pp.free:
			p.close()
		default:
			return
		}
	}
}

func (p *pipe) close() {
	unix.Close(p.r)
	unix.Close(p.w)
}

// copy moves src to dst with splice(2) until src's end, like io.Copy, and
// returns the bytes written to dst. Between bursts it waits for src
// without a pipe. Closing either connection ends it with an error.
func (pp *pipePool) copy(dst, src *net.TCPConn) (int64, error) {
	sc, err := src.SyscallConn()
	if err != nil {
		return 0, err
	}
	dc, err := dst.SyscallConn()
	if err != nil {
		return 0, err
	}
	return pp.copyRaw(dc, sc)
}

// copyRaw is copy on the sockets' raw connections. Each burst starts with
// a splice from src into a pipe taken from the pool; when src has nothing
// (EAGAIN) the pipe goes back before the runtime's poller waits for src,
// so a connection waiting for data holds no pipe, and no system call is
// spent on waiting but the one that finds src empty.
func (pp *pipePool) copyRaw(dc, sc syscall.RawConn) (int64, error) {
	cp := pp.copiers.Get().(*copier)
	defer pp.copiers.Put(cp)
	defer func() {
		if cp.p != nil {
			pp.put(cp.p) // closed instead when it still holds data
			cp.p = nil
		}
	}()
	var total int64
	for {
		if err := sc.Read(cp.fill); err != nil {
			return total, err
		}
		switch {
		case cp.err != nil && cp.p == nil:
			return total, cp.err // no pipe to be had
		case cp.err != nil:
			return total, os.NewSyscallError("splice", cp.err)
		case cp.n == 0:
			return total, nil // the end
		}
		cp.p.n += cp.n
		for cp.p.n > 0 {
			if err := dc.Write(cp.drain); err != nil {
				return total, err
			}
			if cp.err != nil {
				return total, os.NewSyscallError("splice", cp.err)
			}
			if cp.n == 0 {
				return total, io.ErrShortWrite
			}
			cp.p.n -= cp.n
			total += cp.n
		}
	}
}

// copier is the state of one copyRaw, with the functions it hands the
// runtime's poller made once: copiers are pooled, so a burst, and a
// connection, costs no allocation for them.
type copier struct {
	pp          *pipePool
	p           *pipe // the pipe of the burst, nil between bursts
	n           int64 // what the last splice moved
	err         error // and how it failed
	fill, drain func(fd uintptr) bool
}

func newCopier(pp *pipePool) *copier {
	cp := &copier{pp: pp}
	cp.fill = func(fd uintptr) bool {
		if cp.p == nil {
			if cp.p, cp.err = pp.get(); cp.err != nil {
				return true
			}
		}
		n, err := nowait.Splice(int(fd), cp.p.w, maxSplice)
		cp.n, cp.err = int64(n), err
		if cp.err == unix.EAGAIN {
			pp.put(cp.p) // empty: every burst is moved on whole
			cp.p = nil
			return false
		}
		return true
	}
	cp.drain = func(fd uintptr) bool {
		n, err := nowait.Splice(cp.p.r, int(fd), int(cp.p.n))
		cp.n, cp.err = int64(n), err
		return cp.err != unix.EAGAIN
	}
	return cp
}

// splice copies between the raw sockets with splice(2), after the bytes
// already peeked; nothing may wrap them.
// A client that was silent in the sniff window has its first bytes checked
// before anything of it reaches the upstream; the upstream may speak first
// meanwhile.
func (p *Proxy) splice(c *conn, up *net.TCPConn, name string, inspect bool) {
	defer up.Close()
	clientRC, err := c.client.SyscallConn()
	if err != nil {
		c.rec.Close = "client error: " + err.Error()
		return
	}
	upRC, err := up.SyscallConn()
	if err != nil {
		c.rec.Close = "upstream error: " + err.Error()
		return
	}
	var down int64
	var downErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		down, downErr = p.pipes.copyRaw(clientRC, upRC)
		nowait.CloseWrite(clientRC)
	}()
	if c.silent {
		if err := p.firstBytes(c, up, name, inspect); err != nil {
			c.rec.Verdict, c.rec.Reason, c.rec.Close = policy.Deny, err.Error(), "reset"
			c.client.SetLinger(0)
			c.client.Close()
			up.Close()
			<-done
			c.rec.Down = down
			return
		}
	}
	if len(c.peeked) > 0 {
		if _, err := up.Write(c.peeked); err != nil {
			c.rec.Close = "upstream write failed: " + err.Error()
			up.Close()
			<-done
			return
		}
		c.rec.Up = int64(len(c.peeked))
	}
	// Forwarded: a connection held open for hours keeps none of it.
	c.peeked, c.hello, c.head = nil, nil, nil
	n, upErr := p.pipes.copyRaw(upRC, clientRC)
	c.rec.Up += n
	if upErr != nil {
		// The client broke off: end the other direction too.
		up.Close()
	} else {
		nowait.CloseWrite(upRC)
	}
	<-done
	c.rec.Down = down
	switch {
	case upErr != nil:
		c.rec.Close = "client error: " + upErr.Error()
	case downErr != nil:
		c.rec.Close = "upstream error: " + downErr.Error()
	default:
		c.rec.Close = "closed"
	}
}

// firstBytes checks the first bytes of a client that was silent in the
// sniff window, before they go upstream: TLS or HTTP that starts late gets
// the same scrutiny as TLS or HTTP that starts at once. The client may stay
// silent while the upstream sends (a feed): only a connection idle both
// ways for IdleTimeout is cut, as the janitor cuts spliced ones.
func (p *Proxy) firstBytes(c *conn, up *net.TCPConn, name string, inspect bool) error {
	c.silent = false
	wait := p.cfg.IdleTimeout
	for {
		err := p.peek(c, wait, false)
		if errors.Is(err, errClientClosed) {
			// It ended its side with nothing to check: the end is
			// passed on, and the upstream may go on sending.
			return nil
		}
		if !errors.Is(err, errClientSilent) {
			if err != nil {
				return err
			}
			break
		}
		quiet := idle(up)
		if quiet >= p.cfg.IdleTimeout {
			return err
		}
		wait = p.cfg.IdleTimeout - quiet
	}
	switch {
	case !c.readable() && isWebPort(c.rec.Port):
		return fmt.Errorf("on port %d airlock carries only HTTP and TLS it can read, and these bytes are neither", c.rec.Port)
	case !c.readable():
		return nil // another protocol, carried as it is
	case c.head != nil, c.h2c:
		return errors.New("plain HTTP must start at once to be checked request by request; reconnect and send the request right away")
	case inspect:
		return errors.New("TLS that must be intercepted has to start at once; reconnect and send the ClientHello right away")
	}
	if err := p.checkECH(c); err != nil {
		return err
	}
	return c.fronting(name)
}
