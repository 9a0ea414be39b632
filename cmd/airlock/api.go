package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/sessionmcp"
	"github.com/airlockhq/airlock/internal/visible"
	"github.com/airlockhq/airlock/ui"
)

// common holds the flags every API command takes.
type common struct {
	api, tokenFile, config string
	json                   bool
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.api, "api", "", "airlockd's API: http://127.0.0.1:7433 or unix:/path (default $AIRLOCK_API, else from the config)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the API token (default $AIRLOCK_TOKEN, else STATE_DIR/token)")
	fs.StringVar(&c.config, "config", "", "airlockd's config file, to find the API and the token (default $AIRLOCK_CONFIG)")
	fs.BoolVar(&c.json, "json", false, "print JSON")
}

// client finds the daemon the same way every time: flags, then the
// environment, then airlockd's config file.
func (c *common) client() (*ui.Client, error) {
	api := firstOf(c.api, os.Getenv("AIRLOCK_API"))
	token := os.Getenv("AIRLOCK_TOKEN")
	tokenFile := c.tokenFile
	if api == "" || token == "" && tokenFile == "" {
		cfg, err := loadConfig(c.config)
		if err != nil {
			return nil, err
		}
		if api == "" {
			api = cfg.APIListen
			if !strings.HasPrefix(api, "unix:") {
				api = "http://" + api
			}
		}
		if tokenFile == "" {
			tokenFile = filepath.Join(cfg.StateDir, "token")
		}
	}
	if tokenFile != "" && (c.tokenFile != "" || token == "") {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("read the API token: %w (run as root, or pass --token-file or AIRLOCK_TOKEN)", err)
		}
		token = strings.TrimSpace(string(b))
	}
	return ui.NewClient(api, token)
}

func firstOf(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// parse reads flags anywhere among the arguments and returns the rest.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

type apiCommand struct {
	name, usage string
	min, max    int // positional arguments
	flags       func(*flag.FlagSet)
	run         func(ctx context.Context, c *ui.Client, cm *common, args []string) error
}

var (
	flagSave, flagForce bool
	flagMember, flagPat string
	flagSandbox         string
	flagFollow          bool
	flagSource, flagVer string
	flagLimit           int
	flagOut             string
	flagSince           string
	flagList, flagClose bool
	flagHostPort        int
)

func apiCommands() map[string]apiCommand {
	return map[string]apiCommand{
		"ls": {name: "ls", usage: "ls [SANDBOX]", max: 1, run: cmdLs},
		"allow": {name: "allow", usage: "allow SANDBOX PATTERN [--save] [--force] [--member M]", min: 2, max: 2,
			flags: ruleFlags, run: func(ctx context.Context, c *ui.Client, cm *common, a []string) error {
				return addRule(ctx, c, cm, "allowlist", a)
			}},
		"deny": {name: "deny", usage: "deny SANDBOX PATTERN [--save] [--member M]", min: 2, max: 2,
			flags: ruleFlags, run: func(ctx context.Context, c *ui.Client, cm *common, a []string) error {
				return addRule(ctx, c, cm, "denylist", a)
			}},
		"rm": {name: "rm", usage: "rm RULE-ID [--sandbox S]", min: 1, max: 1, flags: func(fs *flag.FlagSet) {
			fs.StringVar(&flagSandbox, "sandbox", "", "the rule's sandbox (default: search all)")
		}, run: cmdRm},
		"pending": {name: "pending", usage: "pending [SANDBOX]", max: 1, run: cmdPending},
		"approve": {name: "approve", usage: "approve ID [--pattern P] [--save] [--force]", min: 1, max: 1, flags: func(fs *flag.FlagSet) {
			fs.StringVar(&flagPat, "pattern", "", "allow this pattern (default: allow this request once; a port or resources request: allow it)")
			fs.BoolVar(&flagSave, "save", false, "save the pattern to the sandbox's policy file")
			fs.BoolVar(&flagForce, "force", false, "accept a broad pattern")
		}, run: func(ctx context.Context, c *ui.Client, cm *common, a []string) error {
			return decideCmd(ctx, c, cm, a[0], true)
		}},
		"reject": {name: "reject", usage: "reject ID [--save]", min: 1, max: 1, flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&flagSave, "save", false, "save a deny rule for the host to the sandbox's policy file")
		}, run: func(ctx context.Context, c *ui.Client, cm *common, a []string) error {
			return decideCmd(ctx, c, cm, a[0], false)
		}},
		"log": {name: "log", usage: "log SANDBOX [-f] [--source S] [--verdict V] [--limit N]", min: 1, max: 1, flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&flagFollow, "f", false, "follow: print new records as they happen")
			fs.StringVar(&flagSource, "source", "", "only this member")
			fs.StringVar(&flagVer, "verdict", "", "only allow or deny")
			fs.IntVar(&flagLimit, "limit", 50, "how many past records")
		}, run: cmdLog},
		"har": {name: "har", usage: "har SANDBOX [-o FILE]", min: 1, max: 1, flags: func(fs *flag.FlagSet) {
			fs.StringVar(&flagOut, "o", "", "write to FILE (default stdout)")
		}, run: cmdHAR},
		"reload": {name: "reload", usage: "reload", run: cmdReload},
		"mcp": {name: "mcp", usage: "mcp [--sandbox NAME]", flags: func(fs *flag.FlagSet) {
			fs.StringVar(&flagSandbox, "sandbox", ui.DefaultMCPSandbox, "the sandbox whose sessions to serve")
		}, run: func(ctx context.Context, c *ui.Client, _ *common, _ []string) error {
			// Standard output carries the protocol: nothing else may be
			// printed there.
			return sessionmcp.NewServer(c.Sessions(flagSandbox), flagSandbox).Run(ctx, &mcp.StdioTransport{})
		}},
		"set": {name: "set", usage: "set SANDBOX unknown_action ask|deny|learn|allow  |  approval_timeout SECONDS  |  learn_until TIME|DURATION  |  presets NAME,NAME|none",
			min: 3, max: 3, run: cmdSet},
		"presets": {name: "presets", usage: "presets", run: cmdPresets},
		"propose": {name: "propose", usage: "propose SANDBOX [--since 1h] [--save]", min: 1, max: 1, flags: func(fs *flag.FlagSet) {
			fs.StringVar(&flagSince, "since", "", "only traffic since this long ago (1h) or this time (RFC 3339); default all the log holds")
			fs.BoolVar(&flagSave, "save", false, "save the patterns that are neither covered nor flagged to the policy file")
		}, run: cmdPropose},
		"expose": {name: "expose", usage: "expose SANDBOX MEMBER PORT [--host-port N]  |  expose --list SANDBOX  |  expose --close SANDBOX ID",
			min: 1, max: 3, flags: func(fs *flag.FlagSet) {
				fs.BoolVar(&flagList, "list", false, "list the sandbox's exposures")
				fs.BoolVar(&flagClose, "close", false, "close exposure ID")
				fs.IntVar(&flagHostPort, "host-port", 0, "listen on this host port (default: a free one)")
			}, run: cmdExpose},
		"ca": {name: "ca", usage: "ca SANDBOX", min: 1, max: 1, run: func(ctx context.Context, c *ui.Client, cm *common, a []string) error {
			var pem []byte
			if err := c.Do(ctx, "GET", sbPath(a[0], "/ca.pem"), nil, &pem); err != nil {
				return err
			}
			_, err := os.Stdout.Write(pem)
			return err
		}},
	}
}

func ruleFlags(fs *flag.FlagSet) {
	fs.BoolVar(&flagSave, "save", false, "save to the sandbox's policy file (default: this session only)")
	fs.BoolVar(&flagForce, "force", false, "accept a broad pattern")
	fs.StringVar(&flagMember, "member", "", "apply only to this member (source label)")
}

// runAPI runs an API subcommand; it returns the exit code.
func runAPI(cmd apiCommand, args []string) int {
	fs := flag.NewFlagSet("airlock "+cmd.name, flag.ContinueOnError)
	var cm common
	cm.register(fs)
	if cmd.flags != nil {
		cmd.flags(fs)
	}
	pos, err := parse(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) < cmd.min || len(pos) > cmd.max {
		fmt.Fprintf(stderr, "usage: airlock %s\n", cmd.usage)
		return 2
	}
	c, err := cm.client()
	if err != nil {
		fmt.Fprintf(stderr, "airlock %s: %s\n", cmd.name, v(err.Error()))
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd.run(ctx, c, &cm, pos); err != nil {
		fmt.Fprintf(stderr, "airlock %s: %s\n", cmd.name, v(err.Error()))
		return 1
	}
	return 0
}

func sbPath(sandbox, rest string) string { return "/sandboxes/" + url.PathEscape(sandbox) + rest }

// printJSON prints x as indented JSON with no unsafe character left raw
// in it (visible.JSON): the same data for a script, nothing a terminal
// acts on.
func printJSON(x any) error {
	b, err := json.MarshalIndent(x, "", "  ")
	if err != nil {
		return err
	}
	_, err = jsonOut.Write(append(visible.JSON(b), '\n'))
	return err
}

// table prints rows under header, every cell escaped: cells are data, and
// many are a member's (URLs, sources).
func table(header string, rows [][]string) {
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, header)
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = v(c)
		}
		fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
	w.Flush()
}

func cmdLs(ctx context.Context, c *ui.Client, cm *common, a []string) error {
	if len(a) == 0 {
		var sbs []ui.SandboxView
		if err := c.Do(ctx, "GET", "/sandboxes", nil, &sbs); err != nil {
			return err
		}
		if cm.json {
			return printJSON(sbs)
		}
		var rows [][]string
		for _, s := range sbs {
			presets := strings.Join(s.Presets, ",")
			if presets == "" {
				presets = "-"
			}
			rows = append(rows, []string{s.Name, s.Subnet, unknownAction(s.UnknownAction, s.LearnUntil, time.Now()), presets, fmt.Sprint(s.Rules), fmt.Sprint(s.Pending), s.Policy})
		}
		table("SANDBOX\tSUBNET\tUNKNOWN\tPRESETS\tRULES\tPENDING\tPOLICY", rows)
		return nil
	}
	var rules []ui.RuleView
	for _, l := range []string{"allowlist", "denylist"} {
		var rs []ui.RuleView
		if err := c.Do(ctx, "GET", sbPath(a[0], "/"+l), nil, &rs); err != nil {
			return err
		}
		rules = append(rules, rs...)
	}
	if cm.json {
		return printJSON(rules)
	}
	var rows [][]string
	for _, r := range rules {
		list := "allow"
		if r.List == "denylist" {
			list = "deny"
		}
		rows = append(rows, []string{r.ID, list, r.Tier, r.Type, r.Pattern, r.Member, r.Source})
	}
	table("ID\tLIST\tTIER\tTYPE\tPATTERN\tMEMBER\tSOURCE", rows)
	return nil
}

func addRule(ctx context.Context, c *ui.Client, cm *common, list string, a []string) error {
	var r ui.RuleView
	body := ui.AddRuleBody{Pattern: a[1], Persist: flagSave, Force: flagForce, Member: flagMember, Source: "added with the airlock command"}
	if err := c.Do(ctx, "POST", sbPath(a[0], "/"+list), body, &r); err != nil {
		return err
	}
	if cm.json {
		return printJSON(r)
	}
	where := "for this session"
	if r.Tier == "user" {
		where = "saved to the policy file"
	}
	fmt.Fprintf(stdout, "%s %s in %s %s (id %s)\n", strings.TrimSuffix(list, "list")+"ed", r.Pattern, a[0], where, r.ID)
	return nil
}

func sandboxNames(ctx context.Context, c *ui.Client) ([]string, error) {
	var sbs []ui.SandboxView
	if err := c.Do(ctx, "GET", "/sandboxes", nil, &sbs); err != nil {
		return nil, err
	}
	var out []string
	for _, s := range sbs {
		out = append(out, s.Name)
	}
	return out, nil
}

func cmdRm(ctx context.Context, c *ui.Client, cm *common, a []string) error {
	names := []string{flagSandbox}
	if flagSandbox == "" {
		var err error
		if names, err = sandboxNames(ctx, c); err != nil {
			return err
		}
	}
	for _, sb := range names {
		for _, l := range []string{"allowlist", "denylist"} {
			var r ui.RuleView
			err := c.Do(ctx, "DELETE", sbPath(sb, "/"+l+"/"+url.PathEscape(a[0])), nil, &r)
			var ae *ui.APIError
			if errors.As(err, &ae) && ae.Status == 404 {
				continue
			}
			if err != nil {
				return err
			}
			if cm.json {
				return printJSON(r)
			}
			fmt.Fprintf(stdout, "removed %s from %s of %s\n", r.Pattern, l, sb)
			return nil
		}
	}
	return fmt.Errorf("no user or session rule %q (airlock ls SANDBOX lists the ids)", a[0])
}

func allPending(ctx context.Context, c *ui.Client, only string) ([]ui.ApprovalView, error) {
	names := []string{only}
	if only == "" {
		var err error
		if names, err = sandboxNames(ctx, c); err != nil {
			return nil, err
		}
	}
	var out []ui.ApprovalView
	for _, sb := range names {
		var ps []ui.ApprovalView
		if err := c.Do(ctx, "GET", sbPath(sb, "/approvals"), nil, &ps); err != nil {
			return nil, err
		}
		for i := range ps {
			ps[i].Sandbox = sb
		}
		out = append(out, ps...)
	}
	return out, nil
}

func cmdPending(ctx context.Context, c *ui.Client, cm *common, a []string) error {
	ps, err := allPending(ctx, c, firstOf(a...))
	if err != nil {
		return err
	}
	if cm.json {
		if ps == nil {
			ps = []ui.ApprovalView{}
		}
		return printJSON(ps)
	}
	var rows [][]string
	for _, p := range ps {
		var sugg []string
		for _, s := range p.Suggestions {
			sugg = append(sugg, s.Pattern)
		}
		rows = append(rows, []string{p.ID, p.Sandbox, kindOf(p), p.Source, approvalWhat(p), fmt.Sprintf("%.0fs", p.SecondsLeft), strings.Join(sugg, " "), p.Reason})
	}
	table("ID\tSANDBOX\tKIND\tSOURCE\tWHAT\tLEFT\tSUGGESTED PATTERNS\tREASON", rows)
	return nil
}

// kindOf is an approval's kind: network, port or resources, and "request"
// after a member's network request.
func kindOf(p ui.ApprovalView) string {
	switch {
	case p.Kind == "" || p.Kind == "network" && !p.Requested:
		return "network"
	case p.Kind == "network":
		return "network request"
	}
	return p.Kind
}

// approvalWhat is what an approval asks for: traffic's URL, a member's
// port, or the limits it asks for.
func approvalWhat(p ui.ApprovalView) string {
	switch p.Kind {
	case "port":
		return fmt.Sprintf("port %d", p.Port)
	case "resources":
		var parts []string
		if p.MemoryMB != 0 {
			parts = append(parts, fmt.Sprintf("memory_mb %d", p.MemoryMB))
		}
		if p.CPUs != 0 {
			parts = append(parts, fmt.Sprintf("cpus %g", p.CPUs))
		}
		if p.Pids != 0 {
			parts = append(parts, fmt.Sprintf("pids %d", p.Pids))
		}
		return strings.Join(parts, ", ")
	}
	if p.Method != "" {
		return p.Method + " " + p.URL
	}
	return p.URL
}

func decideCmd(ctx context.Context, c *ui.Client, cm *common, id string, allow bool) error {
	ps, err := allPending(ctx, c, "")
	if err != nil {
		return err
	}
	for _, p := range ps {
		if p.ID != id {
			continue
		}
		body := ui.DecideBody{Action: "deny", Persist: flagSave}
		switch {
		case allow && slices.Contains(p.Actions, "allow"):
			if flagPat != "" || flagSave || flagForce {
				return fmt.Errorf("approval %s is a %s request: approve it without --pattern, --save or --force", id, p.Kind)
			}
			body = ui.DecideBody{Action: "allow"}
		case allow && flagPat != "":
			body = ui.DecideBody{Action: "allow_pattern", Pattern: flagPat, Persist: flagSave, Force: flagForce}
		case allow && p.Requested:
			var sugg []string
			for _, s := range p.Suggestions {
				sugg = append(sugg, s.Pattern)
			}
			return fmt.Errorf("approval %s is a member's request for %s, ahead of its traffic: approve it with --pattern P (suggested: %s)", id, v(p.URL), v(strings.Join(sugg, ", ")))
		case allow:
			body = ui.DecideBody{Action: "allow_once"}
		case p.Kind == "port" || p.Kind == "resources":
			if flagSave {
				return fmt.Errorf("approval %s is a %s request: --save applies to network approvals", id, p.Kind)
			}
		}
		var out map[string]any
		if err := c.Do(ctx, "POST", sbPath(p.Sandbox, "/approvals/"+url.PathEscape(id)), body, &out); err != nil {
			return err
		}
		if cm.json {
			return printJSON(out)
		}
		what := p.URL
		if p.Kind == "port" || p.Kind == "resources" {
			what = p.Source + " " + approvalWhat(p)
		}
		fmt.Fprintf(stdout, "%s: %s %s\n", body.Action, p.Sandbox, v(what))
		return nil
	}
	return fmt.Errorf("no pending approval %q (airlock pending lists them)", id)
}

func logLine(e audit.Entry) string {
	what := e.URL
	if what == "" && e.Request != "" {
		what = e.Request // what a member asked for through the member API
	}
	if what == "" {
		what = e.Host
		if e.Port != 0 {
			what += fmt.Sprintf(":%d", e.Port)
		}
	}
	extra := e.Rule
	if e.Status != 0 {
		extra = fmt.Sprintf("%d %s", e.Status, e.Rule)
	}
	kind := e.Kind
	if e.Method != "" {
		kind = e.Method
	}
	verdict := firstOf(e.Verdict, e.Action)
	return strings.TrimSpace(fmt.Sprintf("%s %-8s %-10s %-12s %s %s", e.Time.Local().Format("15:04:05"), v(verdict), v(kind), v(e.Source), v(what), v(extra)))
}

func cmdLog(ctx context.Context, c *ui.Client, cm *common, a []string) error {
	q := url.Values{}
	if flagSource != "" {
		q.Set("source", flagSource)
	}
	if flagVer != "" {
		q.Set("verdict", flagVer)
	}
	q.Set("limit", fmt.Sprint(flagLimit))
	show := func(e audit.Entry) {
		if cm.json {
			b, _ := json.Marshal(e)
			jsonOut.Write(append(visible.JSON(b), '\n'))
			return
		}
		fmt.Fprintln(stdout, logLine(e))
	}
	shown := map[uint64]bool{} // the history's entries, by Seq
	history := func() error {
		var es []audit.Entry
		if err := c.Do(ctx, "GET", sbPath(a[0], "/requests?"+q.Encode()), nil, &es); err != nil {
			return err
		}
		for _, e := range es {
			show(e)
			shown[e.Seq] = true
		}
		return nil
	}
	if !flagFollow {
		return history()
	}
	// The history is read once the stream is open, so that no entry falls
	// between the two; one that is in both is shown once.
	return c.Events(ctx, a[0], history, func(e audit.Entry) {
		if shown[e.Seq] {
			return
		}
		if (e.Kind == audit.KindConnection || e.Kind == audit.KindRequest || e.Kind == audit.KindApproval) &&
			(flagSource == "" || e.Source == flagSource) && (flagVer == "" || e.Verdict == flagVer) {
			show(e)
		}
	})
}

// cmdReload asks airlockd to re-read its config and policy files, prints
// what changed, and fails when something was refused.
func cmdReload(ctx context.Context, c *ui.Client, cm *common, _ []string) error {
	var res ui.ReloadResult
	if err := c.Do(ctx, "POST", "/reload", nil, &res); err != nil {
		return err
	}
	if cm.json {
		if err := printJSON(res); err != nil {
			return err
		}
	} else {
		for _, l := range []struct {
			what  string
			names []string
		}{{"added", res.Added}, {"removed", res.Removed}, {"restarted", res.Changed}, {"policy re-read", res.Reloaded}} {
			if len(l.names) > 0 {
				fmt.Fprintf(stdout, "%-15s %s\n", l.what+":", strings.Join(l.names, " "))
			}
		}
		for _, w := range res.Widened {
			fmt.Fprintf(stdout, "%-15s %s\n", "widened:", v(w))
		}
		if len(res.Restart) > 0 {
			fmt.Fprintf(stdout, "%-15s %s (restart airlockd to apply)\n", "not applied:", strings.Join(res.Restart, " "))
		}
	}
	if len(res.Errors) > 0 {
		return fmt.Errorf("refused, the last good state stays in force:\n  %s", strings.Join(res.Errors, "\n  "))
	}
	return nil
}

func cmdHAR(ctx context.Context, c *ui.Client, cm *common, a []string) error {
	var har []byte
	if err := c.Do(ctx, "GET", sbPath(a[0], "/requests.har?limit=100000"), nil, &har); err != nil {
		return err
	}
	// A member's URLs and texts are in it: escaped as the JSON of --json
	// is (the same JSON), for a terminal and for a viewer of the file.
	har = visible.JSON(har)
	w := jsonOut
	if flagOut != "" {
		f, err := os.OpenFile(flagOut, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	_, err := w.Write(har)
	return err
}

// cmdSet changes one setting of a sandbox, in its policy file and in force.
func cmdSet(ctx context.Context, c *ui.Client, cm *common, a []string) error {
	var body ui.SettingsPatch
	switch a[1] {
	case "unknown_action":
		body.UnknownAction = &a[2]
	case "approval_timeout":
		n, err := strconv.ParseInt(strings.TrimSuffix(a[2], "s"), 10, 64)
		if err != nil {
			return fmt.Errorf("approval_timeout %q: want whole seconds, such as 60", a[2])
		}
		body.ApprovalTimeout = &n
	case "learn_until":
		body.LearnUntil = &a[2]
	case "presets":
		names := []string{}
		if a[2] != "none" && a[2] != "" {
			names = strings.Split(a[2], ",")
		}
		body.Presets = &names
	default:
		return fmt.Errorf("unknown setting %q: want unknown_action, approval_timeout, learn_until or presets", a[1])
	}
	var out ui.SettingsView
	if err := c.Do(ctx, "PATCH", sbPath(a[0], "/settings"), body, &out); err != nil {
		return err
	}
	if cm.json {
		return printJSON(out)
	}
	presets := strings.Join(out.Presets, ",")
	if presets == "" {
		presets = "none"
	}
	fmt.Fprintf(stdout, "%s: unknown_action %s, approval_timeout %d s, presets %s (saved to the policy file)\n", a[0],
		unknownAction(out.UnknownAction, out.LearnUntil, time.Now()), out.ApprovalTimeout, presets)
	return nil
}

// unknownAction shows a sandbox's unknown_action, with the time learn mode
// has left.
func unknownAction(action string, until *time.Time, now time.Time) string {
	if action != "learn" {
		return action
	}
	if until == nil || !until.After(now) {
		return "learn (over: asks)"
	}
	return fmt.Sprintf("learn (%s left, until %s)", strings.TrimSuffix(until.Sub(now).Round(time.Minute).String(), "0s"), until.Local().Format("15:04"))
}

// cmdPropose prints the patterns that cover what the sandbox's members
// reached and, with --save, saves those neither covered nor flagged.
func cmdPropose(ctx context.Context, c *ui.Client, cm *common, a []string) error {
	path := sbPath(a[0], "/proposal")
	if flagSince != "" {
		path += "?since=" + url.QueryEscape(flagSince)
	}
	var pv ui.ProposalView
	if err := c.Do(ctx, "GET", path, nil, &pv); err != nil {
		return err
	}
	var save []ui.ProposedRule
	for _, p := range pv.Patterns {
		if p.CoveredBy == "" && len(p.Flags) == 0 {
			save = append(save, ui.ProposedRule{Pattern: p.Pattern, Member: p.Member})
		}
	}
	var saved []ui.RuleView
	if flagSave && len(save) > 0 {
		if err := c.Do(ctx, "POST", path, ui.SaveProposalBody{Rules: save}, &saved); err != nil {
			return err
		}
	}
	if cm.json {
		if flagSave {
			return printJSON(map[string]any{"proposal": pv, "saved": saved})
		}
		return printJSON(pv)
	}
	var rows [][]string
	for _, p := range pv.Patterns {
		note := ""
		switch {
		case p.CoveredBy != "":
			note = "covered by " + p.CoveredBy
		case len(p.Flags) > 0:
			note = "FLAGGED: " + strings.Join(p.Flags, "; ")
		case flagSave:
			note = "saved"
		}
		member := p.Member
		if member == "" {
			member = "-"
		}
		pattern := p.Pattern
		if pattern == "" {
			pattern = "-" // no pattern says it; flagged so
		}
		rows = append(rows, []string{pattern, member, fmt.Sprint(p.Hits), strings.Join(p.Examples, " "), note})
	}
	table("PATTERN\tMEMBER\tHITS\tEXAMPLES\tNOTE", rows)
	switch {
	case len(pv.Patterns) == 0:
		fmt.Fprintf(stdout, "nothing recorded to propose in %s\n", a[0])
	case flagSave:
		fmt.Fprintf(stdout, "saved %d patterns to %s's policy file; flagged ones were left out: add them with airlock allow if you mean it\n", len(saved), a[0])
	default:
		fmt.Fprintf(stdout, "%d patterns; airlock propose %s --save adds the %d neither covered nor flagged\n", len(pv.Patterns), a[0], len(save))
	}
	return nil
}

// cmdPresets lists the presets airlock knows and the hosts they allow.
func cmdPresets(ctx context.Context, c *ui.Client, cm *common, _ []string) error {
	var ps []ui.PresetView
	if err := c.Do(ctx, "GET", "/presets", nil, &ps); err != nil {
		return err
	}
	if cm.json {
		return printJSON(ps)
	}
	var rows [][]string
	for _, p := range ps {
		if len(p.Includes) > 0 {
			rows = append(rows, []string{p.Name, "all of " + strings.Join(p.Includes, ", "), "", p.Description})
		}
		for _, e := range p.Entries {
			rows = append(rows, []string{p.Name, e.Host, strings.Join(e.Patterns, ", "), e.Why})
		}
	}
	table("PRESET\tHOST\tRULES\tWHY", rows)
	return nil
}

// cmdExpose forwards a host port to a member's port, or lists or closes
// a sandbox's exposures.
func cmdExpose(ctx context.Context, c *ui.Client, cm *common, a []string) error {
	const usage = "usage: airlock expose SANDBOX MEMBER PORT [--host-port N]  |  --list SANDBOX  |  --close SANDBOX ID"
	switch {
	case flagList && !flagClose && len(a) == 1:
		var list []ui.Exposure
		if err := c.Do(ctx, "GET", sbPath(a[0], "/exposures"), nil, &list); err != nil {
			return err
		}
		if cm.json {
			return printJSON(list)
		}
		var rows [][]string
		for _, x := range list {
			rows = append(rows, []string{x.ID, x.Member, x.Addr, fmt.Sprint(x.Port), x.URL, x.Created.Local().Format("15:04:05")})
		}
		table("ID\tMEMBER\tADDRESS\tPORT\tOPEN\tSINCE", rows)
		return nil
	case flagClose && !flagList && len(a) == 2:
		var out map[string]string
		if err := c.Do(ctx, "DELETE", sbPath(a[0], "/exposures/"+url.PathEscape(a[1])), nil, &out); err != nil {
			return err
		}
		if cm.json {
			return printJSON(out)
		}
		fmt.Fprintf(stdout, "closed exposure %s of %s\n", v(a[1]), a[0])
		return nil
	case flagList || flagClose || len(a) != 3:
		return errors.New(usage)
	}
	port, err := strconv.Atoi(a[2])
	if err != nil || port < 1 || port > 65535 {
		return fmt.Errorf("port %q: want 1 to 65535", a[2])
	}
	var x ui.Exposure
	if err := c.Do(ctx, "POST", sbPath(a[0], "/exposures"), ui.ExposeRequest{Member: a[1], Port: port, HostPort: flagHostPort}, &x); err != nil {
		return err
	}
	if cm.json {
		return printJSON(x)
	}
	fmt.Fprintf(stdout, "%s:%d of %s (%s) is at %s (id %s; airlock expose --close %s %s ends it)\n", v(x.Member), x.Port, a[0], x.Addr, x.URL, x.ID, a[0], x.ID)
	return nil
}
