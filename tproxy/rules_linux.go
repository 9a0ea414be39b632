package tproxy

import (
	"errors"
	"fmt"
	"net/netip"
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
}

// RulesConfig describes the whole rule set.
type RulesConfig struct {
	// GatePort is the DNS gate's port on each gateway; 0 means 53.
	GatePort uint16
	// ProxyPort is the proxy's port on each gateway. Required.
	ProxyPort uint16
	Sandboxes []SandboxNet
	// MemberVethPrefix starts the host-side name of every member veth
	// (netns.MemberVethPrefix). Required: a member veth seen outside its
	// bridge is dropped.
	MemberVethPrefix string
	// BridgePrefix, when set, starts the name of every sandbox bridge
	// (netns.BridgePrefix). A bridge of that name that no sandbox here
	// owns is dropped whole: one that Docker brings back for the network
	// of a sandbox airlockd no longer runs must not be open.
	BridgePrefix string
}

// Why DNAT and not TPROXY: sandbox members sit on a Linux bridge (Docker's
// bridge driver needs one, and members of a sandbox reach each other on it).
// With br_netfilter loaded, which Docker always does, the IPv4 prerouting
// hook runs from inside the bridge; the socket TPROXY assigns there is
// orphaned by ip_rcv_core() and the connection is reset. DNAT to the
// gateway is carried by conntrack instead and works on a bridge, and the
// proxy reads the original destination with SO_ORIGINAL_DST. Like TPROXY,
// it fails closed: with nothing listening, a connection is refused and
// nothing leaves the host.

func (c *RulesConfig) validate() error {
	if c.GatePort == 0 {
		c.GatePort = 53
	}
	if c.ProxyPort == 0 {
		return errors.New("nftables rules: no proxy port")
	}
	if c.MemberVethPrefix == "" || len(c.MemberVethPrefix) >= unix.IFNAMSIZ {
		return errors.New("nftables rules: no member veth prefix")
	}
	if c.ProxyPort == c.GatePort {
		return fmt.Errorf("nftables rules: proxy port %d is the DNS gate's port", c.ProxyPort)
	}
	seen := map[string]bool{}
	for _, s := range c.Sandboxes {
		switch {
		case s.Bridge == "" || len(s.Bridge) >= unix.IFNAMSIZ:
			return fmt.Errorf("nftables rules: bridge name %q: want 1 to 15 bytes", s.Bridge)
		case seen[s.Bridge]:
			return fmt.Errorf("nftables rules: bridge %s twice", s.Bridge)
		case !s.Subnet.Addr().Is4() || !s.Subnet.Contains(s.Gateway):
			return fmt.Errorf("nftables rules: bridge %s: gateway %s not in IPv4 subnet %s", s.Bridge, s.Gateway, s.Subnet)
		}
		seen[s.Bridge] = true
	}
	return nil
}

// EnsureRules replaces airlock's table with one built from cfg, in one
// atomic batch: whatever an earlier run or a crash left is gone, and there
// is no moment without rules. The table stays when airlockd stops, so
// sandboxes fail closed until DeleteRules.
func EnsureRules(conn *nftables.Conn, cfg RulesConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
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

// DeleteRules removes airlock's table. A missing table is not an error.
func DeleteRules(conn *nftables.Conn) error {
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	conn.AddTable(t)
	conn.DelTable(t)
	if err := conn.Flush(); err != nil {
		return explainNftError(err)
	}
	return nil
}

// RulesPresent reports whether airlock's table exists.
func RulesPresent(conn *nftables.Conn) (bool, error) {
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
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
		return fmt.Errorf("nftables: the kernel lacks a feature airlock needs (nf_tables inet family, nat chains, ct, counter); check CONFIG_NF_TABLES_INET, CONFIG_NFT_NAT and CONFIG_NFT_CT: %w", err)
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EPROTONOSUPPORT):
		return fmt.Errorf("nftables: operation not supported by this kernel (nat chains in the inet family need Linux ≥ 5.2): %w", err)
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

// build lays out the table. The base chains accept by default and only
// jump for sandbox bridges, so the rest of the host is untouched:
//
//	prerouting (filter, mangle): from a bridge: IPv6 drop; source outside the
//	  subnet, or the gateway's own, drop (spoofing); to another member of the subnet accept; UDP and
//	  TCP to port 53 accept; TCP accept; everything else drop.
//	dstnat (nat, before Docker's): from a bridge, not to a member: port 53
//	  (UDP, TCP) → gateway:gate port; other TCP → gateway:proxy port.
//	input (filter): from a bridge: only the gate and the proxy ports on the
//	  gateway; all else drop.
//	forward (filter): bridge → same bridge accept (bridged frames under
//	  br_netfilter); from or to a bridge drop.
//	and last, in prerouting, input and forward: from (or to) a bridge named
//	  like a sandbox's that no sandbox owns: drop.
func (b *builder) build(cfg RulesConfig) {
	pre := b.chain("prerouting", nftables.ChainHookPrerouting, nftables.ChainPriorityMangle, nftables.ChainTypeFilter)
	natPrio := nftables.ChainPriority(*nftables.ChainPriorityNATDest - 10)
	nat := b.chain("dstnat", nftables.ChainHookPrerouting, &natPrio, nftables.ChainTypeNAT)
	in := b.chain("input", nftables.ChainHookInput, nftables.ChainPriorityFilter, nftables.ChainTypeFilter)
	fwd := b.chain("forward", nftables.ChainHookForward, nftables.ChainPriorityFilter, nftables.ChainTypeFilter)

	// A member veth ("alr…") is only ever a port of a sandbox bridge, where
	// the IP hooks see the bridge instead. Seen on its own, its bridge is
	// gone: drop everything, or a host that forwards would route it out.
	for _, c := range []*nftables.Chain{pre, in, fwd} {
		b.rule(c, iifnamePrefix(cfg.MemberVethPrefix), counterDrop())
	}
	b.rule(fwd, oifnamePrefix(cfg.MemberVethPrefix), counterDrop())

	for _, s := range cfg.Sandboxes {
		br := s.Bridge
		sPre := b.chain("pre-"+br, nil, nil, "")
		sNat := b.chain("nat-"+br, nil, nil, "")
		sIn := b.chain("in-"+br, nil, nil, "")
		b.rule(pre, iifname(br), jump(sPre.Name))
		b.rule(nat, iifname(br), jump(sNat.Name))
		b.rule(in, iifname(br), jump(sIn.Name))

		b.rule(sPre, nfproto(unix.NFPROTO_IPV6), counterDrop())
		b.rule(sPre, nfproto(unix.NFPROTO_IPV4), ip4Addr(offSaddr, s.Subnet, expr.CmpOpNeq), counterDrop())
		b.rule(sPre, nfproto(unix.NFPROTO_IPV4), ip4Addr(offSaddr, netip.PrefixFrom(s.Gateway, 32), expr.CmpOpEq), counterDrop())
		b.rule(sPre, nfproto(unix.NFPROTO_IPV4), ip4Addr(offDaddr, s.Subnet, expr.CmpOpEq),
			ip4Addr(offDaddr, netip.PrefixFrom(s.Gateway, 32), expr.CmpOpNeq), verdict(expr.VerdictAccept))
		b.rule(sPre, l4proto(unix.IPPROTO_UDP), dport(53), verdict(expr.VerdictAccept))
		b.rule(sPre, l4proto(unix.IPPROTO_TCP), verdict(expr.VerdictAccept))
		b.rule(sPre, counterDrop())

		b.rule(sNat, nfproto(unix.NFPROTO_IPV4), ip4Addr(offDaddr, s.Subnet, expr.CmpOpEq),
			ip4Addr(offDaddr, netip.PrefixFrom(s.Gateway, 32), expr.CmpOpNeq), verdict(expr.VerdictReturn))
		b.rule(sNat, l4proto(unix.IPPROTO_UDP), dport(53), dnat(s.Gateway, cfg.GatePort))
		b.rule(sNat, l4proto(unix.IPPROTO_TCP), dport(53), dnat(s.Gateway, cfg.GatePort))
		b.rule(sNat, l4proto(unix.IPPROTO_TCP), dnat(s.Gateway, cfg.ProxyPort))

		gw := netip.PrefixFrom(s.Gateway, 32)
		b.rule(sIn, nfproto(unix.NFPROTO_IPV4), ip4Addr(offDaddr, gw, expr.CmpOpEq), l4proto(unix.IPPROTO_UDP), dport(cfg.GatePort), verdict(expr.VerdictAccept))
		b.rule(sIn, nfproto(unix.NFPROTO_IPV4), ip4Addr(offDaddr, gw, expr.CmpOpEq), l4proto(unix.IPPROTO_TCP), dport(cfg.GatePort), verdict(expr.VerdictAccept))
		b.rule(sIn, nfproto(unix.NFPROTO_IPV4), ip4Addr(offDaddr, gw, expr.CmpOpEq), l4proto(unix.IPPROTO_TCP), dport(cfg.ProxyPort), verdict(expr.VerdictAccept))
		b.rule(sIn, counterDrop())

		b.rule(fwd, iifname(br), oifname(br), verdict(expr.VerdictAccept))
		b.rule(fwd, iifname(br), counterDrop())
		b.rule(fwd, oifname(br), counterDrop())
	}
	// Every sandbox's chains above end in a verdict, so only bridges no
	// sandbox owns get here.
	if p := cfg.BridgePrefix; p != "" {
		for _, c := range []*nftables.Chain{pre, in, fwd} {
			b.rule(c, iifnamePrefix(p), counterDrop())
		}
		b.rule(fwd, oifnamePrefix(p), counterDrop())
	}
}

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

func dnat(addr netip.Addr, port uint16) []expr.Any {
	a := addr.As4()
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: a[:]},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
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
	return []string{"pre-" + bridge, "nat-" + bridge, "in-" + bridge}
}

// DeleteSandboxRules removes one bridge's rules and chains from airlock's
// table, leaving the other sandboxes' rules in place (airlock teardown NAME
// while airlockd is stopped). A missing table or bridge is not an error.
func DeleteSandboxRules(conn *nftables.Conn, bridge string) error {
	present, err := RulesPresent(conn)
	if err != nil || !present {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
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
			if mentions(r, bridge, own) {
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

// mentions reports whether a base-chain rule belongs to bridge: it jumps to
// one of its chains or matches its name.
func mentions(r *nftables.Rule, bridge string, own map[string]bool) bool {
	name := ifnameBytes(bridge)
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Verdict:
			if own[e.Chain] {
				return true
			}
		case *expr.Cmp:
			if len(e.Data) == len(name) && strings.TrimRight(string(e.Data), "\x00") == bridge {
				return true
			}
		}
	}
	return false
}

// TableBridges returns the bridges airlock's table has rules for, so that a
// teardown also finds sandboxes no longer in the config.
func TableBridges(conn *nftables.Conn) []string {
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil
	}
	var out []string
	for _, c := range chains {
		if b, ok := strings.CutPrefix(c.Name, "pre-"); ok && c.Table.Name == TableName {
			out = append(out, b)
		}
	}
	return out
}
