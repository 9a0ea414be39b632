package ui

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/policy"
)

func viewSettings(p *policy.Sandbox) SettingsView {
	spec := p.Spec()
	v := SettingsView{UnknownAction: spec.UnknownAction.String(), ApprovalTimeout: int(spec.ApprovalTimeout / time.Second),
		AllowECH: spec.AllowECH, Presets: presetNames(spec), LearnUntil: learnUntil(p)}
	return v
}

// presetNames are the presets a spec turns on, [] for none.
func presetNames(spec policy.Spec) []string {
	if spec.Presets == nil {
		return []string{}
	}
	return spec.Presets
}

// learnUntil is when the sandbox's learn mode ends, or nil when it is not
// learning (or has stopped: it asks).
func learnUntil(p *policy.Sandbox) *time.Time {
	if t := p.LearnUntil(); !t.IsZero() {
		return &t
	}
	return nil
}

func (s *Server) getSettings(c echo.Context) error {
	return c.JSON(http.StatusOK, viewSettings(sandboxOf(c).Policy()))
}

// listPresets lists the presets airlock knows, with their hosts and why.
func (s *Server) listPresets(c echo.Context) error {
	out := []PresetView{}
	for _, p := range policy.Presets() {
		v := PresetView{Name: p.Name, Description: p.Description, Entries: []PresetEntryView{}, Includes: p.Includes, Patterns: []string{}}
		if v.Includes == nil {
			v.Includes = []string{}
		}
		for _, e := range p.Entries {
			v.Entries = append(v.Entries, PresetEntryView{Host: e.Host, Patterns: e.Patterns(), Why: e.Why})
		}
		for _, r := range policy.PresetRules([]string{p.Name}) {
			v.Patterns = append(v.Patterns, r.Pattern.String())
		}
		out = append(out, v)
	}
	return c.JSON(http.StatusOK, out)
}

// patchSettings changes unknown_action and approval_timeout in the policy
// file and in the running policy; a field left out stays as it is.
func (s *Server) patchSettings(c echo.Context) error {
	var b SettingsPatch
	if err := decode(c, &b); err != nil {
		return err
	}
	const example = `send {"unknown_action": "deny"}, {"approval_timeout": 60}, {"unknown_action": "learn", "learn_until": "2h"} or {"presets": ["python", "github"]}`
	if b.UnknownAction == nil && b.ApprovalTimeout == nil && b.LearnUntil == nil && b.Presets == nil {
		return fail(http.StatusBadRequest, "no setting to change", example)
	}
	var set policy.Settings
	var changed []string
	if b.UnknownAction != nil {
		a, err := policy.ParseAction(*b.UnknownAction)
		if err != nil {
			return fail(http.StatusBadRequest, "unknown_action: "+err.Error(), example)
		}
		set.UnknownAction = &a
		changed = append(changed, "unknown_action="+a.String())
	}
	if b.ApprovalTimeout != nil {
		max := int64(policy.MaxApprovalTimeout / time.Second)
		if n := *b.ApprovalTimeout; n < 1 || n > max {
			return fail(http.StatusBadRequest, fmt.Sprintf("approval_timeout %d is out of range: want whole seconds from 1 to %d", n, max), example)
		}
		d := time.Duration(*b.ApprovalTimeout) * time.Second
		set.ApprovalTimeout = &d
		changed = append(changed, fmt.Sprintf("approval_timeout=%d", *b.ApprovalTimeout))
	}
	if b.LearnUntil != nil {
		t, err := parseWhen(*b.LearnUntil, time.Now())
		if err != nil {
			return fail(http.StatusBadRequest, "learn_until: "+err.Error(), example)
		}
		set.LearnUntil = &t
		changed = append(changed, "learn_until="+t.UTC().Format(time.RFC3339))
	}
	if b.Presets != nil {
		names, err := policy.CheckPresets(*b.Presets)
		if err != nil {
			return fail(http.StatusBadRequest, "presets: "+err.Error(), "GET /api/v1/presets lists them")
		}
		set.Presets = &names
		changed = append(changed, "presets=["+strings.Join(names, ",")+"]")
	}
	sb := sandboxOf(c)
	spec, err := sb.Policy().SetSettings(set)
	if isHeldEdit(err) {
		return failHeldEdit(err)
	}
	if err != nil {
		return fail(http.StatusInternalServerError, err.Error(), "the policy file could not be written; nothing changed")
	}
	sb.Journal().Add(audit.Entry{Kind: audit.KindSettings, Sandbox: sb.Name(), Action: "changed", Reason: strings.Join(changed, " ")})
	if set.Presets != nil || spec.UnknownAction == policy.ActionLearn {
		// More may be allowed now than when requests were held.
		sb.Broker().ReleaseAllowed()
	}
	return c.JSON(http.StatusOK, viewSettings(sb.Policy()))
}

// parseWhen reads a time: RFC 3339, or a duration from now ("90m").
func parseWhen(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("%q is not in the future", s)
		}
		return now.Add(d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time such as 2025-01-15T10:30:00Z or a duration such as 2h", truncate(s, 40))
	}
	if t.Year() < 1970 {
		// The zero time stands for no end in the policy file.
		return time.Time{}, fmt.Errorf("%q: want a time after 1970", truncate(s, 40))
	}
	return t, nil
}

// replaceRule gives a user or session rule a new pattern, in its place.
func (s *Server) replaceRule(l policy.List) echo.HandlerFunc {
	return func(c echo.Context) error {
		var b struct {
			Pattern string `json:"pattern"`
			Force   bool   `json:"force"`
		}
		if err := decode(c, &b); err != nil {
			return err
		}
		if b.Pattern == "" {
			return fail(http.StatusBadRequest, "no pattern", `send {"pattern": "api.example.com"}`)
		}
		sb := sandboxOf(c)
		id := c.Param("id")
		if r, ok := sb.Policy().Rule(id); !ok || r.List != l {
			return fail(http.StatusNotFound, fmt.Sprintf("no rule %q in the %s", truncate(id, 40), l), "GET the list for the ids")
		}
		old, nr, err := sb.Policy().Replace(policy.ReplaceRequest{ID: id, Pattern: b.Pattern, Force: b.Force})
		switch {
		case errors.Is(err, policy.ErrBroad):
			return fail(http.StatusBadRequest, err.Error(), `send "force": true to accept a broad pattern on purpose`)
		case errors.Is(err, policy.ErrAutoRule):
			return fail(http.StatusConflict, err.Error(), "auto rules follow mcp_servers and network_allowlist.auto in the policy file")
		case errors.Is(err, policy.ErrPresetRule):
			return fail(http.StatusConflict, err.Error(), presetHint)
		case errors.Is(err, policy.ErrDuplicateRule):
			return fail(http.StatusConflict, err.Error(), "delete this rule instead, or choose another pattern")
		case errors.Is(err, policy.ErrNoRule):
			return fail(http.StatusNotFound, err.Error(), "GET the list for the ids")
		case isHeldEdit(err):
			return failHeldEdit(err)
		case err != nil && strings.HasPrefix(err.Error(), "pattern "):
			return fail(http.StatusBadRequest, err.Error(), "see the pattern language in docs/policy.md")
		case err != nil:
			return fail(http.StatusInternalServerError, err.Error(), "the policy file could not be written; nothing changed")
		}
		if old != nr {
			sb.Journal().Add(audit.Entry{Kind: audit.KindRule, Sandbox: sb.Name(), Action: "replaced", RuleID: nr.ID, Rule: nr.Pattern.String(), List: l.String(), Reason: "was " + old.Pattern.String()})
			if l == policy.Allowlist {
				sb.Broker().ReleaseAllowed()
			}
		}
		return c.JSON(http.StatusOK, viewRule(nr))
	}
}
