package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
)

// List says which list a rule belongs to.
type List uint8

const (
	// Allowlist rules let matching traffic through.
	Allowlist List = iota + 1
	// Denylist rules block matching traffic; they win over every allow rule.
	Denylist
)

func (l List) String() string {
	switch l {
	case Allowlist:
		return "allowlist"
	case Denylist:
		return "denylist"
	}
	return fmt.Sprintf("List(%d)", uint8(l))
}

// Tier says who manages a rule and whether it is written to the policy file.
type Tier uint8

const (
	// Auto rules are managed by airlock (LLM providers, known MCP servers'
	// domains) and are read-only for users.
	Auto Tier = iota + 1
	// User rules live in the policy file.
	User
	// Session rules live in memory only and vanish when airlockd stops.
	Session
	// FromPreset rules come from the presets the policy file turns on
	// (presets: [python]); they are read-only, like auto rules.
	FromPreset
)

func (t Tier) String() string {
	switch t {
	case Auto:
		return "auto"
	case User:
		return "user"
	case Session:
		return "session"
	case FromPreset:
		return "preset"
	}
	return fmt.Sprintf("Tier(%d)", uint8(t))
}

// Rule is one entry of an allowlist or a denylist.
type Rule struct {
	// ID identifies the rule for deletion. It is derived from the list, the
	// canonical pattern and the member, so it is stable across reloads and
	// identical for the same rule added twice.
	ID      string
	Pattern Pattern
	List    List
	Tier    Tier
	// Member, when set, restricts the rule to requests from that sandbox
	// member (a source label such as "mcp:github" or a container name).
	Member string
	// Source says where the rule came from ("approved during run",
	// "manually added", "mcp:github"). It is shown, never matched.
	Source string
	// Added is when the rule was added; zero when unknown.
	Added time.Time
	// Forced records that a broad pattern was accepted on purpose. It must
	// be true for a broad allow rule to be saved (AddRule refuses it
	// otherwise) and is written to the policy file as force: true.
	Forced bool
}

// RuleID returns the stable identifier of a rule with this list, pattern and
// member.
func RuleID(l List, p Pattern, member string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d\x00%s\x00%s", l, p.String(), member)
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// NewRule builds a rule and fills in its ID.
func NewRule(l List, t Tier, p Pattern, member, source string, added time.Time) *Rule {
	return &Rule{
		ID:      RuleID(l, p, member),
		Pattern: p,
		List:    l,
		Tier:    t,
		Member:  member,
		Source:  source,
		Added:   added,
	}
}

// String returns the rule as a user reads it in a decision: list, tier and
// pattern.
func (r *Rule) String() string {
	if r == nil {
		return "none"
	}
	s := r.List.String() + "/" + r.Tier.String() + " " + r.Pattern.String()
	if r.Member != "" {
		s += " (member " + r.Member + ")"
	}
	return s
}
