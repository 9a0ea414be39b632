package tproxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/airlockhq/airlock/internal/testcerts"
	"github.com/airlockhq/airlock/internal/testenv"
)

// leanUpstream is an HTTPS server that answers every HTTP/1.1 request on a
// kept-alive connection with the same small response, allocating next to
// nothing, so that a benchmark's allocations are the proxy's.
func leanUpstream(b testing.TB) *upstream {
	caPEM, leaf, err := testcerts.New([]string{"api.allowed.test"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	up := &upstream{caFile: filepath.Join(b.TempDir(), "ca.pem")}
	os.WriteFile(up.caFile, caPEM, 0o644)
	ln, err := tls.Listen("tcp4", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{leaf}, NextProtos: []string{"http/1.1"}})
	if err != nil {
		b.Fatal(err)
	}
	up.httpsPort = uint16(ln.Addr().(*net.TCPAddr).Port)
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Sat, 21 Nov 2026 20:00:00 GMT\r\n\r\ninternet")
	var conns sync.WaitGroup
	b.Cleanup(func() { ln.Close(); conns.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					// A GET: its head, up to the blank line.
					for {
						l, err := br.ReadSlice('\n')
						if err != nil {
							return
						}
						if len(l) <= 2 {
							break
						}
					}
					if _, err := c.Write(answer); err != nil {
						return
					}
				}
			})
		}
	}()
	return up
}

// BenchmarkBumpKeepAlive measures intercepted requests over kept-alive
// client connections (conns at once, each one request at a time, as wrk
// and h2load do in make bench): the client's TLS terminated, each request
// decided, recorded and forwarded over a pooled upstream connection. The
// client and the upstream allocate next to nothing per request, so
// allocs/op is the proxy's.
func BenchmarkBumpKeepAlive(b *testing.B) {
	for _, proto := range []string{"h1", "h2"} {
		b.Run(proto, func(b *testing.B) {
			up := leanUpstream(b)
			var records atomic.Int64
			h, ca := newBumpHarness(b, up, netip.AddrPortFrom(fake("api.allowed.test"), up.httpsPort),
				rules(up.httpsPort, fmt.Sprintf("api.allowed.test:%d/v1/*", up.httpsPort)),
				func(c *Config) { c.OnRequest = func(RequestRecord) { records.Add(1) } })
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(ca.CertPEM())
			authority := "api.allowed.test:" + strconv.Itoa(int(up.httpsPort))
			const conns = 8
			clients := make([]benchClient, conns)
			for i := range clients {
				alpn := "http/1.1"
				if proto == "h2" {
					alpn = "h2"
				}
				c, err := tls.Dial("tcp4", h.proxy.Addr().String(), &tls.Config{ServerName: "api.allowed.test", RootCAs: roots, NextProtos: []string{alpn}})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { c.Close() })
				if proto == "h2" {
					clients[i] = newH2BenchClient(c, authority)
				} else {
					clients[i] = newH1BenchClient(c, authority)
				}
				// Warm: the upstream connection pooled, buffers grown.
				for range 10 {
					if err := clients[i].do(); err != nil {
						b.Fatal(err)
					}
				}
			}
			// The warm-up's records in, before they are counted from 0.
			testenv.Poll(5*time.Second, func() bool { return records.Load() >= conns*10 })
			b.ReportAllocs()
			b.ResetTimer()
			records.Store(0)
			cpu0 := cpuTime()
			var wg sync.WaitGroup
			errs := make(chan error, conns)
			for i, c := range clients {
				n := b.N / conns
				if i < b.N%conns {
					n++
				}
				wg.Go(func() {
					for range n {
						if err := c.do(); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			close(errs)
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
			// A request is recorded once its answer has left: the last
			// ones may still be on their way.
			testenv.Poll(5*time.Second, func() bool { return records.Load() >= int64(b.N) })
			if n := records.Load(); n != int64(b.N) {
				b.Fatalf("%d requests recorded, want %d", n, b.N)
			}
		})
	}
}

type benchClient interface{ do() error }

// h1BenchClient sends GETs as wrk does and reads the answers.
type h1BenchClient struct {
	c   net.Conn
	br  *bufio.Reader
	req []byte
}

func newH1BenchClient(c net.Conn, authority string) *h1BenchClient {
	return &h1BenchClient{c: c, br: bufio.NewReader(c), req: []byte("GET /v1/x HTTP/1.1\r\nHost: " + authority + "\r\n\r\n")}
}

func (c *h1BenchClient) do() error {
	if _, err := c.c.Write(c.req); err != nil {
		return err
	}
	status, length := false, -1
	for first := true; ; first = false {
		l, err := c.br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if first {
			status = bytes.HasPrefix(l, []byte("HTTP/1.1 200 "))
			continue
		}
		if len(l) <= 2 {
			break
		}
		if k, v, ok := bytes.Cut(l, []byte(":")); ok && bytes.EqualFold(k, []byte("Content-Length")) {
			length, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
	var body [8]byte
	if !status || length != len(body) {
		return fmt.Errorf("answer: status 200 %v, length %d", status, length)
	}
	if _, err := io.ReadFull(c.br, body[:]); err != nil || string(body[:]) != "internet" {
		return fmt.Errorf("body %q: %v", body, err)
	}
	return nil
}

// h2BenchClient sends GETs one at a time, as h2load -m1 does, and reads
// the answers.
type h2BenchClient struct {
	fr        *http2.Framer
	hb        bytes.Buffer
	enc       *hpack.Encoder
	authority string
	stream    uint32
	unacked   uint32 // DATA bytes not yet given back to the connection's window
}

func newH2BenchClient(c net.Conn, authority string) *h2BenchClient {
	io.WriteString(c, http2.ClientPreface)
	cl := &h2BenchClient{fr: http2.NewFramer(c, bufio.NewReader(c)), authority: authority, stream: 1}
	cl.fr.SetReuseFrames()
	cl.fr.WriteSettings()
	cl.enc = hpack.NewEncoder(&cl.hb)
	return cl
}

func (c *h2BenchClient) do() error {
	c.hb.Reset()
	for _, f := range [...]hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "https"},
		{Name: ":authority", Value: c.authority}, {Name: ":path", Value: "/v1/x"}, {Name: "user-agent", Value: "h2load nghttp2/1.52.0"}} {
		c.enc.WriteField(f)
	}
	id := c.stream
	c.stream += 2
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		return err
	}
	var body [16]byte
	n := 0
	status := false
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return err
		}
		end := false
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				c.fr.WritePing(true, f.Data)
			}
		case *http2.HeadersFrame:
			// Go's encoder sends ":status: 200" as static index 8.
			status = f.StreamID == id && len(f.HeaderBlockFragment()) > 0 && f.HeaderBlockFragment()[0] == 0x88
			end = f.StreamEnded()
		case *http2.DataFrame:
			n += copy(body[min(n, len(body)):], f.Data())
			end = f.StreamEnded()
			if c.unacked += uint32(len(f.Data())); c.unacked > 32<<10 {
				c.fr.WriteWindowUpdate(0, c.unacked)
				c.unacked = 0
			}
		case *http2.RSTStreamFrame:
			return fmt.Errorf("stream reset: %v", f.ErrCode)
		case *http2.GoAwayFrame:
			return fmt.Errorf("goaway: %v", f.ErrCode)
		}
		if end && f.Header().StreamID == id {
			break
		}
	}
	if !status || string(body[:min(n, len(body))]) != "internet" {
		return fmt.Errorf("answer: status 200 %v, body %q", status, body[:min(n, len(body))])
	}
	return nil
}
