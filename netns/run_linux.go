package netns

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// InitArg is the first argument with which `airlock` re-executes itself as
// the init process of a member's namespaces. cmd/airlock hands such a run
// to MemberInit.
const InitArg = "__airlock-member-init"

const initEnv = "AIRLOCK_MEMBER_INIT"

// MemberVethPrefix starts the host-side name of every member veth. The
// rule set drops traffic from such a veth when it is not on a bridge.
const MemberVethPrefix = "alr"

// CAEnv are the variables that point programs at a CA bundle.
var CAEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT"}

// RunConfig configures Run.
type RunConfig struct {
	Sandbox string
	// Source labels the member in events; "" means "run".
	Source string
	// Command is the program and its arguments. Required.
	Command []string
	// LeaseDir holds the sandbox's member leases (RUN_DIR/leases/SANDBOX).
	LeaseDir string
	// CABundle, when set, is exported to the command in CAEnv. It stays
	// readable at its path when it lies under a Hide directory.
	CABundle string
	// Hide are directories (airlockd's STATE_DIR and RUN_DIR) the member
	// must not see: each is covered with an empty read-only tmpfs in the
	// member's mount namespace. Each must be an existing directory, or Run
	// refuses to start the member.
	Hide []string
	// ReadOnly are files (the sandboxes' policy files, airlockd's config
	// file, upstream_ca_file) bound read-only onto themselves in the
	// member's mount namespace; missing ones are skipped.
	ReadOnly []string
	// ReadOnlyDirs are directories (the config file's) bound read-only
	// onto themselves, with what is mounted below them, so that nothing in
	// them can be written, renamed over or removed; missing ones are
	// skipped.
	ReadOnlyDirs []string
	// UID and GID run the command as that user; nil runs it as root, but
	// with no capabilities at all.
	UID, GID *uint32
	// Env is the command's environment; nil means os.Environ(). Airlock's
	// own variables are dropped from it (MemberEnv).
	Env []string
	// TaskEnv are NAME=VALUE entries added after that filter: what
	// airlockd itself hands a member (AIRLOCK_TASK).
	TaskEnv []string
	// Stdin, Stdout and Stderr default to the process's own.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Workspace, when set, is a host directory mounted read-write at
	// /workspace, and the command starts there. The member then runs in a
	// root of its own: the host's directories bound read-only (with what
	// Hide and ReadOnly made of them) and the workspace, the only place it
	// can write.
	Workspace string
	// KillOnCancel kills the member when ctx ends (SIGKILL to its init,
	// which ends its whole PID namespace) instead of sending it SIGTERM.
	KillOnCancel bool
	// NoSignalForward leaves the process's own signals alone; by default
	// Run passes SIGINT, SIGTERM, SIGHUP and SIGQUIT on to the member,
	// as a command run from a terminal expects. airlockd, whose SIGHUP
	// means reload, sets it.
	NoSignalForward bool
}

// MemberEnv returns env without airlock's own variables: every name that
// starts with AIRLOCK_ in any case (AIRLOCK_TOKEN, AIRLOCK_API,
// AIRLOCK_CONFIG, AIRLOCK_TOKEN_FILE, …), so that no credential of the
// control plane, nor the way to it, reaches a member (design §8, invariant
// 14), and entries that are not NAME=VALUE. The rest passes as it is; the
// caller then adds the CA variables and AIRLOCK_SANDBOX.
func MemberEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || name == "" || len(name) >= len("AIRLOCK_") && strings.EqualFold(name[:len("AIRLOCK_")], "AIRLOCK_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

type initConfig struct {
	Command  []string `json:"command"`
	Resolv   string   `json:"resolv"`
	Hide     []string `json:"hide,omitempty"`
	ReadOnly []string `json:"read_only,omitempty"`
	RODirs   []string `json:"read_only_dirs,omitempty"`
	Keep     string   `json:"keep,omitempty"` // the CA bundle
	// Workspace is bound at /workspace of a root of the member's own,
	// built at Root (an empty directory).
	Workspace string   `json:"workspace,omitempty"`
	Root      string   `json:"root,omitempty"`
	UID       *uint32  `json:"uid,omitempty"`
	GID       *uint32  `json:"gid,omitempty"`
	Env       []string `json:"env"`
}

// Run runs a command as a member of a sandbox: in fresh network, mount and
// PID namespaces, attached to the sandbox bridge with an address of its own,
// its DNS pointed at the gate, and no capabilities. It returns the command's
// exit code (128+n when killed by signal n). When the command exits, or is
// killed, or Run's own process dies, every process of the member dies with
// it and its network namespace and veth are gone.
func Run(ctx context.Context, cfg RunConfig) (int, error) {
	if len(cfg.Command) == 0 {
		return 0, errors.New("airlock run: no command")
	}
	if cfg.Source == "" {
		cfg.Source = "run"
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return 0, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	nw, err := LookupNetwork(h, cfg.Sandbox)
	if err != nil {
		return 0, err
	}
	bridge, err := h.LinkByName(nw.Bridge)
	if err != nil {
		return 0, err
	}
	lease, err := AcquireLease(cfg.LeaseDir, nw, cfg.Source)
	if err != nil {
		return 0, err
	}
	defer lease.Release()

	tmp, err := os.MkdirTemp("", "airlock-run-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	os.Chmod(tmp, 0o755)
	resolv := filepath.Join(tmp, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("# written by airlock run: every DNS query goes to the sandbox's gate\nnameserver "+nw.Gateway.String()+"\n"), 0o644); err != nil {
		return 0, err
	}

	env := cfg.Env
	if env == nil {
		env = os.Environ()
	}
	env = MemberEnv(env)
	if cfg.CABundle != "" {
		for _, k := range CAEnv {
			env = append(env, k+"="+cfg.CABundle)
		}
	}
	env = append(env, cfg.TaskEnv...)
	env = append(env, "AIRLOCK_SANDBOX="+cfg.Sandbox)
	// Checked here too, for a clear error before anything is built; the
	// member's init checks again and refuses on its own.
	for _, d := range cfg.Hide {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return 0, fmt.Errorf("hide %s from the member: not a directory (%v); check state_dir and run_dir in airlockd's config", d, err)
		}
	}
	ic := initConfig{Command: cfg.Command, Resolv: resolv, UID: cfg.UID, GID: cfg.GID, Env: env,
		Hide: cfg.Hide, ReadOnly: cfg.ReadOnly, RODirs: cfg.ReadOnlyDirs, Keep: cfg.CABundle}
	if cfg.Workspace != "" {
		if fi, err := os.Stat(cfg.Workspace); err != nil || !fi.IsDir() {
			return 0, fmt.Errorf("workspace %s: not a directory (%v)", cfg.Workspace, err)
		}
		ic.Workspace, ic.Root = cfg.Workspace, filepath.Join(tmp, "root")
		if err := os.Mkdir(ic.Root, 0o755); err != nil {
			return 0, err
		}
	}
	icJSON, _ := json.Marshal(ic)

	syncR, syncW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer syncW.Close()
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	child := exec.Command(self, InitArg)
	child.Env = []string{initEnv + "=" + string(icJSON)}
	child.Stdin, child.Stdout, child.Stderr = orStd(cfg.Stdin, os.Stdin), orOut(cfg.Stdout, os.Stdout), orOut(cfg.Stderr, os.Stderr)
	child.ExtraFiles = []*os.File{syncR}
	child.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS | unix.CLONE_NEWPID,
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := child.Start(); err != nil {
		syncR.Close()
		return 0, fmt.Errorf("start member namespaces: %w", err)
	}
	syncR.Close()
	pid := child.Process.Pid

	hostVeth, err := attach(h, bridge, nw, lease, pid)
	if err != nil {
		child.Process.Kill()
		child.Wait()
		return 0, err
	}
	defer func() {
		// The veth dies with the member's namespace; this catches a
		// namespace something else still holds.
		if l, err := h.LinkByName(hostVeth); err == nil {
			h.LinkDel(l)
		}
	}()
	if _, err := syncW.Write([]byte{1}); err != nil {
		child.Process.Kill()
		child.Wait()
		return 0, fmt.Errorf("start member: %w", err)
	}
	syncW.Close()

	sigs := make(chan os.Signal, 4)
	if !cfg.NoSignalForward {
		signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT)
		defer signal.Stop(sigs)
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				child.Process.Signal(s)
			case <-ctx.Done():
				if cfg.KillOnCancel {
					child.Process.Kill()
				} else {
					child.Process.Signal(unix.SIGTERM)
				}
				return
			case <-done:
				return
			}
		}
	}()
	err = child.Wait()
	close(done)
	return exitCode(child.ProcessState, err)
}

// attach creates the member's veth pair, puts one end in the member's
// namespace as eth0 with the lease's address and a default route through
// the gateway, and the other on the bridge.
func attach(h *netlink.Handle, bridge netlink.Link, nw Network, lease *Lease, pid int) (string, error) {
	suffix := make([]byte, 4)
	rand.Read(suffix)
	hostName := MemberVethPrefix + hex.EncodeToString(suffix)
	peerName := "alp" + hex.EncodeToString(suffix)
	la := netlink.NewLinkAttrs()
	la.Name = hostName
	la.MasterIndex = bridge.Attrs().Index
	veth := &netlink.Veth{LinkAttrs: la, PeerName: peerName, PeerNamespace: netlink.NsPid(pid)}
	if err := h.LinkAdd(veth); err != nil {
		return "", fmt.Errorf("create veth for member: %w", err)
	}
	if err := writeSysctl(filepath.Join("/proc/sys/net/ipv6/conf", hostName, "disable_ipv6"), "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return hostName, fmt.Errorf("disable IPv6 on %s: %w", hostName, err)
	}
	host, err := h.LinkByName(hostName)
	if err != nil {
		return hostName, err
	}
	if err := h.LinkSetUp(host); err != nil {
		return hostName, fmt.Errorf("bring up %s: %w", hostName, err)
	}

	ns, err := vnetns.GetFromPid(pid)
	if err != nil {
		return hostName, fmt.Errorf("open member namespace: %w", err)
	}
	defer ns.Close()
	mh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return hostName, fmt.Errorf("netlink in member namespace: %w", err)
	}
	defer mh.Close()
	peer, err := mh.LinkByName(peerName)
	if err != nil {
		return hostName, err
	}
	if err := mh.LinkSetName(peer, "eth0"); err != nil {
		return hostName, fmt.Errorf("rename member link: %w", err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: lease.Addr.AsSlice(), Mask: net.CIDRMask(nw.Subnet.Bits(), 32)}}
	if err := mh.AddrAdd(peer, addr); err != nil {
		return hostName, fmt.Errorf("member address %s: %w", lease.Addr, err)
	}
	lo, err := mh.LinkByName("lo")
	if err == nil {
		err = mh.LinkSetUp(lo)
	}
	if err != nil {
		return hostName, fmt.Errorf("bring up member loopback: %w", err)
	}
	if err := mh.LinkSetUp(peer); err != nil {
		return hostName, fmt.Errorf("bring up member link: %w", err)
	}
	route := &netlink.Route{LinkIndex: peer.Attrs().Index, Gw: nw.Gateway.AsSlice(), Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}
	if err := mh.RouteAdd(route); err != nil {
		return hostName, fmt.Errorf("member default route: %w", err)
	}
	return hostName, nil
}

func exitCode(ps *os.ProcessState, err error) (int, error) {
	if ps == nil {
		return 0, err
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ps.ExitCode(), nil
}

func orStd(r io.Reader, def io.Reader) io.Reader {
	if r == nil {
		return def
	}
	return r
}

func orOut(w io.Writer, def io.Writer) io.Writer {
	if w == nil {
		return def
	}
	return w
}

// IsMemberInit reports whether this process was started by Run as a
// member's init.
func IsMemberInit() bool {
	return len(os.Args) > 1 && os.Args[1] == InitArg && os.Getenv(initEnv) != ""
}

// MemberInit is the init process of a member's namespaces: it waits until
// Run has wired the network, points /etc/resolv.conf at the gate, mounts a
// /proc of its own, hides airlockd's state and makes the policy files
// read-only (see RunConfig.Hide and ReadOnly), turns IPv6 off, drops every
// capability for good, runs the command, reaps orphans, and exits with the
// command's status. It never returns.
func MemberInit() {
	code, err := memberInit()
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: %v\n", err)
		if code == 0 {
			code = 127
		}
	}
	os.Exit(code)
}

func memberInit() (int, error) {
	var cfg initConfig
	if err := json.Unmarshal([]byte(os.Getenv(initEnv)), &cfg); err != nil {
		return 0, fmt.Errorf("bad init config: %w", err)
	}
	os.Unsetenv(initEnv)
	sync := os.NewFile(3, "sync")
	var b [1]byte
	if _, err := sync.Read(b[:]); err != nil {
		return 0, fmt.Errorf("member network was not set up")
	}
	sync.Close()

	// The workspace is opened before confine hides airlockd's state
	// directory, where it lies, and bound from the open directory.
	wsFD := -1
	if cfg.Workspace != "" {
		fd, err := unix.Open(cfg.Workspace, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return 0, fmt.Errorf("open workspace %s: %w", cfg.Workspace, err)
		}
		wsFD = fd
		defer unix.Close(fd)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return 0, fmt.Errorf("make mounts private: %w", err)
	}
	if _, err := os.Stat("/etc/resolv.conf"); err == nil {
		if err := unix.Mount(cfg.Resolv, "/etc/resolv.conf", "", unix.MS_BIND, ""); err != nil {
			return 0, fmt.Errorf("bind resolv.conf: %w", err)
		}
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return 0, fmt.Errorf("mount /proc: %w", err)
	}
	if err := confine(cfg.RODirs, cfg.ReadOnly, cfg.Hide, cfg.Keep); err != nil {
		return 0, err
	}
	for _, k := range []string{"all", "default", "eth0", "lo"} {
		writeSysctl(filepath.Join("/proc/sys/net/ipv6/conf", k, "disable_ipv6"), "1")
	}
	// ICMP echo sockets for every group, so ping works without
	// capabilities (between members; beyond the bridge ICMP is dropped).
	writeSysctl("/proc/sys/net/ipv4/ping_group_range", "0 2147483647")
	if wsFD >= 0 {
		if err := enterWorkspaceRoot(cfg.Root, wsFD); err != nil {
			return 0, err
		}
	}

	// Look the command up the way its own environment would.
	os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	for _, kv := range cfg.Env {
		if p, ok := strings.CutPrefix(kv, "PATH="); ok {
			os.Setenv("PATH", p)
		}
	}
	path, err := exec.LookPath(cfg.Command[0])
	if err != nil {
		return 127, err
	}
	// Drop every capability from the bounding set and forbid gaining new
	// privileges: even a command running as root can then neither leave
	// its namespaces (setns needs CAP_SYS_ADMIN) nor reconfigure them.
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return 0, fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return 0, fmt.Errorf("no_new_privs: %w", err)
	}
	cmd := exec.Command(path, cfg.Command[1:]...)
	cmd.Args[0] = cfg.Command[0]
	cmd.Env = cfg.Env
	if wsFD >= 0 {
		cmd.Dir = ContainerWorkspace
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if cfg.UID != nil && cfg.GID != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: *cfg.UID, Gid: *cfg.GID, Groups: []uint32{}}
	}
	if err := cmd.Start(); err != nil {
		return 126, err
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT)
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	for {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("wait: %w", err)
		}
		if wpid != cmd.Process.Pid {
			continue // an orphan reparented to us
		}
		if ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ws.ExitStatus(), nil
	}
}

// confine changes the member's mount namespace, which must not propagate
// to the host's: each directory of readOnlyDirs and each file of readOnly
// is bound read-only onto itself, then
// each directory of hide is covered with an empty read-only tmpfs, except
// for the file keep (the CA bundle), bound back read-only at its path.
// Any failure is an error: the member must not run with airlockd's token,
// CA keys and API socket in reach.
func confine(readOnlyDirs, readOnly, hide []string, keep string) error {
	for _, d := range readOnlyDirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			continue // nothing there to protect
		}
		if err := unix.Mount(d, d, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("make %s read-only for the member: bind: %w", d, err)
		}
		if err := unix.Mount("", d, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("make %s read-only for the member: remount: %w", d, err)
		}
	}
	for _, f := range readOnly {
		err := bindReadOnly(f, f)
		if errors.Is(err, os.ErrNotExist) {
			continue // nothing to protect; a file made later is airlockd's to judge
		}
		if err != nil {
			return fmt.Errorf("make %s read-only for the member: %w", f, err)
		}
	}
	// The bundle is opened before its directory is hidden, and bound back
	// from the open file.
	keepFD := -1
	if keep != "" {
		fd, err := unix.Open(keep, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open CA bundle %s: %w", keep, err)
		}
		keepFD = fd
		defer unix.Close(fd)
		if keep, err = filepath.EvalSymlinks(keep); err != nil {
			return fmt.Errorf("CA bundle %s: %w", keep, err)
		}
	}
	var dirs []string
	for _, d := range hide {
		real, err := filepath.EvalSymlinks(d)
		if err != nil {
			return fmt.Errorf("hide %s from the member: %w", d, err)
		}
		if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
			return fmt.Errorf("hide %s from the member: not a directory", d)
		}
		dirs = append(dirs, filepath.Clean(real))
	}
	// A directory inside another one is hidden with it.
	slices.Sort(dirs)
	dirs = slices.Compact(dirs)
	dirs = slices.DeleteFunc(slices.Clone(dirs), func(d string) bool {
		return slices.ContainsFunc(dirs, func(o string) bool { return o != d && within(d, o) })
	})
	for _, d := range dirs {
		if err := unix.Mount("airlock-hidden", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=16k,nr_inodes=64,mode=0755"); err != nil {
			return fmt.Errorf("hide %s from the member: mount tmpfs: %w", d, err)
		}
		if keepFD >= 0 && within(keep, d) {
			if err := os.MkdirAll(filepath.Dir(keep), 0o755); err != nil {
				return fmt.Errorf("keep CA bundle %s: %w", keep, err)
			}
			if err := os.WriteFile(keep, nil, 0o444); err != nil {
				return fmt.Errorf("keep CA bundle %s: %w", keep, err)
			}
			if err := bindReadOnly(fmt.Sprintf("/proc/self/fd/%d", keepFD), keep); err != nil {
				return fmt.Errorf("keep CA bundle %s: %w", keep, err)
			}
		}
		if err := unix.Mount("", d, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("hide %s from the member: make the tmpfs read-only: %w", d, err)
		}
	}
	return nil
}

// enterWorkspaceRoot makes the member's root a new one built at root (an
// empty directory): a tmpfs holding each directory of the host's root
// bound there with what is mounted below it (the member's /proc, and what
// confine hid or made read-only), the host's top-level symbolic links, and
// the directory ws (an open file) at /workspace; then every mount but the
// workspace is made read-only and nosuid, and the host's root is detached.
// The member can write nowhere but its workspace.
func enterWorkspaceRoot(root string, ws int) error {
	fail := func(what string, err error) error { return fmt.Errorf("build the member's root: %s: %w", what, err) }
	if err := unix.Mount("airlock-root", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64k,nr_inodes=1024,mode=0755"); err != nil {
		return fail("mount tmpfs", err)
	}
	ents, err := os.ReadDir("/")
	if err != nil {
		return fail("read /", err)
	}
	var bound []string
	for _, e := range ents {
		name := e.Name()
		src, dst := "/"+name, filepath.Join(root, name)
		switch {
		case name == strings.TrimPrefix(ContainerWorkspace, "/"):
			continue // the session's own
		case e.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err == nil {
				err = os.Symlink(target, dst)
			}
			if err != nil {
				return fail(src, err)
			}
		case e.IsDir():
			if err := os.Mkdir(dst, 0o755); err != nil {
				return fail(src, err)
			}
			if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				return fail("bind "+src, err)
			}
			bound = append(bound, dst)
		}
	}
	wsDst := filepath.Join(root, ContainerWorkspace)
	if err := os.Mkdir(wsDst, 0o755); err != nil {
		return fail("make /workspace", err)
	}
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", ws), wsDst, "", unix.MS_BIND, ""); err != nil {
		return fail("bind the workspace", err)
	}
	if err := unix.Mount("", wsDst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fail("remount the workspace nosuid", err)
	}
	for _, d := range bound {
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID}
		if err := unix.MountSetattr(-1, d, unix.AT_RECURSIVE, attr); err != nil {
			return fail("make "+d+" read-only", err)
		}
	}
	if err := unix.Mount("", root, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fail("make the root read-only", err)
	}
	// pivot_root(".", ".") stacks the old root on the new one; detaching
	// it leaves the new root alone.
	if err := unix.Chdir(root); err != nil {
		return fail("chdir", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fail("pivot_root", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fail("detach the host's root", err)
	}
	return unix.Chdir("/")
}

// bindReadOnly binds src onto dst and makes that mount read-only (a bind
// mount takes MS_RDONLY only on a remount).
func bindReadOnly(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("bind: %w", os.ErrNotExist)
		}
		return fmt.Errorf("bind: %w", err)
	}
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("remount read-only: %w", err)
	}
	return nil
}

// within reports whether path is dir or lies under it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
