package supervisor

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/dnsgate"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/metrics"
	"github.com/airlockhq/airlock/internal/session"
	"github.com/airlockhq/airlock/memberapi"
	"github.com/airlockhq/airlock/netns"
	"github.com/airlockhq/airlock/policy"
	"github.com/airlockhq/airlock/tproxy"
	"github.com/airlockhq/airlock/ui"
)

// daemon is a running airlockd: the shared pieces, and the sandboxes.
type Daemon struct {
	ctx context.Context
	// cfgPath and cfgExplicit say where a reload reads the config from;
	// without an explicit --config, a missing file means the built-in one.
	cfgPath     string
	cfgExplicit bool
	// notify tells systemd about the daemon's state (sd_notify).
	notify func(state string)
	cfg    *config.Config
	log    *slog.Logger
	h      *netlink.Handle
	conn   *nftables.Conn
	// nftMu keeps batches on conn whole (a sandbox's divert rule changes
	// with its bandwidth limit, from any goroutine). Taken after d.mu.
	nftMu    sync.Mutex
	upstream *dnsgate.Upstream
	local    netns.LocalAddrs
	servers  []string
	roots    *x509.CertPool
	reg      *prometheus.Registry
	mets     *metrics.Metrics
	smets    *metrics.Sessions
	api      *ui.Server

	docker     *netns.Docker // nil without a Docker Engine
	dockerRuns dockerMembers

	// expose carries out allowed port requests; nil means ports cannot be
	// exposed (requests.go).
	expose Exposer
	// host is what "host" stands for in resource bounds.
	host policy.HostResources

	// mu serialises sandbox changes and guards sandboxes.
	mu        sync.Mutex
	sandboxes []*sandbox
	byName    sync.Map // name -> *sandbox: the running sandboxes, read without mu
}

// sandbox is a running sandbox, as the API sees it.
type sandbox struct {
	cfg     config.Sandbox
	fromAPI bool // created through the API, remembered in STATE_DIR/sandboxes.json
	net     netns.Network
	policy  *policy.Sandbox
	broker  *policy.Broker
	journal *audit.Journal
	ca      *tproxy.CA
	proxy   *tproxy.Proxy
	closers []func() error
	docker  *netns.Docker // the daemon's, or nil
	gauges  []prometheus.Collector
	// sessions are the sandbox's sessions (sessions.go).
	sessions *session.Manager
	// exposures are its members' ports forwarded to the host (expose.go).
	exposures exposureSet
	// policyFP is the policy file as last read; d.mu guards it.
	policyFP fingerprint
	// bandwidth is the bandwidth limit last put on the bridge, in Mbit/s
	// (0: none).
	bandwidth atomic.Int64
	// bandwidthMu orders the changes of the limit (policy edits, polls
	// and reloads may race).
	bandwidthMu sync.Mutex
	// held says how the policy file widens access, when a poll kept it
	// out of force until a person reloads; d.mu guards it.
	held []string
}

func (s *sandbox) Name() string            { return s.cfg.Name }
func (s *sandbox) Subnet() string          { return s.cfg.Subnet.String() }
func (s *sandbox) Policy() *policy.Sandbox { return s.policy }
func (s *sandbox) Broker() *policy.Broker  { return s.broker }
func (s *sandbox) Journal() *audit.Journal { return s.journal }
func (s *sandbox) CAPEM() []byte           { return s.ca.CertPEM() }

func (s *sandbox) stop(log *slog.Logger) {
	for i := len(s.closers) - 1; i >= 0; i-- {
		if err := s.closers[i](); err != nil {
			log.Warn("close", "sandbox", s.cfg.Name, "err", err)
		}
	}
	s.closers = nil
}

// startOptions are what start needs besides the config itself.
type Options struct {
	ConfigPath string // the --config path, read again on reload
	Explicit   bool   // --config was given: a missing file is an error
	// Notify tells systemd about the daemon's state (sd_notify); nil
	// means nobody is told.
	Notify func(state string)
}

// start brings up what every sandbox shares, then each configured and
// API-made sandbox, then the API. On error, what started is stopped.
func Start(ctx context.Context, cfg *config.Config, log *slog.Logger, opt Options) (*Daemon, error) {
	if opt.Notify == nil {
		opt.Notify = func(string) {}
	}
	d := &Daemon{ctx: ctx, cfg: cfg, log: log, cfgPath: opt.ConfigPath, cfgExplicit: opt.Explicit, notify: opt.Notify, host: hostResources()}
	if err := d.init(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

func (d *Daemon) init() error {
	cfg := d.cfg
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state_dir: %w", err)
	}
	// The default home of policy files (a sandbox without policy:, and
	// those made through the API): the first saved rule writes there.
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "sandboxes"), 0o700); err != nil {
		return fmt.Errorf("state_dir: %w", err)
	}
	if err := os.MkdirAll(cfg.RunDir, 0o755); err != nil {
		return fmt.Errorf("run_dir: %w", err)
	}
	var err error
	if d.h, err = netlink.NewHandle(); err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	if d.conn, err = nftables.New(); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if err := netns.EnsureDivertRouting(d.h); err != nil {
		return err
	}
	if d.servers, err = dnsgate.ParseUpstreams(cfg.UpstreamDNS, "/etc/resolv.conf"); err != nil {
		return err
	}
	if d.upstream, err = dnsgate.NewUpstream(d.servers, 0); err != nil {
		return err
	}
	if d.roots, err = upstreamRoots(cfg.UpstreamCAFile); err != nil {
		return err
	}
	d.reg = prometheus.NewRegistry()
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d.mets = metrics.New(d.reg)
	d.smets = metrics.NewSessions(d.reg)

	// The config file's sandboxes, then those made through the API on an
	// earlier run; the config file wins a clash of name or subnet.
	probe := *cfg
	fromAPI := map[string]bool{}
	saved, err := config.LoadAPISandboxes(cfg.StateDir)
	if err != nil {
		return err
	}
	for _, s := range saved {
		sb, err := probe.NewSandbox(s.Name, s.Policy, s.Subnet.String(), cfg.StateDir)
		if err != nil {
			d.log.Warn("API-made sandbox skipped", "sandbox", s.Name, "err", err)
			continue
		}
		probe.Sandboxes = append(probe.Sandboxes, sb)
		fromAPI[sb.Name] = true
	}
	wanted := probe.Sandboxes
	d.connectDocker()
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.dropStaleBridgesLocked(wanted); err != nil {
		return err
	}
	// Rules first, for every sandbox at once: a bridge is caged from the
	// moment it exists.
	if err := d.ensureRulesLocked(wanted); err != nil {
		return err
	}
	for _, sb := range wanted {
		s, err := d.startSandboxLocked(sb, fromAPI[sb.Name])
		if err != nil {
			return err
		}
		d.registerLocked(s)
	}
	d.startDockerLocked()
	uicfg := ui.Config{
		Listen:    cfg.APIListen,
		TokenFile: filepath.Join(cfg.StateDir, "token"),
		Sandboxes: d.uiSandboxes,
		Manager:   d,
		Sessions:  d.sessionsOf,
		Exposures: d,
		Registry:  d.reg,
		Logger:    d.log,
	}
	if d.docker != nil {
		uicfg.Containers = d
	}
	d.api, err = ui.New(uicfg)
	if err != nil {
		return err
	}
	if err := d.api.Start(); err != nil {
		return err
	}
	d.log.Info("airlockd ready", "config", cfg.Path, "upstream_dns", d.servers, "sandboxes", len(d.sandboxes),
		"api", APIURL(cfg.APIListen), "token_file", filepath.Join(cfg.StateDir, "token"))
	return nil
}

// dropStaleBridgesLocked removes the bridges, divert pairs and divert
// chains of sandboxes that the rules left by an earlier run name but that
// are wanted no more (taken out of the config while airlockd was stopped):
// the new rules would not cage them.
// A bridge that cannot be removed fails the start, and the old rules stay.
func (d *Daemon) dropStaleBridgesLocked(wanted []config.Sandbox) error {
	keep := map[string]bool{}
	for _, sb := range wanted {
		keep[netns.BridgeName(sb.Name)] = true
	}
	d.nftMu.Lock()
	bridges := tproxy.TableBridges(d.conn)
	d.nftMu.Unlock()
	for _, b := range bridges {
		if keep[b] {
			continue
		}
		if err := d.removeNetwork(b); err != nil {
			return fmt.Errorf("remove bridge %s of a sandbox no longer configured (its rules stay until it is gone): %w", b, err)
		}
		d.log.Info("removed the bridge of a sandbox no longer configured", "bridge", b)
	}
	return nil
}

func (d *Daemon) ensureRulesLocked(sbs []config.Sandbox) error {
	rules := tproxy.RulesConfig{ProxyPort: d.cfg.ProxyPort, Mark: netns.DivertMark, MemberVethPrefix: netns.MemberVethPrefix,
		DivertPrefix: netns.DivertPrefix, SinkPrefix: netns.SinkPrefix, BridgePrefix: netns.BridgePrefix}
	for _, sb := range sbs {
		n, err := netns.NewNetwork(sb.Name, sb.Subnet)
		if err != nil {
			return err
		}
		rules.Sandboxes = append(rules.Sandboxes, tproxy.SandboxNet{Bridge: n.Bridge, Subnet: n.Subnet, Gateway: n.Gateway, Sink: n.Sink})
	}
	d.nftMu.Lock()
	defer d.nftMu.Unlock()
	return tproxy.EnsureRules(d.conn, rules)
}

// ensureNetwork builds a sandbox's bridge and divert pair, then the
// netdev rule that diverts the bridge's packets into the pair, without a
// bandwidth cap (setBandwidth reshapes it); its rules in airlock's inet
// table must be in place.
func (d *Daemon) ensureNetwork(n netns.Network) error {
	divert, err := n.Ensure(d.h)
	if err != nil {
		return err
	}
	return d.writeDivert(n, divert, false)
}

// shapeDivert rewrites a sandbox's divert rule to send every TCP frame
// through its divert pair (shaped: the upload cap is the pair's queue) or
// only what must go there.
func (d *Daemon) shapeDivert(n netns.Network, shaped bool) error {
	link, err := d.h.LinkByName(n.Divert)
	if err != nil {
		return fmt.Errorf("divert pair of %s: %w", n.Bridge, err)
	}
	return d.writeDivert(n, link.Attrs().Index, shaped)
}

// writeDivert writes the netdev rule of n's bridge for its divert end,
// interface index divert.
func (d *Daemon) writeDivert(n netns.Network, divert int, shaped bool) error {
	d.nftMu.Lock()
	defer d.nftMu.Unlock()
	return tproxy.EnsureDivert(d.conn, tproxy.DivertNet{Bridge: n.Bridge, Subnet: n.Subnet, Gateway: n.Gateway, DivertIndex: divert, Shaped: shaped})
}

// removeNetwork removes a sandbox bridge's divert rule, then the bridge and
// its divert pair. Either way round it stays caged: without the divert rule
// the host's input and forward chains drop what the bridge passes up.
func (d *Daemon) removeNetwork(bridge string) error {
	d.nftMu.Lock()
	err := tproxy.DeleteDivert(d.conn, bridge)
	d.nftMu.Unlock()
	if err != nil {
		return err
	}
	return netns.DeleteBridge(d.h, bridge)
}

func (d *Daemon) runningConfigsLocked() []config.Sandbox {
	out := make([]config.Sandbox, len(d.sandboxes))
	for i, s := range d.sandboxes {
		out[i] = s.cfg
	}
	return out
}

// startSandboxLocked brings up one sandbox whose rules are in place:
// bridge, policy, journal, DNS gate, broker, CA and proxy.
func (d *Daemon) startSandboxLocked(sb config.Sandbox, fromAPI bool) (_ *sandbox, err error) {
	s := &sandbox{cfg: sb, fromAPI: fromAPI, docker: d.docker}
	defer func() {
		if err != nil {
			s.stop(d.log) // s, not the result, which is nil on error
		}
	}()
	if err = d.openSandbox(s); err != nil {
		return nil, err
	}
	attr := attribution{d: d, sandbox: sb.Name, gateway: s.net.Gateway, leases: d.cfg.LeaseDir(sb.Name), dockers: s.net.DockerRange()}
	if cache, cerr := netns.NewLeaseCache(attr.leases); cerr != nil {
		// Still right, only slower: each lookup reads the lease file.
		d.log.Warn("member leases are read on every connection and query", "sandbox", sb.Name, "err", cerr)
	} else {
		attr.cache = cache
		s.closers = append(s.closers, cache.Close)
	}
	members := attr.member
	guard, err := dnsgate.NewGuard(dnsgate.GuardConfig{
		MaxLabelLen:   d.cfg.Exfil.MaxLabelLen,
		MaxSubdomains: d.cfg.Exfil.MaxSubdomainsPerMinute,
		AlertOnly:     d.cfg.Exfil.AlertOnly,
	}, nil)
	if err != nil {
		return nil, err
	}
	pool, err := d.startGate(s, guard, members)
	if err != nil {
		return nil, err
	}
	if err = d.startProxy(s, pool, guard, attr); err != nil {
		return nil, err
	}
	d.registerGauges(s)
	if err = d.startSessions(s); err != nil {
		return nil, err
	}
	// Last, so that it runs first when the sandbox stops.
	s.closers = append(s.closers, func() error { d.closeExposures(s); return nil })
	d.log.Info("sandbox ready", "sandbox", sb.Name, "bridge", s.net.Bridge, "subnet", s.net.Subnet.String(),
		"gate", s.net.Gateway.String()+":53", "policy", sb.Policy, "rules", len(s.policy.Rules()))
	return s, nil
}

// openSandbox builds a sandbox's bridge, reads its policy file, names its
// Docker members and opens its journal.
func (d *Daemon) openSandbox(s *sandbox) error {
	sb := s.cfg
	var err error
	if s.net, err = netns.NewNetwork(sb.Name, sb.Subnet); err != nil {
		return err
	}
	if err = d.ensureNetwork(s.net); err != nil {
		return err
	}
	if err = seedPolicy(sb); err != nil {
		return err
	}
	// Before the file is read: an edit in between is then seen as a change.
	s.policyFP = fingerprintOf(sb.Policy)
	// The kernel's bandwidth limit follows every policy put in force:
	// reloads, polls and edits through the API.
	follow := func(r policy.Resources) {
		if err := d.setBandwidth(s, r.BandwidthMbps); err != nil {
			d.log.Error("bandwidth limit not applied", "sandbox", sb.Name, "bandwidth_mbps", r.BandwidthMbps, "err", err)
		}
	}
	if s.policy, err = policy.OpenSandbox(policy.SandboxConfig{Name: sb.Name, Path: sb.Policy, UnnamedUntrusted: true, OnResources: follow}); err != nil {
		return err
	}
	// A limit the kernel does not take fails the start, as its rules
	// would.
	if err = d.setBandwidth(s, s.policy.Spec().Resources.BandwidthMbps); err != nil {
		return err
	}
	if d.docker != nil {
		// Before the gate and proxy listen: containers already running on
		// the sandbox's network are named, and trusted as labelled, from
		// their first packet.
		d.docker.Register(sb.Name, s.net)
		for _, m := range d.docker.Members(sb.Name) {
			s.trustLabel(m)
		}
	}
	if s.journal, err = audit.Open(audit.Config{Dir: filepath.Join(d.cfg.StateDir, "audit", sb.Name), Logger: d.log.With("sandbox", sb.Name)}); err != nil {
		return err
	}
	s.closers = append(s.closers, s.journal.Close)
	return nil
}

// setBandwidth puts a sandbox's bandwidth limit (0: none) on its bridge
// and divert pair; a limit in place is left alone.
//
// The upload cap is the divert pair's queue, which carries only SYNs
// without one: while a cap is set, the divert rule sends every TCP frame
// through it. The cap goes on before the rule changes and comes off
// after, so no moment passes with packets outside both. The rule is
// rewritten only when a cap comes or goes (the last limit put says how it
// was written: ensureNetwork writes it without).
func (d *Daemon) setBandwidth(s *sandbox, mbps int) error {
	s.bandwidthMu.Lock()
	defer s.bandwidthMu.Unlock()
	old := s.bandwidth.Load()
	err := func() error {
		if mbps > 0 {
			if err := s.net.SetBandwidth(d.h, mbps); err != nil {
				return err
			}
		}
		if shaped := mbps > 0; shaped != (old > 0) {
			if err := d.shapeDivert(s.net, shaped); err != nil {
				return err
			}
		}
		if mbps == 0 {
			return s.net.SetBandwidth(d.h, 0)
		}
		return nil
	}()
	if err != nil {
		return fmt.Errorf("sandbox %s: resources.bandwidth_mbps: %w", s.cfg.Name, err)
	}
	if s.bandwidth.Swap(int64(mbps)); old != int64(mbps) {
		d.log.Info("bandwidth limit", "sandbox", s.cfg.Name, "bandwidth_mbps", mbps, "unlimited", mbps == 0)
	}
	return nil
}

// record adds an entry to a sandbox's journal and metrics, naming the
// agent behind its source.
func (d *Daemon) record(s *sandbox, e audit.Entry) {
	d.mets.Observe(s.journal.Add(d.named(s, e)))
}

// recordHeld is record with the write left for the journal's next Commit.
func (d *Daemon) recordHeld(s *sandbox, e audit.Entry) {
	d.mets.Observe(s.journal.AddHeld(d.named(s, e)))
}

// named fills in an entry's sandbox and the agent behind its source.
func (d *Daemon) named(s *sandbox, e audit.Entry) audit.Entry {
	e.Sandbox = s.cfg.Name
	if e.Source != "" {
		e.Agent = s.AgentOf(e.Source)
	}
	return e
}

// startGate starts a sandbox's DNS gate on a fake-IP pool of its own:
// sandboxes must not learn each other's names through PTR queries or the
// order of addresses.
func (d *Daemon) startGate(s *sandbox, guard *dnsgate.Guard, members func(netip.Addr) string) (*dnsgate.Pool, error) {
	pool, err := dnsgate.NewPool(d.cfg.FakeIPPool)
	if err != nil {
		return nil, err
	}
	gate, err := dnsgate.New(dnsgate.Config{
		Sandbox:     s.cfg.Name,
		Listen:      netip.AddrPortFrom(s.net.Gateway, 53),
		Transparent: true,
		Clients:     s.net.Subnet,
		Policy:      s.policy,
		Pool:        pool,
		Upstream:    d.upstream,
		Guard:       guard,
		Members:     members,
		OnEvent:     func(e dnsgate.Event) { d.record(s, dnsEntry(e)) },
		// A read of queries answered at once: one write for their records,
		// before their answers leave.
		OnEventHeld: func(e dnsgate.Event) { d.recordHeld(s, dnsEntry(e)) },
		Commit:      s.journal.Commit,
		Recording:   s.journal.Err,
		Logger:      d.log,
		LogAllowed:  d.cfg.LogAllowed,
	})
	if err != nil {
		return nil, err
	}
	if err = gate.Start(); err != nil {
		return nil, err
	}
	s.closers = append(s.closers, gate.Close)
	return pool, nil
}

// startProxy starts a sandbox's approvals broker, CA and proxy, within
// the limits.
func (d *Daemon) startProxy(s *sandbox, pool *dnsgate.Pool, guard *dnsgate.Guard, attr attribution) error {
	sb, cfg, log := s.cfg, d.cfg, d.log
	limits := d.limits()
	var err error
	s.broker, err = policy.NewBroker(policy.BrokerConfig{Sandbox: s.policy, Logger: log,
		MaxHeldPerMember: limits.MemberHeld, MaxHeldPerSandbox: limits.SandboxHeld, OnEvent: func(e policy.BrokerEvent) {
			log.Info("approval "+e.Kind, "sandbox", sb.Name, "id", e.Pending.ID, "source", e.Pending.Source,
				"host", e.Pending.Host, "port", e.Pending.Port, "action", e.Action, "waiting", e.Pending.Waiting,
				"kind", e.Pending.Kind, "request", requestText(e.Pending))
			d.record(s, approvalEntry(e))
		}, Grant: d.grant(s), Host: d.host})
	if err != nil {
		return err
	}
	api, err := memberapi.New(memberapi.Config{Sandbox: sb.Name, Gateway: s.net.Gateway, Requests: s.broker, Members: attr.identify, Logger: log})
	if err != nil {
		return err
	}
	if s.ca, err = tproxy.LoadOrCreateCA(filepath.Join(cfg.StateDir, "ca", sb.Name), sb.Name); err != nil {
		return err
	}
	s.proxy, err = tproxy.New(tproxy.Config{
		Sandbox:            sb.Name,
		Listen:             netip.AddrPortFrom(s.net.Gateway, cfg.ProxyPort),
		Transparent:        true,
		Policy:             s.policy,
		Approvals:          s.broker,
		Names:              pool,
		IsLocal:            d.local.Contains,
		Resolve:            dnsgate.NewResolver(d.upstream, guard, nil).LookupA,
		Members:            attr.member,
		MemberAPI:          api,
		OnRecord:           func(r tproxy.Record) { d.record(s, connEntry(r)) },
		OnRequest:          func(r tproxy.RequestRecord) { d.record(s, requestEntry(r)) },
		Recording:          s.journal.Err,
		CA:                 s.ca,
		UpstreamRoots:      d.roots,
		InspectAll:         s.policy.InspectAll,
		MaxConnsPerMember:  limits.MemberConnections,
		MaxConnsPerSandbox: limits.SandboxConnections,
		AllowECH:           s.policy.AllowECH,
		Logger:             log,
		LogAllowed:         cfg.LogAllowed,
		DrainTimeout:       drainTimeout(cfg.Drain),
		ApprovalURL:        APIURL(cfg.APIListen),
	})
	if err != nil {
		return err
	}
	if err = s.proxy.Start(); err != nil {
		return err
	}
	s.closers = append(s.closers, s.proxy.Close)
	return nil
}

// registerGauges exports a sandbox's gauges until it stops.
func (d *Daemon) registerGauges(s *sandbox) {
	labels := prometheus.Labels{"sandbox": s.cfg.Name}
	s.gauges = []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "airlock_pending_approvals", Help: "Approvals waiting for a person.", ConstLabels: labels},
			func() float64 { return float64(len(s.broker.List())) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "airlock_open_connections", Help: "Connections the proxy holds open.", ConstLabels: labels},
			func() float64 { return float64(s.proxy.Active()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "airlock_cert_cache_entries", Help: "Cached leaf certificates.", ConstLabels: labels},
			func() float64 { return float64(s.ca.CacheLen()) }),
	}
	for _, g := range s.gauges {
		d.reg.MustRegister(g)
	}
	s.closers = append(s.closers, func() error {
		for _, g := range s.gauges {
			d.reg.Unregister(g)
		}
		return nil
	})
}

// CreateSandbox starts a new sandbox and remembers it across restarts. It
// implements ui.Manager.
func (d *Daemon) CreateSandbox(name, policyPath, subnet string) (ui.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	probe := *d.cfg
	probe.Sandboxes = d.runningConfigsLocked()
	if policyPath != "" && !filepath.IsAbs(policyPath) {
		return nil, &ui.ManagerError{Msg: "policy path must be absolute", Hint: "or leave it out for STATE_DIR/sandboxes/NAME.yaml"}
	}
	sb, err := probe.NewSandbox(name, policyPath, subnet, d.cfg.StateDir)
	if err != nil {
		return nil, &ui.ManagerError{Msg: err.Error()}
	}
	s, err := d.addSandboxLocked(sb, true)
	if err != nil {
		return nil, err
	}
	if err := d.saveAPISandboxesLocked(); err != nil {
		d.log.Warn("remember API-made sandboxes", "err", err)
	}
	return s, nil
}

// addSandboxLocked brings sb up next to the running sandboxes: its rules
// first, so its bridge is caged from the moment it exists, then the rest.
// On error nothing of it is left.
func (d *Daemon) addSandboxLocked(sb config.Sandbox, fromAPI bool) (*sandbox, error) {
	running := d.runningConfigsLocked()
	if err := d.ensureRulesLocked(append(running, sb)); err != nil {
		return nil, err
	}
	s, err := d.startSandboxLocked(sb, fromAPI)
	if err != nil {
		d.removeNetwork(netns.BridgeName(sb.Name))
		d.ensureRulesLocked(running)
		return nil, err
	}
	d.registerLocked(s)
	if err := d.dockerSandboxLocked(s); err != nil {
		d.log.Error("Docker network of sandbox", "sandbox", s.cfg.Name, "err", err)
	}
	return s, nil
}

// DeleteSandbox stops an API-made sandbox and tears its network down. Its
// policy file, CA and history stay in the state directory. It implements
// ui.Manager.
func (d *Daemon) DeleteSandbox(name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := slices.IndexFunc(d.sandboxes, func(s *sandbox) bool { return s.cfg.Name == name })
	if i < 0 {
		return &ui.ManagerError{Msg: fmt.Sprintf("no sandbox %q", name), NotFound: true}
	}
	if !d.sandboxes[i].fromAPI {
		return &ui.ManagerError{Msg: fmt.Sprintf("sandbox %s is defined in %s", name, d.cfg.Path), Hint: "remove it there and run airlock reload, or run airlock teardown", Conflict: true}
	}
	if err := d.removeSandboxLocked(i); err != nil {
		return err
	}
	return d.saveAPISandboxesLocked()
}

// removeSandboxLocked stops sandbox i and tears its network down: its
// Docker containers and network, the bridge, then its rules, then its
// leases. When the containers cannot be removed, the sandbox stays.
func (d *Daemon) removeSandboxLocked(i int) error {
	s := d.sandboxes[i]
	name := s.cfg.Name
	if d.docker != nil {
		ctx, cancel := context.WithTimeout(d.ctx, time.Minute)
		err := d.docker.RemoveSandbox(ctx, name)
		cancel()
		if err != nil {
			return fmt.Errorf("sandbox %s kept: its Docker members could not be removed: %w", name, err)
		}
	}
	s.stop(d.log)
	if err := d.removeNetwork(s.net.Bridge); err != nil {
		return err
	}
	d.sandboxes = slices.Delete(d.sandboxes, i, i+1)
	d.byName.Delete(name)
	if err := d.ensureRulesLocked(d.runningConfigsLocked()); err != nil {
		return err
	}
	os.RemoveAll(d.cfg.LeaseDir(s.cfg.Name))
	return nil
}

func (d *Daemon) saveAPISandboxesLocked() error {
	var made []config.Sandbox
	for _, s := range d.sandboxes {
		if s.fromAPI {
			made = append(made, s.cfg)
		}
	}
	return config.SaveAPISandboxes(d.cfg.StateDir, made)
}

// registerLocked adds a started sandbox to the running ones.
func (d *Daemon) registerLocked(s *sandbox) {
	d.sandboxes = append(d.sandboxes, s)
	d.byName.Store(s.cfg.Name, s)
}

func (d *Daemon) uiSandboxes() []ui.Sandbox {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]ui.Sandbox, len(d.sandboxes))
	for i, s := range d.sandboxes {
		out[i] = s
	}
	return out
}

// close stops the API and every sandbox, each proxy letting its open
// connections finish for drain_seconds, all sandboxes at once; the rules
// and bridges stay, so sandboxes remain closed.
func (d *Daemon) Close() {
	if d.api != nil {
		d.api.Close()
	}
	d.mu.Lock()
	var wg sync.WaitGroup
	for _, s := range d.sandboxes {
		wg.Go(func() { s.stop(d.log) })
	}
	wg.Wait()
	d.mu.Unlock()
	if d.docker != nil {
		d.docker.Close()
	}
	if d.h != nil {
		d.h.Close()
	}
}

// drainTimeout is the proxy's DrainTimeout for the config's drain_seconds,
// where 0 means none rather than the default.
// limits are the config's limits, the defaults derived from the
// descriptor limit the process has (Go raises its soft limit to the hard
// one at start; the unit sets LimitNOFILE).
func (d *Daemon) limits() config.Limits {
	var rl unix.Rlimit
	nofile := uint64(1024)
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil {
		nofile = rl.Cur
	}
	return config.DefaultLimits(d.cfg.Limits, nofile, len(d.cfg.Sandboxes))
}

func drainTimeout(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

func APIURL(listen string) string {
	if strings.HasPrefix(listen, "unix:") {
		return listen
	}
	return "http://" + listen + "/"
}

// Token is the API's bearer token.
func (d *Daemon) Token() string { return d.api.Token() }
