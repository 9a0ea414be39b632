package e2e

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	neturl "net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestMemberHelper is not a test: the e2e tests run the test binary inside a
// sandbox member as a Go client, with the helper's arguments after "--":
//
//	dial ADDR          print "dial ok" or "dial failed: …"
//	listen ADDR SECS   serve "member" over TCP for SECS seconds, printing
//	                   "accepted from …" per connection
//	echo ADDR SECS     the same, but greet with "member N" and echo lines
//	hold ADDR MS       connect to a server that speaks first, read its banner,
//	                   wait MS ms, send "ping" and print "echo ok" if it
//	                   comes back, then print "closed" when the server or
//	                   the proxy ends the connection
//	dns SERVER NAME    one A query over UDP (2 s); print the addresses, or
//	                   "dns failed: …" (a stand-in for dig +short)
//	rate get URL       download URL; print "rate BYTES SECONDS MBIT/S"
//	rate post URL N    upload N bytes to URL (the world's /sink); the same
//
// and the benchmarks' load: conns, hold-tls, first-bytes (see
// each case).
func TestMemberHelper(t *testing.T) {
	args := helperArgs()
	if args == nil {
		t.Skip("helper process for the e2e tests; runs only inside a member")
	}
	switch args[0] {
	case "dial":
		// Prints "refused: …" unless an HTTP 200 comes back.
		c, err := net.DialTimeout("tcp4", args[1], 5*time.Second)
		if err != nil {
			fmt.Println("refused:", err)
			break
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.0\r\n\r\n")
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil || !strings.Contains(line, " 200 ") {
			fmt.Printf("refused: %q %v\n", line, err)
		} else {
			fmt.Println("ok:", strings.TrimSpace(line))
		}
	case "fetch":
		// fetch N URL: N concurrent GETs on fresh connections; each body must
		// be the /bytes/ pattern of the right length.
		n, _ := strconv.Atoi(args[1])
		want, _ := strconv.Atoi(args[2][strings.LastIndexByte(args[2], '/')+1:])
		client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, MaxConnsPerHost: 0}}
		var wg sync.WaitGroup
		var mu sync.Mutex
		good := 0
		var firstErr error
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := fetchOne(client, args[2], want)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					good++
				} else if firstErr == nil {
					firstErr = err
				}
			}()
		}
		wg.Wait()
		fmt.Printf("ok %d of %d (first error: %v)\n", good, n, firstErr)
	case "conns":
		// conns C N NAMES URL: N requests, C at a time, each on a new
		// connection (a full TLS handshake: no session cache); a "%d" in
		// URL becomes i mod NAMES. Prints "rate <conns/s> p50 <ms> p99 <ms>
		// failed <count>" (failures count in the latencies as an hour).
		c, _ := strconv.Atoi(args[1])
		n, _ := strconv.Atoi(args[2])
		names, _ := strconv.Atoi(args[3])
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		lat := make([]time.Duration, n)
		var next, failed atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range c {
			wg.Go(func() {
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
					url := args[4]
					if strings.Contains(url, "%d") {
						url = fmt.Sprintf(url, i%names)
					}
					t0 := time.Now()
					resp, err := client.Get(url)
					if err != nil {
						// An overloaded machine may stall a client past a
						// proxy's patience now and then; more than 1% fails the run.
						if int(failed.Add(1)) > n/100 {
							fmt.Println("conns error:", err)
							os.Exit(1)
						}
						lat[i] = time.Hour
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					lat[i] = time.Since(t0)
				}
			})
		}
		wg.Wait()
		el := time.Since(start)
		slices.Sort(lat)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		fmt.Printf("rate %.1f p50 %.3f p99 %.3f failed %d\n", float64(n-int(failed.Load()))/el.Seconds(), ms(lat[n/2]), ms(lat[n*99/100]), failed.Load())
	case "hold-tls":
		// hold-tls N URL: opens N TLS connections to URL's host (64 at a time),
		// sends one GET on each and reads the answer, prints "held N", then
		// keeps them all open until stdin closes.
		n, _ := strconv.Atoi(args[1])
		u, err := neturl.Parse(args[2])
		if err != nil {
			fmt.Println("hold:", err)
			os.Exit(1)
		}
		conns := make([]net.Conn, n)
		var next atomic.Int64
		var failed atomic.Int64
		var wg sync.WaitGroup
		for range 64 {
			wg.Go(func() {
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
					c, err := holdOne(u)
					if err != nil {
						if failed.Add(1) == 1 {
							fmt.Println("hold error:", err)
						}
						continue
					}
					conns[i] = c
				}
			})
		}
		wg.Wait()
		if f := failed.Load(); f > 0 {
			fmt.Printf("hold: %d of %d failed\n", f, n)
			os.Exit(1)
		}
		fmt.Println("held", n)
		io.Copy(io.Discard, os.Stdin)
	case "first-bytes":
		// first-bytes N URL: N requests one after another on new
		// connections, a "%d" in URL becoming i; prints "fb HOST <unix ns>"
		// when each response's first byte arrives.
		n, _ := strconv.Atoi(args[1])
		client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		for i := range n {
			url := fmt.Sprintf(args[2], i)
			var first time.Time
			req, _ := http.NewRequest("GET", url, nil)
			req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
				GotFirstResponseByte: func() { first = time.Now() },
			}))
			resp, err := client.Do(req)
			if err != nil {
				fmt.Println("first-bytes error:", err)
				os.Exit(1)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			fmt.Printf("fb %s %d\n", req.URL.Hostname(), first.UnixNano())
		}
	case "rate":
		// The time from the request to the end of the transfer: a burst
		// the queues let through at first counts, and is small against
		// the megabytes the tests move.
		client := &http.Client{Timeout: 120 * time.Second}
		var n int64
		start := time.Now()
		var resp *http.Response
		var err error
		if args[1] == "post" {
			size, _ := strconv.ParseInt(args[3], 10, 64)
			n = size
			resp, err = client.Post(args[2], "application/octet-stream", io.LimitReader(zeros{}, size))
		} else {
			resp, err = client.Get(args[2])
		}
		if err != nil {
			fmt.Println("rate error:", err)
			os.Exit(1)
		}
		var body bytes.Buffer
		got, err := io.Copy(&body, io.LimitReader(resp.Body, 64))
		if err == nil && args[1] != "post" {
			var rest int64
			rest, err = io.Copy(io.Discard, resp.Body)
			n = got + rest
		}
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || args[1] == "post" && body.String() != fmt.Sprintf("got %d", n) {
			fmt.Printf("rate error: %s %q %v\n", resp.Status, body.String(), err)
			os.Exit(1)
		}
		secs := time.Since(start).Seconds()
		fmt.Printf("rate %d %.3f %.2f\n", n, secs, float64(n)*8/secs/1e6)
	case "timed-get":
		// timed-get URL: prints "sent <unix ns>" and, when the response is
		// in, "done <unix ns> <status> <body>".
		client := &http.Client{Timeout: 60 * time.Second}
		fmt.Printf("sent %d\n", time.Now().UnixNano())
		resp, err := client.Get(args[1])
		if err != nil {
			fmt.Printf("error %v\n", err)
			break
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("done %d %d %s\n", time.Now().UnixNano(), resp.StatusCode, b)
	case "garbage":
		c, err := net.DialTimeout("tcp4", args[1], 5*time.Second)
		if err != nil {
			fmt.Println("refused:", err)
			break
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		junk := make([]byte, 64<<10)
		for i := range junk {
			junk[i] = byte(i * 7)
		}
		junk[0] = 0x16
		c.Write(junk)
		n, err := io.Copy(io.Discard, c)
		fmt.Printf("closed after reading %d bytes: %v\n", n, err)
	case "holdmany":
		// holdmany ADDR N SECS: N connections to a server that speaks
		// first, each counted held once its banner arrives, refused
		// otherwise; prints "held H refused R", then holds them SECS.
		n, _ := strconv.Atoi(args[2])
		secs, _ := strconv.Atoi(args[3])
		var conns []net.Conn
		refused := 0
		for range n {
			c, err := net.DialTimeout("tcp4", args[1], 5*time.Second)
			if err != nil {
				refused++
				continue
			}
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
				refused++
				c.Close()
				continue
			}
			conns = append(conns, c)
		}
		fmt.Printf("held %d refused %d\n", len(conns), refused)
		os.Stdout.Sync()
		time.Sleep(time.Duration(secs) * time.Second) // not a wait: the member holds its connections this long
		for _, c := range conns {
			c.Close()
		}
	case "hold":
		c, err := net.DialTimeout("tcp4", args[1], 5*time.Second)
		if err != nil {
			fmt.Println("refused:", err)
			break
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		r := bufio.NewReader(c)
		if _, err := r.ReadString('\n'); err != nil {
			fmt.Println("no banner:", err)
			break
		}
		ms, _ := strconv.Atoi(args[2])
		time.Sleep(time.Duration(ms) * time.Millisecond) // not a wait: the member keeps the connection idle this long
		fmt.Fprintf(c, "ping\n")
		if line, err := r.ReadString('\n'); err == nil && line == "ping\n" {
			fmt.Println("echo ok")
		} else {
			fmt.Printf("echo failed: %q %v\n", line, err)
		}
		io.Copy(io.Discard, r)
		fmt.Println("closed")
		c.Close()
	case "dns":
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(args[2]), dns.TypeA)
		r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, args[1])
		if err != nil {
			fmt.Println("dns failed:", err)
			break
		}
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				fmt.Println(a.A)
			}
		}
	case "storm":
		// Malformed and random datagrams to each address given.
		r := rand.New(rand.NewPCG(9, 9))
		n := 0
		for _, addr := range args[1:] {
			c, err := net.Dial("udp4", addr)
			if err != nil {
				fmt.Println("dial failed:", err)
				os.Exit(1)
			}
			for i := 0; i < 3000; i++ {
				b := make([]byte, r.IntN(512))
				for j := range b {
					b[j] = byte(r.UintN(256))
				}
				if i%2 == 0 && len(b) > 12 {
					b[2], b[3], b[4], b[5] = 0x01, 0x00, 0x00, 0x01 // looks like a query
				}
				c.Write(b)
				n++
			}
			c.Close()
		}
		fmt.Println("sent", n)
	case "echo":
		// echo ADDR SECS: like listen, but each connection gets a line
		// "member <n>" and then its own lines back until it closes, so it
		// stays open as long as the client wants.
		secs, _ := strconv.Atoi(args[2])
		ln, err := net.Listen("tcp4", args[1])
		if err != nil {
			fmt.Println("listen failed:", err)
			os.Exit(1)
		}
		go func() {
			for n := 1; ; n++ {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Println("accepted from", c.RemoteAddr())
				go func() {
					defer c.Close()
					fmt.Fprintf(c, "member %d\n", n)
					io.Copy(c, c)
				}()
			}
		}()
		time.Sleep(time.Duration(secs) * time.Second) // not a wait: the member listens this long
	case "listen":
		secs, _ := strconv.Atoi(args[2])
		ln, err := net.Listen("tcp4", args[1])
		if err != nil {
			fmt.Println("listen failed:", err)
			os.Exit(1)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Println("accepted from", c.RemoteAddr())
				c.Write([]byte("HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\nmember"))
				c.Close()
			}
		}()
		time.Sleep(time.Duration(secs) * time.Second) // not a wait: the member listens this long
	}
	os.Exit(0)
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// holdOne opens a TLS connection to u's host, trusting SSL_CERT_FILE,
// and completes one request on it.
func holdOne(u *neturl.URL) (net.Conn, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp4", u.Hostname()+":443", &tls.Config{ServerName: u.Hostname()})
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", u.RequestURI(), u.Host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

func fetchOne(c *http.Client, url string, want int) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 || len(b) != want {
		return fmt.Errorf("status %d, %d bytes", resp.StatusCode, len(b))
	}
	for i, v := range b {
		if v != byte(i%251) {
			return fmt.Errorf("byte %d is %d, want %d", i, v, i%251)
		}
	}
	return nil
}

func helperArgs() []string {
	for i, a := range os.Args {
		if a == "--" && i+1 < len(os.Args) {
			return os.Args[i+1:]
		}
	}
	return nil
}

// sh runs a command and returns its combined output.
func sh(args ...string) (string, error) {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	return string(out), err
}
