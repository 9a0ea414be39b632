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
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	sdjournal "github.com/coreos/go-systemd/v22/journal"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/logging"
	"github.com/airlockhq/airlock/netns"
	"github.com/airlockhq/airlock/tproxy"
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
	showToken := fs.Bool("show-token", false, "print the API's URL and token on stdout once ready (for a terminal, not a journal)")
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
	// Under systemd, stderr is the journal's stream: it wants priority
	// prefixes and stamps the time itself.
	journal, _ := sdjournal.StderrIsJournalStream()
	log := slog.New(logging.New(os.Stderr, lvl, journal))

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
	// SIGHUP reloads; caught from here on, so one that comes while
	// starting waits instead of killing the daemon.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	notify := func(state string) {
		if _, err := sddaemon.SdNotify(false, state); err != nil {
			log.Warn("sd_notify", "err", err)
		}
	}
	notify("STATUS=starting: rules, sandboxes, API")
	d, err := start(ctx, cfg, log, startOptions{configPath: *cfgPath, explicit: explicit, notify: notify})
	if err != nil {
		notify("STATUS=failed to start: " + err.Error())
		fmt.Fprintf(os.Stderr, "airlockd: %v\n", err)
		return 1
	}
	if *showToken {
		fmt.Printf("\nairlock API: %s\ntoken:       %s\ntry:         curl -H \"Authorization: Bearer %s\" %sapi/v1/sandboxes\n\n",
			apiURL(cfg.APIListen), d.api.Token(), d.api.Token(), apiURL(cfg.APIListen))
	}
	quit := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() { d.watchPolicies(cfg.PolicyPoll, quit) })
	if every, err := sddaemon.SdWatchdogEnabled(false); err != nil {
		log.Warn("systemd watchdog", "err", err)
	} else if every > 0 {
		bg.Go(func() { d.watchdog(every/2, quit) })
	}
	// Rules, gates, proxies and the API are all up.
	notify("READY=1\nSTATUS=" + d.status())
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
		case <-hup:
			d.Reload()
		}
	}
	log.Info("stopping; the rules stay, so sandboxes are closed until airlockd is back", "drain", cfg.Drain)
	notify("STOPPING=1\nSTATUS=stopping: draining connections; sandboxes stay closed")
	close(quit)
	bg.Wait()
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
	var errs []error
	// Docker networks first: one left behind would bring its bridge back,
	// without rules, when a container joins it.
	if dk, err := netns.ConnectDocker(context.Background(), slog.New(slog.DiscardHandler)); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := dk.RemoveOthers(ctx)
		cancel()
		dk.Close()
		if err != nil {
			return fmt.Errorf("rules kept because a sandbox's Docker network could not be removed: %w", err)
		}
	}
	// Bridges next: a bridge without rules would be open. If one cannot
	// be removed, the rules stay.
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
