package session

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/airlockhq/airlock/policy"
)

// fakeRunner carries out a tiny task language in the workspace, the way
// the test agent image does: "write PATH TEXT", "copy FROM TO",
// "sleep", "fail", "say TEXT".
type fakeRunner struct {
	mu     sync.Mutex
	tasks  []Task
	swept  int
	inside chan struct{} // gets a value when a "sleep" task starts
}

func (f *fakeRunner) Run(ctx context.Context, t Task) (Outcome, error) {
	f.mu.Lock()
	f.tasks = append(f.tasks, t)
	f.mu.Unlock()
	var out Outcome
	for _, step := range strings.Split(t.Stdin, ";") {
		verb, rest, _ := strings.Cut(strings.TrimSpace(step), " ")
		switch verb {
		case "write":
			p, text, _ := strings.Cut(rest, " ")
			os.MkdirAll(filepath.Dir(filepath.Join(t.Workspace, p)), 0o755)
			os.WriteFile(filepath.Join(t.Workspace, p), []byte(text), 0o644)
		case "copy":
			from, to, _ := strings.Cut(rest, " ")
			b, _ := os.ReadFile(filepath.Join(t.Workspace, from))
			os.MkdirAll(filepath.Dir(filepath.Join(t.Workspace, to)), 0o755)
			os.WriteFile(filepath.Join(t.Workspace, to), b, 0o644)
		case "link":
			target, name, _ := strings.Cut(rest, " ")
			os.Symlink(target, filepath.Join(t.Workspace, name))
		case "fifo":
			syscall.Mkfifo(filepath.Join(t.Workspace, rest), 0o644)
		case "say":
			out.Output = append(out.Output, rest...)
		case "fail":
			out.ExitCode = 3
		case "sleep":
			if f.inside != nil {
				f.inside <- struct{}{}
			}
			select {
			case <-time.After(t.Timeout):
				out.TimedOut, out.ExitCode = true, 137
			case <-ctx.Done():
				out.ExitCode = 137
			}
		}
	}
	return out, nil
}

func (f *fakeRunner) Sweep(context.Context) error {
	f.mu.Lock()
	f.swept++
	f.mu.Unlock()
	return nil
}

func newManager(t *testing.T, dir string, st *policy.Sessions) (*Manager, *fakeRunner) {
	t.Helper()
	r := &fakeRunner{}
	m, err := New(Config{Sandbox: "sb", Dir: dir, Runner: r, Settings: func() *policy.Sessions { return st },
		Network: func(member string, since time.Time) Network {
			return Network{Allowed: 1, Hosts: []string{member}}
		},
		LookupEnv: func(k string) (string, bool) { return "host-" + k, k == "HOST_KEY" },
		Logger:    slog.New(slog.NewTextHandler(tlogWriter{t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, r
}

func settings() *policy.Sessions {
	return &policy.Sessions{Image: "agent:1", Command: []string{"agent", "--do", "{task}!"}, Env: []string{"A=1", "HOST_KEY", "MISSING"},
		User: policy.DefaultSessionUser, Timeout: 5 * time.Second, IdleCleanup: time.Hour, MaxSessions: 3}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func kindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return 0
}

func TestExecute(t *testing.T) {
	m, r := newManager(t, t.TempDir(), settings())
	ctx := context.Background()
	res, err := m.Execute(ctx, ExecuteRequest{Task: "copy in.txt out/copy.txt; say hello", UserID: "alice",
		Files: []UploadFile{{Path: "in.txt", Content: b64("data")}, {Path: "keep/same.txt", Content: b64("x")}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != StatusCompleted || res.Output != "hello" || res.Error != "" {
		t.Errorf("result %+v", res)
	}
	// The uploads were there before the task; only what it wrote is new.
	if diff := cmp.Diff([]string{"out/copy.txt"}, res.FilesCreated); diff != "" {
		t.Errorf("files_created (-want +got):\n%s", diff)
	}
	if res.Network.Allowed != 1 || res.Network.Hosts[0] != "session:"+res.SessionID {
		t.Errorf("network %+v: want the summary of member session:%s", res.Network, res.SessionID)
	}
	task := r.tasks[0]
	if diff := cmp.Diff([]string{"agent", "--do", "copy in.txt out/copy.txt; say hello!"}, task.Command); diff != "" {
		t.Errorf("command (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"A=1", "HOST_KEY=host-HOST_KEY", "AIRLOCK_TASK=copy in.txt out/copy.txt; say hello"}, task.Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	if task.Member != "session:"+res.SessionID || task.Timeout != 5*time.Second {
		t.Errorf("task %+v", task)
	}
	files, err := m.Files(ctx, FilesRequest{SessionID: res.SessionID, Paths: []string{"out/copy.txt", "./in.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []FileContent{{Path: "out/copy.txt", Content: b64("data"), SizeBytes: 4, MimeType: "text/plain; charset=utf-8"}, {Path: "in.txt", Content: b64("data"), SizeBytes: 4, MimeType: "text/plain; charset=utf-8"}}
	if diff := cmp.Diff(want, files.Files); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}

	// The same session again: a changed file counts, an unchanged one not.
	res2, err := m.Execute(ctx, ExecuteRequest{Task: "write in.txt changed; write keep/same.txt x; fail", UserID: "alice", SessionID: res.SessionID, Timeout: 9})
	if err != nil {
		t.Fatal(err)
	}
	if res2.SessionID != res.SessionID || res2.Status != StatusFailed || !strings.Contains(res2.Error, "code 3") {
		t.Errorf("second task %+v", res2)
	}
	if diff := cmp.Diff([]string{"in.txt"}, res2.FilesCreated); diff != "" {
		t.Errorf("files_created (-want +got):\n%s", diff)
	}
	if r.tasks[1].Timeout != 9*time.Second {
		t.Errorf("timeout %v, want the request's 9s", r.tasks[1].Timeout)
	}

	// Users see their own sessions only.
	other, err := m.Execute(ctx, ExecuteRequest{Task: "say hi", UserID: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	got := list(m, ListRequest{UserID: "alice"})
	if len(got) != 1 || got[0].SessionID != res.SessionID || got[0].Tasks != 2 || got[0].LastStatus != StatusFailed {
		t.Fatalf("alice's sessions %+v", got)
	}
	// The list shows the last task's files and duration, and the network
	// of both tasks.
	if diff := cmp.Diff([]string{"in.txt"}, got[0].FilesCreated); diff != "" || got[0].LastDuration != res2.DurationSeconds {
		t.Errorf("last task's files (-want +got):\n%s; duration %v, want %v", diff, got[0].LastDuration, res2.DurationSeconds)
	}
	if diff := cmp.Diff(Network{Allowed: 2, Hosts: []string{"session:" + res.SessionID}}, got[0].Network); diff != "" {
		t.Errorf("the session's network (-want +got):\n%s", diff)
	}
	if got := list(m, ListRequest{}); len(got) != 2 {
		t.Errorf("all sessions %+v", got)
	}
	if _, err := m.Execute(ctx, ExecuteRequest{Task: "say hi", UserID: "alice", SessionID: other.SessionID}); kindOf(err) != OtherUser {
		t.Errorf("alice in bob's session: %v", err)
	}
	if _, err := m.Files(ctx, FilesRequest{SessionID: other.SessionID, UserID: "alice", Paths: []string{"x"}}); kindOf(err) != OtherUser {
		t.Errorf("alice reading bob's session: %v", err)
	}

	// Cleanup removes the workspace; the session is then unknown.
	if _, err := m.Cleanup(ctx, CleanupRequest{SessionID: res.SessionID}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.dir(res.SessionID)); !os.IsNotExist(err) {
		t.Errorf("workspace still there: %v", err)
	}
	if _, err := m.Files(ctx, FilesRequest{SessionID: res.SessionID, Paths: []string{"in.txt"}}); kindOf(err) != NotFound {
		t.Errorf("files of a cleaned-up session: %v", err)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	dir := t.TempDir()
	m, r := newManager(t, dir, settings())
	ctx := context.Background()
	res, err := m.Execute(ctx, ExecuteRequest{Task: "write a.txt a; link /etc/passwd out; link ../../.. up; fifo pipe; link a.txt inside", UserID: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	os.Symlink(outside, filepath.Join(m.workdir(res.SessionID), "outdir"))
	id := res.SessionID
	big := strings.Repeat("a", MaxUploadFile+1)
	tests := []struct {
		name string
		req  ExecuteRequest
		kind Kind
		msg  string
	}{
		{name: "dot dot", req: ExecuteRequest{Task: "t", UserID: "alice", SessionID: id, Files: []UploadFile{{Path: "ok.txt", Content: b64("x")}, {Path: "a/../../x", Content: b64("x")}}}, kind: BadInput, msg: ".. segment"},
		{name: "absolute", req: ExecuteRequest{Task: "t", UserID: "alice", SessionID: id, Files: []UploadFile{{Path: "/etc/x", Content: b64("x")}}}, kind: BadInput, msg: "is absolute"},
		{name: "through a link out", req: ExecuteRequest{Task: "t", UserID: "alice", SessionID: id, Files: []UploadFile{{Path: "ok.txt", Content: b64("x")}, {Path: "outdir/x", Content: b64("x")}}}, kind: BadInput, msg: "resolves outside /workspace"},
		{name: "onto a link out", req: ExecuteRequest{Task: "t", UserID: "alice", SessionID: id, Files: []UploadFile{{Path: "out", Content: b64("x")}}}, kind: BadInput, msg: "outside /workspace"},
		{name: "onto a fifo", req: ExecuteRequest{Task: "t", UserID: "alice", SessionID: id, Files: []UploadFile{{Path: "pipe", Content: b64("x")}}}, kind: BadInput, msg: "not a regular file"},
		{name: "base64", req: ExecuteRequest{Task: "t", UserID: "alice", SessionID: id, Files: []UploadFile{{Path: "ok.txt", Content: "not base64!"}}}, kind: BadInput, msg: "not valid base64"},
		{name: "too big", req: ExecuteRequest{Task: "t", UserID: "alice", SessionID: id, Files: []UploadFile{{Path: "big", Content: b64(big)}}}, kind: BadInput, msg: "cap of one upload"},
		{name: "timeout too long", req: ExecuteRequest{Task: "t", UserID: "alice", SessionID: id, Timeout: 3601}, kind: BadInput, msg: "want 1 to 3600"},
		{name: "timeout wrapping past the int64 of a duration", req: ExecuteRequest{Task: "t", UserID: "alice", SessionID: id, Timeout: 18446744074}, kind: BadInput, msg: "out of range"},
		{name: "timeout negative", req: ExecuteRequest{Task: "t", UserID: "alice", SessionID: id, Timeout: -1}, kind: BadInput, msg: "out of range"},
		{name: "no user", req: ExecuteRequest{Task: "t"}, kind: BadInput, msg: "user_id is required"},
		{name: "no task", req: ExecuteRequest{Task: " ", UserID: "alice"}, kind: BadInput, msg: "task is empty"},
		{name: "unknown session", req: ExecuteRequest{Task: "t", UserID: "alice", SessionID: "0123456789abcdef0123456789abcdef"}, kind: NotFound, msg: "no session"},
		{name: "malformed session", req: ExecuteRequest{Task: "t", UserID: "alice", SessionID: "../x"}, kind: NotFound, msg: "no session"},
		{name: "new session with a bad file", req: ExecuteRequest{Task: "t", UserID: "carol", Files: []UploadFile{{Path: "../x", Content: b64("x")}}}, kind: BadInput, msg: ".. segment"},
	}
	before, _ := workspace{dir: m.workdir(id)}.snapshot()
	info, _ := m.Get(ctx, id, "")
	tasks := len(r.tasks)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := m.Execute(ctx, tt.req)
			if kindOf(err) != tt.kind || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %v (kind %d), want kind %d saying %q", err, kindOf(err), tt.kind, tt.msg)
			}
		})
	}
	after, _ := workspace{dir: m.workdir(id)}.snapshot()
	if got := changed(before, after); len(got) != 0 || len(after) != len(before) {
		t.Errorf("refused requests changed the workspace: %v", got)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("a refused upload wrote outside the workspace: %v", ents)
	}
	if info2, _ := m.Get(ctx, id, ""); info2.LastUsed != info.LastUsed || info2.Tasks != info.Tasks || m.Count() != 1 || len(r.tasks) != tasks {
		t.Errorf("refused requests changed the table: %+v → %+v, %d sessions, %d tasks", info, info2, m.Count(), len(r.tasks))
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("sessions directory holds %d entries, want the one session", len(ents))
	}

	reads := []struct {
		name  string
		paths []string
		msg   string
	}{
		{name: "link out", paths: []string{"a.txt", "out"}, msg: "outside /workspace"},
		{name: "dir link out", paths: []string{"outdir/x"}, msg: "outside /workspace"},
		{name: "relative link out", paths: []string{"up/etc/passwd"}, msg: "outside /workspace"},
		{name: "dot dot", paths: []string{"../session.json"}, msg: ".. segment"},
		{name: "absolute", paths: []string{"/workspace/a.txt"}, msg: `write "a.txt"`},
		{name: "fifo", paths: []string{"pipe"}, msg: "not a regular file"},
		{name: "missing", paths: []string{"nope"}, msg: "does not exist"},
		{name: "none", paths: nil, msg: "no paths"},
	}
	for _, tt := range reads {
		t.Run("read "+tt.name, func(t *testing.T) {
			_, err := m.Files(ctx, FilesRequest{SessionID: id, Paths: tt.paths})
			if kindOf(err) != BadInput || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %v, want one saying %q", err, tt.msg)
			}
		})
	}
	// A link inside the workspace to a file inside it is fine.
	if got, err := m.Files(ctx, FilesRequest{SessionID: id, Paths: []string{"inside"}}); err != nil || got.Files[0].Content != b64("a") {
		t.Errorf("read through an inside link: %+v %v", got, err)
	}
	os.WriteFile(filepath.Join(m.workdir(id), "huge"), make([]byte, MaxReadFile+1), 0o644)
	if _, err := m.Files(ctx, FilesRequest{SessionID: id, Paths: []string{"huge"}}); kindOf(err) != BadInput || !strings.Contains(err.Error(), "cap of one file") {
		t.Errorf("read over the cap: %v", err)
	}
}

func TestBusyTimeoutAndLimit(t *testing.T) {
	st := settings()
	st.Timeout = 50 * time.Millisecond
	m, r := newManager(t, t.TempDir(), st)
	ctx := context.Background()
	res, err := m.Execute(ctx, ExecuteRequest{Task: "sleep", UserID: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != StatusTimeout || !strings.Contains(res.Error, "timeout") {
		t.Errorf("result %+v, want timeout", res)
	}
	r.inside = make(chan struct{}, 1)
	done := make(chan ExecuteResult)
	go func() {
		res, _ := m.Execute(ctx, ExecuteRequest{Task: "sleep", UserID: "alice", SessionID: res.SessionID, Timeout: 60})
		done <- res
	}()
	<-r.inside
	if _, err := m.Execute(ctx, ExecuteRequest{Task: "say", UserID: "alice", SessionID: res.SessionID}); kindOf(err) != Busy {
		t.Errorf("a task in a busy session: %v", err)
	}
	if got := list(m, ListRequest{})[0].Status; got != "busy" {
		t.Errorf("status %q, want busy", got)
	}
	for range 2 {
		if _, err := m.Execute(ctx, ExecuteRequest{Task: "say", UserID: "bob"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Execute(ctx, ExecuteRequest{Task: "say", UserID: "bob"}); kindOf(err) != Full || !strings.Contains(err.Error(), "max_sessions") {
		t.Errorf("a fourth session with max_sessions 3: %v", err)
	}
	// Cleaning up a busy session ends its task first.
	if _, err := m.Cleanup(ctx, CleanupRequest{SessionID: res.SessionID}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the task of a cleaned-up session still runs")
	}
	if m.Count() != 2 {
		t.Errorf("%d sessions, want 2", m.Count())
	}
}

func TestIdleCleanupAndRestart(t *testing.T) {
	dir := t.TempDir()
	st := settings()
	m, _ := newManager(t, dir, st)
	ctx := context.Background()
	keep, err := m.Execute(ctx, ExecuteRequest{Task: "write f x", UserID: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	os.MkdirAll(filepath.Join(dir, "stray"), 0o700)

	// A new airlockd adopts the session, sweeps members and drops strays.
	m2, r2 := newManager(t, dir, st)
	if r2.swept != 1 {
		t.Errorf("Start swept %d times, want 1", r2.swept)
	}
	if got := list(m2, ListRequest{UserID: "alice"}); len(got) != 1 || got[0].SessionID != keep.SessionID || got[0].Network.Allowed != 1 || len(got[0].FilesCreated) != 1 {
		t.Errorf("adopted %+v, want the session with its files and network", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "stray")); !os.IsNotExist(err) {
		t.Errorf("a stray directory stayed: %v", err)
	}
	m2.Close()

	st.IdleCleanup = 100 * time.Millisecond
	m3, _ := newManager(t, dir, st)
	idle, err := m3.Execute(ctx, ExecuteRequest{Task: "say", UserID: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); m3.Count() > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("idle sessions stayed: %+v", list(m3, ListRequest{}))
		}
	}
	for _, id := range []string{idle.SessionID, keep.SessionID} {
		if _, err := os.Stat(filepath.Join(dir, id)); !os.IsNotExist(err) {
			t.Errorf("workspace of idle session %s stayed: %v", id, err)
		}
	}
}

func TestOutputTail(t *testing.T) {
	long := strings.Repeat("x", MaxOutput) + "END"
	got := tail([]byte(long))
	if !strings.HasSuffix(got, "END") || !strings.HasPrefix(got, "[airlock: 3 earlier bytes cut") {
		t.Errorf("tail starts %.60q, ends %q", got, got[len(got)-5:])
	}
	if got := tail([]byte("ok\xff")); got != "ok\uFFFD" {
		t.Errorf("invalid UTF-8 came out as %q", got)
	}
}

type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func list(m *Manager, req ListRequest) []Info {
	res, _ := m.List(context.Background(), req)
	return res.Sessions
}

// stubbornRunner's tasks end only when let is closed, whatever their
// context says: a member slow to die.
type stubbornRunner struct {
	inside chan struct{}
	let    chan struct{}
}

func (s stubbornRunner) Run(context.Context, Task) (Outcome, error) {
	s.inside <- struct{}{}
	<-s.let
	return Outcome{ExitCode: 137}, nil
}

func (stubbornRunner) Sweep(context.Context) error { return nil }

// TestCleanupGivenUp: a cleanup whose caller stops waiting for the task to
// end still removes the session's workspace when it does end, so the next
// airlockd does not bring the session back.
func TestCleanupGivenUp(t *testing.T) {
	dir := t.TempDir()
	r := stubbornRunner{inside: make(chan struct{}, 1), let: make(chan struct{})}
	st := settings()
	m, err := New(Config{Sandbox: "sb", Dir: dir, Runner: r, Settings: func() *policy.Sessions { return st },
		Logger: slog.New(slog.NewTextHandler(tlogWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := make(chan ExecuteResult)
	go func() {
		res, _ := m.Execute(context.Background(), ExecuteRequest{Task: "sleep", UserID: "alice"})
		done <- res
	}()
	<-r.inside
	id := list(m, ListRequest{})[0].SessionID
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Cleanup(ctx, CleanupRequest{SessionID: id}); err == nil {
		t.Fatal("cleanup of a task that does not end said it was done")
	}
	close(r.let)
	<-done
	m.Close()
	if _, err := os.Stat(m.dir(id)); !os.IsNotExist(err) {
		t.Errorf("the cleaned-up session's directory stayed: %v", err)
	}
	m2, _ := newManager(t, dir, st)
	if got := list(m2, ListRequest{}); len(got) != 0 {
		t.Errorf("the next airlockd adopted cleaned-up sessions: %+v", got)
	}
}
