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

// BenchmarkProxy measures, in one world and one run, a download and new
// connections through three paths that cross the same links: direct (a
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
  bind 10.99.0.1:15002
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
	// The haproxy client: a second namespace like the direct one, DNATed
	// to haproxy as airlock's members are to airlock.
	hpClient := "alt" + filepath.Base(w.Dir) + "x"
	hpClient = hpClient[:min(len(hpClient), 15)]
	setupHaproxyClient(b, w, hpClient)
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
	for _, ns := range []string{direct, hpClient} {
		dir := filepath.Join("/etc/netns", ns)
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte("nameserver "+testworld.DNSAddr+"\n"), 0o644)
		b.Cleanup(func() { os.RemoveAll(dir) })
	}
	const size = 1 << 30
	url := "http://allowed.test/blob/" + strconv.Itoa(size)
	for _, p := range paths {
		b.Run("download-1GiB/"+p.name, func(b *testing.B) {
			out, err := p.run("taskset", "-c", "1", "curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download} %{size_download}", url)
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
				script += fmt.Sprintf("curl -sS -o /dev/null -w '%%{size_download}\\n' http://allowed.test/blob/%d & ", size/8)
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
			out, err := p.run(os.Args[0], "-test.run=^TestMemberHelper$", "--", "rate", "2000", "http://allowed.test/")
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

func nsRun(ns string, argv ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...).Output()
	return string(out), err
}

func setupHaproxyClient(b *testing.B, w *testworld.World, ns string) {
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
	run("ip", "-n", w.Host, "addr", "add", "10.98.0.1/24", "dev", link)
	run("ip", "-n", w.Host, "link", "set", link, "up")
	run("ip", "-n", ns, "addr", "add", "10.98.0.2/24", "dev", "eth0")
	run("ip", "-n", ns, "link", "set", "eth0", "up")
	run("ip", "-n", ns, "route", "add", "default", "via", "10.98.0.1")
	run("ip", "-n", w.Inet, "route", "add", "10.98.0.0/24", "via", testworld.HostUplink)
	// Benchmark plumbing, not product: DNAT the client's TCP to haproxy.
	nft := fmt.Sprintf(`table ip benchhaproxy {
  chain pre { type nat hook prerouting priority dstnat; policy accept; iifname "%s" meta l4proto tcp dnat to 10.99.0.1:15002; }
}`, link)
	cmd := exec.Command("ip", "netns", "exec", w.Host, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(nft)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("nft: %v %s", err, out)
	}
}
