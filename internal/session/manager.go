package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/airlockhq/airlock/policy"
)

// A Task is one execute_task as a Runner runs it.
type Task struct {
	Session   string   // the session's ID
	Member    string   // "session:ID": the member's name in records and approvals
	Workspace string   // the host directory to mount read-write at /workspace
	Image     string   // the agent image
	Command   []string // "{task}" already replaced; empty: the image's command
	Env       []string // NAME=VALUE, AIRLOCK_TASK among them
	Stdin     string   // the task, then end of file
	User      string   // UID:GID, never 0
	Limits    policy.Limits
	Timeout   time.Duration
}

// Outcome is how a task's member ended.
type Outcome struct {
	ExitCode int
	TimedOut bool   // killed at its timeout
	Output   []byte // standard output and error; the runner may keep only a tail
}

// Runner runs tasks as sandbox members.
type Runner interface {
	// Run runs t to its end, or kills it at t.Timeout or when ctx ends.
	// When Run returns, nothing of the task runs any more and its
	// container (if any) is gone. An error means it could not run.
	Run(ctx context.Context, t Task) (Outcome, error)
	// Sweep stops and removes whatever still runs for the sandbox's
	// sessions, which after airlockd restarts is a task whose caller is
	// gone.
	Sweep(ctx context.Context) error
}

// MemberName is the member name records and approvals give a session.
func MemberName(id string) string { return "session:" + id }

// Config configures a Manager.
type Config struct {
	// Sandbox names the sandbox. Required.
	Sandbox string
	// Dir holds the sandbox's sessions, one directory each
	// (STATE_DIR/sessions/SANDBOX). Required; created when missing.
	Dir string
	// Runner runs tasks. Required.
	Runner Runner
	// Settings returns the policy file's sessions: section in force; nil
	// means the sandbox runs no sessions. Required.
	Settings func() *policy.Sessions
	// Network sums up what member did since a time; nil means an empty
	// summary.
	Network func(member string, since time.Time) Network
	// LookupEnv reads airlockd's environment for env entries that name a
	// variable; nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// OnExecuted hears of every task that ran (metrics); runErr says the
	// runner could not run it. Nil means nobody.
	OnExecuted func(res ExecuteResult, runErr bool)
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Manager is one sandbox's session table.
type Manager struct {
	cfg Config
	log *slog.Logger

	// mu guards the following fields.
	mu       sync.Mutex
	sessions map[string]*session
	closed   bool
	wg       sync.WaitGroup // running tasks
}

type session struct {
	ID       string    `json:"id"`
	User     string    `json:"user_id"`
	Created  time.Time `json:"created"`
	LastUsed time.Time `json:"last_used"`
	Tasks    int       `json:"tasks"`
	Last     string    `json:"last_status,omitempty"`
	Duration float64   `json:"last_duration_seconds,omitempty"`
	Files    []string  `json:"files_created,omitempty"`
	Net      Network   `json:"network"`

	busy   bool
	cancel context.CancelFunc // of the running task
	done   chan struct{}      // closed when the running task ends
	idle   *time.Timer
}

// New returns a Manager; Start loads the sessions an earlier airlockd left.
func New(cfg Config) (*Manager, error) {
	if cfg.Sandbox == "" || cfg.Dir == "" || cfg.Runner == nil || cfg.Settings == nil {
		return nil, errors.New("session: sandbox, dir, runner and settings are required")
	}
	if cfg.LookupEnv == nil {
		cfg.LookupEnv = os.LookupEnv
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Manager{cfg: cfg, log: cfg.Logger.With("component", "sessions", "sandbox", cfg.Sandbox), sessions: map[string]*session{}}, nil
}

var idPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// Start removes what still runs of the sandbox's sessions (their callers
// went with the airlockd that started them), adopts the sessions whose
// workspace and record are on disk, and removes anything else there.
func (m *Manager) Start(ctx context.Context) error {
	if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("sessions directory: %w", err)
	}
	if err := m.cfg.Runner.Sweep(ctx); err != nil {
		return fmt.Errorf("remove the members of sessions an earlier airlockd left: %w", err)
	}
	ents, err := os.ReadDir(m.cfg.Dir)
	if err != nil {
		return err
	}
	idle := m.idleCleanup()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range ents {
		dir := filepath.Join(m.cfg.Dir, e.Name())
		s, err := readRecord(dir)
		if err != nil || !idPattern.MatchString(e.Name()) || s.ID != e.Name() || m.cfg.Settings() == nil {
			m.log.Info("removing a session left without its record, or in a sandbox without sessions", "dir", dir, "err", err)
			os.RemoveAll(dir)
			continue
		}
		m.sessions[s.ID] = s
		left := max(idle-time.Since(s.LastUsed), time.Second)
		s.idle = time.AfterFunc(left, func() { m.expire(s.ID) })
		m.log.Info("session adopted", "session", s.ID, "user", s.User)
	}
	return nil
}

func readRecord(dir string) (*session, error) {
	b, err := os.ReadFile(filepath.Join(dir, "session.json"))
	if err != nil {
		return nil, err
	}
	var s session
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

func (m *Manager) dir(id string) string     { return filepath.Join(m.cfg.Dir, id) }
func (m *Manager) workdir(id string) string { return filepath.Join(m.cfg.Dir, id, "workspace") }
func (m *Manager) writeRecord(s *session) error {
	b, _ := json.Marshal(s)
	tmp := filepath.Join(m.dir(s.ID), "session.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(m.dir(s.ID), "session.json"))
}

func (m *Manager) idleCleanup() time.Duration {
	if st := m.cfg.Settings(); st != nil {
		return st.IdleCleanup
	}
	return policy.DefaultSessionIdleCleanup
}

// Close ends running tasks (their members are killed), waits for them and
// stops the idle timers. Sessions stay on disk for the next Start. It is
// idempotent.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closed = true
	for _, s := range m.sessions {
		if s.cancel != nil {
			s.cancel()
		}
		if s.idle != nil {
			s.idle.Stop()
		}
	}
	m.mu.Unlock()
	m.wg.Wait()
	return nil
}

// Count returns how many sessions there are.
func (m *Manager) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sessions)
}

func checkUser(u string) error {
	switch {
	case u == "":
		return errorf(BadInput, "user_id is required: the platform's user the session belongs to")
	case len(u) > maxUserID:
		return errorf(BadInput, "user_id is longer than %d bytes", maxUserID)
	case strings.ContainsFunc(u, func(r rune) bool { return unicode.IsControl(r) || r == unicode.ReplacementChar }):
		return errorf(BadInput, "user_id holds control characters")
	}
	return nil
}

// lookupLocked finds session id for user ("" skips the owner check).
func (m *Manager) lookupLocked(id, user string) (*session, error) {
	s, ok := m.sessions[id]
	if !idPattern.MatchString(id) || !ok {
		return nil, errorf(NotFound, "no session %q in sandbox %s (it ended, was cleaned up, or never was); leave session_id out to start one", truncate(id, 40), m.cfg.Sandbox)
	}
	if user != "" && s.User != user {
		return nil, errorf(OtherUser, "session %s belongs to another user", id)
	}
	return s, nil
}

// Execute runs a task, in a new session or in req.SessionID of the same
// user. A refused request is an *Error and changes nothing.
func (m *Manager) Execute(ctx context.Context, req ExecuteRequest) (ExecuteResult, error) {
	st := m.cfg.Settings()
	if st == nil {
		return ExecuteResult{}, errorf(Unavailable, "sandbox %s runs no sessions: its policy file has no sessions: section (see docs/policy.md)", m.cfg.Sandbox)
	}
	if err := checkUser(req.UserID); err != nil {
		return ExecuteResult{}, err
	}
	switch {
	case strings.TrimSpace(req.Task) == "":
		return ExecuteResult{}, errorf(BadInput, "task is empty: say what the agent is to do")
	case len(req.Task) > MaxTask:
		return ExecuteResult{}, errorf(BadInput, "task is %d bytes, over the cap of %d", len(req.Task), MaxTask)
	case strings.ContainsRune(req.Task, 0):
		return ExecuteResult{}, errorf(BadInput, "task holds a NUL byte")
	}
	timeout := st.Timeout
	if req.Timeout != 0 {
		// Compared in seconds: a huge one would wrap round as a Duration.
		if req.Timeout < 1 || req.Timeout > int(policy.MaxSessionTaskTimeout/time.Second) {
			return ExecuteResult{}, errorf(BadInput, "timeout %d is out of range; want 1 to %d seconds", req.Timeout, int(policy.MaxSessionTaskTimeout/time.Second))
		}
		timeout = time.Duration(req.Timeout) * time.Second
	}
	uploads, err := decodeUploads(req.Files)
	if err != nil {
		return ExecuteResult{}, err
	}
	uid, gid := IDs(st.User)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, created, err := m.claim(req.SessionID, req.UserID, st.MaxSessions, uid, gid, cancel)
	if err != nil {
		return ExecuteResult{}, err
	}
	ws := workspace{dir: m.workdir(s.ID), uid: uid, gid: gid}
	if err := ws.checkUploads(uploads); err != nil {
		m.release(s, created)
		return ExecuteResult{}, err
	}
	if err := ws.write(uploads); err != nil {
		m.release(s, created) // a new session goes; an old one keeps what was written before the failure
		return ExecuteResult{}, err
	}
	res := m.run(ctx, s, ws, st, req.Task, timeout)
	m.mu.Lock()
	s.LastUsed, s.Tasks, s.Last, s.Duration, s.Files = time.Now(), s.Tasks+1, res.Status, res.DurationSeconds, res.FilesCreated
	s.Net = s.Net.add(res.Network)
	m.mu.Unlock()
	if err := m.writeRecord(s); err != nil {
		m.log.Warn("write session record", "session", s.ID, "err", err)
	}
	m.release(s, false)
	return res, nil
}

// claim marks session id busy, or makes a new one; created says which.
// cancel ends the task, for Cleanup.
func (m *Manager) claim(id, user string, maxSessions, uid, gid int, cancel context.CancelFunc) (*session, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, false, errorf(Unavailable, "airlockd is stopping")
	}
	if id != "" {
		s, err := m.lookupLocked(id, user)
		if err != nil {
			return nil, false, err
		}
		if s.busy {
			return nil, false, errorf(Busy, "session %s is running a task; wait for its answer, or start another session", id)
		}
		s.busy, s.done, s.cancel = true, make(chan struct{}), cancel
		m.wg.Add(1)
		if s.idle != nil {
			s.idle.Stop()
		}
		return s, false, nil
	}
	if len(m.sessions) >= maxSessions {
		return nil, false, errorf(Full, "sandbox %s has %d sessions, its max_sessions; clean one up (cleanup_session) or raise sessions.max_sessions", m.cfg.Sandbox, len(m.sessions))
	}
	now := time.Now()
	s := &session{ID: newID(), User: user, Created: now, LastUsed: now, busy: true, done: make(chan struct{}), cancel: cancel}
	if err := os.MkdirAll(m.workdir(s.ID), 0o700); err != nil {
		return nil, false, fmt.Errorf("make the session's workspace: %w", err)
	}
	if os.Geteuid() == 0 {
		os.Chown(m.workdir(s.ID), uid, gid)
	}
	if err := m.writeRecord(s); err != nil {
		os.RemoveAll(m.dir(s.ID))
		return nil, false, fmt.Errorf("write the session's record: %w", err)
	}
	m.sessions[s.ID] = s
	m.wg.Add(1)
	m.log.Info("session started", "session", s.ID, "user", user)
	return s, true, nil
}

// release ends a claim; drop removes a session made for a request that was
// then refused. A session cleaned up meanwhile goes too: its Cleanup may
// have stopped waiting for the task, and left the workspace to this.
func (m *Manager) release(s *session, drop bool) {
	m.mu.Lock()
	s.busy, s.cancel = false, nil
	close(s.done)
	drop = drop || m.sessions[s.ID] != s
	if drop {
		delete(m.sessions, s.ID)
	} else if !m.closed {
		s.idle = time.AfterFunc(m.idleCleanup(), func() { m.expire(s.ID) })
	}
	m.mu.Unlock()
	if drop {
		os.RemoveAll(m.dir(s.ID))
	}
	m.wg.Done()
}

// run runs one task and sums it up.
func (m *Manager) run(ctx context.Context, s *session, ws workspace, st *policy.Sessions, task string, timeout time.Duration) ExecuteResult {
	res := ExecuteResult{SessionID: s.ID, FilesCreated: []string{}}
	before, err := ws.snapshot()
	if err != nil {
		m.log.Warn("snapshot the workspace", "session", s.ID, "err", err)
	}
	t := Task{
		Session: s.ID, Member: MemberName(s.ID), Workspace: ws.dir, Image: st.Image,
		Command: expand(st.Command, task), Env: m.env(st.Env, task), Stdin: task,
		User: st.User, Limits: st.Limits, Timeout: timeout,
	}
	start := time.Now()
	out, runErr := m.cfg.Runner.Run(ctx, t)
	res.DurationSeconds = time.Since(start).Seconds()
	res.Output = tail(out.Output)
	switch {
	case runErr != nil:
		res.Status, res.Error = StatusFailed, "the task could not run: "+runErr.Error()
		m.log.Error("session task could not run", "session", s.ID, "err", runErr)
	case out.TimedOut:
		res.Status, res.Error = StatusTimeout, fmt.Sprintf("the task ran past its timeout of %s and was killed", timeout)
	case out.ExitCode != 0:
		res.Status, res.Error = StatusFailed, "the agent exited with code "+strconv.Itoa(out.ExitCode)
	default:
		res.Status = StatusCompleted
	}
	after, err := ws.snapshot()
	if err != nil {
		m.log.Warn("snapshot the workspace", "session", s.ID, "err", err)
	}
	res.FilesCreated = changed(before, after)
	if m.cfg.Network != nil {
		res.Network = m.cfg.Network(t.Member, start)
	}
	if res.Network.Hosts == nil {
		res.Network.Hosts = []string{}
	}
	m.log.Info("session task", "session", s.ID, "status", res.Status, "duration", res.DurationSeconds, "files_created", len(res.FilesCreated))
	if m.cfg.OnExecuted != nil {
		m.cfg.OnExecuted(res, runErr != nil)
	}
	return res
}

// expand puts the task in place of each argument's "{task}".
func expand(cmd []string, task string) []string {
	out := make([]string, len(cmd))
	for i, a := range cmd {
		out[i] = strings.ReplaceAll(a, "{task}", task)
	}
	return out
}

// env is the member's environment: the section's values, the host's
// values of the names it lists (left out when the host has none), and the
// task.
func (m *Manager) env(entries []string, task string) []string {
	var out []string
	for _, e := range entries {
		if strings.Contains(e, "=") {
			out = append(out, e)
		} else if v, ok := m.cfg.LookupEnv(e); ok {
			out = append(out, e+"="+v)
		}
	}
	return append(out, "AIRLOCK_TASK="+task)
}

// Files returns files of a session's workspace.
func (m *Manager) Files(_ context.Context, req FilesRequest) (FilesResult, error) {
	m.mu.Lock()
	s, err := m.lookupLocked(req.SessionID, req.UserID)
	m.mu.Unlock()
	if err != nil {
		return FilesResult{}, err
	}
	files, err := workspace{dir: m.workdir(s.ID)}.read(req.Paths)
	if err != nil {
		return FilesResult{}, err
	}
	return FilesResult{Files: files}, nil
}

// Cleanup ends a session: a running task is killed, then the workspace is
// removed.
func (m *Manager) Cleanup(ctx context.Context, req CleanupRequest) (CleanupResult, error) {
	m.mu.Lock()
	s, err := m.lookupLocked(req.SessionID, req.UserID)
	if err != nil {
		m.mu.Unlock()
		return CleanupResult{}, err
	}
	delete(m.sessions, s.ID)
	cancel, done := s.cancel, s.done
	if s.idle != nil {
		s.idle.Stop()
	}
	m.mu.Unlock()
	if s.busy && cancel != nil {
		cancel()
		select {
		case <-done:
		case <-ctx.Done():
			return CleanupResult{}, fmt.Errorf("session %s: its task is still ending: %w", s.ID, ctx.Err())
		}
	}
	if err := os.RemoveAll(m.dir(s.ID)); err != nil {
		return CleanupResult{}, fmt.Errorf("remove the workspace of session %s: %w", s.ID, err)
	}
	m.log.Info("session cleaned up", "session", s.ID, "user", s.User)
	return CleanupResult{SessionID: s.ID, Removed: true}, nil
}

// expire removes a session idle for idle_cleanup.
func (m *Manager) expire(id string) {
	m.mu.Lock()
	s, ok := m.sessions[id]
	if !ok || s.busy || m.closed || time.Since(s.LastUsed) < m.idleCleanup()-time.Second/10 {
		m.mu.Unlock()
		return
	}
	delete(m.sessions, id)
	m.mu.Unlock()
	os.RemoveAll(m.dir(id))
	m.log.Info("idle session removed", "session", id, "user", s.User, "idle_cleanup", m.idleCleanup())
}

// Get returns one session.
func (m *Manager) Get(_ context.Context, id, user string) (Info, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.lookupLocked(id, user)
	if err != nil {
		return Info{}, err
	}
	return s.info(time.Now()), nil
}

// List returns the sessions of user, or all with "", oldest first.
func (m *Manager) List(_ context.Context, req ListRequest) (ListResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []Info{}
	now := time.Now()
	for _, s := range m.sessions {
		if req.UserID == "" || s.User == req.UserID {
			out = append(out, s.info(now))
		}
	}
	slices.SortFunc(out, func(a, b Info) int { return a.Created.Compare(b.Created) })
	return ListResult{Sessions: out}, nil
}

func (s *session) info(now time.Time) Info {
	status := "idle"
	if s.busy {
		status = "busy"
	}
	return Info{SessionID: s.ID, UserID: s.User, Member: MemberName(s.ID), Status: status, Created: s.Created, LastUsed: s.LastUsed,
		AgeSeconds: now.Sub(s.Created).Seconds(), IdleSeconds: now.Sub(s.LastUsed).Seconds(), Tasks: s.Tasks, LastStatus: s.Last,
		LastDuration: s.Duration, FilesCreated: slices.Clone(orEmpty(s.Files)), Network: s.Net.add(Network{})}
}

// add sums up two tasks' networks: the counts, and the hosts of both
// (sorted, at most maxHosts).
func (n Network) add(o Network) Network {
	hosts := slices.Concat(n.Hosts, o.Hosts)
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	if len(hosts) > maxHosts {
		hosts = hosts[:maxHosts]
	}
	return Network{Allowed: n.Allowed + o.Allowed, Denied: n.Denied + o.Denied, Held: n.Held + o.Held, Hosts: orEmpty(hosts)}
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func newID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// IDs reads a sessions.user "UID:GID", which the policy file has checked.
func IDs(user string) (int, int) {
	u, g, _ := strings.Cut(user, ":")
	uid, _ := strconv.Atoi(u)
	gid, _ := strconv.Atoi(g)
	return uid, gid
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
