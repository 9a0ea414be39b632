package ui

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/policy"
)

// ProposalView answers GET …/proposal: the patterns that cover what
// members reached since Since (zero: all the journal holds).
type ProposalView struct {
	Since    *time.Time        `json:"since,omitempty"`
	Records  int               `json:"records"` // how many records it was computed from
	Patterns []policy.Proposed `json:"patterns"`
}

// SaveProposalBody is the body of POST …/proposal: the reviewed patterns
// to save to the policy file.
type SaveProposalBody struct {
	Rules []ProposedRule `json:"rules"`
}

// ProposedRule is one reviewed pattern to save.
type ProposedRule struct {
	Pattern string `json:"pattern"`
	Member  string `json:"member,omitempty"`
	Force   bool   `json:"force,omitempty"`
}

// proposalKinds are the journal entries a proposal reads.
var proposalKinds = []string{audit.KindConnection, audit.KindRequest, audit.KindApproval}

// proposalHits picks from the journal what members reached, or tried to
// reach for want of a rule: allowed and learned traffic, held requests, and
// traffic denied by unknown_action or for being a raw IP. Connection
// records of intercepted connections are left out: their requests stand
// for them. A held request a person denied is marked Denied, so that the
// proposal that covers it is flagged.
func proposalHits(entries []audit.Entry) []policy.Hit {
	unknown, rawIP := policy.ReasonUnknown.String(), policy.ReasonRawIP.String()
	denied := map[string]bool{}
	for _, e := range entries {
		if e.Kind == audit.KindApproval && e.Action == "deny" && e.ApprovalID != "" {
			denied[e.ApprovalID] = true
		}
	}
	var out []policy.Hit
	for _, e := range entries {
		var ok bool
		switch e.Kind {
		case audit.KindApproval:
			ok = e.Action == "opened"
		case audit.KindConnection:
			ok = !strings.HasPrefix(e.Reason, "intercepted") &&
				(e.Verdict == "allow" || e.Verdict == policy.LearnedVerdict || e.Verdict == "deny" && (e.Reason == unknown || e.Reason == rawIP))
		case audit.KindRequest:
			ok = e.Verdict == "allow" || e.Verdict == policy.LearnedVerdict || e.Verdict == "deny" && e.Reason == unknown
		}
		if !ok {
			continue
		}
		h := policy.Hit{Source: e.Source, Host: e.Host, Port: e.Port, Shown: e.Host + ":" + fmt.Sprint(e.Port),
			Denied: e.Kind == audit.KindApproval && e.ApprovalID != "" && denied[e.ApprovalID]}
		if e.Method != "" && e.URL != "" {
			q, err := policy.SampleQuery(e.Method + " " + e.URL)
			if err != nil {
				continue
			}
			h.Host, h.Port, h.Method, h.Path, h.Shown = q.Host, q.Port, q.Method, q.Path, e.Method+" "+e.URL
		}
		out = append(out, h)
	}
	return out
}

func (s *Server) getProposal(c echo.Context) error {
	f, err := filterFrom(c, proposalKinds)
	if err != nil {
		return err
	}
	f.Source, f.Verdict, f.Kinds, f.Limit = "", "", proposalKinds, 100000
	sb := sandboxOf(c)
	entries := sb.Journal().Query(f)
	hits := proposalHits(entries)
	out := ProposalView{Records: len(hits), Patterns: policy.Propose(hits, sb.Policy().Decide)}
	if out.Patterns == nil {
		out.Patterns = []policy.Proposed{}
	}
	if !f.Since.IsZero() {
		out.Since = &f.Since
	}
	return c.JSON(http.StatusOK, out)
}

// saveProposal adds reviewed patterns to the policy file, with source
// "learned DATE", in one edit: one bad pattern is a 400, and a file that
// cannot be written a 500, and either way nothing is saved.
func (s *Server) saveProposal(c echo.Context) error {
	var b SaveProposalBody
	if err := decode(c, &b); err != nil {
		return err
	}
	const example = `send {"rules": [{"pattern": "api.example.com", "member": "agent"}]}`
	if len(b.Rules) == 0 || len(b.Rules) > 1000 {
		return fail(http.StatusBadRequest, "want 1 to 1000 rules", example)
	}
	source := "learned " + time.Now().UTC().Format("2006-01-02")
	reqs := make([]policy.AddRequest, len(b.Rules))
	for i, r := range b.Rules {
		reqs[i] = policy.AddRequest{Pattern: r.Pattern, List: policy.Allowlist, Persist: true, Force: r.Force, Member: r.Member, Source: source}
		// The file's own checks, every rule before the first is written.
		if err := badRule(reqs[i].Check(), fmt.Sprintf("rules[%d]: ", i), "nothing was saved"); err != nil {
			return err
		}
	}
	sb := sandboxOf(c)
	// One edit of the file: every rule is saved or none is.
	rules, err := sb.Policy().AddAll(reqs)
	switch {
	case isHeldEdit(err):
		return failHeldEdit(err)
	case err != nil:
		return fail(http.StatusInternalServerError, err.Error(), "the policy file could not be written; nothing was saved")
	}
	added := make([]RuleView, len(rules))
	for i, rule := range rules {
		sb.Journal().Add(audit.Entry{Kind: audit.KindRule, Sandbox: sb.Name(), Action: "added", RuleID: rule.ID, Rule: rule.Pattern.String(), List: "allowlist", Reason: source})
		added[i] = viewRule(rule)
	}
	sb.Broker().ReleaseAllowed()
	return c.JSON(http.StatusCreated, added)
}
