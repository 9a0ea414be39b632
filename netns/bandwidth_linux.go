package netns

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Bandwidth limits (resources.bandwidth_mbps, docs/design.md §12). All of
// a sandbox's traffic through airlock crosses two queues of the host that
// carry nothing else, so one token bucket filter (tbf) at the root of
// each caps one direction in the kernel, per sandbox:
//
//   - towards members (downloads, and every answer of the proxy and the
//     gate): the host sends it out of the bridge device, whose own queue
//     sees only what the host sends to the sandbox. Frames one member
//     sends another are forwarded port to port and never queue there.
//   - from members (uploads, and requests): while a cap is set, the
//     bridge's netdev rule dups each TCP and DNS frame into the divert end
//     of the pair (without one, only SYNs: tproxy.DivertNet.Shaped); the
//     dup is a transmit on that veth, through its queue, on its way to the
//     sink. Member-to-member frames are not diverted.
//
// So traffic between members of one sandbox is not capped, and what
// airlock carries is capped in each direction separately. A tbf shapes
// (it queues up to bandwidthQueue of traffic and sends it at the rate)
// rather than policing, so TCP sees delay before loss.

// bandwidthHandle marks the root qdiscs airlock puts on a sandbox's links,
// so that lifting a cap removes only what airlock put there.
var bandwidthHandle = netlink.MakeHandle(0xa1, 0)

// Bucket and queue sizes: the bucket holds 10 ms at the rate and at least
// bandwidthMinBurst, so a burst never dominates a transfer of a second or
// more and a full-sized frame always fits; the queue holds another 100 ms.
const (
	bandwidthMinBurst = 32 << 10
	bandwidthQueue    = 100 // milliseconds of traffic queued
)

// tbfFor returns the root qdisc that caps link at mbps megabits per
// second.
func tbfFor(link netlink.Link, mbps int) *netlink.Tbf {
	rate := uint64(mbps) * 1_000_000 / 8 // bytes per second
	burst := max(uint32(rate/100), bandwidthMinBurst)
	return &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: bandwidthHandle, Parent: netlink.HANDLE_ROOT},
		Rate:       rate,
		Buffer:     netlink.Xmittime(rate, burst),
		Limit:      burst + uint32(rate*bandwidthQueue/1000),
	}
}

// SetBandwidth caps the sandbox's traffic through airlock at mbps megabits
// per second in each direction, or lifts the cap when mbps is 0. It is
// idempotent: a cap already in place with the same rate is left alone
// (replacing it would drop what its queue holds). The bridge and the
// divert pair must exist (Ensure).
func (n Network) SetBandwidth(h *netlink.Handle, mbps int) error {
	if mbps < 0 {
		return fmt.Errorf("sandbox bandwidth %d Mbit/s: want 0 (unlimited) or more", mbps)
	}
	var errs []error
	for _, name := range []string{n.Bridge, n.Divert} {
		if err := setTBF(h, name, mbps); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func setTBF(h *netlink.Handle, name string, mbps int) error {
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("bandwidth limit on %s: %w", name, err)
	}
	cur, err := rootQdisc(h, link)
	if err != nil {
		return fmt.Errorf("bandwidth limit on %s: %w", name, err)
	}
	ours, _ := cur.(*netlink.Tbf)
	if ours != nil && ours.Handle != bandwidthHandle {
		ours = nil
	}
	if mbps == 0 {
		if ours == nil {
			return nil
		}
		if err := h.QdiscDel(ours); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("lift the bandwidth limit on %s: %w", name, err)
		}
		return nil
	}
	want := tbfFor(link, mbps)
	if ours != nil && ours.Rate == want.Rate && ours.Buffer == want.Buffer && ours.Limit == want.Limit {
		return nil
	}
	if err := h.QdiscReplace(want); err != nil {
		return fmt.Errorf("limit %s to %d Mbit/s (tc qdisc tbf): %w", name, mbps, err)
	}
	return nil
}

// rootQdisc returns the qdisc at the root of link, or nil.
func rootQdisc(h *netlink.Handle, link netlink.Link) (netlink.Qdisc, error) {
	qs, err := h.QdiscList(link)
	if err != nil {
		return nil, fmt.Errorf("list qdiscs: %w", err)
	}
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT {
			return q, nil
		}
	}
	return nil, nil
}

// Bandwidth reads back the cap SetBandwidth put on the sandbox's links, in
// megabits per second towards members (the bridge) and from them (the
// divert end); 0 means none.
func (n Network) Bandwidth(h *netlink.Handle) (down, up int, err error) {
	var out [2]int
	for i, name := range []string{n.Bridge, n.Divert} {
		link, err := h.LinkByName(name)
		if err != nil {
			return 0, 0, fmt.Errorf("bandwidth limit on %s: %w", name, err)
		}
		q, err := rootQdisc(h, link)
		if err != nil {
			return 0, 0, fmt.Errorf("bandwidth limit on %s: %w", name, err)
		}
		if tbf, ok := q.(*netlink.Tbf); ok && tbf.Handle == bandwidthHandle {
			out[i] = int(tbf.Rate * 8 / 1_000_000)
		}
	}
	return out[0], out[1], nil
}
