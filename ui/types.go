package ui

import (
	"time"

	"github.com/airlockhq/airlock/policy"
)

// The API's JSON types: the server writes them, and the Go client and the
// CLI read them (airlock --json prints them as they are).

// SandboxView is a sandbox as GET /sandboxes and GET /sandboxes/{sb} show it.
type SandboxView struct {
	Name            string `json:"name"`
	Subnet          string `json:"subnet"`
	Policy          string `json:"policy"`
	Enabled         bool   `json:"enabled"`
	UnknownAction   string `json:"unknown_action"`
	ApprovalTimeout int    `json:"approval_timeout"`
	Inspect         string `json:"inspect"`
	// LearnUntil is when learn mode ends, while the sandbox learns.
	LearnUntil *time.Time `json:"learn_until,omitempty"`
	Presets    []string   `json:"presets"`
	Rules      int        `json:"rules"`
	Pending    int        `json:"pending"`
	MCPServers []MCPView  `json:"mcp_servers"`
}

// MCPView is one of a sandbox's MCP servers and what it reaches.
type MCPView struct {
	Name      string   `json:"name"`
	Transport string   `json:"transport"`
	Known     bool     `json:"known"`
	Network   string   `json:"network"` // none, domains, any-url, unknown
	Domains   []string `json:"domains"`
	Risk      string   `json:"risk"` // none, low, medium, high, unknown
}

// RuleView is an allow or deny rule as the allowlist and denylist show it.
type RuleView struct {
	ID      string     `json:"id"`
	Pattern string     `json:"pattern"`
	Type    string     `json:"type"` // policy.Pattern.Form: exact, wildcard, path, wildcard-path, method, regex, cidr, any
	Tier    string     `json:"tier"` // auto, preset, user, session
	List    string     `json:"list"`
	Source  string     `json:"source,omitempty"` // "preset:NAME" for a preset's rules
	Member  string     `json:"member,omitempty"`
	Added   *time.Time `json:"added,omitempty"`
	Forced  bool       `json:"forced,omitempty"`
	LLM     bool       `json:"llm,omitempty"` // the pattern names a known LLM API
}

// PresetView is a preset as GET /presets lists it.
type PresetView struct {
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Entries     []PresetEntryView `json:"entries"`
	Includes    []string          `json:"includes"`
	// Patterns are the rules the preset brings, includes too.
	Patterns []string `json:"patterns"`
}

// PresetEntryView is one host of a preset.
type PresetEntryView struct {
	Host     string   `json:"host"`
	Patterns []string `json:"patterns"`
	Why      string   `json:"why"`
}

// AddRuleBody is the body of POST …/allowlist and …/denylist.
type AddRuleBody struct {
	Pattern string `json:"pattern"`
	Persist bool   `json:"persist"`
	Force   bool   `json:"force"`
	Member  string `json:"member"`
	Source  string `json:"source"`
}

// TestBody is the body of POST …/allowlist/test.
type TestBody struct {
	Pattern string   `json:"pattern"`
	URLs    []string `json:"urls"`
	Force   bool     `json:"force"`
}

// TestResult answers POST …/allowlist/test.
type TestResult struct {
	URL     string `json:"url"`
	Matches bool   `json:"matches"`
	Error   string `json:"error,omitempty"`
}

// ApprovalView is a pending approval as GET …/approvals lists it.
type ApprovalView struct {
	ID          string              `json:"id"`
	Sandbox     string              `json:"sandbox"`
	Source      string              `json:"source"`
	Sources     []string            `json:"sources"`
	Host        string              `json:"host"`
	Port        uint16              `json:"port"`
	Method      string              `json:"method,omitempty"`
	URL         string              `json:"url"`
	Created     time.Time           `json:"created"`
	SecondsLeft float64             `json:"seconds_left"`
	Waiting     int                 `json:"waiting"`
	Suggestions []policy.Suggestion `json:"suggestions"`
	Headers     map[string][]string `json:"headers,omitempty"`
	LLM         bool                `json:"llm"`
	Agent       string              `json:"agent,omitempty"` // the agent driving Source, when known
	// Kind is network (held traffic, or a member's request for a URL),
	// port or resources.
	Kind string `json:"kind"`
	// Requested says the member asked through the member API; Reason is
	// its own words.
	Requested bool   `json:"requested,omitempty"`
	Reason    string `json:"reason,omitempty"`
	// MemoryMB, CPUs and Pids are what a resources request asks for.
	MemoryMB int     `json:"memory_mb,omitempty"`
	CPUs     float64 `json:"cpus,omitempty"`
	Pids     int     `json:"pids,omitempty"`
	// Listen is, for a port request, the host address an allowed one
	// listens on (expose_listen); "" when this airlockd cannot open ports.
	Listen string `json:"listen,omitempty"`
	// Actions are the actions POST …/approvals/{id} takes for it.
	Actions []string `json:"actions"`
}

// DecideBody is the body of POST …/approvals/{id}.
type DecideBody struct {
	Action  string `json:"action"`
	Pattern string `json:"pattern"`
	Persist bool   `json:"persist"`
	Force   bool   `json:"force"`
}

// SettingsView answers GET and PATCH …/settings.
type SettingsView struct {
	UnknownAction string `json:"unknown_action"`
	// LearnUntil is when learn mode ends (unknown_action learn); it asks
	// from then on.
	LearnUntil      *time.Time `json:"learn_until,omitempty"`
	ApprovalTimeout int        `json:"approval_timeout"` // seconds
	Presets         []string   `json:"presets"`
	AllowECH        bool       `json:"allow_ech"` // read-only here: set in the policy file
}

// SettingsPatch is the body of PATCH …/settings: a field left out stays as
// it is.
type SettingsPatch struct {
	UnknownAction   *string `json:"unknown_action,omitempty"`
	ApprovalTimeout *int64  `json:"approval_timeout,omitempty"`
	// LearnUntil is an RFC 3339 time or a duration from now ("2h"); with
	// unknown_action learn and no learn_until, an hour from now.
	LearnUntil *string   `json:"learn_until,omitempty"`
	Presets    *[]string `json:"presets,omitempty"`
}
