package tproxy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/policy"
)

// rawListen listens on a loopback port with a raw socket and returns its
// descriptor and port.
func rawListen(b *testing.B) (int, uint16) {
	b.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		b.Fatal(err)
	}
	if err := unix.Listen(fd, 1024); err != nil {
		b.Fatal(err)
	}
	sa, _ := unix.Getsockname(fd)
	return fd, uint16(sa.(*unix.SockaddrInet4).Port)
}

// rawUpstream serves connections on fd one at a time until fd is closed:
// it reads the client's first bytes, answers with a few of its own and
// closes, as a server answering one short request would. It makes raw
// system calls and allocates nothing per connection.
func rawUpstream(fd int) {
	buf := make([]byte, MaxPeek)
	reply := []byte("a short answer")
	for {
		c, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
		if err == unix.EINTR || err == unix.ECONNABORTED {
			continue
		}
		if err != nil {
			return
		}
		for {
			if _, err := unix.Read(c, buf); err != unix.EINTR {
				break
			}
		}
		unix.Write(c, reply)
		unix.Close(c)
	}
}

// rawExchange connects to port, sends hello, reads until the other side
// closes, then closes: one short connection, from a client that allocates
// nothing.
func rawExchange(b *testing.B, port uint16, hello, buf []byte) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	for {
		err = unix.Connect(fd, &unix.SockaddrInet4{Port: int(port), Addr: [4]byte{127, 0, 0, 1}})
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		b.Fatal(err)
	}
	if _, err := unix.Write(fd, hello); err != nil {
		b.Fatal(err)
	}
	got := 0
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			break
		}
		got += n
	}
	if got == 0 {
		b.Fatal("connection closed without an answer")
	}
}

// BenchmarkProxyConnection opens short connections one after another, as
// a package manager or git does: a TLS ClientHello for an allowed name on
// its fake IP, spliced to an upstream that answers a few bytes and closes.
// Each goes through accept, attribution, the name, the decision, the
// dial, the splice and the record. The client and the upstream make raw
// system calls and allocate nothing, so allocs/op are the proxy's per
// connection; "direct" is the same client talking to the upstream
// without the proxy.
func BenchmarkProxyConnection(b *testing.B) {
	upFD, upPort := rawListen(b)
	go rawUpstream(upFD)
	defer unix.Close(upFD)
	hello := clientHello(b, "allowed.test")
	buf := make([]byte, 4096)

	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		cpu := cpuTime()
		for b.Loop() {
			rawExchange(b, upPort, hello, buf)
		}
		reportCPU(b, cpu)
	})
	b.Run("proxied", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "app.yaml")
		os.WriteFile(path, []byte(rules(upPort, fmt.Sprintf("allowed.test:%d", upPort))), 0o644)
		sb, err := policy.OpenSandbox(policy.SandboxConfig{Name: "bench", Path: path})
		if err != nil {
			b.Fatal(err)
		}
		var records atomic.Int64
		p, err := New(Config{
			Sandbox: "bench",
			Listen:  netip.MustParseAddrPort("127.0.0.1:0"),
			Policy:  sb,
			Names:   names,
			Resolve: func(context.Context, string) ([]netip.Addr, error) {
				return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
			},
			Members:  func(netip.Addr) string { return "agent" },
			OnRecord: func(r Record) { records.Add(1) },
			Logger:   slog.New(slog.DiscardHandler),
			OrigDst: func(*net.TCPConn) (netip.AddrPort, error) {
				return netip.AddrPortFrom(fake("allowed.test"), upPort), nil
			},
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Start(); err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		port := p.Addr().Port()
		rawExchange(b, port, hello, buf)
		for records.Load() < 1 {
			time.Sleep(time.Millisecond)
		}
		b.ReportAllocs()
		b.ResetTimer()
		cpu := cpuTime()
		for range b.N {
			rawExchange(b, port, hello, buf)
		}
		// The record is written once the connection is done with: the
		// work per connection ends there.
		for records.Load() < int64(b.N)+1 {
			time.Sleep(100 * time.Microsecond)
		}
		reportCPU(b, cpu)
	})
}

// cpuTime returns the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU time per operation since start, in
// microseconds: the client's, the upstream's and the proxy's.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime()-start)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
}
