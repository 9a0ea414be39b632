package ui

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/policy"
)

func viewSandbox(sb Sandbox) SandboxView {
	spec := sb.Policy().Spec()
	mcp := []MCPView{}
	for _, m := range spec.MCPServers {
		v := MCPView{Name: m.Name, Transport: m.Transport, Network: "unknown", Risk: "unknown", Domains: []string{}}
		if k, ok := policy.LookupMCPServer(m.Name); ok {
			v.Known, v.Network, v.Risk, v.Domains = true, k.Network.String(), k.Risk.String(), k.Domains
			if v.Domains == nil {
				v.Domains = []string{}
			}
		}
		mcp = append(mcp, v)
	}
	return SandboxView{
		MCPServers: mcp,
		Name:       sb.Name(), Subnet: sb.Subnet(), Policy: sb.Policy().Path(), Enabled: spec.Enabled,
		UnknownAction: spec.UnknownAction.String(), ApprovalTimeout: int(spec.ApprovalTimeout / time.Second),
		LearnUntil: learnUntil(sb.Policy()), Presets: presetNames(spec),
		Inspect: spec.Inspect.String(), Rules: len(sb.Policy().Rules()), Pending: len(sb.Broker().List()),
	}
}

// presetHint says how to drop a preset's rule.
const presetHint = `preset rules follow presets in the policy file: PATCH settings {"presets": [...]} without it`

func (s *Server) listSandboxes(c echo.Context) error {
	out := []SandboxView{}
	for _, sb := range s.cfg.Sandboxes() {
		out = append(out, viewSandbox(sb))
	}
	return c.JSON(http.StatusOK, out)
}

func managerError(err error) error {
	var me *ManagerError
	if errors.As(err, &me) {
		status := http.StatusBadRequest
		switch {
		case me.NotFound:
			status = http.StatusNotFound
		case me.Conflict:
			status = http.StatusConflict
		case me.Unavailable:
			status = http.StatusServiceUnavailable
		}
		return fail(status, me.Msg, me.Hint)
	}
	return fail(http.StatusInternalServerError, err.Error(), "")
}

func (s *Server) createSandbox(c echo.Context) error {
	var b struct {
		Name   string `json:"name"`
		Policy string `json:"policy"`
		Subnet string `json:"subnet"`
		// Presets are written to the policy file; left out, a policy file
		// that does not exist yet starts with policy.DefaultPresets.
		Presets *[]string `json:"presets"`
	}
	if err := decode(c, &b); err != nil {
		return err
	}
	if b.Name == "" || b.Subnet == "" {
		return fail(http.StatusBadRequest, "name and subnet are required", `send {"name": "myapp", "subnet": "10.88.5.0/24", "policy": "/path/to/app.yaml"}`)
	}
	if b.Presets != nil {
		names, err := policy.CheckPresets(*b.Presets)
		if err != nil {
			return fail(http.StatusBadRequest, "presets: "+err.Error(), "GET /api/v1/presets lists them; send [] for none")
		}
		b.Presets = &names
	}
	sb, err := s.cfg.Manager.CreateSandbox(b.Name, b.Policy, b.Subnet)
	if err != nil {
		return managerError(err)
	}
	if b.Presets == nil {
		if _, err := os.Stat(sb.Policy().Path()); errors.Is(err, os.ErrNotExist) {
			b.Presets = &policy.DefaultPresets
		}
	}
	if b.Presets != nil {
		if _, err := sb.Policy().SetSettings(policy.Settings{Presets: b.Presets}); err != nil {
			// Nothing half made: the sandbox goes again.
			if derr := s.cfg.Manager.DeleteSandbox(b.Name); derr != nil {
				s.log.Warn("remove sandbox after a failed create", "sandbox", b.Name, "err", derr)
			}
			return fail(http.StatusBadRequest, "presets: "+err.Error(), "the sandbox was not created")
		}
	}
	return c.JSON(http.StatusCreated, viewSandbox(sb))
}

func (s *Server) deleteSandbox(c echo.Context) error {
	if err := s.cfg.Manager.DeleteSandbox(c.Param("sb")); err != nil {
		return managerError(err)
	}
	return c.JSON(http.StatusOK, map[string]string{"deleted": c.Param("sb")})
}

func (s *Server) reload(c echo.Context) error {
	res, err := s.cfg.Manager.Reload()
	if err != nil {
		return managerError(err)
	}
	return c.JSON(http.StatusOK, res)
}

func (s *Server) getSandbox(c echo.Context) error {
	return c.JSON(http.StatusOK, viewSandbox(sandboxOf(c)))
}

func viewRule(r *policy.Rule) RuleView {
	v := RuleView{ID: r.ID, Pattern: r.Pattern.String(), Type: r.Pattern.Form(), Tier: r.Tier.String(),
		List: r.List.String(), Source: r.Source, Member: r.Member, Forced: r.Forced, LLM: policy.IsLLMHost(r.Pattern.String())}
	if !r.Added.IsZero() {
		t := r.Added
		v.Added = &t
	}
	return v
}

func (s *Server) listRules(l policy.List) echo.HandlerFunc {
	return func(c echo.Context) error {
		out := []RuleView{}
		for _, r := range sandboxOf(c).Policy().Rules() {
			if r.List == l {
				out = append(out, viewRule(r))
			}
		}
		return c.JSON(http.StatusOK, out)
	}
}

func (s *Server) addRule(l policy.List) echo.HandlerFunc {
	return func(c echo.Context) error {
		var b AddRuleBody
		if err := decode(c, &b); err != nil {
			return err
		}
		if b.Pattern == "" {
			return fail(http.StatusBadRequest, "no pattern", `send {"pattern": "api.example.com", "persist": true}`)
		}
		if len(b.Source) > 200 || strings.ContainsAny(b.Source, "\n\r\x00") {
			return fail(http.StatusBadRequest, "source too long or with control characters", "")
		}
		if b.Source == "" {
			b.Source = "added through the API"
		}
		req := policy.AddRequest{Pattern: b.Pattern, List: l, Persist: b.Persist, Force: b.Force, Member: b.Member, Source: b.Source}
		if err := badRule(req.Check(), "", "nothing changed"); err != nil {
			return err
		}
		sb := sandboxOf(c)
		r, err := sb.Policy().Add(req)
		switch {
		case isHeldEdit(err):
			return failHeldEdit(err)
		case err != nil:
			return fail(http.StatusInternalServerError, err.Error(), "the policy file could not be written; nothing changed")
		}
		sb.Journal().Add(audit.Entry{Kind: audit.KindRule, Sandbox: sb.Name(), Action: "added", RuleID: r.ID, Rule: r.Pattern.String(), List: l.String(), Reason: r.Tier.String()})
		// A new allow rule may answer held requests.
		if l == policy.Allowlist {
			sb.Broker().ReleaseAllowed()
		}
		return c.JSON(http.StatusCreated, viewRule(r))
	}
}

func (s *Server) removeRule(l policy.List) echo.HandlerFunc {
	return func(c echo.Context) error {
		sb := sandboxOf(c)
		id := c.Param("id")
		r, ok := sb.Policy().Rule(id)
		if !ok || r.List != l {
			return fail(http.StatusNotFound, fmt.Sprintf("no rule %q in the %s", truncate(id, 40), l), "GET the list for the ids")
		}
		removed, err := sb.Policy().Remove(id)
		switch {
		case errors.Is(err, policy.ErrAutoRule):
			return fail(http.StatusConflict, err.Error(), "auto rules follow mcp_servers and network_allowlist.auto in the policy file")
		case errors.Is(err, policy.ErrPresetRule):
			return fail(http.StatusConflict, err.Error(), presetHint)
		case isHeldEdit(err):
			return failHeldEdit(err)
		case err != nil:
			return fail(http.StatusInternalServerError, err.Error(), "")
		}
		sb.Journal().Add(audit.Entry{Kind: audit.KindRule, Sandbox: sb.Name(), Action: "removed", RuleID: removed.ID, Rule: removed.Pattern.String(), List: l.String()})
		return c.JSON(http.StatusOK, viewRule(removed))
	}
}

// testPattern answers the page's live preview: does the pattern parse, is
// it broad, which sample URLs it matches, and how many recorded requests
// it would have matched.
func (s *Server) testPattern(c echo.Context) error {
	var b TestBody
	if err := decode(c, &b); err != nil {
		return err
	}
	if len(b.URLs) > 100 {
		return fail(http.StatusBadRequest, "more than 100 sample URLs", "")
	}
	out := struct {
		Valid    bool         `json:"valid"`
		Broad    bool         `json:"broad"`
		Error    string       `json:"error,omitempty"`
		Type     string       `json:"type,omitempty"`
		Results  []TestResult `json:"results"`
		Recorded int          `json:"recorded_matches"`
	}{Results: []TestResult{}}
	p, err := policy.Parse(b.Pattern, policy.ParseOptions{Force: b.Force})
	if errors.Is(err, policy.ErrBroad) {
		out.Broad = true
		p, err = policy.Parse(b.Pattern, policy.ParseOptions{Force: true})
		out.Error = "too broad: needs force"
	}
	if err != nil {
		out.Error = err.Error()
		return c.JSON(http.StatusOK, out)
	}
	out.Valid, out.Type = !out.Broad, p.Kind().String()
	for _, u := range b.URLs {
		q, err := policy.SampleQuery(u)
		if err != nil {
			out.Results = append(out.Results, TestResult{URL: u, Error: err.Error()})
			continue
		}
		out.Results = append(out.Results, TestResult{URL: u, Matches: p.Matches(q)})
	}
	for _, e := range sandboxOf(c).Journal().Query(audit.Filter{Kinds: []string{audit.KindConnection, audit.KindRequest}, Limit: 10000}) {
		if q, ok := entryQuery(e); ok && p.Matches(q) {
			out.Recorded++
		}
	}
	return c.JSON(http.StatusOK, out)
}

// entryQuery is the policy question a recorded entry stands for.
func entryQuery(e audit.Entry) (policy.Query, bool) {
	if e.Kind == audit.KindRequest {
		q, err := policy.SampleQuery(e.Method + " " + e.URL)
		return q, err == nil
	}
	if e.Host == "" {
		return policy.Query{}, false
	}
	return policy.Query{Host: e.Host, Port: e.Port}, true
}

// AgentNamer is what a Sandbox may also do: name the agent that drives a
// member (a container's airlock.agent label).
type AgentNamer interface {
	AgentOf(source string) string
}

func (s *Server) listApprovals(c echo.Context) error {
	out := []ApprovalView{}
	now := time.Now()
	sb := sandboxOf(c)
	agents, _ := sb.(AgentNamer)
	for _, p := range sb.Broker().List() {
		v := ApprovalView{ID: p.ID, Sandbox: sb.Name(), Source: p.Source, Sources: p.Sources, Host: p.Host, Port: p.Port,
			Method: p.Method, URL: p.URL, Created: p.Created, SecondsLeft: max(0, p.Deadline.Sub(now).Seconds()),
			Waiting: p.Waiting, Suggestions: p.Suggestions, Headers: p.Headers, LLM: p.Host != "" && policy.IsLLMHost(p.Host),
			Kind: string(p.Kind), Requested: p.Requested, Reason: p.Reason, MemoryMB: p.MemoryMB, CPUs: p.CPUs, Pids: p.Pids}
		if v.Suggestions == nil {
			v.Suggestions = []policy.Suggestion{}
		}
		for _, a := range p.Actions() {
			v.Actions = append(v.Actions, a.String())
		}
		if agents != nil {
			v.Agent = agents.AgentOf(p.Source)
		}
		if p.Kind == policy.AskPort && s.cfg.Exposures != nil {
			v.Listen = s.cfg.Exposures.ExposeListen()
		}
		out = append(out, v)
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) decide(c echo.Context) error {
	var b DecideBody
	if err := decode(c, &b); err != nil {
		return err
	}
	action, err := policy.ParseResolution(b.Action)
	if err != nil {
		return fail(http.StatusBadRequest, err.Error(), `send {"action": "allow_once"}, {"action": "deny"}, {"action": "allow_pattern", "pattern": "…", "persist": true} or, for a port or resources request, {"action": "allow"}`)
	}
	sb := sandboxOf(c)
	r, err := sb.Broker().Decide(c.Param("id"), policy.Choice{Action: action, Pattern: b.Pattern, Persist: b.Persist, Force: b.Force})
	switch {
	case errors.Is(err, policy.ErrNoPending):
		return fail(http.StatusNotFound, fmt.Sprintf("no pending approval %q", truncate(c.Param("id"), 40)), "it may have been decided or timed out; GET approvals")
	case errors.Is(err, policy.ErrWrongAction):
		return fail(http.StatusBadRequest, err.Error(), "GET approvals lists the actions each approval takes")
	case errors.Is(err, policy.ErrGrantFailed):
		return fail(http.StatusBadGateway, err.Error(), "the member was told so; it may ask again")
	case errors.Is(err, policy.ErrBroad):
		return fail(http.StatusBadRequest, err.Error(), `send "force": true to accept a broad pattern on purpose`)
	case isHeldEdit(err):
		return failHeldEdit(err)
	case err != nil:
		return fail(http.StatusBadRequest, err.Error(), "")
	}
	out := map[string]any{"decided": c.Param("id"), "action": action.String()}
	if r != nil {
		out["rule"] = viewRule(r)
		sb.Journal().Add(audit.Entry{Kind: audit.KindRule, Sandbox: sb.Name(), Action: "added", RuleID: r.ID, Rule: r.Pattern.String(), List: r.List.String(), Reason: "approval " + c.Param("id")})
	}
	return c.JSON(http.StatusOK, out)
}

// filterFrom reads source, verdict, llm, since (RFC 3339 or a duration
// such as 10m), kind and limit from the query string.
func filterFrom(c echo.Context, kinds []string) (audit.Filter, error) {
	f := audit.Filter{Source: c.QueryParam("source"), Verdict: c.QueryParam("verdict"), Kinds: kinds}
	if k := c.QueryParam("kind"); k != "" {
		f.Kinds = strings.Split(k, ",")
	}
	if v := c.QueryParam("llm"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return f, fail(http.StatusBadRequest, "llm must be true or false", "")
		}
		f.LLM = &b
	}
	if v := c.QueryParam("since"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			f.Since = time.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, v); err == nil {
			f.Since = t
		} else {
			return f, fail(http.StatusBadRequest, "since must be RFC 3339 or a duration", "since=10m or since=2026-01-02T15:04:05Z")
		}
	}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100000 {
			return f, fail(http.StatusBadRequest, "limit must be 1 to 100000", "")
		}
		f.Limit = n
	}
	return f, nil
}

var trafficKinds = []string{audit.KindConnection, audit.KindRequest}

func (s *Server) listRequests(c echo.Context) error {
	f, err := filterFrom(c, trafficKinds)
	if err != nil {
		return err
	}
	out := sandboxOf(c).Journal().Query(f)
	if out == nil {
		out = []audit.Entry{}
	}
	return c.JSON(http.StatusOK, out)
}

// eventPing is how often an idle event stream sends a comment, so that
// proxies and browsers keep it open.
const eventPing = 15 * time.Second

// openEventStream answers with a server-sent event stream and writes a
// first comment, so that the client sees it open at once; the error is
// the write's (a client already gone).
func openEventStream(w *echo.Response, comment string) error {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprintf(w, ": %s\n\n", comment); err != nil {
		return err
	}
	w.Flush()
	return nil
}

// events streams the sandbox's journal as server-sent events: one event
// per entry, named by its kind, with the entry as JSON data.
func (s *Server) events(c echo.Context) error {
	sub := sandboxOf(c).Journal().Subscribe(1024)
	defer sub.Close()
	w := c.Response()
	openEventStream(w, "airlock events")
	ping := time.NewTicker(eventPing)
	defer ping.Stop()
	ctx := c.Request().Context()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ping.C:
			fmt.Fprint(w, ": ping\n\n")
			w.Flush()
		case e, ok := <-sub.C():
			if !ok {
				return nil
			}
			b, _ := jsonMarshal(e)
			fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", e.Seq, e.Kind, b)
			w.Flush()
		}
	}
}

// isHeldEdit reports whether err refused an edit of a policy file that
// holds edits widening access that are not in force (policy.WidensError).
// badRule is the 400 for a rule policy.AddRequest.Check refuses (nil for
// nil), its message prefixed with where, its hint ending with then.
func badRule(err error, where, then string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, policy.ErrBroad):
		return fail(http.StatusBadRequest, where+err.Error(), `send "force": true with it to accept a broad pattern on purpose; `+then)
	default:
		return fail(http.StatusBadRequest, where+err.Error(), "see the pattern language and members in docs/policy.md; "+then)
	}
}

func isHeldEdit(err error) bool {
	var we *policy.WidensError
	return errors.As(err, &we)
}

func failHeldEdit(err error) error {
	return fail(http.StatusConflict, err.Error(), "the policy file was edited on disk to widen access; check the edit, then run airlock reload to apply it (or undo it), and try again")
}
