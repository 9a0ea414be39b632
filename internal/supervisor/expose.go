package supervisor

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/transparent"
	"github.com/airlockhq/airlock/netns"
	"github.com/airlockhq/airlock/ui"
)

// Exposures (previews, docs/design.md §6.2): airlockd listens on a host
// port of expose_listen and forwards each connection to one member's
// port, dialled from the sandbox's gateway with a transparent socket: the
// datapath hands a member's replies to that socket and to no other host
// socket (§12), so nothing else of the sandbox becomes reachable, and
// members reach nothing new.

const (
	// maxExposures bounds a sandbox's open exposures.
	maxExposures = 32
	// maxExposureConns bounds the connections one exposure carries at
	// once; more are closed at accept.
	maxExposureConns = 64
	// exposeDialTimeout bounds the dial of a member's port.
	exposeDialTimeout = 10 * time.Second
	// exposeCheckEvery is how often an exposure checks that its member
	// still lives (a Docker member's end also ends it at once).
	exposeCheckEvery = time.Second
)

// exposureSet is a sandbox's open exposures.
type exposureSet struct {
	// mu guards the following fields.
	mu      sync.Mutex
	open    map[string]*exposure // by ID
	stopped bool                 // the sandbox stops: no new ones
}

// exposure forwards one host listener to one member's port.
type exposure struct {
	view   ui.Exposure
	member exposedMember
	ln     net.Listener
	dial   func(context.Context) (net.Conn, error) // to the member's port
	ctx    context.Context                         // ends when the exposure does: cancels dials
	cancel context.CancelFunc
	check  chan struct{} // asks the watcher to check the member now
	once   sync.Once
	wg     sync.WaitGroup // the accept loop and the connections

	// mu guards conns.
	mu    sync.Mutex
	conns map[net.Conn]bool // open connections, true for a client's
}

// exposedMember is one member, not just a name: a run member by its lease,
// a Docker member by its container. Another member that later takes the
// address or the name is not it.
type exposedMember struct {
	name      string
	addr      netip.Addr
	lease     netns.LeaseHolder // a run member's
	leases    string            // and the lease directory it is in
	container string            // a Docker member's container ID
}

func (m exposedMember) kind() string {
	if m.container != "" {
		return "docker"
	}
	return "run"
}

// Expose forwards a host port (one the kernel picks, on expose_listen) to
// port of a member of sandbox, named by its source name as records and
// approvals show it (or by its address when several share the name), and
// returns the exposure. It ends when closed (CloseExposure), when its
// member ends, and when the sandbox or airlockd stops. A *ui.ManagerError
// says what was wrong with the request.
func (d *Daemon) Expose(sandbox, member string, port uint16) (ui.Exposure, error) {
	return d.ExposePort(sandbox, ui.ExposeRequest{Member: member, Port: int(port)})
}

// ExposePort is Expose with the API's request: it may name the host port.
// It implements ui.Exposer.
func (d *Daemon) ExposePort(name string, req ui.ExposeRequest) (ui.Exposure, error) {
	if err := req.Check(); err != nil {
		return ui.Exposure{}, err
	}
	s := d.sandboxNamed(name)
	if s == nil {
		return ui.Exposure{}, &ui.ManagerError{Msg: fmt.Sprintf("no sandbox %q", name), NotFound: true}
	}
	m, err := d.findMember(s, req.Member)
	if err != nil {
		return ui.Exposure{}, err
	}
	return d.exposeMember(s, m, req)
}

// exposeMember forwards a host port to port req.Port of member m of s.
func (d *Daemon) exposeMember(s *sandbox, m exposedMember, req ui.ExposeRequest) (ui.Exposure, error) {
	// The config refuses a sandbox's subnet; one made later through the
	// API may still hold the address.
	listen := d.cfg.ExposeListen
	var inSubnet string
	d.byName.Range(func(_, v any) bool {
		if o := v.(*sandbox); o.net.Subnet.Contains(listen) {
			inSubnet = o.cfg.Name
		}
		return inSubnet == ""
	})
	if inSubnet != "" {
		return ui.Exposure{}, &ui.ManagerError{Msg: fmt.Sprintf("expose_listen %s is in sandbox %s's subnet", listen, inSubnet), Hint: "set expose_listen to 127.0.0.1 in airlockd's config and restart it", Conflict: true}
	}
	dialer := transparent.Dialer(s.net.Gateway)
	dialer.Timeout = exposeDialTimeout
	target := netip.AddrPortFrom(m.addr, uint16(req.Port)).String()
	return d.openExposure(s, m, netip.AddrPortFrom(listen, uint16(req.HostPort)), uint16(req.Port), func(ctx context.Context) (net.Conn, error) {
		return dialer.DialContext(ctx, "tcp4", target)
	})
}

// openExposure listens on host and forwards what comes to member m's port
// through dial.
func (d *Daemon) openExposure(s *sandbox, m exposedMember, host netip.AddrPort, port uint16, dial func(context.Context) (net.Conn, error)) (ui.Exposure, error) {
	ln, err := net.Listen("tcp", host.String())
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return ui.Exposure{}, &ui.ManagerError{Msg: fmt.Sprintf("host port %d on %s is taken", host.Port(), host.Addr()), Hint: "pick another host_port, or leave it out for a free one", Conflict: true}
		}
		return ui.Exposure{}, fmt.Errorf("expose: listen on %s: %w", host.Addr(), err)
	}
	host = ln.Addr().(*net.TCPAddr).AddrPort()
	e := &exposure{
		member: m,
		ln:     ln,
		dial:   dial,
		check:  make(chan struct{}, 1),
		conns:  map[net.Conn]bool{},
		view: ui.Exposure{ID: exposureID(), Sandbox: s.cfg.Name, Member: m.name, Addr: m.addr.String(), Port: port,
			HostAddr: host.String(), URL: "http://" + browsable(host).String() + "/", Created: time.Now().UTC()},
	}
	e.ctx, e.cancel = context.WithCancel(d.ctx)
	target := netip.AddrPortFrom(m.addr, port).String()
	// The accept loop counts from before the exposure can be ended (close
	// waits for it), and "opened" is recorded before it can be: a
	// sandbox may stop at any moment.
	e.wg.Add(1)
	err = s.exposures.add(e, func() {
		d.log.Info("exposure opened", "sandbox", s.cfg.Name, "source", m.name, "member", target, "listen", e.view.HostAddr, "id", e.view.ID)
		d.record(s, exposureEntry(e.view, "opened", e.view.HostAddr+" forwards to "+target))
	})
	if err != nil {
		e.wg.Done()
		ln.Close()
		e.cancel()
		return ui.Exposure{}, err
	}
	go d.serveExposure(s, e)
	go d.watchExposure(s, e)
	return e.view, nil
}

// browsable is where a browser on the host reaches a listener: the
// loopback address for one on every address.
func browsable(a netip.AddrPort) netip.AddrPort {
	switch {
	case a.Addr().Is4() && a.Addr().IsUnspecified():
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), a.Port())
	case a.Addr().IsUnspecified():
		return netip.AddrPortFrom(netip.IPv6Loopback(), a.Port())
	}
	return a
}

func exposureID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func exposureEntry(x ui.Exposure, action, reason string) audit.Entry {
	return audit.Entry{Kind: audit.KindExposure, Source: x.Member, Port: x.Port, Dest: x.HostAddr, URL: x.URL,
		Action: action, Reason: reason, ExposureID: x.ID}
}

// ExposeListen is the address exposures listen on (ui.Exposer).
func (d *Daemon) ExposeListen() string { return d.cfg.ExposeListen.String() }

// Exposures lists a sandbox's open exposures, oldest first. It implements
// ui.Exposer.
func (d *Daemon) Exposures(sandbox string) []ui.Exposure {
	s := d.sandboxNamed(sandbox)
	if s == nil {
		return nil
	}
	s.exposures.mu.Lock()
	defer s.exposures.mu.Unlock()
	out := make([]ui.Exposure, 0, len(s.exposures.open))
	for _, e := range s.exposures.open {
		out = append(out, e.view)
	}
	slices.SortFunc(out, func(a, b ui.Exposure) int { return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID)) })
	return out
}

// CloseExposure ends an exposure: its listener closes and so do the
// connections it carries. It implements ui.Exposer.
func (d *Daemon) CloseExposure(sandbox, id string) error {
	s := d.sandboxNamed(sandbox)
	if s == nil {
		return &ui.ManagerError{Msg: fmt.Sprintf("no sandbox %q", sandbox), NotFound: true}
	}
	if !d.endExposure(s, id, "closed") {
		return &ui.ManagerError{Msg: fmt.Sprintf("no open exposure %q in sandbox %s", truncated(id, 40), sandbox), Hint: "GET …/exposures (airlock expose --list SANDBOX) lists them", NotFound: true}
	}
	return nil
}

func truncated(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// endExposure removes exposure id of s, ends it and records why; false
// when s has no such exposure (it has ended already).
func (d *Daemon) endExposure(s *sandbox, id, why string) bool {
	s.exposures.mu.Lock()
	e := s.exposures.open[id]
	delete(s.exposures.open, id)
	s.exposures.mu.Unlock()
	if e == nil {
		return false
	}
	e.close()
	d.log.Info("exposure closed", "sandbox", s.cfg.Name, "source", e.view.Member, "listen", e.view.HostAddr, "id", id, "reason", why)
	d.record(s, exposureEntry(e.view, "closed", why))
	return true
}

// closeExposures ends every exposure of a sandbox that stops, and takes
// no more.
func (d *Daemon) closeExposures(s *sandbox) {
	s.exposures.mu.Lock()
	s.exposures.stopped = true
	ids := make([]string, 0, len(s.exposures.open))
	for id := range s.exposures.open {
		ids = append(ids, id)
	}
	s.exposures.mu.Unlock()
	for _, id := range ids {
		d.endExposure(s, id, "sandbox stopped")
	}
}

// memberLeft ends the exposures of a Docker member that has left (its
// container died, was removed, or left the network).
func (d *Daemon) memberLeft(s *sandbox, container string) {
	s.exposures.mu.Lock()
	var ids []string
	for id, e := range s.exposures.open {
		if e.member.container == container {
			ids = append(ids, id)
		}
	}
	s.exposures.mu.Unlock()
	for _, id := range ids {
		d.endExposure(s, id, "member ended")
	}
}

// add adds e, calling opened while no one can end it yet.
func (x *exposureSet) add(e *exposure, opened func()) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch {
	case x.stopped:
		return &ui.ManagerError{Msg: "the sandbox is stopping", Conflict: true}
	case len(x.open) >= maxExposures:
		return &ui.ManagerError{Msg: fmt.Sprintf("the sandbox has %d exposures open, the most it may", maxExposures), Hint: "close one first", Conflict: true}
	}
	if x.open == nil {
		x.open = map[string]*exposure{}
	}
	x.open[e.view.ID] = e
	opened()
	return nil
}

// findMember resolves a member's name, or its address, among the
// sandbox's live members.
func (d *Daemon) findMember(s *sandbox, name string) (exposedMember, error) {
	live := d.liveMembers(s)
	addr, err := netip.ParseAddr(name)
	byAddr := err == nil
	var found []exposedMember
	for _, m := range live {
		if byAddr && m.addr == addr || !byAddr && m.name == name {
			found = append(found, m)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		names := make([]string, len(live))
		for i, m := range live {
			names[i] = m.name + " (" + m.addr.String() + ")"
		}
		hint := "the sandbox has no live member; start one with airlock run or airlock docker run"
		if len(names) > 0 {
			hint = "live members: " + truncated(fmt.Sprint(names), 400)
		}
		return exposedMember{}, &ui.ManagerError{Msg: fmt.Sprintf("no live member %q in sandbox %s", truncated(name, 64), s.cfg.Name), Hint: hint, NotFound: true}
	}
	addrs := make([]string, len(found))
	for i, m := range found {
		addrs[i] = m.addr.String()
	}
	return exposedMember{}, &ui.ManagerError{Msg: fmt.Sprintf("%d members of sandbox %s are named %q (%v)", len(found), s.cfg.Name, truncated(name, 64), addrs),
		Hint: "name one by its address", Conflict: true}
}

// liveMembers lists a sandbox's live members: the holders of its leases
// (airlock run, sessions without Docker) and its running containers,
// sorted by name and address.
func (d *Daemon) liveMembers(s *sandbox) []exposedMember {
	var out []exposedMember
	dockers := s.net.DockerRange()
	dir := d.cfg.LeaseDir(s.cfg.Name)
	for _, h := range netns.LeaseHolders(dir) {
		// Leases are only ever taken below Docker's range (attribution).
		if s.net.Subnet.Contains(h.Addr) && !dockers.Contains(h.Addr) && h.Addr != s.net.Gateway {
			out = append(out, exposedMember{name: h.Source, addr: h.Addr, lease: h, leases: dir})
		}
	}
	if d.docker != nil {
		for _, m := range d.docker.Members(s.cfg.Name) {
			if m.Running && m.Addr != s.net.Gateway {
				out = append(out, exposedMember{name: m.Source, addr: m.Addr, container: m.ID})
			}
		}
	}
	slices.SortFunc(out, func(a, b exposedMember) int { return cmp.Or(cmp.Compare(a.name, b.name), a.addr.Compare(b.addr)) })
	return out
}

// memberWithID returns the live member of s that id names (memberID):
// the Docker container, or the run member's lease, that asked.
func (d *Daemon) memberWithID(s *sandbox, id string) (exposedMember, bool) {
	for _, m := range d.liveMembers(s) {
		if m.container != "" && m.container == id || m.container == "" && leaseID(m.lease) == id {
			return m, true
		}
	}
	return exposedMember{}, false
}

// leaseID names a run member by its lease: its address, process and the
// time it took the lease. A member that later takes the address or the
// name has another.
func leaseID(h netns.LeaseHolder) string {
	return fmt.Sprintf("lease %s pid %d taken %d", h.Addr, h.PID, h.Taken.UnixNano())
}

// Members lists a sandbox's live members. It implements ui.Exposer.
func (d *Daemon) Members(sandbox string) []ui.MemberView {
	s := d.sandboxNamed(sandbox)
	if s == nil {
		return nil
	}
	var out []ui.MemberView
	for _, m := range d.liveMembers(s) {
		out = append(out, ui.MemberView{Name: m.name, Addr: m.addr.String(), Kind: m.kind()})
	}
	return out
}

// alive reports whether m is still the member at its address.
func (d *Daemon) alive(s *sandbox, m exposedMember) bool {
	if m.container != "" {
		if d.docker == nil {
			return false
		}
		for _, o := range d.docker.Members(s.cfg.Name) {
			if o.ID == m.container && o.Addr == m.addr && o.Running {
				return true
			}
		}
		return false
	}
	h, ok := netns.LeaseHolderOf(m.leases, m.addr)
	return ok && h.Same(m.lease)
}

// watchExposure ends e when its member ends. It is not one of e's
// goroutines (e.wg): ending e waits for those.
func (d *Daemon) watchExposure(s *sandbox, e *exposure) {
	t := time.NewTicker(exposeCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		case <-e.check:
		}
		if !d.alive(s, e.member) {
			d.endExposure(s, e.view.ID, "member ended")
			return
		}
	}
}

// serveExposure accepts connections until e ends and forwards each one.
func (d *Daemon) serveExposure(s *sandbox, e *exposure) {
	defer e.wg.Done()
	for {
		c, err := e.ln.Accept()
		if err != nil {
			if e.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, say: wait rather than spin.
			d.log.Warn("exposure: accept", "sandbox", s.cfg.Name, "id", e.view.ID, "err", err)
			select {
			case <-e.ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		if !e.track(c, true) {
			d.log.Debug("exposure: connection refused at the limit, or while closing", "sandbox", s.cfg.Name, "id", e.view.ID, "from", c.RemoteAddr().String())
			c.Close()
			continue
		}
		e.wg.Add(1)
		go d.forward(s, e, c)
	}
}

// forward carries one connection to the member's port and back.
func (d *Daemon) forward(s *sandbox, e *exposure, c net.Conn) {
	defer e.wg.Done()
	defer e.untrack(c)
	// A member that has ended is not dialled: its address may be
	// another's by now.
	if !d.alive(s, e.member) {
		select {
		case e.check <- struct{}{}:
		default:
		}
		return
	}
	up, err := e.dial(e.ctx)
	if err != nil {
		d.log.Debug("exposure: dial member", "sandbox", s.cfg.Name, "id", e.view.ID, "member", e.view.Addr, "port", e.view.Port, "err", err)
		return
	}
	if !e.track(up, false) {
		up.Close()
		return
	}
	defer e.untrack(up)
	var wg sync.WaitGroup
	wg.Go(func() { pipe(up, c) })
	pipe(c, up)
	wg.Wait()
}

// pipe copies src to dst until src ends, then ends dst's writing half.
func pipe(dst, src net.Conn) {
	io.Copy(dst, src)
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	} else {
		dst.Close()
	}
}

// track adds an open connection, unless e has ended or, for a client's
// connection, carries as many as it may.
func (e *exposure) track(c net.Conn, client bool) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx.Err() != nil {
		return false
	}
	if client {
		n := 0
		for _, isClient := range e.conns {
			if isClient {
				n++
			}
		}
		if n >= maxExposureConns {
			return false
		}
	}
	e.conns[c] = client
	return true
}

// untrack closes and forgets a connection.
func (e *exposure) untrack(c net.Conn) {
	c.Close()
	e.mu.Lock()
	delete(e.conns, c)
	e.mu.Unlock()
}

// close ends e: no more connections, the open ones cut. It waits for e's
// accept loop and connections, and is idempotent.
func (e *exposure) close() {
	e.once.Do(func() {
		e.mu.Lock()
		e.cancel() // under mu: track adds nothing after this
		for c := range e.conns {
			c.Close()
		}
		e.mu.Unlock()
		e.ln.Close()
	})
	e.wg.Wait()
}
