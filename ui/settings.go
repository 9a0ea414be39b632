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

func viewSettings(spec policy.Spec) SettingsView {
	return SettingsView{UnknownAction: spec.UnknownAction.String(), ApprovalTimeout: int(spec.ApprovalTimeout / time.Second), AllowECH: spec.AllowECH}
}

func (s *Server) getSettings(c echo.Context) error {
	return c.JSON(http.StatusOK, viewSettings(sandboxOf(c).Policy().Spec()))
}

// patchSettings changes unknown_action and approval_timeout in the policy
// file and in the running policy; a field left out stays as it is.
func (s *Server) patchSettings(c echo.Context) error {
	var b SettingsPatch
	if err := decode(c, &b); err != nil {
		return err
	}
	const example = `send {"unknown_action": "deny"} and/or {"approval_timeout": 60}`
	if b.UnknownAction == nil && b.ApprovalTimeout == nil {
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
	sb := sandboxOf(c)
	spec, err := sb.Policy().SetSettings(set)
	if isHeldEdit(err) {
		return failHeldEdit(err)
	}
	if err != nil {
		return fail(http.StatusInternalServerError, err.Error(), "the policy file could not be written; nothing changed")
	}
	sb.Journal().Add(audit.Entry{Kind: audit.KindSettings, Sandbox: sb.Name(), Action: "changed", Reason: strings.Join(changed, " ")})
	return c.JSON(http.StatusOK, viewSettings(spec))
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
