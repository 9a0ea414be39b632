package supervisor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/errdefs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockhq/airlock/dnsgate"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/session"
	"github.com/airlockhq/airlock/netns"
	"github.com/airlockhq/airlock/policy"
	"github.com/airlockhq/airlock/ui"
)

// startSessions opens a sandbox's session table: the sessions an earlier
// airlockd left are adopted, their members still running removed.
func (d *Daemon) startSessions(s *sandbox) error {
	var runner session.Runner = localRunner{d: d, s: s}
	if d.docker != nil {
		runner = dockerRunner{d: d, s: s}
	}
	m, err := session.New(session.Config{
		Sandbox:  s.cfg.Name,
		Dir:      filepath.Join(d.cfg.StateDir, "sessions", s.cfg.Name),
		Runner:   runner,
		Settings: func() *policy.Sessions { return s.policy.Spec().Sessions },
		Network:  s.sessionNetwork,
		OnExecuted: func(res session.ExecuteResult, runErr bool) {
			d.smets.Executed(s.cfg.Name, res.Status, res.DurationSeconds, runErr)
		},
		Logger: d.log,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(d.ctx, time.Minute)
	defer cancel()
	if err := m.Start(ctx); err != nil {
		return fmt.Errorf("sessions of sandbox %s: %w", s.cfg.Name, err)
	}
	s.sessions = m
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "airlock_sessions_active", Help: "Sessions (idle or busy) a sandbox keeps.", ConstLabels: prometheus.Labels{"sandbox": s.cfg.Name}},
		func() float64 { return float64(m.Count()) })
	d.reg.MustRegister(g)
	s.closers = append(s.closers, m.Close, func() error { d.reg.Unregister(g); return nil })
	return nil
}

// sessionsOf is the API's and /mcp's way to a sandbox's sessions.
func (d *Daemon) sessionsOf(sandbox string) (ui.SessionTable, error) {
	s := d.sandboxNamed(sandbox)
	if s == nil || s.sessions == nil {
		return nil, &ui.ManagerError{Msg: fmt.Sprintf("no sandbox %q", sandbox), NotFound: true, Hint: "/mcp serves the sandbox named default; /mcp/NAME another"}
	}
	return s.sessions, nil
}

// sessionNetwork sums up what a session's member did since a time, from
// the sandbox's journal.
func (s *sandbox) sessionNetwork(member string, since time.Time) session.Network {
	// The proxy records a connection when it closes, which can come a
	// moment after the member is gone.
	for deadline := time.Now().Add(500 * time.Millisecond); s.proxy.Active() > 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	n := session.Network{Hosts: []string{}}
	seen := map[string]bool{}
	for _, e := range s.journal.Query(audit.Filter{Source: member, Since: since, Limit: 10000}) {
		if e.Kind == audit.KindConnection && strings.HasPrefix(e.Close, "intercepted") {
			continue // its requests count, as the monitor lists them
		}
		conn := e.Kind == audit.KindConnection || e.Kind == audit.KindRequest
		switch {
		case conn && e.Verdict == policy.Allow.String():
			n.Allowed++
		case conn && e.Verdict == policy.Deny.String(),
			e.Kind == audit.KindDNS && (e.Verdict == dnsgate.VerdictDenied || e.Verdict == dnsgate.VerdictRefused):
			n.Denied++
		case e.Kind == audit.KindApproval && e.Action == "opened":
			n.Held++
		case e.Kind != audit.KindDNS || e.Verdict != dnsgate.VerdictFake:
			continue
		}
		if e.Host != "" && !seen[e.Host] && len(n.Hosts) < 100 {
			seen[e.Host] = true
			n.Hosts = append(n.Hosts, e.Host)
		}
	}
	slices.Sort(n.Hosts)
	return n
}

// dockerRunner runs a session's tasks as hardened Docker members, as
// `airlock docker run` starts them, with the workspace read-write.
type dockerRunner struct {
	d *Daemon
	s *sandbox
}

func sessionContainer(sandbox, id string) string { return "airlock-" + sandbox + "-session-" + id }

func (r dockerRunner) Run(ctx context.Context, t session.Task) (session.Outcome, error) {
	dk := r.d.docker
	l := t.Limits
	if l == (policy.Limits{}) {
		l = r.s.policy.Spec().Resources.Agent
	}
	id, err := dk.Launch(ctx, netns.Launch{
		Sandbox: r.s.cfg.Name, Image: t.Image, Cmd: t.Command, Env: t.Env, Name: sessionContainer(r.s.cfg.Name, t.Session),
		Source: t.Member, User: t.User, Session: t.Session, Stdin: t.Stdin,
		MemoryMB: l.MemoryMB, CPUs: l.CPUs, PidsLimit: int64(l.Pids),
		Workspace: t.Workspace, WorkspaceRW: true,
		CAFile: r.s.ca.CertFile(), CABundle: r.s.ca.BundleFile(),
	})
	if err != nil {
		return session.Outcome{}, err
	}
	res, err := dk.Wait(ctx, id, t.Timeout)
	if err != nil {
		// The caller went (cleanup_session, airlockd stopping): so does
		// the member.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if rerr := dk.Client().ContainerRemove(rctx, id, container.RemoveOptions{Force: true}); rerr != nil && !errdefs.IsNotFound(rerr) {
			r.d.log.Error("remove the member of a stopped session task", "sandbox", r.s.cfg.Name, "container", id, "err", rerr)
		}
		return session.Outcome{}, fmt.Errorf("the task was stopped: %w", err)
	}
	return session.Outcome{ExitCode: res.ExitCode, TimedOut: res.TimedOut, Output: res.Output}, nil
}

func (r dockerRunner) Sweep(ctx context.Context) error {
	cli := r.d.docker.Client()
	list, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", netns.LabelSandbox+"="+r.s.cfg.Name), filters.Arg("label", netns.LabelManaged+"=session"))})
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range list {
		r.d.log.Info("removing the member of a session task an earlier airlockd started", "sandbox", r.s.cfg.Name, "container", c.ID, "session", c.Labels[netns.LabelSession])
		if err := cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// localRunner runs a session's tasks without a Docker Engine, as
// `airlock run` members: the same network cage, the workspace read-write
// at /workspace of a root where the host's files are read-only, the
// section's user, no capabilities, no_new_privs; but the host's kernel,
// programs and files (read-only), and no memory, CPU or pids limits
// (README, "Sessions over MCP").
type localRunner struct {
	d *Daemon
	s *sandbox
}

func (r localRunner) Run(ctx context.Context, t session.Task) (session.Outcome, error) {
	if len(t.Command) == 0 {
		return session.Outcome{}, errors.New("without a Docker Engine a session runs its sessions.command on this host, and the policy file gives none (the image's own command needs Docker)")
	}
	u, g := session.IDs(t.User)
	uid, gid := uint32(u), uint32(g)
	env, taskEnv := []string{}, []string{}
	for _, kv := range t.Env {
		if strings.HasPrefix(kv, "AIRLOCK_TASK=") {
			taskEnv = append(taskEnv, kv)
		} else {
			env = append(env, kv)
		}
	}
	cfg := r.d.cfg
	readOnly, roDirs := cfg.MemberReadOnly(r.d.policyFiles())
	tctx, cancel := context.WithTimeout(ctx, t.Timeout)
	defer cancel()
	// Twice the answer's bound, so that session's tail sees the cut.
	out := &netns.TailWriter{Max: 2 * session.MaxOutput}
	// The member's init dies with the thread that started it
	// (Pdeathsig): that thread must stay for the task's whole run.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	code, err := netns.Run(tctx, netns.RunConfig{
		Sandbox: r.s.cfg.Name, Source: t.Member, Command: t.Command,
		LeaseDir: cfg.LeaseDir(r.s.cfg.Name), CABundle: r.s.ca.BundleFile(),
		Hide: []string{cfg.StateDir, cfg.RunDir}, ReadOnly: readOnly, ReadOnlyDirs: roDirs,
		UID: &uid, GID: &gid, Env: env, TaskEnv: taskEnv,
		Stdin: strings.NewReader(t.Stdin), Stdout: out, Stderr: out,
		Workspace: t.Workspace, KillOnCancel: true, NoSignalForward: true,
	})
	if err != nil {
		return session.Outcome{}, err
	}
	if ctx.Err() != nil {
		return session.Outcome{}, fmt.Errorf("the task was stopped: %w", ctx.Err())
	}
	return session.Outcome{ExitCode: code, TimedOut: tctx.Err() != nil, Output: out.Bytes()}, nil
}

// Sweep has nothing to do: a member dies with the airlockd that started it.
func (localRunner) Sweep(context.Context) error { return nil }

// policyFiles are the policy files of the running sandboxes, which a
// member must not edit.
func (d *Daemon) policyFiles() []string {
	var out []string
	d.byName.Range(func(_, v any) bool {
		out = append(out, v.(*sandbox).cfg.Policy)
		return true
	})
	return out
}
