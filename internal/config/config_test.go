package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDefault(t *testing.T) {
	c := Default()
	if c.APIListen != "127.0.0.1:7433" || c.StateDir != "/var/lib/airlock" || c.ProxyPort != 15001 {
		t.Errorf("defaults: %+v", c)
	}
	if len(c.Sandboxes) != 1 || c.Sandboxes[0].Name != "default" || c.Sandboxes[0].Subnet.String() != "10.88.0.0/24" ||
		c.Sandboxes[0].Policy != "/var/lib/airlock/sandboxes/default.yaml" || c.Sandboxes[0].Presets != "package-managers" {
		t.Errorf("default sandbox: %+v", c.Sandboxes)
	}
	if c.FakeIPPool.String() != "198.18.0.0/15" || c.UpstreamDNS[0] != "system" {
		t.Errorf("pool/upstream: %v %v", c.FakeIPPool, c.UpstreamDNS)
	}
	if c.LogAllowed || c.PolicyPoll != 2*time.Second || c.Drain != 5*time.Second {
		t.Errorf("log_allowed %v, policy poll %v, drain %v; want false, 2s, 5s", c.LogAllowed, c.PolicyPoll, c.Drain)
	}
	if c.ExposeListen.String() != "127.0.0.1" {
		t.Errorf("expose_listen %v, want 127.0.0.1", c.ExposeListen)
	}
}

func TestParseExposeListen(t *testing.T) {
	for _, tc := range []struct{ in, want string }{{"127.0.0.2", "127.0.0.2"}, {"'::1'", "::1"}, {"0.0.0.0", "0.0.0.0"}, {"192.0.2.7", "192.0.2.7"}, {"'::ffff:127.0.0.1'", "127.0.0.1"}} {
		c, err := Parse("x.yaml", []byte("expose_listen: "+tc.in+"\nsandboxes:\n  - {name: a, subnet: 10.88.0.0/24}\n"))
		if err != nil || c.ExposeListen.String() != tc.want {
			t.Errorf("expose_listen %s: %v %v, want %s", tc.in, c, err, tc.want)
		}
	}
}

func TestParseSandboxPresets(t *testing.T) {
	c, err := Parse("x.yaml", []byte("sandboxes:\n  - {name: a, subnet: 10.88.0.0/24, presets: [Python, go]}\n  - {name: b, subnet: 10.88.1.0/24}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Sandboxes[0].Presets != "python,go" || c.Sandboxes[1].Presets != "" {
		t.Errorf("presets %q, %q; want python,go and none", c.Sandboxes[0].Presets, c.Sandboxes[1].Presets)
	}
	_, err = Parse("x.yaml", []byte("sandboxes:\n  - {name: a, subnet: 10.88.0.0/24, presets: [pip]}\n"))
	if err == nil || !strings.Contains(err.Error(), `sandboxes[0].presets: unknown preset "pip": want one of python`) {
		t.Errorf("unknown preset: %v", err)
	}
}

func TestParseServiceKeys(t *testing.T) {
	c, err := Parse("x.yaml", []byte("log_allowed: true\npolicy_poll_seconds: 0.5\ndrain_seconds: 0\nsandboxes:\n  - {name: a, subnet: 10.88.0.0/24}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.LogAllowed || c.PolicyPoll != 500*time.Millisecond || c.Drain != 0 {
		t.Errorf("log_allowed %v, policy poll %v, drain %v; want true, 500ms, 0s", c.LogAllowed, c.PolicyPoll, c.Drain)
	}
}

func TestParseDesignExample(t *testing.T) {
	c, err := Parse("/etc/airlock/airlockd.yaml", []byte(`
api_listen: 127.0.0.1:7433       # or unix:/run/airlock/api.sock
state_dir: /var/lib/airlock
upstream_dns: ["203.0.113.53:53"]
upstream_ca_file: ""
fake_ip_pool: 198.18.0.0/15
sandboxes:
  - name: default
    policy: /var/lib/airlock/sandboxes/default.yaml
    subnet: 10.88.0.0/24
  - name: myapp
    policy: app.yaml
    subnet: 10.88.1.0/24
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Sandboxes[1].Policy != "/etc/airlock/app.yaml" {
		t.Errorf("relative policy path = %q, want it relative to the config file", c.Sandboxes[1].Policy)
	}
	if c.LeaseDir("myapp") != "/run/airlock/leases/myapp" {
		t.Errorf("LeaseDir = %q", c.LeaseDir("myapp"))
	}
}

func TestParseErrors(t *testing.T) {
	const sb = "\nsandboxes:\n  - name: a\n    subnet: 10.88.0.0/24\n"
	tests := []struct{ name, yaml, want string }{
		{"unknown key", "api_listn: 127.0.0.1:1" + sb, "field api_listn not found"},
		{"public api", "api_listen: 0.0.0.0:7433" + sb, "not a loopback address"},
		{"api garbage", "api_listen: localhost" + sb, "want 127.0.0.1:PORT"},
		{"relative unix", "api_listen: unix:api.sock" + sb, "must be absolute"},
		{"relative state", "state_dir: state" + sb, "absolute path"},
		{"bad pool", "fake_ip_pool: 198.18.0.0/28" + sb, "fake_ip_pool"},
		{"proxy port 53", "proxy_port: 53" + sb, "proxy_port"},
		{"no sandboxes", "state_dir: /x\n", "no sandboxes"},
		{"bad name", "sandboxes:\n  - name: My_App\n    subnet: 10.88.0.0/24\n", "sandbox name"},
		{"dup name", "sandboxes:\n  - {name: a, subnet: 10.88.0.0/24}\n  - {name: a, subnet: 10.88.1.0/24}\n", "twice"},
		{"host bits", "sandboxes:\n  - {name: a, subnet: 10.88.0.1/24}\n", "did you mean 10.88.0.0/24"},
		{"v6 subnet", "sandboxes:\n  - {name: a, subnet: 'fd00::/64'}\n", "IPv4 prefix"},
		{"tiny subnet", "sandboxes:\n  - {name: a, subnet: 10.88.0.0/30}\n", "/16 to /29"},
		{"overlap", "sandboxes:\n  - {name: a, subnet: 10.88.0.0/24}\n  - {name: b, subnet: 10.88.0.128/25}\n", "overlaps sandboxes[0]"},
		{"overlap pool", "sandboxes:\n  - {name: a, subnet: 198.18.0.0/24}\n", "overlaps fake_ip_pool"},
		{"yaml syntax", "sandboxes: [", "config x.yaml"},
		{"wrong type", "proxy_port: many" + sb, "cannot unmarshal"},
		{"poll zero", "policy_poll_seconds: 0" + sb, "policy_poll_seconds 0: want 0.1 to 3600 seconds"},
		{"poll nan", "policy_poll_seconds: .nan" + sb, "policy_poll_seconds"},
		{"drain negative", "drain_seconds: -1" + sb, "drain_seconds -1: want 0 to 600 seconds"},
		{"drain words", "drain_seconds: long" + sb, "cannot unmarshal"},
		{"log_allowed words", "log_allowed: sometimes" + sb, "cannot unmarshal"},
		{"expose with a port", "expose_listen: 127.0.0.1:8080" + sb, `expose_listen: "127.0.0.1:8080": want an IP address`},
		{"expose by name", "expose_listen: localhost" + sb, "want an IP address"},
		{"expose on a gateway", "expose_listen: 10.88.0.1" + sb, "expose_listen: 10.88.0.1 is in sandbox a's subnet 10.88.0.0/24"},
		{"expose in the pool", "expose_listen: 198.18.0.9" + sb, "fake_ip_pool"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("x.yaml", []byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestDefaultLimits(t *testing.T) {
	for _, tc := range []struct {
		name      string
		set       Limits
		nofile    uint64
		sandboxes int
		want      Limits
	}{
		{"the unit's limit", Limits{}, 1 << 20, 1, Limits{MemberConnections: 65472, SandboxConnections: 130944, MemberHeld: 32, SandboxHeld: 128}},
		{"many sandboxes share it", Limits{}, 1 << 20, 16, Limits{MemberConnections: 16368, SandboxConnections: 32736, MemberHeld: 32, SandboxHeld: 128}},
		{"a container's 20,000", Limits{}, 20000, 1, Limits{MemberConnections: 1186, SandboxConnections: 2372, MemberHeld: 32, SandboxHeld: 128}},
		{"a tiny limit keeps a floor", Limits{}, 1024, 1, Limits{MemberConnections: 8, SandboxConnections: 16, MemberHeld: 32, SandboxHeld: 128}},
		{"set values stay", Limits{MemberConnections: 5, SandboxHeld: 7}, 1 << 20, 1, Limits{MemberConnections: 5, SandboxConnections: 130944, MemberHeld: 32, SandboxHeld: 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := DefaultLimits(tc.set, tc.nofile, tc.sandboxes)
			if got != tc.want {
				t.Errorf("DefaultLimits = %+v, want %+v", got, tc.want)
			}
			// Every sandbox at its limit fits beside the others.
			if tc.set == (Limits{}) && tc.nofile > 2*reservedFDs && uint64(got.SandboxConnections*fdsPerConn*max(tc.sandboxes, sandboxShares)+reservedFDs) > tc.nofile {
				t.Errorf("%d sandboxes of %d connections do not fit in %d descriptors", max(tc.sandboxes, sandboxShares), got.SandboxConnections, tc.nofile)
			}
		})
	}
}

func TestMemberReadOnly(t *testing.T) {
	tests := []struct {
		name             string
		cfg              Config
		wantFiles, wantD []string
	}{
		{"built-in config", Config{}, []string{"/p/a.yaml"}, nil},
		{"config file and upstream CA", Config{Path: "/etc/airlock/airlockd.yaml", UpstreamCAFile: "/etc/ca.pem"},
			[]string{"/p/a.yaml", "/etc/airlock/airlockd.yaml", "/etc/ca.pem"}, []string{"/etc/airlock"}},
		{"config file in /", Config{Path: "/airlockd.yaml"}, []string{"/p/a.yaml", "/airlockd.yaml"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			policies := []string{"/p/a.yaml"}
			files, dirs := tt.cfg.MemberReadOnly(policies)
			if diff := cmp.Diff(tt.wantFiles, files); diff != "" {
				t.Errorf("files (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantD, dirs); diff != "" {
				t.Errorf("dirs (-want +got):\n%s", diff)
			}
			if len(policies) != 1 {
				t.Errorf("the caller's policies changed: %v", policies)
			}
		})
	}
}
