// Command gatebench runs a DNS gate on loopback for `make bench`: unknown
// names under bench.test get fake IPs, denied.test is denied, names under
// fwd.test are allowed and forwarded to a fake upstream it also runs (TXT
// records t0..t999.fwd.test). The exfiltration guard's cap is lifted so the
// forwarded set does not trip it. -rules pads the policy to that many rules;
// -journal records every query as airlockd does. The gate runs with
// airlockd's runtime setting (package sysmon). It runs until SIGINT or
// SIGTERM.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/dnsgate"
	"github.com/airlockhq/airlock/dnsgate/dnsgatetest"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/sysmon"
	"github.com/airlockhq/airlock/policy"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:5301", "gate address")
	upstream := flag.String("upstream", "127.0.0.1:5300", "fake upstream address (also used by the peers)")
	noGate := flag.Bool("upstream-only", false, "run only the fake upstream")
	nRules := flag.Int("rules", 10, "rules in the policy: the two the benchmark needs, the rest exact hosts and wildcards that match none of its names")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	journal := flag.String("journal", "", "record every query in an audit journal in this directory, as airlockd does (empty: none)")
	flag.Parse()
	if !*noGate {
		// As airlockd runs (package sysmon).
		if err := sysmon.Setup(); err != nil {
			fmt.Fprintf(os.Stderr, "gatebench: the runtime's scheduler monitor keeps its default: %v\n", err)
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fail(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}

	up := &dnsgatetest.Server{TXT: map[string]string{}}
	for i := 0; i < 1000; i++ {
		up.TXT[fmt.Sprintf("t%d.fwd.test", i)] = "v=bench"
	}
	if _, err := up.Start(*upstream); err != nil {
		fail(err)
	}
	if !*noGate {
		rules := []*policy.Rule{
			policy.NewRule(policy.Allowlist, policy.User, policy.MustParse("*.fwd.test"), "", "bench", time.Time{}),
			policy.NewRule(policy.Denylist, policy.User, policy.MustParse("denied.test"), "", "bench", time.Time{}),
		}
		for i := len(rules); i < *nRules; i++ {
			p := fmt.Sprintf("h%d.example.com", i)
			if i%5 == 0 {
				p = fmt.Sprintf("*.w%d.example.com", i)
			}
			rules = append(rules, policy.NewRule(policy.Allowlist, policy.User, policy.MustParse(p), "", "bench", time.Time{}))
		}
		pool, err := dnsgate.NewPool(dnsgate.DefaultPool)
		if err != nil {
			fail(err)
		}
		u, err := dnsgate.NewUpstream([]string{*upstream}, 0)
		if err != nil {
			fail(err)
		}
		guard, err := dnsgate.NewGuard(dnsgate.GuardConfig{MaxSubdomains: 1 << 30}, nil)
		if err != nil {
			fail(err)
		}
		cfg := dnsgate.Config{
			Sandbox:  "bench",
			Listen:   netip.MustParseAddrPort(*listen),
			Policy:   policy.NewRuleset(policy.ActionAsk, rules),
			Pool:     pool,
			Upstream: u,
			Guard:    guard,
			Logger:   slog.New(slog.DiscardHandler),
		}
		if *journal != "" {
			j, err := audit.Open(audit.Config{Dir: *journal})
			if err != nil {
				fail(err)
			}
			defer j.Close()
			// As airlockd records a query (internal/supervisor: dnsEntry,
			// record, recordHeld).
			entry := func(e dnsgate.Event) audit.Entry {
				return audit.Entry{Time: e.Time, Kind: audit.KindDNS, Sandbox: "bench", Source: e.Source, Host: e.Name, DNSType: e.Type, Verdict: e.Verdict, Rule: e.Rule, Reason: e.Reason}
			}
			cfg.OnEvent = func(e dnsgate.Event) { j.Add(entry(e)) }
			cfg.OnEventHeld = func(e dnsgate.Event) { j.AddHeld(entry(e)) }
			cfg.Commit = j.Commit
			cfg.Recording = j.Err
		}
		g, err := dnsgate.New(cfg)
		if err != nil {
			fail(err)
		}
		if err := g.Start(); err != nil {
			fail(err)
		}
		defer g.Close()
	}
	fmt.Println("ready")
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
	up.Close()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gatebench:", err)
	os.Exit(1)
}
