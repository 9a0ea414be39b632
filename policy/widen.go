package policy

import (
	"fmt"
	"slices"
	"time"
)

// Widens lists, in words a person reads, how the policy next would give
// sandbox members more than the policy old does; nil means next only
// restricts, or changes nothing that matters to security. Both must be
// non-nil.
//
// It counts: enabled turned on; unknown_action moving up the order
// deny < ask < learn < allow; learn_until moved later (or dropped, so the
// default hour starts again) while learning; a preset turned on; inspect
// going from all to needed; allow_ech turned on; an allow rule
// (auto or user, compared by pattern and member) in next and not in old; a
// deny rule in old and not in next; an MCP server added, its trust raised
// (user_added < verified < builtin), or its image or command changed;
// sessions turned on, or their image, command, env or user changed;
// resources.bandwidth_mbps raised or lifted (a member that can write the
// file must not lift its own cap unattended).
// Everything else (approval_timeout, the other resources, sources and
// times of rules, order, comments) is not counted.
func Widens(old, next *Spec) []string {
	var out []string
	if !old.Enabled && next.Enabled {
		out = append(out, "enabled: false → true")
	}
	if actionRank(next.UnknownAction) > actionRank(old.UnknownAction) {
		out = append(out, fmt.Sprintf("unknown_action: %s → %s", old.UnknownAction, next.UnknownAction))
	}
	if old.UnknownAction == ActionLearn && next.UnknownAction == ActionLearn && !next.LearnUntil.Equal(old.LearnUntil) &&
		(next.LearnUntil.IsZero() || next.LearnUntil.After(old.LearnUntil)) {
		out = append(out, fmt.Sprintf("learn_until: %s → %s", learnEnd(old.LearnUntil), learnEnd(next.LearnUntil)))
	}
	for _, p := range next.Presets {
		if !slices.Contains(old.Presets, p) {
			out = append(out, "preset turned on: "+p)
		}
	}
	if old.Inspect == InspectAll && next.Inspect != InspectAll {
		out = append(out, fmt.Sprintf("inspect: %s → %s", old.Inspect, next.Inspect))
	}
	if !old.AllowECH && next.AllowECH {
		out = append(out, "allow_ech: false → true")
	}
	had := ruleKeys(old.Auto, old.User)
	for _, r := range slices.Concat(next.Auto, next.User) {
		if k := ruleKey(r); !had[k] {
			had[k] = true // once, when both tiers name it
			out = append(out, "allow rule added: "+describeRule(r))
		}
	}
	keeps := ruleKeys(next.Deny)
	for _, r := range old.Deny {
		if k := ruleKey(r); !keeps[k] {
			keeps[k] = true
			out = append(out, "deny rule removed: "+describeRule(r))
		}
	}
	for _, m := range next.MCPServers {
		i := slices.IndexFunc(old.MCPServers, func(o MCPServer) bool { return o.Source() == m.Source() })
		if i < 0 {
			out = append(out, "MCP server added: "+m.Name)
			continue
		}
		o := old.MCPServers[i]
		if trustRank(m.Trust) > trustRank(o.Trust) {
			out = append(out, fmt.Sprintf("MCP server %s: trust %s → %s", m.Name, o.Trust, m.Trust))
		}
		if m.Image != o.Image {
			out = append(out, fmt.Sprintf("MCP server %s: image %q → %q", m.Name, o.Image, m.Image))
		}
		if !slices.Equal(m.Command, o.Command) {
			out = append(out, fmt.Sprintf("MCP server %s: command %q → %q", m.Name, o.Command, m.Command))
		}
	}
	if o, n := old.Resources.BandwidthMbps, next.Resources.BandwidthMbps; o != 0 && (n == 0 || n > o) {
		out = append(out, fmt.Sprintf("resources.bandwidth_mbps: %d → %s", o, bandwidthText(n)))
	}
	return append(out, sessionsWiden(old.Sessions, next.Sessions)...)
}

// bandwidthText names a bandwidth_mbps value in a widening message.
func bandwidthText(mbps int) string {
	if mbps == 0 {
		return "unlimited"
	}
	return fmt.Sprint(mbps)
}

// actionRank orders unknown actions by how much they let through.
func actionRank(a Action) int {
	switch a {
	case ActionDeny:
		return 0
	case ActionAsk:
		return 1
	case ActionLearn:
		return 2
	case ActionAllow:
		return 3
	}
	return 4 // unknown: treat as the widest, so a change to it is asked about
}

// learnEnd names learn_until in a widening message.
func learnEnd(t time.Time) string {
	if t.IsZero() {
		return "(an hour from when it is put in force)"
	}
	return t.UTC().Format(time.RFC3339)
}

// trustRank orders trust levels by how much a member reaches.
func trustRank(t Trust) int {
	switch t {
	case TrustUserAdded:
		return 0
	case TrustVerified:
		return 1
	case TrustBuiltin:
		return 2
	}
	return 3
}

type ruleIdent struct{ pattern, member string }

func ruleKey(r *Rule) ruleIdent { return ruleIdent{r.Pattern.String(), r.Member} }

func ruleKeys(lists ...[]*Rule) map[ruleIdent]bool {
	m := map[ruleIdent]bool{}
	for _, l := range lists {
		for _, r := range l {
			m[ruleKey(r)] = true
		}
	}
	return m
}

func describeRule(r *Rule) string {
	if r.Member != "" {
		return r.Pattern.String() + " (member " + r.Member + ")"
	}
	return r.Pattern.String()
}
