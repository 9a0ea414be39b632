// Package testworld builds the world airlock's privileged end-to-end tests
// run in (docs/design.md §10): a "host" network namespace where airlockd runs,
// an "internet" namespace behind it with servers at 203.0.113.0/24 that log
// everything that reaches them (DNS, HTTP, UDP, a private service at
// 10.255.0.1 and a metadata service at 169.254.169.254), and helpers to run
// real clients as sandbox members through `airlock run`. Every name is
// unique per test, and everything is torn down in t.Cleanup, also when the
// test fails. Only addresses assigned to these test hosts are ever targeted.
package testworld

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	vnetns "github.com/vishvananda/netns"

	"github.com/airlockhq/airlock/dnsgate/dnsgatetest"
	"github.com/airlockhq/airlock/internal/testcerts"
	"github.com/airlockhq/airlock/internal/testenv"
)

// Addresses of the internet's hosts.
const (
	HostUplink = "203.0.113.254" // the host's address towards the internet
	InetRouter = "203.0.113.1"
	DNSAddr    = "203.0.113.53"
	WebAddr    = "203.0.113.10" // allowed.test: HTTP 80, HTTPS 443, a banner server on 22, UDP loggers on 443 and 9999
	DecoyAddr  = "203.0.113.66" // a second server that must never be reached through the proxy
	UDP53Addr  = "203.0.113.77" // a UDP logger on port 53 that is no DNS server
	Private    = "10.255.0.1"   // stand-in private service, HTTP on 80
	Metadata   = "169.254.169.254"
)

// World is one test's namespaces and servers.
type World struct {
	t    testing.TB
	id   string
	Host string // host namespace name (airlockd runs here)
	Inet string // internet namespace name
	Dir  string // scratch directory
	// CAFile holds the test CA that signed the internet's HTTPS server
	// (names allowed.test and other.test); point upstream_ca_file at it.
	CAFile string

	DNS *dnsgatetest.Server
	// DaemonLogLevel is airlockd's --log-level; "" means debug, which
	// tests read. Benchmarks set info: a debug line per connection is
	// work a production daemon does not do.
	DaemonLogLevel string

	mu   sync.Mutex // guards logs
	logs []string   // "proto addr ← from: data" lines of everything that reached the internet
}

// New builds a world. It needs root; see testenv.Privileged.
func New(t testing.TB) *World {
	t.Helper()
	testenv.Privileged(t)
	b := make([]byte, 3)
	rand.Read(b)
	id := hex.EncodeToString(b)
	w := &World{t: t, id: id, Host: "alt" + id + "h", Inet: "alt" + id + "i", Dir: t.TempDir()}
	t.Cleanup(w.teardown)

	w.ip("netns", "add", w.Host)
	w.ip("netns", "add", w.Inet)
	w.ip("-n", w.Host, "link", "set", "lo", "up")
	w.ip("-n", w.Inet, "link", "set", "lo", "up")
	up, down := "alt"+id+"u", "alt"+id+"d"
	w.ip("link", "add", up, "netns", w.Host, "type", "veth", "peer", "name", down, "netns", w.Inet)
	w.ip("-n", w.Host, "addr", "add", HostUplink+"/24", "dev", up)
	w.ip("-n", w.Host, "link", "set", up, "up")
	for _, a := range []string{InetRouter + "/24", DNSAddr + "/24", WebAddr + "/24", UDP53Addr + "/24", DecoyAddr + "/24", Private + "/32", Metadata + "/32"} {
		w.ip("-n", w.Inet, "addr", "add", a, "dev", down)
	}
	w.ip("-n", w.Inet, "link", "set", down, "up")
	// The host routes to the private and metadata services, and forwards
	// like a Docker host does: only airlock's rules keep sandboxes in.
	w.ip("-n", w.Host, "route", "add", Private+"/32", "via", InetRouter)
	w.ip("-n", w.Host, "route", "add", Metadata+"/32", "via", InetRouter)
	w.sh("ip", "netns", "exec", w.Host, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
	// The internet could answer sandboxes if anything were let through.
	w.ip("-n", w.Inet, "route", "add", "10.88.0.0/16", "via", HostUplink)

	w.DNS = &dnsgatetest.Server{
		A: map[string]string{"allowed.test": WebAddr, "other.test": WebAddr, "ssh.test": WebAddr,
			"api.allowed.test": WebAddr, "badcert.test": WebAddr, "unknown.example": WebAddr,
			"api.unknown.test": WebAddr, "generativelanguage.googleapis.com": WebAddr,
			"private.test": Private, "metadata.test": Metadata, "decoy.test": DecoyAddr,
			"*.bench.test": WebAddr,
			// Stand-ins for the python preset's registries, and hosts for
			// learn mode's proposal (e2e/presets_test.go).
			"pypi.org": WebAddr, "files.pythonhosted.org": WebAddr, "*.cdn.test": WebAddr, "pkgs.test": WebAddr},
		TXT: map[string]string{"allowed.test": "v=allowed", "unknown.test": "v=secret"},
	}
	w.InNetns(w.Inet, func() {
		if _, err := w.DNS.Start(DNSAddr + ":53"); err != nil {
			t.Errorf("internet DNS: %v", err)
		}
		for _, a := range []string{Private + ":80", Metadata + ":80", DecoyAddr + ":80", DecoyAddr + ":443"} {
			w.tcpLogger(a)
		}
		w.webServers()
		w.bannerServer(WebAddr + ":22")
		for _, a := range []string{WebAddr + ":443", WebAddr + ":9999", UDP53Addr + ":53"} {
			w.udpLogger(a)
		}
	})
	t.Cleanup(w.DNS.Close)
	return w
}

func (w *World) teardown() {
	for _, ns := range []string{w.Host, w.Inet} {
		// Deleting the namespaces takes their links, bridges, nftables
		// tables and routes with them.
		exec.Command("ip", "netns", "del", ns).Run()
	}
}

func (w *World) ip(args ...string) {
	w.t.Helper()
	w.sh("ip", args...)
}

func (w *World) sh(name string, args ...string) {
	w.t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		w.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// InNetns runs fn on a thread inside namespace ns. Sockets fn creates stay
// in ns. The thread is thrown away afterwards, never reused elsewhere. Call
// it from the test's goroutine.
func (w *World) InNetns(ns string, fn func()) {
	w.t.Helper()
	if err := inNetns(ns, fn); err != nil {
		w.t.Error(err)
	}
	if w.t.Failed() {
		w.t.FailNow()
	}
}

// inNetns is InNetns for any goroutine: it reports instead of failing.
func inNetns(ns string, fn func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		h, err := vnetns.GetFromName(ns)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", ns, err)
			return
		}
		defer h.Close()
		if err := vnetns.Set(h); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", ns, err)
			return
		}
		fn()
		errc <- nil
	}()
	return <-errc
}

func (w *World) record(line string) {
	w.mu.Lock()
	w.logs = append(w.logs, line)
	w.mu.Unlock()
}

// Reached returns what reached the internet's TCP and UDP loggers, one line
// each: "tcp 203.0.113.10:80 ← 10.88.0.2:41000" or "udp …: <bytes>".
func (w *World) Reached() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.logs...)
}

// serveTCP listens on addr, logs each connection as "KIND addr ← from",
// and hands it to handle on its own goroutine; handle closes it.
func (w *World) serveTCP(kind, addr string, handle func(net.Conn)) {
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		w.t.Errorf("%s server %s: %v", kind, addr, err)
		return
	}
	w.t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			w.record(fmt.Sprintf("%s %s ← %s", kind, addr, c.RemoteAddr()))
			go handle(c)
		}
	}()
}

// tcpLogger answers every connection with a tiny HTTP response, after
// reading the request head (a server that closes before reading makes its
// client's writes fail at random).
func (w *World) tcpLogger(addr string) {
	w.serveTCP("tcp", addr, func(c net.Conn) {
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		r := bufio.NewReader(c)
		for {
			l, err := r.ReadString('\n')
			if err != nil || l == "\r\n" || l == "\n" {
				break
			}
		}
		c.Write([]byte("HTTP/1.0 200 OK\r\nContent-Length: 8\r\n\r\ninternet"))
	})
}

// webServers serves HTTP on WebAddr:80 and HTTPS on WebAddr:443 (HTTP/1.1
// and HTTP/2) with a certificate from a fresh test CA (ECDSA P-256) for
// allowed.test, api.allowed.test, other.test, *.bench.test (names the
// benchmarks make up by the thousand) and WebAddr (not badcert.test), writes the CA to w.CAFile, and logs every request
// with its Host. "/" answers "internet"; "/bytes/N" answers N bytes, byte i
// being i%251; any path ending in "/blob/N" answers N bytes as fast as it
// can; "/sink" reads the whole request body and answers "got N".
func (w *World) webServers() {
	// badcert.test resolves here too, but the certificate does not name it.
	ca, leaf, err := testcerts.New([]string{"allowed.test", "api.allowed.test", "other.test", "*.bench.test"}, []net.IP{net.ParseIP(WebAddr)})
	if err != nil {
		w.t.Errorf("test certificates: %v", err)
		return
	}
	w.CAFile = filepath.Join(w.Dir, "upstream-ca.pem")
	if err := os.WriteFile(w.CAFile, ca, 0o644); err != nil {
		w.t.Errorf("write CA: %v", err)
		return
	}
	handler := func(scheme string) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			sni := ""
			if r.TLS != nil {
				sni = " sni " + r.TLS.ServerName
			}
			w.record(fmt.Sprintf("%s %s ← %s: %s %s host %s%s", scheme, r.Context().Value(http.LocalAddrContextKey), r.RemoteAddr, r.Method, r.URL.Path, r.Host, sni))
			if r.URL.Path == "/sink" {
				n, _ := io.Copy(io.Discard, r.Body)
				fmt.Fprintf(rw, "got %d", n)
				return
			}
			if i := strings.Index(r.URL.Path, "/blob/"); i >= 0 {
				n := r.URL.Path[i+len("/blob/"):]
				// N bytes from one buffer, as fast as the server can write.
				size, _ := strconv.ParseInt(n, 10, 64)
				rw.Header().Set("Content-Length", strconv.FormatInt(size, 10))
				for sent := int64(0); sent < size; {
					k := min(int64(len(blob)), size-sent)
					if _, err := rw.Write(blob[:k]); err != nil {
						return
					}
					sent += k
				}
				return
			}
			if n, ok := strings.CutPrefix(r.URL.Path, "/bytes/"); ok {
				size, _ := strconv.Atoi(n)
				rw.Header().Set("Content-Length", strconv.Itoa(size))
				buf := make([]byte, 32<<10)
				for sent := 0; sent < size; {
					k := min(len(buf), size-sent)
					for i := 0; i < k; i++ {
						buf[i] = byte((sent + i) % 251)
					}
					if _, err := rw.Write(buf[:k]); err != nil {
						return
					}
					sent += k
				}
				return
			}
			fmt.Fprint(rw, "internet")
		})
	}
	for _, s := range []struct {
		addr, scheme string
	}{{WebAddr + ":80", "http"}, {WebAddr + ":443", "https"}} {
		ln, err := net.Listen("tcp4", s.addr)
		if err != nil {
			w.t.Errorf("web server %s: %v", s.addr, err)
			return
		}
		srv := &http.Server{Handler: handler(s.scheme), ErrorLog: log.New(io.Discard, "", 0)}
		if s.scheme == "https" {
			srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{leaf}}
			go srv.ServeTLS(ln, "", "")
		} else {
			go srv.Serve(ln)
		}
		w.t.Cleanup(func() { srv.Close() })
	}
}

var blob = make([]byte, 1<<20)

// DirectClient makes a namespace routed to the internet through the host
// namespace without airlock (plain forwarding), for measuring the direct
// path: it crosses the same two veths a sandbox member's traffic does. Its
// address is 10.99.0.2; the host side is 10.99.0.1 on link "alt<id>c".
func (w *World) DirectClient() (ns, hostLink string) {
	w.t.Helper()
	ns, hostLink = "alt"+w.id+"c", "alt"+w.id+"c"
	w.ip("netns", "add", ns)
	w.t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	w.ip("-n", ns, "link", "set", "lo", "up")
	w.ip("link", "add", hostLink, "netns", w.Host, "type", "veth", "peer", "name", "eth0", "netns", ns)
	w.ip("-n", w.Host, "addr", "add", "10.99.0.1/24", "dev", hostLink)
	w.ip("-n", w.Host, "link", "set", hostLink, "up")
	w.ip("-n", ns, "addr", "add", "10.99.0.2/24", "dev", "eth0")
	w.ip("-n", ns, "link", "set", "eth0", "up")
	w.ip("-n", ns, "route", "add", "default", "via", "10.99.0.1")
	w.ip("-n", w.Inet, "route", "add", "10.99.0.0/24", "via", HostUplink)
	return ns, hostLink
}

// bannerServer speaks first, like SSH: it sends a banner, then echoes.
func (w *World) bannerServer(addr string) {
	w.serveTCP("banner", addr, func(c net.Conn) {
		defer c.Close()
		c.Write([]byte("SSH-2.0-testworld\r\n"))
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.Copy(c, c)
	})
}

func (w *World) udpLogger(addr string) {
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		w.t.Errorf("udp logger %s: %v", addr, err)
		return
	}
	w.t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			w.record(fmt.Sprintf("udp %s ← %s: %q", addr, from, buf[:n]))
		}
	}()
}

// Binaries builds airlockd and airlock once per test binary and returns
// their directory.
func Binaries(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "airlock-e2e-bin-")
		if err != nil {
			binErr = err
			return
		}
		root, err := moduleRoot()
		if err != nil {
			binErr = err
			return
		}
		cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/airlockd", "./cmd/airlock")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		binDir = dir
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binDir
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// RemoveBinaries removes what Binaries built; call it from TestMain once
// the tests are done.
func RemoveBinaries() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// Daemon is an airlockd process running in the world's host namespace.
type Daemon struct {
	w    *World
	cfg  string
	env  []string
	cmd  *exec.Cmd
	Log  *SyncBuffer
	done chan struct{}
}

// SyncBuffer collects a process's output, written and read from different
// goroutines.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// StartDaemon runs airlockd with the config file cfg in the host namespace,
// with env ("KEY=value") added to the environment, and waits until it says
// it is ready.
func (w *World) StartDaemon(cfg string, env ...string) *Daemon {
	w.t.Helper()
	return w.startDaemon(true, cfg, env...)
}

// StartRootDaemon runs airlockd with the config file cfg in the machine's
// own network namespace, where the Docker Engine puts containers, and waits
// until it is ready. Call RouteRoot first so it reaches the internet. The
// config must use a subnet and API port of its own; the test's cleanup
// tears its rules and bridges down.
func (w *World) StartRootDaemon(cfg string) *Daemon {
	w.t.Helper()
	return w.startDaemon(false, cfg)
}

func (w *World) startDaemon(inHost bool, cfg string, env ...string) *Daemon {
	w.t.Helper()
	bin := Binaries(w.t)
	d := &Daemon{w: w, Log: &SyncBuffer{}, done: make(chan struct{}), cfg: cfg, env: env}
	level := w.DaemonLogLevel
	if level == "" {
		level = "debug"
	}
	if inHost {
		d.cmd = exec.Command("ip", "netns", "exec", w.Host, filepath.Join(bin, "airlockd"), "--config", cfg, "--log-level", level)
	} else {
		d.cmd = exec.Command(filepath.Join(bin, "airlockd"), "--config", cfg, "--log-level", level)
	}
	d.cmd.Env = append(os.Environ(), env...)
	d.cmd.Stdout, d.cmd.Stderr = d.Log, d.Log
	if err := d.cmd.Start(); err != nil {
		w.t.Fatalf("start airlockd: %v", err)
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	w.t.Cleanup(func() {
		d.cmd.Process.Kill()
		<-d.done
		w.t.Logf("airlockd log:\n%s", d.Log.String())
	})
	exited := false
	ready := testenv.Poll(15*time.Second, func() bool {
		if strings.Contains(d.Log.String(), "airlockd ready") {
			return true
		}
		select {
		case <-d.done:
			exited = true
			return true
		default:
			return false
		}
	})
	switch {
	case exited:
		w.t.Fatalf("airlockd exited:\n%s", d.Log.String())
	case !ready:
		w.t.Fatalf("airlockd not ready after 15 s:\n%s", d.Log.String())
	}
	return d
}

// WaitLog waits up to 5 s until airlockd's log holds sub at least n times
// (records are written when the proxy is done with a connection or request,
// which may be just after the client is) and returns the log.
func (d *Daemon) WaitLog(sub string, n int) string {
	testenv.Poll(5*time.Second, func() bool { return strings.Count(d.Log.String(), sub) >= n })
	return d.Log.String()
}

// Kill kills airlockd with SIGKILL and waits for it to be gone.
func (d *Daemon) Kill() {
	d.cmd.Process.Kill()
	<-d.done
}

// Stop sends SIGTERM, as systemd does, and waits.
func (d *Daemon) Stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		d.w.t.Fatal("airlockd did not stop within 10 s of SIGTERM")
	}
}

// Signal sends sig to airlockd (`ip netns exec` execs it, so the process
// started is airlockd itself).
func (d *Daemon) Signal(sig os.Signal) {
	if err := d.cmd.Process.Signal(sig); err != nil {
		d.w.t.Errorf("signal airlockd: %v", err)
	}
}

// Pid is airlockd's process ID.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Exited reports whether airlockd has exited.
func (d *Daemon) Exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// Result is what a member's command did.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// Command returns the `airlock run` command that runs argv as a member of
// sandbox, not yet started.
func (w *World) Command(ctx context.Context, cfg, sandbox, source string, argv ...string) *exec.Cmd {
	bin := Binaries(w.t)
	args := append([]string{"netns", "exec", w.Host, filepath.Join(bin, "airlock"), "run", "--config", cfg, "--sandbox", sandbox, "--source", source, "--"}, argv...)
	return exec.CommandContext(ctx, "ip", args...)
}

// Run runs argv as a member of sandbox with `airlock run`, with a timeout.
func (w *World) Run(cfg, sandbox, source string, timeout time.Duration, argv ...string) Result {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := w.Command(ctx, cfg, sandbox, source, argv...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := Result{Stdout: out.String(), Stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.Code = ee.ExitCode()
	} else if err != nil {
		w.t.Fatalf("airlock run %v: %v", argv, err)
	}
	return r
}

// Start runs argv as a member in the background; the returned func waits
// for it.
func (w *World) Start(cfg, sandbox, source string, timeout time.Duration, argv ...string) func() Result {
	ch := make(chan Result, 1)
	go func() { ch <- w.Run(cfg, sandbox, source, timeout, argv...) }()
	return func() Result { return <-ch }
}

// DialHost connects from inside the host namespace, where airlockd's API
// listens on loopback.
func (w *World) DialHost(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	var err error
	if nerr := inNetns(w.Host, func() {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
	}); nerr != nil {
		return nil, nerr
	}
	return c, err
}

// HostClient is an HTTP client whose connections start in the host
// namespace.
func (w *World) HostClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: w.DialHost}}
}

// ForwardHost listens on a loopback port of the test's own namespace and
// forwards every connection to addr inside the host namespace, so that a
// browser outside can reach airlockd's API. It returns the local address.
func (w *World) ForwardHost(addr string) string {
	w.t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := w.DialHost(context.Background(), "tcp4", addr)
				if err != nil {
					return
				}
				defer up.Close()
				go io.Copy(up, c)
				io.Copy(c, up)
			}()
		}
	}()
	return ln.Addr().String()
}

// RouteRoot links the machine's own network namespace to the internet
// namespace (198.51.100.1 here, 198.51.100.2 there) and routes the
// internet's servers over it, for an airlockd that runs beside the Docker
// Engine. The route and link go when the test ends.
func (w *World) RouteRoot() {
	w.t.Helper()
	root, inet := "alt"+w.id+"r", "alt"+w.id+"n"
	w.ip("link", "add", root, "type", "veth", "peer", "name", inet, "netns", w.Inet)
	w.t.Cleanup(func() { exec.Command("ip", "link", "del", root).Run() })
	w.ip("addr", "add", "198.51.100.1/30", "dev", root)
	w.ip("link", "set", root, "up")
	w.ip("-n", w.Inet, "addr", "add", "198.51.100.2/30", "dev", inet)
	w.ip("-n", w.Inet, "link", "set", inet, "up")
	// Only the world's own hosts: other addresses of 203.0.113.0/24 may be
	// real ones on this machine's network (a package mirror, say).
	for _, a := range []string{DNSAddr, WebAddr, DecoyAddr, UDP53Addr} {
		w.ip("route", "add", a+"/32", "via", "198.51.100.2")
	}
}

// Teardown runs `airlockd --teardown` with the daemon's config, in the
// namespace it ran in.
func (d *Daemon) Teardown() (string, error) {
	bin := Binaries(d.w.t)
	args := d.cmd.Args
	var cmd *exec.Cmd
	if args[0] == "ip" {
		cmd = exec.Command("ip", "netns", "exec", d.w.Host, filepath.Join(bin, "airlockd"), "--config", d.cfg, "--teardown")
	} else {
		cmd = exec.Command(filepath.Join(bin, "airlockd"), "--config", d.cfg, "--teardown")
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Restart stops airlockd (SIGINT) and starts it again with the same config
// in the same namespace.
func (d *Daemon) Restart() *Daemon {
	d.w.t.Helper()
	d.Stop()
	return d.w.startDaemon(d.cmd.Args[0] == "ip", d.cfg, d.env...)
}

// HostExec runs a command in the host namespace and returns its output.
func (w *World) HostExec(args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", w.Host}, args...)...).CombinedOutput()
	return string(out), err
}
