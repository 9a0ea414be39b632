package e2e

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
	"github.com/airlockhq/airlock/netns"
)

const (
	sbA      = "sba"
	sbB      = "sbb"
	sbC      = "sbc"
	exfilCap = 10
)

// setup builds a world and an airlockd with three sandboxes: sba asks (2 s)
// for unknown hosts and allows allowed.test, *.exfil.test, private.test,
// metadata.test and ssh.test; sbb denies unknown hosts and allows
// cidr:203.0.113.10/32, private.test with cidr:10.255.0.1/32, and
// ssh.test:22; sbc denies unknown hosts and intercepts api.allowed.test
// (GET or any method under /v1/) and badcert.test.
func setup(t *testing.T) (*testworld.World, string, *testworld.Daemon) {
	w := testworld.New(t)
	policyA := filepath.Join(w.Dir, "app.yaml")
	write(t, policyA, `name: myapp  # unrelated keys stay
sandbox:
  unknown_action: ask
  approval_timeout: 2
  network_allowlist:
    user:
      - pattern: allowed.test
      - pattern: "*.exfil.test"
      - pattern: private.test
      - pattern: metadata.test
      - pattern: ssh.test
`)
	policyB := filepath.Join(w.Dir, "b.yaml")
	write(t, policyB, `sandbox:
  unknown_action: deny
  network_allowlist:
    user:
      - pattern: "cidr:203.0.113.10/32"
      - pattern: private.test
      - pattern: "cidr:10.255.0.1/32"
      - pattern: "ssh.test:22"
`)
	policyC := filepath.Join(w.Dir, "c.yaml")
	write(t, policyC, `sandbox:
  unknown_action: deny
  network_allowlist:
    user:
      - pattern: allowed.test
      - pattern: "api.allowed.test/v1/*"
      - pattern: "GET api.allowed.test/repos/*"
      - pattern: "badcert.test/x/*"
`)
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	write(t, cfg, fmt.Sprintf(`api_listen: 127.0.0.1:7433
state_dir: %[1]s/state
run_dir: %[1]s/run
upstream_dns: ["%[2]s:53"]
upstream_ca_file: %[8]s
exfil:
  max_subdomains_per_minute: %[3]d
sandboxes:
  - name: %[4]s
    subnet: 10.88.0.0/24
    policy: %[5]s
  - name: %[6]s
    subnet: 10.88.1.0/24
    policy: %[7]s
  - name: %[9]s
    subnet: 10.88.2.0/24
    policy: %[10]s
`, w.Dir, testworld.DNSAddr, exfilCap, sbA, policyA, sbB, policyB, w.CAFile, sbC, policyC))
	d := w.StartDaemon(cfg)
	return w, cfg, d
}

func write(t testing.TB, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func inFakePool(t *testing.T, s string) bool {
	t.Helper()
	ip := net.ParseIP(strings.TrimSpace(s))
	_, pool, _ := net.ParseCIDR("198.18.0.0/15")
	return ip != nil && pool.Contains(ip)
}

func upstreamSaw(w *testworld.World, name string) bool { return w.DNS.Saw(name) }

func TestDNSFakeIPsAndNothingUnknownUpstream(t *testing.T) {
	w, cfg, _ := setup(t)
	tests := []struct {
		name string
		argv []string
	}{
		{"allowed via resolv.conf", []string{"dig", "+short", "+tries=1", "allowed.test"}},
		{"unknown via resolv.conf", []string{"dig", "+short", "+tries=1", "unknown.test"}},
		{"straight at the upstream", []string{"dig", "+short", "+tries=1", "@" + testworld.DNSAddr, "direct-unknown.test"}},
		{"straight at the upstream over TCP", []string{"dig", "+short", "+tcp", "+tries=1", "@" + testworld.DNSAddr, "tcp-unknown.test"}},
		{"mixed case", []string{"dig", "+short", "+tries=1", "UnKnOwN-Case.TeSt"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := w.Run(cfg, sbA, "agent", 20*time.Second, tt.argv...)
			if r.Code != 0 || !inFakePool(t, r.Stdout) {
				t.Fatalf("%v: code %d, out %q, err %q; want an address in 198.18.0.0/15", tt.argv, r.Code, r.Stdout, r.Stderr)
			}
		})
	}
	for _, q := range w.DNS.Queries() {
		t.Errorf("the upstream received %v; A queries must never be forwarded", q)
	}
}

func TestDNSRecordTypes(t *testing.T) {
	w, cfg, _ := setup(t)
	dig := func(args ...string) string {
		t.Helper()
		r := w.Run(cfg, sbA, "agent", 20*time.Second, append([]string{"dig", "+tries=1"}, args...)...)
		if r.Code != 0 {
			t.Fatalf("dig %v: %d %s %s", args, r.Code, r.Stdout, r.Stderr)
		}
		return r.Stdout
	}
	if out := dig("TXT", "allowed.test"); !strings.Contains(out, `"v=allowed"`) || !strings.Contains(out, "status: NOERROR") {
		t.Errorf("TXT allowed.test: want the upstream's record, got\n%s", out)
	}
	if !upstreamSaw(w, "allowed.test") {
		t.Error("the upstream never saw allowed.test TXT")
	}
	out := dig("TXT", "unknown.test")
	if !strings.Contains(out, "status: REFUSED") || !strings.Contains(out, "EDE: 15 (Blocked)") {
		t.Errorf("TXT unknown.test: want REFUSED with EDE Blocked, got\n%s", out)
	}
	if out := dig("AAAA", "allowed.test"); !strings.Contains(out, "status: NOERROR") || !strings.Contains(out, "ANSWER: 0") {
		t.Errorf("AAAA: want no data, got\n%s", out)
	}
	for _, typ := range []string{"NULL", "ANY"} {
		if out := dig(typ, "allowed.test"); !strings.Contains(out, "status: REFUSED") {
			t.Errorf("%s: want REFUSED, got\n%s", typ, out)
		}
	}
	if upstreamSaw(w, "unknown.test") {
		t.Error("unknown.test reached the upstream")
	}
}

func TestDNSExfiltrationCap(t *testing.T) {
	w, cfg, d := setup(t)
	// 200 TXT queries of random 40-character subdomains, as one shell
	// script in one member.
	r := rand.New(rand.NewPCG(3, 4))
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var script strings.Builder
	for i := 0; i < 200; i++ {
		b := make([]byte, 40)
		for j := range b {
			b[j] = alphabet[r.IntN(len(alphabet))]
		}
		fmt.Fprintf(&script, "dig +short +tries=1 +time=1 TXT %s.exfil.test >/dev/null\n", b)
	}
	res := w.Run(cfg, sbA, "agent", 3*time.Minute, "sh", "-c", script.String())
	if res.Code != 0 {
		t.Fatalf("script: %d %s", res.Code, res.Stderr)
	}
	n := 0
	for _, q := range w.DNS.Queries() {
		if strings.HasSuffix(q.Name, ".exfil.test") {
			n++
		}
	}
	if n > exfilCap {
		t.Errorf("the upstream saw %d random subdomains of exfil.test; the cap is %d", n, exfilCap)
	}
	if !strings.Contains(d.Log.String(), "exfiltration guard tripped") {
		t.Error("no exfiltration trip in airlockd's log")
	}
}

// capFreePing copies ping without its file capabilities: members have none
// and the kernel refuses to exec a binary that needs them. It then uses an
// unprivileged ICMP socket, which airlock run allows.
func capFreePing(t *testing.T, w *testworld.World) string {
	src, err := os.Open("/usr/bin/ping")
	if err != nil {
		t.Fatalf("ping not installed (apt-get install iputils-ping): %v", err)
	}
	defer src.Close()
	dst := filepath.Join(w.Dir, "ping")
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(f, src)
	f.Close()
	return dst
}

func TestNothingElseLeaves(t *testing.T) {
	w, cfg, _ := setup(t)
	ping := capFreePing(t, w)
	run := func(argv ...string) testworld.Result {
		return w.Run(cfg, sbA, "agent", 30*time.Second, argv...)
	}
	finalDrop := regexp.MustCompile(`^\s*counter packets \d+ bytes \d+ drop`)
	dropped := ruleCounter(t, w, "inet", "pre-al-"+sbA, finalDrop)
	if r := run(ping, "-c", "1", "-W", "2", testworld.InetRouter); r.Code == 0 {
		t.Errorf("ping %s succeeded from a sandbox:\n%s", testworld.InetRouter, r.Stdout)
	}
	// QUIC-like UDP to 443, other UDP, and non-DNS bytes to port 53 of an
	// internet host, through bash's /dev/udp. The ping and the two
	// datagrams not to port 53 end at the bridge pass's last drop.
	run("bash", "-c", "echo quic > /dev/udp/"+testworld.WebAddr+"/443; echo hello > /dev/udp/"+testworld.WebAddr+"/9999; echo notdns > /dev/udp/"+testworld.UDP53Addr+"/53; sleep 0.5")
	// TCP straight to internet hosts, the private service and the metadata
	// service by IP: no rule of sba allows a raw IP, so each is refused
	// (403 for plain HTTP, reset for TLS).
	for _, u := range []string{"http://" + testworld.WebAddr + "/", "https://" + testworld.WebAddr + "/", "http://" + testworld.Private + "/", "http://" + testworld.Metadata + "/latest/meta-data/"} {
		if r := run("curl", "-sSfk", "-m", "5", u); r.Code == 0 {
			t.Errorf("curl %s succeeded from a sandbox: %s", u, r.Stdout)
		}
	}
	// A Go client: dial by IP.
	if r := run(os.Args[0], "-test.run=^TestMemberHelper$", "--", "dial", testworld.WebAddr+":80"); !strings.Contains(r.Stdout, "refused") {
		t.Errorf("Go client dial: %q %q", r.Stdout, r.Stderr)
	}
	if !testenv.Poll(2*time.Second, func() bool { return ruleCounter(t, w, "inet", "pre-al-"+sbA, finalDrop) >= dropped+3 }) {
		t.Errorf("the bridge pass dropped %d packets, want the ping and two datagrams (3)", ruleCounter(t, w, "inet", "pre-al-"+sbA, finalDrop)-dropped)
	}
	for _, l := range w.Reached() {
		t.Errorf("reached the internet: %s", l)
	}
	for _, q := range w.DNS.Queries() {
		if q.Name != "allowed.test" {
			t.Errorf("the upstream DNS received %v", q)
		}
	}
}

func TestNoIPv6NoSpoofing(t *testing.T) {
	w, cfg, d := setup(t)
	r := w.Run(cfg, sbA, "agent", 20*time.Second, "sh", "-c", "ip -6 route; ip -6 addr")
	if strings.TrimSpace(r.Stdout) != "" {
		t.Errorf("member has IPv6 routes or addresses:\n%s", r.Stdout)
	}
	// A forced IPv6 packet: a member that turns IPv6 back on cannot (no
	// capabilities), so build a rogue member by hand on the bridge and send
	// from it; the rule set must count and drop it.
	rogue := "alt-rogue-" + fmt.Sprint(rand.IntN(1e4))
	if out, err := sh("ip", "netns", "add", rogue); err != nil {
		t.Fatal(out)
	}
	defer sh("ip", "netns", "del", rogue)
	steps := [][]string{
		{"ip", "-n", w.Host, "link", "add", "altrg0", "type", "veth", "peer", "name", "altrg1", "netns", rogue},
		{"ip", "-n", w.Host, "link", "set", "altrg0", "master", "al-" + sbA, "up"},
		{"ip", "netns", "exec", rogue, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=0"},
		{"ip", "-n", rogue, "link", "set", "altrg1", "up"},
		{"ip", "-n", rogue, "addr", "add", "2001:db8:88::2/64", "dev", "altrg1", "nodad"},
		{"ip", "-n", rogue, "-6", "neigh", "add", "2001:db8:88::1", "lladdr", "02:00:00:00:00:01", "dev", "altrg1"},
		{"ip", "-n", rogue, "-6", "route", "add", "default", "via", "2001:db8:88::1"},
	}
	for _, s := range steps {
		if out, err := sh(s...); err != nil {
			t.Fatalf("%v: %s", s, out)
		}
	}
	before := dropCount(t, w, "nfproto ipv6")
	spoofBefore := dropCount(t, w, "saddr != 10.88.0.0/24")
	sh("ip", "netns", "exec", rogue, "bash", "-c", "for i in 1 2 3; do echo v6 > /dev/udp/2001:db8:113::10/443; done; true")
	// Also to the bridge's all-nodes group.
	sh("ip", "netns", "exec", rogue, "bash", "-c", "echo v6 > /dev/udp/ff02::1%altrg1/9999; true")
	// Spoofed IPv4 sources: one outside every sandbox, one of sandbox B,
	// sent from the rogue member on sandbox A's bridge, as a DNS query to
	// the gate and a TCP SYN to the internet.
	for _, s := range [][]string{
		{"ip", "-n", rogue, "addr", "add", "10.77.0.5/32", "dev", "altrg1"},
		{"ip", "-n", rogue, "addr", "add", "10.88.1.77/32", "dev", "altrg1"},
		{"ip", "-n", rogue, "route", "add", "10.88.0.0/24", "dev", "altrg1", "src", "10.77.0.5"},
		{"ip", "-n", rogue, "route", "add", testworld.WebAddr + "/32", "dev", "altrg1", "src", "10.88.1.77"},
		{"ip", "-n", rogue, "neigh", "add", testworld.WebAddr, "lladdr", "02:00:00:00:00:01", "dev", "altrg1"},
	} {
		if out, err := sh(s...); err != nil {
			t.Fatalf("%v: %s", s, out)
		}
	}
	sh("ip", "netns", "exec", rogue, "dig", "+tries=1", "+time=1", "@10.88.0.1", "spoofed.test")
	sh("ip", "netns", "exec", rogue, "curl", "-s", "-m", "2", "http://"+testworld.WebAddr+"/")
	if !testenv.Poll(2*time.Second, func() bool { return dropCount(t, w, "nfproto ipv6") > before }) {
		t.Errorf("IPv6 drop counter stayed at %d: the forced packets were not seen and dropped", before)
	}
	if !testenv.Poll(2*time.Second, func() bool { return dropCount(t, w, "saddr != 10.88.0.0/24") >= spoofBefore+2 }) {
		t.Errorf("spoofed-source drop counter %d → %d: want the DNS query and the SYN dropped", spoofBefore, dropCount(t, w, "saddr != 10.88.0.0/24"))
	}
	if strings.Contains(d.Log.String(), "spoofed.test") {
		t.Error("a query from a spoofed source reached the gate")
	}
	// The gateway's own address, which the proxy would take for the host.
	gwBefore := dropCount(t, w, "saddr 10.88.0.1 ")
	for _, s := range [][]string{
		{"ip", "-n", rogue, "addr", "add", "10.88.0.1/32", "dev", "altrg1"},
		{"ip", "-n", rogue, "route", "add", testworld.DecoyAddr + "/32", "dev", "altrg1", "src", "10.88.0.1"},
		{"ip", "-n", rogue, "neigh", "add", testworld.DecoyAddr, "lladdr", "02:00:00:00:00:01", "dev", "altrg1"},
	} {
		if out, err := sh(s...); err != nil {
			t.Fatalf("%v: %s", s, out)
		}
	}
	sh("ip", "netns", "exec", rogue, "curl", "-s", "-m", "2", "http://"+testworld.DecoyAddr+"/")
	if after := dropCount(t, w, "saddr 10.88.0.1 "); after <= gwBefore {
		t.Errorf("gateway-source drop counter %d → %d: want the SYN dropped", gwBefore, after)
	}
	for _, l := range w.Reached() {
		t.Errorf("reached the internet: %s", l)
	}
}

// dropCount returns the packet counter of the rule in sandbox A's source
// checks whose text contains match.
func dropCount(t *testing.T, w *testworld.World, match string) int {
	t.Helper()
	return ruleCounter(t, w, "inet", "src-al-"+sbA, regexp.MustCompile(regexp.QuoteMeta(match)))
}

func TestIsolation(t *testing.T) {
	w, cfg, _ := setup(t)
	ping := capFreePing(t, w)
	// A host service on the host (airlockd's own API listens on
	// 127.0.0.1:7433 there).
	w.InNetns(w.Host, func() {
		for _, a := range []string{"0.0.0.0:9999"} {
			ln, err := net.Listen("tcp4", a)
			if err != nil {
				t.Errorf("host listener: %v", err)
				return
			}
			t.Cleanup(func() { ln.Close() })
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					t.Errorf("host service %s reached from %s", a, c.RemoteAddr())
					c.Close()
				}
			}()
		}
	})
	// Members: a listener in A (first address), a listener in B.
	waitA := w.Start(cfg, sbA, "server-a", 30*time.Second, os.Args[0], "-test.run=^TestMemberHelper$", "--", "listen", ":8080", "8")
	waitB := w.Start(cfg, sbB, "server-b", 30*time.Second, os.Args[0], "-test.run=^TestMemberHelper$", "--", "listen", ":8080", "8")
	run := func(sb string, argv ...string) testworld.Result {
		return w.Run(cfg, sb, "client", 20*time.Second, argv...)
	}
	// Each server holds its sandbox's first address before a client comes
	// (leases take turns), and is up once a client of its own sandbox is
	// answered (curl retries a refused connection until it listens).
	for _, m := range []struct{ sb, addr, source string }{{sbA, "10.88.0.2", "server-a"}, {sbB, "10.88.1.2", "server-b"}} {
		dir := filepath.Join(w.Dir, "run", "leases", m.sb)
		testenv.WaitFor(t, 10*time.Second, m.source+"'s lease", func() bool {
			return netns.LeaseSource(dir, netip.MustParseAddr(m.addr)) == m.source
		})
	}
	// Two members of the same sandbox reach each other (TCP and ICMP).
	if r := run(sbA, "curl", "-sS", "-m", "15", "--retry", "50", "--retry-connrefused", "--retry-delay", "0", "--retry-max-time", "15", "http://10.88.0.2:8080/"); r.Code != 0 || !strings.Contains(r.Stdout, "member") {
		t.Errorf("member to member in one sandbox: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if r := run(sbB, "curl", "-sS", "-m", "15", "--retry", "50", "--retry-connrefused", "--retry-delay", "0", "--retry-max-time", "15", "http://10.88.1.2:8080/"); r.Code != 0 || !strings.Contains(r.Stdout, "member") {
		t.Errorf("member to member in sandbox B: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if r := run(sbA, ping, "-c", "1", "-W", "2", "10.88.0.2"); r.Code != 0 {
		t.Errorf("ping between members of one sandbox failed: %s %s", r.Stdout, r.Stderr)
	}
	// Sandbox A cannot reach sandbox B's member, nor B A's.
	if r := run(sbA, "curl", "-sSf", "-m", "5", "http://10.88.1.2:8080/"); r.Code == 0 {
		t.Errorf("sandbox A reached sandbox B: %q", r.Stdout)
	}
	if r := run(sbB, ping, "-c", "1", "-W", "2", "10.88.0.2"); r.Code == 0 {
		t.Errorf("sandbox B pinged sandbox A")
	}
	// The host's own services: on the gateway, on the uplink, on loopback
	// (which a member names as its own), and the API port.
	for _, u := range []string{"http://10.88.0.1:9999/", "http://" + testworld.HostUplink + ":9999/", "http://10.88.0.1:7433/", "http://10.88.1.1:9999/", "http://127.0.0.1:7433/"} {
		if r := run(sbA, "curl", "-sSf", "-m", "5", u); r.Code == 0 {
			t.Errorf("curl %s from a sandbox succeeded: %q", u, r.Stdout)
		}
	}
	for _, l := range w.Reached() {
		t.Errorf("reached the internet: %s", l)
	}
	if r := waitA(); !strings.Contains(r.Stdout, "accepted") {
		t.Errorf("sandbox A's server saw no connection: %q %q", r.Stdout, r.Stderr)
	}
	if r := waitB(); strings.Contains(r.Stdout, "accepted from 10.88.0.") {
		t.Errorf("sandbox B's server was reached from sandbox A: %q", r.Stdout)
	}
}

func TestFailClosedWhenAirlockdDies(t *testing.T) {
	w, cfg, d := setup(t)
	if r := w.Run(cfg, sbA, "agent", 20*time.Second, "dig", "+short", "+tries=1", "allowed.test"); !inFakePool(t, r.Stdout) {
		t.Fatalf("before: %q %q", r.Stdout, r.Stderr)
	}
	d.Kill()
	// DNS: to the gate, and straight at the upstream; TCP by name and IP.
	for _, argv := range [][]string{
		{"dig", "+short", "+tries=1", "+time=2", "allowed.test"},
		{"dig", "+short", "+tries=1", "+time=2", "@" + testworld.DNSAddr, "TXT", "allowed.test"},
		{"curl", "-sS", "-m", "3", "http://" + testworld.WebAddr + "/"},
		{"curl", "-sS", "-m", "3", "--resolve", "allowed.test:80:" + testworld.WebAddr, "http://allowed.test/"},
	} {
		r := w.Run(cfg, sbA, "agent", 20*time.Second, argv...)
		if r.Code == 0 && strings.TrimSpace(r.Stdout) != "" {
			t.Errorf("%v with airlockd dead: %q", argv, r.Stdout)
		}
	}
	if n := len(w.DNS.Queries()); n != 0 {
		t.Errorf("with airlockd dead the upstream received %v", w.DNS.Queries())
	}
	for _, l := range w.Reached() {
		t.Errorf("with airlockd dead, reached the internet: %s", l)
	}
	// Start again, no manual cleanup: service returns.
	w.StartDaemon(cfg)
	if r := w.Run(cfg, sbA, "agent", 20*time.Second, "dig", "+short", "+tries=2", "allowed.test"); !inFakePool(t, r.Stdout) {
		t.Errorf("after restart: %q %q", r.Stdout, r.Stderr)
	}
}

func TestTeardown(t *testing.T) {
	w, cfg, d := setup(t)
	bin := testworld.Binaries(t)
	if out, err := w.HostExec(filepath.Join(bin, "airlock"), "teardown", "--config", cfg, sbB); err != nil {
		t.Fatalf("airlock teardown: %v %s", err, out)
	}
	out, _ := w.HostExec("nft", "list", "table", "inet", "airlock")
	if strings.Contains(out, "al-"+sbB) || !strings.Contains(out, "al-"+sbA) {
		t.Errorf("after teardown of %s the table is:\n%s", sbB, out)
	}
	if out, _ := w.HostExec("ip", "link", "show", "al-"+sbB); !strings.Contains(out, "does not exist") {
		t.Errorf("bridge of %s still there: %s", sbB, out)
	}
	d.Stop()
	// Stopped, the rules stay.
	if out, err := w.HostExec("nft", "list", "table", "inet", "airlock"); err != nil || !strings.Contains(out, "al-"+sbA) {
		t.Errorf("after stop the rules are gone: %v %s", err, out)
	}
	if out, err := w.HostExec(filepath.Join(bin, "airlockd"), "--config", cfg, "--teardown"); err != nil {
		t.Fatalf("airlockd --teardown: %v %s", err, out)
	}
	if out, _ := w.HostExec("nft", "list", "tables"); strings.Contains(out, "airlock") {
		t.Errorf("table still there after --teardown: %s", out)
	}
	if out, _ := w.HostExec("ip", "link", "show", "type", "bridge"); strings.Contains(out, "al-") {
		t.Errorf("bridges left after --teardown: %s", out)
	}
}
