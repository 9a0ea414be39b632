package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/session"
)

// TestSessionsLocal: without a Docker Engine (the test world's airlockd
// cannot reach the machine's) a session's task runs as an `airlock run`
// member in the sandbox's cage, with the workspace read-write at
// /workspace and the host's files read-only; the SDK's client drives it
// over HTTP.
func TestSessionsLocal(t *testing.T) {
	w, _, _, token := sessionsWorld(t, "    timeout: 30\n")
	cs := mcpConnect(t, &mcp.StreamableClientTransport{Endpoint: "http://127.0.0.1:7433/mcp",
		HTTPClient: &http.Client{Transport: bearer{token: token, base: w.HostClient().Transport}}, MaxRetries: -1})
	escape := filepath.Join(os.TempDir(), "airlock-session-escape")
	os.Remove(escape)
	stateToken := filepath.Join(w.Dir, "state", "token")

	res := execTask(t, cs, session.ExecuteRequest{
		Task:   "read in.txt; write out/result.txt done; fetch http://allowed.test/local",
		UserID: "alice", Files: []session.UploadFile{{Path: "in.txt", Content: b64s("hello")}}})
	for _, want := range []string{"task arrived 3 ways", "read in.txt: hello", "fetch http://allowed.test/local: status 200 internet"} {
		if !strings.Contains(res.Output, want) {
			t.Errorf("output lacks %q:\n%s", want, res.Output)
		}
	}
	if res.Status != session.StatusCompleted || !slices.Equal(res.FilesCreated, []string{"out/result.txt"}) {
		t.Errorf("status %s, files_created %v; want completed, [out/result.txt]", res.Status, res.FilesCreated)
	}
	if res.Network.Allowed < 1 || !slices.Contains(res.Network.Hosts, "allowed.test") {
		t.Errorf("network %+v", res.Network)
	}
	var files session.FilesResult
	if msg := callTool(t, cs, "get_files", session.FilesRequest{SessionID: res.SessionID, Paths: []string{"out/result.txt"}}, &files); msg != "" || len(files.Files) != 1 || files.Files[0].Content != b64s("done") {
		t.Errorf("get_files: %s %+v", msg, files)
	}

	// Outside its workspace the host's files are read-only, and airlockd's
	// token out of reach; a denied host fails and shows in network.
	res2 := execTask(t, cs, session.ExecuteRequest{Task: "write .." + escape + " x; read .." + stateToken + "; fetch http://other.test/denied",
		UserID: "alice", SessionID: res.SessionID})
	for _, want := range []string{"write: open " + escape + ": read-only file system", "read: open " + stateToken, "fetch http://other.test/denied: error"} {
		if !strings.Contains(res2.Output, want) {
			t.Errorf("output lacks %q:\n%s", want, res2.Output)
		}
	}
	if strings.Contains(res2.Output, token) {
		t.Errorf("the task read airlockd's token:\n%s", res2.Output)
	}
	if _, err := os.Stat(escape); err == nil {
		os.Remove(escape)
		t.Errorf("the task wrote %s on the host", escape)
	}
	if res2.Status != session.StatusFailed || res2.Network.Denied < 1 || !slices.Contains(res2.Network.Hosts, "other.test") {
		t.Errorf("status %s, network %+v; want failed, other.test denied", res2.Status, res2.Network)
	}

	// A task past its timeout is killed with everything it started.
	res3 := execTask(t, cs, session.ExecuteRequest{Task: "sleep 60", UserID: "bob", Timeout: 2})
	if res3.Status != session.StatusTimeout || res3.DurationSeconds > 20 {
		t.Errorf("result %+v, want timeout after about 2 s", res3)
	}
	if procs := agentProcs(t); len(procs) != 0 {
		t.Errorf("processes of the timed-out task left: %v", procs)
	}

	var cl session.CleanupResult
	if msg := callTool(t, cs, "cleanup_session", session.CleanupRequest{SessionID: res.SessionID, UserID: "alice"}, &cl); msg != "" || !cl.Removed {
		t.Errorf("cleanup: %s %+v", msg, cl)
	}
}

// agentProcs lists the processes running the test agent.
func agentProcs(t *testing.T) []string {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var out []string
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(b), "airlock-agent-") {
			out = append(out, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}
