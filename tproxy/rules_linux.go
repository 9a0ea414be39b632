package tproxy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TableName is the one nftables table airlock owns (family inet).
const TableName = "airlock"

// SandboxNet is what the rule set needs to know of one sandbox network.
type SandboxNet struct {
	Bridge  string       // the sandbox bridge's link name
	Subnet  netip.Prefix // the sandbox subnet
	Gateway netip.Addr   // the bridge's address in Subnet: the gate and the proxy listen there
	// Sink is the link where the bridge's diverted packets arrive
	// (netns.Network.Sink); the tproxy rules work there.
	Sink string
}

// RulesConfig describes the whole rule set.
type RulesConfig struct {
	// GatePort is the DNS gate's port on each gateway; 0 means 53.
	GatePort uint16
	// ProxyPort is the proxy's port on each gateway. Required.
	ProxyPort uint16
	// Mark is the packet mark bit set on packets handed to a transparent
	// socket; an ip rule looks them up in a table where every address is
	// local (netns.DivertMark). Required: a single bit.
	Mark      uint32
	Sandboxes []SandboxNet
	// MemberVethPrefix starts the host-side name of every member veth
	// (netns.MemberVethPrefix). Required: a member veth seen outside its
	// bridge is dropped.
	MemberVethPrefix string
	// DivertPrefix and SinkPrefix start the names of the two ends of every
	// divert pair (netns.DivertPrefix, netns.SinkPrefix). Required: nothing
	// may arrive on a divert end, nor on a sink that no sandbox here owns
	// (a stale divert rule must not be a way out).
	DivertPrefix, SinkPrefix string
	// BridgePrefix, when set, starts the name of every sandbox bridge
	// (netns.BridgePrefix). A bridge of that name that no sandbox here
	// owns is dropped whole: one that Docker brings back for the network
	// of a sandbox airlockd no longer runs must not be open.
	BridgePrefix string
}

// The datapath is TPROXY (docs/design.md §12). Docker loads br_netfilter,
// which runs the IPv4 prerouting hook from inside the bridge, where a
// socket tproxy assigns is orphaned before TCP sees the packet. So the
// bridge pass (chain pre-BRIDGE) only checks sources, lets members reach
// each other, and untracks what goes up (Docker's NAT must not rewrite it);
// a netdev ingress rule on the bridge (EnsureDivert) then writes TCP SYNs
// and UDP/53 frames into the sandbox's divert pair, and they arrive on its
// sink as an ordinary receive, where chain tp-BRIDGE hands them to the
// gate's and the proxy's transparent sockets. tproxy that finds no socket
// does not drop: tp-BRIDGE ends in a reset and a drop, so with airlockd
// gone a diverted packet finds nothing and leaves nothing. A connection's
// later packets need no tproxy: the bridge pass finds their socket by
// their addresses and ports and, if it is transparent, marks them for the
// host (the established path, docs/design.md §12).

func (c *RulesConfig) validate() error {
	if c.GatePort == 0 {
		c.GatePort = 53
	}
	if c.ProxyPort == 0 {
		return errors.New("nftables rules: no proxy port")
	}
	if c.Mark == 0 || c.Mark&(c.Mark-1) != 0 {
		return fmt.Errorf("nftables rules: mark %#x is not a single bit", c.Mark)
	}
	for _, p := range []string{c.MemberVethPrefix, c.DivertPrefix, c.SinkPrefix} {
		if p == "" || len(p) >= unix.IFNAMSIZ {
			return errors.New("nftables rules: no member veth, divert or sink prefix")
		}
	}
	if c.ProxyPort == c.GatePort {
		return fmt.Errorf("nftables rules: proxy port %d is the DNS gate's port", c.ProxyPort)
	}
	seen := map[string]bool{}
	for _, s := range c.Sandboxes {
		switch {
		case s.Bridge == "" || len(s.Bridge) >= unix.IFNAMSIZ:
			return fmt.Errorf("nftables rules: bridge name %q: want 1 to 15 bytes", s.Bridge)
		case s.Sink == "" || len(s.Sink) >= unix.IFNAMSIZ || !strings.HasPrefix(s.Sink, c.SinkPrefix):
			return fmt.Errorf("nftables rules: bridge %s: sink name %q: want 1 to 15 bytes starting %q", s.Bridge, s.Sink, c.SinkPrefix)
		case seen[s.Bridge] || seen[s.Sink]:
			return fmt.Errorf("nftables rules: bridge %s or sink %s twice", s.Bridge, s.Sink)
		case !s.Subnet.Addr().Is4() || !s.Subnet.Contains(s.Gateway):
			return fmt.Errorf("nftables rules: bridge %s: gateway %s not in IPv4 subnet %s", s.Bridge, s.Gateway, s.Subnet)
		}
		seen[s.Bridge], seen[s.Sink] = true, true
	}
	return nil
}

// EnsureRules replaces airlock's inet table with one built from cfg, in
// one atomic batch: whatever an earlier run or a crash left is gone, and
// there is no moment without rules. The table stays when airlockd stops,
// so sandboxes fail closed until DeleteRules. The netdev rules that divert
// a bridge's packets come per bridge, once it exists: EnsureDivert. Until
// then its TCP and DNS find the host's input and forward chains, which
// drop them.
func EnsureRules(conn *nftables.Conn, cfg RulesConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	t := inetTable()
	// Add (a no-op if present), delete, add: replaces the table without an
	// ENOENT for a missing one.
	conn.AddTable(t)
	conn.DelTable(t)
	conn.AddTable(t)
	b := builder{conn: conn, t: t}
	b.build(cfg)
	if err := conn.Flush(); err != nil {
		return explainNftError(err)
	}
	return nil
}

func inetTable() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
}

func netdevTable() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyNetdev, Name: TableName}
}

// DeleteRules removes airlock's tables (inet and netdev). Missing ones are
// not an error.
func DeleteRules(conn *nftables.Conn) error {
	for _, t := range []*nftables.Table{netdevTable(), inetTable()} {
		conn.AddTable(t)
		conn.DelTable(t)
	}
	if err := conn.Flush(); err != nil {
		return explainNftError(err)
	}
	return nil
}

// RulesPresent reports whether airlock's inet table exists.
func RulesPresent(conn *nftables.Conn) (bool, error) {
	return tablePresent(conn, nftables.TableFamilyINet)
}

func tablePresent(conn *nftables.Conn, family nftables.TableFamily) (bool, error) {
	tables, err := conn.ListTablesOfFamily(family)
	if err != nil {
		return false, explainNftError(err)
	}
	for _, t := range tables {
		if t.Name == TableName {
			return true, nil
		}
	}
	return false, nil
}

func explainNftError(err error) error {
	switch {
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("nftables: permission denied; airlockd needs root (CAP_NET_ADMIN): %w", err)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("nftables: the kernel lacks a feature airlock needs (nf_tables inet and netdev families, tproxy, socket, fib, notrack, reject, dup, counter); check CONFIG_NF_TABLES_INET, CONFIG_NF_TABLES_NETDEV, CONFIG_NFT_TPROXY, CONFIG_NFT_SOCKET, CONFIG_NFT_FIB_INET, CONFIG_NFT_FIB_NETDEV, CONFIG_NFT_CT, CONFIG_NFT_REJECT and CONFIG_NF_DUP_NETDEV: %w", err)
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EPROTONOSUPPORT):
		return fmt.Errorf("nftables: operation not supported by this kernel (tproxy in the inet family and reject in prerouting need Linux ≥ 5.x): %w", err)
	case errors.Is(err, unix.ENODEV):
		return fmt.Errorf("nftables: a sandbox bridge is gone while its divert rule was being added: %w", err)
	}
	return fmt.Errorf("nftables: %w", err)
}

type builder struct {
	conn *nftables.Conn
	t    *nftables.Table
}

func (b *builder) chain(name string, hook *nftables.ChainHook, prio *nftables.ChainPriority, typ nftables.ChainType) *nftables.Chain {
	c := &nftables.Chain{Name: name, Table: b.t}
	if hook != nil {
		accept := nftables.ChainPolicyAccept
		c.Hooknum, c.Priority, c.Type, c.Policy = hook, prio, typ, &accept
	}
	return b.conn.AddChain(c)
}

func (b *builder) rule(c *nftables.Chain, parts ...[]expr.Any) {
	var e []expr.Any
	for _, p := range parts {
		e = append(e, p...)
	}
	b.conn.AddRule(&nftables.Rule{Table: b.t, Chain: c, Exprs: e})
}

// build lays out the inet table. The base chains accept by default and
// only jump for sandbox links, so the rest of the host is untouched:
//
//	spoof (prerouting, -450: before defragmentation): from a bridge or
//	  its sink, IPv6 drop; source outside the subnet, or the gateway's
//	  own, drop (spoofing).
//	prerouting (filter, raw: before conntrack and Docker's NAT):
//	  from a bridge (br_netfilter's pass, or the host's receive): to
//	  another member of the subnet accept; TCP after its SYN: to a
//	  socket bound to 0.0.0.0 reset, not to a host address and to a
//	  transparent socket notrack, mark, accept, else tproxy to the gate
//	  or the proxy (a connection, or their listeners), mark, accept,
//	  none: reset; TCP and UDP to port 53 notrack, accept; everything
//	  else drop.
//	  from a sink (diverted packets): notrack;
//	  port 53 (UDP, TCP) tproxy to the gate, other TCP tproxy to the proxy,
//	  each setting the mark; TCP left over (no socket) reset; the rest drop.
//	input (filter): from a sink or a bridge to a socket bound to 0.0.0.0
//	  drop; from a sink with the mark accept; from a bridge TCP with the
//	  mark to a transparent socket accept; from a bridge or a sink
//	  anything else drop.
//	forward (filter): bridge → same bridge accept (bridged frames under
//	  br_netfilter); from or to a bridge drop.
//	output (filter, raw): to a bridge notrack (the proxy's and the gate's
//	  answers leave no conntrack entry).
//	and in spoof, prerouting, input and forward: from (or to) a member veth, a
//	  divert end, or a bridge or sink named like a sandbox's that no
//	  sandbox owns: drop.
func (b *builder) build(cfg RulesConfig) {
	// The source checks run before defragmentation (conntrack's defrag
	// hook, at -400, which tproxy needs): the reassembly queues are shared
	// by every interface, so a fragment that a member sends with another
	// sandbox's source would otherwise join that sandbox's datagram before
	// any check saw it, and be delivered inside it when a member there
	// sends the piece that completes it: a channel between sandboxes.
	spoof := b.chain("spoof", nftables.ChainHookPrerouting, nftables.ChainPriorityRef(*nftables.ChainPriorityConntrackDefrag-50), nftables.ChainTypeFilter)
	pre := b.chain("prerouting", nftables.ChainHookPrerouting, nftables.ChainPriorityRaw, nftables.ChainTypeFilter)
	in := b.chain("input", nftables.ChainHookInput, nftables.ChainPriorityFilter, nftables.ChainTypeFilter)
	fwd := b.chain("forward", nftables.ChainHookForward, nftables.ChainPriorityFilter, nftables.ChainTypeFilter)
	out := b.chain("output", nftables.ChainHookOutput, nftables.ChainPriorityRaw, nftables.ChainTypeFilter)

	// A member veth ("alr…") is only ever a port of a sandbox bridge, where
	// the IP hooks see the bridge instead. Seen on its own, its bridge is
	// gone: drop everything, or a host that forwards would route it out.
	// Nothing is ever received on a divert end.
	for _, p := range []string{cfg.MemberVethPrefix, cfg.DivertPrefix} {
		for _, c := range []*nftables.Chain{spoof, pre, in, fwd} {
			b.rule(c, iifnamePrefix(p), counterDrop())
		}
		b.rule(fwd, oifnamePrefix(p), counterDrop())
	}
	b.rule(fwd, oifnamePrefix(cfg.SinkPrefix), counterDrop())

	for _, s := range cfg.Sandboxes {
		br, sink := s.Bridge, s.Sink
		gw := netip.PrefixFrom(s.Gateway, 32)
		sSrc := b.chain("src-"+br, nil, nil, "")
		sPre := b.chain("pre-"+br, nil, nil, "")
		sTP := b.chain("tp-"+br, nil, nil, "")
		// The sink's packets too: a host without br_netfilter never ran
		// the bridge pass on them.
		b.rule(spoof, iifname(br), jump(sSrc.Name))
		b.rule(spoof, iifname(sink), jump(sSrc.Name))
		b.rule(pre, iifname(br), jump(sPre.Name))
		b.rule(pre, iifname(sink), jump(sTP.Name))

		// The source checks: IPv6 drop; a source outside the subnet, or
		// the gateway's own, drop (spoofing).
		b.rule(sSrc, nfproto(unix.NFPROTO_IPV6), counterDrop())
		b.rule(sSrc, nfproto(unix.NFPROTO_IPV4), ip4Addr(offSaddr, s.Subnet, expr.CmpOpNeq), counterDrop())
		b.rule(sSrc, nfproto(unix.NFPROTO_IPV4), ip4Addr(offSaddr, gw, expr.CmpOpEq), counterDrop())
		b.rule(sSrc, verdict(expr.VerdictAccept))

		// The bridge pass.
		b.rule(sPre, nfproto(unix.NFPROTO_IPV4), toOtherMember(s.Subnet, s.Gateway), verdict(expr.VerdictAccept))
		// A connection's packets after its SYN (EnsureDivert diverts only
		// SYNs and fragments) go to the transparent socket that tproxy gave
		// the SYN, found by their own addresses and ports, as a local
		// receive on the bridge: the mark routes them to the host. No
		// other socket gets them: one bound to every address resets, one
		// that is not transparent (none of airlockd's) is no match. The
		// lookup finds listeners too, after connections: a segment to a
		// host address (another sandbox's gateway, say) would find the
		// listener bound there, which takes an ACK that carries a valid
		// SYN cookie (the secret is the host's, so the member's own
		// proxy hands it one). Those go the listener's way below, where
		// tproxy looks up connections only, then the sandbox's own
		// listener.
		established := slices.Concat(nfproto(unix.NFPROTO_IPV4), tcpAfterSYN())
		// Reset, as a segment with no socket is: a member must not tell
		// the host's ports on every address from closed ones.
		b.rule(sPre, established, socketWildcard(), counter(), rejectTCPReset())
		b.rule(sPre, established, daddrLocal(expr.CmpOpNeq), socketTransparent(), counter(), notrack(), setMark(cfg.Mark), verdict(expr.VerdictAccept))
		// A segment without a socket of its own goes where its SYN went:
		// to the gate's or the proxy's listener, which resets it or, when
		// it answered the SYN with a SYN cookie, makes the connection
		// from it (no socket held that connection until this ACK). Without
		// br_netfilter the socket tproxy assigns here is the packet's;
		// with it, the bridge's divert rule sends a packet that carries a
		// socket through the divert pair, where tproxy finds the listener
		// again (ip_rcv_core would orphan this one).
		b.rule(sPre, established, dport(53), tproxyTo(s.Gateway, cfg.GatePort), counter(), notrack(), setMark(cfg.Mark), verdict(expr.VerdictAccept))
		b.rule(sPre, established, tproxyTo(s.Gateway, cfg.ProxyPort), counter(), notrack(), setMark(cfg.Mark), verdict(expr.VerdictAccept))
		// No listener (airlockd gone): reset, as it would.
		b.rule(sPre, established, counter(), rejectTCPReset())
		b.rule(sPre, l4proto(unix.IPPROTO_TCP), notrack(), verdict(expr.VerdictAccept))
		b.rule(sPre, l4proto(unix.IPPROTO_UDP), dport(53), notrack(), verdict(expr.VerdictAccept))
		b.rule(sPre, counterDrop())

		// The sink pass; the source checks ran in chain spoof.
		b.rule(sTP, notrack())
		b.rule(sTP, nfproto(unix.NFPROTO_IPV4), l4proto(unix.IPPROTO_UDP), dport(53), tproxyTo(s.Gateway, cfg.GatePort), setMark(cfg.Mark), verdict(expr.VerdictAccept))
		b.rule(sTP, nfproto(unix.NFPROTO_IPV4), l4proto(unix.IPPROTO_TCP), dport(53), tproxyTo(s.Gateway, cfg.GatePort), setMark(cfg.Mark), verdict(expr.VerdictAccept))
		b.rule(sTP, nfproto(unix.NFPROTO_IPV4), l4proto(unix.IPPROTO_TCP), tproxyTo(s.Gateway, cfg.ProxyPort), setMark(cfg.Mark), verdict(expr.VerdictAccept))
		// tproxy that finds no socket (airlockd gone) does not drop.
		b.rule(sTP, l4proto(unix.IPPROTO_TCP), counter(), rejectTCPReset())
		b.rule(sTP, counterDrop())

		// tproxy hands a packet to any transparent socket on the port,
		// also one bound to 0.0.0.0 (a host's unbound with ip-transparent,
		// another proxy): while airlockd is gone, that one would answer
		// members. The gate's and the proxy's are bound to the gateway.
		b.rule(in, iifname(sink), socketWildcard(), counterDrop())
		b.rule(in, iifname(sink), markSet(cfg.Mark), verdict(expr.VerdictAccept))
		b.rule(in, iifname(sink), counterDrop())
		// The bridge pass's established packets, checked again at their
		// socket (early demux has found it: no second lookup).
		b.rule(in, iifname(br), socketWildcard(), counterDrop())
		b.rule(in, iifname(br), l4proto(unix.IPPROTO_TCP), markSet(cfg.Mark), socketTransparent(), verdict(expr.VerdictAccept))
		b.rule(in, iifname(br), counterDrop())
		// The gateway is the sandbox's address: nothing from another
		// network reaches the gate or the proxy there (which would take
		// the caller for a member, or use up the sandbox's limits). The
		// host's own processes still can, over lo.
		b.rule(in, iifnameNot("lo"), nfproto(unix.NFPROTO_IPV4), ip4Addr(offDaddr, gw, expr.CmpOpEq), counterDrop())

		b.rule(fwd, iifname(br), oifname(br), verdict(expr.VerdictAccept))
		b.rule(fwd, iifname(br), counterDrop())
		b.rule(fwd, oifname(br), counterDrop())
		b.rule(fwd, iifname(sink), counterDrop())

		b.rule(out, oifname(br), notrack())
	}
	// Every sandbox's chains above end in a verdict, so only bridges and
	// sinks no sandbox owns get here.
	prefixes := []string{cfg.SinkPrefix}
	if cfg.BridgePrefix != "" {
		prefixes = append(prefixes, cfg.BridgePrefix)
	}
	for _, p := range prefixes {
		for _, c := range []*nftables.Chain{spoof, pre, in, fwd} {
			b.rule(c, iifnamePrefix(p), counterDrop())
		}
	}
	if p := cfg.BridgePrefix; p != "" {
		b.rule(fwd, oifnamePrefix(p), counterDrop())
	}
}

// DivertNet is what a bridge's divert rule needs to know.
type DivertNet struct {
	Bridge  string
	Subnet  netip.Prefix
	Gateway netip.Addr
	// DivertIndex is the interface index of the divert end of the
	// bridge's pair (netns.Network.Ensure returns it). The rule holds the
	// index, not the name: EnsureDivert again whenever the pair is made
	// anew.
	DivertIndex int
	// Shaped sends every TCP frame through the divert pair, not only
	// SYNs: the cap on a sandbox's uploads is the pair's queue
	// (netns.Network.SetBandwidth), so while a cap is set its packets
	// must all cross it.
	Shaped bool
}

// EnsureDivert adds, or replaces, the netdev ingress chain of one bridge
// in airlock's netdev table: IPv4 TCP SYNs and fragments (every TCP
// frame when d.Shaped), TCP to a host address, TCP that chain pre-BRIDGE
// gave a listener under br_netfilter, and UDP to port 53 that the bridge
// passes up to
// the host, except what goes to another member of the subnet, are written
// into the divert pair and dropped on the bridge; a connection's other
// packets go up the bridge to chain pre-BRIDGE, which hands them to their
// socket. The bridge must exist. Without the chain, the packets reach the
// host's input and forward chains, which drop them.
func EnsureDivert(conn *nftables.Conn, d DivertNet) error {
	switch {
	case d.Bridge == "" || len(d.Bridge) >= unix.IFNAMSIZ:
		return fmt.Errorf("divert rule: bridge name %q: want 1 to 15 bytes", d.Bridge)
	case !d.Subnet.Addr().Is4() || !d.Subnet.Contains(d.Gateway):
		return fmt.Errorf("divert rule: bridge %s: gateway %s not in IPv4 subnet %s", d.Bridge, d.Gateway, d.Subnet)
	case d.DivertIndex <= 0:
		return fmt.Errorf("divert rule: bridge %s: no divert link", d.Bridge)
	}
	t := netdevTable()
	conn.AddTable(t)
	b := builder{conn: conn, t: t}
	accept := nftables.ChainPolicyAccept
	c := conn.AddChain(&nftables.Chain{Name: divertChain(d.Bridge), Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookIngress, Priority: nftables.ChainPriorityFilter, Device: d.Bridge, Policy: &accept})
	conn.FlushChain(c)
	// A frame still VLAN-tagged here (the kernel took one tag off at the
	// member's port) has a VLAN ethertype, so no rule below matches it;
	// after this hook the kernel takes off further priority tags (VLAN
	// 0) and hands the IPv4 inside to the host's receive: TCP that never
	// crossed the divert pair, past a bandwidth cap. No member needs to
	// send the host a tagged frame.
	for _, tpid := range []uint16{unix.ETH_P_8021Q, unix.ETH_P_8021AD} {
		b.rule(c, etherType(tpid), counterDrop())
	}
	b.rule(c, etherIPv4(), toOtherMember(d.Subnet, d.Gateway), verdict(expr.VerdictAccept))
	// After the SYN, a connection's packets stay on the bridge: chain
	// pre-BRIDGE hands them to their established socket. One that carries
	// a socket here has been through pre-BRIDGE under br_netfilter, which
	// gave it to a listener with tproxy: that one must cross the pair
	// (after the bridge, ip_rcv_core drops the socket).
	//
	// A segment to a host address always crosses the pair, where tproxy
	// keeps the socket it finds. Up the bridge, a socket tproxy found in
	// pre-BRIDGE under br_netfilter is dropped, and a time-wait or request
	// socket carries no owner for hasSocket to see: input would then look
	// the socket up again, and if the connection had just ended (a time-
	// wait socket a member's reset kills) find the listener bound there,
	// another sandbox's proxy, which takes a valid SYN cookie.
	if !d.Shaped {
		afterSYN := slices.Concat(etherIPv4(), tcpAfterSYN())
		b.rule(c, afterSYN, daddrLocal(expr.CmpOpEq), counter(), dupTo(d.DivertIndex), verdict(expr.VerdictDrop))
		b.rule(c, afterSYN, hasSocket(), counter(), dupTo(d.DivertIndex), verdict(expr.VerdictDrop))
		b.rule(c, afterSYN, verdict(expr.VerdictAccept))
	}
	b.rule(c, etherIPv4(), l4proto(unix.IPPROTO_TCP), counter(), dupTo(d.DivertIndex), verdict(expr.VerdictDrop))
	b.rule(c, etherIPv4(), l4proto(unix.IPPROTO_UDP), dport(53), counter(), dupTo(d.DivertIndex), verdict(expr.VerdictDrop))
	if err := conn.Flush(); err != nil {
		return explainNftError(err)
	}
	return nil
}

// DeleteDivert removes a bridge's netdev chain; a missing one is not an
// error.
func DeleteDivert(conn *nftables.Conn, bridge string) error {
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyNetdev)
	if err != nil {
		return explainNftError(err)
	}
	for _, c := range chains {
		if c.Table.Name == TableName && c.Name == divertChain(bridge) {
			conn.FlushChain(c)
			conn.DelChain(c)
			if err := conn.Flush(); err != nil {
				return explainNftError(err)
			}
		}
	}
	return nil
}

func divertChain(bridge string) string { return "divert-" + bridge }

// Offsets of the IPv4 source and destination addresses in the header.
const (
	offSaddr = 12
	offDaddr = 16
)

func ifnameBytes(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func iifname(n string) []expr.Any { return ifnameMatch(expr.MetaKeyIIFNAME, ifnameBytes(n)) }
func oifname(n string) []expr.Any { return ifnameMatch(expr.MetaKeyOIFNAME, ifnameBytes(n)) }

// iifnameNot matches packets that did not arrive on interface n.
func iifnameNot(n string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifnameBytes(n)},
	}
}

// iifnamePrefix and oifnamePrefix match names starting with p: without the
// NUL padding the comparison is a prefix match.
func iifnamePrefix(p string) []expr.Any { return ifnameMatch(expr.MetaKeyIIFNAME, []byte(p)) }
func oifnamePrefix(p string) []expr.Any { return ifnameMatch(expr.MetaKeyOIFNAME, []byte(p)) }

func ifnameMatch(key expr.MetaKey, name []byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
	}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

// dport matches the transport header's destination port; put an l4proto
// match first.
func dport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
	}
}

// ip4Addr compares the IPv4 address at offset with a prefix; put an nfproto
// match first.
func ip4Addr(offset uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	p = p.Masked()
	mask := make([]byte, 4)
	for i, bits := 0, p.Bits(); i < 4 && bits > 0; i++ {
		if bits >= 8 {
			mask[i], bits = 0xff, bits-8
		} else {
			mask[i], bits = byte(0xff<<(8-bits)), 0
		}
	}
	a := p.Addr().As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: op, Register: 1, Data: a[:]},
	}
}

// toOtherMember matches IPv4 packets to an address of subnet other than
// the gateway: traffic between members, which is bridged, not proxied. Put
// an IPv4 match first.
func toOtherMember(subnet netip.Prefix, gateway netip.Addr) []expr.Any {
	return slices.Concat(ip4Addr(offDaddr, subnet, expr.CmpOpEq), ip4Addr(offDaddr, netip.PrefixFrom(gateway, 32), expr.CmpOpNeq))
}

// tproxyTo hands the packet to the transparent socket on addr:port (the
// established one of its connection first); with none it does not match.
func tproxyTo(addr netip.Addr, port uint16) []expr.Any {
	a := addr.As4()
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: a[:]},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.TProxy{Family: unix.NFPROTO_IPV4, TableFamily: unix.NFPROTO_INET, RegAddr: 1, RegPort: 2},
	}
}

// setMark sets bit in the packet's mark, keeping the others.
func setMark(bit uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^bit), Xor: binaryutil.NativeEndian.PutUint32(bit)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	}
}

// markSet matches packets whose mark has bit set.
func markSet(bit uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bit), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(bit)},
	}
}

// etherIPv4 matches IPv4 frames (netdev family, where meta nfproto is
// not set).
func etherIPv4() []expr.Any { return etherType(unix.ETH_P_IP) }

// etherType matches frames whose protocol (skb->protocol: the ethertype
// after a VLAN tag the kernel took off) is typ.
func etherType(typ uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(typ)},
	}
}

// dupTo sends a copy of the frame out of interface index; google/nftables
// has no fwd, and dup followed by drop is the same.
func dupTo(index int) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(uint32(index))},
		&expr.Dup{RegDev: 1, IsRegDevSet: true},
	}
}

// socketWildcard matches packets assigned to a full socket bound to the
// wildcard address (a request or time-wait socket does not match).
func socketWildcard() []expr.Any {
	return []expr.Any{
		&expr.Socket{Key: expr.SocketKeyWildcard, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1}},
	}
}

// daddrLocal compares whether a packet is addressed to one of this host's
// addresses (fib daddr type local) with op: CmpOpEq matches those that
// are, CmpOpNeq those that are not.
func daddrLocal(op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, ResultADDRTYPE: true, FlagDADDR: true},
		&expr.Cmp{Op: op, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// hasSocket matches packets that carry a full socket of this network
// namespace (one tproxy assigned; a member's own sockets are in its
// namespace). nftables has no socket expression in the netdev family; the
// socket's owner is read instead, and any owner matches.
func hasSocket() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
		&expr.Cmp{Op: expr.CmpOpGte, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

// socketTransparent matches packets whose socket (the one already
// assigned, or found by their addresses and ports) is transparent: one of
// a proxy's, as airlockd's listeners and the connections they accept are.
func socketTransparent() []expr.Any {
	return []expr.Any{
		&expr.Socket{Key: expr.SocketKeyTransparent, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1}},
	}
}

// notFragment matches IPv4 packets that are whole: neither "more
// fragments" nor a fragment offset (in a fragment after the first, the
// transport header is not there to read).
func notFragment() []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 6, Len: 2},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 2, Mask: []byte{0x3f, 0xff}, Xor: []byte{0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0}},
	}
}

const tcpSYN = 0x02

// tcpAfterSYN matches whole TCP segments without SYN: a connection's
// packets after its first. Put an IPv4 match first.
func tcpAfterSYN() []expr.Any {
	return slices.Concat(l4proto(unix.IPPROTO_TCP), notFragment(), tcpFlagClear(tcpSYN))
}

// tcpFlagClear matches TCP segments without flag; put an l4proto match and
// notFragment first.
func tcpFlagClear(flag byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{flag}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0}},
	}
}

func notrack() []expr.Any { return []expr.Any{&expr.Notrack{}} }

func counter() []expr.Any { return []expr.Any{&expr.Counter{}} }

func rejectTCPReset() []expr.Any {
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}
}

func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func counterDrop() []expr.Any {
	return []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
}

// chainsOf returns the names of the chains built for bridge.
func chainsOf(bridge string) []string {
	return []string{"src-" + bridge, "pre-" + bridge, "tp-" + bridge}
}

// DeleteSandboxRules removes one bridge's rules and chains from airlock's
// tables, its divert chain and those naming it or its sink, leaving the
// other sandboxes' rules in place (airlock teardown NAME while airlockd is
// stopped). A missing table or bridge is not an error.
func DeleteSandboxRules(conn *nftables.Conn, bridge, sink string) error {
	if err := DeleteDivert(conn, bridge); err != nil {
		return err
	}
	present, err := RulesPresent(conn)
	if err != nil || !present {
		return err
	}
	t := inetTable()
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return explainNftError(err)
	}
	own := map[string]bool{}
	for _, n := range chainsOf(bridge) {
		own[n] = true
	}
	for _, c := range chains {
		if c.Table.Name != TableName || c.Hooknum == nil {
			continue
		}
		rules, err := conn.GetRules(t, c)
		if err != nil {
			return explainNftError(err)
		}
		for _, r := range rules {
			if mentions(r, own, bridge, sink) {
				if err := conn.DelRule(r); err != nil {
					return explainNftError(err)
				}
			}
		}
	}
	for _, c := range chains {
		if c.Table.Name == TableName && own[c.Name] {
			conn.FlushChain(c)
			conn.DelChain(c)
		}
	}
	if err := conn.Flush(); err != nil {
		return explainNftError(err)
	}
	return nil
}

// mentions reports whether a base-chain rule belongs to a sandbox: it
// jumps to one of its chains (own) or matches one of its links by name.
func mentions(r *nftables.Rule, own map[string]bool, links ...string) bool {
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Verdict:
			if own[e.Chain] {
				return true
			}
		case *expr.Cmp:
			if len(e.Data) == unix.IFNAMSIZ && slices.Contains(links, strings.TrimRight(string(e.Data), "\x00")) {
				return true
			}
		}
	}
	return false
}

// TableBridges returns the bridges airlock's tables have rules for (inet
// chains or a netdev divert chain), each once, so that a start or a
// teardown also finds sandboxes no longer in the config.
func TableBridges(conn *nftables.Conn) []string {
	out := slices.Concat(chainBridges(conn, nftables.TableFamilyINet, "pre-"), chainBridges(conn, nftables.TableFamilyNetdev, "divert-"))
	slices.Sort(out)
	return slices.Compact(out)
}

// chainBridges returns the bridges named by the chains of airlock's table
// of family whose names start with prefix.
func chainBridges(conn *nftables.Conn, family nftables.TableFamily, prefix string) []string {
	chains, err := conn.ListChainsOfTableFamily(family)
	if err != nil {
		return nil
	}
	var out []string
	for _, c := range chains {
		if b, ok := strings.CutPrefix(c.Name, prefix); ok && c.Table.Name == TableName {
			out = append(out, b)
		}
	}
	return out
}
