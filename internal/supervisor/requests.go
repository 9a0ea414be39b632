package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"time"

	"github.com/docker/docker/api/types/container"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/memberapi"
	"github.com/airlockhq/airlock/netns"
	"github.com/airlockhq/airlock/policy"
	"github.com/airlockhq/airlock/ui"
)

// Members' requests through the member API (design §5.10): who asks, and
// what an allowed port or resources request does.

// Exposer makes a member's port reachable from the host and returns the
// host address it listens on ("127.0.0.1:40123"); member is the member's
// name as approvals show it, and memberID, when not "", names the member
// that asked (memberapi.Member's ID or Lease): the exposure is for that
// one, not a later member under its name or at its address.
type Exposer func(sandbox, member, memberID string, port uint16) (addr string, err error)

// exposer returns what carries out allowed port requests: Expose, unless
// a test set another.
func (d *Daemon) exposer() Exposer {
	if d.expose != nil {
		return d.expose
	}
	return func(sandbox, member, memberID string, port uint16) (string, error) {
		if memberID == "" {
			x, err := d.Expose(sandbox, member, port)
			return x.HostAddr, err
		}
		s := d.sandboxNamed(sandbox)
		if s == nil {
			return "", fmt.Errorf("no sandbox %q", sandbox)
		}
		m, ok := d.memberWithID(s, memberID)
		if !ok || m.name != member {
			return "", fmt.Errorf("member %q that asked has ended (another may have its name or address now): it may ask again", member)
		}
		x, err := d.exposeMember(s, m, ui.ExposeRequest{Member: member, Port: int(port)})
		return x.HostAddr, err
	}
}

// hostResources reads what "host" stands for in resource bounds: the CPUs
// this process may run on and the host's physical memory.
func hostResources() policy.HostResources {
	h := policy.HostResources{CPUs: float64(runtime.NumCPU())}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err == nil {
		h.MemoryMB = int(uint64(si.Totalram) * uint64(si.Unit) >> 20)
	}
	return h
}

// identify names the member behind a source address for the member API:
// its name, and a Docker member's container ID or a run member's lease.
func (a attribution) identify(addr netip.Addr) memberapi.Member {
	if a.d != nil && a.d.docker != nil && a.dockers.Contains(addr) {
		if m, ok := a.d.docker.Member(addr); ok && m.Sandbox == a.sandbox {
			return memberapi.Member{Name: m.Source, ID: m.ID}
		}
	}
	if addr != a.gateway && !a.dockers.Contains(addr) {
		if h, ok := netns.LeaseHolderOf(a.leases, addr); ok {
			return memberapi.Member{Name: h.Source, Lease: leaseID(h)}
		}
	}
	return memberapi.Member{Name: a.member(addr)}
}

// grant carries out an allowed port or resources request of a sandbox's
// member; the broker calls it once per approval.
func (d *Daemon) grant(s *sandbox) func(policy.Pending) (string, error) {
	return func(p policy.Pending) (string, error) {
		switch p.Kind {
		case policy.AskPort:
			addr, err := d.exposer()(s.cfg.Name, p.Source, p.MemberID, p.Port)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("port %d is reachable from the host at %s (http://%s/)", p.Port, addr, addr), nil
		case policy.AskResources:
			return d.updateResources(s, p)
		}
		return "", fmt.Errorf("nothing to grant for a %s approval", p.Kind)
	}
}

// updateResources gives a Docker member the limits a person allowed,
// through the engine, once more within the bounds now in force and only
// while the container that asked still runs as that member.
func (d *Daemon) updateResources(s *sandbox, p policy.Pending) (string, error) {
	if err := s.policy.Spec().Resources.Bounds.Check(p.MemoryMB, p.CPUs, p.Pids, d.host); err != nil {
		return "", err
	}
	if d.docker == nil || p.MemberID == "" {
		return "", errors.New("the limits of this member cannot be changed: only Docker members' can")
	}
	var running *netns.Member
	for _, m := range d.docker.Members(s.cfg.Name) {
		if m.ID == p.MemberID && m.Source == p.Source && m.Running {
			running = &m
			break
		}
	}
	if running == nil {
		return "", fmt.Errorf("the container of %s that asked is gone", p.Source)
	}
	var res container.Resources
	if p.MemoryMB != 0 {
		res.Memory = int64(p.MemoryMB) << 20
		res.MemorySwap = res.Memory // no swap beyond the limit, as members airlock starts
	}
	if p.CPUs != 0 {
		res.NanoCPUs = int64(p.CPUs * 1e9)
	}
	if p.Pids != 0 {
		pids := int64(p.Pids)
		res.PidsLimit = &pids
	}
	ctx, cancel := context.WithTimeout(d.ctx, 30*time.Second)
	defer cancel()
	if _, err := d.docker.Client().ContainerUpdate(ctx, p.MemberID, container.UpdateConfig{Resources: res}); err != nil {
		return "", fmt.Errorf("update the limits of container %s: %w", running.Name, err)
	}
	return "the limits of " + running.Name + " are now " + p.Summary(), nil
}
