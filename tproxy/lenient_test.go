package tproxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/airlockhq/airlock/policy"
)

// TestSilentClientKeptWhileServerSends: a server-first connection (the
// client silent past the sniff window) whose upstream keeps sending is not
// cut at IdleTimeout: only a connection idle both ways is, as the janitor
// cuts spliced ones.
func TestSilentClientKeptWhileServerSends(t *testing.T) {
	port := startFeed(t, -1, 50*time.Millisecond)
	const idle = 600 * time.Millisecond
	h := newHarness(t, nil, netip.AddrPortFrom(fake("allowed.test"), port), rules(port, fmt.Sprintf("allowed.test:%d", port)), func(c *Config) {
		c.SniffTimeout = 20 * time.Millisecond
		c.IdleTimeout = idle
	})
	c := h.connect(t, 10*time.Second)
	start := time.Now()
	r := bufio.NewReader(c)
	for time.Since(start) < 3*idle {
		if _, err := r.ReadString('\n'); err != nil {
			c.Close()
			waitRecords(t, h, 1)
			rec := h.Records()[0]
			t.Fatalf("the feed was cut after %s (IdleTimeout %s) while it sent a line every 50 ms: %v; record %s / %s",
				time.Since(start).Round(10*time.Millisecond), idle, err, rec.Verdict, rec.Reason)
		}
	}
	c.Close()
}

// TestSilentClientHalfClose: a server-first connection whose client never
// sends and shuts down its write side (nc -N, a script that closes stdin)
// gets the whole feed of its allowed upstream, and the record says allowed.
func TestSilentClientHalfClose(t *testing.T) {
	port := startFeed(t, 5, 100*time.Millisecond)
	h := newHarness(t, nil, netip.AddrPortFrom(fake("allowed.test"), port), rules(port, fmt.Sprintf("allowed.test:%d", port)), func(c *Config) {
		c.SniffTimeout = 20 * time.Millisecond
		c.IdleTimeout = 5 * time.Second
	})
	c := h.connect(t, 10*time.Second)
	time.Sleep(150 * time.Millisecond) // past the sniff window, the feed has begun
	c.(interface{ CloseWrite() error }).CloseWrite()
	got, err := io.ReadAll(c)
	c.Close()
	waitRecords(t, h, 1)
	rec := h.Records()[0]
	if err != nil || len(got) < len("tick 0\ntick 1\ntick 2\ntick 3\ntick 4\n") || rec.Verdict != policy.Allow {
		t.Errorf("half-closed silent client of an allowed feed: read %q, err %v; record %s / %q / close %q; want the whole feed and an allowed record",
			got, err, rec.Verdict, rec.Reason, rec.Close)
	}
}

// startFeed starts an upstream that sends lines ("tick N\n") every
// interval, then closes: after n of them, or never for n < 0. It returns
// its port (never a web port: the test skips then).
func startFeed(t *testing.T, n int, every time.Duration) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for i := 0; n < 0 || i < n; i++ {
					if _, err := fmt.Fprintf(c, "tick %d\n", i); err != nil {
						return
					}
					time.Sleep(every)
				}
			}()
		}
	}()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	if isWebPort(port) {
		t.Skip("ephemeral port is a web port")
	}
	return port
}
