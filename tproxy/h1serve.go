package tproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// h1Server serves one intercepted HTTP/1.1 connection, request by request,
// in the connection's goroutine. It stands where an http.Server would and
// reads requests with the same parser (http.ReadRequest) and the same
// checks on top (version, Host, header names and values, Expect), but it
// spares every request what a keep-alive proxy does not need: a goroutine
// that reads ahead to notice a client that went away (it starts one only
// for a request still unanswered after watchAfter), a context tree per
// connection, a second buffer before the chunking writer, a header map per
// response.
type h1Server struct {
	p       *Proxy
	conn    net.Conn
	lim     *headLimit // under br: bounds a request head
	br      *bufio.Reader
	bw      *bufio.Writer
	tls     *tls.ConnectionState
	remote  string
	handler http.Handler
	header  http.Header // the response header map, cleared between requests
	keys    []string    // for writing the header sorted
	date    []byte
	head    []byte // a request head kept by startHead, while it is read
	// ctx is the requests' context, cancelled when the connection ends
	// or its client goes away.
	ctx    context.Context
	cancel context.CancelFunc
	// Each request's answer and watch, reused from one to the next (the
	// connection carries one at a time).
	w     h1Response
	watch clientWatch
	timer *time.Timer // starts the watch
}

const (
	// maxRequestHead bounds a request's line and headers, as
	// http.Server's default MaxHeaderBytes does (with its slack).
	maxRequestHead = 1<<20 + 4096
	// maxDrain is what is read of a request body the handler left unread
	// to keep the connection: more, and the connection is closed.
	maxDrain = 256 << 10
	// watchAfter is how long a request may take before its client is
	// watched for going away (which cancels the request's context).
	watchAfter = 50 * time.Millisecond
	// preHeadBuffer is how much of a body of unknown length is held back
	// so that a small one leaves with a Content-Length, not chunked.
	preHeadBuffer = 2 << 10
)

var errRequestHeadTooLarge = errors.New("request head larger than 1 MiB")

func newH1Server(p *Proxy, conn net.Conn, handler http.Handler) *h1Server {
	s := &h1Server{p: p, conn: conn, handler: handler, header: http.Header{}, remote: conn.RemoteAddr().String()}
	s.lim = &headLimit{r: conn, err: errRequestHeadTooLarge}
	s.br = bufio.NewReaderSize(s.lim, 4<<10)
	s.bw = bufio.NewWriterSize(conn, 4<<10)
	if tc, ok := conn.(*tls.Conn); ok {
		st := tc.ConnectionState()
		s.tls = &st
	}
	return s
}

// serve serves requests until the client closes, a request asks to, an
// answer cannot be framed for another to follow, the connection sits idle
// for IdleTimeout, or the proxy closes. The connection is closed when it
// returns, unless a handler took it over (an upgrade).
func (s *h1Server) serve() {
	hijacked := false
	defer func() {
		if !hijacked {
			s.conn.Close()
		}
	}()
	s.ctx, s.cancel = context.WithCancel(s.p.ctx)
	defer s.cancel()
	s.watch.s, s.watch.cancel = s, s.cancel
	s.timer = time.AfterFunc(time.Hour, s.watch.expire)
	s.timer.Stop()
	defer s.timer.Stop()
	for first := true; ; first = false {
		// Between requests the connection may idle; the first request, and
		// every head once it has begun, must come within PeekTimeout.
		wait := s.p.cfg.IdleTimeout
		if first {
			wait = s.p.cfg.PeekTimeout
		}
		s.conn.SetReadDeadline(time.Now().Add(wait))
		if _, err := s.br.Peek(1); err != nil {
			return
		}
		if !first {
			s.conn.SetReadDeadline(time.Now().Add(s.p.cfg.PeekTimeout))
		}
		s.startHead()
		req, err := http.ReadRequest(s.br)
		kept := s.lim.rec != nil
		s.lim.on, s.lim.rec = false, nil
		if err != nil {
			s.head = nil
			s.refuse(err)
			return
		}
		code, text := checkRequest(req)
		if code == 0 && req.URL.Host != "" {
			code, text = checkHostHeader(req, s.head, kept)
		}
		s.head = nil
		if code != 0 {
			s.replyError(code, text)
			return
		}
		s.conn.SetReadDeadline(time.Time{})
		var keep bool
		if keep, hijacked = s.serveRequest(req); !keep || hijacked {
			return
		}
	}
}

// startHead readies the reading of a request head. http.ReadRequest
// drops the Host header, and when the target is in absolute form (GET
// http://host/ HTTP/1.1) req.Host is the target's authority, not the
// header's; http.Server still refuses such a request without a Host
// header or with a malformed one. So the bytes of a head whose target may
// be in absolute form are kept in s.head, for checkHostHeader to read its
// header again. An origin-form target (a '/' after the method, as
// clients send it) keeps nothing.
func (s *h1Server) startHead() {
	s.lim.on, s.lim.left = true, maxRequestHead
	b, _ := s.br.Peek(s.br.Buffered())
	// The parser cuts the request line at its first space: the target
	// starts after it.
	if i := bytes.IndexByte(b, ' '); i >= 0 && i+1 < len(b) && (b[i+1] == '/' || b[i+1] == '*') {
		return
	}
	s.head = append(s.head[:0], b...)
	s.lim.rec = &s.head
}

// checkHostHeader applies http.Server's checks of the Host header to a
// request whose target was in absolute form, from its head's bytes (read
// with the parser http.ReadRequest uses). kept is false when startHead
// kept nothing, which it does only for targets that cannot be in absolute
// form: the request is refused rather than let through unchecked.
func checkHostHeader(req *http.Request, head []byte, kept bool) (int, string) {
	if !kept {
		return http.StatusBadRequest, "malformed request"
	}
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(head)))
	if _, err := tp.ReadLine(); err != nil {
		return http.StatusBadRequest, "malformed request"
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil {
		return http.StatusBadRequest, "malformed request"
	}
	// http.ReadRequest refused more than one.
	hosts := h["Host"]
	return checkHost(req, h.Get("Host"), len(hosts) > 0)
}

// checkHost applies http.Server's checks to a request's Host (present
// says whether it has one): an HTTP/1.1 request other than CONNECT needs
// one, and it must be well formed.
func checkHost(req *http.Request, host string, present bool) (int, string) {
	if req.ProtoAtLeast(1, 1) && !present && req.Method != http.MethodConnect {
		return http.StatusBadRequest, "missing required Host header"
	}
	if present && !httpguts.ValidHostHeader(host) {
		return http.StatusBadRequest, "malformed Host header"
	}
	return 0, ""
}

// checkRequest applies what http.Server checks on top of the parser, and
// returns the status and reason of a refusal, or 0. The Host header of a
// target in absolute form is checkHostHeader's.
func checkRequest(req *http.Request) (int, string) {
	if req.ProtoMajor != 1 {
		return http.StatusHTTPVersionNotSupported, "unsupported protocol version"
	}
	// The parser has taken Host out of the headers (and refused more
	// than one): req.Host is the request target's authority, else the
	// header's.
	if code, text := checkHost(req, req.Host, req.Host != ""); code != 0 {
		return code, text
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return http.StatusBadRequest, "invalid header name"
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return http.StatusBadRequest, "invalid header value"
			}
		}
	}
	if req.Header.Get("Expect") != "" && !httpguts.HeaderValuesContainsToken(req.Header["Expect"], "100-continue") {
		return http.StatusExpectationFailed, "unsupported Expect"
	}
	return 0, ""
}

// refuse answers a request that could not be read, as http.Server does:
// nothing for a connection that closed or timed out, 431 for a head too
// large, 501 for a transfer coding it does not know, 400 otherwise.
func (s *h1Server) refuse(err error) {
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.As(err, &ne) && ne.Timeout():
	case errors.Is(err, errRequestHeadTooLarge):
		s.replyError(http.StatusRequestHeaderFieldsTooLarge, "")
	case strings.Contains(err.Error(), "unsupported transfer encoding"):
		s.replyError(http.StatusNotImplemented, "Unsupported transfer encoding")
	default:
		s.replyError(http.StatusBadRequest, "")
	}
}

// replyError writes an error answer and lets the client read it before
// the connection closes.
func (s *h1Server) replyError(code int, text string) {
	body := strconv.Itoa(code) + " " + http.StatusText(code)
	if text != "" {
		body += ": " + text
	}
	s.conn.SetWriteDeadline(time.Now().Add(s.p.cfg.PeekTimeout))
	io.WriteString(s.bw, "HTTP/1.1 "+body+"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	s.bw.Flush()
	s.lingerClose()
}

// lingerClose closes the writing side and reads what the client still
// sends for a moment: closing a socket with unread bytes resets it, and a
// reset can take the answer with it.
func (s *h1Server) lingerClose() {
	if cw, ok := s.conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	s.conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	io.Copy(io.Discard, io.LimitReader(s.br, maxDrain))
}

// serveRequest runs the handler for req and finishes its answer. It
// reports whether the connection can carry another request, and whether
// the handler took it over.
func (s *h1Server) serveRequest(req *http.Request) (keep, hijacked bool) {
	req = req.WithContext(s.ctx)
	req.RemoteAddr, req.TLS = s.remote, s.tls
	clear(s.header)
	w, watch := &s.w, &s.watch
	*w = h1Response{s: s, req: req, header: s.header, clen: -1, trailers: w.trailers[:0], pending: w.pending[:0], watch: watch}
	// A body of its own for each request: a reader the handler left
	// behind (a Transport's write loop) may still hold the last one, and
	// must find it closed, not reading this request's bytes.
	body := &h1RequestBody{rc: req.Body, w: w, watch: watch}
	body.eof = req.Body == http.NoBody || req.ContentLength == 0
	watch.reset(body.eof)
	waitsForContinue := !body.eof && req.ProtoAtLeast(1, 1) && httpguts.HeaderValuesContainsToken(req.Header["Expect"], "100-continue")
	w.canContinue.Store(waitsForContinue)
	// Expect is answered here, never passed upstream (http.Server's way).
	req.Header.Del("Expect")
	req.Body = body
	// A request still unanswered after watchAfter has its client watched,
	// as http.Server watches every request: a client that goes away
	// cancels the requests' context (an approval it waits for, the
	// upstream exchange). Quick ones never pay for the watch.
	defer w.recordNow() // a request that ended otherwise
	ok := s.runHandler(w, req)
	gone := watch.stop()
	switch {
	case w.hijacked:
		return false, true
	case !ok, gone:
		return false, false
	}
	// Told to wait for 100 Continue and never told to go on, the client
	// never sent the body.
	neverSent := w.canContinue.Load()
	keep = w.finish()
	w.recordNow() // before what is left of the body is read: the client sets its pace
	// What the handler left of the body is read off, within reason, so
	// that the next request starts where it should.
	if ended := body.finish(!keep || neverSent); !ended {
		keep = false
		s.lingerClose()
	}
	return keep, false
}

// runHandler calls the handler; a panic (http.ErrAbortHandler from the
// ReverseProxy when an answer breaks off) ends the connection, as
// http.Server ends it.
func (s *h1Server) runHandler(w *h1Response, req *http.Request) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				s.p.log.Error("intercepted request handler panicked", "panic", v, "stack", string(debug.Stack()))
			}
			ok = false
		}
	}()
	s.handler.ServeHTTP(w, req)
	return true
}

// clientWatch reads ahead on a connection whose request is taking long,
// as http.Server's background read does for every request: bytes that
// arrive (a pipelined request) stay in the buffer; an error or the end of
// the connection cancels the request. It starts once the request is due
// (watchAfter) and its body has been read to the end, since the handler
// reads the body from the same buffer.
type clientWatch struct {
	s      *h1Server
	cancel context.CancelFunc

	mu sync.Mutex // guards the following fields
	// The timer (s.timer) is not set and stopped for each request, which
	// would wake the runtime's network poller each time: once set, it
	// stays set while requests follow each other, and when it fires for
	// a request that started since, it is set again for that one's due
	// time. It is left unset once no request is in flight.
	armed   bool
	start   time.Time // of the request in flight
	due     bool
	bodyEOF bool
	stopped bool
	done    chan struct{} // the read, once started
	gone    bool          // the client went away; read after stop
}

// reset readies the watch for the next request, whose body may have been
// read to its end already (it has none).
func (c *clientWatch) reset(bodyEOF bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.due, c.bodyEOF, c.stopped, c.done = false, bodyEOF, false, nil
	c.start = time.Now()
	if !c.armed {
		c.armed = true
		c.s.timer.Reset(watchAfter)
	}
}

// expire is the timer's: the request in flight is due, or will be.
func (c *clientWatch) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = false
	if c.stopped {
		return // no request in flight
	}
	if left := watchAfter - time.Since(c.start); left > 0 {
		c.armed = true
		c.s.timer.Reset(left)
		return
	}
	c.due = true
	c.startLocked()
}

// sawEOF is the body's: it has been read to its end.
func (c *clientWatch) sawEOF() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bodyEOF = true
	c.startLocked()
}

func (c *clientWatch) startLocked() {
	if !c.due || !c.bodyEOF || c.stopped || c.done != nil {
		return
	}
	c.done = make(chan struct{})
	go func() {
		defer close(c.done)
		if _, err := c.s.br.Peek(1); err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				c.gone = true
				c.cancel()
			}
		}
	}()
}

// stop ends the watch and waits for its read to return; the connection's
// read deadline is cleared again. It reports whether the client went away.
func (c *clientWatch) stop() (gone bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return c.gone
	}
	c.stopped = true
	if c.done != nil {
		c.s.conn.SetReadDeadline(time.Unix(1, 0))
		<-c.done
		c.s.conn.SetReadDeadline(time.Time{})
	}
	return c.gone
}

// h1RequestBody is a request's body as the handler reads it, which may
// be from another goroutine (the Transport's) and after the handler
// returned: it is locked, and closed to readers once the handler is done.
// It notes the end, and has 100 Continue sent before the first read when
// the client waits for it.
type h1RequestBody struct {
	w     *h1Response
	watch *clientWatch

	mu     sync.Mutex // guards the following fields
	rc     io.ReadCloser
	eof    bool
	closed bool
}

func (b *h1RequestBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		// Its answer is done: b.w may be the next request's.
		return 0, http.ErrBodyReadAfterClose
	}
	b.w.sendContinue()
	return b.readLocked(p)
}

func (b *h1RequestBody) readLocked(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof = true
		b.watch.sawEOF()
	}
	return n, err
}

// Close does not read the rest: finish does, once the handler is done.
func (b *h1RequestBody) Close() error { return nil }

// finish closes the body to the handler's readers and, unless skip, reads
// off up to maxDrain bytes of what they left, within PeekTimeout. It
// reports whether the body was read to its end.
func (b *h1RequestBody) finish(skip bool) bool {
	// A reader still waiting for bytes (a Transport's body writer, whose
	// upstream answered early) holds the lock: the deadline ends its
	// wait, at once when nothing more is to be read.
	if skip {
		b.w.s.conn.SetReadDeadline(time.Unix(1, 0))
	} else {
		b.w.s.conn.SetReadDeadline(time.Now().Add(b.w.s.p.cfg.PeekTimeout))
	}
	defer b.w.s.conn.SetReadDeadline(time.Time{})
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if !b.eof && !skip {
		io.CopyN(io.Discard, readerFunc(b.readLocked), maxDrain)
	}
	return b.eof
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// h1Response is the http.ResponseWriter of an h1Server's request.
type h1Response struct {
	s        *h1Server
	req      *http.Request
	header   http.Header
	status   int // 0 until WriteHeader
	hijacked bool
	// wroteHead: the head is in the buffer (or on the wire).
	wroteHead bool
	bodyless  bool  // no body by rule (HEAD, 1xx, 204, 304)
	clen      int64 // the declared Content-Length, or -1
	written   int64
	chunked   bool
	closing   bool     // the connection closes after this answer
	pending   []byte   // body held back before the head
	trailers  []string // declared in Trailer
	watch     *clientWatch
	// canContinue: the client waits for 100 Continue before it sends the
	// body, and the answer has not begun. The body's reader sends it
	// (maybe from another goroutine) under continueMu; whatever writes
	// the answer clears it first.
	canContinue atomic.Bool
	continueMu  sync.Mutex
	// record, when recordTo is set, is the request's record: the server
	// hands it to recordTo.finishRequest once the answer is finished (or
	// the request ended otherwise).
	record   RequestRecord
	recordTo *Proxy
}

// recordAfter has rec recorded by p once the answer is finished.
func (w *h1Response) recordAfter(p *Proxy, rec RequestRecord) {
	w.record, w.recordTo = rec, p
}

// recordNow records the request, if its handler left a record.
func (w *h1Response) recordNow() {
	if p := w.recordTo; p != nil {
		w.recordTo = nil
		p.finishRequest(w.record)
		w.record = RequestRecord{}
	}
}

// sendContinue sends 100 Continue if the client waits for it.
func (w *h1Response) sendContinue() {
	if !w.canContinue.Load() {
		return
	}
	w.continueMu.Lock()
	defer w.continueMu.Unlock()
	if w.canContinue.Load() {
		w.s.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		w.s.bw.Flush()
		w.canContinue.Store(false)
	}
}

// noContinue makes sure no 100 Continue is sent once the answer begins.
func (w *h1Response) noContinue() {
	if w.canContinue.Load() {
		w.continueMu.Lock()
		w.canContinue.Store(false)
		w.continueMu.Unlock()
	}
}

func (w *h1Response) Header() http.Header { return w.header }

func (w *h1Response) WriteHeader(code int) {
	if w.hijacked || w.status != 0 {
		return
	}
	w.noContinue()
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// Informational (103 Early Hints): out at once, with the headers
		// set so far; the final answer follows.
		bw := w.s.bw
		bw.WriteString("HTTP/1.1 " + strconv.Itoa(code) + " " + http.StatusText(code) + "\r\n")
		w.writeHeaderLines(bw, false)
		bw.WriteString("\r\n")
		bw.Flush()
		return
	}
	if code < 100 || code > 999 {
		panic("invalid WriteHeader code " + strconv.Itoa(code))
	}
	w.status = code
	w.bodyless = w.req.Method == http.MethodHead || code < 200 || code == http.StatusNoContent || code == http.StatusNotModified
	w.clen, w.trailers = responseFraming(w.header, w.trailers)
	if w.req.Close || !w.req.ProtoAtLeast(1, 1) || code == http.StatusSwitchingProtocols {
		w.closing = true
	}
	if w.clen >= 0 || w.bodyless {
		w.writeHead()
	}
}

func (w *h1Response) Write(p []byte) (int, error) {
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	w.noContinue()
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.bodyless {
		if w.req.Method == http.MethodHead {
			return len(p), nil
		}
		return 0, http.ErrBodyNotAllowed
	}
	if w.clen >= 0 && w.written+int64(len(p)) > w.clen {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if !w.wroteHead {
		if len(w.pending)+len(p) <= preHeadBuffer {
			w.pending = append(w.pending, p...)
			return len(p), nil
		}
		w.writeHead()
	}
	return len(p), w.writeBody(p)
}

func (w *h1Response) writeBody(p []byte) error {
	bw := w.s.bw
	if w.chunked && len(p) > 0 {
		bw.WriteString(strconv.FormatInt(int64(len(p)), 16))
		bw.WriteString("\r\n")
		bw.Write(p)
		_, err := bw.WriteString("\r\n")
		return err
	}
	_, err := bw.Write(p)
	return err
}

// writeHead puts the status line and the headers in the buffer, with the
// framing of the body: its declared or known length, chunked, or up to
// the end of the connection (HTTP/1.0).
func (w *h1Response) writeHead() {
	w.wroteHead = true
	bw := w.s.bw
	known := w.clen >= 0
	if !known && !w.bodyless {
		if w.req.ProtoAtLeast(1, 1) {
			w.chunked = true
		} else {
			w.closing = true
		}
	}
	bw.WriteString("HTTP/1.1 ")
	bw.WriteString(strconv.Itoa(w.status))
	bw.WriteByte(' ')
	bw.WriteString(http.StatusText(w.status))
	bw.WriteString("\r\n")
	w.writeHeaderLines(bw, true)
	if _, ok := w.header["Date"]; !ok {
		w.s.date = time.Now().UTC().AppendFormat(w.s.date[:0], http.TimeFormat)
		bw.WriteString("Date: ")
		bw.Write(w.s.date)
		bw.WriteString("\r\n")
	}
	if w.chunked {
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	if w.closing {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
	if len(w.pending) > 0 {
		p := w.pending
		w.pending = nil
		w.writeBody(p)
	}
}

// writeHeaderLines writes the header map sorted by name, as http.Server
// does, without the fields the framing owns; names that are not valid
// are dropped and line breaks in values become spaces.
func (w *h1Response) writeHeaderLines(bw *bufio.Writer, final bool) {
	keys := w.s.keys[:0]
	for k := range w.header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	w.s.keys = keys
	for _, k := range keys {
		switch k {
		case "Connection", "Transfer-Encoding", "Trailer", "Keep-Alive":
			continue
		}
		if strings.HasPrefix(k, http.TrailerPrefix) || !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range w.header[k] {
			bw.WriteString(k)
			bw.WriteString(": ")
			writeHeaderValue(bw, v)
			bw.WriteString("\r\n")
		}
	}
	if final && len(w.trailers) > 0 && w.clen < 0 && !w.bodyless && w.req.ProtoAtLeast(1, 1) {
		bw.WriteString("Trailer: ")
		bw.WriteString(strings.Join(w.trailers, ", "))
		bw.WriteString("\r\n")
	}
}

// writeHeaderValue writes v as Header.Write does: CR and LF as spaces,
// trimmed.
func writeHeaderValue(bw *bufio.Writer, v string) {
	if strings.ContainsAny(v, "\r\n") {
		v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
	}
	bw.WriteString(textproto.TrimString(v))
}

// responseFraming reads what a handler's header says of its answer's
// framing: the Content-Length (-1 for none; an invalid one is dropped
// from h) and the trailers declared, appended to trailers: names valid
// for a trailer only, as http.Server declares them (no other field
// written, none that frames or routes).
func responseFraming(h http.Header, trailers []string) (int64, []string) {
	clen := int64(-1)
	if cl := h.Get("Content-Length"); cl != "" {
		if v, err := strconv.ParseInt(cl, 10, 64); err == nil && v >= 0 {
			clen = v
		} else {
			h.Del("Content-Length")
		}
	}
	for _, v := range h["Trailer"] {
		for _, k := range strings.Split(v, ",") {
			if k = http.CanonicalHeaderKey(strings.TrimSpace(k)); httpguts.ValidHeaderFieldName(k) && httpguts.ValidTrailerHeader(k) && !slices.Contains(trailers, k) {
				trailers = append(trailers, k)
			}
		}
	}
	return clen, trailers
}

// FlushError sends what is buffered; a body of unknown length is chunked
// from here on.
func (w *h1Response) FlushError() error {
	if w.hijacked {
		return http.ErrHijacked
	}
	w.noContinue()
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.wroteHead {
		w.writeHead()
	}
	return w.s.bw.Flush()
}

func (w *h1Response) Flush() { w.FlushError() }

// Hijack hands the connection over (a WebSocket upgrade); the server
// leaves it alone from then on.
func (w *h1Response) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	if w.wroteHead {
		return nil, nil, errors.New("hijack after the answer began")
	}
	w.noContinue()
	w.watch.stop()
	w.hijacked = true
	w.s.conn.SetDeadline(time.Time{})
	return w.s.conn, bufio.NewReadWriter(w.s.br, w.s.bw), nil
}

// finish completes the answer after the handler returned and reports
// whether the connection can carry another request.
func (w *h1Response) finish() bool {
	w.noContinue()
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.wroteHead {
		// Everything fit before the head: it goes out with its length.
		w.clen = int64(len(w.pending))
		w.header.Set("Content-Length", strconv.Itoa(len(w.pending)))
		w.writeHead()
	}
	bw := w.s.bw
	if w.chunked {
		bw.WriteString("0\r\n")
		for _, k := range w.trailers {
			for _, v := range w.header[k] {
				bw.WriteString(k + ": ")
				writeHeaderValue(bw, v)
				bw.WriteString("\r\n")
			}
		}
		for k, vv := range w.header {
			if name, ok := undeclaredTrailer(k); ok {
				for _, v := range vv {
					bw.WriteString(name + ": ")
					writeHeaderValue(bw, v)
					bw.WriteString("\r\n")
				}
			}
		}
		bw.WriteString("\r\n")
	}
	if err := bw.Flush(); err != nil {
		return false
	}
	// A declared length not met leaves the client waiting for the rest.
	if w.clen >= 0 && w.written != w.clen && !w.bodyless {
		return false
	}
	return !w.closing
}

// undeclaredTrailer returns the trailer a header key set with
// http.TrailerPrefix names, in canonical form, and whether it may go out
// as one: a valid field name that is not a framing, routing or
// authentication field (httpguts.ValidTrailerHeader), as both servers
// send them.
func undeclaredTrailer(k string) (string, bool) {
	name, ok := strings.CutPrefix(k, http.TrailerPrefix)
	if !ok {
		return "", false
	}
	name = textproto.CanonicalMIMEHeaderKey(name)
	return name, httpguts.ValidHeaderFieldName(name) && httpguts.ValidTrailerHeader(name)
}
