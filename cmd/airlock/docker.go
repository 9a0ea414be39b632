package main

import (
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/airlockhq/airlock/ui"
)

const dockerUsage = `usage:
  airlock docker run [FLAGS] SANDBOX IMAGE [CMD [ARG...]]
      start a hardened member of SANDBOX from IMAGE (no capabilities, read-only
      root, tmpfs /tmp, non-root, pids/memory/CPU limits from the policy file,
      the sandbox CA trusted), wait for it and exit with its exit code
      --name N        container name          --source S   label in records (default: the name)
      --agent A       the agent driving it    --kind K     agent (default) or mcp: which limits apply
      --workspace DIR mounted read-only at /workspace
      --env K=V       (repeatable)            --user U     run as U instead of the image's user or nobody
      --trust T       builtin, verified or user_added
      -d              start it and print its ID, without waiting
  airlock docker ps SANDBOX                  the sandbox's containers and their sources
  airlock docker rm SANDBOX CONTAINER        stop and remove a container of the sandbox
  airlock docker cp [--max-mib N] [--max-entries N] SANDBOX CONTAINER:/workspace/PATH DEST
      copy a file or directory from under a member's /workspace to DEST (into
      it when it is a directory, else as DEST); - writes the tar.gz to stdout (not a terminal).
      Entries that would land or link outside DEST, and devices, are refused; it stops
      past 2048 MiB of files or 100000 entries unless --max-mib/--max-entries say otherwise (0: no bound)
  airlock docker logs [-f] [--tail N] SANDBOX CONTAINER
      a member's output (-f: follow it until the member ends); a member's
      control characters are shown escaped
`

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// cmdDocker runs `airlock docker ...`; it returns the exit code, which for
// `run` is the member's.
func cmdDocker(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, dockerUsage)
		return 2
	}
	sub := args[0]
	fs := flag.NewFlagSet("airlock docker "+sub, flag.ContinueOnError)
	var cm common
	cm.register(fs)
	var req ui.ContainerRequest
	var env multiFlag
	var detach bool
	if sub == "run" {
		fs.StringVar(&req.Name, "name", "", "container name")
		fs.StringVar(&req.Source, "source", "", "the member's label in records (default: the container name)")
		fs.StringVar(&req.Agent, "agent", "", "the agent that drives this member")
		fs.StringVar(&req.Kind, "kind", "agent", "agent or mcp: which resources: limits apply")
		fs.StringVar(&req.Workspace, "workspace", "", "host directory mounted read-only at /workspace")
		fs.StringVar(&req.User, "user", "", "user to run as (default: the image's, or nobody when that is root)")
		fs.StringVar(&req.Trust, "trust", "", "builtin, verified or user_added")
		fs.Var(&env, "env", "KEY=VALUE for the member (repeatable)")
		fs.BoolVar(&detach, "d", false, "start it and print its ID without waiting")
	}
	lim := ui.DefaultUnpackLimits
	var maxMiB int64
	if sub == "cp" {
		fs.Int64Var(&maxMiB, "max-mib", lim.MaxBytes>>20, "unpack at most this many MiB of files (0: no bound)")
		fs.IntVar(&lim.MaxEntries, "max-entries", lim.MaxEntries, "unpack at most this many entries (0: no bound)")
	}
	var lq ui.LogQuery
	if sub == "logs" {
		fs.BoolVar(&lq.Follow, "f", false, "follow the output until the member ends")
		fs.IntVar(&lq.Tail, "tail", 0, "start with the last N lines (default: all)")
	}
	// Flags stop at SANDBOX: what follows IMAGE is the member's command.
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	pos := fs.Args()
	want := map[string][2]int{"run": {2, -1}, "ps": {1, 1}, "rm": {2, 2}, "cp": {3, 3}, "logs": {2, 2}}[sub]
	if want == [2]int{} || len(pos) < want[0] || want[1] >= 0 && len(pos) > want[1] {
		fmt.Fprint(stderr, dockerUsage)
		return 2
	}
	c, err := cm.client()
	if err != nil {
		fmt.Fprintf(stderr, "airlock docker %s: %v\n", sub, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := func() (int, error) {
		switch sub {
		case "ps":
			var list []ui.Container
			if err := c.Do(ctx, "GET", sbPath(pos[0], "/containers"), nil, &list); err != nil {
				return 1, err
			}
			if cm.json {
				return 0, printJSON(list)
			}
			var rows [][]string
			for _, m := range list {
				rows = append(rows, []string{short(m.ID), m.Name, m.Source, m.Agent, m.Trust, m.Addr, m.Managed})
			}
			table("ID\tNAME\tSOURCE\tAGENT\tTRUST\tADDRESS\tSTARTED BY AIRLOCK", rows)
			return 0, nil
		case "rm":
			return 0, c.Do(ctx, "DELETE", sbPath(pos[0], "/containers/"+pos[1]), nil, nil)
		case "cp":
			if maxMiB < 0 || lim.MaxEntries < 0 || maxMiB > math.MaxInt64>>20 {
				return 2, fmt.Errorf("--max-mib %d, --max-entries %d: want 0 (no bound) or a positive number", maxMiB, lim.MaxEntries)
			}
			lim.MaxBytes = maxMiB << 20
			return dockerCp(ctx, c, pos[0], pos[1], pos[2], lim)
		case "logs":
			if lq.Tail < 0 {
				return 2, fmt.Errorf("--tail %d: want a number of lines, 0 for all", lq.Tail)
			}
			return dockerLogs(ctx, c, cm.json, pos[0], pos[1], lq)
		}
		req.Image, req.Cmd, req.Env = pos[1], pos[2:], env
		var m ui.Container
		if err := c.Do(ctx, "POST", sbPath(pos[0], "/containers"), req, &m); err != nil {
			return 1, err
		}
		if detach {
			fmt.Fprintln(stdout, m.ID)
			return 0, nil
		}
		var res ui.ContainerResult
		for res = (ui.ContainerResult{Running: true}); res.Running; {
			res = ui.ContainerResult{} // a field the answer leaves out must not linger
			if err := c.Do(ctx, "GET", sbPath(pos[0], "/containers/"+m.ID+"/wait"), nil, &res); err != nil {
				if ctx.Err() != nil { // interrupted: the member goes too
					c.Do(context.Background(), "DELETE", sbPath(pos[0], "/containers/"+m.ID), nil, nil)
				}
				return 1, err
			}
		}
		os.Stdout.WriteString(res.Output)
		if res.TimedOut {
			fmt.Fprintf(stderr, "airlock docker run: %s killed at the sandbox's run timeout\n", m.Name)
		}
		return res.ExitCode, nil
	}()
	if err != nil {
		fmt.Fprintf(stderr, "airlock docker %s: %v\n", sub, err)
	}
	return code
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// dockerCp copies SRC (CONTAINER:/workspace/PATH) of a member to dest: the
// archive route's tar.gz, unpacked by ui.UnpackArchive, or as it comes
// for "-".
func dockerCp(ctx context.Context, c *ui.Client, sandbox, src, dest string, lim ui.UnpackLimits) (int, error) {
	id, p, ok := strings.Cut(src, ":")
	if !ok || id == "" {
		return 2, fmt.Errorf("%q: want CONTAINER:/workspace/PATH", src)
	}
	if err := ui.CheckWorkspacePath(p); err != nil {
		return 2, err
	}
	if dest == "-" && isTerminal(rawOut) {
		// The member's bytes, raw (gzip stores what it cannot compress
		// as it is): a terminal would act on the escapes among them.
		return 2, errors.New("the archive is binary and the output is a terminal: write it to a file or a pipe (… - > out.tar.gz), or name a directory")
	}
	resp, err := c.Open(ctx, sbPath(sandbox, "/containers/"+url.PathEscape(id)+"/archive?path="+url.QueryEscape(p)))
	if err != nil {
		return 1, err
	}
	defer resp.Body.Close()
	if dest == "-" {
		// The archive itself, for a file or a pipe: bytes, not text.
		if _, err := io.Copy(rawOut, resp.Body); err != nil {
			return 1, fmt.Errorf("the archive was cut short: %w", err)
		}
		return 0, nil
	}
	gz, err := gzip.NewReader(resp.Body)
	if err != nil {
		return 1, fmt.Errorf("the archive is not gzip: %w", err)
	}
	n, err := ui.UnpackArchive(gz, dest, lim)
	if err == nil {
		// To the gzip trailer: its checksum, and that airlockd did not
		// cut the archive short.
		_, err = io.Copy(io.Discard, gz)
	}
	if err != nil {
		return 1, fmt.Errorf("%s: %w (what was unpacked before stays in %s)", src, err, dest)
	}
	fmt.Fprintf(stdout, "copied %s:%s to %s (%d entries)\n", v(id), v(p), v(dest), n)
	return 0, nil
}

// dockerLogs prints a member's output: its standard output on stdout, its
// standard error on stderr, escaped for the terminal.
func dockerLogs(ctx context.Context, c *ui.Client, asJSON bool, sandbox, id string, q ui.LogQuery) (int, error) {
	err := c.Logs(ctx, sandbox, id, q, func(l ui.LogLine) {
		if asJSON {
			printJSON(l)
			return
		}
		w := stdout
		if l.Stream == "stderr" {
			w = stderr
		}
		end := "\n"
		if l.Partial {
			end = ""
		}
		io.WriteString(w, l.Line+end)
	})
	if err != nil {
		return 1, err
	}
	return 0, nil
}
