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
	return RulesConfig{ProxyPort: 15001, MemberVethPrefix: "alr", Sandboxes: []SandboxNet{
		{Bridge: "al-a", Subnet: netip.MustParsePrefix("10.88.0.0/24"), Gateway: netip.MustParseAddr("10.88.0.1")},
		{Bridge: "al-b", Subnet: netip.MustParsePrefix("10.88.1.0/24"), Gateway: netip.MustParseAddr("10.88.1.1")},
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
			for _, name := range []string{"prerouting", "dstnat", "input", "forward", "pre-al-a", "nat-al-a", "in-al-a", "pre-al-b"} {
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
	if len(chains) != 8 {
		t.Errorf("chains built: %v", chains)
	}
	rules := 0
	for _, k := range kinds {
		if k == unix.NFT_MSG_NEWRULE {
			rules++
		}
	}
	// 4 orphan-veth drops + per sandbox: 3 jumps, 7 pre, 4 nat, 4 in, 3 forward.
	if want := 4 + 2*(3+7+4+4+3); rules != want {
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
		{"no veth prefix", func(c *RulesConfig) { c.MemberVethPrefix = "" }, "veth prefix"},
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
