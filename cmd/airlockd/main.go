// Command airlockd is airlock's host agent: it builds the sandbox networks
// and the nftables rule set, runs each sandbox's DNS gate, and stands at the
// proxy port, until SIGINT or SIGTERM. Stopping it leaves the rules in place,
// so sandboxes stay closed until it is back; --teardown removes everything.
package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/vishvananda/netlink"

	"github.com/airlockhq/airlock/dnsgate"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/metrics"
	"github.com/airlockhq/airlock/netns"
	"github.com/airlockhq/airlock/policy"
	"github.com/airlockhq/airlock/tproxy"
	"github.com/airlockhq/airlock/ui"
)

func main() {
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("airlockd", flag.ContinueOnError)
	cfgPath := fs.String("config", config.DefaultPath, "config file; the built-in default is used when the default path does not exist")
	teardown := fs.Bool("teardown", false, "remove airlock's nftables table, sandbox bridges and leases, then exit")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	printDefault := fs.Bool("print-default-config", false, "print the built-in config and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "airlockd: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *printDefault {
		os.Stdout.Write(config.DefaultYAML())
		return 0
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(os.Stderr, "airlockd: --log-level %q: want debug, info, warn or error\n", *level)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))

	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "config" })
	cfg, err := loadConfig(*cfgPath, explicit)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlockd: %v\n", err)
		return 1
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "airlockd: must run as root: it builds bridges and nftables rules (try: sudo airlockd)")
		return 1
	}
	if *teardown {
		if err := teardownAll(cfg); err != nil {
			fmt.Fprintf(os.Stderr, "airlockd: teardown: %v\n", err)
			return 1
		}
		log.Info("teardown complete: nftables table, bridges and leases removed")
		return 0
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	d, err := start(ctx, cfg, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlockd: %v\n", err)
		if d != nil {
			d.close()
		}
		return 1
	}
	<-ctx.Done()
	log.Info("stopping; the rules stay, so sandboxes are closed until airlockd is back")
	d.close()
	return 0
}

func loadConfig(path string, explicit bool) (*config.Config, error) {
	cfg, err := config.Load(path)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return config.Default(), nil
	}
	return cfg, err
}

type daemon struct {
	log       *slog.Logger
	closers   []func() error
	sandboxes []*sandbox
	api       *ui.Server
}

// sandbox is a running sandbox, as the API sees it.
type sandbox struct {
	name    string
	subnet  string
	policy  *policy.Sandbox
	broker  *policy.Broker
	journal *audit.Journal
	ca      *tproxy.CA
	proxy   *tproxy.Proxy
}

func (s *sandbox) Name() string            { return s.name }
func (s *sandbox) Subnet() string          { return s.subnet }
func (s *sandbox) Policy() *policy.Sandbox { return s.policy }
func (s *sandbox) Broker() *policy.Broker  { return s.broker }
func (s *sandbox) Journal() *audit.Journal { return s.journal }
func (s *sandbox) CAPEM() []byte           { return s.ca.CertPEM() }

func (d *daemon) uiSandboxes() []ui.Sandbox {
	out := make([]ui.Sandbox, len(d.sandboxes))
	for i, s := range d.sandboxes {
		out[i] = s
	}
	return out
}

func (d *daemon) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		if err := d.closers[i](); err != nil {
			d.log.Warn("close", "err", err)
		}
	}
}

func start(ctx context.Context, cfg *config.Config, log *slog.Logger) (*daemon, error) {
	d := &daemon{log: log}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state_dir: %w", err)
	}
	if err := os.MkdirAll(cfg.RunDir, 0o755); err != nil {
		return nil, fmt.Errorf("run_dir: %w", err)
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	d.closers = append(d.closers, func() error { h.Close(); return nil })
	conn, err := nftables.New()
	if err != nil {
		return d, fmt.Errorf("nftables: %w", err)
	}

	nets := make([]netns.Network, len(cfg.Sandboxes))
	rules := tproxy.RulesConfig{ProxyPort: cfg.ProxyPort, MemberVethPrefix: netns.MemberVethPrefix}
	for i, sb := range cfg.Sandboxes {
		n, err := netns.NewNetwork(sb.Name, sb.Subnet)
		if err != nil {
			return d, err
		}
		nets[i] = n
		rules.Sandboxes = append(rules.Sandboxes, tproxy.SandboxNet{Bridge: n.Bridge, Subnet: n.Subnet, Gateway: n.Gateway})
	}
	// Rules first: a bridge is caged from the moment it exists.
	if err := tproxy.EnsureRules(conn, rules); err != nil {
		return d, err
	}
	for _, n := range nets {
		if err := n.Ensure(h); err != nil {
			return d, err
		}
	}

	pool, err := dnsgate.NewPool(cfg.FakeIPPool)
	if err != nil {
		return d, err
	}
	servers, err := dnsgate.ParseUpstreams(cfg.UpstreamDNS, "/etc/resolv.conf")
	if err != nil {
		return d, err
	}
	upstream, err := dnsgate.NewUpstream(servers, 0)
	if err != nil {
		return d, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mets := metrics.New(reg)
	roots, err := upstreamRoots(cfg.UpstreamCAFile)
	if err != nil {
		return d, err
	}
	for i, sb := range cfg.Sandboxes {
		n := nets[i]
		pol, err := policy.OpenSandbox(policy.SandboxConfig{Name: sb.Name, Path: sb.Policy})
		if err != nil {
			return d, err
		}
		guard, err := dnsgate.NewGuard(dnsgate.GuardConfig{
			MaxLabelLen:   cfg.Exfil.MaxLabelLen,
			MaxSubdomains: cfg.Exfil.MaxSubdomainsPerMinute,
			AlertOnly:     cfg.Exfil.AlertOnly,
		}, nil)
		if err != nil {
			return d, err
		}
		journal, err := audit.Open(audit.Config{Dir: filepath.Join(cfg.StateDir, "audit", sb.Name)})
		if err != nil {
			return d, err
		}
		d.closers = append(d.closers, journal.Close)
		record := func(e audit.Entry) {
			e.Sandbox = sb.Name
			mets.Observe(journal.Add(e))
		}
		leases := cfg.LeaseDir(sb.Name)
		gate, err := dnsgate.New(dnsgate.Config{
			Sandbox:  sb.Name,
			Listen:   netip.AddrPortFrom(n.Gateway, 53),
			Clients:  n.Subnet,
			Policy:   pol,
			Pool:     pool,
			Upstream: upstream,
			Guard:    guard,
			Members:  func(a netip.Addr) string { return netns.LeaseSource(leases, a) },
			OnEvent:  func(e dnsgate.Event) { record(dnsEntry(e)) },
			Logger:   log,
		})
		if err != nil {
			return d, err
		}
		if err := gate.Start(); err != nil {
			return d, err
		}
		d.closers = append(d.closers, gate.Close)
		broker, err := policy.NewBroker(policy.BrokerConfig{Sandbox: pol, OnEvent: func(e policy.BrokerEvent) {
			log.Info("approval "+e.Kind, "sandbox", sb.Name, "id", e.Pending.ID, "source", e.Pending.Source,
				"host", e.Pending.Host, "port", e.Pending.Port, "action", e.Action, "waiting", e.Pending.Waiting)
			record(approvalEntry(e))
		}})
		if err != nil {
			return d, err
		}
		ca, err := tproxy.LoadOrCreateCA(filepath.Join(cfg.StateDir, "ca", sb.Name), sb.Name)
		if err != nil {
			return d, err
		}
		proxy, err := tproxy.New(tproxy.Config{
			Sandbox:       sb.Name,
			Listen:        netip.AddrPortFrom(n.Gateway, cfg.ProxyPort),
			Policy:        pol,
			Approvals:     broker,
			Names:         pool,
			Resolve:       dnsgate.NewResolver(upstream, guard, nil).LookupA,
			Members:       func(a netip.Addr) string { return netns.LeaseSource(leases, a) },
			OnRecord:      func(r tproxy.Record) { record(connEntry(r)) },
			OnRequest:     func(r tproxy.RequestRecord) { record(requestEntry(r)) },
			CA:            ca,
			UpstreamRoots: roots,
			InspectAll:    pol.InspectAll,
			Logger:        log,
			ApprovalURL:   "http://" + cfg.APIListen + "/",
		})
		if err != nil {
			return d, err
		}
		if err := proxy.Start(); err != nil {
			return d, err
		}
		d.closers = append(d.closers, proxy.Close)
		d.sandboxes = append(d.sandboxes, &sandbox{name: sb.Name, subnet: n.Subnet.String(), policy: pol, broker: broker, journal: journal, ca: ca, proxy: proxy})
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "airlock_pending_approvals", Help: "Approvals waiting for a person.", ConstLabels: prometheus.Labels{"sandbox": sb.Name}},
				func() float64 { return float64(len(broker.List())) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "airlock_open_connections", Help: "Connections the proxy holds open.", ConstLabels: prometheus.Labels{"sandbox": sb.Name}},
				func() float64 { return float64(proxy.Active()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "airlock_cert_cache_entries", Help: "Cached leaf certificates.", ConstLabels: prometheus.Labels{"sandbox": sb.Name}},
				func() float64 { return float64(ca.CacheLen()) }),
		)
		log.Info("sandbox ready", "sandbox", sb.Name, "bridge", n.Bridge, "subnet", n.Subnet.String(),
			"gate", n.Gateway.String()+":53", "policy", sb.Policy, "rules", len(pol.Rules()))
	}
	api, err := ui.New(ui.Config{
		Listen:    cfg.APIListen,
		TokenFile: filepath.Join(cfg.StateDir, "token"),
		Sandboxes: d.uiSandboxes,
		Registry:  reg,
		Logger:    log,
	})
	if err != nil {
		return d, err
	}
	if err := api.Start(); err != nil {
		return d, err
	}
	d.closers = append(d.closers, api.Close)
	d.api = api
	log.Info("airlockd ready", "config", cfg.Path, "upstream_dns", servers, "sandboxes", len(cfg.Sandboxes),
		"api", apiURL(cfg.APIListen), "token_file", filepath.Join(cfg.StateDir, "token"))
	return d, nil
}

func apiURL(listen string) string {
	if strings.HasPrefix(listen, "unix:") {
		return listen
	}
	return "http://" + listen + "/"
}

// upstreamRoots are the system roots plus the certificates in file (the
// config's upstream_ca_file), which verify upstream TLS when intercepting.
func upstreamRoots(file string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if file == "" {
		return pool, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("upstream_ca_file: %w", err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("upstream_ca_file %s holds no PEM certificate", file)
	}
	return pool, nil
}

// teardownAll removes the table, the bridges of configured sandboxes and of
// any sandbox the table still names, and the leases.
func teardownAll(cfg *config.Config) error {
	conn, err := nftables.New()
	if err != nil {
		return err
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	bridges := map[string]bool{}
	for _, sb := range cfg.Sandboxes {
		bridges[netns.BridgeName(sb.Name)] = true
	}
	for _, b := range tproxy.TableBridges(conn) {
		bridges[b] = true
	}
	// Bridges first: a bridge without rules would be open. If one cannot
	// be removed, the rules stay.
	var errs []error
	for b := range bridges {
		if err := netns.DeleteBridge(h, b); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("rules kept because a bridge could not be removed: %w", errors.Join(errs...))
	}
	if err := tproxy.DeleteRules(conn); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(filepath.Join(cfg.RunDir, "leases")); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
