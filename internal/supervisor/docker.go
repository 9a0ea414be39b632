package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/errdefs"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/netns"
	"github.com/airlockhq/airlock/policy"
	"github.com/airlockhq/airlock/ui"
)

// dockerMembers is what airlockd keeps of the members it started: how each
// one-off member ended, for whoever waits on it.
type dockerMembers struct {
	mu      sync.Mutex
	waiters map[string]*memberWait // by container ID
}

type memberWait struct {
	sandbox string
	done    chan struct{}
	res     ui.ContainerResult
	err     error
}

// connectDocker connects to the Docker Engine. Without one it says so once
// and airlockd goes on with `airlock run` members only.
func (d *Daemon) connectDocker() {
	dk, err := netns.ConnectDocker(d.ctx, d.log)
	if err != nil {
		d.log.Warn("no Docker Engine: sandboxes take `airlock run` members only; start Docker and restart airlockd for Docker members", "err", err)
		return
	}
	d.docker = dk
	d.dockerRuns.waiters = map[string]*memberWait{}
	dk.OnChange(d.memberChanged)
}

// startDockerLocked gives every sandbox its Docker network and sidecars,
// and follows the engine's events, which adopts running members.
func (d *Daemon) startDockerLocked() {
	if d.docker == nil {
		return
	}
	ctx, cancel := context.WithTimeout(d.ctx, time.Minute)
	defer cancel()
	var names []string
	for _, s := range d.sandboxes {
		names = append(names, s.cfg.Name)
	}
	if err := d.docker.RemoveOthers(ctx, names...); err != nil {
		d.log.Error("remove Docker networks of sandboxes that are gone", "err", err)
	}
	for _, s := range d.sandboxes {
		if err := d.dockerSandboxLocked(s); err != nil {
			d.log.Error("Docker network of sandbox", "sandbox", s.cfg.Name, "err", err)
		}
	}
	go d.docker.Watch(d.ctx)
}

// dockerSandboxLocked creates the sandbox's Docker network and starts its
// MCP sidecars.
func (d *Daemon) dockerSandboxLocked(s *sandbox) error {
	if d.docker == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(d.ctx, time.Minute)
	defer cancel()
	if err := d.docker.EnsureNetwork(ctx, s.cfg.Name, s.net); err != nil {
		return err
	}
	spec := s.policy.Spec()
	for _, srv := range spec.MCPServers {
		if srv.Transport != "sse" || srv.Image == "" {
			continue
		}
		if err := d.ensureSidecar(ctx, s, srv, spec.Resources); err != nil {
			d.log.Error("MCP sidecar", "sandbox", s.cfg.Name, "server", srv.Name, "err", err)
		}
	}
	return nil
}

var unsafeName = regexp.MustCompile(`[^a-z0-9_.-]+`)

// sidecarName is the container name of an MCP server's sidecar, which the
// sandbox's other members reach it by: "airlock-SANDBOX-mcp-NAME".
func sidecarName(sandbox, server string) string {
	return "airlock-" + sandbox + "-mcp-" + unsafeName.ReplaceAllString(strings.ToLower(server), "-")
}

// ensureSidecar starts an SSE MCP server's container unless it runs
// already with the same image, which is how a restarted airlockd adopts it.
func (d *Daemon) ensureSidecar(ctx context.Context, s *sandbox, srv policy.MCPServer, res policy.Resources) error {
	name := sidecarName(s.cfg.Name, srv.Name)
	cli := d.docker.Client()
	if info, err := cli.ContainerInspect(ctx, name); err == nil {
		if info.Config.Image == srv.Image && info.State != nil && info.State.Running {
			return nil
		}
		if err := cli.ContainerRemove(ctx, info.ID, container.RemoveOptions{Force: true}); err != nil {
			return err
		}
	} else if !errdefs.IsNotFound(err) {
		return err
	}
	env := make([]string, 0, len(srv.Env))
	for k, v := range srv.Env {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	_, err := d.docker.Launch(ctx, netns.Launch{
		Sandbox: s.cfg.Name, Image: srv.Image, Cmd: srv.Command, Env: env, Name: name,
		Source: srv.Source(), Trust: srv.Trust.String(), Sidecar: true,
		MemoryMB: res.MCP.MemoryMB, CPUs: res.MCP.CPUs, PidsLimit: int64(res.MCP.Pids),
		CAFile: s.ca.CertFile(), CABundle: s.ca.BundleFile(),
	})
	if err == nil {
		d.log.Info("MCP sidecar started", "sandbox", s.cfg.Name, "server", srv.Name, "container", name, "image", srv.Image)
	}
	return err
}

// memberChanged hears of Docker members coming and going: it applies their
// trust label, records them, and puts a run timeout on one-off members a
// restarted airlockd adopts.
func (d *Daemon) memberChanged(m netns.Member, event string) {
	s := d.sandboxNamed(m.Sandbox)
	if s == nil {
		return
	}
	e := audit.Entry{Kind: audit.KindMember, Sandbox: m.Sandbox, Source: m.Source, Agent: m.Agent, Host: m.Name, Dest: m.Addr.String(), Action: event}
	switch {
	case event == "start":
		s.trustLabel(m)
		e.Reason = "container joined the sandbox"
		if m.Managed == "member" {
			d.superviseMember(s, m)
		}
	case event == "die" && m.ExitCode != 0 && m.Managed == "sidecar":
		e.Reason = fmt.Sprintf("MCP sidecar crashed with exit code %d; Docker restarts it with a growing delay", m.ExitCode)
		d.log.Warn("MCP sidecar crashed", "sandbox", m.Sandbox, "container", m.Name, "source", m.Source, "exit_code", m.ExitCode)
	default:
		e.Reason = fmt.Sprintf("container left the sandbox (%s, exit code %d)", event, m.ExitCode)
		d.memberLeft(s, m.ID)
	}
	d.mets.Observe(s.journal.Add(e))
}

// trustLabel puts a container's airlock.trust label in force for its source.
func (s *sandbox) trustLabel(m netns.Member) {
	if t, err := policy.ParseTrust(m.Trust); err == nil && s.policy.Trust(m.Source) != t {
		s.policy.SetTrust(m.Source, t)
	}
}

// sandboxNamed returns the running sandbox name, or nil. It takes no lock
// of d.mu, so Docker's hooks may call it while a sandbox is being made.
func (d *Daemon) sandboxNamed(name string) *sandbox {
	if s, ok := d.byName.Load(name); ok {
		return s.(*sandbox)
	}
	return nil
}

// superviseMember waits for a one-off member to end, killing it at the
// sandbox's run timeout, and keeps how it ended for WaitContainer.
func (d *Daemon) superviseMember(s *sandbox, m netns.Member) {
	r := &d.dockerRuns
	r.mu.Lock()
	if _, ok := r.waiters[m.ID]; ok {
		r.mu.Unlock()
		return
	}
	w := &memberWait{sandbox: s.cfg.Name, done: make(chan struct{})}
	r.waiters[m.ID] = w
	r.mu.Unlock()
	timeout := s.policy.Spec().Resources.RunTimeout
	if !m.StartedAt.IsZero() {
		timeout -= time.Since(m.StartedAt)
		timeout = max(timeout, time.Second)
	}
	go func() {
		res, err := d.docker.Wait(d.ctx, m.ID, timeout)
		w.res = ui.ContainerResult{ID: m.ID, ExitCode: res.ExitCode, TimedOut: res.TimedOut, Output: string(res.Output)}
		w.err = err
		close(w.done)
		if res.TimedOut {
			d.log.Warn("member killed at its run timeout", "sandbox", s.cfg.Name, "container", m.Name, "run_timeout", timeout)
		}
		// Kept a while for a late waiter, then forgotten.
		time.AfterFunc(10*time.Minute, func() {
			r.mu.Lock()
			delete(r.waiters, m.ID)
			r.mu.Unlock()
		})
	}()
}

// AgentOf names the agent that drives a member of the sandbox, when a
// container's airlock.agent label says. It implements ui.AgentNamer.
func (s *sandbox) AgentOf(source string) string {
	if s.docker == nil {
		return ""
	}
	return s.docker.AgentOf(s.cfg.Name, source)
}

// The ui.Containers methods.

func (d *Daemon) ListContainers(sandbox string) ([]ui.Container, error) {
	var out []ui.Container
	for _, m := range d.docker.Members(sandbox) {
		out = append(out, ui.Container{ID: m.ID, Name: m.Name, Source: m.Source, Agent: m.Agent, Trust: m.Trust, Addr: m.Addr.String(), Managed: m.Managed})
	}
	return out, nil
}

func (d *Daemon) StartContainer(sandbox string, req ui.ContainerRequest) (ui.Container, error) {
	s := d.sandboxNamed(sandbox)
	if s == nil {
		return ui.Container{}, &ui.ManagerError{Msg: fmt.Sprintf("no sandbox %q", sandbox), NotFound: true}
	}
	spec := s.policy.Spec()
	limits := spec.Resources.Agent
	switch req.Kind {
	case "", "agent":
	case "mcp":
		limits = spec.Resources.MCP
	default:
		return ui.Container{}, &ui.ManagerError{Msg: fmt.Sprintf("kind %q: want agent or mcp", req.Kind)}
	}
	if req.Workspace != "" {
		ws, err := d.checkWorkspace(req.Workspace)
		if err != nil {
			return ui.Container{}, &ui.ManagerError{Msg: err.Error(), Hint: "pass the project directory, e.g. --workspace \"$PWD\""}
		}
		req.Workspace = ws
	}
	env := slices.Clone(req.Env)
	if stdio := stdioServers(spec.MCPServers); stdio != "" && req.Kind != "mcp" {
		env = append(env, "AIRLOCK_MCP_SERVERS="+stdio)
	}
	l := netns.Launch{
		Sandbox: sandbox, Image: req.Image, Cmd: req.Cmd, Env: env, Name: req.Name,
		Source: req.Source, Agent: req.Agent, Trust: req.Trust, User: req.User,
		MemoryMB: limits.MemoryMB, CPUs: limits.CPUs, PidsLimit: int64(limits.Pids), Workspace: req.Workspace,
		CAFile: s.ca.CertFile(), CABundle: s.ca.BundleFile(),
	}
	ctx, cancel := context.WithTimeout(d.ctx, time.Minute)
	defer cancel()
	id, err := d.docker.Launch(ctx, l)
	if err != nil {
		return ui.Container{}, &ui.ManagerError{Msg: err.Error()}
	}
	out := ui.Container{ID: id, Name: req.Name, Source: req.Source, Agent: req.Agent, Trust: req.Trust, Managed: "member"}
	for _, m := range d.docker.Members(sandbox) {
		if m.ID == id {
			out.Name, out.Source, out.Addr = m.Name, m.Source, m.Addr.String()
		}
	}
	// By ID, whether or not the member still runs: one that ended before
	// the engine was asked about it is never announced as started, and its
	// waiter must exist all the same. (For one that was, this is a no-op.)
	d.superviseMember(s, netns.Member{ID: id, Name: out.Name})
	return out, nil
}

// checkWorkspace resolves a workspace directory and refuses one that is,
// holds or lies inside what a member must never see: the host's system
// directories, sockets (a Docker socket is a way out of any container), and
// airlockd's own state (the token, the CA keys).
func (d *Daemon) checkWorkspace(dir string) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("workspace %q is not an absolute path", dir)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("workspace %q: %w", dir, err)
	}
	if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("workspace %q is not a directory on this host", dir)
	}
	private := []string{"/proc", "/sys", "/dev", "/run", "/var/run", "/etc", "/boot", "/root", "/var/lib/docker", "/var/lib/containerd", d.cfg.StateDir, d.cfg.RunDir}
	for _, p := range private {
		if rp, err := filepath.EvalSymlinks(p); err == nil {
			p = rp
		}
		if within(real, p) || within(p, real) {
			return "", fmt.Errorf("workspace %q (%s) is, holds or lies inside %s, which members must not see", dir, real, p)
		}
	}
	return real, nil
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// stdioServers is the JSON the agent container finds in AIRLOCK_MCP_SERVERS:
// the stdio MCP servers it spawns itself, inside its own cage.
func stdioServers(servers []policy.MCPServer) string {
	type server struct {
		Name    string            `json:"name"`
		Image   string            `json:"image,omitempty"`
		Command []string          `json:"command,omitempty"`
		Env     map[string]string `json:"env,omitempty"`
	}
	var out []server
	for _, s := range servers {
		if s.Transport == "stdio" {
			out = append(out, server{s.Name, s.Image, s.Command, s.Env})
		}
	}
	if len(out) == 0 {
		return ""
	}
	b, _ := json.Marshal(out)
	return string(b)
}

func (d *Daemon) WaitContainer(ctx context.Context, sandbox, id string) (ui.ContainerResult, error) {
	r := &d.dockerRuns
	r.mu.Lock()
	var w *memberWait
	for wid, x := range r.waiters {
		if x.sandbox == sandbox && (wid == id || strings.HasPrefix(wid, id) && len(id) >= 12) {
			w = x
		}
	}
	r.mu.Unlock()
	if w == nil {
		return ui.ContainerResult{}, &ui.ManagerError{Msg: fmt.Sprintf("sandbox %s has no member %q that airlock started", sandbox, id), NotFound: true}
	}
	select {
	case <-w.done:
		return w.res, w.err
	case <-ctx.Done():
		return ui.ContainerResult{}, ctx.Err()
	}
}

func (d *Daemon) RemoveContainer(sandbox, id string) error {
	ctx, cancel := context.WithTimeout(d.ctx, 30*time.Second)
	defer cancel()
	err := d.docker.Remove(ctx, sandbox, id)
	if errdefs.IsNotFound(err) {
		return &ui.ManagerError{Msg: err.Error(), NotFound: true}
	}
	return err
}

// The ui.MemberOutput methods. ui finds them by a type assertion on
// Containers; this keeps them from going missing unnoticed.
var _ ui.MemberOutput = (*Daemon)(nil)

func (d *Daemon) Archive(ctx context.Context, sandbox, id, path string) (io.ReadCloser, error) {
	rc, err := d.docker.Archive(ctx, sandbox, id, path)
	if err != nil {
		return nil, memberError(err, "archives are read only under /workspace, and never through a symbolic link that leads out of it")
	}
	return rc, nil
}

func (d *Daemon) Logs(ctx context.Context, sandbox, id string, q ui.LogQuery, ready func() error, line func(ui.LogLine) error) error {
	err := d.docker.Logs(ctx, sandbox, id, netns.LogOptions{Follow: q.Follow, Tail: q.Tail, MaxLine: ui.MaxLogLine}, ready,
		func(stream string, text []byte, partial bool) error {
			return line(ui.LogLine{Stream: stream, Line: string(text), Partial: partial})
		})
	return memberError(err, "")
}

// memberError makes the engine's and Archive's refusals the API's: a
// container that is not the sandbox's, or a path that is not there, is
// not found; a path outside the workspace is the request's fault.
func memberError(err error, hint string) error {
	switch {
	case err == nil:
		return nil
	case errdefs.IsNotFound(err):
		return &ui.ManagerError{Msg: err.Error(), NotFound: true, Hint: "airlock docker ps SANDBOX lists its containers"}
	case errors.Is(err, netns.ErrOutsideWorkspace):
		return &ui.ManagerError{Msg: err.Error(), Hint: hint}
	}
	return err
}
