package nowait

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
)

// pair is a connected pair whose first end is a Conn.
func pair(t *testing.T) (*Conn, *net.TCPConn) {
	t.Helper()
	a, b := testenv.TCPPair(t)
	k, err := NewConn(a)
	if err != nil {
		t.Fatal(err)
	}
	return k, b
}

// A write larger than both sockets' buffers is taken in parts, waiting for
// the reader between them, and arrives whole and in order both ways.
func TestConnMovesBytesBothWays(t *testing.T) {
	k, b := pair(t)
	k.SetWriteBuffer(16 << 10)
	b.SetReadBuffer(16 << 10)
	want := make([]byte, 8<<20)
	rand.Read(want)
	for _, dir := range []struct {
		name string
		w    io.Writer
		r    io.Reader
	}{{"Conn to TCPConn", k, b}, {"TCPConn to Conn", b, k}} {
		errc := make(chan error, 1)
		go func() {
			n, err := dir.w.Write(want)
			if err == nil && n != len(want) {
				err = io.ErrShortWrite
			}
			errc <- err
		}()
		got := make([]byte, len(want))
		if _, err := io.ReadFull(dir.r, got); err != nil {
			t.Fatalf("%s: read: %v", dir.name, err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("%s: write: %v", dir.name, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: the bytes read are not the bytes written", dir.name)
		}
	}
}

// Reads, writes and their errors are net.TCPConn's: the end of the stream
// is io.EOF, a deadline is a timeout, a closed connection net.ErrClosed and
// a reset ECONNRESET, each a *net.OpError naming the operation as
// net.TCPConn does.
func TestConnErrorsAreTCPConns(t *testing.T) {
	type wrap func(*net.TCPConn) net.Conn
	kinds := map[string]wrap{
		"net.TCPConn": func(c *net.TCPConn) net.Conn { return c },
		"nowait.Conn": func(c *net.TCPConn) net.Conn {
			k, err := NewConn(c)
			if err != nil {
				t.Fatal(err)
			}
			return k
		},
	}
	for name, w := range kinds {
		t.Run(name, func(t *testing.T) {
			a, b := testenv.TCPPair(t)
			c := w(a)
			if n, err := c.Read(nil); n != 0 || err != nil {
				t.Errorf("empty read = %d, %v", n, err)
			}

			c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			_, err := c.Read(make([]byte, 8))
			var ne net.Error
			if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() || op(err) != "read" {
				t.Errorf("read past its deadline: %v (op %q)", err, op(err))
			}
			c.SetReadDeadline(time.Time{})

			b.Write([]byte("hi"))
			buf := make([]byte, 8)
			if n, err := c.Read(buf); err != nil || string(buf[:n]) != "hi" {
				t.Errorf("read = %q, %v", buf[:n], err)
			}
			b.CloseWrite()
			if n, err := c.Read(buf); n != 0 || err != io.EOF {
				t.Errorf("read at the end = %d, %v; want 0, EOF", n, err)
			}

			// The peer goes with data unread: the next write is refused,
			// then reset.
			b.SetLinger(0)
			b.Close()
			var werr error
			testenv.WaitFor(t, 5*time.Second, "a write to a reset connection fails", func() bool {
				_, werr = c.Write([]byte("x"))
				return werr != nil
			})
			if !errors.Is(werr, syscall.ECONNRESET) && !errors.Is(werr, syscall.EPIPE) || op(werr) != "write" {
				t.Errorf("write to a reset connection: %v (op %q)", werr, op(werr))
			}

			c.Close()
			if _, err := c.Read(buf); !errors.Is(err, net.ErrClosed) || op(err) != "read" {
				t.Errorf("read after Close: %v", err)
			}
			if _, err := c.Write(buf); !errors.Is(err, net.ErrClosed) || op(err) != "write" {
				t.Errorf("write after Close: %v", err)
			}
		})
	}
}

func op(err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Op
	}
	return ""
}

// A read waiting on an idle connection ends when another goroutine closes
// the connection, and writes go on meanwhile.
func TestConnCloseEndsAWaitingRead(t *testing.T) {
	k, b := pair(t)
	errc := make(chan error, 1)
	go func() {
		_, err := k.Read(make([]byte, 8))
		errc <- err
	}()
	if _, err := k.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("peer read %q, %v", buf, err)
	}
	select {
	case err := <-errc:
		t.Fatalf("the read returned before Close: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	k.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("waiting read after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the waiting read")
	}
}

// Reads and writes that need not wait allocate nothing.
func TestConnAllocatesNothing(t *testing.T) {
	k, b := pair(t)
	msg, buf := []byte("0123456789"), make([]byte, 10)
	if n := testing.AllocsPerRun(200, func() {
		if _, err := k.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(b, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(k, buf); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("a write and a read on a Conn allocate %v times; want 0", n)
	}
}
