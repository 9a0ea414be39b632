package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/docker/docker/errdefs"
	"golang.org/x/sys/unix"
)

// Labels airlock reads on containers and puts on what it creates.
const (
	// LabelSource names the member in records ("mcp:github"); without it a
	// container is named by its container name.
	LabelSource = "airlock.source"
	// LabelAgent names the agent that drives the member, when known.
	LabelAgent = "airlock.agent"
	// LabelTrust is the member's trust level: builtin, verified or
	// user_added.
	LabelTrust = "airlock.trust"
	// LabelSandbox marks networks and containers airlock made for a sandbox.
	LabelSandbox = "airlock.sandbox"
	// LabelManaged marks containers airlock started itself: "member" for a
	// one-off member, "sidecar" for an MCP server it keeps running,
	// "session" for a task of a session.
	LabelManaged = "airlock.managed"
	// LabelSession names the session whose task a container runs.
	LabelSession = "airlock.session"
)

// DockerNetworkName is the Docker network of a sandbox.
func DockerNetworkName(sandbox string) string { return "airlock-" + sandbox }

// A Member is a container in a sandbox, as attribution sees it.
type Member struct {
	Sandbox   string
	ID        string // the container's ID
	Name      string // the container's name, without Docker's leading "/"
	Source    string // the label airlock.source, or else Name
	Agent     string // the label airlock.agent
	Trust     string // the label airlock.trust
	Addr      netip.Addr
	Managed   string // the label airlock.managed
	Running   bool
	StartedAt time.Time
	ExitCode  int // when it died
}

// Docker is airlockd's link to a Docker Engine: it keeps one Docker network
// per sandbox on the sandbox's bridge and follows the engine's events to
// know which container holds which member address.
type Docker struct {
	cli *client.Client
	log *slog.Logger

	// mu guards the following fields.
	mu       sync.Mutex
	networks map[string]sandboxNet // by Docker network name
	members  map[netip.Addr]Member
	byID     map[string][]netip.Addr
	missed   map[netip.Addr]time.Time // when an unknown address was last looked for
	adoptMu  sync.Mutex               // one Adopt at a time
	adopted  time.Time                // when the last Adopt ended; guarded by adoptMu
	changed  chan struct{}            // closed, and replaced, when a member joins
	onChange []func(Member, string)
}

type sandboxNet struct {
	sandbox string
	net     Network
}

// ConnectDocker connects to the engine named by DOCKER_HOST (default the
// local socket) and checks that it answers. An error means no engine: the
// caller runs without Docker members.
func ConnectDocker(ctx context.Context, log *slog.Logger) (*Docker, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cli.Ping(pctx); err != nil {
		cli.Close()
		return nil, fmt.Errorf("no Docker Engine at %s: %w", cli.DaemonHost(), err)
	}
	if err := sameNetns(cli.DaemonHost()); err != nil {
		cli.Close()
		return nil, err
	}
	return &Docker{
		cli: cli, log: log,
		networks: map[string]sandboxNet{},
		members:  map[netip.Addr]Member{},
		byID:     map[string][]netip.Addr{},
		missed:   map[netip.Addr]time.Time{},
		changed:  make(chan struct{}),
	}, nil
}

// Client is the engine's API client.
func (d *Docker) Client() *client.Client { return d.cli }

// Close closes the client.
func (d *Docker) Close() error { return d.cli.Close() }

// OnChange registers f to hear of members that join ("start") or leave
// ("die", "kill", "destroy", "disconnect"); a member that died carries its
// exit code.
func (d *Docker) OnChange(f func(m Member, event string)) {
	d.mu.Lock()
	d.onChange = append(d.onChange, f)
	d.mu.Unlock()
}

// DockerRange returns the addresses Docker gives containers: the upper half
// of the subnet, above the addresses of `airlock run` members.
func (n Network) DockerRange() netip.Prefix {
	return netip.PrefixFrom(addU32(n.Subnet.Addr(), uint32(1)<<(32-n.Subnet.Bits())/2), n.Subnet.Bits()+1)
}

// Register tells d of a sandbox network before its Docker network is made,
// so that Member waits for and reads the containers of its address range
// from the moment the sandbox's gate and proxy listen.
func (d *Docker) Register(sandbox string, n Network) {
	d.mu.Lock()
	d.networks[DockerNetworkName(sandbox)] = sandboxNet{sandbox, n}
	d.mu.Unlock()
}

// EnsureNetwork creates the Docker network of a sandbox on its bridge, or
// recreates it when it is missing a piece or has one it must not have: the
// bridge driver on n.Bridge, the sandbox's subnet and gateway, Docker's
// addresses in n.DockerRange(), and no IP masquerade. Containers attached
// to a wrong network are reconnected to the new one.
func (d *Docker) EnsureNetwork(ctx context.Context, sandbox string, n Network) error {
	name := DockerNetworkName(sandbox)
	want := network.CreateOptions{
		Driver: "bridge",
		IPAM: &network.IPAM{Config: []network.IPAMConfig{{
			Subnet:  n.Subnet.String(),
			IPRange: n.DockerRange().String(),
			Gateway: n.Gateway.String(),
		}}},
		Options: map[string]string{
			"com.docker.network.bridge.name":                 n.Bridge,
			"com.docker.network.bridge.enable_ip_masquerade": "false",
		},
		Labels: map[string]string{LabelSandbox: sandbox},
	}
	var reattach []string
	cur, err := d.cli.NetworkInspect(ctx, name, network.InspectOptions{})
	switch {
	case errdefs.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("docker network %s: %w", name, err)
	default:
		why := networkDiffers(cur, want)
		if why == "" {
			d.mu.Lock()
			d.networks[name] = sandboxNet{sandbox, n}
			d.mu.Unlock()
			return nil
		}
		d.log.Warn("docker network is wrong; recreating it", "network", name, "why", why)
		for id := range cur.Containers {
			if err := d.cli.NetworkDisconnect(ctx, cur.ID, id, true); err != nil {
				return fmt.Errorf("docker network %s: disconnect %s: %w", name, id, err)
			}
			reattach = append(reattach, id)
		}
		if err := d.cli.NetworkRemove(ctx, cur.ID); err != nil {
			return fmt.Errorf("docker network %s: remove: %w", name, err)
		}
	}
	if _, err := d.cli.NetworkCreate(ctx, name, want); err != nil {
		return fmt.Errorf("docker network %s: create: %w", name, err)
	}
	d.mu.Lock()
	d.networks[name] = sandboxNet{sandbox, n}
	d.mu.Unlock()
	for _, id := range reattach {
		if err := d.cli.NetworkConnect(ctx, name, id, nil); err != nil {
			d.log.Warn("reconnect container to its sandbox", "network", name, "container", id, "err", err)
		}
	}
	return nil
}

// networkDiffers says how cur is not want, or "" when it is.
func networkDiffers(cur network.Inspect, want network.CreateOptions) string {
	if cur.Driver != want.Driver {
		return "driver " + cur.Driver
	}
	if cur.Internal || cur.Attachable || cur.Ingress || cur.EnableIPv6 {
		return "internal, attachable, ingress or IPv6 set"
	}
	for k, v := range want.Options {
		if cur.Options[k] != v {
			return fmt.Sprintf("option %s=%q", k, cur.Options[k])
		}
	}
	if len(cur.IPAM.Config) != 1 {
		return fmt.Sprintf("%d address ranges", len(cur.IPAM.Config))
	}
	c, w := cur.IPAM.Config[0], want.IPAM.Config[0]
	if c.Subnet != w.Subnet || c.Gateway != w.Gateway || c.IPRange != w.IPRange {
		return fmt.Sprintf("subnet %s range %s gateway %s", c.Subnet, c.IPRange, c.Gateway)
	}
	return ""
}

// RemoveSandbox removes every container on the sandbox's Docker network,
// then the network. A missing network is not an error.
func (d *Docker) RemoveSandbox(ctx context.Context, sandbox string) error {
	name := DockerNetworkName(sandbox)
	cur, err := d.cli.NetworkInspect(ctx, name, network.InspectOptions{})
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("docker network %s: %w", name, err)
	}
	// Forgotten first, so the events of the removal recreate nothing; put
	// back if the removal fails, as the sandbox then stays.
	d.mu.Lock()
	sn, had := d.networks[name]
	delete(d.networks, name)
	d.mu.Unlock()
	restore := func() {
		if had {
			d.Register(sandbox, sn.net)
		}
	}
	ids := slices.Collect(maps.Keys(cur.Containers))
	// Containers airlock made for the sandbox but not running now.
	made, err := d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelSandbox+"="+sandbox))})
	if err == nil {
		for _, c := range made {
			ids = append(ids, c.ID)
		}
	}
	var errs []error
	for _, id := range ids {
		if err := d.cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true}); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove container %s: %w", id, err))
		}
	}
	if len(errs) > 0 {
		restore()
		return errors.Join(errs...)
	}
	if err := d.cli.NetworkRemove(ctx, cur.ID); err != nil && !errdefs.IsNotFound(err) {
		restore()
		return fmt.Errorf("docker network %s: remove: %w", name, err)
	}
	d.mu.Lock()
	for a, m := range d.members {
		if m.Sandbox == sandbox {
			delete(d.members, a)
			delete(d.byID, m.ID) // all its addresses are in this sandbox's subnet
		}
	}
	d.mu.Unlock()
	return nil
}

// RemoveOthers removes the Docker network, with its containers, of every
// sandbox airlock made one for and keep does not name (all of them for
// airlockd --teardown; those of sandboxes gone from the config at start).
// A network left behind would bring its bridge back when a container
// joins it, and only the rule set's catch-all would stand in its way.
func (d *Docker) RemoveOthers(ctx context.Context, keep ...string) error {
	nets, err := d.cli.NetworkList(ctx, network.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelSandbox))})
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range nets {
		sb := n.Labels[LabelSandbox]
		if slices.Contains(keep, sb) || n.Name != DockerNetworkName(sb) {
			continue
		}
		d.log.Info("removing the Docker network of a sandbox that is gone", "network", n.Name)
		if err := d.RemoveSandbox(ctx, sb); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Member returns the container holding addr. A container speaks before
// the engine has told anyone it started (its start event, even its running
// state, come after its first packets), so on a miss for an address Docker
// hands out, Member re-reads the engine's containers and waits up to a
// second for the start to be reported.
func (d *Docker) Member(addr netip.Addr) (Member, bool) {
	deadline := time.Now().Add(time.Second)
	for {
		d.mu.Lock()
		m, ok := d.members[addr]
		dockers := false
		for _, sn := range d.networks {
			dockers = dockers || sn.net.DockerRange().Contains(addr)
		}
		stale := !ok && time.Since(d.missed[addr]) > 100*time.Millisecond
		if stale {
			if len(d.missed) > 4096 {
				clear(d.missed)
			}
			d.missed[addr] = time.Now()
		}
		changed := d.changed
		d.mu.Unlock()
		if ok {
			return m, true
		}
		if stale {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := d.Adopt(ctx); err != nil {
				d.log.Debug("docker: re-read containers", "err", err)
			}
			cancel()
			d.mu.Lock()
			m, ok = d.members[addr]
			d.mu.Unlock()
			if ok {
				return m, true
			}
		}
		if !dockers || time.Now().After(deadline) {
			return Member{}, false
		}
		select {
		case <-changed:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// AgentOf returns the agent of the sandbox's running members labelled
// source, or "".
func (d *Docker) AgentOf(sandbox, source string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, m := range d.members {
		if m.Sandbox == sandbox && m.Source == source && m.Agent != "" {
			return m.Agent
		}
	}
	return ""
}

// Members returns the sandbox's containers, sorted by name.
func (d *Docker) Members(sandbox string) []Member {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []Member
	for _, m := range d.members {
		if m.Sandbox == sandbox {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Adopt reads every running container on a sandbox network, which is how
// airlockd names members that started before it did, and forgets members
// that are no longer there (their die event may have been lost while the
// engine's event stream was down). Calls that come while one runs share
// its result, and it runs at most ten times a second.
func (d *Docker) Adopt(ctx context.Context) error {
	d.adoptMu.Lock()
	defer d.adoptMu.Unlock()
	if time.Since(d.adopted) < 100*time.Millisecond {
		return nil // a re-read that began after the caller asked has just ended
	}
	defer func() { d.adopted = time.Now() }()
	d.mu.Lock()
	nets := maps.Clone(d.networks)
	d.mu.Unlock()
	seen := map[string]bool{}
	for name := range nets {
		list, err := d.cli.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("network", name))})
		if err != nil {
			return err
		}
		for _, c := range list {
			if seen[c.ID] {
				continue
			}
			seen[c.ID] = true
			d.track(ctx, c.ID, "start")
		}
	}
	d.mu.Lock()
	var stale []string
	for id := range d.byID {
		if !seen[id] {
			stale = append(stale, id)
		}
	}
	d.mu.Unlock()
	for _, id := range stale {
		d.track(ctx, id, "gone") // inspects it once more: forgets it unless it runs
	}
	return nil
}

// track inspects container id and records (or forgets) its sandbox
// address.
func (d *Docker) track(ctx context.Context, id, event string) {
	info, err := d.cli.ContainerInspect(ctx, id)
	if err != nil {
		d.forget(id, event, 0)
		return
	}
	if info.State == nil || !info.State.Running {
		d.forget(id, event, 0)
		return
	}
	d.mu.Lock()
	nets := maps.Clone(d.networks)
	d.mu.Unlock()
	var found []Member
	var others []string
	for netName, ep := range info.NetworkSettings.Networks {
		sn, ok := nets[netName]
		if !ok || ep == nil {
			others = append(others, netName)
			continue
		}
		sb := sn.sandbox
		addr, err := netip.ParseAddr(ep.IPAddress)
		if err != nil {
			continue
		}
		m := Member{
			Sandbox: sb, ID: info.ID, Name: strings.TrimPrefix(info.Name, "/"), Addr: addr, Running: true,
			Source: info.Config.Labels[LabelSource], Agent: info.Config.Labels[LabelAgent],
			Trust: info.Config.Labels[LabelTrust], Managed: info.Config.Labels[LabelManaged],
		}
		if m.Source == "" {
			m.Source = m.Name
		}
		m.StartedAt, _ = time.Parse(time.RFC3339Nano, info.State.StartedAt)
		found = append(found, m)
	}
	if len(found) == 0 {
		d.forget(id, event, 0)
		return
	}
	// A member on a network of another kind as well would have a way out
	// that no rule of airlock's sees: it leaves that network.
	for _, n := range others {
		d.log.Error("a sandbox member was also on another Docker network; disconnecting it from that one", "container", found[0].Name, "sandbox", found[0].Sandbox, "network", n)
		if err := d.cli.NetworkDisconnect(ctx, n, info.ID, true); err != nil {
			d.log.Error("disconnect a sandbox member from another network failed; stopping it", "container", found[0].Name, "network", n, "err", err)
			d.cli.ContainerKill(ctx, info.ID, "KILL")
			d.forget(id, "killed", 137)
			return
		}
	}
	d.mu.Lock()
	var added []Member
	addrs := make([]netip.Addr, 0, len(found))
	for _, m := range found {
		if old, ok := d.members[m.Addr]; !ok || old.ID != m.ID {
			added = append(added, m)
		}
		d.members[m.Addr] = m
		addrs = append(addrs, m.Addr)
	}
	for _, a := range d.byID[info.ID] {
		if !slices.Contains(addrs, a) && d.members[a].ID == info.ID {
			delete(d.members, a) // left one of the sandbox networks
		}
	}
	d.byID[info.ID] = addrs
	if len(added) > 0 {
		close(d.changed)
		d.changed = make(chan struct{})
	}
	hooks := d.onChange
	d.mu.Unlock()
	for _, m := range added {
		for _, f := range hooks {
			f(m, "start")
		}
	}
}

func (d *Docker) forget(id, event string, exitCode int) {
	d.mu.Lock()
	var gone []Member
	for _, a := range d.byID[id] {
		if m, ok := d.members[a]; ok && m.ID == id {
			m.Running, m.ExitCode = false, exitCode
			gone = append(gone, m)
			delete(d.members, a)
		}
	}
	delete(d.byID, id)
	hooks := d.onChange
	d.mu.Unlock()
	for _, m := range gone {
		for _, f := range hooks {
			f(m, event)
		}
	}
}

// Watch follows the engine's container and network events until ctx ends,
// keeping the member table current. It adopts running members first, and
// again after the event stream breaks (the engine restarted).
func (d *Docker) Watch(ctx context.Context) {
	for ctx.Err() == nil {
		f := filters.NewArgs(filters.Arg("type", string(events.ContainerEventType)), filters.Arg("type", string(events.NetworkEventType)))
		msgs, errs := d.cli.Events(ctx, events.ListOptions{Filters: f})
		if err := d.Adopt(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn("docker: read running containers", "err", err)
		}
	loop:
		for {
			select {
			case <-ctx.Done():
				return
			case err := <-errs:
				if ctx.Err() == nil && !errors.Is(err, io.EOF) {
					d.log.Warn("docker: event stream broke; following it again", "err", err)
				}
				break loop
			case m := <-msgs:
				d.event(ctx, m)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (d *Docker) event(ctx context.Context, m events.Message) {
	switch {
	case m.Type == events.ContainerEventType && (m.Action == events.ActionStart || m.Action == events.ActionRestart || m.Action == events.ActionUnPause):
		d.track(ctx, m.Actor.ID, string(m.Action))
	case m.Type == events.ContainerEventType && (m.Action == events.ActionDie || m.Action == events.ActionDestroy):
		code, _ := strconv.Atoi(m.Actor.Attributes["exitCode"])
		d.forget(m.Actor.ID, string(m.Action), code)
	case m.Type == events.NetworkEventType && (m.Action == events.ActionConnect || m.Action == events.ActionDisconnect):
		if id := m.Actor.Attributes["container"]; id != "" {
			d.track(ctx, id, string(m.Action))
		}
	case m.Type == events.NetworkEventType && m.Action == events.ActionDestroy:
		name := m.Actor.Attributes["name"]
		d.mu.Lock()
		sn, ours := d.networks[name]
		d.mu.Unlock()
		if ours {
			d.log.Warn("a sandbox's Docker network was removed behind airlockd's back; creating it again", "network", name)
			if err := d.EnsureNetwork(ctx, sn.sandbox, sn.net); err != nil {
				d.log.Error("recreate Docker network", "network", name, "err", err)
			}
		}
	}
}

// sameNetns checks that the engine behind a unix socket runs in this
// process's network namespace: Docker attaches containers to the bridge of
// that name in its own namespace, so an airlockd elsewhere (a test's
// namespace, say) would be handing out networks on bridges it does not
// cage. What cannot be checked is refused: an engine over TCP, or one whose
// process this one cannot see. /proc/PID/net names the namespace of PID
// and, unlike /proc/PID/ns/net, can be read without ptrace rights, which
// airlockd lacks under its systemd unit.
func sameNetns(host string) error {
	path, ok := strings.CutPrefix(host, "unix://")
	if !ok {
		return fmt.Errorf("the Docker Engine at %s is not on a local unix socket: airlock cannot check that its containers join bridges it cages", host)
	}
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return fmt.Errorf("no Docker Engine at %s: %w", host, err)
	}
	defer c.Close()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cerr != nil || cred == nil || cred.Pid <= 0 {
		return fmt.Errorf("the Docker Engine at %s: cannot tell which process serves it (%v), so not whether it shares airlockd's network namespace", host, cerr)
	}
	theirs, ours := fmt.Sprintf("/proc/%d/net/dev", cred.Pid), "/proc/self/net/dev"
	for try := 0; ; try++ {
		a, err1 := linkNames(theirs)
		b, err2 := linkNames(ours)
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("the Docker Engine at %s: %w", host, err)
		}
		if slices.Equal(a, b) {
			return nil
		}
		if try == 2 { // links come and go; a namespace of its own differs every time
			return fmt.Errorf("the Docker Engine at %s (pid %d) runs in another network namespace than airlockd: its containers could not join this airlockd's sandbox bridges", host, cred.Pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// linkNames returns the sorted interface names of a /proc/…/net/dev file.
func linkNames(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok {
			names = append(names, strings.TrimSpace(name))
		}
	}
	slices.Sort(names)
	return names, nil
}
