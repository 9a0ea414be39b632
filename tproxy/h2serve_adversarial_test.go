package tproxy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"net"
)

// TestH2ServerFrameLargerThanAdvertised: the server advertises no
// SETTINGS_MAX_FRAME_SIZE, so 16384 holds (RFC 9113, 4.2: a larger frame
// is a FRAME_SIZE_ERROR). The Framer is left at its own limit (16 MiB - 1)
// and reads it whole into a buffer it keeps for the connection's life.
func TestH2ServerFrameLargerThanAdvertised(t *testing.T) {
	p := h2TestProxy(t, nil)
	pc := startH2Peer(t, p, okHandler)
	// A frame of an unknown type (ignored) of 1 MiB, then a PING.
	big := make([]byte, 1<<20)
	pc.write(func(fr *http2.Framer) error { return fr.WriteRawFrame(0xfa, 0, 0, big) })
	pc.write(func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{7}) })
	var got string
	pc.until(func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			got = "goaway " + f.ErrCode.String()
			return true
		case *http2.PingFrame:
			got = "ping ack: the 1 MiB frame was read and ignored"
			return true
		}
		return false
	})
	if got != "goaway FRAME_SIZE_ERROR" {
		t.Errorf("a 1 MiB frame where 16 KiB was advertised: %s, want goaway FRAME_SIZE_ERROR", got)
	}
}

// TestH2ServerFrameBufferPinned: one ignored frame of 16 MiB - 1 makes a
// connection hold a 16 MiB read buffer for as long as it stays open (x/net's
// server capped and advertised 1 MiB).
func TestH2ServerFrameBufferPinned(t *testing.T) {
	p := h2TestProxy(t, nil)
	const conns = 6
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for range conns {
		pc := startH2Peer(t, p, okHandler)
		pc.write(func(*http2.Framer) error {
			// Written straight to the pipe from a small buffer: only the
			// server holds the frame.
			n := 1<<24 - 1
			if _, err := pc.conn.Write([]byte{byte(n >> 16), byte(n >> 8), byte(n), 0xfa, 0, 0, 0, 0, 0}); err != nil {
				return err
			}
			chunk := make([]byte, 64<<10)
			for n > 0 {
				k := min(n, len(chunk))
				if _, err := pc.conn.Write(chunk[:k]); err != nil {
					return err
				}
				n -= k
			}
			return nil
		})
		pc.write(func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{9}) })
		if pc.until(func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() }) == nil {
			return // refused: fine
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	held := int64(after.HeapInuse) - int64(before.HeapInuse)
	if held > conns*2<<20 {
		t.Errorf("%d idle connections hold %d MiB after one ignored frame each", conns, held>>20)
	}
}

// TestH2ServerIdleWithStalledReader: a client that stops reading must not
// keep its connection past IdleTimeout. Here the SETTINGS ack's write
// blocks holding s.wmu, and the idle close waits for s.wmu before it sets
// a write deadline: the connection, its goroutine and the idle closer's
// stay forever (x/net's server closes it goAwayTimeout after the idle
// GOAWAY).
func TestH2ServerIdleWithStalledReader(t *testing.T) {
	p := h2TestProxy(t, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	pc := startH2Peer(t, p, okHandler)
	// Read the server's SETTINGS and WINDOW_UPDATE (one write), then never
	// read again. The peer's SETTINGS (queued by startH2Peer) wants an ack.
	for range 2 {
		if _, err := pc.fr.ReadFrame(); err != nil {
			t.Fatal(err)
		}
	}
	pc.write(func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{1}) })
	select {
	case <-pc.done:
	case <-time.After(3 * time.Second):
		t.Error("a connection whose client stopped reading outlived IdleTimeout (300ms) by 3s")
	}
}

// TestH2ServerContinueAfterFinalAnswer: a handler (the ReverseProxy's
// Transport reading the body after the upstream already answered) reads
// the body of an Expect: 100-continue request after the final answer's
// HEADERS left: a 100 must not follow them (x/net's server drops it,
// golang.org/issue/14030); a client takes it as a malformed response.
func TestH2ServerContinueAfterFinalAnswer(t *testing.T) {
	p := h2TestProxy(t, nil)
	pc := startH2Peer(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		w.(http.Flusher).Flush()
		io.Copy(io.Discard, r.Body)
	}))
	pc.headers(1, false, append(get("/up"), "expect", "100-continue", "content-length", "2")...)
	var order []string
	pc.until(func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 {
				order = append(order, f.PseudoValue("status"))
				if f.PseudoValue("status") == "403" {
					// The client sends its body a little after the answer came.
					pc.write(func(fr *http2.Framer) error {
						time.Sleep(200 * time.Millisecond)
						return fr.WriteData(1, true, []byte("ok"))
					})
				}
			}
		case *http2.DataFrame:
			return f.StreamID == 1 && f.StreamEnded()
		case *http2.RSTStreamFrame:
			return f.StreamID == 1
		}
		return false
	})
	if strings.Join(order, ",") != "403" {
		t.Errorf("HEADERS on the stream with :status %q, want only 403", order)
	}
}

// TestH2ServerConnWindowLeak: DATA the server refuses with a stream error
// (past the declared Content-Length) still counted against the
// connection's receive window and is never given back: after 1 MiB of it
// the connection takes no more body bytes from anyone.
func TestH2ServerConnWindowLeak(t *testing.T) {
	p := h2TestProxy(t, nil)
	pc := startH2Peer(t, p, okHandler)
	chunk := bytes.Repeat([]byte("x"), 16<<10)
	id := uint32(1)
	for range h2Window / len(chunk) {
		pc.headers(id, false, append(get("/up"), "content-length", "0")...)
		sid := id
		pc.write(func(fr *http2.Framer) error { return fr.WriteData(sid, true, chunk) })
		if o := pc.outcome(id); o != "reset PROTOCOL_ERROR" {
			t.Fatalf("stream %d: %s", id, o)
		}
		id += 2
	}
	// A well-behaved upload on a new stream.
	pc.headers(id, false, append(get("/up"), "content-length", "1")...)
	sid := id
	pc.write(func(fr *http2.Framer) error { return fr.WriteData(sid, true, []byte("y")) })
	if o := pc.outcome(id); o != "200" {
		t.Errorf("an upload after 1 MiB of refused DATA: %s, want 200 (the refused bytes were never given back)", o)
	}
}

// TestH2ServerWerrRace: s.werr is written under s.wmu (flushLocked) and
// read under s.mu (takeWindow): a write failing while another handler
// takes window is a data race (run with -race).
func TestH2ServerWerrRace(t *testing.T) {
	p := h2TestProxy(t, nil)
	startA := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	pc := startH2Peer(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer wg.Done()
		switch r.URL.Path {
		case "/a": // blocks in a write the client never reads
			<-startA
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
		case "/b": // waits in takeWindow: the stream's window is 0
			w.WriteHeader(200)
			w.Write([]byte("b"))
			w.(http.Flusher).Flush()
		}
	}), http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	pc.headers(1, true, get("/a")...)
	pc.headers(3, true, get("/b")...)
	if pc.until(func(f http2.Frame) bool { h, ok := f.(*http2.MetaHeadersFrame); return ok && h.StreamID == 3 }) == nil {
		t.Fatal("no answer on stream 3")
	}
	time.Sleep(100 * time.Millisecond) // b waits for window
	close(startA)
	time.Sleep(100 * time.Millisecond) // a blocks in its write
	pc.write(func(fr *http2.Framer) error { return fr.WriteWindowUpdate(3, 100) })
	time.Sleep(100 * time.Millisecond) // b took window, waits for s.wmu
	pc.conn.Close()                    // a's write fails: s.werr
	wg.Wait()
}

// trailerProxy is the handler bumpHandler forwards with: a ReverseProxy,
// whose first act is req.Clone (which copies r.Trailer), over a transport
// that reads the body.
func trailerProxy(delay func() time.Duration) http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "up.test" },
		Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Body != nil {
				io.Copy(io.Discard, r.Body)
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		}),
		ErrorLog: log.New(io.Discard, "", 0),
	}
	// The time bumpHandler spends deciding before it forwards.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for start, d := time.Now(), delay(); time.Since(start) < d; {
		}
		rp.ServeHTTP(w, r)
	})
}

// sendTrailed sends on stream id a POST declaring n trailers and, at
// once, the trailers themselves.
func sendTrailed(pc *h2Peer, id uint32, n int) {
	names := make([]string, n)
	var trailers []string
	for i := range names {
		names[i] = "x-t" + strconv.Itoa(i)
		trailers = append(trailers, names[i], "v")
	}
	pc.headers(id, false, append(get("/up"), "trailer", strings.Join(names, ","))...)
	pc.headers(id, true, trailers...)
}

// TestH2ServerTrailerMapRace: the trailers a client sends are stored by
// the connection's goroutine straight into r.Trailer, the map the handler
// already has and reads (the ReverseProxy's req.Clone): a data race
// (run with -race). x/net's server keeps them apart and copies them in
// the handler's goroutine when its body read reaches EOF.
func TestH2ServerTrailerMapRace(t *testing.T) {
	p := h2TestProxy(t, nil)
	pc := startH2Peer(t, p, trailerProxy(func() time.Duration { return 20 * time.Millisecond }))
	sendTrailed(pc, 1, 50)
	if o := pc.outcome(1); o != "200" {
		t.Errorf("outcome %s", o)
	}
}

// TestH2ServerTrailerMapCrash: the same race without the race detector:
// the handler's Clone iterating r.Trailer while the connection's goroutine
// assigns to it is "concurrent map iteration and map write", a fatal error
// no recover catches: one client ends airlockd. Run in a child process.
func TestH2ServerTrailerMapCrash(t *testing.T) {
	if os.Getenv("H2_TRAILER_CHILD") == "1" {
		p := h2TestProxy(t, nil)
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			pc := startH2Peer(t, p, trailerProxy(func() time.Duration { return time.Duration(rand.IntN(400)) * time.Microsecond }))
			for id := uint32(1); id < 200; id += 2 {
				sendTrailed(pc, id, 1500)
				pc.outcome(id)
			}
			pc.conn.Close()
			<-pc.done
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestH2ServerTrailerMapCrash$", "-test.count=1")
	cmd.Env = append(os.Environ(), "H2_TRAILER_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		i := bytes.Index(out, []byte("fatal error"))
		if i < 0 {
			i = 0
		}
		t.Errorf("the serving process died: %v\n%s", err, out[i:min(len(out), i+300)])
	}
}

// TestH2ServerTrailerCrashThroughProxy: the same through the whole proxy
// (TLS interception, bumpHandler's checks, the ReverseProxy of an allowed
// POST): a sandbox member that sends requests with declared trailers and
// the trailers right after ends the proxy's process. Run in a child
// process.
func TestH2ServerTrailerCrashThroughProxy(t *testing.T) {
	if os.Getenv("H2_TRAILER_PROXY_CHILD") != "1" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestH2ServerTrailerCrashThroughProxy$", "-test.count=1")
		cmd.Env = append(os.Environ(), "H2_TRAILER_PROXY_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			i := bytes.Index(out, []byte("fatal error"))
			if i < 0 {
				i = 0
			}
			t.Errorf("the proxy's process died: %v\n%s", err, out[i:min(len(out), i+300)])
		}
		return
	}
	up := leanUpstream(t)
	h, ca := newBumpHarness(t, up, netip.AddrPortFrom(fake("api.allowed.test"), up.httpsPort),
		rules(up.httpsPort, fmt.Sprintf("api.allowed.test:%d/v1/*", up.httpsPort)))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	authority := "api.allowed.test:" + strconv.Itoa(int(up.httpsPort))
	names := make([]string, 1500)
	var trailers []string
	for i := range names {
		names[i] = "x-t" + strconv.Itoa(i)
		trailers = append(trailers, names[i], "v")
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		c, err := tls.Dial("tcp4", h.proxy.Addr().String(), &tls.Config{ServerName: "api.allowed.test", RootCAs: roots, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		close(done)
		pc := newH2Peer(t, c, done)
		for id := uint32(1); id < 60; id += 2 {
			pc.headers(id, false, ":method", "POST", ":scheme", "https", ":authority", authority, ":path", "/v1/x",
				"trailer", strings.Join(names, ","))
			pc.headers(id, true, trailers...)
			pc.outcome(id)
		}
		c.Close()
	}
}

// TestH2ServerStreamAfterIdleGoAway: once the idle close has decided on
// its GOAWAY (last stream 0), a request that arrives before the
// connection is closed must not be served: the GOAWAY tells the client
// it was not processed, so clients retry it (x/net's Transport does, for
// requests it can replay), and a POST runs upstream twice. Here checkIdle
// sets s.closed, but headers() never looks at it.
func TestH2ServerStreamAfterIdleGoAway(t *testing.T) {
	p := h2TestProxy(t, func(c *Config) { c.IdleTimeout = 200 * time.Millisecond })
	served := make(chan struct{}, 1)
	pc := startH2Peer(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served <- struct{}{}
	}))
	// Read up to the ack of our SETTINGS, then stop reading: the idle
	// close's GOAWAY write waits for us.
	if pc.until(func(f http2.Frame) bool { s, ok := f.(*http2.SettingsFrame); return ok && s.IsAck() }) == nil {
		t.Fatal("no SETTINGS ack")
	}
	time.Sleep(500 * time.Millisecond) // past IdleTimeout: the GOAWAY is being written
	pc.headers(1, true, append(get("/v1/pay"), ":method", "POST")[2:]...)
	ran := false
	select {
	case <-served:
		ran = true
	case <-time.After(time.Second):
	}
	var last uint32 = 1 << 31
	pc.until(func(f http2.Frame) bool {
		if g, ok := f.(*http2.GoAwayFrame); ok {
			last = g.LastStreamID
			return true
		}
		return false
	})
	if ran && last < 1 {
		t.Errorf("stream 1 was served, but the GOAWAY said the last stream processed was %d: the client retries it", last)
	}
}

// TestH2ServerSendWindowLostOnReset: send() takes room from the
// connection's send window (takeWindow), then lockStream finds the stream
// reset and returns: the room taken is never given back, though no DATA
// was sent. Each reset that lands between the two (many streams sending,
// the client cancelling some: a browser, an x/net Transport whose
// requests time out) lowers the server's view of the connection window
// below the client's by up to a frame, for good. A client keeps its
// window topped up for what it received, so once the drift reaches its
// connection window (65535 for a client that never raises it) every
// answer on the connection waits in takeWindow forever.
func TestH2ServerSendWindowLostOnReset(t *testing.T) {
	for round := range 20 {
		if lost := sendWindowLostOnReset(t); lost != 0 {
			t.Fatalf("round %d: the server's connection send window is %d bytes below the client's: taken for DATA never sent", round, lost)
		}
	}
}

func sendWindowLostOnReset(t *testing.T) int64 {
	p := h2TestProxy(t, nil)
	const n = 60
	var wg sync.WaitGroup
	wg.Add(n)
	srvConn, cli := net.Pipe()
	done := make(chan struct{})
	chunk := bytes.Repeat([]byte("d"), 16<<10)
	s := newH2Server(p, pipeAddrConn{srvConn}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/last" {
			wg.Wait()
			io.WriteString(w, "last")
			return
		}
		defer wg.Done()
		for range 200 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	go func() { defer close(done); s.serve() }()
	pc := newH2Peer(t, cli, done, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1})
	const grant = 1<<31 - 1 - 65535
	pc.write(func(fr *http2.Framer) error { return fr.WriteWindowUpdate(0, grant) })
	var received int64
	frames := map[uint32]int{}
	for i := range n {
		pc.headers(uint32(2*i+1), true, get("/x")...)
	}
	reset := 0
	if pc.until(func(f http2.Frame) bool {
		if d, ok := f.(*http2.DataFrame); ok {
			received += int64(d.Length)
			frames[d.StreamID]++
			if frames[d.StreamID] == 3+int(d.StreamID)%7 {
				id := d.StreamID
				pc.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(id, http2.ErrCodeCancel) })
				if reset++; reset == n {
					pc.headers(uint32(2*n+1), true, get("/last")...)
				}
			}
			return d.StreamID == 2*n+1 && d.StreamEnded()
		}
		return false
	}) == nil {
		t.Fatal("no answer on the last stream")
	}
	s.mu.Lock()
	got := s.sendConn
	s.mu.Unlock()
	pc.conn.Close()
	return 65535 + grant - received - got
}

// TestH2ServerHeadSnapshotAtWriteHeader: net/http (and x/net's server)
// send the header map as it was at WriteHeader; here it is encoded at the
// first send, so a field set after WriteHeader (a declared trailer's
// value, set after a small body) also goes out in the response's head.
func TestH2ServerHeadSnapshotAtWriteHeader(t *testing.T) {
	p := h2TestProxy(t, nil)
	pc := startH2Peer(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-T")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "body")
		w.Header().Set("X-T", "trailer-value")
	}))
	pc.headers(1, true, get("/x")...)
	var head *http2.MetaHeadersFrame
	pc.until(func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		if ok && h.StreamID == 1 {
			head = h
		}
		return ok
	})
	if head == nil {
		t.Fatal("no answer")
	}
	for _, hf := range head.RegularFields() {
		if hf.Name == "x-t" {
			t.Errorf("the response head carries %s: %q, set after WriteHeader", hf.Name, hf.Value)
		}
	}
}

// TestH2ServerResetGivesTheBodyBack: what a reset stream held of its body
// is given back to the connection's window at once, not when its handler
// returns: a handler that does not read (waiting for a person, say) must
// not leave the client's other streams without room.
func TestH2ServerResetGivesTheBodyBack(t *testing.T) {
	p := h2TestProxy(t, nil)
	block := make(chan struct{})
	defer close(block)
	pc := startH2Peer(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stuck" {
			<-block // reads nothing, minds no context
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, n)
	}))
	pc.headers(1, false, get("/stuck")...)
	chunk := bytes.Repeat([]byte("s"), 16<<10)
	for range h2Window / len(chunk) { // the connection's whole window
		pc.write(func(fr *http2.Framer) error { return fr.WriteData(1, false, chunk) })
	}
	pc.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(1, http2.ErrCodeCancel) })
	pc.headers(3, false, append(get("/up"), "content-length", fmt.Sprint(len(chunk)))...)
	pc.write(func(fr *http2.Framer) error { return fr.WriteData(3, true, chunk) })
	if o := pc.outcome(3); o != "200" {
		t.Errorf("an upload after a reset stream held the whole window: %s, want 200", o)
	}
}
