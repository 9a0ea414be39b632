package tproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testcerts"
	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2TestProxy is as much of a Proxy as an h2Server uses; it closes when
// the test ends.
func h2TestProxy(t testing.TB, tune func(*Config)) *Proxy {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p := &Proxy{ctx: ctx, log: slog.New(slog.DiscardHandler), cfg: Config{PeekTimeout: 5 * time.Second, IdleTimeout: time.Minute}}
	if tune != nil {
		tune(&p.cfg)
	}
	return p
}

// h2Peer is a client speaking raw frames to an h2Server over a pipe. Its
// writes go out in order from a goroutine of their own (a pipe blocks a
// write until the other end reads, and the server may be writing too);
// the test reads.
type h2Peer struct {
	t    testing.TB
	conn net.Conn
	fr   *http2.Framer // reads
	wfr  *http2.Framer // writes, in the writer's goroutine only
	wq   chan func(*http2.Framer) error
	done chan struct{} // closed when the server returned
}

// startH2Peer serves handler on one end of a pipe and returns the other,
// the preface and SETTINGS sent.
func startH2Peer(t testing.TB, p *Proxy, handler http.Handler, settings ...http2.Setting) *h2Peer {
	srv, cli := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		newH2Server(p, pipeAddrConn{srv}, handler).serve()
	}()
	return newH2Peer(t, cli, done, settings...)
}

// newH2Peer is startH2Peer's client on conn, the server's end of which
// closes done when it is served.
func newH2Peer(t testing.TB, conn net.Conn, done chan struct{}, settings ...http2.Setting) *h2Peer {
	pc := &h2Peer{t: t, conn: conn, done: done, wq: make(chan func(*http2.Framer) error, 1024)}
	t.Cleanup(func() { conn.Close(); <-done })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	pc.fr = http2.NewFramer(nil, conn)
	pc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	pc.wfr = http2.NewFramer(conn, nil)
	pc.wfr.AllowIllegalWrites = true
	go func() {
		if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
			return
		}
		for f := range pc.wq {
			if f(pc.wfr) != nil {
				for range pc.wq { // the rest fails too
				}
				return
			}
		}
	}()
	pc.write(func(fr *http2.Framer) error { return fr.WriteSettings(settings...) })
	return pc
}

// pipeAddrConn gives a pipe's end an address the server can print.
type pipeAddrConn struct{ net.Conn }

func (pipeAddrConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 40000}
}

// write queues a frame's write.
func (pc *h2Peer) write(f func(*http2.Framer) error) { pc.wq <- f }

// headers sends a header block of fields (name, value, name, value...)
// on stream id.
func (pc *h2Peer) headers(id uint32, end bool, fields ...string) {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	pc.write(func(fr *http2.Framer) error {
		return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: b.Bytes(), EndStream: end, EndHeaders: true})
	})
}

// get is a well-formed GET of path.
func get(path string) []string {
	return []string{":method", "GET", ":scheme", "https", ":authority", "api.allowed.test", ":path", path}
}

// until reads frames until want returns true for one, and returns it; nil
// if the connection ended first.
func (pc *h2Peer) until(want func(http2.Frame) bool) http2.Frame {
	pc.t.Helper()
	for {
		f, err := pc.fr.ReadFrame()
		if err != nil {
			return nil
		}
		if f, ok := f.(*http2.SettingsFrame); ok && !f.IsAck() {
			pc.write(func(fr *http2.Framer) error { return fr.WriteSettingsAck() })
			continue
		}
		if want(f) {
			return f
		}
	}
}

// outcome reads frames until stream id is answered (its :status), reset
// (RST_STREAM's code) or the connection ends (GOAWAY's code, or "closed").
func (pc *h2Peer) outcome(id uint32) string {
	pc.t.Helper()
	var got string
	pc.until(func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamID == id && f.PseudoValue("status") != "" && f.PseudoValue("status")[0] != '1' {
				got = f.PseudoValue("status")
				return true
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				got = "reset " + f.ErrCode.String()
				return true
			}
		case *http2.GoAwayFrame:
			got = "goaway " + f.ErrCode.String()
			return true
		}
		return false
	})
	if got == "" {
		got = "closed"
	}
	return got
}

// okHandler answers every request "ok", having read its body.
var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	io.WriteString(w, "ok")
})

// TestH2ServerRefusesWhatXNetRefuses: header blocks x/net's server
// refuses (as a reset stream, or an answer of its own) are refused here,
// and the handler never sees them; the well-formed ones are served.
func TestH2ServerRefusesWhatXNetRefuses(t *testing.T) {
	p := h2TestProxy(t, nil)
	base := get("/v1/x")
	with := func(extra ...string) []string { return append(slices.Clone(base), extra...) }
	without := func(name string) []string {
		var out []string
		for i := 0; i < len(base); i += 2 {
			if base[i] != name {
				out = append(out, base[i], base[i+1])
			}
		}
		return out
	}
	cases := []struct {
		name   string
		fields []string
		end    bool
		want   string
	}{
		{"well formed", base, true, "200"},
		{"query and odd path", get("/v1/a/../b?x=1;y=2"), true, "200"},
		{"no :method", without(":method"), true, "reset PROTOCOL_ERROR"},
		{"no :path", without(":path"), true, "reset PROTOCOL_ERROR"},
		{"no :scheme", without(":scheme"), true, "reset PROTOCOL_ERROR"},
		{"scheme ftp", []string{":method", "GET", ":scheme", "ftp", ":authority", "a", ":path", "/"}, true, "reset PROTOCOL_ERROR"},
		{"path without slash", get("v1/x"), true, "reset PROTOCOL_ERROR"},
		{"absolute path", get("https://other.test/v1/x"), true, "reset PROTOCOL_ERROR"},
		{"empty path", get(""), true, "reset PROTOCOL_ERROR"},
		{":protocol", with(":protocol", "websocket"), true, "reset PROTOCOL_ERROR"},
		{"unknown pseudo", with(":foo", "x"), true, "reset PROTOCOL_ERROR"},
		{"pseudo after regular", append(with("accept", "*/*"), ":x", "y"), true, "reset PROTOCOL_ERROR"},
		{"duplicate :path", with(":path", "/other"), true, "reset PROTOCOL_ERROR"},
		{":status in a request", with(":status", "200"), true, "reset PROTOCOL_ERROR"},
		{"upper-case name", with("X-Upper", "1"), true, "reset PROTOCOL_ERROR"},
		{"name with space", with("x y", "1"), true, "reset PROTOCOL_ERROR"},
		{"value with newline", with("x-a", "1\r\nx-b: 2"), true, "reset PROTOCOL_ERROR"},
		{"value with NUL", with("x-a", "1\x002"), true, "reset PROTOCOL_ERROR"},
		{"host differs from :authority", with("host", "other.test"), true, "reset PROTOCOL_ERROR"},
		{"two hosts", append(without(":authority"), "host", "a.test", "host", "b.test"), true, "reset PROTOCOL_ERROR"},
		{"userinfo in :authority", []string{":method", "GET", ":scheme", "https", ":authority", "u@api.allowed.test", ":path", "/"}, true, "reset PROTOCOL_ERROR"},
		{"bad :authority", []string{":method", "GET", ":scheme", "https", ":authority", "a b", ":path", "/"}, true, "reset PROTOCOL_ERROR"},
		{"connection header", with("connection", "close"), true, "400"},
		{"transfer-encoding", with("transfer-encoding", "chunked"), true, "400"},
		{"upgrade", with("upgrade", "h2c"), true, "400"},
		{"keep-alive", with("keep-alive", "1"), true, "400"},
		{"proxy-connection", with("proxy-connection", "x"), true, "400"},
		{"te gzip", with("te", "gzip"), true, "400"},
		{"te trailers", with("te", "trailers"), true, "200"},
		{"CONNECT with a path", []string{":method", "CONNECT", ":scheme", "https", ":authority", "a.test:443", ":path", "/"}, true, "reset PROTOCOL_ERROR"},
		{"CONNECT without :authority", []string{":method", "CONNECT"}, true, "reset PROTOCOL_ERROR"},
		{"content-length on an ended stream", with("content-length", "5"), true, "reset PROTOCOL_ERROR"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			called := false
			var mu sync.Mutex
			pc := startH2Peer(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				called = true
				mu.Unlock()
				okHandler(w, r)
			}))
			pc.headers(1, c.end, c.fields...)
			got := pc.outcome(1)
			mu.Lock()
			defer mu.Unlock()
			if got != c.want {
				t.Errorf("%q: %s, want %s", c.fields, got, c.want)
			}
			if called != (c.want == "200") {
				t.Errorf("%q: handler called %v", c.fields, called)
			}
		})
	}
}

// TestH2ServerRequest: what the handler gets of a well-formed request.
func TestH2ServerRequest(t *testing.T) {
	p := h2TestProxy(t, nil)
	got := make(chan *http.Request, 1)
	bodies := make(chan string, 1)
	pc := startH2Peer(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r
		bodies <- string(b)
		io.WriteString(w, "ok")
	}))
	pc.headers(1, false, ":method", "POST", ":scheme", "https", ":authority", "api.allowed.test:8443", ":path", "/v1/x?q=1",
		"cookie", "a=1", "cookie", "b=2", "content-length", "5", "trailer", "x-sum", "x-multi", "1", "x-multi", "2")
	pc.write(func(fr *http2.Framer) error { return fr.WriteData(1, false, []byte("hel")) })
	pc.write(func(fr *http2.Framer) error { return fr.WriteData(1, false, []byte("lo")) })
	pc.headers(1, true, "x-sum", "abc", "x-undeclared", "no")
	if o := pc.outcome(1); o != "200" {
		t.Fatalf("answer: %s", o)
	}
	r := <-got
	if b := <-bodies; b != "hello" {
		t.Errorf("body %q", b)
	}
	if r.Method != "POST" || r.Host != "api.allowed.test:8443" || r.RequestURI != "/v1/x?q=1" || r.URL.Path != "/v1/x" || r.URL.RawQuery != "q=1" ||
		r.Proto != "HTTP/2.0" || r.ProtoMajor != 2 || r.ContentLength != 5 || r.RemoteAddr != "10.0.0.2:40000" {
		t.Errorf("request %s %s %s %s %s %d %s", r.Method, r.Host, r.RequestURI, r.URL, r.Proto, r.ContentLength, r.RemoteAddr)
	}
	if c := r.Header["Cookie"]; len(c) != 1 || c[0] != "a=1; b=2" {
		t.Errorf("cookies %q, want one field a=1; b=2", c)
	}
	if m := r.Header["X-Multi"]; !slices.Equal(m, []string{"1", "2"}) {
		t.Errorf("X-Multi %q", m)
	}
	if r.Trailer.Get("X-Sum") != "abc" || r.Trailer.Get("X-Undeclared") != "" || r.Header.Get("Trailer") != "" {
		t.Errorf("trailers %v, header Trailer %q", r.Trailer, r.Header.Get("Trailer"))
	}
}

// TestH2ServerBodyChecks: a body longer or shorter than its
// Content-Length resets the stream, and the handler's read fails; DATA
// after the end resets it too.
func TestH2ServerBodyChecks(t *testing.T) {
	p := h2TestProxy(t, nil)
	for _, c := range []struct {
		name string
		send func(pc *h2Peer)
	}{
		{"longer", func(pc *h2Peer) {
			pc.write(func(fr *http2.Framer) error { return fr.WriteData(1, true, []byte("123456")) })
		}},
		{"shorter", func(pc *h2Peer) {
			pc.write(func(fr *http2.Framer) error { return fr.WriteData(1, true, []byte("1234")) })
		}},
		{"shorter, then trailers", func(pc *h2Peer) {
			pc.write(func(fr *http2.Framer) error { return fr.WriteData(1, false, []byte("1234")) })
			pc.headers(1, true, "x-t", "1")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			readErr := make(chan error, 1)
			pc := startH2Peer(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, err := io.ReadAll(r.Body)
				readErr <- err
			}))
			pc.headers(1, false, append(get("/up"), "content-length", "5")...)
			c.send(pc)
			if o := pc.outcome(1); o != "reset PROTOCOL_ERROR" {
				t.Errorf("%s body: %s, want reset PROTOCOL_ERROR", c.name, o)
			}
			if err := <-readErr; err == nil {
				t.Errorf("%s body: the handler read it without error", c.name)
			}
		})
	}
}

// TestH2ServerFlowControl: an answer larger than the client's windows
// waits for its WINDOW_UPDATEs; a client sending more than its window
// is stopped. (TestH2ServerUnderLoad uploads more than a window.)
func TestH2ServerFlowControl(t *testing.T) {
	p := h2TestProxy(t, nil)
	big := bytes.Repeat([]byte("z"), 300<<10)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			w.Write(big)
		case "/echo":
			n, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprint(w, n)
		}
	})
	t.Run("answer waits for the window", func(t *testing.T) {
		pc := startH2Peer(t, p, handler, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		pc.headers(1, true, get("/big")...)
		if pc.until(func(f http2.Frame) bool { _, ok := f.(*http2.MetaHeadersFrame); return ok }) == nil {
			t.Fatal("no HEADERS")
		}
		pc.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if f := pc.until(func(f http2.Frame) bool { _, ok := f.(*http2.DataFrame); return ok }); f != nil {
			t.Fatal("DATA sent into a window of 0")
		}
		pc.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		pc.fr = http2.NewFramer(nil, pc.conn) // nothing came: the timed-out read took no byte
		pc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		pc.write(func(fr *http2.Framer) error { return fr.WriteWindowUpdate(1, uint32(len(big))) })
		pc.write(func(fr *http2.Framer) error { return fr.WriteWindowUpdate(0, uint32(len(big))) })
		n := 0
		pc.until(func(f http2.Frame) bool {
			if d, ok := f.(*http2.DataFrame); ok {
				n += len(d.Data())
				return d.StreamEnded()
			}
			return false
		})
		if n != len(big) {
			t.Errorf("got %d bytes of %d", n, len(big))
		}
	})
	t.Run("more than the window", func(t *testing.T) {
		block := make(chan struct{})
		defer close(block)
		pc := startH2Peer(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
		pc.headers(1, false, get("/slow")...)
		got := make(chan string, 1)
		go func() { got <- pc.outcome(1) }()
		chunk := bytes.Repeat([]byte("u"), 16<<10)
		for range (h2Window / len(chunk)) + 1 {
			pc.write(func(fr *http2.Framer) error { return fr.WriteData(1, false, chunk) })
		}
		if o := <-got; o != "reset FLOW_CONTROL_ERROR" && o != "goaway FLOW_CONTROL_ERROR" {
			t.Errorf("past the window: %s", o)
		}
	})
}

// TestH2ServerProtocolErrors: frames no client may send end the
// connection with GOAWAY.
func TestH2ServerProtocolErrors(t *testing.T) {
	p := h2TestProxy(t, nil)
	for _, c := range []struct {
		name string
		send func(pc *h2Peer)
		want string
	}{
		{"HEADERS on an even stream", func(pc *h2Peer) { pc.headers(2, true, get("/")...) }, "goaway PROTOCOL_ERROR"},
		{"DATA on an idle stream", func(pc *h2Peer) { pc.write(func(fr *http2.Framer) error { return fr.WriteData(5, true, []byte("x")) }) }, "goaway PROTOCOL_ERROR"},
		{"a stream gone by", func(pc *h2Peer) {
			pc.headers(3, true, get("/")...)
			pc.headers(1, true, get("/")...)
		}, "goaway PROTOCOL_ERROR"},
		{"PUSH_PROMISE", func(pc *h2Peer) {
			pc.write(func(fr *http2.Framer) error {
				return fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: []byte{0x82}, EndHeaders: true})
			})
		}, "goaway PROTOCOL_ERROR"},
		{"window overflow", func(pc *h2Peer) {
			pc.write(func(fr *http2.Framer) error { return fr.WriteWindowUpdate(0, 1<<31-1) })
		}, "goaway FLOW_CONTROL_ERROR"},
		{"bad SETTINGS value", func(pc *h2Peer) {
			pc.write(func(fr *http2.Framer) error {
				return fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 31})
			})
		}, "goaway FLOW_CONTROL_ERROR"},
		{"RST_STREAM on an idle stream", func(pc *h2Peer) {
			pc.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(7, http2.ErrCodeCancel) })
		}, "goaway PROTOCOL_ERROR"},
	} {
		t.Run(c.name, func(t *testing.T) {
			pc := startH2Peer(t, p, okHandler)
			c.send(pc)
			var got string
			pc.until(func(f http2.Frame) bool {
				if g, ok := f.(*http2.GoAwayFrame); ok {
					got = "goaway " + g.ErrCode.String()
					return true
				}
				return false
			})
			if got != c.want {
				t.Errorf("%s: %q, want %q", c.name, got, c.want)
			}
		})
	}
}

// TestH2ServerStreamLimits: past SETTINGS_MAX_CONCURRENT_STREAMS a stream
// is refused; handlers left running by streams reset and opened again
// (rapid reset) end the connection once they are h2MaxHandlers.
func TestH2ServerStreamLimits(t *testing.T) {
	p := h2TestProxy(t, nil)
	block := make(chan struct{})
	defer close(block)
	stuck := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }) // minds no context
	t.Run("concurrent streams", func(t *testing.T) {
		pc := startH2Peer(t, p, stuck)
		for i := range h2MaxStreams {
			pc.headers(uint32(2*i+1), true, get("/")...)
		}
		id := uint32(2*h2MaxStreams + 1)
		pc.headers(id, true, get("/")...)
		if o := pc.outcome(id); o != "reset REFUSED_STREAM" {
			t.Errorf("stream %d of %d: %s", h2MaxStreams+1, h2MaxStreams, o)
		}
	})
	t.Run("rapid reset", func(t *testing.T) {
		pc := startH2Peer(t, p, stuck)
		var id uint32 = 1
		got := make(chan string, 1)
		go func() { got <- pc.outcome(0) }()
		for range h2MaxHandlers + 1 {
			pc.headers(id, true, get("/")...)
			reset := id
			pc.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(reset, http2.ErrCodeCancel) })
			id += 2
		}
		if o := <-got; o != "goaway ENHANCE_YOUR_CALM" {
			t.Errorf("after %d streams reset while their handlers ran: %s", h2MaxHandlers+1, o)
		}
	})
}

// TestH2ServerIdle: a connection without streams for IdleTimeout ends
// with GOAWAY; PING is answered.
func TestH2ServerIdle(t *testing.T) {
	p := h2TestProxy(t, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	pc := startH2Peer(t, p, okHandler)
	pc.write(func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{1, 2, 3}) })
	if f := pc.until(func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() && p.Data[2] == 3 }); f == nil {
		t.Fatal("PING not answered")
	}
	start := time.Now()
	got := pc.outcome(0)
	if got != "goaway NO_ERROR" {
		t.Errorf("idle: %s", got)
	}
	select {
	case <-pc.done:
	case <-time.After(5 * time.Second):
		t.Error("an idle connection was not closed")
	}
	if time.Since(start) > 5*time.Second {
		t.Error("closed late")
	}
}

// TestH2ServerAnswerBeforeReset: an upload answered before the client
// sent its body: the answer, then RST_STREAM NO_ERROR in a write of its
// own. (One TLS record with the whole answer and the reset made curl 7.88
// take the stream for closed before it sent its body, and fail with
// "Stream error in the HTTP/2 framing layer" instead of showing the 403.)
func TestH2ServerAnswerBeforeReset(t *testing.T) {
	p := h2TestProxy(t, nil)
	srv, cli := net.Pipe()
	rec := &recordingConn{Conn: pipeAddrConn{srv}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		newH2Server(p, rec, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Airlock-Verdict", "deny")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, "denied")
		})).serve()
	}()
	pc := newH2Peer(t, cli, done)
	pc.headers(1, false, append(get("/up"), "content-length", "1")...)
	if pc.until(func(f http2.Frame) bool {
		r, ok := f.(*http2.RSTStreamFrame)
		return ok && r.ErrCode == http2.ErrCodeNo
	}) == nil {
		t.Fatal("no RST_STREAM NO_ERROR for the unread upload")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, w := range rec.writes {
		if bytes.Contains(w, []byte("denied")) {
			// The write with the answer's DATA ends with it: no frame of
			// type RST_STREAM (3) follows in the same write.
			end := bytes.Index(w, []byte("denied")) + len("denied")
			if end != len(w) {
				t.Errorf("the answer's write goes on past its DATA with %d bytes (the reset?)", len(w)-end)
			}
		}
	}
}

// TestH2ServerUnderLoad: our server over TLS, x/net's client, a mix of
// answers from several goroutines; every one arrives whole, and nothing is
// left running once the connections close.
func TestH2ServerUnderLoad(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p := h2TestProxy(t, nil)
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
			time.Sleep(100 * time.Millisecond)
			io.WriteString(w, "later")
		case "/bigheaders":
			w.Header().Set("X-Big", strings.Repeat("h", 40000)) // past one frame: CONTINUATION
			io.WriteString(w, "bh")
		case "/trailers":
			w.Header().Set("Trailer", "X-T")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			io.WriteString(w, "tt")
			w.Header().Set("X-T", "done")
		case "/continue":
			b, _ := io.ReadAll(r.Body)
			w.Write(b)
		case "/count":
			n, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprint(w, n)
		case "/large":
			io.WriteString(w, big)
		case "/reset":
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	})
	var conns sync.WaitGroup
	srvDone := make(chan struct{})
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
				newH2Server(p, tc, handler).serve()
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
				case 4:
					expectAnswer(t, cl, getReq(u+"/trailers"), "tt", "done")
				case 5:
					req, _ := http.NewRequest("POST", u+"/continue", strings.NewReader("body!"))
					req.Header.Set("Expect", "100-continue")
					expectAnswer(t, cl, req, "body!", "")
				case 6:
					expectAnswer(t, cl, getReq(u+"/large"), big, "")
					req, _ := http.NewRequest("POST", u+"/count", strings.NewReader(big+big+big+big+big+big+big+big))
					expectAnswer(t, cl, req, fmt.Sprint(8*len(big)), "") // past the windows
				case 7:
					ctx, cancel := context.WithCancel(context.Background())
					req, _ := http.NewRequestWithContext(ctx, "GET", u+"/reset", nil)
					if res, err := cl.Do(req); err == nil {
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
	tr.CloseIdleConnections()
	ln.Close()
	<-srvDone
	conns.Wait()
}

// TestInterceptedH2AnswerInOneRecord: through the proxy, a small HTTP/2
// answer (its HEADERS and DATA frames) reaches the client in one TLS
// record, not one per frame.
func TestInterceptedH2AnswerInOneRecord(t *testing.T) {
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

func testLeaf(t testing.TB) tls.Certificate {
	_, leaf, err := testcerts.New([]string{"x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return leaf
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

// h2Exchange sends one header block (and body, if any) to a server
// running serve on a pipe and returns how the stream ended (as
// h2Peer.outcome says) and, if the handler ran, what it saw of the
// request.
func h2Exchange(t testing.TB, serve func(net.Conn, http.Handler), fields []string, end bool, body []byte) (outcome, seen string) {
	srv, cli := net.Pipe()
	done := make(chan struct{})
	var mu sync.Mutex
	go func() {
		defer close(done)
		serve(pipeAddrConn{srv}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, err := io.ReadAll(r.Body)
			// x/net declares an empty trailer name (a "Trailer" of ""
			// or ","), which no trailer can fill; here it is not.
			trailer := maps.Clone(r.Trailer)
			delete(trailer, "")
			keys := slices.Sorted(maps.Keys(r.Header))
			var hdr strings.Builder
			for _, k := range keys {
				fmt.Fprintf(&hdr, "%s=%q ", k, r.Header[k])
			}
			mu.Lock()
			seen = fmt.Sprintf("%s host=%q uri=%q path=%q rawpath=%q query=%q cl=%d body=%q err=%v trailer=%v header=%s",
				r.Method, r.Host, r.RequestURI, r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.ContentLength, b, err != nil, trailer, hdr.String())
			mu.Unlock()
			io.WriteString(w, "ok")
		}))
	}()
	pc := newH2Peer(t, cli, done)
	cli.SetDeadline(time.Now().Add(2 * time.Second))
	pc.headers(1, end, fields...)
	if !end {
		pc.write(func(fr *http2.Framer) error { return fr.WriteData(1, true, body) })
	}
	outcome = pc.outcome(1)
	cli.Close()
	<-done
	mu.Lock()
	defer mu.Unlock()
	return outcome, seen
}

// serveXNet serves conn with x/net's HTTP/2 server, which airlock's
// stands in for.
func serveXNet(conn net.Conn, h http.Handler) {
	(&http2.Server{}).ServeConn(conn, &http2.ServeConnOpts{Handler: h})
}

// FuzzH2Request: a request x/net's server refuses is refused here too,
// and one both serve reaches the handler exactly as x/net's server hands
// it over. (Here may refuse more: a Content-Length that is not one plain
// number, say.)
func FuzzH2Request(f *testing.F) {
	for _, seed := range []string{
		":method\x00GET\x00:scheme\x00https\x00:authority\x00api.allowed.test\x00:path\x00/v1/x",
		":method\x00POST\x00:scheme\x00https\x00:authority\x00a.test:8443\x00:path\x00/v1/%2e%2e/x?q=1;y\x00content-length\x002\x00cookie\x00a=1\x00cookie\x00b",
		":method\x00GET\x00:scheme\x00http\x00:path\x00*\x00host\x00a.test",
		":method\x00GET\x00:scheme\x00https\x00:authority\x00a.test\x00:path\x00//x//y\x00host\x00a.test\x00te\x00trailers",
		":method\x00CONNECT\x00:authority\x00a.test:443",
		":method\x00PUT\x00:scheme\x00https\x00:authority\x00[::1]:1\x00:path\x00/\x00expect\x00100-continue\x00trailer\x00x-a, content-length",
		":method\x00GET\x00:scheme\x00https\x00:authority\x00a.test\x00:path\x00/\x00x-a\x00\x80\xff\x00content-length\x00+1",
	} {
		f.Add(seed, true, []byte(nil))
		f.Add(seed, false, []byte("ok"))
	}
	p := h2TestProxy(f, nil)
	ours := func(c net.Conn, h http.Handler) { newH2Server(p, c, h).serve() }
	f.Fuzz(func(t *testing.T, spec string, end bool, body []byte) {
		fields := strings.Split(spec, "\x00")
		if len(fields)%2 == 1 {
			fields = fields[:len(fields)-1]
		}
		theirs, theySaw := h2Exchange(t, serveXNet, fields, end, body)
		got, weSaw := h2Exchange(t, ours, fields, end, body)
		// An answer of 200 comes after the handler noted what it saw;
		// a handler's view without one may not have been noted yet.
		switch {
		case got == "200" && theirs != "200":
			t.Errorf("%q: served here (%s), refused by x/net (%s)", fields, weSaw, theirs)
		case got == "200" && weSaw != theySaw:
			t.Errorf("%q: the handler saw\n  here:  %s\n  x/net: %s", fields, weSaw, theySaw)
		}
	})
}

// FuzzH2Frames: whatever frames a client sends, the server neither
// panics nor outlives the connection, and leaves no handler running.
func FuzzH2Frames(f *testing.F) {
	var seed bytes.Buffer
	fr := http2.NewFramer(&seed, nil)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", "a.test"}, {":path", "/"}, {"content-length", "3"}} {
		enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	fr.WriteData(1, false, []byte("ab"))
	fr.WriteWindowUpdate(1, 100)
	fr.WriteRSTStream(1, http2.ErrCodeCancel)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: hb.Bytes(), EndHeaders: false})
	fr.WriteContinuation(3, true, nil)
	fr.WriteData(3, true, []byte("abc"))
	fr.WritePing(false, [8]byte{})
	fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	f.Add(seed.Bytes())
	p := h2TestProxy(f, func(c *Config) { c.PeekTimeout = time.Second })
	f.Fuzz(func(t *testing.T, frames []byte) {
		srv, cli := net.Pipe()
		done := make(chan struct{})
		var running sync.WaitGroup
		go func() {
			defer close(done)
			newH2Server(p, pipeAddrConn{srv}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				running.Add(1)
				defer running.Done()
				io.Copy(io.Discard, r.Body)
				io.WriteString(w, "ok")
			})).serve()
		}()
		go io.Copy(io.Discard, cli)
		cli.SetWriteDeadline(time.Now().Add(time.Second))
		io.WriteString(cli, http2.ClientPreface)
		cli.Write(frames)
		cli.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the server outlived its connection")
		}
		finished := make(chan struct{})
		go func() { running.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(5 * time.Second):
			t.Fatal("a handler outlived its connection")
		}
	})
}

// TestH2ServerMatchesXNet: requests that both servers serve reach the
// handler alike.
func TestH2ServerMatchesXNet(t *testing.T) {
	p := h2TestProxy(t, nil)
	ours := func(c net.Conn, h http.Handler) { newH2Server(p, c, h).serve() }
	for _, c := range []struct {
		fields []string
		end    bool
	}{
		{get("/v1/x?q=1"), true},
		{append(get("/v1/%2e%2e/a;b?x=%zz"), "cookie", "a", "cookie", "b", "x-multi", "1", "x-multi", "2"), true},
		{append(get("/up"), "content-length", "2", "expect", "100-continue", "trailer", "x-t"), false},
		{[]string{":method", "OPTIONS", ":scheme", "https", ":path", "*", "host", "a.test:1"}, true},
		{[]string{":method", "CONNECT", ":authority", "a.test:443"}, true},
	} {
		theirs, theySaw := h2Exchange(t, serveXNet, c.fields, c.end, []byte("ok"))
		got, weSaw := h2Exchange(t, ours, c.fields, c.end, []byte("ok"))
		if got != theirs || weSaw != theySaw || weSaw == "" {
			t.Errorf("%q:\n  here:  %s %s\n  x/net: %s %s", c.fields, got, weSaw, theirs, theySaw)
		}
	}
}

// TestH2ServerEndsWithTheProxy: closing the proxy ends its HTTP/2
// connections and cancels the requests they carry.
func TestH2ServerEndsWithTheProxy(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := &Proxy{ctx: ctx, log: slog.New(slog.DiscardHandler), cfg: Config{PeekTimeout: 5 * time.Second, IdleTimeout: time.Minute}}
	started, ended := make(chan struct{}), make(chan struct{})
	pc := startH2Peer(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
		close(ended)
	}))
	pc.headers(1, true, get("/wait")...)
	go pc.outcome(1) // reads what the server writes
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("the request never reached its handler")
	}
	cancel()
	for what, ch := range map[string]chan struct{}{"the connection": pc.done, "the request": ended} {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Errorf("%s outlived the proxy", what)
		}
	}
}
