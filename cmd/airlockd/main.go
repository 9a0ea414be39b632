// Command airlockd is airlock's host agent: it builds the sandbox networks
// and the nftables rule set, runs each sandbox's DNS gate, and stands at the
// proxy port, until SIGINT or SIGTERM. Stopping it leaves the rules in place,
// so sandboxes stay closed until it is back; --teardown removes everything.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	sdjournal "github.com/coreos/go-systemd/v22/journal"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/logging"
	"github.com/airlockhq/airlock/internal/supervisor"
	"github.com/airlockhq/airlock/internal/sysmon"
	"github.com/airlockhq/airlock/netns"
)

func main() {
	if netns.IsMemberInit() {
		netns.MemberInit() // a session member's init (sessions without Docker); never returns
	}
	// Start again with the runtime's monitor thread kept out of its deep
	// sleep (see package sysmon); returns only when already so, or when it
	// cannot.
	if err := sysmon.Setup(); err != nil {
		fmt.Fprintf(os.Stderr, "airlockd: the runtime's scheduler monitor keeps its default: %v\n", err)
	}
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
	cfg, err := supervisor.LoadConfig(*cfgPath, explicit)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlockd: %v\n", err)
		return 1
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "airlockd: must run as root: it builds bridges and nftables rules (try: sudo airlockd)")
		return 1
	}
	if *teardown {
		if err := supervisor.Teardown(cfg); err != nil {
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
	d, err := supervisor.Start(ctx, cfg, log, supervisor.Options{ConfigPath: *cfgPath, Explicit: explicit, Notify: notify})
	if err != nil {
		notify("STATUS=failed to start: " + err.Error())
		fmt.Fprintf(os.Stderr, "airlockd: %v\n", err)
		return 1
	}
	if *showToken {
		fmt.Printf("\nairlock API: %s\ntoken:       %s\ntry:         curl -H \"Authorization: Bearer %s\" %sapi/v1/sandboxes\n\n",
			supervisor.APIURL(cfg.APIListen), d.Token(), d.Token(), supervisor.APIURL(cfg.APIListen))
	}
	quit := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() { d.WatchPolicies(cfg.PolicyPoll, quit) })
	if every, err := sddaemon.SdWatchdogEnabled(false); err != nil {
		log.Warn("systemd watchdog", "err", err)
	} else if every > 0 {
		bg.Go(func() { d.Watchdog(every/2, quit) })
	}
	// Rules, gates, proxies and the API are all up.
	notify("READY=1\nSTATUS=" + d.Status())
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
	d.Close()
	return 0
}
