package tproxy

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// record returns a Conn that records the netlink messages of a Flush and
// acknowledges them, so the rule set can be checked without root.
func record(t *testing.T) (*nftables.Conn, *[]netlink.Message) {
	var msgs []netlink.Message
	c, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		msgs = append(msgs, req...)
		var acks []netlink.Message
		for _, m := range req {
			if m.Header.Flags&netlink.Acknowledge != 0 {
				acks = append(acks, netlink.Message{Header: netlink.Header{Length: 4, Type: netlink.Error, Sequence: m.Header.Sequence, PID: m.Header.PID}, Data: []byte{0, 0, 0, 0}})
			}
		}
		return acks, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	return c, &msgs
}

func testConfig() RulesConfig {
	return RulesConfig{ProxyPort: 15001, Mark: 0x2000, MemberVethPrefix: "alr", DivertPrefix: "ald", SinkPrefix: "als", Sandboxes: []SandboxNet{
		{Bridge: "al-a", Sink: "alsa", Subnet: netip.MustParsePrefix("10.88.0.0/24"), Gateway: netip.MustParseAddr("10.88.0.1")},
		{Bridge: "al-b", Sink: "alsb", Subnet: netip.MustParsePrefix("10.88.1.0/24"), Gateway: netip.MustParseAddr("10.88.1.1")},
	}}
}

func TestEnsureRulesReplacesTableAtomically(t *testing.T) {
	c, msgs := record(t)
	if err := EnsureRules(c, testConfig()); err != nil {
		t.Fatal(err)
	}
	var kinds []int
	chains := map[string]bool{}
	for _, m := range *msgs {
		typ := int(m.Header.Type) & 0xff
		kinds = append(kinds, typ)
		if typ == unix.NFT_MSG_NEWCHAIN {
			for _, name := range []string{"spoof", "prerouting", "input", "forward", "output", "src-al-a", "pre-al-a", "tp-al-a", "src-al-b", "pre-al-b", "tp-al-b"} {
				if strings.Contains(string(m.Data), name+"\x00") {
					chains[name] = true
				}
			}
		}
	}
	// One batch: begin, new table, delete table, new table, …, end.
	if len(kinds) < 5 || kinds[1] != unix.NFT_MSG_NEWTABLE || kinds[2] != unix.NFT_MSG_DELTABLE || kinds[3] != unix.NFT_MSG_NEWTABLE {
		t.Errorf("message kinds start %v; want batch begin, NEWTABLE, DELTABLE, NEWTABLE", kinds[:min(len(kinds), 5)])
	}
	if len(chains) != 11 {
		t.Errorf("chains built: %v", chains)
	}
	rules := 0
	for _, k := range kinds {
		if k == unix.NFT_MSG_NEWRULE {
			rules++
		}
	}
	// Drops of member veths and divert ends (5 each), sinks routed out (1);
	// per sandbox: 4 jumps, 4 src, 9 pre, 6 tp, 7 input, 4 forward, 1
	// output; and drops of unowned sinks (4).
	if want := 5 + 5 + 1 + 2*(4+4+9+6+7+4+1) + 4; rules != want {
		t.Errorf("%d rules, want %d", rules, want)
	}
}

func TestRulesConfigValidation(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*RulesConfig)
		want string
	}{
		{"no proxy port", func(c *RulesConfig) { c.ProxyPort = 0 }, "no proxy port"},
		{"proxy on 53", func(c *RulesConfig) { c.ProxyPort = 53 }, "DNS gate's port"},
		{"no veth prefix", func(c *RulesConfig) { c.MemberVethPrefix = "" }, "veth, divert or sink prefix"},
		{"no divert prefix", func(c *RulesConfig) { c.DivertPrefix = "" }, "veth, divert or sink prefix"},
		{"no sink prefix", func(c *RulesConfig) { c.SinkPrefix = "" }, "veth, divert or sink prefix"},
		{"no mark", func(c *RulesConfig) { c.Mark = 0 }, "not a single bit"},
		{"two mark bits", func(c *RulesConfig) { c.Mark = 0x3000 }, "not a single bit"},
		{"no sink", func(c *RulesConfig) { c.Sandboxes[0].Sink = "" }, "sink name"},
		{"sink without prefix", func(c *RulesConfig) { c.Sandboxes[0].Sink = "xyz" }, "sink name"},
		{"sink twice", func(c *RulesConfig) { c.Sandboxes[1].Sink = "alsa" }, "twice"},
		{"long bridge", func(c *RulesConfig) { c.Sandboxes[0].Bridge = "al-0123456789abc" }, "1 to 15"},
		{"same bridge", func(c *RulesConfig) { c.Sandboxes[1].Bridge = "al-a" }, "twice"},
		{"gateway outside", func(c *RulesConfig) { c.Sandboxes[0].Gateway = netip.MustParseAddr("10.99.0.1") }, "not in IPv4 subnet"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			tt.mod(&cfg)
			c, msgs := record(t)
			err := EnsureRules(c, cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("EnsureRules error = %v, want %q", err, tt.want)
			}
			if len(*msgs) != 0 {
				t.Errorf("a refused config sent %d netlink messages", len(*msgs))
			}
		})
	}
}

func TestEnsureDivertValidation(t *testing.T) {
	good := DivertNet{Bridge: "al-a", Subnet: netip.MustParsePrefix("10.88.0.0/24"), Gateway: netip.MustParseAddr("10.88.0.1"), DivertIndex: 7}
	tests := []struct {
		name string
		mod  func(*DivertNet)
		want string
	}{
		{"no bridge", func(d *DivertNet) { d.Bridge = "" }, "1 to 15"},
		{"long bridge", func(d *DivertNet) { d.Bridge = "al-0123456789abc" }, "1 to 15"},
		{"gateway outside", func(d *DivertNet) { d.Gateway = netip.MustParseAddr("10.99.0.1") }, "not in IPv4 subnet"},
		{"IPv6", func(d *DivertNet) {
			d.Subnet, d.Gateway = netip.MustParsePrefix("fd00::/64"), netip.MustParseAddr("fd00::1")
		}, "not in IPv4 subnet"},
		{"no divert link", func(d *DivertNet) { d.DivertIndex = 0 }, "no divert link"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := good
			tt.mod(&d)
			c, msgs := record(t)
			if err := EnsureDivert(c, d); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("EnsureDivert error = %v, want %q", err, tt.want)
			}
			if len(*msgs) != 0 {
				t.Errorf("a refused divert sent %d netlink messages", len(*msgs))
			}
		})
	}
	c, msgs := record(t)
	if err := EnsureDivert(c, good); err != nil || len(*msgs) == 0 {
		t.Errorf("EnsureDivert(%+v) = %v with %d messages", good, err, len(*msgs))
	}
}
