package tproxy

import (
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// h2HoldMax bounds how long h2Conn holds a response's HEADERS frame back
// waiting for the write that follows it (a variable for tests).
var h2HoldMax = time.Millisecond

// h2Conn is an intercepted client connection as Go's HTTP/2 server sees
// it. The server writes a response's HEADERS frame, waits until it is
// written, and only then hands over the DATA frame, so a small answer
// leaves in two writes: two TLS records, two system calls and two wakeups
// of the client. h2Conn holds back a write that ends with a HEADERS frame
// that neither ends its stream nor is followed by CONTINUATION, and sends
// it with the next write, or on its own after h2HoldMax, whichever comes
// first. Bytes are never reordered or changed: a hold only delays them.
type h2Conn struct {
	net.Conn
	timer  *time.Timer
	closed atomic.Bool // no hold begins once Close has begun

	mu   sync.Mutex // guards the following fields, and writes to Conn
	held *[]byte    // from h2Buffers, while bytes are held
	// frame is where the bytes written so far end: within a frame's
	// header or its payload.
	frame struct {
		head [h2FrameHeaderLen]byte
		n    int  // bytes of head read
		left int  // payload bytes still to come
		open bool // the frame is a response's HEADERS without END_STREAM
	}
	err error // of a write that failed: every later one fails with it
}

// h2TLSConn is an h2Conn over TLS: the server reads the TLS state from it
// (it refuses TLS below 1.2 and weak ciphers, and fills in each request's
// TLS field).
type h2TLSConn struct {
	*h2Conn
	tc *tls.Conn
}

func (c h2TLSConn) ConnectionState() tls.ConnectionState { return c.tc.ConnectionState() }

// newH2Conn wraps c for Go's HTTP/2 server; the result has c's TLS state
// when c is a *tls.Conn.
func newH2Conn(c net.Conn) net.Conn {
	h := &h2Conn{Conn: c}
	h.timer = time.AfterFunc(time.Hour, h.release)
	h.timer.Stop()
	if tc, ok := c.(*tls.Conn); ok {
		return h2TLSConn{h, tc}
	}
	return h
}

// Write writes p, with the bytes held back before it, or holds p back if
// it ends with a response's HEADERS frame and nothing is held yet.
//
// Held bytes never share a write with an RST_STREAM frame: they go on
// their own first. The server resets a stream with NO_ERROR right after
// a response whose request body it did not read (RFC 9113, section 8.1),
// in the same write as the response's last DATA frame. Joined to the held
// HEADERS, the whole response and the reset would reach the client in one
// TLS record, and a client that has not sent its body yet can take the
// stream as closed before it does: curl 7.88 then fails the upload with
// "Stream error in the HTTP/2 framing layer" instead of showing the
// response. Written apart, the HEADERS come first, as without the hold.
func (c *h2Conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	open, reset := c.scan(p)
	if c.held != nil {
		c.timer.Stop()
		joined := !reset
		if joined {
			*c.held = append(*c.held, p...)
		}
		if err := c.sendHeld(); err != nil {
			return 0, err
		}
		if joined {
			return len(p), nil
		}
	}
	if !open || len(p) > h2HoldBytes || c.closed.Load() {
		n, err := c.Conn.Write(p)
		if err != nil {
			c.err = err
		}
		return n, err
	}
	c.held = h2Buffers.Get().(*[]byte)
	*c.held = append((*c.held)[:0], p...)
	c.timer.Reset(h2HoldMax)
	return len(p), nil
}

// release sends what is held, when no write came to take it along.
func (c *h2Conn) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held != nil {
		c.sendHeld()
	}
}

// sendHeld writes the held bytes, unless a write has failed, gives their
// buffer back and returns the connection's error.
func (c *h2Conn) sendHeld() error {
	if c.err == nil {
		if _, err := c.Conn.Write(*c.held); err != nil {
			c.err = err
		}
	}
	c.dropHeld()
	return c.err
}

// h2HoldBytes is the most a hold keeps: a response's header block, and
// maybe a few small frames before it. A connection holds a buffer only
// while it holds bytes, so an idle one keeps none.
const h2HoldBytes = 4 << 10

var h2Buffers = sync.Pool{New: func() any { b := make([]byte, 0, 2*h2HoldBytes); return &b }}

// dropHeld gives the held bytes' buffer back. One grown far past what a
// hold and the write that joins it need is left to the collector.
func (c *h2Conn) dropHeld() {
	if cap(*c.held) <= 64<<10 {
		h2Buffers.Put(c.held)
	}
	c.held = nil
}

// Close closes the connection. What is held goes first if no write is
// under way (one blocked on a client that does not read must not keep
// the connection open).
func (c *h2Conn) Close() error {
	c.closed.Store(true)
	c.timer.Stop()
	if c.mu.TryLock() {
		if c.held != nil {
			if c.err == nil {
				c.Conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				c.Conn.Write(*c.held)
			}
			c.dropHeld()
		}
		c.mu.Unlock()
	}
	return c.Conn.Close()
}

// HTTP/2 frame types and flags h2Conn reads (RFC 9113, section 6).
const (
	h2FrameHeaders   = 0x1
	h2FrameRSTStream = 0x3
	h2FlagEndStream  = 0x1
	h2FlagEndHeaders = 0x4
	h2FrameHeaderLen = 9
)

// scan follows the frames in p, the next bytes the server writes. open
// reports whether p ends exactly with a whole HEADERS frame that has
// END_HEADERS and not END_STREAM: a response's header block whose body or
// trailers come in a later write. reset reports whether an RST_STREAM
// frame begins in p, or p ends within a frame header, whose type is then
// not known yet.
func (c *h2Conn) scan(p []byte) (open, reset bool) {
	f := &c.frame
	for len(p) > 0 {
		if f.left > 0 {
			k := min(f.left, len(p))
			f.left -= k
			p = p[k:]
			open = f.left == 0 && f.open
			continue
		}
		k := copy(f.head[f.n:], p)
		f.n += k
		p = p[k:]
		if f.n < h2FrameHeaderLen {
			return false, true
		}
		f.n = 0
		f.left = int(f.head[0])<<16 | int(f.head[1])<<8 | int(f.head[2])
		f.open = f.head[3] == h2FrameHeaders && f.head[4]&(h2FlagEndStream|h2FlagEndHeaders) == h2FlagEndHeaders
		reset = reset || f.head[3] == h2FrameRSTStream
		open = f.left == 0 && f.open
	}
	return open, reset
}
