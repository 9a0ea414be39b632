package tproxy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/airlockhq/airlock/internal/testenv"
)

// writesConn is a net.Conn that keeps each Write as it came.
type writesConn struct {
	net.Conn // nil: only Write, Close and SetWriteDeadline are called
	mu       sync.Mutex
	writes   [][]byte
	fail     error
	closed   bool
}

func (c *writesConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.fail != nil:
		return 0, c.fail
	case c.closed:
		return 0, net.ErrClosed
	}
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func (c *writesConn) Close() error                     { c.mu.Lock(); c.closed = true; c.mu.Unlock(); return nil }
func (c *writesConn) SetWriteDeadline(time.Time) error { return nil }

func (c *writesConn) got() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.writes...)
}

// frame is an HTTP/2 frame's bytes: header and a payload of n bytes.
func frame(typ, flags byte, stream uint32, n int) []byte {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	switch typ {
	case h2FrameHeaders:
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: make([]byte, n),
			EndStream: flags&h2FlagEndStream != 0, EndHeaders: flags&h2FlagEndHeaders != 0})
	case 0x0:
		fr.WriteData(stream, flags&h2FlagEndStream != 0, make([]byte, n))
	case 0x6:
		fr.WritePing(false, [8]byte{})
	case h2FrameRSTStream:
		fr.WriteRSTStream(stream, http2.ErrCodeNo)
	}
	return b.Bytes()
}

func TestH2ConnJoinsHeadersWithWhatFollows(t *testing.T) {
	defer func(d time.Duration) { h2HoldMax = d }(h2HoldMax)
	h2HoldMax = time.Minute
	open := frame(h2FrameHeaders, h2FlagEndHeaders, 1, 40)
	data := frame(0x0, h2FlagEndStream, 1, 8)
	rst := frame(h2FrameRSTStream, 0, 1, 0)
	disguised := frame(0x0, 0, 3, len(open))
	copy(disguised[9:], open)
	cases := []struct {
		name   string
		writes [][]byte
		want   []int // lengths of the writes that reach the connection
	}{
		{"headers then data", [][]byte{open, data}, []int{len(open) + len(data)}},
		// The reset a refused upload gets after its answer: the headers
		// go before it, on their own.
		{"headers then data and a reset", [][]byte{open, append(append([]byte(nil), data...), rst...)}, []int{len(open), len(data) + len(rst)}},
		{"headers then a write that ends in a frame header", [][]byte{open, append(append([]byte(nil), data...), rst[:3]...), rst[3:]}, []int{len(open), len(data) + 3, len(rst) - 3}},
		{"headers that end the stream", [][]byte{frame(h2FrameHeaders, h2FlagEndHeaders|h2FlagEndStream, 1, 40), data}, []int{49, len(data)}},
		{"headers continued", [][]byte{frame(h2FrameHeaders, 0, 1, 40), data}, []int{49, len(data)}},
		{"data, then headers in the same write", [][]byte{append(append([]byte(nil), data...), open...), data}, []int{2*len(data) + len(open)}},
		{"headers, then data in the same write", [][]byte{append(append([]byte(nil), open...), data...), data}, []int{len(open) + len(data), len(data)}},
		// A frame split across writes: its payload must not be read as
		// frames.
		{"payload split", [][]byte{data[:12], data[12:], open, data}, []int{12, len(data) - 12, len(open) + len(data)}},
		{"frame header split", [][]byte{open[:4], open[4:], data}, []int{4, len(open) - 4 + len(data)}},
		// A DATA frame whose payload reads as an open HEADERS frame.
		{"payload that looks like a frame", [][]byte{disguised, data}, []int{len(disguised), len(data)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			under := &writesConn{}
			c := newH2Conn(under)
			var all []byte
			for _, w := range tc.writes {
				if n, err := c.Write(w); n != len(w) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
				all = append(all, w...)
			}
			got := under.got()
			var lens []int
			for _, w := range got {
				lens = append(lens, len(w))
			}
			if fmt.Sprint(lens) != fmt.Sprint(tc.want) || !bytes.Equal(bytes.Join(got, nil), all) {
				t.Errorf("writes of %v bytes (same bytes in order: %v), want %v", lens, bytes.Equal(bytes.Join(got, nil), all), tc.want)
			}
		})
	}
}

func TestH2ConnReleasesHeldHeaders(t *testing.T) {
	defer func(d time.Duration) { h2HoldMax = d }(h2HoldMax)
	h2HoldMax = 5 * time.Millisecond
	open := frame(h2FrameHeaders, h2FlagEndHeaders, 1, 40)

	// Nothing follows: the headers go on their own.
	under := &writesConn{}
	c := newH2Conn(under)
	c.Write(open)
	if len(under.got()) != 0 {
		t.Fatal("headers written at once")
	}
	testenv.WaitFor(t, 5*time.Second, "the held headers", func() bool { return len(under.got()) == 1 })
	if !bytes.Equal(under.got()[0], open) {
		t.Errorf("wrote %x, want %x", under.got()[0], open)
	}

	// Closed while holding: they go before the close.
	under = &writesConn{}
	c = newH2Conn(under)
	c.Write(open)
	c.Close()
	if got := under.got(); len(got) != 1 || !bytes.Equal(got[0], open) || !under.closed {
		t.Errorf("closed with %d writes, closed %v", len(got), under.closed)
	}

	// A write that fails when the timer makes it fails the next one.
	under = &writesConn{}
	c = newH2Conn(under)
	c.Write(open)
	under.mu.Lock()
	under.fail = errors.New("broken pipe")
	under.mu.Unlock()
	time.Sleep(4 * h2HoldMax)
	if _, err := c.Write(frame(0x0, h2FlagEndStream, 1, 8)); err == nil {
		t.Error("a write after a failed one succeeded")
	}
}

func TestH2ConnKeepsTLSState(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	// Go's HTTP/2 server checks the TLS version and cipher it reads from
	// here, and goes without TLS when it cannot.
	if _, ok := newH2Conn(tls.Server(a, &tls.Config{})).(interface{ ConnectionState() tls.ConnectionState }); !ok {
		t.Error("a TLS connection lost its TLS state")
	}
	if _, ok := newH2Conn(a).(interface{ ConnectionState() tls.ConnectionState }); ok {
		t.Error("a plain connection claims a TLS state")
	}
}

// TestH2ConnConcurrentClose: writes, the timer's release and a close
// that meet keep every byte in order up to the close, and never hang.
func TestH2ConnConcurrentClose(t *testing.T) {
	defer func(d time.Duration) { h2HoldMax = d }(h2HoldMax)
	h2HoldMax = 50 * time.Microsecond
	open := frame(h2FrameHeaders, h2FlagEndHeaders, 1, 40)
	data := frame(0x0, h2FlagEndStream, 1, 8)
	for range 200 {
		under := &writesConn{}
		c := newH2Conn(under)
		var wg sync.WaitGroup
		var all []byte
		wg.Go(func() {
			for i := range 20 {
				p := open
				if i%3 == 1 {
					p = data
				}
				if _, err := c.Write(p); err == nil {
					all = append(all, p...)
				}
			}
		})
		c.Close()
		wg.Wait()
		if got := bytes.Join(under.got(), nil); !bytes.HasPrefix(all, got) {
			t.Fatalf("the connection got %d bytes that are not the writes' in order", len(got))
		}
	}
}

// TestInterceptedH2AnswerInOneRecord: through the proxy, a small HTTP/2
// answer (its HEADERS and DATA frames) reaches the client in one TLS
// record, not one per frame.
func TestInterceptedH2AnswerInOneRecord(t *testing.T) {
	defer func(d time.Duration) { h2HoldMax = d }(h2HoldMax)
	h2HoldMax = time.Minute // no release by the clock: the join is what is tested
	up := leanUpstream(t)
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), up.httpsPort),
		rules(up.httpsPort, fmt.Sprintf("api.allowed.test:%d/v1/*", up.httpsPort)))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	raw, err := net.Dial("tcp4", h.proxy.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	counted := &recordCounter{Conn: raw}
	c := tls.Client(counted, &tls.Config{ServerName: "api.allowed.test", RootCAs: roots, NextProtos: []string{"h2"}})
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	cl := newH2BenchClient(c, "api.allowed.test:"+strconv.Itoa(int(up.httpsPort)))
	// The first exchange also carries the settings and session tickets.
	if err := cl.do(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		before := counted.records()
		if err := cl.do(); err != nil {
			t.Fatal(err)
		}
		if n := counted.records() - before; n != 1 {
			t.Errorf("answer %d came in %d TLS records, want 1", i+2, n)
		}
	}
}

// recordCounter counts the TLS records read through it.
type recordCounter struct {
	net.Conn
	mu   sync.Mutex
	head []byte // of the record being read
	left int    // its bytes still to come
	n    int
}

func (c *recordCounter) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	for b := p[:n]; len(b) > 0; {
		if c.left > 0 {
			k := min(c.left, len(b))
			c.left -= k
			b = b[k:]
			continue
		}
		k := min(5-len(c.head), len(b))
		c.head = append(c.head, b[:k]...)
		b = b[k:]
		if len(c.head) == 5 {
			c.left = int(c.head[3])<<8 | int(c.head[4])
			c.head = c.head[:0]
			c.n++
		}
	}
	return n, err
}

func (c *recordCounter) records() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

var _ io.Reader = (*recordCounter)(nil)
