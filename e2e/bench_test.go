package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testworld"
)

// BenchmarkProxy measures, in one world and one run, an HTTPS download and
// new HTTPS connections through three paths that cross the same links: direct (a
// namespace the host merely forwards), haproxy in transparent TCP mode
// (DNAT to it, upstream = the original destination), and airlock's spliced
// proxy. Run it with -benchtime 1x: each sub-benchmark does its own fixed
// amount of work and reports MB/s, conns/s and latencies.
func BenchmarkProxy(b *testing.B) {
	w := testworld.New(b)
	policyA := filepath.Join(w.Dir, "app.yaml")
	os.WriteFile(policyA, []byte("sandbox:\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n"), 0o644)
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("state_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nsandboxes:\n  - name: %[3]s\n    subnet: 10.88.0.0/24\n    policy: %[4]s\n",
		w.Dir, testworld.DNSAddr, sbA, policyA)), 0o644)
	w.StartDaemon(cfg)
	direct, _ := w.DirectClient()

	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		b.Fatal("haproxy not installed (make bench installs it)")
	}
	hcfg := filepath.Join(w.Dir, "haproxy.cfg")
	os.WriteFile(hcfg, []byte(`global
  maxconn 8000
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
	hp := exec.Command("ip", "netns", "exec", w.Host, haproxy, "-f", hcfg, "-db")
	hpLog := &strings.Builder{}
	hp.Stdout, hp.Stderr = hpLog, hpLog
	if err := hp.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("haproxy:\n%s", hpLog.String())
		}
	})
	b.Cleanup(func() { hp.Process.Kill(); hp.Wait() })
	// The haproxy client: a namespace like the direct one, DNATed to
	// haproxy as airlock's members are to airlock.
	hpClient := nsName(w, "x")
	setupDNATClient(b, w, hpClient, "10.98.0", "10.98.0.1:15002")
	time.Sleep(500 * time.Millisecond)

	type path struct {
		name string
		run  func(argv ...string) (string, error)
	}
	paths := []path{
		{"direct", func(argv ...string) (string, error) { return nsRun(direct, argv...) }},
		{"haproxy", func(argv ...string) (string, error) { return nsRun(hpClient, argv...) }},
		{"airlock", func(argv ...string) (string, error) {
			r := w.Run(cfg, sbA, "bench", 10*time.Minute, argv...)
			if r.Code != 0 {
				return r.Stdout, fmt.Errorf("exit %d: %s", r.Code, r.Stderr)
			}
			return r.Stdout, nil
		}},
	}
	// Every path fetches by name: the direct and haproxy clients resolve
	// through the internet's DNS (ip netns exec binds /etc/netns/NS/), a
	// member through airlock's gate.
	netnsResolv(b, direct)
	// HTTPS: TLS end to end, which airlock splices (plain HTTP it serves
	// request by request).
	const size = 1 << 30
	url := "https://allowed.test/blob/" + strconv.Itoa(size)
	for _, p := range paths {
		b.Run("download-1GiB/"+p.name, func(b *testing.B) {
			out, err := p.run("taskset", "-c", "1", "curl", "-sS", "--cacert", w.CAFile, "-o", "/dev/null", "-w", "%{speed_download} %{size_download}", url)
			if err != nil {
				b.Fatalf("%v: %s", err, out)
			}
			var speed, got float64
			fmt.Sscanf(out, "%f %f", &speed, &got)
			if got != size {
				b.Fatalf("downloaded %v bytes, want %d", got, size)
			}
			b.ReportMetric(speed/1e6, "MB/s")
		})
	}
	for _, p := range paths {
		b.Run("download-8x128MiB/"+p.name, func(b *testing.B) {
			script := ""
			for i := 0; i < 8; i++ {
				script += fmt.Sprintf("curl -sS --cacert %s -o /dev/null -w '%%{size_download}\\n' https://allowed.test/blob/%d & ", w.CAFile, size/8)
			}
			start := time.Now()
			out, err := p.run("sh", "-c", script+"wait")
			el := time.Since(start)
			if err != nil || strings.Count(out, strconv.Itoa(size/8)) != 8 {
				b.Fatalf("%v: %q", err, out)
			}
			b.ReportMetric(float64(size)/el.Seconds()/1e6, "MB/s")
		})
	}
	for _, p := range paths {
		b.Run("connect/"+p.name, func(b *testing.B) {
			out, err := p.run("env", "SSL_CERT_FILE="+w.CAFile, os.Args[0], "-test.run=^TestMemberHelper$", "--", "rate", "2000", "https://allowed.test/")
			var rate, p50, p99 float64
			if n, _ := fmt.Sscanf(strings.TrimSpace(out), "rate %f p50 %f p99 %f", &rate, &p50, &p99); n != 3 {
				b.Fatalf("%v: %q", err, out)
			}
			b.ReportMetric(rate, "conns/s")
			b.ReportMetric(p50, "p50-ms")
			b.ReportMetric(p99, "p99-ms")
		})
	}
}

func netnsResolv(b *testing.B, ns string) {
	dir := filepath.Join("/etc/netns", ns)
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte("nameserver "+testworld.DNSAddr+"\n"), 0o644)
	b.Cleanup(func() { os.RemoveAll(dir) })
}

func nsRun(ns string, argv ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...).Output()
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
	dir := filepath.Join("/etc/netns", ns)
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte("nameserver "+testworld.DNSAddr+"\n"), 0o644)
	b.Cleanup(func() { os.RemoveAll(dir) })
}

// nsName returns a namespace name unique to this world.
func nsName(w *testworld.World, suffix string) string {
	return w.Host[:len(w.Host)-1] + suffix
}

// BenchmarkIntercept measures TLS interception in one world and one run: an
// HTTPS download (1 GiB; 64 MiB through mitmdump, which is slow) and keep-alive HTTPS requests (HTTP/1.1 and HTTP/2,
// 8 connections) through three paths: direct (TLS end to end, the host
// forwards), mitmdump in transparent mode, and airlock with inspect: all.
func BenchmarkIntercept(b *testing.B) {
	w := testworld.New(b)
	policyA := filepath.Join(w.Dir, "app.yaml")
	os.WriteFile(policyA, []byte("sandbox:\n  inspect: all\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n"), 0o644)
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("state_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nupstream_ca_file: %[5]s\nsandboxes:\n  - name: %[3]s\n    subnet: 10.88.0.0/24\n    policy: %[4]s\n",
		w.Dir, testworld.DNSAddr, sbA, policyA, w.CAFile)), 0o644)
	w.StartDaemon(cfg)
	direct, _ := w.DirectClient()
	netnsResolv(b, direct)

	mitmdump, err := exec.LookPath("mitmdump")
	if err != nil {
		b.Fatal("mitmdump not installed (make bench installs mitmproxy)")
	}
	conf := filepath.Join(w.Dir, "mitm")
	mc := exec.Command("ip", "netns", "exec", w.Host, mitmdump, "--mode", "transparent", "--listen-host", "10.97.0.1", "--listen-port", "15003",
		"--set", "confdir="+conf, "--set", "ssl_verify_upstream_trusted_ca="+w.CAFile, "--set", "flow_detail=0", "--set", "stream_large_bodies=128k", "-q")
	mlog := &strings.Builder{}
	mc.Stdout, mc.Stderr = mlog, mlog
	mitmClient := nsName(w, "m")
	setupDNATClient(b, w, mitmClient, "10.97.0", "10.97.0.1:15003")
	if err := mc.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { mc.Process.Kill(); mc.Wait() })
	mitmCA := filepath.Join(conf, "mitmproxy-ca-cert.pem")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(mitmCA); err == nil {
			if out, _ := nsRun(mitmClient, "curl", "-sS", "--cacert", mitmCA, "https://allowed.test/"); out == "internet" {
				break
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("mitmdump not serving after 30 s:\n%s", mlog.String())
		}
	}

	type path struct {
		name string
		ca   string // CA file to trust; "" = the member's environment
		n    int    // keep-alive requests (mitmdump is slow)
		size int    // download size (mitmdump is slow)
		run  func(argv ...string) (string, error)
	}
	paths := []path{
		{"direct", w.CAFile, 20000, 1 << 30, func(argv ...string) (string, error) { return nsRun(direct, argv...) }},
		{"mitmdump", mitmCA, 2000, 64 << 20, func(argv ...string) (string, error) { return nsRun(mitmClient, argv...) }},
		{"airlock", "", 20000, 1 << 30, func(argv ...string) (string, error) {
			r := w.Run(cfg, sbA, "bench", 10*time.Minute, argv...)
			if r.Code != 0 {
				return r.Stdout, fmt.Errorf("exit %d: %s", r.Code, r.Stderr)
			}
			return r.Stdout, nil
		}},
	}
	for _, p := range paths {
		b.Run("https-download/"+p.name, func(b *testing.B) {
			argv := []string{"taskset", "-c", "1", "curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download} %{size_download}"}
			if p.ca != "" {
				argv = append(argv, "--cacert", p.ca)
			}
			out, err := p.run(append(argv, "https://allowed.test/blob/"+strconv.Itoa(p.size))...)
			var speed, got float64
			fmt.Sscanf(out, "%f %f", &speed, &got)
			if err != nil || got != float64(p.size) {
				b.Fatalf("%v: %q", err, out)
			}
			b.ReportMetric(speed/1e6, "MB/s")
		})
	}
	for _, proto := range []string{"h1", "h2"} {
		for _, p := range paths {
			b.Run("keepalive-"+proto+"/"+p.name, func(b *testing.B) {
				argv := []string{os.Args[0], "-test.run=^TestMemberHelper$", "--", "keepalive", proto, "8", strconv.Itoa(p.n), "https://allowed.test/"}
				if p.ca != "" {
					argv = append([]string{"env", "SSL_CERT_FILE=" + p.ca}, argv...)
				}
				out, err := p.run(argv...)
				var rps float64
				if n, _ := fmt.Sscanf(strings.TrimSpace(out), "rps %f", &rps); n != 1 {
					b.Fatalf("%v: %q", err, out)
				}
				b.ReportMetric(rps, "req/s")
			})
		}
	}
}
