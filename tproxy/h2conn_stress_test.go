package tproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/airlockhq/airlock/internal/testcerts"
)

// testLeaf is a server certificate for "x" from a throwaway CA; the
// clients here skip verification.
func testLeaf(t testing.TB) tls.Certificate {
	_, leaf, err := testcerts.New([]string{"x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

// TestH2ConnUnderXNet: x/net's server over h2Conn, x/net's client, a mix of
// answers; every one arrives whole and nothing is left running.
func TestH2ConnUnderXNet(t *testing.T) {
	defer func(d time.Duration) { h2HoldMax = d }(h2HoldMax)
	h2HoldMax = time.Millisecond
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cert := testLeaf(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("b", 200<<10)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/small":
			io.WriteString(w, "hello")
		case "/stream":
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			time.Sleep(200 * time.Millisecond)
			io.WriteString(w, "later")
		case "/bigheaders":
			w.Header().Set("X-Big", strings.Repeat("h", 6000))
			io.WriteString(w, "bh")
		case "/midheaders":
			w.Header().Set("X-Mid", strings.Repeat("m", 3900))
			io.WriteString(w, "mh")
		case "/trailers":
			w.Header().Set("Trailer", "X-T")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			io.WriteString(w, "tt")
			w.Header().Set("X-T", "done")
		case "/continue":
			b, _ := io.ReadAll(r.Body)
			w.Write(b)
		case "/large":
			io.WriteString(w, big)
		case "/reset":
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	})
	srvDone := make(chan struct{})
	var conns sync.WaitGroup
	go func() {
		defer close(srvDone)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() {
				tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}})
				if tc.Handshake() != nil {
					c.Close()
					return
				}
				(&http2.Server{}).ServeConn(newH2Conn(tc), &http2.ServeConnOpts{Handler: handler})
			})
		}
	}()
	tr := &http2.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}}
	cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	u := "https://" + ln.Addr().String()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 30 {
				switch (g + i) % 8 {
				case 0, 1:
					expectAnswer(t, cl, getReq(u+"/small"), "hello", "")
				case 2:
					expectAnswer(t, cl, getReq(u+"/stream"), "later", "")
				case 3:
					expectAnswer(t, cl, getReq(u+"/bigheaders"), "bh", "")
					expectAnswer(t, cl, getReq(u+"/midheaders"), "mh", "")
				case 4:
					expectAnswer(t, cl, getReq(u+"/trailers"), "tt", "done")
				case 5:
					req, _ := http.NewRequest("POST", u+"/continue", strings.NewReader("body!"))
					req.Header.Set("Expect", "100-continue")
					expectAnswer(t, cl, req, "body!", "")
				case 6:
					expectAnswer(t, cl, getReq(u+"/large"), big, "")
				case 7:
					ctx, cancel := context.WithCancel(context.Background())
					req, _ := http.NewRequestWithContext(ctx, "GET", u+"/reset", nil)
					res, err := cl.Do(req)
					if err == nil {
						cancel()
						io.ReadAll(res.Body)
						res.Body.Close()
					}
					cancel()
				}
			}
		})
	}
	wg.Wait()
	// Alone on its connection, nothing else can carry the held headers:
	// they must come on their own, not with the body the handler writes
	// 200 ms after flushing them, so the body is still to come when the
	// client has the headers.
	tr.CloseIdleConnections()
	var bodyTook time.Duration
	if res, err := cl.Get(u + "/stream"); err != nil {
		t.Error(err)
	} else {
		start := time.Now()
		io.ReadAll(res.Body)
		res.Body.Close()
		bodyTook = time.Since(start)
	}
	tr.CloseIdleConnections()
	ln.Close()
	<-srvDone
	conns.Wait()
	if bodyTook < 100*time.Millisecond {
		t.Errorf("the flushed headers came %v before the body, want about 200ms: they waited for it", bodyTook)
	}
}

// getReq is a GET of u.
func getReq(u string) *http.Request {
	req, _ := http.NewRequest("GET", u, nil)
	return req
}

// expectAnswer sends req and checks the answer's body, and its X-T
// trailer when trailer is not "".
func expectAnswer(t *testing.T, cl *http.Client, req *http.Request, want, trailer string) {
	res, err := cl.Do(req)
	if err != nil {
		t.Error(err)
		return
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || !bytes.Equal(b, []byte(want)) {
		t.Errorf("%s %s: %d bytes, %v", req.Method, req.URL, len(b), err)
	}
	if trailer != "" && res.Trailer.Get("X-T") != trailer {
		t.Errorf("%s %s: trailer %q", req.Method, req.URL, res.Trailer.Get("X-T"))
	}
}

// TestH2ConnCloseUnblocks: a client that never reads blocks the timer's
// release and the next write; Close frees both at once.
func TestH2ConnCloseUnblocks(t *testing.T) {
	defer func(d time.Duration) { h2HoldMax = d }(h2HoldMax)
	h2HoldMax = time.Millisecond
	for _, useTLS := range []bool{false, true} {
		a, b := net.Pipe()
		var under net.Conn = a
		if useTLS {
			cert := testLeaf(t)
			tc := tls.Server(a, &tls.Config{Certificates: []tls.Certificate{cert}})
			cc := tls.Client(b, &tls.Config{InsecureSkipVerify: true})
			go cc.Handshake()
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			under = tc
		}
		c := newH2Conn(under)
		c.Write(frame(h2FrameHeaders, h2FlagEndHeaders, 1, 40))
		time.Sleep(20 * time.Millisecond) // the release is now blocked in the pipe
		done := make(chan error, 1)
		go func() { _, err := c.Write(frame(0x0, h2FlagEndStream, 1, 8)); done <- err }()
		time.Sleep(10 * time.Millisecond)
		closed := make(chan struct{})
		go func() { c.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(2 * time.Second):
			t.Fatalf("tls %v: Close hangs", useTLS)
		}
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("tls %v: write after close succeeded", useTLS)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("tls %v: write hangs after Close", useTLS)
		}
		b.Close()
	}
}

// recordingConn passes writes on and keeps each as it came: over TLS,
// each would be a record of its own.
type recordingConn struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes = append(c.writes, bytes.Clone(p))
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// TestH2ConnRefusedUploadHeadersBeforeReset: a POST refused before the
// client sent its body. x/net's server answers, then resets the stream
// with NO_ERROR in the same write as the answer's DATA; the answer's
// HEADERS, held, must not go in that write. (One TLS record with the
// whole answer and the reset made curl 7.88 take the stream for closed
// before it sent its body, and fail with "Stream error in the HTTP/2
// framing layer" instead of showing the 403.)
func TestH2ConnRefusedUploadHeadersBeforeReset(t *testing.T) {
	defer func(d time.Duration) { h2HoldMax = d }(h2HoldMax)
	h2HoldMax = time.Hour // no release by the clock: the join is what is tested
	srv, cli := net.Pipe()
	rec := &recordingConn{Conn: srv}
	served := make(chan struct{})
	go func() {
		defer close(served)
		(&http2.Server{}).ServeConn(newH2Conn(rec), &http2.ServeConnOpts{Handler: http.HandlerFunc(
			func(w http.ResponseWriter, r *http.Request) {
				// A header, as bump's refusals have: with none, the
				// server does not wait for the HEADERS to be written
				// before it takes the DATA, and sends all in one write
				// itself.
				w.Header().Set("X-Airlock-Verdict", "deny")
				w.WriteHeader(http.StatusForbidden)
				io.WriteString(w, "denied")
			})})
	}()
	defer func() { cli.Close(); <-served }()
	cli.SetDeadline(time.Now().Add(10 * time.Second))

	// The client's side: it reads until the reset, and sends no body.
	reset := make(chan error, 1)
	go func() {
		fr := http2.NewFramer(nil, cli)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				reset <- err
				return
			}
			if f, ok := f.(*http2.RSTStreamFrame); ok && f.StreamID == 1 {
				reset <- nil
				return
			}
		}
	}()
	io.WriteString(cli, http2.ClientPreface)
	fw := http2.NewFramer(cli, nil)
	fw.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", "x"}, {":path", "/"}, {"content-length", "1"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	fw.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	if err := <-reset; err != nil {
		t.Fatalf("no RST_STREAM for the refused upload: %v", err)
	}

	// Which write carried each of the server's frames.
	rec.mu.Lock()
	writes := rec.writes
	rec.mu.Unlock()
	headersIn, resetIn := -1, -1
	var head []byte
	left := 0
	for i, w := range writes {
		for len(w) > 0 {
			if left > 0 {
				k := min(left, len(w))
				left, w = left-k, w[k:]
				continue
			}
			k := min(h2FrameHeaderLen-len(head), len(w))
			head, w = append(head, w[:k]...), w[k:]
			if len(head) < h2FrameHeaderLen {
				continue
			}
			switch head[3] {
			case h2FrameHeaders:
				headersIn = i
			case h2FrameRSTStream:
				resetIn = i
			}
			left, head = int(head[0])<<16|int(head[1])<<8|int(head[2]), head[:0]
		}
	}
	if headersIn < 0 || headersIn >= resetIn {
		t.Errorf("the answer's HEADERS went in write %d, the RST_STREAM in write %d: want the HEADERS in an earlier write", headersIn, resetIn)
	}
}
