package policy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/ratelog"
)

// Resolution is the action a person takes on a pending approval.
type Resolution uint8

const (
	// ResolveDeny refuses the held traffic; with Persist (and a pattern) it
	// also adds a deny rule to the policy file.
	ResolveDeny Resolution = iota + 1
	// ResolveAllowOnce lets the held traffic through and adds no rule.
	ResolveAllowOnce
	// ResolveAllowPattern adds an allow rule (session, or in the policy
	// file with Persist) and releases every held request it matches.
	ResolveAllowPattern
	// ResolveAllow grants a member's port or resources request.
	ResolveAllow
)

func (r Resolution) String() string {
	switch r {
	case ResolveDeny:
		return "deny"
	case ResolveAllowOnce:
		return "allow_once"
	case ResolveAllowPattern:
		return "allow_pattern"
	case ResolveAllow:
		return "allow"
	}
	return "Resolution(" + strconv.Itoa(int(r)) + ")"
}

// ParseResolution reads "deny", "allow_once", "allow_pattern" or "allow".
func ParseResolution(s string) (Resolution, error) {
	switch s {
	case "deny":
		return ResolveDeny, nil
	case "allow_once":
		return ResolveAllowOnce, nil
	case "allow_pattern":
		return ResolveAllowPattern, nil
	case "allow":
		return ResolveAllow, nil
	}
	return 0, fmt.Errorf("unknown action %q: want deny, allow_once or allow_pattern (network), or allow (port, resources)", truncate(s, 40))
}

// Choice is what a person decided about a pending approval.
type Choice struct {
	Action Resolution
	// Pattern is required for ResolveAllowPattern and optional for a
	// persisted ResolveDeny (default: the exact host).
	Pattern string
	Persist bool
	// Force accepts a broad allow pattern.
	Force bool
}

// AskRequest describes held traffic, or what a member asked for through
// the member API. Held traffic asks about one request when it has a Method
// or a URL with a path (scheme://authority/path), and about a connection
// otherwise.
type AskRequest struct {
	// Kind is what is asked for; "" means AskNetwork.
	Kind   AskKind
	Source string
	Host   string // normalised name or IP (AskNetwork)
	// Port is the destination's port (AskNetwork), or the member's port
	// to expose (AskPort).
	Port   uint16
	Method string // when the request is known (intercepted HTTP)
	URL    string // full URL when known, else host:port
	// Headers of an intercepted request, credentials already masked.
	Headers map[string][]string
	// Requested says a member asked through the member API (Broker.Request)
	// rather than traffic being held.
	Requested bool
	// MemberID names the member to a grant, so that a grant reaches the
	// member that asked and no later one under its name: a Docker
	// container's ID, a run member's lease, "" for a member that has
	// neither.
	MemberID string
	// Reason is the member's own words, through CleanReason.
	Reason string
	// MemoryMB, CPUs and Pids are the limits a resources request asks
	// for; 0 leaves one as it is.
	MemoryMB int
	CPUs     float64
	Pids     int
}

// Pending is an approval waiting for a person.
type Pending struct {
	ID     string
	Kind   AskKind // AskNetwork, AskPort or AskResources
	Source string  // the member that asked
	// Sources is Source alone (none when Source is ""): an approval is
	// never shared between members. It stays for the API's sake.
	Sources     []string
	Host        string
	Port        uint16
	Method      string
	URL         string
	Created     time.Time
	Deadline    time.Time
	Suggestions []Suggestion
	Headers     map[string][]string // of the first request, credentials masked
	Waiting     int                 // held connections or requests sharing this approval
	// Requested, MemberID, Reason, MemoryMB, CPUs and Pids are the
	// AskRequest's, for a member's request.
	Requested bool
	MemberID  string
	Reason    string
	MemoryMB  int
	CPUs      float64
	Pids      int
}

// Outcome is what a held request learns.
type Outcome struct {
	Allowed bool
	// Action is how it was decided: deny, allow_once, allow_pattern,
	// allow, timeout, failed (allowed, but the grant could not be carried
	// out), or "" (refused without asking, or the asker went away).
	Action string
	// Rule is the rule that an allow_pattern or persisted deny added.
	Rule   *Rule
	Reason string // "approved once", "denied by a person", "no decision within 30s", …
}

// BrokerEvent reports an approval opened or decided.
type BrokerEvent struct {
	Kind    string // "opened" or "decided"
	Pending Pending
	// Action, for "decided": deny, allow_once, allow_pattern, allow,
	// failed, timeout, or gone (the request it showed went away: its
	// member hung up; any others that joined it are asked about anew).
	Action string
	Rule   *Rule
}

// BrokerConfig configures a Broker.
type BrokerConfig struct {
	// Sandbox whose rules allow_pattern and persisted deny edit. Required.
	Sandbox *Sandbox
	// Timeout is how long a pending approval waits; 0 means the sandbox's
	// approval_timeout at the time of asking.
	Timeout time.Duration
	// OnEvent receives approvals opened and decided, in the order of the
	// changes; nil means none. It must not block, nor decide (it may call
	// List and Get): the change that queued an event waits for its
	// delivery.
	OnEvent func(BrokerEvent)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MaxHeldPerMember and MaxHeldPerSandbox bound the connections and
	// requests held at once, for one member and in all; 0 means no bound.
	// Beyond them an ask is denied at once, not held (design §8,
	// invariant 17).
	MaxHeldPerMember, MaxHeldPerSandbox int
	// Logger gets those refusals, once per 10 s per member; nil means
	// slog.Default().
	Logger *slog.Logger
	// Grant carries out an allowed port or resources request and says
	// what it did ("exposed at 127.0.0.1:40123"); nil means such requests
	// cannot be allowed. It is called once per approval, without the
	// broker's lock, before the member learns the answer.
	Grant func(Pending) (string, error)
	// Host is what "host" stands for in the sandbox's resource bounds;
	// zero values refuse requests bounded by them.
	Host HostResources
}

// Broker holds traffic no rule decides until a person does. Connections of
// one member to the same host and port share one pending approval, and so
// do requests of one member with the same method and URL; nothing else
// does, so that a person decides exactly what they see, for the member
// they see. It is safe for concurrent use.
type Broker struct {
	cfg      BrokerConfig
	refusals ratelog.Limiter

	// mu guards pending, taken and queue.
	mu      sync.Mutex
	pending map[string]*pendingState // by ID
	// taken are approvals taken off pending to be decided whose waiters
	// are not answered yet (a rule being saved): they still count
	// against the bounds on held asks.
	taken map[*pendingState]struct{}
	// queue holds events in the order of the changes they report, which
	// are made under mu; flush delivers them outside mu, one batch at a
	// time (delivering), and returns once its caller's own are delivered.
	queue           []BrokerEvent
	queued, handed  int // events queued and delivered, ever
	delivering      bool
	deliveredOrIdle *sync.Cond // on mu: a batch was delivered
}

type pendingState struct {
	Pending
	key askKey
	// query is the question ReleaseAllowed asks the rules again.
	query Query
	// waiters are the held connections or requests, first asker first;
	// guarded by Broker.mu.
	waiters []*waiter
	// shown is the waiter whose request the approval shows (its headers
	// and reason): the only one allow once lets through.
	shown *waiter
	timer *time.Timer // times the approval out
}

// waiter is one held connection or request.
type waiter struct {
	ps   *pendingState // the approval it waits on; guarded by Broker.mu
	done chan struct{} // closed when it is answered
	out  Outcome
	// headers and reason are its own request's: asks that share an
	// approval may differ in them.
	headers map[string][]string
	reason  string
}

// askKey says which asks share an approval.
type askKey struct {
	kind      AskKind
	requested bool
	source    string
	// memberID keeps apart containers that share a member's name: a grant
	// goes to the container that asked.
	memberID string
	host     string
	port     uint16
	// method and url are set for a request and empty for a connection.
	method, url string
	// memoryMB, cpus and pids are a resources request's.
	memoryMB, pids int
	cpus           float64
}

// queryOf is the policy question behind an ask: about the request, with
// the path of its URL, when it asks about one.
func queryOf(req AskRequest) Query {
	q := Query{Source: req.Source, Host: req.Host, Port: req.Port}
	if req.Requested {
		// A member's request for a URL asks about a GET of it.
		path, _ := urlPath(req.URL)
		q.Method, q.Path = "GET", path
		return q
	}
	if path, ok := urlPath(req.URL); ok || req.Method != "" {
		q.Method, q.Path = req.Method, path
	}
	return q
}

func keyOf(req AskRequest) askKey {
	k := askKey{kind: req.Kind, requested: req.Requested, source: req.Source, memberID: req.MemberID, host: req.Host, port: req.Port,
		memoryMB: req.MemoryMB, cpus: req.CPUs, pids: req.Pids}
	if req.isRequest() {
		k.method, k.url = req.Method, req.URL
	}
	return k
}

func (req AskRequest) isRequest() bool {
	_, ok := urlPath(req.URL)
	return req.Method != "" || ok
}

// urlPath returns the request target (path and query) of a URL
// "scheme://authority/path?query", and false when u has no path, such as
// "host:port".
func urlPath(u string) (string, bool) {
	_, rest, ok := strings.Cut(u, "://")
	if !ok {
		return "", false
	}
	i := strings.IndexAny(rest, "/?")
	if i < 0 {
		return "", false
	}
	if rest[i] == '?' {
		return "/" + rest[i:], true
	}
	return rest[i:], true
}

// NewBroker returns a broker for a sandbox.
func NewBroker(cfg BrokerConfig) (*Broker, error) {
	if cfg.Sandbox == nil {
		return nil, errors.New("broker: no sandbox")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	b := &Broker{cfg: cfg, pending: make(map[string]*pendingState), taken: make(map[*pendingState]struct{})}
	b.deliveredOrIdle = sync.NewCond(&b.mu)
	return b, nil
}

// ErrNoPending is wrapped by Decide's error for an unknown or already
// decided approval.
var ErrNoPending = errors.New("no such pending approval")

// Ask holds the caller until a person decides, the approval times out
// (denied), or ctx ends (denied, without deciding for others waiting).
func (b *Broker) Ask(ctx context.Context, req AskRequest) Outcome {
	req.Kind, req.Requested = AskNetwork, false
	w := newWaiter(req)
	if why := b.join(req, w); why != "" {
		log := b.cfg.Logger
		if log == nil {
			log = slog.Default()
		}
		b.refusals.Log(log, req.Source, "ask refused: too many held", "sandbox", b.cfg.Sandbox.Name(), "source", req.Source, "host", req.Host, "reason", why)
		return Outcome{Reason: why}
	}
	select {
	case <-w.done:
		return w.out
	case <-ctx.Done():
		if b.leave(w) {
			return Outcome{Reason: "the client went away while waiting"}
		}
		<-w.done // answered meanwhile
		return w.out
	}
}

func newWaiter(req AskRequest) *waiter {
	return &waiter{done: make(chan struct{}), headers: req.Headers, reason: req.Reason}
}

// join holds w on the approval for req, opening one if need be; it
// returns why not when a bound on held asks is reached.
func (b *Broker) join(req AskRequest, w *waiter) string {
	key := keyOf(req)
	b.mu.Lock()
	if b.cfg.MaxHeldPerMember > 0 || b.cfg.MaxHeldPerSandbox > 0 {
		all, mine := 0, 0
		count := func(ps *pendingState) {
			all += len(ps.waiters)
			if ps.Source == req.Source {
				mine += len(ps.waiters)
			}
		}
		for _, ps := range b.pending {
			count(ps)
		}
		for ps := range b.taken {
			count(ps)
		}
		switch {
		case b.cfg.MaxHeldPerSandbox > 0 && all >= b.cfg.MaxHeldPerSandbox:
			b.mu.Unlock()
			return fmt.Sprintf("too many held requests in the sandbox (limit %d); denied without asking", b.cfg.MaxHeldPerSandbox)
		case b.cfg.MaxHeldPerMember > 0 && mine >= b.cfg.MaxHeldPerMember:
			b.mu.Unlock()
			return fmt.Sprintf("too many held requests of this member (limit %d); denied without asking", b.cfg.MaxHeldPerMember)
		}
	}
	if open := b.openForLocked(key); open != nil {
		b.holdLocked(open, []*waiter{w})
		b.mu.Unlock()
		return ""
	}
	var sugg []Suggestion
	url := req.URL
	if req.Kind == AskNetwork {
		sugg, _ = Suggest(req.Host)
		if url == "" {
			url = req.Host + ":" + strconv.Itoa(int(req.Port))
		}
	}
	ps := &pendingState{
		Pending: Pending{
			Kind: req.Kind, Source: req.Source, Host: req.Host, Port: req.Port, Method: req.Method, URL: url,
			Suggestions: sugg, Headers: req.Headers,
			Requested: req.Requested, MemberID: req.MemberID, Reason: req.Reason,
			MemoryMB: req.MemoryMB, CPUs: req.CPUs, Pids: req.Pids,
		},
		key:   key,
		query: queryOf(req),
	}
	if req.Source != "" {
		ps.Sources = []string{req.Source}
	}
	b.openLocked(ps, []*waiter{w})
	b.mu.Unlock()
	b.flush()
	return ""
}

// openLocked gives ps a new ID and deadline, holds waiters on it, starts
// its timeout and queues its announcement.
func (b *Broker) openLocked(ps *pendingState, waiters []*waiter) {
	now := b.cfg.Now()
	timeout := b.cfg.Timeout
	if timeout == 0 {
		timeout = b.cfg.Sandbox.Spec().ApprovalTimeout
	}
	id := make([]byte, 8)
	rand.Read(id)
	ps.ID, ps.Created, ps.Deadline = hex.EncodeToString(id), now, now.Add(timeout)
	ps.waiters, ps.Waiting = waiters, len(waiters)
	for _, w := range waiters {
		w.ps = ps
	}
	// It shows the first waiter's own request.
	ps.shown = waiters[0]
	ps.Headers, ps.Reason = ps.shown.headers, ps.shown.reason
	b.pending[ps.ID] = ps
	ps.timer = time.AfterFunc(timeout, func() {
		b.resolve(ps, Outcome{Reason: fmt.Sprintf("no decision within %s", timeout.Round(time.Second))}, "timeout", nil)
	})
	b.queueLocked(BrokerEvent{Kind: "opened", Pending: ps.Pending})
}

// leave takes w off its approval; it reports false when w was answered
// already. An approval nobody waits on any more is dropped: the question
// is moot. One whose shown request leaves is asked anew about the others,
// each of which the person has not seen: a new approval shows the next
// one's own request. Either is announced as decided "gone".
func (b *Broker) leave(w *waiter) bool {
	b.mu.Lock()
	ps := w.ps
	i := slices.Index(ps.waiters, w)
	if i < 0 {
		b.mu.Unlock()
		return false
	}
	ps.waiters = slices.Delete(ps.waiters, i, i+1)
	ps.Waiting = len(ps.waiters)
	if w != ps.shown && len(ps.waiters) > 0 {
		b.mu.Unlock()
		return true
	}
	// Off the list unless it is being decided: a decision in flight
	// answers those left.
	if !b.takeLocked(ps) {
		b.mu.Unlock()
		return true
	}
	b.goneLocked(ps)
	b.mu.Unlock()
	b.flush()
	return true
}

// goneLocked ends an approval taken off the list whose shown request went
// away (decided "gone"), and asks about those still waiting anew.
func (b *Broker) goneLocked(ps *pendingState) {
	b.queueLocked(BrokerEvent{Kind: "decided", Pending: ps.Pending, Action: "gone"})
	b.requeueLocked(ps, ps.waiters)
	b.answeredLocked(ps)
}

// requeueLocked asks about waiters of ps (taken off the list) anew, none of
// whom the person was shown: they join the open approval for the same
// question, if one was opened meanwhile, or a new one that shows the
// first's own request.
func (b *Broker) requeueLocked(ps *pendingState, waiters []*waiter) {
	if len(waiters) == 0 {
		return
	}
	if open := b.openForLocked(ps.key); open != nil {
		b.holdLocked(open, waiters)
		return
	}
	next := &pendingState{Pending: ps.Pending, key: ps.key, query: ps.query}
	next.Sources = slices.Clone(ps.Sources)
	b.openLocked(next, slices.Clone(waiters))
}

// openForLocked is the pending approval for the question key, or nil.
func (b *Broker) openForLocked(key askKey) *pendingState {
	for _, ps := range b.pending {
		if ps.key == key {
			return ps
		}
	}
	return nil
}

// holdLocked holds waiters on the open approval ps, behind those there.
func (b *Broker) holdLocked(ps *pendingState, waiters []*waiter) {
	ps.waiters = append(ps.waiters, waiters...)
	ps.Waiting = len(ps.waiters)
	for _, w := range waiters {
		w.ps = ps
	}
}

// shownAndRest splits a taken approval's waiters into the one it shows
// (none, if that one left) and the others.
func shownAndRest(ps *pendingState) (shown, rest []*waiter) {
	for _, w := range ps.waiters {
		if w == ps.shown {
			shown = []*waiter{w}
		} else {
			rest = append(rest, w)
		}
	}
	return shown, rest
}

// putBackLocked returns an approval taken off the list to be decided (a
// decision that failed) as it was, with the time it has left, when nothing
// changed meanwhile. When its shown request went away, or the same question
// was asked again in an approval of its own meanwhile, it ends (decided
// "gone") and those still waiting are asked anew.
func (b *Broker) putBackLocked(ps *pendingState) {
	if slices.Contains(ps.waiters, ps.shown) && b.openForLocked(ps.key) == nil {
		delete(b.taken, ps)
		b.pending[ps.ID] = ps
		ps.timer.Reset(max(ps.Deadline.Sub(b.cfg.Now()), 0))
		return
	}
	b.goneLocked(ps)
}

// takeLocked takes a pending approval that is being decided off the list
// and stops its timeout; it reports false when it was decided already.
func (b *Broker) takeLocked(ps *pendingState) bool {
	if _, ok := b.pending[ps.ID]; !ok {
		return false
	}
	delete(b.pending, ps.ID)
	b.taken[ps] = struct{}{}
	ps.timer.Stop()
	return true
}

// answeredLocked marks a taken approval's waiters answered or moved on:
// they no longer count against the bounds on held asks.
func (b *Broker) answeredLocked(ps *pendingState) {
	ps.waiters = nil
	delete(b.taken, ps)
}

// resolve answers every waiter of a pending approval with out; it is a
// no-op when the approval was already decided.
func (b *Broker) resolve(ps *pendingState, out Outcome, action string, rule *Rule) bool {
	b.mu.Lock()
	if !b.takeLocked(ps) {
		b.mu.Unlock()
		return false
	}
	waiters := b.decidedLocked(ps, ps.waiters, action, rule)
	b.mu.Unlock()
	b.tell(waiters, out, action, rule)
	return true
}

// decidedLocked queues the decision of a taken approval for the waiters
// answered (the event says how many) and marks it answered; it returns
// them, to be told with tell.
func (b *Broker) decidedLocked(ps *pendingState, answered []*waiter, action string, rule *Rule) []*waiter {
	decided := ps.Pending
	decided.Waiting = len(answered)
	b.queueLocked(BrokerEvent{Kind: "decided", Pending: decided, Action: action, Rule: rule})
	b.answeredLocked(ps)
	return answered
}

// tell delivers the events queued, then answers waiters: the monitor and
// the audit log show a decision ahead of the traffic it lets through.
func (b *Broker) tell(waiters []*waiter, out Outcome, action string, rule *Rule) {
	b.flush()
	out.Action = action
	if out.Rule == nil {
		out.Rule = rule
	}
	for _, w := range waiters {
		w.out = out
		close(w.done)
	}
}

// allowOnce lets exactly one held connection or request through: the one
// that opened the approval, whose URL and headers the person saw (design
// §8, invariant 13). Others that joined it (the same member, host and port,
// or the same method and URL, but maybe another body or other headers)
// are asked about again, as a new approval.
func (b *Broker) allowOnce(ps *pendingState) bool {
	b.mu.Lock()
	if !b.takeLocked(ps) {
		b.mu.Unlock()
		return false
	}
	// The shown waiter is there: had it left, the approval would have
	// been asked anew (see leave).
	shown, rest := shownAndRest(ps)
	yes := b.decidedLocked(ps, shown, "allow_once", nil)
	b.requeueLocked(ps, rest)
	b.mu.Unlock()
	b.tell(yes, Outcome{Allowed: true, Reason: "approved once"}, "allow_once", nil)
	return true
}

// List returns the pending approvals, oldest first.
func (b *Broker) List() []Pending {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Pending, 0, len(b.pending))
	for _, ps := range b.pending {
		p := ps.Pending
		p.Sources = slices.Clone(p.Sources)
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Pending) int { return a.Created.Compare(b.Created) })
	return out
}

// Get returns one pending approval.
func (b *Broker) Get(id string) (Pending, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ps, ok := b.pending[id]
	if !ok {
		return Pending{}, false
	}
	p := ps.Pending
	p.Sources = slices.Clone(p.Sources)
	return p, true
}

// Decide applies a person's choice to a pending approval. An allow_pattern
// rule is added before anything is released; it answers this approval yes
// and releases the other pending approvals that the rules, asked again
// about each one's own question, now allow (see ReleaseAllowed). A bad
// pattern is an error and decides nothing.
func (b *Broker) Decide(id string, c Choice) (*Rule, error) {
	b.mu.Lock()
	ps, ok := b.pending[id]
	var p Pending
	if ok {
		p = ps.Pending
	}
	b.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("decide %s: %w", id, ErrNoPending)
	}
	if err := checkChoice(p, c); err != nil {
		return nil, fmt.Errorf("decide %s: %w", id, err)
	}
	switch c.Action {
	case ResolveAllow:
		return nil, b.grant(ps)
	case ResolveDeny:
		if !c.Persist {
			if !b.resolve(ps, Outcome{Reason: "denied by a person"}, "deny", nil) {
				return nil, fmt.Errorf("decide %s: %w", id, ErrNoPending)
			}
			return nil, nil
		}
		return b.denyAndSave(ps, c.Pattern)
	case ResolveAllowOnce:
		if !b.allowOnce(ps) {
			return nil, fmt.Errorf("decide %s: %w", id, ErrNoPending)
		}
		return nil, nil
	case ResolveAllowPattern:
		if c.Pattern == "" {
			return nil, errors.New("allow_pattern needs a pattern")
		}
		return b.allowPattern(ps, c)
	}
	return nil, fmt.Errorf("decide %s: unknown action %v", id, c.Action)
}

// denyAndSave denies an approval and saves a deny rule for it (pattern, or
// its host). The approval is taken off the list before the rule is
// written, so that it cannot end meanwhile with the rule saved and the
// decision refused; if the rule cannot be saved, it is put back as it was
// (or times out, if its time ran out meanwhile) and nothing changed.
func (b *Broker) denyAndSave(ps *pendingState, pattern string) (*Rule, error) {
	if pattern == "" {
		pattern = ps.Host
		if isIPLiteral(ps.Host) {
			pattern = "cidr:" + ps.Host + "/32"
		}
	}
	rule, err := b.takeAndSave(ps, AddRequest{Pattern: pattern, List: Denylist, Persist: true, Source: "denied during run"})
	if err != nil {
		return nil, err
	}
	waiters := b.decidedLocked(ps, ps.waiters, "deny", rule)
	b.mu.Unlock()
	b.tell(waiters, Outcome{Reason: "denied by a person"}, "deny", rule)
	return rule, nil
}

// takeAndSave takes ps off the list and saves req's rule meanwhile (see
// denyAndSave and allowPattern). It returns the rule with b.mu locked, for
// the caller to answer ps; or an error, with ps put back (see
// putBackLocked) and b.mu unlocked.
func (b *Broker) takeAndSave(ps *pendingState, req AddRequest) (*Rule, error) {
	b.mu.Lock()
	if !b.takeLocked(ps) {
		b.mu.Unlock()
		return nil, fmt.Errorf("decide %s: %w", ps.ID, ErrNoPending)
	}
	b.mu.Unlock()
	r, err := b.cfg.Sandbox.Add(req)
	b.mu.Lock()
	if err != nil {
		b.putBackLocked(ps)
		b.mu.Unlock()
		b.flush()
		return nil, err
	}
	return r, nil
}

// allowPattern adds the person's allow rule, then answers the approval.
// The approval is taken off the list while the rule is saved, so that no
// request joins it unseen meanwhile. The request shown is answered yes
// (the person saw it, whether or not the chosen pattern covers it: a
// person may pick any pattern, and a rule without a member does not speak
// for a high-risk or user_added member); the others that share the
// approval are let through only if the rules now allow their question, and
// are asked about anew otherwise. Then every other pending approval the
// rules allow is released. A rule that cannot be saved puts the approval
// back (see putBackLocked).
func (b *Broker) allowPattern(ps *pendingState, c Choice) (*Rule, error) {
	r, err := b.takeAndSave(ps, AddRequest{Pattern: c.Pattern, List: Allowlist, Persist: c.Persist, Force: c.Force, Source: "approved during run"})
	if err != nil {
		return nil, err
	}
	yes, rest := ps.waiters, []*waiter(nil)
	// A member's request holds no traffic: its answer lets nothing through,
	// so every asker of it learns the decision.
	if d := b.cfg.Sandbox.Decide(ps.query); !ps.Requested && (d.Verdict != Allow || d.Rule == nil) {
		yes, rest = shownAndRest(ps)
	}
	yes = b.decidedLocked(ps, yes, "allow_pattern", r)
	b.requeueLocked(ps, rest)
	b.mu.Unlock()
	b.tell(yes, Outcome{Allowed: true, Reason: "approved by pattern " + r.Pattern.String()}, "allow_pattern", r)
	b.ReleaseAllowed()
	return r, nil
}

// checkChoice refuses an action that does not apply to the approval's
// kind, and a pattern for a kind that has no host.
func checkChoice(p Pending, c Choice) error {
	acts := p.Actions()
	if !slices.Contains(acts, c.Action) {
		names := make([]string, len(acts))
		for i, a := range acts {
			names[i] = a.String()
		}
		what := "a " + string(p.Kind) + " request"
		if p.Kind == AskNetwork && !p.Requested {
			what = "held traffic"
		} else if p.Kind == AskNetwork {
			what = "a member's network request (it holds no traffic to let through once)"
		}
		return fmt.Errorf("%w: %s takes %s, not %s", ErrWrongAction, what, strings.Join(names, " or "), c.Action)
	}
	if p.Kind != AskNetwork && (c.Pattern != "" || c.Persist || c.Force) {
		return fmt.Errorf("%w: pattern, persist and force apply to network approvals only", ErrWrongAction)
	}
	return nil
}

// grant carries out an allowed port or resources request, then answers
// the member: allowed with what was done, or failed with why.
func (b *Broker) grant(ps *pendingState) error {
	b.mu.Lock()
	if !b.takeLocked(ps) {
		b.mu.Unlock()
		return fmt.Errorf("decide %s: %w", ps.ID, ErrNoPending)
	}
	waiters := ps.waiters
	b.answeredLocked(ps) // a grant's answer is on its way whatever it is
	decided := ps.Pending
	b.mu.Unlock()
	var detail string
	err := errors.New("this airlockd cannot carry out " + string(decided.Kind) + " requests")
	if b.cfg.Grant != nil {
		detail, err = b.cfg.Grant(decided)
	}
	action, out := "allow", Outcome{Allowed: true, Reason: detail}
	if err != nil {
		action, out = "failed", Outcome{Reason: ErrGrantFailed.Error() + ": " + err.Error()}
	}
	b.mu.Lock()
	b.queueLocked(BrokerEvent{Kind: "decided", Pending: decided, Action: action})
	b.mu.Unlock()
	b.tell(waiters, out, action, nil)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrGrantFailed, err)
	}
	return nil
}

// ReleaseAllowed lets through every pending approval the sandbox's rules
// now allow. Each is decided again with its own question: its member, host
// and port, and for a request its method and path. So a path rule releases
// only the requests it covers, and a high-risk or user_added member only by
// a rule naming it.
func (b *Broker) ReleaseAllowed() {
	b.mu.Lock()
	var allowed []*pendingState
	var rules []*Rule
	for _, ps := range b.pending {
		if ps.Kind != AskNetwork {
			continue
		}
		d := b.cfg.Sandbox.Decide(ps.query)
		if d.Verdict == Allow && d.Rule != nil {
			allowed = append(allowed, ps)
			rules = append(rules, d.Rule)
		}
	}
	b.mu.Unlock()
	for i, ps := range allowed {
		b.resolve(ps, Outcome{Allowed: true, Rule: rules[i], Reason: "allowed by " + rules[i].Pattern.String()}, "allow_pattern", rules[i])
	}
}

// queueLocked queues an event where the change it reports is made; flush
// delivers it.
func (b *Broker) queueLocked(e BrokerEvent) {
	if b.cfg.OnEvent != nil {
		b.queue = append(b.queue, e)
		b.queued++
	}
}

// flush delivers the queued events, in order, outside b.mu, and returns
// once every event queued before the call has been delivered: a decision
// is announced before its traffic goes, and whoever makes changes (a
// member opening and dropping approvals, too) waits for their
// announcement, so that nobody's is put off by another's stream of them.
// Events are delivered a batch at a time, by whichever caller finds none
// under way.
func (b *Broker) flush() {
	if b.cfg.OnEvent == nil {
		return
	}
	b.mu.Lock()
	for mine := b.queued; b.handed < mine; {
		if b.delivering {
			b.deliveredOrIdle.Wait()
			continue
		}
		events := b.queue
		b.queue, b.delivering = nil, true
		b.mu.Unlock()
		b.deliverBatch(events)
	}
	b.mu.Unlock()
}

// deliverBatch hands a batch to OnEvent and returns with b.mu locked. Should
// OnEvent panic, the batch counts as delivered, the next caller may
// deliver, and the panic goes on to the caller with b.mu unlocked: the
// broker stays usable for whoever recovers it.
func (b *Broker) deliverBatch(events []BrokerEvent) {
	delivered := func() {
		b.handed += len(events)
		b.delivering = false
		b.deliveredOrIdle.Broadcast()
	}
	ok := false
	defer func() {
		if !ok {
			b.mu.Lock()
			delivered()
			b.mu.Unlock()
		}
	}()
	for _, e := range events {
		b.cfg.OnEvent(e)
	}
	ok = true
	b.mu.Lock()
	delivered()
}
