package policy

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// SandboxConfig configures a Sandbox.
type SandboxConfig struct {
	// Name is the sandbox's name; see ValidName. Required.
	Name string
	// Path is the policy file (a project YAML with a "sandbox:" section).
	// A missing file means default settings and no rules; it is created on
	// the first persisted edit. Required.
	Path string
	// Now is the clock for the Added time of new rules; nil means time.Now.
	Now func() time.Time
	// UnnamedUntrusted makes a member known only by its bare address (no
	// lease, no container: airlock could not name it) user_added.
	UnnamedUntrusted bool
	// OnResources, when set, hears the resources of every policy put in
	// force, the first one in OpenSandbox included, in order: whoever
	// enforces them outside the policy (the kernel's bandwidth limits)
	// follows every reload and edit. It is called with the Sandbox's lock
	// held and must not call the Sandbox.
	OnResources func(Resources)
}

// Sandbox is one sandbox's policy: the settings and rules of its policy file,
// the session rules that live in memory only, and the compiled Ruleset every
// decision uses. It is safe for concurrent use; Decide takes no lock.
type Sandbox struct {
	name string
	path string
	now  func() time.Time
	// dir is the real path of the policy file's directory (resolveDir),
	// resolved when the sandbox was opened, or by its first edit when the
	// directory was missing then; guarded by mu. Edits open it following
	// no link, so a member that replaces a directory on the path with a
	// link cannot send them elsewhere.
	dir string
	// unnamedUntrusted: see SandboxConfig.UnnamedUntrusted.
	unnamedUntrusted bool
	onResources      func(Resources)

	rs         atomic.Pointer[Ruleset]
	inspectAll atomic.Bool
	allowECH   atomic.Bool
	// fileTrust maps the policy file's MCP servers ("mcp:NAME") to their
	// trust level.
	fileTrust atomic.Pointer[map[string]Trust]

	// trust maps members the file does not list to their level; it is
	// replaced, never changed, under trustMu.
	trustMu sync.Mutex
	trust   atomic.Pointer[map[string]Trust]

	// changed is closed, and replaced by a new channel, whenever what
	// Decide answers may have changed: a policy put in force (setLocked),
	// a member's trust level set (SetTrust). See Changed.
	changed atomic.Pointer[chan struct{}]

	// mu serialises changes and guards the following fields.
	mu      sync.Mutex
	spec    *Spec
	session []*Rule
	// learnUntil is when learn mode ends: the spec's LearnUntil, or
	// DefaultLearnFor after learn mode without one was put in force;
	// zero when the sandbox is not in learn mode.
	learnUntil time.Time
	// written is the spec the last edit of the file wrote (writeHooks.wrote).
	written *Spec
}

// OpenSandbox loads the sandbox's policy file. An invalid file is an error
// that names the file, line and key.
func OpenSandbox(cfg SandboxConfig) (*Sandbox, error) {
	if err := ValidName(cfg.Name); err != nil {
		return nil, err
	}
	if cfg.Path == "" {
		return nil, fmt.Errorf("sandbox %s: no policy file path", cfg.Name)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Sandbox{name: cfg.Name, path: cfg.Path, now: cfg.Now, unnamedUntrusted: cfg.UnnamedUntrusted, onResources: cfg.OnResources}
	s.dir, _ = resolveDir(cfg.Path)
	ch := make(chan struct{})
	s.changed.Store(&ch)
	spec, err := loadOrDefault(cfg.Path)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setLocked(spec, nil)
	s.pinLearnLocked()
	return s, nil
}

// pinLearnLocked writes the end of learn mode into the policy file when
// the file says learn without learn_until: learn mode lasts one
// DefaultLearnFor from when it was put in force, and a restart of airlockd
// must not start another. A file that cannot be written keeps the end in
// memory only.
func (s *Sandbox) pinLearnLocked() {
	if s.spec.UnknownAction != ActionLearn || !s.spec.LearnUntil.IsZero() || s.learnUntil.IsZero() {
		return
	}
	until := s.learnUntil.UTC().Truncate(time.Second)
	if err := setSettings(s.path, Settings{LearnUntil: &until}, s.diskHooksLocked()); err != nil {
		return
	}
	if s.written != nil {
		s.setLocked(s.written, s.session)
		s.written = nil
	}
}

func loadOrDefault(path string) (*Spec, error) {
	spec, err := LoadSpec(path)
	if errors.Is(err, os.ErrNotExist) {
		return DefaultSpec(), nil
	}
	return spec, err
}

// Changed returns a channel that is closed the next time what Decide
// answers may change: every policy put in force (a reload, an edit, a
// change of settings such as unknown_action or learn_until, a session rule
// added or removed) and every trust level set. Whoever keeps something
// open on the strength of a decision (a connection learn mode let through)
// takes the channel, then decides, and decides again once it is closed,
// taking the next one first: no change falls between.
func (s *Sandbox) Changed() <-chan struct{} {
	return *s.changed.Load()
}

// notifyChanged closes the channel Changed returned and puts a new one in
// its place; it is called once the new answers are in force.
func (s *Sandbox) notifyChanged() {
	ch := make(chan struct{})
	close(*s.changed.Swap(&ch))
}

// Name returns the sandbox's name.
func (s *Sandbox) Name() string { return s.name }

// Path returns the sandbox's policy file.
func (s *Sandbox) Path() string { return s.path }

// Decide answers q with the sandbox's current rules. A user_added member
// (see Trust) gets only what allow rules naming it allow.
//
// A high-risk MCP server (fetch, puppeteer, browserbase: see
// KnownMCPServers) has each request asked about, unless a rule naming it
// as member allows it.
func (s *Sandbox) Decide(q Query) Decision {
	q.MemberOnly = q.MemberOnly || s.untrusted(q.Source)
	q.AskEach = q.AskEach || highRisk(q.Source)
	return s.rs.Load().Decide(q)
}

// DecideName answers a question about a DNS name with the sandbox's
// current rules (see Ruleset.DecideName and Decide).
func (s *Sandbox) DecideName(source, name string) Decision {
	return s.rs.Load().decideName(source, name, s.untrusted(source), highRisk(source))
}

// highRisk reports whether source names a known MCP server that reaches
// any URL it is given.
func highRisk(source string) bool {
	name, ok := strings.CutPrefix(source, "mcp:")
	return ok && highRiskServers[strings.ToLower(strings.TrimSpace(name))]
}

// highRiskServers are the names of the known high-risk MCP servers, read
// once: highRisk is asked on every decision.
var highRiskServers = func() map[string]bool {
	m := map[string]bool{}
	for _, k := range knownMCPServers {
		if k.Risk == RiskHigh {
			m[k.Name] = true
		}
	}
	return m
}()

// SetTrust records the trust level of a member that is not one of the
// policy file's mcp_servers (a container labelled airlock.trust). Zero
// forgets it.
func (s *Sandbox) SetTrust(source string, t Trust) {
	s.trustMu.Lock()
	defer s.trustMu.Unlock()
	m := map[string]Trust{}
	if old := s.trust.Load(); old != nil {
		m = maps.Clone(*old)
	}
	if t == 0 {
		delete(m, source)
	} else {
		m[source] = t
	}
	s.trust.Store(&m)
	s.notifyChanged()
}

// Trust returns a member's trust level: the policy file's for its MCP
// servers ("mcp:NAME"), else what SetTrust recorded, else builtin. A member
// airlock could not name (its source is its bare address: no lease, no
// container) is user_added with SandboxConfig.UnnamedUntrusted: it gets
// only rules that name that address.
func (s *Sandbox) Trust(source string) Trust {
	if source == "" {
		return TrustBuiltin
	}
	if c := source[len(source)-1]; s.unnamedUntrusted && (c >= '0' && c <= '9' || c == ':') {
		if _, err := netip.ParseAddr(source); err == nil {
			return TrustUserAdded
		}
	}
	if t := s.fileTrust.Load(); t != nil {
		if v, ok := (*t)[source]; ok {
			return v
		}
	}
	if t := s.trust.Load(); t != nil {
		if v, ok := (*t)[source]; ok {
			return v
		}
	}
	return TrustBuiltin
}

func (s *Sandbox) untrusted(source string) bool { return s.Trust(source) == TrustUserAdded }

// InspectAll reports whether the sandbox intercepts every TLS connection
// (inspect: all), not only those that path or method rules need.
func (s *Sandbox) InspectAll() bool { return s.inspectAll.Load() }

// AllowECH reports whether the policy lets an encrypted ClientHello be
// spliced (allow_ech: true).
func (s *Sandbox) AllowECH() bool { return s.allowECH.Load() }

// Spec returns a copy of the policy file's current content.
func (s *Sandbox) Spec() Spec {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := *s.spec
	c.Auto = slices.Clone(c.Auto)
	c.User = slices.Clone(c.User)
	c.Deny = slices.Clone(c.Deny)
	c.Presets = slices.Clone(c.Presets)
	c.Preset = slices.Clone(c.Preset)
	if c.UnknownAction == ActionLearn {
		c.LearnUntil = s.learnUntil
	}
	c.MCPServers = slices.Clone(c.MCPServers)
	return c
}

// LearnUntil returns when learn mode ends, or zero when the sandbox is not
// in learn mode or its learn mode has ended (it asks).
func (s *Sandbox) LearnUntil() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spec.UnknownAction != ActionLearn || !s.now().Before(s.learnUntil) {
		return time.Time{}
	}
	return s.learnUntil
}

// Rules returns every rule: the allowlist's auto, preset, user and session
// rules, then the denylist's user and session rules.
func (s *Sandbox) Rules() []*Rule {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rulesLocked()
}

func (s *Sandbox) rulesLocked() []*Rule {
	var out []*Rule
	out = append(out, s.spec.Auto...)
	out = append(out, s.spec.Preset...)
	out = append(out, s.spec.User...)
	for _, r := range s.session {
		if r.List == Allowlist {
			out = append(out, r)
		}
	}
	out = append(out, s.spec.Deny...)
	for _, r := range s.session {
		if r.List == Denylist {
			out = append(out, r)
		}
	}
	return out
}

// Rule returns the rule with this ID.
func (s *Sandbox) Rule(id string) (*Rule, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rulesLocked() {
		if r.ID == id {
			return r, true
		}
	}
	return nil, false
}

// AddRequest asks for a rule to be added.
type AddRequest struct {
	Pattern string
	List    List // Allowlist or Denylist
	// Persist writes the rule to the policy file; otherwise it is a session
	// rule, gone when airlockd stops.
	Persist bool
	// Force accepts a broad allow pattern (see ErrBroad). Deny patterns are
	// never refused for being broad.
	Force bool
	// Member restricts the rule to one sandbox member; "" means all.
	Member string
	// Source says where the rule came from ("approved during run").
	Source string
}

// Check says whether Add refuses req for what it asks: its list, its
// pattern (ErrBroad for a broad allow pattern without Force) or its member,
// by the rules the policy file holds entries to. A caller that adds several
// rules checks them all first, so that a bad one adds none.
func (req AddRequest) Check() error {
	_, err := req.parse()
	return err
}

func (req AddRequest) parse() (Pattern, error) {
	if req.List != Allowlist && req.List != Denylist {
		return Pattern{}, fmt.Errorf("add rule: unknown list %v", req.List)
	}
	p, err := Parse(req.Pattern, ParseOptions{Force: req.Force || req.List == Denylist})
	if err != nil {
		return Pattern{}, err
	}
	if req.Member != "" {
		if err := checkMember(req.Member); err != nil {
			return Pattern{}, err
		}
	}
	return p, nil
}

// Add adds a rule and returns it. Adding a rule that is already there (same
// list, pattern and member) returns the existing rule and changes nothing. A
// persisted rule is on disk when Add returns.
func (s *Sandbox) Add(req AddRequest) (*Rule, error) {
	rules, err := s.AddAll([]AddRequest{req})
	if err != nil {
		return nil, err
	}
	return rules[0], nil
}

// AddAll adds the rules reqs ask for, each as Add adds one, and returns
// them in order. All or nothing: a request Add would refuse adds none, and
// the persisted rules are written to the policy file in one edit, so that
// either every one of them is on disk when AddAll returns or the file and
// the rules in force are as they were.
func (s *Sandbox) AddAll(reqs []AddRequest) ([]*Rule, error) {
	now := s.now().UTC().Truncate(time.Second)
	rules := make([]*Rule, len(reqs))
	for i, req := range reqs {
		p, err := req.parse()
		if err != nil {
			return nil, err
		}
		tier := Session
		if req.Persist {
			tier = User
		}
		rules[i] = NewRule(req.List, tier, p, req.Member, req.Source, now)
		rules[i].Forced = req.Force && req.List == Allowlist
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(rules)
	added := map[string]*Rule{} // by ID: a repeat of a request is the rule it added
	var write, session []*Rule
	for i, r := range rules {
		if old := added[r.ID]; old != nil {
			out[i] = old
			continue
		}
		if old := s.existingLocked(r.ID, reqs[i].Persist); old != nil {
			out[i] = old
			continue
		}
		added[r.ID] = r
		if reqs[i].Persist {
			write = append(write, r)
		} else {
			session = append(session, r)
		}
	}
	session = append(slices.Clone(s.session), session...)
	if len(write) == 0 {
		if len(session) > len(s.session) {
			s.setLocked(s.spec, session)
		}
		return out, nil
	}
	if err := addRules(s.path, write, s.diskHooksLocked()); err != nil {
		return nil, s.fileError(err)
	}
	// Saving a session rule to the project replaces the session copy.
	session = slices.DeleteFunc(session, func(x *Rule) bool { return added[x.ID] != nil && added[x.ID].Tier == User })
	return out, s.editedLocked(session)
}

// existingLocked is the rule in force with this ID that an Add of it
// returns instead of adding it: any, or for a persisted add one that is
// not a session rule (a session rule is saved to the project).
func (s *Sandbox) existingLocked(id string, persist bool) *Rule {
	for _, old := range s.rulesLocked() {
		if old.ID == id && (old.Tier != Session || !persist) {
			return old
		}
	}
	return nil
}

// Remove deletes the user or session rule with this ID and returns it. A
// user rule is gone from disk when Remove returns.
func (s *Sandbox) Remove(id string) (*Rule, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range s.session {
		if r.ID == id {
			s.setLocked(s.spec, slices.Delete(slices.Clone(s.session), i, i+1))
			return r, nil
		}
	}
	var list List
	for _, r := range s.spec.User {
		if r.ID == id {
			list = Allowlist
		}
	}
	for _, r := range s.spec.Deny {
		if r.ID == id {
			list = Denylist
		}
	}
	if list == 0 {
		for _, r := range s.spec.Auto {
			if r.ID == id {
				return nil, fmt.Errorf("remove rule %s (%s): %w; remove its MCP server or auto entry from %s", id, r.Pattern, ErrAutoRule, s.path)
			}
		}
		for _, r := range s.spec.Preset {
			if r.ID == id {
				return nil, fmt.Errorf("remove rule %s (%s): %w; turn its preset %s off in presets", id, r.Pattern, ErrPresetRule, PresetOf(r))
			}
		}
		return nil, fmt.Errorf("remove rule %s: %w", id, ErrNoRule)
	}
	removed, err := removeRule(s.path, list, id, s.diskHooksLocked())
	if err != nil {
		return nil, s.fileError(err)
	}
	return removed, s.editedLocked(s.session)
}

// Reload re-reads the policy file and puts it in force, whatever it says:
// it is for a person's explicit reload. On error the rules in force stay as
// they were and the error names the file, line and key.
func (s *Sandbox) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A person's reload is a trusted moment: the directory edits go to is
	// resolved again (a link of theirs may point elsewhere now).
	if dir, err := resolveDir(s.path); err == nil {
		s.dir = dir
	}
	return s.reloadLocked(s.session)
}

// WidensError says that a policy file on disk would give the sandbox's
// members more than the policy in force (see Widens); it was not put in
// force.
type WidensError struct {
	Sandbox, Path string
	Reasons       []string // what widens, as Widens says it
}

func (e *WidensError) Error() string {
	return fmt.Sprintf("sandbox %s: policy file %s widens access (%s); run `airlock reload` (or send airlockd SIGHUP) to apply it",
		e.Sandbox, e.Path, strings.Join(e.Reasons, "; "))
}

// ReloadRestricting re-reads the policy file and puts it in force only if
// it does not widen access (see Widens): an unattended reload, such as
// polling for edits, must not let a member that can write the file widen
// its own policy. A file that widens is a *WidensError and the policy in
// force stays; so does a file that does not parse.
func (s *Sandbox) ReloadRestricting() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	spec, err := loadOrDefault(s.path)
	if err != nil {
		return fmt.Errorf("sandbox %s: reload: %w", s.name, err)
	}
	if why := Widens(s.spec, spec); len(why) > 0 {
		return &WidensError{Sandbox: s.name, Path: s.path, Reasons: why}
	}
	s.setLocked(spec, s.session)
	return nil
}

// diskHooksLocked makes an edit of the policy file refuse a file that holds
// edits that widen access and are not in force: the edit rewrites the file
// and then puts all of it in force, so it would apply them without anyone
// asking. The check runs on the file as the edit reads it, under its lock.
func (s *Sandbox) diskHooksLocked() writeHooks {
	inForce := s.spec
	s.written = nil
	if s.dir == "" {
		s.dir, _ = resolveDir(s.path)
	}
	return writeHooks{
		dir: s.dir,
		check: func(disk *Spec) error {
			if why := Widens(inForce, disk); len(why) > 0 {
				return &WidensError{Sandbox: s.name, Path: s.path, Reasons: why}
			}
			return nil
		},
		wrote: func(spec *Spec) { s.written = spec },
	}
}

// editedLocked puts in force what the sandbox's own edit wrote (see
// writeHooks.wrote), with session rules session; an edit that changed
// nothing leaves the spec in force as it is. It never reads the file: a
// member that renamed its own file over the policy file after the edit
// would have it put in force past the widening check.
func (s *Sandbox) editedLocked(session []*Rule) error {
	spec := s.written
	s.written = nil
	if spec == nil {
		spec = s.spec
	}
	s.setLocked(spec, session)
	s.pinLearnLocked()
	return nil
}

// fileError names the sandbox in an error of an edit of its policy file; a
// WidensError names it already.
func (s *Sandbox) fileError(err error) error {
	var we *WidensError
	if errors.As(err, &we) {
		return err
	}
	return fmt.Errorf("sandbox %s: %w", s.name, err)
}

func (s *Sandbox) reloadLocked(session []*Rule) error {
	spec, err := loadOrDefault(s.path)
	if err != nil {
		return fmt.Errorf("sandbox %s: reload: %w", s.name, err)
	}
	s.setLocked(spec, session)
	s.pinLearnLocked()
	return nil
}

// setLocked installs a new spec and session rules and compiles them, and
// tells whoever waits on Changed.
func (s *Sandbox) setLocked(spec *Spec, session []*Rule) {
	defer s.notifyChanged()
	switch {
	case spec.UnknownAction != ActionLearn:
		s.learnUntil = time.Time{}
	case !spec.LearnUntil.IsZero():
		s.learnUntil = spec.LearnUntil
	case s.spec == nil || s.spec.UnknownAction != ActionLearn || !s.spec.LearnUntil.IsZero():
		// Learn mode without an end was just set: it lasts the default.
		s.learnUntil = s.now().Add(DefaultLearnFor)
	}
	s.spec, s.session = spec, session
	if s.onResources != nil {
		s.onResources(spec.Resources)
	}
	s.inspectAll.Store(spec.Inspect == InspectAll)
	s.allowECH.Store(spec.AllowECH)
	trust := make(map[string]Trust, len(spec.MCPServers))
	for _, m := range spec.MCPServers {
		trust[m.Source()] = m.Trust
	}
	s.fileTrust.Store(&trust)
	if !spec.Enabled {
		// A disabled sandbox still cages its members: with no policy in
		// force, nothing is allowed.
		s.rs.Store(NewRuleset(ActionDeny))
		return
	}
	s.rs.Store(NewRuleset(spec.UnknownAction, spec.Deny, spec.Auto, spec.Preset, spec.User, session).Learning(s.learnUntil, s.now))
}

// SetSettings changes the sandbox's scalar settings in its policy file and
// puts them in force for the next decision and the next held request
// (requests already held keep their deadline). It returns the settings now
// in force. On error nothing changed.
//
// Turning learn mode on without LearnUntil sets it DefaultLearnFor from
// now.
func (s *Sandbox) SetSettings(set Settings) (Spec, error) {
	if set.UnknownAction != nil && *set.UnknownAction == ActionLearn && set.LearnUntil == nil {
		until := s.now().Add(DefaultLearnFor).UTC().Truncate(time.Second)
		set.LearnUntil = &until
	}
	if err := set.Validate(); err != nil {
		return Spec{}, err
	}
	s.mu.Lock()
	err := setSettings(s.path, set, s.diskHooksLocked())
	if err == nil {
		err = s.editedLocked(s.session)
	}
	s.mu.Unlock()
	if err != nil {
		return Spec{}, s.fileError(err)
	}
	return s.Spec(), nil
}

// ReplaceRequest asks for a rule's pattern to be replaced.
type ReplaceRequest struct {
	ID      string
	Pattern string
	// Force accepts a broad allow pattern (see ErrBroad).
	Force bool
}

// Replace gives the user or session rule with this ID a new pattern and
// returns the old and the new rule. The new rule keeps the old one's list,
// tier, member, source and place in the list; its Added time is now (the
// moment this pattern was allowed or denied). A user rule is changed on
// disk when Replace returns. The same pattern again changes nothing. On
// error (bad pattern, ErrDuplicateRule, ErrAutoRule, ErrNoRule) nothing
// changed.
func (s *Sandbox) Replace(req ReplaceRequest) (old, repl *Rule, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var cur *Rule
	for _, r := range s.rulesLocked() {
		if r.ID == req.ID {
			cur = r
		}
	}
	switch {
	case cur == nil:
		return nil, nil, fmt.Errorf("replace rule %s: %w", req.ID, ErrNoRule)
	case cur.Tier == Auto:
		return nil, nil, fmt.Errorf("replace rule %s (%s): %w; edit its MCP server or auto entry in %s", req.ID, cur.Pattern, ErrAutoRule, s.path)
	case cur.Tier == FromPreset:
		return nil, nil, fmt.Errorf("replace rule %s (%s): %w; turn its preset %s off in presets and add a rule of your own", req.ID, cur.Pattern, ErrPresetRule, PresetOf(cur))
	}
	p, err := Parse(req.Pattern, ParseOptions{Force: req.Force || cur.List == Denylist})
	if err != nil {
		return nil, nil, err
	}
	nr := NewRule(cur.List, cur.Tier, p, cur.Member, cur.Source, s.now().UTC().Truncate(time.Second))
	nr.Forced = req.Force && cur.List == Allowlist
	if nr.ID == cur.ID {
		return cur, cur, nil
	}
	for _, r := range s.rulesLocked() {
		if r.ID == nr.ID {
			return nil, nil, fmt.Errorf("replace rule %s with %s: %w", req.ID, p, ErrDuplicateRule)
		}
	}
	if cur.Tier == Session {
		session := slices.Clone(s.session)
		session[slices.Index(session, cur)] = nr
		s.setLocked(s.spec, session)
		return cur, nr, nil
	}
	if _, err := replaceRule(s.path, cur.List, cur.ID, nr, s.diskHooksLocked()); err != nil {
		return nil, nil, s.fileError(err)
	}
	return cur, nr, s.editedLocked(s.session)
}
