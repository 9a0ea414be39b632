// Package config reads airlockd's configuration file (docs/design.md §7.1): where
// the API listens, where state lives, the upstream DNS servers, the fake-IP
// pool and the sandboxes.
package config

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/airlockhq/airlock/policy"
)

// DefaultPath is where airlockd looks for its config file.
const DefaultPath = "/etc/airlock/airlockd.yaml"

//go:embed default.yaml
var defaultYAML []byte

// Default returns the built-in configuration: API on 127.0.0.1:7433, state
// in /var/lib/airlock, the host's resolvers upstream, and one sandbox
// "default" on 10.88.0.0/24.
func Default() *Config {
	c, err := Parse("(built-in)", defaultYAML)
	if err != nil {
		panic("built-in config: " + err.Error())
	}
	return c
}

// DefaultYAML returns the text of the built-in configuration.
func DefaultYAML() []byte { return bytes.Clone(defaultYAML) }

// Config is airlockd's configuration.
type Config struct {
	// Path is the file the config was read from.
	Path string
	// APIListen is "host:port" on loopback or "unix:/path".
	APIListen string
	// StateDir holds CA keys, the API token, audit logs and the policy files
	// of sandboxes made through the API.
	StateDir string
	// RunDir holds runtime state: member leases.
	RunDir string
	// UpstreamDNS is "system" (the host's resolv.conf) or IP[:port] entries.
	UpstreamDNS []string
	// UpstreamCAFile holds extra roots for upstream TLS; "" means none.
	UpstreamCAFile string
	FakeIPPool     netip.Prefix
	// ProxyPort is the proxy's port on every sandbox gateway.
	ProxyPort uint16
	Exfil     Exfil
	// LogAllowed logs allowed connections, requests and DNS answers at
	// info; false (the default) logs them at debug, so only refusals,
	// approvals and changes show.
	LogAllowed bool
	// PolicyPoll is how often each sandbox's policy file is checked for
	// changes (size, modification time, content hash). Default 2 s.
	PolicyPoll time.Duration
	// Drain is how long a stopping airlockd lets open connections finish
	// before it closes them. Default 5 s.
	Drain time.Duration
	// Limits bound what one member and one sandbox may hold open; zero
	// fields take DefaultLimits.
	Limits Limits
	// ExposeListen is the address exposures listen on (a host port
	// forwarded to a member's port, docs/design.md §6.2). Default
	// 127.0.0.1: only the host itself reaches them. Another address is
	// the config's explicit choice; none inside a sandbox subnet or the
	// fake-IP pool.
	ExposeListen netip.Addr
	Sandboxes    []Sandbox
}

// Limits bound the connections and held approvals of one member and of one
// sandbox, so that neither can take what the others need (docs/design.md
// §8, invariant 17). Zero means the default.
type Limits struct {
	MemberConnections  int `yaml:"member_connections"`
	SandboxConnections int `yaml:"sandbox_connections"`
	MemberHeld         int `yaml:"member_held"`
	SandboxHeld        int `yaml:"sandbox_held"`
}

// Limits' defaults beyond the connection counts, and what the connection
// defaults leave to airlockd itself.
const (
	DefaultMemberHeld  = 32
	DefaultSandboxHeld = 128
	// reservedFDs are kept for airlockd itself: the API and its clients,
	// the gates' sockets, upstream DNS, logs, leases, netlink.
	reservedFDs = 1024
	// fdsPerConn is what a proxied connection holds: the client's socket
	// and the upstream's (splice pipes and interception's idle upstream
	// connections are pooled, and bounded apart).
	fdsPerConn = 2
	// sandboxShares is how many sandboxes the descriptors are shared
	// among, at least: API-made sandboxes come and go after the limits are
	// set.
	sandboxShares = 4
)

// DefaultLimits fills the zero fields of l from the process's descriptor
// limit nofile and the number of configured sandboxes: what is left after
// reservedFDs is split into max(sandboxes, 4) equal shares of fdsPerConn
// descriptors per connection, so that every sandbox at its limit still
// fits beside the others; a member may take half of its sandbox's share.
// With LimitNOFILE=1048576 (the unit's) that is 130,944 connections a
// sandbox and 65,472 a member.
func DefaultLimits(l Limits, nofile uint64, sandboxes int) Limits {
	shares := max(sandboxes, sandboxShares)
	usable := int64(nofile) - reservedFDs
	perSandbox := int(max(usable/int64(shares*fdsPerConn), 16))
	if l.SandboxConnections == 0 {
		l.SandboxConnections = perSandbox
	}
	if l.MemberConnections == 0 {
		l.MemberConnections = max(l.SandboxConnections/2, 8)
	}
	if l.MemberHeld == 0 {
		l.MemberHeld = DefaultMemberHeld
	}
	if l.SandboxHeld == 0 {
		l.SandboxHeld = DefaultSandboxHeld
	}
	return l
}

// Exfil tunes the DNS exfiltration guard; zero values take dnsgate's
// defaults.
type Exfil struct {
	MaxLabelLen            int  `yaml:"max_label_len"`
	MaxSubdomainsPerMinute int  `yaml:"max_subdomains_per_minute"`
	AlertOnly              bool `yaml:"alert_only"`
}

// Sandbox is one configured sandbox.
type Sandbox struct {
	Name   string
	Policy string // the policy file, absolute
	Subnet netip.Prefix
	// Presets are the presets (comma-separated, checked) a policy file
	// airlockd creates for the sandbox starts with, when it does not exist
	// yet; "" means none. A string keeps Sandbox comparable.
	Presets string
}

// LeaseDir returns the directory of a sandbox's member leases.
func (c *Config) LeaseDir(sandbox string) string {
	return filepath.Join(c.RunDir, "leases", sandbox)
}

// MemberReadOnly returns what a member started on this host must not be
// able to change (design §8, invariant 15): the policy files, the config
// file and upstream_ca_file, bound read-only onto themselves, and the
// config file's directory (unless it is /), bound read-only with what lies
// below it.
func (c *Config) MemberReadOnly(policies []string) (files, dirs []string) {
	files = slices.Clone(policies)
	if c.Path != "" {
		files = append(files, c.Path)
		if dir := filepath.Dir(c.Path); dir != "/" {
			dirs = append(dirs, dir)
		}
	}
	if c.UpstreamCAFile != "" {
		files = append(files, c.UpstreamCAFile)
	}
	return files, dirs
}

type fileConfig struct {
	APIListen      string        `yaml:"api_listen"`
	StateDir       string        `yaml:"state_dir"`
	RunDir         string        `yaml:"run_dir"`
	UpstreamDNS    []string      `yaml:"upstream_dns"`
	UpstreamCAFile string        `yaml:"upstream_ca_file"`
	FakeIPPool     string        `yaml:"fake_ip_pool"`
	ProxyPort      int           `yaml:"proxy_port"`
	Exfil          Exfil         `yaml:"exfil"`
	LogAllowed     bool          `yaml:"log_allowed"`
	PolicyPoll     *float64      `yaml:"policy_poll_seconds"`
	Drain          *float64      `yaml:"drain_seconds"`
	Limits         Limits        `yaml:"limits"`
	ExposeListen   string        `yaml:"expose_listen"`
	Sandboxes      []fileSandbox `yaml:"sandboxes"`
}

type fileSandbox struct {
	Name    string   `yaml:"name"`
	Policy  string   `yaml:"policy"`
	Subnet  string   `yaml:"subnet"`
	Presets []string `yaml:"presets"`
}

// Load reads a config file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	return Parse(abs, data)
}

// Parse reads a config from data; name is the file's path, for messages and
// for relative paths inside it.
func Parse(name string, data []byte) (*Config, error) {
	var fc fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("config %s: %w", name, err)
	}
	c := &Config{
		Path:           name,
		APIListen:      or(fc.APIListen, "127.0.0.1:7433"),
		StateDir:       or(fc.StateDir, "/var/lib/airlock"),
		RunDir:         or(fc.RunDir, "/run/airlock"),
		UpstreamDNS:    fc.UpstreamDNS,
		UpstreamCAFile: fc.UpstreamCAFile,
		Exfil:          fc.Exfil,
		Limits:         fc.Limits,
		LogAllowed:     fc.LogAllowed,
	}
	if len(c.UpstreamDNS) == 0 {
		c.UpstreamDNS = []string{"system"}
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("config %s: "+format, append([]any{name}, a...)...)
	}
	if err := checkAPIListen(c.APIListen); err != nil {
		return nil, bad("api_listen: %v", err)
	}
	for _, d := range []struct{ key, dir string }{{"state_dir", c.StateDir}, {"run_dir", c.RunDir}} {
		if !filepath.IsAbs(d.dir) {
			return nil, bad("%s %q must be an absolute path", d.key, d.dir)
		}
	}
	pool, err := netip.ParsePrefix(or(fc.FakeIPPool, "198.18.0.0/15"))
	if err != nil || !pool.Addr().Is4() || pool.Bits() > 24 || pool.Masked() != pool {
		return nil, bad("fake_ip_pool %q: want an IPv4 prefix of /24 or larger, such as 198.18.0.0/15", fc.FakeIPPool)
	}
	c.FakeIPPool = pool
	switch {
	case fc.ProxyPort == 0:
		c.ProxyPort = 15001
	case fc.ProxyPort < 1 || fc.ProxyPort > 65535 || fc.ProxyPort == 53:
		return nil, bad("proxy_port %d: want 1 to 65535, not 53", fc.ProxyPort)
	default:
		c.ProxyPort = uint16(fc.ProxyPort)
	}
	if l := c.Limits; l.MemberConnections < 0 || l.SandboxConnections < 0 || l.MemberHeld < 0 || l.SandboxHeld < 0 {
		return nil, bad("limits: member_connections, sandbox_connections, member_held and sandbox_held want a positive number, or 0 for the default")
	}
	if c.Exfil.MaxLabelLen < 0 || c.Exfil.MaxLabelLen > 63 || c.Exfil.MaxSubdomainsPerMinute < 0 {
		return nil, bad("exfil: max_label_len wants 1 to 63, max_subdomains_per_minute a positive number")
	}
	for _, d := range []struct {
		key      string
		v        *float64
		def      float64
		min, max float64
		out      *time.Duration
	}{
		{"policy_poll_seconds", fc.PolicyPoll, 2, 0.1, 3600, &c.PolicyPoll},
		{"drain_seconds", fc.Drain, 5, 0, 600, &c.Drain},
	} {
		v := d.def
		if d.v != nil {
			v = *d.v
		}
		if math.IsNaN(v) || v < d.min || v > d.max {
			return nil, bad("%s %v: want %v to %v seconds", d.key, v, d.min, d.max)
		}
		*d.out = time.Duration(v * float64(time.Second))
	}
	if len(fc.Sandboxes) == 0 {
		return nil, bad("no sandboxes; add one under sandboxes: (name, subnet)")
	}
	for i, s := range fc.Sandboxes {
		sb, err := c.NewSandbox(s.Name, s.Policy, s.Subnet, filepath.Dir(name))
		if err != nil {
			return nil, bad("sandboxes[%d]: %v", i, err)
		}
		presets, err := policy.CheckPresets(s.Presets)
		if err != nil {
			return nil, bad("sandboxes[%d].presets: %v", i, err)
		}
		sb.Presets = strings.Join(presets, ",")
		c.Sandboxes = append(c.Sandboxes, sb)
	}
	if c.ExposeListen, err = c.exposeListen(fc.ExposeListen); err != nil {
		return nil, bad("expose_listen: %v", err)
	}
	return c, nil
}

// exposeListen checks the address exposures listen on; "" means 127.0.0.1.
// A loopback address keeps them to the host's own processes; another one
// opens them to whatever reaches that address, which the config must say.
// Members never reach them: nothing of a sandbox subnet or the fake pool.
func (c *Config) exposeListen(s string) (netip.Addr, error) {
	if s == "" {
		return netip.AddrFrom4([4]byte{127, 0, 0, 1}), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q: want an IP address such as 127.0.0.1 (the port is chosen per exposure)", s)
	}
	a = a.Unmap()
	if c.FakeIPPool.Contains(a) {
		return netip.Addr{}, fmt.Errorf("%s is in fake_ip_pool %s", a, c.FakeIPPool)
	}
	for _, sb := range c.Sandboxes {
		if sb.Subnet.Contains(a) {
			return netip.Addr{}, fmt.Errorf("%s is in sandbox %s's subnet %s; exposures are for the host, never for members", a, sb.Name, sb.Subnet)
		}
	}
	return a, nil
}

// NewSandbox checks a sandbox against the config and the sandboxes already
// in it (name free, subnet free and outside the fake-IP pool) and returns
// it. A relative policy path is taken relative to dir; an empty one means
// STATE_DIR/sandboxes/NAME.yaml.
func (c *Config) NewSandbox(name, policyPath, subnet, dir string) (Sandbox, error) {
	if err := policy.ValidName(name); err != nil {
		return Sandbox{}, err
	}
	for _, o := range c.Sandboxes {
		if o.Name == name {
			return Sandbox{}, fmt.Errorf("sandbox %q twice", name)
		}
	}
	p, err := netip.ParsePrefix(subnet)
	switch {
	case err != nil || !p.Addr().Is4():
		return Sandbox{}, fmt.Errorf("subnet %q: want an IPv4 prefix such as 10.88.0.0/24", subnet)
	case p.Masked() != p:
		return Sandbox{}, fmt.Errorf("subnet %s has host bits set; did you mean %s?", p, p.Masked())
	case p.Bits() > 29 || p.Bits() < 16:
		return Sandbox{}, fmt.Errorf("subnet %s: want a size from /16 to /29", p)
	case p.Overlaps(c.FakeIPPool):
		return Sandbox{}, fmt.Errorf("subnet %s overlaps fake_ip_pool %s", p, c.FakeIPPool)
	}
	for j, o := range c.Sandboxes {
		if o.Subnet.Overlaps(p) {
			return Sandbox{}, fmt.Errorf("subnet %s overlaps sandboxes[%d] (%s, %s)", p, j, o.Name, o.Subnet)
		}
	}
	switch {
	case policyPath == "":
		policyPath = filepath.Join(c.StateDir, "sandboxes", name+".yaml")
	case !filepath.IsAbs(policyPath):
		policyPath = filepath.Join(dir, policyPath)
	}
	return Sandbox{Name: name, Policy: filepath.Clean(policyPath), Subnet: p}, nil
}

func checkAPIListen(s string) error {
	if path, ok := strings.CutPrefix(s, "unix:"); ok {
		if !filepath.IsAbs(path) {
			return fmt.Errorf("%q: a unix socket path must be absolute", s)
		}
		return nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return fmt.Errorf("%q: want 127.0.0.1:PORT or unix:/path", s)
	}
	if !ap.Addr().IsLoopback() {
		return fmt.Errorf("%q is not a loopback address; the API must never be reachable from a sandbox or the network", s)
	}
	return nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// APISandboxesFile is where airlockd remembers the sandboxes made through
// its API, in the state directory.
func APISandboxesFile(stateDir string) string { return filepath.Join(stateDir, "sandboxes.json") }

type savedSandbox struct {
	Name   string `json:"name"`
	Policy string `json:"policy"`
	Subnet string `json:"subnet"`
}

// LoadAPISandboxes reads the sandboxes made through the API; a missing file
// means none.
func LoadAPISandboxes(stateDir string) ([]Sandbox, error) {
	path := APISandboxesFile(stateDir)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var saved []savedSandbox
	if err := json.Unmarshal(b, &saved); err != nil {
		return nil, fmt.Errorf("%s: %w; fix or remove it", path, err)
	}
	var out []Sandbox
	for _, s := range saved {
		p, err := netip.ParsePrefix(s.Subnet)
		if err != nil {
			return nil, fmt.Errorf("%s: sandbox %s: %w", path, s.Name, err)
		}
		out = append(out, Sandbox{Name: s.Name, Policy: s.Policy, Subnet: p})
	}
	return out, nil
}

// SaveAPISandboxes replaces the file of sandboxes made through the API
// (0600, written to a temporary file and renamed).
func SaveAPISandboxes(stateDir string, sbs []Sandbox) error {
	saved := []savedSandbox{}
	for _, s := range sbs {
		saved = append(saved, savedSandbox{Name: s.Name, Policy: s.Policy, Subnet: s.Subnet.String()})
	}
	b, _ := json.MarshalIndent(saved, "", "  ")
	path := APISandboxesFile(stateDir)
	if err := os.WriteFile(path+".tmp", append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
