package nowait

import (
	"bytes"
	"io"
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/testenv"
)

// fd runs f on c's descriptor.
func fd(t *testing.T, c *net.TCPConn, f func(fd int)) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Control(func(d uintptr) { f(int(d)) }); err != nil {
		t.Fatal(err)
	}
}

func TestSpliceMovesBytesAndNeverWaits(t *testing.T) {
	a, b := testenv.TCPPair(t)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])

	// Nothing sent yet: the socket is empty and the call returns at once.
	fd(t, b, func(fd int) {
		if n, err := Splice(fd, p[1], 1<<16); err != unix.EAGAIN || n != 0 {
			t.Errorf("splice from an empty socket = %d, %v; want 0, EAGAIN", n, err)
		}
	})
	msg := []byte("hello through a pipe")
	if _, err := a.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < len(msg) {
		fd(t, b, func(fd int) {
			n, err := Splice(fd, p[1], 1<<16)
			if err != nil && err != unix.EAGAIN {
				t.Fatalf("splice into the pipe: %v", err)
			}
			got += n
		})
	}
	// And on from the pipe to the other socket, back to a.
	fd(t, b, func(fd int) {
		if n, err := Splice(p[0], fd, got); err != nil || n != got {
			t.Errorf("splice out of the pipe = %d, %v; want %d", n, err, got)
		}
	})
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(a, buf); err != nil || !bytes.Equal(buf, msg) {
		t.Errorf("read back %q, %v; want %q", buf, err, msg)
	}
	// An empty pipe: SPLICE_F_NONBLOCK returns at once.
	fd(t, a, func(fd int) {
		if n, err := Splice(p[0], fd, 1<<16); err != unix.EAGAIN || n != 0 {
			t.Errorf("splice from an empty pipe = %d, %v; want 0, EAGAIN", n, err)
		}
	})
}

func TestReadNeverWaits(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	buf := make([]byte, 16)
	if n, err := Read(p[0], buf); err != unix.EAGAIN || n != 0 {
		t.Errorf("read of an empty pipe = %d, %v; want 0, EAGAIN", n, err)
	}
	unix.Write(p[1], []byte("abc"))
	if n, err := Read(p[0], buf); err != nil || string(buf[:n]) != "abc" {
		t.Errorf("read = %q, %v; want abc", buf[:n], err)
	}
	if n, err := Read(p[0], nil); err != nil || n != 0 {
		t.Errorf("read into nothing = %d, %v; want 0, nil", n, err)
	}
	unix.Close(p[1])
	if n, err := Read(p[0], buf); err != nil || n != 0 {
		t.Errorf("read at the end = %d, %v; want 0, nil", n, err)
	}
	if _, err := Read(-1, buf); err != unix.EBADF {
		t.Errorf("read of a bad descriptor: %v; want EBADF", err)
	}
}

func TestMmsgRoundTrip(t *testing.T) {
	rx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := net.DialUDP("udp4", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	rrc, _ := rx.SyscallConn()
	trc, _ := tx.SyscallConn()

	msgs := func(bufs [][]byte) []unix.Mmsghdr {
		h := make([]unix.Mmsghdr, len(bufs))
		iov := make([]unix.Iovec, len(bufs))
		for i, b := range bufs {
			iov[i].Base = &b[0]
			iov[i].SetLen(len(b))
			h[i].Hdr.Iov = &iov[i]
			h[i].Hdr.Iovlen = 1
		}
		return h
	}
	// Nothing queued: recvmmsg returns at once.
	in := [][]byte{make([]byte, 64), make([]byte, 64), make([]byte, 64)}
	rrc.Control(func(fd uintptr) {
		if n, err := Recvmmsg(fd, msgs(in)); err != unix.EAGAIN || n != 0 {
			t.Errorf("recvmmsg on an empty socket = %d, %v; want 0, EAGAIN", n, err)
		}
	})
	out := [][]byte{[]byte("one"), []byte("two")}
	trc.Control(func(fd uintptr) {
		if n, err := Sendmmsg(fd, msgs(out)); err != nil || n != 2 {
			t.Errorf("sendmmsg = %d, %v; want 2", n, err)
		}
	})
	got := 0
	h := msgs(in)
	for got < 2 {
		rrc.Read(func(fd uintptr) bool {
			n, err := Recvmmsg(fd, h[got:])
			if err == unix.EAGAIN {
				return false
			}
			if err != nil {
				t.Fatalf("recvmmsg: %v", err)
			}
			got += n
			return true
		})
	}
	for i, want := range []string{"one", "two"} {
		if s := string(in[i][:h[i].Len]); s != want {
			t.Errorf("datagram %d = %q; want %q", i, s, want)
		}
	}
	if n, err := Sendmmsg(0, nil); n != 0 || err != nil {
		t.Errorf("sendmmsg of nothing = %d, %v; want 0, nil", n, err)
	}
}

func TestCloseWriteSendsTheEnd(t *testing.T) {
	a, b := testenv.TCPPair(t)
	rc, err := a.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	a.Write([]byte("last"))
	if err := CloseWrite(rc); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(b)
	if err != nil || string(got) != "last" {
		t.Errorf("the other end read %q, %v; want \"last\" and the end", got, err)
	}
	// The reading side is still open.
	b.Write([]byte("reply"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(a, buf); err != nil || string(buf) != "reply" {
		t.Errorf("after CloseWrite, read %q, %v; want reply", buf, err)
	}
	a.Close()
	if err := CloseWrite(rc); err == nil {
		t.Error("CloseWrite of a closed connection: no error")
	}
}

// CloseWrite runs at the end of every spliced direction: like
// net.TCPConn's CloseWrite it must not allocate.
func TestCloseWriteAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops shutters at random under the race detector")
	}
	a, _ := testenv.TCPPair(t)
	rc, err := a.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	CloseWrite(rc) // the pool's first shutter
	if n := testing.AllocsPerRun(100, func() {
		if err := CloseWrite(rc); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("CloseWrite: %v allocations per call; want 0", n)
	}
}
