package policy

import (
	"golang.org/x/net/publicsuffix"
)

// Suggestion is a pattern offered to a person approving an unknown host.
type Suggestion struct {
	Pattern string `json:"pattern"`
	// Label says in words what the pattern allows, for the approval dialog.
	Label string `json:"label"`
}

// Suggest returns the patterns the approval dialog offers for host, narrowest
// first: the host, the host with any path, every subdomain of its registrable
// domain, and the same with any path. The registrable domain comes from the
// public suffix list, private section included, so a host under github.io or
// googleapis.com is offered its own subtree rather than everyone's. A raw IP
// is offered its /32, and a host that is itself a public suffix only itself.
func Suggest(host string) ([]Suggestion, error) {
	h, err := NormalizeHost(host)
	if err != nil {
		return nil, err
	}
	if isIPLiteral(h) {
		if !isIPv4(h) {
			return nil, ErrNotAName
		}
		return []Suggestion{{Pattern: "cidr:" + h + "/32", Label: "only this IP address"}}, nil
	}
	out := []Suggestion{
		{Pattern: h, Label: "only " + h},
		{Pattern: h + "/*", Label: "any path on " + h},
	}
	reg, err := publicsuffix.EffectiveTLDPlusOne(h)
	if err != nil || isPublicSuffix(reg) || ChildrenArePublicSuffixes(reg) {
		return out, nil
	}
	return append(out,
		Suggestion{Pattern: "*." + reg, Label: "every subdomain of " + reg + " (not " + reg + " itself)"},
		Suggestion{Pattern: "*." + reg + "/*", Label: "every subdomain of " + reg + ", any path"},
	), nil
}

func isIPv4(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			return false
		}
	}
	return true
}
