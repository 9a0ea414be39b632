package e2e

import (
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testworld"
)

func reachedMatching(w *testworld.World, sub string) []string {
	var out []string
	for _, l := range w.Reached() {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

func TestProxyAllowedHostsAreSpliced(t *testing.T) {
	w, cfg, d := setup(t)
	r := w.Run(cfg, sbA, "agent", 20*time.Second, "curl", "-sSf", "-m", "10", "--cacert", w.CAFile, "https://allowed.test/")
	if r.Code != 0 || r.Stdout != "internet" {
		t.Fatalf("https://allowed.test/: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	r = w.Run(cfg, sbA, "agent", 20*time.Second, "curl", "-sSf", "-m", "10", "http://allowed.test/")
	if r.Code != 0 || r.Stdout != "internet" {
		t.Fatalf("http://allowed.test/: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	// The server saw the requests, TLS end to end with the client's own
	// SNI: the bytes were spliced, not re-encrypted.
	if got := reachedMatching(w, "https 203.0.113.10:443 ← 203.0.113.254"); len(got) != 1 || !strings.Contains(got[0], "host allowed.test sni allowed.test") {
		t.Errorf("HTTPS request at the server: %v", got)
	}
	if got := reachedMatching(w, "http 203.0.113.10:80"); len(got) != 1 || !strings.Contains(got[0], "host allowed.test") {
		t.Errorf("HTTP request at the server: %v", got)
	}
	// One record per connection, naming the rule.
	rec := `msg=connection component=tproxy sandbox=sba source=agent host=allowed.test port=443 verdict=allow rule=allowed.test`
	log := d.WaitLog(rec, 1)
	if n := strings.Count(log, rec); n != 1 {
		t.Errorf("%d allow records for allowed.test:443 in the log", n)
	}
}

func TestProxyHoldsUnknownHosts(t *testing.T) {
	w, cfg, d := setup(t)
	// Three parallel connections to one unknown host: one approval, and
	// with nobody deciding, all three end denied after 2 s.
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := w.Run(cfg, sbA, "agent", 30*time.Second, "curl", "-sSf", "-m", "15", "--cacert", w.CAFile, "https://unknown.test/")
			if r.Code == 0 {
				t.Errorf("unknown.test got through: %q", r.Stdout)
			}
		}()
	}
	wg.Wait()
	if el := time.Since(start); el < 2*time.Second {
		t.Errorf("held connections ended after %v, before the 2 s approval timeout", el)
	}
	deny := `host=unknown.test port=443 verdict=deny rule="" reason="no decision within 2s"`
	log := d.WaitLog(deny, 3)
	if n := strings.Count(log, `msg="approval opened" sandbox=sba`); n != 1 {
		t.Errorf("%d approvals opened for 3 parallel connections, want 1:\n%s", n, log)
	}
	if !strings.Contains(log, `host=unknown.test port=443 action=timeout waiting=3`) {
		t.Errorf("no timeout decision with 3 waiting in the log")
	}
	if n := strings.Count(log, deny); n != 3 {
		t.Errorf("%d deny records for unknown.test, want 3", n)
	}
	if w.DNS.Saw("unknown.test") {
		t.Error("the proxy resolved unknown.test upstream before anyone approved it")
	}
	for _, l := range w.Reached() {
		t.Errorf("reached the internet: %s", l)
	}
}

func TestProxyDialsByName(t *testing.T) {
	w, cfg, _ := setup(t)
	run := func(sb string, argv ...string) testworld.Result {
		return w.Run(cfg, sb, "agent", 20*time.Second, argv...)
	}
	// The client's chosen address is ignored: the name decides where the
	// connection goes.
	if r := run(sbA, "curl", "-sSf", "-m", "10", "--cacert", w.CAFile, "--resolve", "allowed.test:443:"+testworld.DecoyAddr, "https://allowed.test/"); r.Stdout != "internet" {
		t.Errorf("--resolve to the decoy: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if r := run(sbA, "curl", "-sSf", "-m", "10", "-H", "Host: allowed.test", "http://"+testworld.DecoyAddr+"/"); r.Stdout != "internet" {
		t.Errorf("Host: allowed.test to the decoy's IP: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if got := reachedMatching(w, testworld.DecoyAddr); len(got) != 0 {
		t.Errorf("the decoy was reached: %v", got)
	}
	if got := reachedMatching(w, "203.0.113.10"); len(got) != 2 {
		t.Errorf("the real allowed.test server saw %v, want both requests", got)
	}
	// A raw IP: denied without a cidr rule (sba), allowed with one (sbb).
	if r := run(sbA, "curl", "-sSfk", "-m", "10", "https://"+testworld.WebAddr+"/"); r.Code == 0 {
		t.Errorf("raw IP from sba: %q", r.Stdout)
	}
	if r := run(sbB, "curl", "-sSfk", "-m", "10", "https://"+testworld.WebAddr+"/"); r.Stdout != "internet" {
		t.Errorf("raw IP from sbb with cidr:203.0.113.10/32: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
}

func TestProxySSRFGuard(t *testing.T) {
	w, cfg, _ := setup(t)
	// private.test and metadata.test are allowed by name in sba but
	// resolve to a private and a link-local address.
	for _, u := range []string{"http://private.test/", "http://metadata.test/latest/meta-data/"} {
		r := w.Run(cfg, sbA, "agent", 20*time.Second, "curl", "-sS", "-m", "10", u)
		if !strings.Contains(r.Stdout, "403") && !strings.Contains(r.Stdout, "SSRF guard refuses") {
			t.Errorf("%s: %q %q", u, r.Stdout, r.Stderr)
		}
	}
	if got := w.Reached(); len(got) != 0 {
		t.Errorf("a private or metadata address was reached: %v", got)
	}
	// sbb names 10.255.0.1 explicitly: allowed.
	if r := w.Run(cfg, sbB, "agent", 20*time.Second, "curl", "-sSf", "-m", "10", "http://private.test/"); r.Code != 0 {
		t.Errorf("private.test with an explicit cidr rule: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if got := reachedMatching(w, "tcp 10.255.0.1:80"); len(got) != 1 {
		t.Errorf("private service log: %v", got)
	}
}

func TestProxyPortsNeedRules(t *testing.T) {
	w, cfg, _ := setup(t)
	ssh := []string{"bash", "-c", "exec 3<>/dev/tcp/ssh.test/22 && timeout 5 head -c 17 <&3"}
	if r := w.Run(cfg, sbA, "agent", 20*time.Second, ssh...); strings.Contains(r.Stdout, "SSH-2.0") {
		t.Errorf("port 22 without a :22 rule: %q", r.Stdout)
	}
	if got := reachedMatching(w, "banner"); len(got) != 0 {
		t.Errorf("the banner server was reached without a :22 rule: %v", got)
	}
	if r := w.Run(cfg, sbB, "agent", 20*time.Second, ssh...); r.Stdout != "SSH-2.0-testworld" {
		t.Errorf("port 22 with ssh.test:22: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
}

func TestProxyManyConnections(t *testing.T) {
	w, cfg, _ := setup(t)
	r := w.Run(cfg, sbA, "agent", 3*time.Minute, os.Args[0], "-test.run=^TestMemberHelper$", "--", "fetch", "1000", "http://allowed.test/bytes/65536")
	if !strings.Contains(r.Stdout, "ok 1000 of 1000") {
		t.Errorf("1000 concurrent connections: %q %q", r.Stdout, r.Stderr)
	}
}

func TestProxyBadInputKeepsServing(t *testing.T) {
	w, cfg, _ := setup(t)
	r := w.Run(cfg, sbA, "agent", 30*time.Second, os.Args[0], "-test.run=^TestMemberHelper$", "--", "garbage", testworld.WebAddr+":443")
	if !strings.Contains(r.Stdout, "closed after") {
		t.Errorf("garbage: %q %q", r.Stdout, r.Stderr)
	}
	if got := w.Reached(); len(got) != 0 {
		t.Errorf("garbage reached the internet: %v", got)
	}
	if r := w.Run(cfg, sbA, "agent", 20*time.Second, "curl", "-sSf", "-m", "10", "http://allowed.test/"); r.Stdout != "internet" {
		t.Errorf("after garbage: %q %q", r.Stdout, r.Stderr)
	}
}
