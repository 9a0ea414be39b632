package tproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Server serves an intercepted HTTP/2 connection. It stands where x/net's
// http2.Server stood and reads frames with the same Framer and HPACK
// decoder (which bound header lists and CONTINUATION), but keeps what a
// proxy serving one request at a time needs to a minimum of hand-offs:
// the connection's goroutine reads frames and answers control frames
// itself, each request runs in a goroutine of its own that writes its
// answer straight to the connection (HEADERS and DATA in one write), and
// nothing else runs. x/net's server passes every frame, header block and
// write through its serve goroutine and a writer goroutine of its own:
// per request several goroutine wake-ups that this machine's profile put
// at half of the request's cost.
//
// Requests are checked as x/net's server checks them (pseudo-header
// fields, Host against :authority, connection-specific fields, the
// declared Content-Length against the DATA sent), flow control is kept on
// both sides, and a client is bounded in what it can make the proxy hold:
// streams open at once (h2MaxStreams), handlers still running after their
// streams were reset (h2MaxHandlers), body bytes buffered (the windows it
// was given), header lists (maxRequestHead).
type h2Server struct {
	p       *Proxy
	conn    net.Conn
	handler http.Handler
	tls     *tls.ConnectionState
	remote  string
	fr      *http2.Framer
	ctx     context.Context
	cancel  context.CancelFunc

	wmu     sync.Mutex // guards writes: fr's writing side, bw, enc and hbuf
	bw      *bufioWriter
	enc     *hpack.Encoder
	hbuf    bytes.Buffer
	werr    error       // of a write that failed: every later one fails with it
	broken  atomic.Bool // werr is set
	closing atomic.Bool // goAwayAndClose has begun: the write deadline stays short
	lowers  map[string]string
	// wdeadline is the connection's write deadline.
	wdeadline time.Time
	// maxFrame is the client's SETTINGS_MAX_FRAME_SIZE.
	maxFrame atomic.Uint32

	mu         sync.Mutex // guards the following fields and the streams'
	sendCond   sync.Cond  // on mu: a send window grew, or the connection ended
	streams    map[uint32]*h2Stream
	lastID     uint32 // the highest stream the client opened
	open       int    // streams in streams the client has not reset
	running    int    // handlers not yet returned
	waiting    int    // idle workers
	sendConn   int64  // what we may send on the connection
	initWindow int64  // the client's SETTINGS_INITIAL_WINDOW_SIZE
	// The connection's receive window: used is what the client has
	// sent that it has not been given back yet, free what of that the
	// proxy is done with (read or dropped), given back in WINDOW_UPDATEs
	// of at least a quarter of the window.
	connUsed, connFree int64
	closed             bool
	goAway             bool // the client sent GOAWAY: no new streams
	idleSince          time.Time
	// idleWorkers hands a request to an idle worker (see work).
	idleWorkers chan h2Job
	idle        *time.Timer
}

// bufioWriter gathers frames until a flush writes them in one write.
// Unlike a bufio.Writer it never writes on its own when full, so frames
// written together (HEADERS and DATA) leave together; a buffer grown past
// 64 KiB (a large header block) is let go after the flush.
type bufioWriter struct {
	w   io.Writer
	buf []byte
}

func (b *bufioWriter) Write(p []byte) (int, error) {
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *bufioWriter) Flush() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.w.Write(b.buf)
	if cap(b.buf) > 64<<10 {
		b.buf = nil
	} else {
		b.buf = b.buf[:0]
	}
	return err
}

const (
	// h2MaxStreams is the most streams a client may have open at once
	// (SETTINGS_MAX_CONCURRENT_STREAMS).
	h2MaxStreams = 100
	// h2MaxHandlers bounds the handlers running for one connection,
	// counting those of streams the client reset and opened again
	// (rapid reset): past it, the connection ends.
	h2MaxHandlers = 4 * h2MaxStreams
	// h2Window is the receive window of each stream and of the
	// connection: the most body bytes a client can make the proxy hold.
	h2Window = 1 << 20
	// h2Preface is what a client sends first.
	h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
)

// h2Stream is one request of an h2Server.
type h2Stream struct {
	s      *h2Server
	id     uint32
	ctx    context.Context
	cancel context.CancelFunc
	// The following fields are guarded by s.mu.
	cond       sync.Cond // on s.mu: body bytes came, or the body ended
	sendWindow int64
	body       []byte // received, not yet read
	bodyEnded  bool   // END_STREAM received
	bodyErr    error  // the body broke off (reset, malformed)
	bodyDone   bool   // the handler is done with the body: bytes are discarded
	declared   int64  // Content-Length, or -1
	received   int64  // body bytes received
	used, free int64  // the stream's receive window, as the connection's
	reset      bool   // by the client, or by us
	// trailer is the request's Trailer map, the handler's: its declared
	// keys are filled in by whoever reads the body to its end, from
	// trailers (received), never by the connection's goroutine.
	trailer    http.Header
	trailers   http.Header
	gotTrailer bool
	continue_  bool // the client waits for 100 Continue
	final      bool // the answer's final HEADERS are on their way: no 100 Continue after them
}

func newH2Server(p *Proxy, conn net.Conn, handler http.Handler) *h2Server {
	s := &h2Server{p: p, conn: conn, handler: handler, remote: conn.RemoteAddr().String(),
		streams: map[uint32]*h2Stream{}, sendConn: 65535, initWindow: 65535}
	s.maxFrame.Store(16384)
	s.sendCond.L = &s.mu
	s.idleWorkers = make(chan h2Job)
	if tc, ok := conn.(*tls.Conn); ok {
		st := tc.ConnectionState()
		s.tls = &st
	}
	s.bw = &bufioWriter{w: conn}
	s.fr = http2.NewFramer(s.bw, conn)
	s.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	s.fr.MaxHeaderListSize = maxRequestHead
	// The default SETTINGS_MAX_FRAME_SIZE, which the server does not
	// raise: the Framer's buffer grows to the largest frame read.
	s.fr.SetMaxReadFrameSize(16 << 10)
	s.enc = hpack.NewEncoder(&s.hbuf)
	return s
}

// serve serves the connection until the client closes it, breaks the
// protocol, sits idle for IdleTimeout, or the proxy closes; then it
// closes it.
func (s *h2Server) serve() {
	s.ctx, s.cancel = context.WithCancel(s.p.ctx)
	stop := context.AfterFunc(s.ctx, func() { s.conn.Close() })
	defer func() {
		stop()
		s.cancel()
		s.conn.Close()
		s.mu.Lock()
		s.closed = true
		if s.idle != nil {
			s.idle.Stop()
		}
		for _, st := range s.streams {
			s.breakStreamLocked(st, errClientGone)
		}
		s.sendCond.Broadcast()
		s.mu.Unlock()
	}()
	s.conn.SetReadDeadline(time.Now().Add(s.p.cfg.PeekTimeout))
	var preface [len(h2Preface)]byte
	if _, err := io.ReadFull(s.conn, preface[:]); err != nil || string(preface[:]) != h2Preface {
		return
	}
	s.conn.SetReadDeadline(time.Time{})
	s.wmu.Lock()
	s.fr.WriteSettings(
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: h2MaxStreams},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2Window},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxRequestHead},
	)
	s.fr.WriteWindowUpdate(0, h2Window-65535)
	err := s.flushLocked()
	s.wmu.Unlock()
	if err != nil {
		return
	}
	s.mu.Lock()
	s.idleSince = time.Now()
	s.idle = time.AfterFunc(s.p.cfg.IdleTimeout, s.checkIdle)
	s.mu.Unlock()
	s.fr.SetReuseFrames()
	for {
		f, err := s.fr.ReadFrame()
		if err == nil {
			err = s.frame(f)
		}
		if err != nil && !s.failed(err) {
			return
		}
	}
}

// failed acts on an error of reading or of acting on a frame and reports
// whether the connection goes on: a StreamError resets that stream, a
// ConnectionError (or a frame larger than allowed) ends the connection
// with GOAWAY, any other error ends it quietly.
func (s *h2Server) failed(err error) bool {
	var se http2.StreamError
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &se):
		s.resetStream(se.StreamID, se.Code)
		return true
	case errors.As(err, &ce):
		s.goAwayAndClose(http2.ErrCode(ce))
	case errors.Is(err, http2.ErrFrameTooLarge):
		s.goAwayAndClose(http2.ErrCodeFrameSize)
	}
	return false
}

var (
	errClientGone  = errors.New("client went away")
	errStreamReset = errors.New("stream reset by the client")
	errConnDone    = errors.New("the HTTP/2 connection is done")
	errFinal       = errors.New("the final answer has begun")
)

// frame acts on one frame the client sent; its error is failed's.
func (s *h2Server) frame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return s.headers(f)
	case *http2.DataFrame:
		return s.data(f)
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		return s.settings(f)
	case *http2.PingFrame:
		if f.IsAck() {
			return nil
		}
		s.wmu.Lock()
		defer s.wmu.Unlock()
		s.fr.WritePing(true, f.Data)
		return s.flushLocked()
	case *http2.WindowUpdateFrame:
		return s.windowUpdate(f)
	case *http2.RSTStreamFrame:
		s.mu.Lock()
		if f.StreamID > s.lastID {
			s.mu.Unlock()
			return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
		}
		if st := s.streams[f.StreamID]; st != nil {
			s.resetLocked(st, errStreamReset)
		}
		s.mu.Unlock()
		s.sendUpdates(nil)
		return nil
	case *http2.GoAwayFrame:
		s.mu.Lock()
		s.goAway = true
		done := len(s.streams) == 0
		s.mu.Unlock()
		if done {
			return io.EOF
		}
		return nil
	case *http2.PushPromiseFrame:
		return http2.ConnectionError(http2.ErrCodeProtocol) // only servers push
	case *http2.PriorityFrame:
		if f.StreamID == f.PriorityParam.StreamDep {
			return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeProtocol}
		}
		return nil
	}
	return nil // unknown frame types are ignored (RFC 9113, section 4.1)
}

// settings applies the client's SETTINGS and acknowledges them.
func (s *h2Server) settings(f *http2.SettingsFrame) error {
	if err := f.ForeachSetting(func(set http2.Setting) error { return set.Valid() }); err != nil {
		return err
	}
	var table *uint32
	s.mu.Lock()
	err := f.ForeachSetting(func(set http2.Setting) error {
		switch set.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(set.Val) - s.initWindow
			for _, st := range s.streams {
				if st.sendWindow+delta > 1<<31-1 {
					return http2.ConnectionError(http2.ErrCodeFlowControl)
				}
				st.sendWindow += delta
			}
			s.initWindow = int64(set.Val)
			s.sendCond.Broadcast()
		case http2.SettingMaxFrameSize:
			s.maxFrame.Store(set.Val)
		case http2.SettingHeaderTableSize:
			table = &set.Val
		}
		return nil
	})
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if table != nil {
		s.enc.SetMaxDynamicTableSizeLimit(*table)
	}
	s.fr.WriteSettingsAck()
	return s.flushLocked()
}

// windowUpdate grows a send window.
func (s *h2Server) windowUpdate(f *http2.WindowUpdateFrame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.StreamID == 0 {
		if s.sendConn+int64(f.Increment) > 1<<31-1 {
			return http2.ConnectionError(http2.ErrCodeFlowControl)
		}
		s.sendConn += int64(f.Increment)
		s.sendCond.Broadcast()
		return nil
	}
	if f.StreamID > s.lastID {
		return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
	}
	st := s.streams[f.StreamID]
	if st == nil || st.reset {
		return nil // closed
	}
	if st.sendWindow+int64(f.Increment) > 1<<31-1 {
		return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeFlowControl}
	}
	st.sendWindow += int64(f.Increment)
	s.sendCond.Broadcast()
	return nil
}

// data takes a DATA frame of a request body.
func (s *h2Server) data(f *http2.DataFrame) error {
	id, length := f.StreamID, int64(f.Length)
	s.mu.Lock()
	err := s.dataLocked(f, id, length)
	st := s.streams[id]
	s.mu.Unlock()
	s.sendUpdates(st)
	return err
}

func (s *h2Server) dataLocked(f *http2.DataFrame, id uint32, length int64) error {
	if id == 0 || id > s.lastID {
		return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
	}
	// The connection's window counts every DATA frame, whatever its
	// stream's state.
	if s.connUsed+length > h2Window {
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	s.connUsed += length
	st := s.streams[id]
	if st == nil || st.reset || st.bodyEnded || st.bodyDone || st.bodyErr != nil {
		// Closed, or its handler is done with the body: what it carries
		// is dropped and its room given back.
		s.connFree += length
		if st != nil && !st.reset && st.bodyEnded {
			return http2.StreamError{StreamID: id, Code: http2.ErrCodeStreamClosed}
		}
		return nil
	}
	if st.used+length > h2Window {
		s.connFree += length
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeFlowControl}
	}
	st.used += length
	data := f.Data()
	if pad := length - int64(len(data)); pad > 0 {
		st.free += pad // padding is never read
		s.connFree += pad
	}
	if n := st.received + int64(len(data)); st.declared >= 0 && (n > st.declared || f.StreamEnded() && n != st.declared) {
		s.connFree += int64(len(data)) // the padding is free already
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol}
	}
	st.received += int64(len(data))
	st.body = append(st.body, data...)
	if f.StreamEnded() {
		st.bodyEnded = true
	}
	st.cond.Broadcast()
	return nil
}

// sendUpdates gives back what is free of the connection's receive window,
// and of st's (st may be nil), once it is a quarter of the window.
func (s *h2Server) sendUpdates(st *h2Stream) {
	var conn, strm int64
	s.mu.Lock()
	if s.connFree >= h2Window/4 {
		conn, s.connUsed, s.connFree = s.connFree, s.connUsed-s.connFree, 0
	}
	if st != nil && !st.reset && !st.bodyEnded && st.bodyErr == nil && st.free >= h2Window/4 {
		strm, st.used, st.free = st.free, st.used-st.free, 0
	}
	if conn == 0 && strm == 0 {
		s.mu.Unlock()
		return
	}
	// Taken before s.mu is let go, as lockStream does: no update of a
	// stream follows its reset.
	s.wmu.Lock()
	s.mu.Unlock()
	defer s.wmu.Unlock()
	if conn > 0 {
		s.fr.WriteWindowUpdate(0, uint32(conn))
	}
	if strm > 0 {
		s.fr.WriteWindowUpdate(st.id, uint32(strm))
	}
	s.flushLocked()
}

// headers takes a HEADERS frame (with its CONTINUATIONs): a new request,
// or the trailers of one.
func (s *h2Server) headers(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if id%2 != 1 {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	s.mu.Lock()
	if st := s.streams[id]; st != nil {
		defer s.mu.Unlock()
		return s.trailersLocked(st, f)
	}
	if s.closed {
		s.mu.Unlock()
		return nil // closing: its GOAWAY says the stream was not taken
	}
	if id <= s.lastID {
		s.mu.Unlock()
		return http2.ConnectionError(http2.ErrCodeProtocol) // a stream gone by
	}
	s.lastID = id
	switch {
	case s.goAway:
		s.mu.Unlock()
		return nil
	case s.running >= h2MaxHandlers:
		// Streams reset and opened again faster than their handlers end.
		s.mu.Unlock()
		return http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
	case s.open >= h2MaxStreams:
		s.mu.Unlock()
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeRefusedStream}
	}
	s.mu.Unlock()
	req, st, code, why := s.newRequest(f)
	if st == nil {
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol}
	}
	s.mu.Lock()
	st.sendWindow = s.initWindow
	s.streams[id] = st
	s.open++
	s.running++
	s.mu.Unlock()
	j := h2Job{st, req, code, why}
	select {
	case s.idleWorkers <- j:
	default:
		go s.work(j)
	}
	return nil
}

// h2Job is a request for a worker to serve.
type h2Job struct {
	st   *h2Stream
	req  *http.Request
	code int
	why  string
}

// h2IdleWorkers is how many goroutines that served a request wait for the
// next one of their connection: the next request is handed to one instead
// of a goroutine started for it, whose stack would grow again through the
// handler.
const h2IdleWorkers = 2

// work serves j, then the requests handed to it while it waits for them
// as one of the idle workers.
func (s *h2Server) work(j h2Job) {
	for {
		s.run(j.st, j.req, j.code, j.why)
		if !s.wait(&j) {
			return
		}
	}
}

// wait makes its goroutine one of the connection's idle workers, unless
// h2IdleWorkers already are, until a request is handed to it (true) or
// the connection ends (false).
func (s *h2Server) wait(j *h2Job) bool {
	s.mu.Lock()
	if s.waiting >= h2IdleWorkers {
		s.mu.Unlock()
		return false
	}
	s.waiting++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.waiting--
		s.mu.Unlock()
	}()
	select {
	case *j = <-s.idleWorkers:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// trailersLocked takes the trailers of st's body.
func (s *h2Server) trailersLocked(st *h2Stream, f *http2.MetaHeadersFrame) error {
	switch {
	case st.reset:
		return nil
	case st.bodyEnded:
		return http2.StreamError{StreamID: st.id, Code: http2.ErrCodeStreamClosed}
	case st.gotTrailer:
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	st.gotTrailer = true
	if !f.StreamEnded() || len(f.PseudoFields()) > 0 {
		return http2.StreamError{StreamID: st.id, Code: http2.ErrCodeProtocol}
	}
	if st.declared >= 0 && st.received != st.declared {
		return http2.StreamError{StreamID: st.id, Code: http2.ErrCodeProtocol}
	}
	for _, hf := range f.RegularFields() {
		k := textproto.CanonicalMIMEHeaderKey(hf.Name)
		if !httpguts.ValidTrailerHeader(k) {
			return http2.StreamError{StreamID: st.id, Code: http2.ErrCodeProtocol}
		}
		if _, declared := st.trailer[k]; declared {
			if st.trailers == nil {
				st.trailers = http.Header{}
			}
			st.trailers[k] = append(st.trailers[k], hf.Value)
		}
	}
	st.bodyEnded = true
	st.cond.Broadcast()
	return nil
}

// connHeaders are header fields that name a connection's properties,
// which HTTP/2 has none of (RFC 9113, section 8.2.2).
var connHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade"}

// newRequest makes the request of a HEADERS frame, checked as x/net's
// server checks it; a nil stream means the frame is malformed (the stream
// is reset). A code other than 0 is an answer the request gets instead of
// the handler's, with why.
func (s *h2Server) newRequest(f *http2.MetaHeadersFrame) (req *http.Request, st *h2Stream, code int, why string) {
	method, scheme := f.PseudoValue("method"), f.PseudoValue("scheme")
	authority, path := f.PseudoValue("authority"), f.PseudoValue("path")
	if f.PseudoValue("protocol") != "" {
		return nil, nil, 0, "" // extended CONNECT is not offered
	}
	if method == "CONNECT" {
		if path != "" || scheme != "" || authority == "" {
			return nil, nil, 0, ""
		}
	} else if method == "" || path == "" || scheme != "https" && scheme != "http" {
		return nil, nil, 0, ""
	}
	header := make(http.Header, len(f.Fields))
	for _, hf := range f.RegularFields() {
		k := textproto.CanonicalMIMEHeaderKey(hf.Name)
		header[k] = append(header[k], hf.Value)
	}
	if host := header["Host"]; len(host) == 1 {
		if authority == "" {
			authority = host[0]
		} else if host[0] != authority {
			return nil, nil, 0, ""
		}
		delete(header, "Host")
	} else if len(host) > 1 {
		return nil, nil, 0, ""
	}
	if strings.IndexByte(authority, '@') >= 0 || authority != "" && !httpguts.ValidHostHeader(authority) {
		return nil, nil, 0, ""
	}
	var u *url.URL
	requestURI := path
	if method == "CONNECT" {
		u, requestURI = &url.URL{Host: authority}, authority
	} else {
		if path[0] != '/' && path != "*" {
			return nil, nil, 0, ""
		}
		var err error
		if u, err = url.ParseRequestURI(path); err != nil {
			return nil, nil, 0, ""
		}
	}
	st = &h2Stream{s: s, id: f.StreamID, declared: -1, bodyEnded: f.StreamEnded()}
	st.cond.L = &s.mu
	if cl := header["Content-Length"]; len(cl) > 0 {
		n, err := strconv.ParseUint(cl[0], 10, 63)
		if err != nil || len(cl) > 1 {
			return nil, nil, 0, ""
		}
		if st.bodyEnded && n != 0 {
			return nil, nil, 0, ""
		}
		st.declared = int64(n)
	}
	var contentLength int64
	if !st.bodyEnded {
		contentLength = st.declared
	}
	if httpguts.HeaderValuesContainsToken(header["Expect"], "100-continue") {
		delete(header, "Expect")
		st.continue_ = !st.bodyEnded
	}
	if cookies := header["Cookie"]; len(cookies) > 1 {
		header["Cookie"] = []string{strings.Join(cookies, "; ")}
	}
	for _, v := range header["Trailer"] {
		for _, k := range strings.Split(v, ",") {
			switch k = textproto.CanonicalMIMEHeaderKey(textproto.TrimString(k)); k {
			case "Transfer-Encoding", "Trailer", "Content-Length", "":
			default:
				if st.trailer == nil {
					st.trailer = http.Header{}
				}
				st.trailer[k] = nil
			}
		}
	}
	delete(header, "Trailer")
	st.ctx, st.cancel = context.WithCancel(s.ctx)
	req = &http.Request{
		Method: method, URL: u, Proto: "HTTP/2.0", ProtoMajor: 2, Header: header, Host: authority,
		RequestURI: requestURI, RemoteAddr: s.remote, ContentLength: contentLength, Trailer: st.trailer,
		Body: http.NoBody,
	}
	if scheme == "https" {
		req.TLS = s.tls
	}
	if !st.bodyEnded {
		req.Body = &h2Body{st: st}
	}
	req = req.WithContext(st.ctx)
	switch {
	case f.Truncated:
		code, why = http.StatusRequestHeaderFieldsTooLarge, "request header list larger than 1 MiB"
	default:
		for _, k := range connHeaders {
			if _, ok := header[k]; ok {
				code, why = http.StatusBadRequest, fmt.Sprintf("request header %q is not valid in HTTP/2", k)
			}
		}
		if te := header["Te"]; len(te) > 1 || len(te) == 1 && te[0] != "trailers" && te[0] != "" {
			code, why = http.StatusBadRequest, `request header "TE" may only be "trailers" in HTTP/2`
		}
	}
	return req, st, code, why
}

// run serves one request in its own goroutine, then ends its stream.
func (s *h2Server) run(st *h2Stream, req *http.Request, code int, why string) {
	w := &h2Response{st: st, header: http.Header{}, head: req.Method == http.MethodHead}
	complete := false
	defer func() {
		if v := recover(); v != nil && v != http.ErrAbortHandler {
			s.p.log.Error("intercepted request handler panicked", "panic", v, "stack", string(debug.Stack()))
		}
		if complete {
			complete = w.end() == nil
		}
		s.finish(st, complete)
	}()
	if code != 0 {
		http.Error(w, why, code)
	} else {
		s.handler.ServeHTTP(w, req)
	}
	complete = true
}

// finish ends st once its handler has returned: a stream whose answer did
// not complete is reset, as is one whose client is still sending a body
// nobody will read (with NO_ERROR: the answer stands, RFC 9113, section
// 8.1).
func (s *h2Server) finish(st *h2Stream, complete bool) {
	st.cancel()
	s.mu.Lock()
	delete(s.streams, st.id)
	s.running--
	code, reset := http2.ErrCodeInternal, !st.reset
	switch {
	case st.reset:
	case !complete:
	case st.bodyEnded && st.bodyErr == nil:
		reset = false
	default:
		code = http2.ErrCodeNo
	}
	if !st.reset {
		s.open--
	}
	st.reset, st.bodyDone = true, true
	s.dropBodyLocked(st) // a reader left behind (a Transport's) ends
	if len(s.streams) == 0 {
		s.idleSince = time.Now()
	}
	end := s.goAway && len(s.streams) == 0
	s.mu.Unlock()
	if reset {
		// On its own: a client still sending its body may take a reset
		// that came in the same TLS record as the answer for the
		// stream's end and fail the upload (curl 7.88 does).
		s.wmu.Lock()
		s.fr.WriteRSTStream(st.id, code)
		s.flushLocked()
		s.wmu.Unlock()
	}
	s.sendUpdates(nil)
	if end {
		s.conn.Close()
	}
}

// resetStream resets stream id for a malformed frame or request.
func (s *h2Server) resetStream(id uint32, code http2.ErrCode) {
	s.mu.Lock()
	if st := s.streams[id]; st != nil {
		s.resetLocked(st, fmt.Errorf("stream reset: %v", code))
	}
	s.mu.Unlock()
	s.wmu.Lock()
	s.fr.WriteRSTStream(id, code)
	s.flushLocked()
	s.wmu.Unlock()
	s.sendUpdates(nil)
}

// resetLocked marks st reset, by the client or by us, unless it is, and
// ends its request with err.
func (s *h2Server) resetLocked(st *h2Stream, err error) {
	if st.reset {
		return
	}
	st.reset = true
	s.open--
	s.breakStreamLocked(st, err)
}

// breakStreamLocked ends st's request: its body reads fail with err, its
// context ends, its writes stop, and what it holds of the body is dropped
// and given back to the connection's window (by the caller's
// sendUpdates), whether or not its handler has returned.
func (s *h2Server) breakStreamLocked(st *h2Stream, err error) {
	if st.bodyErr == nil {
		st.bodyErr = err
	}
	s.dropBodyLocked(st)
	s.sendCond.Broadcast()
	st.cancel()
}

// goAwayAndClose tells the client why the connection ends and ends it.
func (s *h2Server) goAwayAndClose(code http2.ErrCode) {
	s.mu.Lock()
	last := s.lastID
	s.mu.Unlock()
	// A write stuck behind a client that does not read holds s.wmu: the
	// deadline ends it first.
	s.closing.Store(true)
	s.conn.SetWriteDeadline(time.Now().Add(s.p.cfg.PeekTimeout))
	s.wmu.Lock()
	s.fr.WriteGoAway(last, code, nil)
	if s.werr == nil {
		s.bw.Flush() // under the deadline above, not flushLocked's
	}
	s.wmu.Unlock()
}

// checkIdle ends a connection that has had no stream for IdleTimeout.
func (s *h2Server) checkIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	idle := len(s.streams) == 0
	left := s.p.cfg.IdleTimeout - time.Since(s.idleSince)
	switch {
	case s.closed:
	case idle && left <= 0:
		s.closed = true
		go func() {
			s.goAwayAndClose(http2.ErrCodeNo)
			s.conn.Close()
		}()
	case idle:
		s.idle.Reset(left)
	default:
		s.idle.Reset(s.p.cfg.IdleTimeout)
	}
}

// refreshWriteDeadline keeps a write deadline between IdleTimeout/2 and
// IdleTimeout ahead, moving it only when it has come within IdleTimeout/2:
// a client that reads nothing for that long loses its connection, and a
// write costs no timer change. s.wmu is held.
func (s *h2Server) refreshWriteDeadline() {
	now := time.Now()
	if s.wdeadline.Sub(now) < s.p.cfg.IdleTimeout/2 && !s.closing.Load() {
		s.wdeadline = now.Add(s.p.cfg.IdleTimeout)
		s.conn.SetWriteDeadline(s.wdeadline)
	}
}

// flushLocked writes what is buffered; s.wmu is held.
func (s *h2Server) flushLocked() error {
	if s.werr != nil {
		s.bw.buf = s.bw.buf[:0]
		return s.werr
	}
	s.refreshWriteDeadline()
	if err := s.bw.Flush(); err != nil {
		s.werr = err
		s.broken.Store(true)
		s.conn.Close() // the reader ends too
	}
	return s.werr
}

// h2Body is a request's body as its handler reads it.
type h2Body struct{ st *h2Stream }

func (b *h2Body) Read(p []byte) (int, error) {
	st := b.st
	s := st.s
	s.mu.Lock()
	if st.continue_ {
		st.continue_ = false
		if len(st.body) == 0 && !st.bodyEnded && st.bodyErr == nil && !st.bodyDone && !st.final {
			s.mu.Unlock()
			if s.lockStream(st, true) == nil {
				s.writeHeadLocked(st.id, 100, nil, false)
				s.flushLocked()
				s.wmu.Unlock()
			}
			s.mu.Lock()
		}
	}
	for len(st.body) == 0 && !st.bodyEnded && st.bodyErr == nil && !st.bodyDone {
		st.cond.Wait()
	}
	var n int
	var err error
	switch {
	case st.bodyDone:
		err = http.ErrBodyReadAfterClose
	case len(st.body) > 0:
		n = copy(p, st.body)
		st.body = st.body[n:]
		if len(st.body) == 0 {
			st.body = nil
		}
		st.free += int64(n)
		s.connFree += int64(n)
	case st.bodyErr != nil:
		err = st.bodyErr
	default:
		err = io.EOF
		for k, vv := range st.trailers { // declared keys only
			st.trailer[k] = vv
		}
		st.trailers = nil
	}
	s.mu.Unlock()
	if n > 0 {
		s.sendUpdates(st)
	}
	return n, err
}

// Close ends the handler's use of the body: what is left is dropped.
func (b *h2Body) Close() error {
	st := b.st
	st.s.mu.Lock()
	st.bodyDone = true
	st.s.dropBodyLocked(st)
	st.s.mu.Unlock()
	st.s.sendUpdates(nil)
	return nil
}

// dropBodyLocked drops what st holds of its body unread, for the caller's
// sendUpdates to give back to the connection's window, and wakes its
// readers.
func (s *h2Server) dropBodyLocked(st *h2Stream) {
	s.connFree += int64(len(st.body))
	st.body = nil
	st.cond.Broadcast()
}

// h2Response is a request's answer as its handler writes it. A small
// answer leaves whole, HEADERS and DATA in one write, when the handler
// returns; a larger one as it comes, in DATA frames as the client's
// windows allow.
type h2Response struct {
	st       *h2Stream
	header   http.Header
	sent     http.Header // header as it was at WriteHeader: the head sent
	head     bool        // a HEAD request's: no body is sent
	status   int         // of the final answer, once written
	sentHead bool        // its HEADERS frame has been written
	clen     int64       // the Content-Length the handler set, or -1
	written  int64       // body bytes the handler wrote
	buf      []byte
	trailers []string // declared
}

// h2Buffered is how much of a body waits for more before it is sent.
const h2Buffered = 16 << 10

func (w *h2Response) Header() http.Header { return w.header }

func (w *h2Response) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if w.status != 0 {
		return
	}
	if code < 200 {
		// Informational: sent at once, the header map as it is.
		s := w.st.s
		if s.lockStream(w.st, false) == nil {
			s.writeHeadLocked(w.st.id, code, w.header, false)
			s.flushLocked()
			s.wmu.Unlock()
		}
		return
	}
	// What changes in the header after this is for trailers, as with
	// net/http's servers.
	w.status, w.sent = code, w.header.Clone()
	w.clen, w.trailers = responseFraming(w.sent, w.trailers)
}

// bodyAllowed reports whether an answer with status may have a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

func (w *h2Response) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	switch {
	case !bodyAllowed(w.status):
		return 0, http.ErrBodyNotAllowed
	case w.clen >= 0 && w.written+int64(len(p)) > w.clen:
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if w.head {
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	if len(w.buf) >= h2Buffered {
		if err := w.send(false); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (w *h2Response) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.send(false)
}

func (w *h2Response) Flush() { w.FlushError() }

// end sends what is left of the answer, and its trailers: the handler has
// returned. An answer shorter than its Content-Length is an error: the
// stream is reset rather than ended as if complete.
func (w *h2Response) end() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.clen >= 0 && w.written != w.clen && !w.head && bodyAllowed(w.status) {
		return http.ErrContentLength
	}
	if !w.sentHead && w.clen < 0 && !w.head && bodyAllowed(w.status) && len(w.trailers) == 0 && !w.undeclaredTrailers() {
		w.sent.Set("Content-Length", strconv.Itoa(len(w.buf)))
	}
	return w.send(true)
}

// undeclaredTrailers reports whether the handler set trailers it did not
// declare (with http.TrailerPrefix).
func (w *h2Response) undeclaredTrailers() bool {
	for k := range w.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

// trailerFields returns the trailers the handler set, once it is done.
func (w *h2Response) trailerFields() http.Header {
	var t http.Header
	add := func(k string, vv []string) {
		if len(vv) == 0 || !httpguts.ValidTrailerHeader(k) {
			return
		}
		if t == nil {
			t = http.Header{}
		}
		t[k] = append(t[k], vv...)
	}
	for _, k := range w.trailers {
		add(k, w.header[k])
	}
	for k, vv := range w.header {
		if name, ok := undeclaredTrailer(k); ok {
			add(name, vv)
		}
	}
	return t
}

// send writes the HEADERS frame if it has not left yet, then the body
// buffered, as DATA frames as the windows allow; with end, the stream's
// end too, after the trailers if any.
func (w *h2Response) send(end bool) error {
	st := w.st
	s := st.s
	var trailers http.Header
	if end {
		trailers = w.trailerFields()
	}
	endData := end && trailers == nil
	if !w.sentHead {
		w.sentHead = true
		s.mu.Lock()
		st.final = true
		s.mu.Unlock()
		if err := s.lockStream(st, false); err != nil {
			return err
		}
		s.writeHeadLocked(st.id, w.status, w.sent, endData && len(w.buf) == 0)
		if len(w.buf) == 0 && !end {
			s.flushLocked()
		}
		s.wmu.Unlock()
		if endData && len(w.buf) == 0 {
			return s.flushNow()
		}
	}
	data := w.buf
	for len(data) > 0 || endData {
		n, err := s.takeWindow(st, len(data))
		if err != nil {
			s.flushNow() // what went before, as far as it goes
			return err
		}
		last := n == len(data)
		if err := s.lockStream(st, false); err != nil {
			s.mu.Lock()
			s.sendConn += int64(n) // never sent: the client does not count it
			s.sendCond.Broadcast()
			s.mu.Unlock()
			return err
		}
		s.fr.WriteData(st.id, endData && last, data[:n])
		err = s.flushLocked()
		s.wmu.Unlock()
		if err != nil {
			return err
		}
		data = data[n:]
		if last {
			break
		}
	}
	w.buf = w.buf[:0]
	if trailers != nil {
		if err := s.lockStream(st, false); err != nil {
			return err
		}
		s.writeHeadLocked(st.id, 0, trailers, true)
		err := s.flushLocked()
		s.wmu.Unlock()
		return err
	}
	return nil
}

// lockStream takes s.wmu for a frame of st, unless st was reset or the
// connection is done, or for a 100 Continue (continue_) the final answer
// has begun. It is taken while s.mu is held: a reset, marked
// under s.mu and then written under s.wmu, comes after every frame of the
// stream written before it was marked, and none comes after it.
func (s *h2Server) lockStream(st *h2Stream, continue_ bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed || s.broken.Load():
		return errConnDone
	case st.reset:
		return errStreamReset
	case continue_ && st.final:
		return errFinal
	}
	s.wmu.Lock()
	return nil
}

// flushNow writes what is buffered.
func (s *h2Server) flushNow() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.flushLocked()
}

// takeWindow takes room for up to want bytes of st's body from the send
// windows, waiting until there is some; want 0 takes none and waits for
// nothing. Bytes buffered to be written are written before it waits.
func (s *h2Server) takeWindow(st *h2Stream, want int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		switch {
		case s.closed || s.broken.Load():
			return 0, errConnDone
		case st.reset:
			return 0, errStreamReset
		case want == 0:
			return 0, nil
		}
		n := min(int64(want), st.sendWindow, s.sendConn, int64(s.maxFrame.Load()))
		if n > 0 {
			st.sendWindow -= n
			s.sendConn -= n
			return int(n), nil
		}
		s.mu.Unlock()
		s.flushNow()
		s.mu.Lock()
		if min(st.sendWindow, s.sendConn) <= 0 && !s.closed && !st.reset {
			s.sendCond.Wait()
		}
	}
}

// writeHeadLocked writes a HEADERS frame (and CONTINUATIONs) with status
// (none for trailers) and header's fields that HTTP/2 carries; s.wmu is
// held.
func (s *h2Server) writeHeadLocked(id uint32, status int, header http.Header, end bool) {
	s.hbuf.Reset()
	if status != 0 {
		s.enc.WriteField(hpack.HeaderField{Name: ":status", Value: strconv.Itoa(status)})
	}
	for k, vv := range header {
		if !httpguts.ValidHeaderFieldName(k) || isConnHeader(k) {
			continue
		}
		lk := s.lower(k)
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				continue
			}
			s.enc.WriteField(hpack.HeaderField{Name: lk, Value: v})
		}
	}
	block := s.hbuf.Bytes()
	max := int(s.maxFrame.Load())
	first := true
	for first || len(block) > 0 {
		n := min(len(block), max)
		if first {
			s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block[:n], EndStream: end, EndHeaders: n == len(block)})
			first = false
		} else {
			s.fr.WriteContinuation(id, n == len(block), block[:n])
		}
		block = block[n:]
	}
}

func isConnHeader(k string) bool {
	for _, c := range connHeaders {
		if strings.EqualFold(k, c) {
			return true
		}
	}
	return false
}

// lower returns k in lower case, as HTTP/2 field names are, remembering
// the names it has seen (a bounded number).
func (s *h2Server) lower(k string) string {
	if lk, ok := s.lowers[k]; ok {
		return lk
	}
	lk := strings.ToLower(k)
	if s.lowers == nil {
		s.lowers = map[string]string{}
	}
	if len(s.lowers) < 64 {
		s.lowers[k] = lk
	}
	return lk
}
