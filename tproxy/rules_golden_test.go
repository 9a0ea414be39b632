package tproxy

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/*.golden from the code")

// TestRuleSetGolden renders the exact rule set EnsureRules sends to the
// kernel in nft's own words and compares it with testdata/ruleset.golden.
// The rules are read back from the netlink messages of the Flush (parsed
// by google/nftables as `nft list` would get them from the kernel), so a
// change of any match, register, offset, priority or verdict shows here.
// After a deliberate change: go test ./tproxy -run TestRuleSetGolden -update
func TestRuleSetGolden(t *testing.T) {
	cfg := testConfig()
	cfg.BridgePrefix = "al-"
	got := renderRuleSet(t, cfg)
	path := filepath.Join("testdata", "ruleset.golden")
	if *updateGolden {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("the rule set differs from %s; if the change is meant, run with -update and review the diff.\ngot:\n%s", path, got)
	}
}

// TestRuleSetGoldenSeesAChange: the renderer shows a one-byte change of a
// match, so the golden test cannot pass over one.
func TestRuleSetGoldenSeesAChange(t *testing.T) {
	a := renderRuleSet(t, testConfig())
	cfg := testConfig()
	cfg.Sandboxes[1].Subnet = netip.MustParsePrefix("10.88.2.0/24")
	cfg.Sandboxes[1].Gateway = netip.MustParseAddr("10.88.2.1")
	b := renderRuleSet(t, cfg)
	if a == b || !strings.Contains(b, "10.88.2.0") {
		t.Errorf("another subnet renders the same rule set:\n%s", b)
	}
	cfg = testConfig()
	cfg.ProxyPort = 15002
	if c := renderRuleSet(t, cfg); c == a || !strings.Contains(c, ":15002") {
		t.Errorf("another proxy port renders the same rule set:\n%s", c)
	}
	cfg = testConfig()
	cfg.Mark = 0x4000
	if c := renderRuleSet(t, cfg); c == a {
		t.Errorf("another mark renders the same rule set:\n%s", c)
	}
}

// renderRuleSet builds cfg's rule set, and each sandbox's divert rule
// (divert end at interface index 100, 101, …), on a recording connection,
// then reads the chains and rules back through google/nftables' own
// parsers and renders them, the inet table first, then the netdev one.
func renderRuleSet(t *testing.T, cfg RulesConfig) string {
	t.Helper()
	c, msgs := record(t)
	if err := EnsureRules(c, cfg); err != nil {
		t.Fatal(err)
	}
	for i, s := range cfg.Sandboxes {
		// The second sandbox has a bandwidth cap: all its TCP is diverted.
		if err := EnsureDivert(c, DivertNet{Bridge: s.Bridge, Subnet: s.Subnet, Gateway: s.Gateway, DivertIndex: 100 + i, Shaped: i == 1}); err != nil {
			t.Fatal(err)
		}
	}
	type family struct {
		fam           nftables.TableFamily
		name          string
		chains, rules []netlink.Message
	}
	fams := []*family{{fam: nftables.TableFamilyINet, name: "inet"}, {fam: nftables.TableFamilyNetdev, name: "netdev"}}
	for _, m := range *msgs {
		// nfgenmsg starts with the family.
		for _, f := range fams {
			if len(m.Data) == 0 || nftables.TableFamily(m.Data[0]) != f.fam {
				continue
			}
			switch int(m.Header.Type) & 0xff {
			case unix.NFT_MSG_NEWCHAIN:
				f.chains = append(f.chains, m)
			case unix.NFT_MSG_NEWRULE:
				f.rules = append(f.rules, m)
			}
		}
	}
	// A connection whose "kernel" answers every dump with what the Flush
	// sent: the parsers then see the bytes the kernel would have stored.
	replay := func(out []netlink.Message) *nftables.Conn {
		rc, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
			reply := make([]netlink.Message, len(out))
			for i, m := range out {
				m.Header.Sequence, m.Header.PID = req[0].Header.Sequence, req[0].Header.PID
				reply[i] = m
			}
			return reply, nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		return rc
	}
	var b strings.Builder
	for _, f := range fams {
		chains, err := replay(f.chains).ListChainsOfTableFamily(f.fam)
		if err != nil {
			t.Fatalf("parse %s chains: %v", f.name, err)
		}
		table := &nftables.Table{Family: f.fam, Name: TableName}
		rules, err := replay(f.rules).GetRules(table, &nftables.Chain{Name: "any"})
		if err != nil {
			t.Fatalf("parse %s rules: %v", f.name, err)
		}
		if len(rules) != len(f.rules) {
			t.Fatalf("%s: %d rules sent, %d parsed", f.name, len(f.rules), len(rules))
		}
		byChain := map[string][]string{}
		for i, r := range rules {
			byChain[r.Chain.Name] = append(byChain[r.Chain.Name], renderExprs(withUnparsed(t, f.rules[i], r.Exprs)))
		}
		devices := map[string]string{}
		for _, m := range f.chains {
			name, dev := chainDevice(t, m)
			devices[name] = dev
		}
		fmt.Fprintf(&b, "table %s %s {\n", f.name, TableName)
		for _, ch := range chains {
			fmt.Fprintf(&b, "\tchain %s {\n", ch.Name)
			if ch.Hooknum != nil {
				policy := "accept"
				if ch.Policy != nil && *ch.Policy == nftables.ChainPolicyDrop {
					policy = "drop"
				}
				dev := ""
				if d := devices[ch.Name]; d != "" {
					dev = fmt.Sprintf(" device %q", d)
				}
				fmt.Fprintf(&b, "\t\ttype %s hook %s%s priority %d; policy %s;\n", ch.Type, hookName(f.fam, *ch.Hooknum), dev, *ch.Priority, policy)
			}
			for _, r := range byChain[ch.Name] {
				fmt.Fprintf(&b, "\t\t%s\n", r)
			}
			b.WriteString("\t}\n")
			delete(byChain, ch.Name)
		}
		b.WriteString("}\n")
		if len(byChain) > 0 {
			var names []string
			for n := range byChain {
				names = append(names, n)
			}
			sort.Strings(names)
			t.Errorf("%s rules in chains that were not created: %v", f.name, names)
		}
	}
	return b.String()
}

// withUnparsed puts back into a rule's parsed expressions those that
// google/nftables v0.3.0 cannot parse and leaves out (tproxy, dup),
// decoded from the rule's netlink message m itself.
func withUnparsed(t *testing.T, m netlink.Message, parsed []expr.Any) []expr.Any {
	t.Helper()
	var out []expr.Any
	for _, e := range attrsOf(t, m.Data[4:]) {
		if e.Type != unix.NFTA_RULE_EXPRESSIONS {
			continue
		}
		for _, elem := range attrsOf(t, e.Data) {
			var name string
			var data []byte
			for _, a := range attrsOf(t, elem.Data) {
				switch a.Type {
				case unix.NFTA_EXPR_NAME:
					name = strings.TrimRight(string(a.Data), "\x00")
				case unix.NFTA_EXPR_DATA:
					data = a.Data
				}
			}
			u32 := map[uint16]uint32{}
			switch name {
			case "tproxy", "dup", "socket":
				for _, a := range attrsOf(t, data) {
					u32[a.Type] = binary.BigEndian.Uint32(a.Data)
				}
			}
			switch name {
			case "tproxy":
				out = append(out, &expr.TProxy{Family: byte(u32[expr.NFTA_TPROXY_FAMILY]), RegAddr: u32[expr.NFTA_TPROXY_REG_ADDR], RegPort: u32[expr.NFTA_TPROXY_REG_PORT]})
			case "dup":
				_, dev := u32[unix.NFTA_DUP_SREG_DEV]
				out = append(out, &expr.Dup{RegAddr: u32[unix.NFTA_DUP_SREG_ADDR], RegDev: u32[unix.NFTA_DUP_SREG_DEV], IsRegDevSet: dev})
			case "socket":
				out = append(out, &expr.Socket{Key: expr.SocketKey(u32[1 /* NFTA_SOCKET_KEY */]), Register: u32[2 /* NFTA_SOCKET_DREG */]})
			default:
				if len(parsed) == 0 {
					t.Fatalf("expression %q sent but not parsed", name)
				}
				out, parsed = append(out, parsed[0]), parsed[1:]
			}
		}
	}
	if len(parsed) > 0 {
		t.Fatalf("%d parsed expressions left over", len(parsed))
	}
	return out
}

// chainDevice returns the name of the chain in NEWCHAIN message m and the
// device its hook is bound to, if any.
func chainDevice(t *testing.T, m netlink.Message) (name, device string) {
	t.Helper()
	for _, a := range attrsOf(t, m.Data[4:]) {
		switch a.Type {
		case unix.NFTA_CHAIN_NAME:
			name = strings.TrimRight(string(a.Data), "\x00")
		case unix.NFTA_CHAIN_HOOK:
			for _, h := range attrsOf(t, a.Data) {
				if h.Type == unix.NFTA_HOOK_DEV {
					device = strings.TrimRight(string(h.Data), "\x00")
				}
			}
		}
	}
	return name, device
}

func attrsOf(t *testing.T, b []byte) []netlink.Attribute {
	t.Helper()
	as, err := netlink.UnmarshalAttributes(b)
	if err != nil {
		t.Fatalf("netlink attributes: %v", err)
	}
	for i := range as {
		as[i].Type &^= unix.NLA_F_NESTED
	}
	return as
}

func hookName(fam nftables.TableFamily, h nftables.ChainHook) string {
	if fam == nftables.TableFamilyNetdev {
		switch h {
		case *nftables.ChainHookIngress:
			return "ingress"
		}
		return fmt.Sprintf("hook(%d)", h)
	}
	switch h {
	case *nftables.ChainHookPrerouting:
		return "prerouting"
	case *nftables.ChainHookInput:
		return "input"
	case *nftables.ChainHookForward:
		return "forward"
	case *nftables.ChainHookOutput:
		return "output"
	case *nftables.ChainHookPostrouting:
		return "postrouting"
	}
	return fmt.Sprintf("hook(%d)", h)
}

// renderExprs writes a rule's expressions in nft's words, with the
// registers that tie them together, so that a load into the wrong
// register, a wrong offset or a wrong mask shows. What it does not know it
// writes with %T and %+v, which still changes with every field.
func renderExprs(es []expr.Any) string {
	var parts []string
	for _, e := range es {
		switch e := e.(type) {
		case *expr.Meta:
			if e.SourceRegister {
				parts = append(parts, fmt.Sprintf("meta %s set r%d", metaName(e.Key), e.Register))
			} else {
				parts = append(parts, fmt.Sprintf("r%d = meta %s", e.Register, metaName(e.Key)))
			}
		case *expr.Payload:
			base := map[expr.PayloadBase]string{expr.PayloadBaseLLHeader: "ll", expr.PayloadBaseNetworkHeader: "nh", expr.PayloadBaseTransportHeader: "th"}[e.Base]
			parts = append(parts, fmt.Sprintf("r%d = payload %s[%d:%d]", e.DestRegister, base, e.Offset, e.Offset+e.Len))
		case *expr.Bitwise:
			parts = append(parts, fmt.Sprintf("r%d = r%d & %s ^ %s", e.DestRegister, e.SourceRegister, hexBytes(e.Mask), hexBytes(e.Xor)))
		case *expr.Cmp:
			op := map[expr.CmpOp]string{expr.CmpOpEq: "==", expr.CmpOpNeq: "!=", expr.CmpOpLt: "<", expr.CmpOpLte: "<=", expr.CmpOpGt: ">", expr.CmpOpGte: ">="}[e.Op]
			parts = append(parts, fmt.Sprintf("r%d %s %s", e.Register, op, dataString(e.Data)))
		case *expr.Immediate:
			parts = append(parts, fmt.Sprintf("r%d = %s", e.Register, dataString(e.Data)))
		case *expr.NAT:
			typ := map[expr.NATType]string{expr.NATTypeDestNAT: "dnat", expr.NATTypeSourceNAT: "snat"}[e.Type]
			parts = append(parts, fmt.Sprintf("%s family %d to r%d:r%d", typ, e.Family, e.RegAddrMin, e.RegProtoMin))
		case *expr.TProxy:
			parts = append(parts, fmt.Sprintf("tproxy family %d to r%d:r%d", e.Family, e.RegAddr, e.RegPort))
		case *expr.Dup:
			if !e.IsRegDevSet {
				parts = append(parts, fmt.Sprintf("dup to address r%d", e.RegAddr))
				break
			}
			parts = append(parts, fmt.Sprintf("dup to device r%d", e.RegDev))
		case *expr.Socket:
			parts = append(parts, fmt.Sprintf("r%d = socket key %d", e.Register, e.Key))
		case *expr.Fib:
			if *e != (expr.Fib{Register: e.Register, ResultADDRTYPE: true, FlagDADDR: true}) {
				parts = append(parts, fmt.Sprintf("%T%+v", e, e))
				break
			}
			parts = append(parts, fmt.Sprintf("r%d = fib daddr type", e.Register))
		case *expr.Notrack:
			parts = append(parts, "notrack")
		case *expr.Reject:
			parts = append(parts, fmt.Sprintf("reject type %d code %d", e.Type, e.Code))
		case *expr.Counter:
			parts = append(parts, "counter")
		case *expr.Verdict:
			v := map[expr.VerdictKind]string{expr.VerdictAccept: "accept", expr.VerdictDrop: "drop", expr.VerdictReturn: "return", expr.VerdictJump: "jump", expr.VerdictGoto: "goto", expr.VerdictContinue: "continue"}[e.Kind]
			if e.Chain != "" {
				v += " " + e.Chain
			}
			parts = append(parts, v)
		default:
			parts = append(parts, fmt.Sprintf("%T%+v", e, e))
		}
	}
	return strings.Join(parts, "; ")
}

func metaName(k expr.MetaKey) string {
	switch k {
	case expr.MetaKeyIIFNAME:
		return "iifname"
	case expr.MetaKeyOIFNAME:
		return "oifname"
	case expr.MetaKeyNFPROTO:
		return "nfproto"
	case expr.MetaKeyL4PROTO:
		return "l4proto"
	case expr.MetaKeyMARK:
		return "mark"
	case expr.MetaKeyPKTTYPE:
		return "pkttype"
	case expr.MetaKeyPROTOCOL:
		return "protocol"
	case expr.MetaKeySKUID:
		return "skuid"
	}
	return fmt.Sprintf("meta(%d)", k)
}

// dataString shows comparison data as what it most likely is: an
// interface name, an IPv4 address, a port, a protocol number, else hex.
func dataString(d []byte) string {
	switch {
	case len(d) == unix.IFNAMSIZ || len(d) > 0 && len(d) < unix.IFNAMSIZ && isPrintable(d) && len(d) > 2:
		return fmt.Sprintf("%q", string(bytes.TrimRight(d, "\x00")))
	case len(d) == 4:
		return netip.AddrFrom4([4]byte(d)).String()
	case len(d) == 2:
		return fmt.Sprintf(":%d", binary.BigEndian.Uint16(d))
	case len(d) == 1:
		return fmt.Sprintf("%d", d[0])
	}
	return hexBytes(d)
}

func isPrintable(d []byte) bool {
	for _, c := range d {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

func hexBytes(d []byte) string { return fmt.Sprintf("0x%x", d) }
