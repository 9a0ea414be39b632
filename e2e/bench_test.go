package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
)

// quick is set by `make bench-quick`: the same code paths with less work.
var quick = os.Getenv("AIRLOCK_BENCH_QUICK") != ""

// scale is full for `make bench`, small for `make bench-quick`.
func scale(full, small int) int {
	if quick {
		return small
	}
	return full
}

// benchPath is one way from a client to the test internet's HTTPS server:
// direct, through a peer, or through airlock.
type benchPath struct {
	name string
	ca   string // CA file the client trusts; "" = the member's environment (the sandbox CA)
	pid  int    // the proxy's process, for CPU and memory figures; 0 = none
	// slow scales work down for a peer orders of magnitude slower
	// (mitmdump), so that the run stays short: sizes and counts are divided
	// by it. slowConns does the same for new-connection benchmarks only.
	slow, slowConns int
	noH2            bool // the path does not offer HTTP/2
	cmd             func(argv ...string) *exec.Cmd
}

// argv prefixes argv with the environment that makes Go clients and curl
// trust p's CA.
func (p benchPath) argv(argv []string) []string {
	if p.ca == "" {
		return argv
	}
	return append([]string{"env", "SSL_CERT_FILE=" + p.ca, "CURL_CA_BUNDLE=" + p.ca}, argv...)
}

func (p benchPath) run(argv ...string) (string, error) {
	cmd := p.cmd(p.argv(argv)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%v: %s", err, stderr.String())
	}
	return string(out), nil
}

// runCPU runs argv as run does and also returns what the path's proxy
// used while argv ran: from when argv starts inside the path's namespace
// or member to when it ends, so that setting up and tearing down a member
// is not counted. A path without a proxy gives zero use.
func (p benchPath) runCPU(argv ...string) (string, usage, error) {
	if p.pid == 0 {
		out, err := p.run(argv...)
		return out, usage{}, err
	}
	script := `echo @ready; read go; "$@"; rc=$?; echo @done; exit $rc`
	cmd := p.cmd(p.argv(append([]string{"sh", "-c", script, "sh"}, argv...))...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", usage{}, err
	}
	defer cmd.Wait()
	br := bufio.NewReader(stdout)
	if l, err := br.ReadString('\n'); l != "@ready\n" {
		cmd.Process.Kill()
		return l, usage{}, fmt.Errorf("%v: %s", err, stderr.String())
	}
	u0 := used(p.pid)
	io.WriteString(stdin, "go\n")
	var out strings.Builder
	u := usage{ticks: -1}
	for {
		l, err := br.ReadString('\n')
		if l == "@done\n" {
			u1 := used(p.pid)
			u = usage{ticks: u1.ticks - u0.ticks, switches: u1.switches - u0.switches}
			continue
		}
		out.WriteString(l)
		if err != nil {
			break
		}
	}
	if err := cmd.Wait(); err != nil || u.ticks < 0 {
		return out.String(), usage{}, fmt.Errorf("%v: %s", err, stderr.String())
	}
	return out.String(), u, nil
}

// usPer is CPU time in clock ticks as microseconds per unit of work.
func usPer(ticks int64, units float64) float64 { return float64(ticks) * 1e6 / clockTicks / units }

// clockTicks is the kernel's USER_HZ, the unit of utime and stime in
// /proc/PID/stat: 100 on every Linux architecture Go supports.
const clockTicks = 100

// rounds is how many times each speed figure is measured: this machine
// stalls now and then, whatever runs, so a figure is the median of several
// runs, shown with their spread.
var rounds = scale(3, 1)

// figures are one run's measurements, by unit.
type figures map[string]float64

// benchRounds measures each path rounds times, the paths taking turns
// within each round so that a slow spell of the machine falls on all of
// them alike, and reports each path as sub-benchmark label/path: every
// unit's median, with the spread of the runs as UNIT-min and UNIT-max,
// and failed summed over the runs.
func benchRounds(b *testing.B, label string, paths []benchPath, measure func(b *testing.B, p benchPath, round int) figures) {
	b.Run(label, func(b *testing.B) {
		got := make([]map[string][]float64, len(paths))
		for i := range got {
			got[i] = map[string][]float64{}
		}
		for r := range rounds {
			for i, p := range paths {
				for u, v := range measure(b, p, r) {
					got[i][u] = append(got[i][u], v)
				}
			}
		}
		for i, p := range paths {
			b.Run(p.name, func(b *testing.B) {
				for u, vs := range got[i] {
					if u == "failed" {
						var n float64
						for _, v := range vs {
							n += v
						}
						if n > 0 {
							b.ReportMetric(n, u)
						}
						continue
					}
					slices.Sort(vs)
					b.ReportMetric(vs[(len(vs)-1)/2], u)
					if len(vs) > 1 {
						b.ReportMetric(vs[0], u+"-min")
						b.ReportMetric(vs[len(vs)-1], u+"-max")
					}
				}
			})
		}
	})
}

// div is n scaled down for a slow path.
func (p benchPath) div(n int) int { return n / max(p.slow, 1) }

// nsPath runs clients in namespace ns.
func nsPath(name, ns, ca string, pid int) benchPath {
	return benchPath{name: name, ca: ca, pid: pid, cmd: func(argv ...string) *exec.Cmd {
		return exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	}}
}

// memberPath runs clients as members of sandbox sbA with `airlock run`.
func memberPath(w *testworld.World, cfg, ca string, d *testworld.Daemon) benchPath {
	return benchPath{name: "airlock", ca: ca, pid: d.Pid(), cmd: func(argv ...string) *exec.Cmd {
		return w.Command(context.Background(), cfg, sbA, "bench", argv...)
	}}
}

// pick returns the paths named, in the order of paths.
func pick(paths []benchPath, names ...string) []benchPath {
	var out []benchPath
	for _, p := range paths {
		if slices.Contains(names, p.name) {
			out = append(out, p)
		}
	}
	return out
}

// benchWorld builds a world for the proxy benchmarks: airlockd (logging at
// info, as in production; the exfiltration guard's cap lifted, since the
// benchmarks make up thousands of names) with sandbox sbA under policy, and a direct
// client. It returns the config file, the daemon and the direct path.
func benchWorld(b *testing.B, policy string) (*testworld.World, string, *testworld.Daemon, benchPath) {
	w := testworld.New(b)
	w.DaemonLogLevel = "info"
	policyA := filepath.Join(w.Dir, "app.yaml")
	os.WriteFile(policyA, []byte(policy), 0o644)
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("state_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nupstream_ca_file: %[5]s\nexfil:\n  max_subdomains_per_minute: 1000000\nlimits:\n  member_connections: 1000000\n  sandbox_connections: 1000000\n  member_held: 100000\n  sandbox_held: 100000\nsandboxes:\n  - name: %[3]s\n    subnet: 10.88.0.0/24\n    policy: %[4]s\n",
		w.Dir, testworld.DNSAddr, sbA, policyA, w.CAFile)), 0o644)
	d := w.StartDaemon(cfg)
	direct, _ := w.DirectClient()
	netnsResolv(b, direct)
	// Tens of thousands of connections to one server in a few minutes:
	// let the host reuse ports in TIME_WAIT (benchmark plumbing).
	for _, ns := range []string{w.Host, direct} {
		nsRun(ns, "sysctl", "-q", "-w", "net.ipv4.tcp_tw_reuse=1", "net.ipv4.ip_local_port_range=1024 65000")
	}
	return w, cfg, d, nsPath("direct", direct, w.CAFile, 0)
}

// peer is a peer proxy that startPeer runs.
type peer struct {
	ns   string // the client namespace whose TCP the host sends to it
	host string // the world's host namespace, where it runs
	argv []string
	env  []string
	cmd  *exec.Cmd
	log  *testworld.SyncBuffer
}

// startPeer runs a peer proxy (argv) in the world's host namespace and a
// client namespace on network NET (such as "10.98.0") whose TCP the host
// DNATs to NET.1:port, where the peer listens. The peer's output is
// logged when the benchmark fails.
func startPeer(b *testing.B, w *testworld.World, net, port string, env []string, argv ...string) *peer {
	b.Helper()
	p := &peer{ns: nsName(w, strings.Split(net, ".")[1]), host: w.Host, argv: argv, env: env, log: &testworld.SyncBuffer{}}
	setupDNATClient(b, w, p.ns, net, net+".1:"+port)
	nsRun(p.ns, "sysctl", "-q", "-w", "net.ipv4.ip_local_port_range=1024 65000")
	p.start(b)
	b.Cleanup(func() {
		p.stop()
		if b.Failed() {
			b.Logf("%s:\n%s", argv[0], p.log.String())
		}
	})
	return p
}

func (p *peer) start(b *testing.B) {
	b.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", p.host}, p.argv...)...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	// Its own process group, so that the processes it forks go with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p.cmd = cmd
}

// stop kills the peer and every process it forked, and waits for it.
func (p *peer) stop() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd.Wait()
}

// pid is the peer's process ID, for its CPU and memory figures.
func (p *peer) pid() int { return p.cmd.Process.Pid }

// path is the way through the peer for clients that trust ca.
func (p *peer) path(name, ca string) benchPath { return nsPath(name, p.ns, ca, p.pid()) }

// freshen restarts the proxies of paths, airlockd with them, and waits
// until each serves again, so that the rows after the idle rows measure
// fresh processes rather than ones that have just held and let go of
// thousands of connections (see "Order" in scripts/bench-notes.md). It
// returns the paths with their new processes and the new daemon.
func freshen(b *testing.B, w *testworld.World, cfg string, d *testworld.Daemon, paths []benchPath, peers map[string]*peer) ([]benchPath, *testworld.Daemon) {
	b.Helper()
	out := slices.Clone(paths)
	for i, p := range out {
		switch {
		case p.name == "airlock":
			d = d.Restart()
			out[i] = memberPath(w, cfg, p.ca, d)
		case peers[p.name] != nil:
			pr := peers[p.name]
			pr.stop()
			pr.start(b)
			out[i].pid = pr.pid()
		default:
			continue
		}
		waitServing(b, out[i])
	}
	return out, d
}

// waitServing waits until p fetches the internet's front page.
func waitServing(b *testing.B, p benchPath) {
	b.Helper()
	var out string
	var err error
	if testenv.Poll(30*time.Second, func() bool {
		out, err = p.run("curl", "-sS", "--max-time", "5", "https://allowed.test/")
		return out == "internet"
	}) {
		return
	}
	b.Fatalf("%s not serving after 30 s: %q %v", p.name, out, err)
}

// procTree is pid and all its descendants: sslsplit and squid work in
// child processes.
func procTree(pid int) []int {
	if pid == 0 {
		return nil
	}
	out := []int{pid}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			c, _ := strconv.Atoi(f)
			out = append(out, procTree(c)...)
		}
	}
	return out
}

// usage is what a proxy used: CPU time (user and system, in clock ticks
// of 1/100 s) and context switches of its threads (each time one of them
// stopped running, because it waited or was made to yield).
type usage struct {
	ticks, switches int64
}

// per adds u per unit of work to f: "cpu-us/UNIT" and "switches/UNIT",
// for n units.
func (u usage) per(f figures, unit string, n float64) {
	f["cpu-us/"+unit] = usPer(u.ticks, n)
	f["switches/"+unit] = float64(u.switches) / n
}

// used is what pid and its descendants have used so far.
func used(pid int) usage {
	var u usage
	for _, p := range procTree(pid) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		// Fields after the command name, which may hold spaces: state is
		// field 3, utime 14, stime 15.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		u.ticks += ut + st
		// Switches are counted per thread: the process's own line has only
		// its first thread's.
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", p))
		for _, t := range tasks {
			b, _ := os.ReadFile(t)
			for _, l := range strings.Split(string(b), "\n") {
				if k, v, ok := strings.Cut(l, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
					n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					u.switches += n
				}
			}
		}
	}
	return u
}

// rssKiB is the resident memory of pid and its descendants.
func rssKiB(pid int) int64 {
	var n int64
	for _, p := range procTree(pid) {
		n += ownRSSKiB(p)
	}
	return n
}

// benchDownload fetches size bytes (scaled down on slow paths) with curl
// pinned to CPU 1, in streams parallel downloads, in each round, and
// reports MB/s and the proxy's CPU time per GB.
func benchDownload(b *testing.B, label string, paths []benchPath, size, streams int) {
	benchRounds(b, label, paths, func(b *testing.B, p benchPath, _ int) figures {
		each := p.div(size) / streams
		script := ""
		for range streams {
			script += fmt.Sprintf("taskset -c 1 curl -sS -o /dev/null -w '%%{size_download}\\n' https://allowed.test/blob/%d & ", each)
		}
		start := time.Now()
		out, cpu, err := p.runCPU("sh", "-c", script+"wait")
		el := time.Since(start)
		if err != nil || strings.Count(out, strconv.Itoa(each)+"\n") != streams {
			b.Fatalf("%s: %v: %q", p.name, err, out)
		}
		total := float64(each * streams)
		f := figures{"MB/s": total / el.Seconds() / 1e6}
		if p.pid != 0 {
			f["cpu-ms/GB"] = usPer(cpu.ticks, total/1e9) / 1000
		}
		return f
	})
}

// benchConns opens n connections (c at a time) through each path, each
// for one request to url, over the rounds, and reports conns/s, request
// latency and the proxy's CPU time per connection. A "%d" in url becomes
// i mod names; with more than one name, each round takes names/rounds
// names of its own, so that every round meets names none has seen.
func benchConns(b *testing.B, label string, paths []benchPath, c, n, names int, url string) {
	benchRounds(b, label, paths, func(b *testing.B, p benchPath, round int) figures {
		u, k := url, names
		if names > 1 {
			u, k = strings.Replace(url, "%d", fmt.Sprintf("%%d-r%d", round), 1), max(names/rounds, 1)
		}
		conns := n / rounds / max(p.slow, p.slowConns, 1)
		out, cpu, err := p.runCPU(os.Args[0], "-test.run=^TestMemberHelper$", "--", "conns", strconv.Itoa(c), strconv.Itoa(conns), strconv.Itoa(k), u)
		var rate, p50, p99, failed float64
		if n, _ := fmt.Sscanf(strings.TrimSpace(out), "rate %f p50 %f p99 %f failed %f", &rate, &p50, &p99, &failed); n != 4 || err != nil {
			b.Fatalf("%s: %v: %q", p.name, err, out)
		}
		f := figures{"conns/s": rate, "p50-ms": p50, "p99-ms": p99, "failed": failed}
		if p.pid != 0 {
			cpu.per(f, "conn", float64(conns))
		}
		return f
	})
}

// benchKeepalive sends small requests over 8 kept-alive connections
// through each path for secs seconds a round, with wrk (HTTP/1.1) and
// h2load (HTTP/2, one stream at a time per connection, so that both
// protocols carry the same concurrency), pinned to CPU 1, and reports
// requests/s and the proxy's CPU time per request. Paths that do not
// offer HTTP/2 (sslsplit, squid) get h2load --h1. h1-1conn is wrk over
// one connection: one request at a time, as one agent sends them, where
// every hand-off's latency counts.
func benchKeepalive(b *testing.B, paths []benchPath, secs int) {
	for _, proto := range []string{"h1", "h2", "h1-1conn"} {
		benchRounds(b, "keepalive-"+proto, paths, func(b *testing.B, p benchPath, _ int) figures {
			d := strconv.Itoa(secs)
			var argv []string
			switch {
			case proto == "h1-1conn":
				argv = []string{"wrk", "-t1", "-c1", "-d" + d + "s", "https://allowed.test/"}
			case proto == "h1":
				argv = []string{"wrk", "-t1", "-c8", "-d" + d + "s", "https://allowed.test/"}
			case p.noH2:
				argv = []string{"h2load", "--h1", "-t1", "-c8", "-m1", "-D", d, "https://allowed.test/"}
			default:
				argv = []string{"h2load", "-t1", "-c8", "-m1", "-D", d, "https://allowed.test/"}
			}
			out, cpu, err := p.runCPU(append([]string{"taskset", "-c", "1"}, argv...)...)
			r := loadResult(argv[0], out)
			if err != nil || !r.ok || r.rps == 0 || r.done == 0 {
				b.Fatalf("%s %v: %v: %q", p.name, argv, err, out)
			}
			if r.failed > 0 {
				b.Fatalf("%s %v: %d requests failed: %q", p.name, argv, r.failed, out)
			}
			f := figures{"req/s": r.rps}
			if p.pid != 0 {
				cpu.per(f, "req", float64(r.done))
			}
			return f
		})
	}
}

// load is what wrk's or h2load's summary says.
type load struct {
	rps    float64 // requests per second
	done   int     // requests answered
	failed int     // errors and non-2xx answers
	ok     bool    // the rate was found
}

// loadResult reads wrk's or h2load's summary.
func loadResult(tool, out string) load {
	var r load
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		var a, b, c, d int
		switch {
		case tool == "wrk" && strings.HasPrefix(l, "Requests/sec:"):
			_, err := fmt.Sscanf(l, "Requests/sec: %f", &r.rps)
			r.ok = err == nil
		case tool == "wrk" && strings.Contains(l, " requests in "):
			fmt.Sscanf(l, "%d requests in", &r.done)
		case tool == "wrk" && strings.HasPrefix(l, "Socket errors:"):
			fmt.Sscanf(l, "Socket errors: connect %d, read %d, write %d, timeout %d", &a, &b, &c, &d)
			r.failed += a + b + c + d
		case tool == "wrk" && strings.HasPrefix(l, "Non-2xx or 3xx responses:"):
			fmt.Sscanf(l, "Non-2xx or 3xx responses: %d", &a)
			r.failed += a
		case tool == "h2load" && strings.HasPrefix(l, "finished in"):
			_, err := fmt.Sscanf(l[strings.Index(l, ",")+1:], "%f req/s", &r.rps)
			r.ok = err == nil
		case tool == "h2load" && strings.HasPrefix(l, "requests:"):
			// requests: N total, N started, N done, N succeeded, N failed, N errored, N timeout
			f := strings.Split(l, ",")
			if len(f) >= 5 {
				fmt.Sscanf(strings.TrimSpace(f[2]), "%d done", &r.done)
				fmt.Sscanf(strings.TrimSpace(f[4]), "%d failed", &a)
				r.failed += a
			}
		case tool == "h2load" && strings.HasPrefix(l, "status codes:"):
			// status codes: N 2xx, N 3xx, N 4xx, N 5xx
			fmt.Sscanf(l, "status codes: %d 2xx, %d 3xx, %d 4xx, %d 5xx", &a, &b, &c, &d)
			r.failed += b + c + d
		}
	}
	return r
}

// benchHey opens n connections one after another through each path with
// hey (-c 1 -disable-keepalive: a DNS lookup, a TCP connection and a full
// TLS handshake per request), pinned to CPU 1, n/rounds a round, and
// reports conns/s, the p50 and p99 request latency and the proxy's CPU
// time per connection.
func benchHey(b *testing.B, label string, paths []benchPath, n int) {
	benchRounds(b, label, paths, func(b *testing.B, p benchPath, _ int) figures {
		each := n / rounds
		argv := []string{"taskset", "-c", "1", "hey", "-n", strconv.Itoa(each), "-c", "1", "-disable-keepalive", "-t", "10", "https://allowed.test/"}
		out, cpu, err := p.runCPU(argv...)
		var rate, p50, p99 float64
		var ok200 int
		for _, l := range strings.Split(out, "\n") {
			l = strings.TrimSpace(l)
			fmt.Sscanf(l, "Requests/sec: %f", &rate)
			fmt.Sscanf(l, "50%% in %f secs", &p50)
			fmt.Sscanf(l, "99%% in %f secs", &p99)
			fmt.Sscanf(l, "[200] %d responses", &ok200)
		}
		if err != nil || rate == 0 || p99 == 0 {
			b.Fatalf("%s %v: %v: %q", p.name, argv, err, out)
		}
		if failed := each - ok200; failed > each/100 {
			b.Fatalf("%s: %d of %d requests failed", p.name, failed, each)
		}
		f := figures{"conns/s": rate, "p50-ms": p50 * 1000, "p99-ms": p99 * 1000, "failed": float64(each - ok200)}
		if p.pid != 0 {
			cpu.per(f, "conn", float64(each))
		}
		return f
	})
}

// idleConns is how many connections the idle benchmarks hold: 10,000, or
// fewer where the open-file limit (which a container without
// CAP_SYS_RESOURCE cannot raise) does not leave the proxies fds
// descriptors per connection.
func idleConns(fds int) int {
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return scale(min(10000, int(lim.Max-1000)/fds/500*500), 1000)
}

// benchIdle opens n TLS connections through each path, one request each,
// holds them, and reports how much the proxy's resident memory grew per
// connection. Run it first, on a fresh proxy: a heap grown by earlier
// work would take the new connections without growing. Then freshen the
// proxies it measured.
func benchIdle(b *testing.B, label string, paths []benchPath, n int) {
	for _, p := range paths {
		b.Run(label+"/"+p.name, func(b *testing.B) {
			cmd := p.cmd(p.argv([]string{os.Args[0], "-test.run=^TestMemberHelper$", "--", "hold-tls", strconv.Itoa(n), "https://allowed.test/"})...)
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			var stderr strings.Builder
			cmd.Stderr = &stderr
			before := rssKiB(p.pid)
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			defer cmd.Wait()
			defer stdin.Close()
			// A proxy that stops accepting (out of descriptors, say) must not
			// hang the run.
			timer := time.AfterFunc(3*time.Minute, func() { cmd.Process.Kill() })
			defer timer.Stop()
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if line != fmt.Sprintf("held %d\n", n) {
				b.Fatalf("%q %v %s", line, err, stderr.String())
			}
			time.Sleep(500 * time.Millisecond) // not a wait: the proxy's memory settles before it is measured
			b.ReportMetric(float64(rssKiB(p.pid)-before)/float64(n), "KiB/conn")
		})
	}
}

// BenchmarkProxy measures, in one world and one run, the spliced proxy
// against two other paths that cross the same links: direct (a namespace
// the host merely forwards) and haproxy in transparent TCP mode (DNAT to
// it, upstream = the original destination): memory per idle connection,
// HTTPS downloads with the proxy's CPU time, new connections; then, for
// airlock alone, approval latency and connection rate at 10 and 100,000
// rules. Run it with -benchtime 1x: each sub-benchmark does its own fixed
// amount of work and reports its own units; speed figures are medians of
// rounds (benchRounds), with the proxy's CPU time per unit of work.
func BenchmarkProxy(b *testing.B) {
	w, cfg, d, direct := benchWorld(b, "sandbox:\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n")

	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		b.Fatal("haproxy not installed (make bench installs it)")
	}
	hcfg := filepath.Join(w.Dir, "haproxy.cfg")
	os.WriteFile(hcfg, []byte(`global
  maxconn 9900
defaults
  mode tcp
  timeout connect 10s
  timeout client 1m
  timeout server 1m
frontend f
  bind 10.98.0.1:15002
  default_backend b
backend b
  server original 0.0.0.0:0
`), 0o644)
	hp := startPeer(b, w, "10.98.0", "15002", nil, haproxy, "-f", hcfg, "-db")
	// Spliced TLS is end to end: every client trusts the internet's CA.
	paths := []benchPath{direct, hp.path("haproxy", w.CAFile), memberPath(w, cfg, w.CAFile, d)}
	waitServing(b, paths[1])

	// First, then fresh proxies, as in BenchmarkIntercept (see there).
	benchIdle(b, "idle", pick(paths, "haproxy", "airlock"), idleConns(2))
	paths, d = freshen(b, w, cfg, d, paths, map[string]*peer{"haproxy": hp})
	// Half a GiB a round: three rounds carry more than one run of 1 GiB
	// did, in about as long again.
	const size = 512 << 20
	benchDownload(b, "download-512MiB", paths, scale(size, size/8), 1)
	benchDownload(b, "download-8x64MiB", paths, scale(size, size/8), 8)
	benchHey(b, "connect", paths, scale(3000, 600))
	benchApprovals(b, w, paths[2], scale(200, 50))
	benchRuleScale(b, w, d, paths[2], scale(3000, 600))
}

// benchApprovals has a member fetch n unknown names one after another; the
// benchmark approves each (allow_once) as soon as it shows up in the API
// and reports the time from its POST to the response's first byte at the
// member.
func benchApprovals(b *testing.B, w *testworld.World, member benchPath, n int) {
	b.Run("approval/airlock", func(b *testing.B) {
		token, err := os.ReadFile(filepath.Join(w.Dir, "state", "token"))
		if err != nil {
			b.Fatal(err)
		}
		var mu sync.Mutex
		posted := map[string]time.Time{} // host → decision POST
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			client := w.HostClient()
			do := func(method, path, body string) []byte {
				req, _ := http.NewRequest(method, apiBase+path, strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
				resp, err := client.Do(req)
				if err != nil {
					return nil
				}
				defer resp.Body.Close()
				var buf strings.Builder
				bufio.NewReader(resp.Body).WriteTo(&buf)
				return []byte(buf.String())
			}
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
				var pending []struct{ ID, Host string }
				json.Unmarshal(do("GET", "/sandboxes/"+sbA+"/approvals", ""), &pending)
				for _, p := range pending {
					mu.Lock()
					_, seen := posted[p.Host]
					if !seen {
						posted[p.Host] = time.Now()
					}
					mu.Unlock()
					if !seen {
						do("POST", "/sandboxes/"+sbA+"/approvals/"+p.ID, `{"action": "allow_once"}`)
					}
				}
			}
		})
		out, err := member.run(os.Args[0], "-test.run=^TestMemberHelper$", "--", "first-bytes", strconv.Itoa(n), "https://a%d.bench.test/")
		close(stop)
		wg.Wait()
		var lat []time.Duration
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var host string
			var ns int64
			if k, _ := fmt.Sscanf(l, "fb %s %d", &host, &ns); k == 2 && !posted[host].IsZero() {
				lat = append(lat, time.Unix(0, ns).Sub(posted[host]))
			}
		}
		if err != nil || len(lat) != n {
			b.Fatalf("%d of %d approvals timed: %v: %q", len(lat), n, err, out)
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[n/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[n*99/100].Microseconds())/1000, "p99-ms")
	})
}

// benchRuleScale measures airlock's connection rate with 10 rules and with
// 100,000 (80% exact hosts, 20% wildcards, none matching the test's host
// but allowed.test), reloading the policy file in between.
func benchRuleScale(b *testing.B, w *testworld.World, d *testworld.Daemon, member benchPath, n int) {
	policy := filepath.Join(w.Dir, "app.yaml")
	for _, rules := range []int{10, 100000} {
		var sb strings.Builder
		sb.WriteString("sandbox:\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n")
		for r := 1; r < rules; r++ {
			if r%5 == 0 {
				fmt.Fprintf(&sb, "      - pattern: \"*.w%d.example.com\"\n", r)
			} else {
				fmt.Fprintf(&sb, "      - pattern: h%d.example.com\n", r)
			}
		}
		os.WriteFile(policy, []byte(sb.String()), 0o644)
		// The edit widens access, so a poll holds it: a reload, as a
		// person would run, puts it in force.
		reloads := strings.Count(d.Log.String(), "msg=reloaded")
		d.Signal(syscall.SIGHUP)
		if !testenv.Poll(60*time.Second, func() bool { return strings.Count(d.Log.String(), "msg=reloaded") > reloads }) {
			b.Fatalf("policy with %d rules not reloaded after 60 s", rules)
		}
		want := fmt.Sprintf("rules=%d", rules)
		benchHey(b, "connect-"+want, []benchPath{member}, n)
	}
}

func netnsResolv(b *testing.B, ns string) {
	dir := filepath.Join("/etc/netns", ns)
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte("nameserver "+testworld.DNSAddr+"\n"), 0o644)
	b.Cleanup(func() { os.RemoveAll(dir) })
}

func nsRun(ns string, argv ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...).CombinedOutput()
	return string(out), err
}

// setupDNATClient makes namespace ns on its own link to the host (host side
// NET.1, client NET.2, NET such as "10.98.0") whose TCP the host DNATs to
// target, as a sandbox's is DNATed to airlock, and points its DNS at the
// internet's server.
func setupDNATClient(b *testing.B, w *testworld.World, ns, net, target string) {
	b.Helper()
	run := func(args ...string) {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %v %s", args, err, out)
		}
	}
	run("ip", "netns", "add", ns)
	b.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	link := ns[:min(len(ns), 13)] + "h"
	run("ip", "-n", ns, "link", "set", "lo", "up")
	run("ip", "link", "add", link, "netns", w.Host, "type", "veth", "peer", "name", "eth0", "netns", ns)
	run("ip", "-n", w.Host, "addr", "add", net+".1/24", "dev", link)
	run("ip", "-n", w.Host, "link", "set", link, "up")
	run("ip", "-n", ns, "addr", "add", net+".2/24", "dev", "eth0")
	run("ip", "-n", ns, "link", "set", "eth0", "up")
	run("ip", "-n", ns, "route", "add", "default", "via", net+".1")
	run("ip", "-n", w.Inet, "route", "add", net+".0/24", "via", testworld.HostUplink)
	// Benchmark plumbing, not product: DNAT the client's TCP (DNS aside).
	table := "bench" + strings.ReplaceAll(net, ".", "")
	nft := fmt.Sprintf(`table ip %s {
  chain pre { type nat hook prerouting priority dstnat; policy accept; iifname "%s" tcp dport != 53 dnat to %s; }
}`, table, link, target)
	cmd := exec.Command("ip", "netns", "exec", w.Host, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(nft)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("nft: %v %s", err, out)
	}
	netnsResolv(b, ns)
}

// nsName returns a namespace name unique to this world.
func nsName(w *testworld.World, suffix string) string {
	return w.Host[:len(w.Host)-1] + suffix
}

// BenchmarkIntercept measures TLS interception in one world and one run,
// through direct (TLS end to end, the host forwards), mitmdump in
// transparent mode, sslsplit, squid with ssl-bump, and airlock with
// inspect: all: memory per idle intercepted connection, an HTTPS download,
// keep-alive requests (HTTP/1.1 and HTTP/2, 8 connections), and new
// connections with 1 name (warm) and 10,000 names (cold, a leaf
// certificate each); speed figures are medians of rounds (benchRounds),
// with the proxy's CPU time per unit of work.
func BenchmarkIntercept(b *testing.B) {
	w, cfg, d, direct := benchWorld(b, "sandbox:\n  inspect: all\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n      - pattern: \"*.bench.test\"\n")
	// The peers' CA and leaf key: ECDSA P-256 like airlock's, in a
	// directory squid's unprivileged user can read.
	peerDir, err := os.MkdirTemp("", "airlock-bench-peers-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(peerDir) })
	os.Chmod(peerDir, 0o755)
	peerCA, peerKey, leafKey := filepath.Join(peerDir, "ca.pem"), filepath.Join(peerDir, "ca.key"), filepath.Join(peerDir, "leaf.key")
	upCA := filepath.Join(peerDir, "upstream-ca.pem")
	for _, c := range [][]string{
		{"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", peerKey, "-out", peerCA, "-subj", "/CN=bench peer CA", "-days", "2"},
		{"openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", leafKey},
		{"cp", w.CAFile, upCA},
		{"chmod", "-R", "a+rX", peerDir},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %v %s", c, err, out)
		}
	}
	paths := []benchPath{direct}

	// mitmdump: transparent mode, streaming bodies. It is two orders of
	// magnitude slower than the rest, so it gets a sixteenth of the work.
	mitmdump, err := exec.LookPath("mitmdump")
	if err != nil {
		b.Fatal("mitmdump not installed (make bench installs mitmproxy)")
	}
	conf := filepath.Join(w.Dir, "mitm")
	mp := startPeer(b, w, "10.97.0", "15003", nil, mitmdump, "--mode", "transparent", "--listen-host", "10.97.0.1", "--listen-port", "15003",
		"--set", "confdir="+conf, "--set", "ssl_verify_upstream_trusted_ca="+w.CAFile, "--set", "flow_detail=0", "--set", "stream_large_bodies=128k", "-q")
	mitm := mp.path("mitmdump", filepath.Join(conf, "mitmproxy-ca-cert.pem"))
	mitm.slow = 16
	paths = append(paths, mitm)

	// sslsplit: generic TLS splitting (no HTTP rewriting), original
	// destination from netfilter, upstream verified against the internet's CA.
	sslsplit, err := exec.LookPath("sslsplit")
	if err != nil {
		b.Fatal("sslsplit not installed (make bench installs it)")
	}
	sp := startPeer(b, w, "10.96.0", "15004", []string{"SSL_CERT_FILE=" + upCA}, sslsplit, "-u", "root", "-k", peerKey, "-c", peerCA, "-K", leafKey,
		"-o", "VerifyPeer=yes", "ssl", "10.96.0.1", "15004")
	split := sp.path("sslsplit", peerCA)
	// Each new connection through sslsplit takes about 250 ms whatever
	// the load (its rate is bound by latency, not CPU): fewer of them
	// give the same rate in less time.
	split.slowConns = 16
	split.noH2 = true
	paths = append(paths, split)

	// squid: ssl-bump in intercept mode (peek at the ClientHello, then
	// bump), caching off, certificates minted by its helper.
	squid, err := exec.LookPath("squid")
	if err != nil {
		b.Fatal("squid not installed (make bench installs squid-openssl)")
	}
	ssldb := filepath.Join(peerDir, "ssldb")
	if out, err := exec.Command("/usr/lib/squid/security_file_certgen", "-c", "-s", ssldb, "-M", "64MB").CombinedOutput(); err != nil {
		b.Fatalf("security_file_certgen: %v %s", err, out)
	}
	exec.Command("chown", "-R", "proxy:proxy", peerDir).Run()
	squidConf := filepath.Join(peerDir, "squid.conf")
	os.WriteFile(squidConf, []byte(fmt.Sprintf(`http_port 10.95.0.1:15006
https_port 10.95.0.1:15005 intercept ssl-bump tls-cert=%[1]s/ca.pem tls-key=%[1]s/ca.key generate-host-certificates=on dynamic_cert_mem_cache_size=64MB
sslcrtd_program /usr/lib/squid/security_file_certgen -s %[1]s/ssldb -M 64MB
sslcrtd_children 8 startup=2 idle=1
acl step1 at_step SslBump1
ssl_bump peek step1
ssl_bump bump all
tls_outgoing_options cafile=%[1]s/upstream-ca.pem
dns_nameservers %[2]s
http_access allow all
cache deny all
access_log none
cache_log %[1]s/cache.log
pid_filename %[1]s/squid.pid
coredump_dir %[1]s
shutdown_lifetime 0 seconds
`, peerDir, testworld.DNSAddr)), 0o644)
	qp := startPeer(b, w, "10.95.0", "15005", nil, squid, "-N", "-f", squidConf)
	sq := qp.path("squid", peerCA)
	sq.slowConns = 4
	sq.noH2 = true
	paths = append(paths, sq)
	paths = append(paths, memberPath(w, cfg, "", d))
	for _, p := range paths[1:] {
		waitServing(b, p)
	}

	// First, while every proxy is fresh: the figure is resident memory's
	// growth, and a Go process that has worked reuses the heap it freed.
	// Then the proxies it measured start again, since a proxy that has
	// just let thousands of connections go is not a neutral start for the
	// rows after (see scripts/bench-notes.md, "Order").
	benchIdle(b, "idle", pick(paths, "sslsplit", "airlock"), idleConns(2))
	paths, _ = freshen(b, w, cfg, d, paths, map[string]*peer{"sslsplit": sp})
	benchDownload(b, "https-download", pick(paths, "direct", "mitmdump", "sslsplit", "squid", "airlock"), scale(512<<20, 128<<20), 1)
	benchKeepalive(b, paths, scale(2, 1))
	hs := pick(paths, "direct", "sslsplit", "squid", "airlock")
	benchConns(b, "handshake-warm", hs, 8, scale(2000, 500), 1, "https://warm.bench.test/")
	benchConns(b, "handshake-cold", hs, 8, scale(10000, 1000), scale(10000, 1000), "https://c%d.bench.test/")
}
