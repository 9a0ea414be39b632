package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBandwidthLimit: resources.bandwidth_mbps caps a member's download
// from the test world and its upload to it at about that rate, measured
// over 4 s transfers (the token bucket's burst is 32 KiB: under 1% of
// them), within 0.6N to 1.15N; a poll puts a lower cap in force; lifting
// the cap widens and waits for a reload, after which a download is many
// times faster.
func TestBandwidthLimit(t *testing.T) {
	const mbps = 20
	w, cfg, d, pol, token := policySetup(t, fmt.Sprintf("sandbox:\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n  resources:\n    bandwidth_mbps: %d\n", mbps))
	// rate runs the helper's rate verb in a member and returns Mbit/s.
	rate := func(args ...string) float64 {
		t.Helper()
		r := w.Run(cfg, "default", "agent", 2*time.Minute, append([]string{os.Args[0], "-test.run=^TestMemberHelper$", "--", "rate"}, args...)...)
		f := strings.Fields(r.Stdout)
		if r.Code != 0 || len(f) != 4 || f[0] != "rate" {
			t.Fatalf("rate %v: exit %d %q %q", args, r.Code, r.Stdout, r.Stderr)
		}
		got, _ := strconv.ParseFloat(f[3], 64)
		t.Logf("rate %v: %s bytes in %s s: %.1f Mbit/s", args, f[1], f[2], got)
		return got
	}
	within := func(what string, got float64, n int) {
		t.Helper()
		if lo, hi := 0.6*float64(n), 1.15*float64(n); got < lo || got > hi {
			t.Errorf("%s under a %d Mbit/s cap: %.1f Mbit/s, want %.0f to %.0f", what, n, got, lo, hi)
		}
	}
	qdisc := func() string {
		out, err := w.HostExec("tc", "qdisc", "show", "dev", "al-default", "root")
		if err != nil {
			t.Fatalf("tc qdisc show: %v %s", err, out)
		}
		return out
	}
	// 10 MiB is 4.2 s at 20 Mbit/s.
	within("download", rate("get", "http://allowed.test/blob/10485760"), mbps)
	within("upload", rate("post", "http://allowed.test/sink", "10485760"), mbps)
	if q := qdisc(); !strings.Contains(q, "tbf") || !strings.Contains(q, "rate 20Mbit") {
		t.Errorf("root qdisc of al-default: %q, want tbf rate 20Mbit", q)
	}

	// Lowering the cap restricts: the next poll puts it in force.
	write(t, pol, "sandbox:\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n  resources:\n    bandwidth_mbps: 10\n")
	if log := d.WaitLog(`msg="bandwidth limit" sandbox=default bandwidth_mbps=10`, 1); !strings.Contains(log, "bandwidth_mbps=10") {
		t.Fatal("a lower bandwidth_mbps was not put in force by the poll")
	}
	within("download", rate("get", "http://allowed.test/blob/5242880"), 10)

	// Lifting it widens: held until a reload.
	write(t, pol, "sandbox:\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n")
	d.WaitLog("resources.bandwidth_mbps: 10 → unlimited", 1)
	if q := qdisc(); !strings.Contains(q, "rate 10Mbit") {
		t.Fatalf("a poll lifted the cap: %q", q)
	}
	code, body := call(t, w, token, "POST", "/reload", "")
	var res struct{ Widened []string }
	if json.Unmarshal([]byte(body), &res); code != 200 || len(res.Widened) != 1 || !strings.Contains(res.Widened[0], "resources.bandwidth_mbps: 10 → unlimited") {
		t.Fatalf("reload: %d %s; want it to say the cap was lifted", code, body)
	}
	if q := qdisc(); strings.Contains(q, "tbf") {
		t.Errorf("the cap stayed after the reload lifted it: %q", q)
	}
	if got := rate("get", "http://allowed.test/blob/10485760"); got < 4*mbps {
		t.Errorf("download without a cap: %.1f Mbit/s, want clearly more than the %d Mbit/s cap (at least %d)", got, mbps, 4*mbps)
	}
}
