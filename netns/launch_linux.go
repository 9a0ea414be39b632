package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/errdefs"
	"github.com/docker/docker/pkg/stdcopy"
)

// Paths of the sandbox CA inside a container airlock starts.
const (
	ContainerCAFile     = "/etc/airlock/ca.pem"
	ContainerCABundle   = "/etc/airlock/ca-bundle.pem"
	ContainerWorkspace  = "/workspace"
	nobody              = "65534:65534"
	defaultPidsLimit    = 256
	maxLaunchOutput     = 1 << 20
	maxLaunchLogRead    = 256 << 20 // of the last 10,000 lines, for maxLaunchOutput
	containerNameMaxLen = 128
)

// A Launch describes a member airlock starts itself.
type Launch struct {
	Sandbox string
	Image   string
	Cmd     []string // empty: the image's own command
	Env     []string // KEY=VALUE, added to the CA variables
	// Name is the container's name; "" lets Docker choose one.
	Name string
	// Source, Agent and Trust become the labels airlock.source,
	// airlock.agent and airlock.trust.
	Source, Agent, Trust string
	// Sidecar marks a long-running MCP server: Docker restarts it when it
	// fails, with its growing back-off delay.
	Sidecar bool
	// User runs the command as this user; "" keeps the image's user, or
	// nobody (65534:65534) when the image would run as root.
	User      string
	MemoryMB  int
	CPUs      float64
	PidsLimit int64 // 0 means 256
	// Workspace, when set, is a host directory mounted read-only at
	// /workspace (read-write with WorkspaceRW).
	Workspace   string
	WorkspaceRW bool
	// Session, when set, makes the member a session's (airlock.managed
	// "session", airlock.session the ID): airlockd's sessions supervise it,
	// not the run timeout of one-off members.
	Session string
	// Stdin, when set, is written to the member's standard input, which
	// then ends.
	Stdin string
	// CAFile and CABundle are host files: the sandbox CA and the bundle of
	// system roots plus it. They are mounted read-only and named in CAEnv.
	CAFile, CABundle string
}

var containerName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

func (l *Launch) check() error {
	switch {
	case l.Image == "":
		return errors.New("no image")
	case l.Name != "" && (len(l.Name) > containerNameMaxLen || !containerName.MatchString(l.Name)):
		return fmt.Errorf("container name %q: want letters, digits, '_', '.' or '-', starting with a letter or digit", l.Name)
	case l.Workspace != "" && !path.IsAbs(l.Workspace):
		return fmt.Errorf("workspace %q is not an absolute path", l.Workspace)
	case l.MemoryMB < 0 || l.CPUs < 0 || l.PidsLimit < 0:
		return errors.New("negative resource limit")
	case l.CAFile == "" || l.CABundle == "":
		return errors.New("no sandbox CA")
	}
	for _, e := range l.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t\n\x00") {
			return fmt.Errorf("environment entry %q: want KEY=VALUE", e)
		}
	}
	switch l.Trust {
	case "", "builtin", "verified", "user_added":
	default:
		return fmt.Errorf("trust %q: want builtin, verified or user_added", l.Trust)
	}
	if l.User != "" {
		uid, gid, hasGID := strings.Cut(l.User, ":")
		ids := []string{uid}
		if hasGID {
			ids = append(ids, gid)
		}
		for _, id := range ids {
			if n, err := strconv.ParseUint(id, 10, 32); err != nil || n == 0 {
				return fmt.Errorf("user %q: want a numeric UID[:GID] other than 0 (members never run as root)", l.User)
			}
		}
	}
	return nil
}

// isRoot reports whether an image's USER ("name", "uid", "uid:gid") runs as
// root: empty, root, or a number that is 0 however it is written.
func isRoot(user string) bool {
	u, g, _ := strings.Cut(user, ":")
	if u == "" || u == "root" || g == "root" {
		return true
	}
	for _, id := range []string{u, g} {
		if n, err := strconv.ParseUint(id, 10, 32); err == nil && n == 0 {
			return true
		}
	}
	return false
}

// Launch creates and starts a hardened member of a sandbox on its Docker
// network: no capabilities, no new privileges, a read-only root with a
// tmpfs /tmp, a non-root user unless the image names one, pids, memory
// and CPU limits, the project directory read-only at /workspace, and the
// sandbox CA trusted through CAEnv. It returns the container's ID.
func (d *Docker) Launch(ctx context.Context, l Launch) (string, error) {
	if err := l.check(); err != nil {
		return "", err
	}
	img, err := d.cli.ImageInspect(ctx, l.Image)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return "", fmt.Errorf("image %s is not on this host (airlock does not pull images; docker pull or build it first)", l.Image)
		}
		return "", fmt.Errorf("image %s: %w", l.Image, err)
	}
	user := l.User
	if user == "" && img.Config != nil {
		user = img.Config.User
	}
	if isRoot(user) {
		user = nobody
	}
	env := append([]string(nil), l.Env...)
	for _, k := range CAEnv {
		f := ContainerCABundle
		if k == "NODE_EXTRA_CA_CERTS" {
			f = ContainerCAFile // node adds it to its own roots
		}
		env = append(env, k+"="+f)
	}
	labels := map[string]string{LabelSandbox: l.Sandbox, LabelManaged: "member"}
	switch {
	case l.Sidecar:
		labels[LabelManaged] = "sidecar"
	case l.Session != "":
		labels[LabelManaged], labels[LabelSession] = "session", l.Session
	}
	for k, v := range map[string]string{LabelSource: l.Source, LabelAgent: l.Agent, LabelTrust: l.Trust} {
		if v != "" {
			labels[k] = v
		}
	}
	pids := l.PidsLimit
	if pids == 0 {
		pids = defaultPidsLimit
	}
	mounts := []mount.Mount{
		{Type: mount.TypeBind, Source: l.CAFile, Target: ContainerCAFile, ReadOnly: true},
		{Type: mount.TypeBind, Source: l.CABundle, Target: ContainerCABundle, ReadOnly: true},
	}
	if l.Workspace != "" {
		mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: l.Workspace, Target: ContainerWorkspace, ReadOnly: !l.WorkspaceRW})
	}
	host := &container.HostConfig{
		NetworkMode:    container.NetworkMode(DockerNetworkName(l.Sandbox)),
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges:true"},
		ReadonlyRootfs: true,
		Tmpfs:          map[string]string{"/tmp": "rw,noexec,nosuid,nodev,size=64m"},
		Mounts:         mounts,
		Resources: container.Resources{
			Memory:     int64(l.MemoryMB) << 20,
			MemorySwap: int64(l.MemoryMB) << 20, // no swap beyond the limit
			NanoCPUs:   int64(l.CPUs * 1e9),
			PidsLimit:  &pids,
		},
	}
	if l.Sidecar {
		host.RestartPolicy = container.RestartPolicy{Name: container.RestartPolicyOnFailure}
	}
	cfg := &container.Config{Image: l.Image, Cmd: l.Cmd, Env: env, User: user, Labels: labels}
	if l.Stdin != "" {
		cfg.OpenStdin, cfg.StdinOnce, cfg.AttachStdin = true, true, true
	}
	netCfg := &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{DockerNetworkName(l.Sandbox): {}}}
	created, err := d.cli.ContainerCreate(ctx, cfg, host, netCfg, nil, l.Name)
	if err != nil {
		return "", fmt.Errorf("create container: %w", err)
	}
	var stdin *types.HijackedResponse
	if l.Stdin != "" {
		att, err := d.cli.ContainerAttach(ctx, created.ID, container.AttachOptions{Stream: true, Stdin: true})
		if err != nil {
			d.cli.ContainerRemove(context.WithoutCancel(ctx), created.ID, container.RemoveOptions{Force: true})
			return "", fmt.Errorf("attach to the container's standard input: %w", err)
		}
		stdin = &att
	}
	if err := d.cli.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		if stdin != nil {
			stdin.Close()
		}
		d.cli.ContainerRemove(context.WithoutCancel(ctx), created.ID, container.RemoveOptions{Force: true})
		return "", fmt.Errorf("start container: %w", err)
	}
	if stdin != nil {
		// In the background: a member that never reads must not hold up
		// the launch. Its end closes the stream.
		go func() {
			defer stdin.Close()
			io.WriteString(stdin.Conn, l.Stdin)
			stdin.CloseWrite()
		}()
	}
	d.track(ctx, created.ID, "start")
	return created.ID, nil
}

// Result is how a launched member ended.
type Result struct {
	ExitCode int
	TimedOut bool   // killed at its run timeout
	Output   []byte // its standard output and error, the last 1 MiB
}

// Wait waits for container id to exit, killing it after timeout (0: no
// limit), collects its output and removes it.
func (d *Docker) Wait(ctx context.Context, id string, timeout time.Duration) (Result, error) {
	var res Result
	wctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	waitC, errC := d.cli.ContainerWait(wctx, id, container.WaitConditionNotRunning)
	select {
	case w := <-waitC:
		res.ExitCode = int(w.StatusCode)
	case err := <-errC:
		if wctx.Err() == nil || ctx.Err() != nil {
			return res, fmt.Errorf("wait for container: %w", err)
		}
		res.TimedOut = true
		bg := context.WithoutCancel(ctx)
		d.cli.ContainerKill(bg, id, "KILL")
		w, e2 := d.cli.ContainerWait(bg, id, container.WaitConditionNotRunning)
		select {
		case r := <-w:
			res.ExitCode = int(r.StatusCode)
		case <-e2:
			res.ExitCode = 137
		}
	}
	bg := context.WithoutCancel(ctx)
	if rc, err := d.cli.ContainerLogs(bg, id, container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: "10000"}); err == nil {
		// The last lines, read through to their end: the last bytes
		// are what a caller wants (an agent's answer comes last).
		out := &TailWriter{Max: maxLaunchOutput}
		stdcopy.StdCopy(out, out, io.LimitReader(rc, maxLaunchLogRead))
		rc.Close()
		res.Output = out.Bytes()
	}
	if err := d.cli.ContainerRemove(bg, id, container.RemoveOptions{Force: true}); err != nil && !errdefs.IsNotFound(err) {
		d.log.Warn("remove finished member", "container", id, "err", err)
	}
	return res, nil
}

// Remove stops and removes a container of the sandbox. It refuses a
// container that is not on the sandbox's network nor made for it.
func (d *Docker) Remove(ctx context.Context, sandbox, id string) error {
	info, err := d.member(ctx, sandbox, id)
	if err != nil {
		return err
	}
	return d.cli.ContainerRemove(ctx, info.ID, container.RemoveOptions{Force: true})
}
