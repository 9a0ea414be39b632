package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Action is what happens to traffic no rule matches.
type Action uint8

const (
	// ActionAsk holds the traffic until a person decides.
	ActionAsk Action = iota + 1
	// ActionDeny refuses it.
	ActionDeny
	// ActionAllow lets it through. It defeats the allowlist; only for
	// learning what an agent needs.
	ActionAllow
	// ActionLearn lets it through and records it as learned until the
	// sandbox's LearnUntil, then asks (ActionAsk): a bounded way to learn
	// what an agent needs and turn it into rules (see Propose).
	ActionLearn
)

// DefaultLearnFor is how long learn mode lasts when learn_until is not
// given: from the moment the mode is set.
const DefaultLearnFor = time.Hour

func (a Action) String() string {
	switch a {
	case ActionAsk:
		return "ask"
	case ActionDeny:
		return "deny"
	case ActionAllow:
		return "allow"
	case ActionLearn:
		return "learn"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// ParseAction reads "ask", "deny", "learn" or "allow".
func ParseAction(s string) (Action, error) {
	switch s {
	case "learn":
		return ActionLearn, nil
	case "ask":
		return ActionAsk, nil
	case "deny":
		return ActionDeny, nil
	case "allow":
		return ActionAllow, nil
	}
	return 0, fmt.Errorf("unknown action %q: want ask, deny, learn or allow", s)
}

// Inspect says which allowed TLS connections the proxy intercepts.
type Inspect uint8

const (
	// InspectNeeded intercepts only hosts that path or method rules apply to.
	InspectNeeded Inspect = iota + 1
	// InspectAll intercepts every TLS connection, to record every request.
	InspectAll
)

func (i Inspect) String() string {
	switch i {
	case InspectNeeded:
		return "needed"
	case InspectAll:
		return "all"
	}
	return fmt.Sprintf("Inspect(%d)", uint8(i))
}

// ParseInspect reads "needed" or "all".
func ParseInspect(s string) (Inspect, error) {
	switch s {
	case "needed":
		return InspectNeeded, nil
	case "all":
		return InspectAll, nil
	}
	return 0, fmt.Errorf("unknown inspect mode %q: want needed or all", s)
}

// MCPServer is an MCP server that runs inside the sandbox.
type MCPServer struct {
	Name      string // a known server's name ("github") or any other
	Transport string // "stdio" or "sse"
	// Image, when set, is the container image airlock starts the server
	// from: as a sidecar for sse, for the agent to spawn for stdio.
	Image   string
	Command []string          // the command in the image; empty: its own
	Env     map[string]string // its environment
	// Trust is builtin, verified or user_added. It defaults to builtin for
	// a known server and user_added for any other. A user_added server
	// reaches only what rules naming it as their member allow.
	Trust Trust
}

// Trust is how far airlock trusts a sandbox member.
type Trust uint8

const (
	// TrustBuiltin is a server airlock knows (see KnownMCPServers).
	TrustBuiltin Trust = iota + 1
	// TrustVerified is a server the user vouches for.
	TrustVerified
	// TrustUserAdded is any other server: it gets no network beyond its
	// sandbox except what rules naming it as member allow.
	TrustUserAdded
)

func (t Trust) String() string {
	switch t {
	case TrustBuiltin:
		return "builtin"
	case TrustVerified:
		return "verified"
	case TrustUserAdded:
		return "user_added"
	}
	return fmt.Sprintf("Trust(%d)", uint8(t))
}

// ParseTrust reads "builtin", "verified" or "user_added".
func ParseTrust(s string) (Trust, error) {
	switch s {
	case "builtin":
		return TrustBuiltin, nil
	case "verified":
		return TrustVerified, nil
	case "user_added":
		return TrustUserAdded, nil
	}
	return 0, fmt.Errorf("unknown trust level %q: want builtin, verified or user_added", s)
}

// Source is the member name of the server's sidecar: "mcp:NAME".
func (m MCPServer) Source() string { return "mcp:" + strings.ToLower(strings.TrimSpace(m.Name)) }

// Limits are the resources of a member airlock starts itself.
type Limits struct {
	MemoryMB int     // megabytes; 0 means the default
	CPUs     float64 // CPUs, fractions allowed; 0 means the default
	Pids     int     // processes and threads; 0 means the default
}

// Resources are the limits of members airlock starts itself, and what
// members may ask for.
type Resources struct {
	Agent      Limits
	MCP        Limits
	RunTimeout time.Duration // how long `airlock run` and launched members may run
	// Bounds are what members may ask for through the member API
	// (resources.bounds); DefaultBounds when the file names none.
	Bounds ResourceBounds
	// BandwidthMbps caps the sandbox's traffic through airlock in each
	// direction, in megabits per second, in the kernel (netns.SetBandwidth);
	// 0 means unlimited.
	BandwidthMbps int
}

// Spec is what a sandbox policy file says, converted and validated: the
// domain model of the "sandbox:" section.
type Spec struct {
	Enabled       bool
	UnknownAction Action
	// LearnUntil ends learn mode (UnknownAction ActionLearn): from then on
	// the sandbox asks. Zero with ActionLearn means DefaultLearnFor after
	// the policy was put in force (see Sandbox).
	LearnUntil      time.Time
	ApprovalTimeout time.Duration // how long a held request waits for a person
	Inspect         Inspect
	// AllowECH lets a ClientHello with encrypted_client_hello be spliced;
	// false (the default) refuses it, since the server would act on a name
	// airlock cannot read.
	AllowECH bool
	// Auto holds the rules airlock manages: the file's network_allowlist.auto
	// entries and the domains of known MCP servers in MCPServers.
	Auto []*Rule
	User []*Rule // network_allowlist.user
	// Presets are the names of the presets the file turns on, checked and
	// lower-cased; Preset holds their rules (tier FromPreset).
	Presets    []string
	Preset     []*Rule
	Deny       []*Rule // network_denylist
	MCPServers []MCPServer
	Resources  Resources
	// Sessions is the sessions: section; nil when the file has none (the
	// sandbox then runs no sessions).
	Sessions *Sessions
}

// Defaults of a policy file's settings.
const (
	DefaultApprovalTimeout = 30 * time.Second
	DefaultRunTimeout      = 300 * time.Second
	DefaultAgentMemoryMB   = 512
	DefaultAgentCPUs       = 1.0
	DefaultMCPMemoryMB     = 256
	DefaultMCPCPUs         = 0.5
	DefaultPids            = 256
	// MaxApprovalTimeout bounds how long a connection may be held.
	MaxApprovalTimeout = 10 * time.Minute
)

// DefaultSpec returns the settings of a policy file that says nothing:
// enabled, ask for unknown destinations, 30 s to decide, intercept only where
// needed, no rules.
func DefaultSpec() *Spec {
	return &Spec{
		Enabled:         true,
		UnknownAction:   ActionAsk,
		ApprovalTimeout: DefaultApprovalTimeout,
		Inspect:         InspectNeeded,
		Resources: Resources{
			Agent:      Limits{MemoryMB: DefaultAgentMemoryMB, CPUs: DefaultAgentCPUs, Pids: DefaultPids},
			MCP:        Limits{MemoryMB: DefaultMCPMemoryMB, CPUs: DefaultMCPCPUs, Pids: DefaultPids},
			RunTimeout: DefaultRunTimeout,
			Bounds:     DefaultBounds(),
		},
	}
}

// Equal reports whether m and o say the same.
func (m MCPServer) Equal(o MCPServer) bool {
	return m.Name == o.Name && m.Transport == o.Transport && m.Image == o.Image &&
		slices.Equal(m.Command, o.Command) && maps.Equal(m.Env, o.Env) && m.Trust == o.Trust
}
