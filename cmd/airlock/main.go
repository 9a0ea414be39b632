// Command airlock is airlock's command line: it runs commands inside a
// sandbox and tears sandboxes down. It finds the daemon's state through the
// daemon's config file (--config, $AIRLOCK_CONFIG, or the default path).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/netns"
	"github.com/airlockhq/airlock/policy"
	"github.com/airlockhq/airlock/tproxy"
)

const usage = `usage:
  airlock run --sandbox NAME [--source LABEL] [--user UID[:GID]] -- CMD [ARG...]
      run CMD in the sandbox: its own network namespace on the sandbox bridge,
      DNS through the gate, the sandbox CA trusted, no capabilities; exits with
      CMD's exit code
  airlock docker run|ps|rm|cp|logs ...       hardened Docker members, their files and output
                                             (airlock docker for help)
  airlock ls [SANDBOX]                       sandboxes, or one sandbox's rules
  airlock allow SANDBOX PATTERN [--save] [--force] [--member M]
  airlock deny SANDBOX PATTERN [--save] [--member M]
  airlock rm RULE-ID [--sandbox S]           remove a user or session rule
  airlock pending [SANDBOX]                  requests waiting for a decision
  airlock approve ID [--pattern P] [--save]  allow once, or allow a pattern
  airlock reject ID [--save]                 deny (--save: and deny the host from now on)
  airlock log SANDBOX [-f] [--source S] [--verdict V] [--limit N]
  airlock har SANDBOX [-o FILE]              traffic as HAR 1.2
  airlock ca SANDBOX                         the sandbox CA certificate (PEM)
  airlock reload                             airlockd re-reads its config and every policy file
  airlock mcp [--sandbox NAME]               serve the sandbox's sessions as MCP tools over stdio
                                             (execute_task, get_files, cleanup_session, list_sessions)
  airlock set SANDBOX KEY VALUE              unknown_action ask|deny|learn|allow, approval_timeout SECONDS,
                                             learn_until TIME|DURATION, or presets NAME,NAME|none
  airlock presets                            the presets and the hosts they allow
  airlock propose SANDBOX [--since 1h] [--save]
                                             patterns covering what members reached (--save: add
                                             the ones not covered or flagged to the policy file)
  airlock expose SANDBOX MEMBER PORT [--host-port N]
                                             forward a host port (127.0.0.1) to MEMBER's PORT;
                                             --list SANDBOX lists them, --close SANDBOX ID ends one
  airlock teardown NAME                      remove sandbox NAME's rules, bridge and leases

Finding airlockd: --api URL (or $AIRLOCK_API, default from the config: http://127.0.0.1:7433),
the token from --token-file FILE (or the token itself in $AIRLOCK_TOKEN, default STATE_DIR/token),
or --config FILE naming airlockd's config (or $AIRLOCK_CONFIG; default ` + config.DefaultPath + `).
--json prints JSON.
`

func main() {
	if netns.IsMemberInit() {
		netns.MemberInit() // never returns
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(os.Stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:])
	case "teardown":
		return cmdTeardown(args[1:])
	case "docker":
		return cmdDocker(args[1:])
	}
	if cmd, ok := apiCommands()[args[0]]; ok {
		return runAPI(cmd, args[1:])
	}
	fmt.Fprintf(os.Stderr, "airlock: unknown command %q\n\n%s", args[0], usage)
	return 2
}

func loadConfig(path string) (*config.Config, error) {
	explicit := path != ""
	if path == "" {
		path = os.Getenv("AIRLOCK_CONFIG")
		explicit = path != ""
	}
	if path == "" {
		path = config.DefaultPath
	}
	cfg, err := config.Load(path)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return config.Default(), nil
	}
	return cfg, err
}

func cmdRun(args []string) int {
	fs := flag.NewFlagSet("airlock run", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "airlockd's config file")
	sandbox := fs.String("sandbox", "", "sandbox to run in (required)")
	source := fs.String("source", "", "label naming this member in events (default \"run\")")
	user := fs.String("user", "", "run CMD as UID[:GID] (default: the sudo caller, else root without capabilities)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cmd := fs.Args()
	if *sandbox == "" || len(cmd) == 0 {
		fmt.Fprint(os.Stderr, "airlock run: need --sandbox NAME and a command after --\n\n"+usage)
		return 2
	}
	if err := policy.ValidName(*sandbox); err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: %v\n", err)
		return 2
	}
	if *source != "" && (len(*source) > 64 || strings.ContainsAny(*source, " \t\n\"\\")) {
		fmt.Fprintf(os.Stderr, "airlock run: --source %q: want up to 64 characters without spaces or quotes\n", *source)
		return 2
	}
	uid, gid, err := parseUser(*user)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: %v\n", err)
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "airlock run: must run as root to build the member's namespaces (try: sudo airlock run ...)")
		return 1
	}
	cfg, err := loadConfig(*cfgPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: %v\n", err)
		return 1
	}
	ca := filepath.Join(cfg.StateDir, "ca", *sandbox, "bundle.pem")
	if _, err := os.Stat(ca); err != nil {
		ca = "" // no sandbox CA yet: nothing to offer
	}
	policies, err := policyFiles(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: %v\n", err)
		return 1
	}
	// airlockd's config file and its directory are read-only to the
	// member too, and so is upstream_ca_file: a member must not point a
	// sandbox at a policy of its own for the next reload (design §8,
	// invariant 15).
	readOnly, roDirs := cfg.MemberReadOnly(policies)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	code, err := netns.Run(ctx, netns.RunConfig{
		Sandbox:  *sandbox,
		Source:   *source,
		Command:  cmd,
		LeaseDir: cfg.LeaseDir(*sandbox),
		CABundle: ca,
		// The member sees the host's files, but not airlockd's token, CA
		// keys, leases and API socket, and cannot edit any sandbox's
		// policy (its own or another's).
		Hide:         []string{cfg.StateDir, cfg.RunDir},
		ReadOnly:     readOnly,
		ReadOnlyDirs: roDirs,
		UID:          uid,
		GID:          gid,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: %v\n", err)
		return 125
	}
	return code
}

// policyFiles lists the policy files of every sandbox airlockd runs: the
// config's, and those made through the API, which airlockd remembers in
// STATE_DIR/sandboxes.json. The files, not the API, are the source: run
// needs no token, and works while airlockd is down.
func policyFiles(cfg *config.Config) ([]string, error) {
	var out []string
	for _, sb := range cfg.Sandboxes {
		out = append(out, sb.Policy)
	}
	made, err := config.LoadAPISandboxes(cfg.StateDir)
	if errors.Is(err, syscall.ENOTDIR) {
		return out, nil // Run refuses a state_dir that is not a directory
	}
	if err != nil {
		return nil, err
	}
	for _, m := range made {
		if m.Policy != "" {
			out = append(out, m.Policy)
		}
	}
	return out, nil
}

// parseUser reads UID[:GID]; empty means the sudo caller, if any.
func parseUser(s string) (*uint32, *uint32, error) {
	if s == "" {
		u, g := os.Getenv("SUDO_UID"), os.Getenv("SUDO_GID")
		if u == "" || g == "" {
			return nil, nil, nil
		}
		s = u + ":" + g
	}
	us, gs, hasGID := strings.Cut(s, ":")
	uid, err := strconv.ParseUint(us, 10, 32)
	if err != nil {
		return nil, nil, fmt.Errorf("--user %q: want a numeric UID[:GID]", s)
	}
	gid := uid
	if hasGID {
		if gid, err = strconv.ParseUint(gs, 10, 32); err != nil {
			return nil, nil, fmt.Errorf("--user %q: want a numeric UID[:GID]", s)
		}
	}
	u, g := uint32(uid), uint32(gid)
	return &u, &g, nil
}

func cmdTeardown(args []string) int {
	fs := flag.NewFlagSet("airlock teardown", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "airlockd's config file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprint(os.Stderr, "airlock teardown: need exactly one sandbox name\n\n"+usage)
		return 2
	}
	name := fs.Arg(0)
	if err := policy.ValidName(name); err != nil {
		fmt.Fprintf(os.Stderr, "airlock teardown: %v\n", err)
		return 2
	}
	cfg, err := loadConfig(*cfgPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock teardown: %v\n", err)
		return 1
	}
	// The bridge goes first: a bridge without its rules would be open.
	h, err := netlink.NewHandle()
	if err == nil {
		err = netns.DeleteBridge(h, netns.BridgeName(name))
		h.Close()
	}
	if err == nil {
		var conn *nftables.Conn
		if conn, err = nftables.New(); err == nil {
			br := netns.BridgeName(name)
			err = tproxy.DeleteSandboxRules(conn, br, netns.SinkName(br))
		}
	}
	if err == nil {
		err = os.RemoveAll(cfg.LeaseDir(name))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock teardown %s: %v\n", name, err)
		return 1
	}
	fmt.Printf("sandbox %s torn down: rules, bridge %s and leases removed\n", name, netns.BridgeName(name))
	return 0
}
