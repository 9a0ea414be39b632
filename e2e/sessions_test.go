package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/session"
	"github.com/airlockhq/airlock/internal/testworld"
)

// The sessions tests run airlockd in the machine's own namespace beside
// the Docker Engine, like TestDocker, with names, subnets and an API port
// of their own.
const (
	sesPort  = "7534"
	sesAPI   = "http://127.0.0.1:" + sesPort + "/api/v1"
	sesImage = "airlock-e2e-agent:test"
	ses1     = "e2e-ses1"
	ses2     = "e2e-ses2"
)

// agentImage builds the test agent image FROM scratch.
func agentImage(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "agent"), "./testdata/agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build agent: %v\n%s", err, out)
	}
	write(t, filepath.Join(dir, "Dockerfile"), "FROM scratch\nCOPY agent /agent\n")
	if out, err := exec.Command("docker", "build", "-q", "-t", sesImage, dir).CombinedOutput(); err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("docker", "image", "rm", "-f", sesImage).Run() })
}

// bearer adds the API token to requests it sends through base (nil:
// http.DefaultTransport).
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	if b.base == nil {
		return http.DefaultTransport.RoundTrip(r)
	}
	return b.base.RoundTrip(r)
}

func mcpConnect(t testing.TB, tr mcp.Transport) *mcp.ClientSession {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(context.Background(), tr, nil)
	if err != nil {
		t.Fatalf("MCP connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// callTool calls a tool and decodes its structured answer into out; a tool
// error comes back as its text.
func callTool(t testing.TB, cs *mcp.ClientSession, name string, args any, out any) string {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		var msg []string
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				msg = append(msg, tc.Text)
			}
		}
		return strings.Join(msg, " ")
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s answer %s: %v", name, b, err)
		}
	}
	return ""
}

func execTask(t *testing.T, cs *mcp.ClientSession, req session.ExecuteRequest) session.ExecuteResult {
	t.Helper()
	var res session.ExecuteResult
	if msg := callTool(t, cs, "execute_task", req, &res); msg != "" {
		t.Fatalf("execute_task %+v: %s", req, msg)
	}
	return res
}

func b64s(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func listSessions(t *testing.T, cs *mcp.ClientSession, user string) []session.Info {
	t.Helper()
	var res session.ListResult
	if msg := callTool(t, cs, "list_sessions", session.ListRequest{UserID: user}, &res); msg != "" {
		t.Fatalf("list_sessions: %s", msg)
	}
	return res.Sessions
}

func sessionGone(t *testing.T, id string) {
	t.Helper()
	out, err := exec.Command("docker", "ps", "-aq", "--filter", "label=airlock.session="+id).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("containers of session %s left: %v %q", id, err, out)
	}
}

// basics is what both transports show: files go in and come back,
// files_created is right, users keep to their own sessions.
func basics(t *testing.T, cs *mcp.ClientSession) {
	res := execTask(t, cs, session.ExecuteRequest{Task: "read in.txt; write out/result.txt done", UserID: "alice",
		Files: []session.UploadFile{{Path: "in.txt", Content: b64s("hello")}}})
	if res.Status != session.StatusCompleted || !strings.Contains(res.Output, "task arrived 3 ways") || !strings.Contains(res.Output, "read in.txt: hello") {
		t.Fatalf("task %+v", res)
	}
	if !slices.Equal(res.FilesCreated, []string{"out/result.txt"}) {
		t.Errorf("files_created %v, want [out/result.txt]", res.FilesCreated)
	}
	var files session.FilesResult
	if msg := callTool(t, cs, "get_files", session.FilesRequest{SessionID: res.SessionID, Paths: []string{"out/result.txt", "in.txt"}}, &files); msg != "" {
		t.Fatal(msg)
	}
	if len(files.Files) != 2 || files.Files[0].Content != b64s("done") || files.Files[0].SizeBytes != 4 || !strings.HasPrefix(files.Files[0].MimeType, "text/plain") || files.Files[1].Content != b64s("hello") {
		t.Errorf("get_files %+v", files)
	}
	// Bob sees nothing of alice's and cannot use her session.
	if msg := callTool(t, cs, "execute_task", session.ExecuteRequest{Task: "read in.txt", UserID: "bob", SessionID: res.SessionID}, nil); !strings.Contains(msg, "belongs to another user") {
		t.Errorf("bob in alice's session: %q", msg)
	}
	for _, s := range listSessions(t, cs, "bob") {
		if s.SessionID == res.SessionID {
			t.Errorf("bob's list shows alice's session")
		}
	}
	if got := listSessions(t, cs, "alice"); !slices.ContainsFunc(got, func(s session.Info) bool { return s.SessionID == res.SessionID && s.Status == "idle" }) {
		t.Errorf("alice's sessions %+v", got)
	}
	var cl session.CleanupResult
	if msg := callTool(t, cs, "cleanup_session", session.CleanupRequest{SessionID: res.SessionID}, &cl); msg != "" || !cl.Removed {
		t.Errorf("cleanup: %s %+v", msg, cl)
	}
	if msg := callTool(t, cs, "get_files", session.FilesRequest{SessionID: res.SessionID, Paths: []string{"in.txt"}}, nil); !strings.Contains(msg, "no session") {
		t.Errorf("files of a cleaned-up session: %q", msg)
	}
	sessionGone(t, res.SessionID)
}

func TestSessionsMCP(t *testing.T) {
	w := rootWorld(t)
	agentImage(t)
	pol1, pol2 := filepath.Join(w.Dir, "ses1.yaml"), filepath.Join(w.Dir, "ses2.yaml")
	write(t, pol1, `sandbox:
  approval_timeout: 60
  network_allowlist:
    user:
      - pattern: allowed.test
  network_denylist:
    - pattern: other.test
  sessions:
    image: `+sesImage+`
    command: ["/agent", "{task}"]
    env: ["AGENT_MODE=test"]
    timeout: 60
    resources: {memory_mb: 128, cpus: 0.5, pids: 64}
`)
	write(t, pol2, `sandbox:
  sessions:
    image: `+sesImage+`
    command: ["/agent", "{task}"]
    idle_cleanup: 2
    max_sessions: 1
`)
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	write(t, cfg, fmt.Sprintf("api_listen: 127.0.0.1:%[6]s\nstate_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nupstream_ca_file: %[3]s\nsandboxes:\n  - name: %[4]s\n    subnet: 10.89.81.0/24\n    policy: %[5]s\n  - name: %[7]s\n    subnet: 10.89.82.0/24\n    policy: %[8]s\n",
		w.Dir, testworld.DNSAddr, w.CAFile, ses1, pol1, sesPort, ses2, pol2))
	var d *testworld.Daemon
	t.Cleanup(func() {
		exec.Command("sh", "-c", "docker ps -aq --filter label=airlock.sandbox="+ses1+" | xargs -r docker rm -f; docker ps -aq --filter label=airlock.sandbox="+ses2+" | xargs -r docker rm -f; docker network rm airlock-"+ses1+" airlock-"+ses2).Run()
		if d != nil {
			if out, err := d.Teardown(); err != nil {
				t.Errorf("teardown: %v\n%s", err, out)
			}
		}
	})
	d = w.StartRootDaemon(cfg)
	tok, err := os.ReadFile(filepath.Join(w.Dir, "state", "token"))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tok))
	httpMCP := func(sandbox string) *mcp.ClientSession {
		return mcpConnect(t, &mcp.StreamableClientTransport{Endpoint: "http://127.0.0.1:" + sesPort + "/mcp/" + sandbox, HTTPClient: &http.Client{Transport: bearer{token: token}}, MaxRetries: -1})
	}
	cs := httpMCP(ses1)

	t.Run("over HTTP: files, files_created, users", func(t *testing.T) { basics(t, cs) })

	t.Run("over stdio: airlock mcp", func(t *testing.T) {
		cmd := exec.Command(filepath.Join(testworld.Binaries(t), "airlock"), "mcp", "--sandbox", ses1)
		cmd.Env = append(os.Environ(), "AIRLOCK_API=http://127.0.0.1:"+sesPort, "AIRLOCK_TOKEN="+token)
		basics(t, mcpConnect(t, &mcp.CommandTransport{Command: cmd}))
	})

	t.Run("without a token /mcp answers 401", func(t *testing.T) {
		resp, err := http.Post("http://127.0.0.1:"+sesPort+"/mcp/"+ses1, "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Errorf("status %d, want 401", resp.StatusCode)
		}
	})

	var netID string
	t.Run("network: allowed, held until approved, denied", func(t *testing.T) {
		res := execTask(t, cs, session.ExecuteRequest{Task: "fetch http://allowed.test/session; fetch http://other.test/denied", UserID: "carol"})
		netID = res.SessionID
		if !strings.Contains(res.Output, "fetch http://allowed.test/session: status 200 internet") {
			t.Errorf("allowed fetch: %s", res.Output)
		}
		if !strings.Contains(res.Output, "fetch http://other.test/denied: error") || res.Status != session.StatusFailed {
			t.Errorf("denied fetch: %s (status %s)", res.Output, res.Status)
		}
		if res.Network.Allowed < 1 || res.Network.Denied < 1 || !slices.Contains(res.Network.Hosts, "other.test") || !slices.Contains(res.Network.Hosts, "allowed.test") {
			t.Errorf("network %+v", res.Network)
		}
		done := make(chan session.ExecuteResult, 1)
		go func() {
			var r session.ExecuteResult
			callTool(t, cs, "execute_task", session.ExecuteRequest{Task: "fetch http://unknown.example/held", UserID: "carol", SessionID: netID}, &r)
			done <- r
		}()
		var id string
		for deadline := time.Now().Add(30 * time.Second); id == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			_, body := callAt(t, http.DefaultClient, sesAPI, token, "GET", "/sandboxes/"+ses1+"/approvals", "")
			var p []struct{ ID, Source, Host string }
			json.Unmarshal([]byte(body), &p)
			for _, a := range p {
				if a.Source == session.MemberName(netID) && a.Host == "unknown.example" {
					id = a.ID
				}
			}
		}
		if id == "" {
			t.Fatalf("no approval from %s for unknown.example", session.MemberName(netID))
		}
		select {
		case r := <-done:
			t.Fatalf("the task ended before the approval: %+v", r)
		default:
		}
		if status, body := callAt(t, http.DefaultClient, sesAPI, token, "POST", "/sandboxes/"+ses1+"/approvals/"+id, `{"action":"allow_once"}`); status != 200 {
			t.Fatalf("approve: %d %s", status, body)
		}
		select {
		case r := <-done:
			if r.Status != session.StatusCompleted || !strings.Contains(r.Output, "status 200 internet") || r.Network.Held != 1 {
				t.Errorf("approved task %+v", r)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("the task did not end after the approval")
		}
	})

	t.Run("output is the last 64 KiB, however long its lines", func(t *testing.T) {
		res := execTask(t, cs, session.ExecuteRequest{Task: "lines 9000", UserID: "dave"})
		if !strings.HasSuffix(res.Output, "the last line\n") || !strings.HasPrefix(res.Output, "[airlock: ") || len(res.Output) > session.MaxOutput+200 {
			t.Errorf("output of %d bytes starts %.60q, ends %q", len(res.Output), res.Output, res.Output[max(0, len(res.Output)-40):])
		}
	})

	t.Run("a task past its timeout ends timeout, its container gone", func(t *testing.T) {
		res := execTask(t, cs, session.ExecuteRequest{Task: "sleep 60", UserID: "dave", Timeout: 2})
		if res.Status != session.StatusTimeout || res.DurationSeconds > 30 {
			t.Errorf("result %+v", res)
		}
		sessionGone(t, res.SessionID)
	})

	t.Run("every bad input is a tool error and changes nothing", func(t *testing.T) {
		res := execTask(t, cs, session.ExecuteRequest{Task: "link /etc host; link .. up; big huge 1048577; write keep.txt k", UserID: "erin"})
		id := res.SessionID
		before := len(listSessions(t, cs, ""))
		busy := make(chan struct{})
		go func() {
			callTool(t, cs, "execute_task", session.ExecuteRequest{Task: "sleep 4", UserID: "erin", SessionID: id}, nil)
			close(busy)
		}()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if s := listSessions(t, cs, "erin"); len(s) == 1 && s[0].Status == "busy" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the session never became busy")
			}
		}
		// The member is hardened as airlock docker run makes them.
		// (Busy comes before its container starts.)
		var out []byte
		var err error
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			out, err = exec.Command("docker", "inspect", "--format", "{{.HostConfig.ReadonlyRootfs}} {{.HostConfig.CapDrop}} {{.HostConfig.SecurityOpt}} {{.Config.User}} {{index .Config.Labels \"airlock.source\"}} {{.HostConfig.PidsLimit}} {{.HostConfig.Memory}} {{range .Mounts}}{{if eq .Destination \"/workspace\"}}rw={{.RW}}{{end}}{{end}}", "airlock-"+ses1+"-session-"+id).CombinedOutput()
			if err == nil {
				break
			}
		}
		if want := fmt.Sprintf("true [ALL] [no-new-privileges:true] 65534:65534 session:%s 64 134217728 rw=true", id); err != nil || strings.TrimSpace(string(out)) != want {
			t.Errorf("session member: %v %q, want %q", err, out, want)
		}
		if msg := callTool(t, cs, "execute_task", session.ExecuteRequest{Task: "write x y", UserID: "erin", SessionID: id}, nil); !strings.Contains(msg, "running a task") {
			t.Errorf("a task in a busy session: %q", msg)
		}
		<-busy
		tooBig := b64s(strings.Repeat("z", session.MaxUploadFile+1))
		execs := []struct {
			name string
			req  session.ExecuteRequest
			want string
		}{
			{"dot dot", session.ExecuteRequest{Task: "t", UserID: "erin", SessionID: id, Files: []session.UploadFile{{Path: "../../escape.txt", Content: b64s("x")}}}, ".. segment"},
			{"absolute", session.ExecuteRequest{Task: "t", UserID: "erin", SessionID: id, Files: []session.UploadFile{{Path: "/tmp/escape.txt", Content: b64s("x")}}}, "is absolute"},
			{"symlink out", session.ExecuteRequest{Task: "t", UserID: "erin", SessionID: id, Files: []session.UploadFile{{Path: "host/escape.txt", Content: b64s("x")}}}, "outside /workspace"},
			{"base64", session.ExecuteRequest{Task: "t", UserID: "erin", SessionID: id, Files: []session.UploadFile{{Path: "a.txt", Content: "@@@"}}}, "not valid base64"},
			{"upload over the cap", session.ExecuteRequest{Task: "t", UserID: "erin", SessionID: id, Files: []session.UploadFile{{Path: "a.txt", Content: tooBig}}}, "cap of one upload"},
			{"another user's session", session.ExecuteRequest{Task: "t", UserID: "mallory", SessionID: id}, "belongs to another user"},
			{"unknown session", session.ExecuteRequest{Task: "t", UserID: "erin", SessionID: "00000000000000000000000000000000"}, "no session"},
			{"timeout out of range", session.ExecuteRequest{Task: "t", UserID: "erin", SessionID: id, Timeout: 4000}, "want 1 to 3600"},
			{"new session, bad path", session.ExecuteRequest{Task: "t", UserID: "frank", Files: []session.UploadFile{{Path: "../x", Content: b64s("x")}}}, ".. segment"},
		}
		for _, tt := range execs {
			if msg := callTool(t, cs, "execute_task", tt.req, nil); !strings.Contains(msg, tt.want) {
				t.Errorf("%s: %q, want a tool error saying %q", tt.name, msg, tt.want)
			}
		}
		reads := []struct {
			name  string
			paths []string
			want  string
		}{
			{"symlink out", []string{"host/passwd"}, "outside /workspace"},
			{"symlink to the parent", []string{"up/session.json"}, "outside /workspace"},
			{"dot dot", []string{"../session.json"}, ".. segment"},
			{"absolute", []string{"/etc/passwd"}, "is absolute"},
			{"read over the cap", []string{"huge"}, "cap of one file"},
		}
		for _, tt := range reads {
			if msg := callTool(t, cs, "get_files", session.FilesRequest{SessionID: id, Paths: tt.paths}, nil); !strings.Contains(msg, tt.want) {
				t.Errorf("get_files %s: %q, want a tool error saying %q", tt.name, msg, tt.want)
			}
		}
		if after := len(listSessions(t, cs, "")); after != before {
			t.Errorf("%d sessions after the refusals, %d before", after, before)
		}
		if s := listSessions(t, cs, "erin"); len(s) != 1 || s[0].Tasks != 2 {
			t.Errorf("erin's session after the refusals: %+v (want 2 tasks run)", s)
		}
		for _, p := range []string{"/tmp/escape.txt", filepath.Join(w.Dir, "state", "sessions", "escape.txt"), filepath.Join(w.Dir, "state", "escape.txt")} {
			if _, err := os.Stat(p); err == nil {
				t.Errorf("%s was written", p)
			}
		}
	})

	t.Run("idle cleanup and max_sessions", func(t *testing.T) {
		cs2 := httpMCP(ses2)
		res := execTask(t, cs2, session.ExecuteRequest{Task: "write a b", UserID: "gina"})
		if msg := callTool(t, cs2, "execute_task", session.ExecuteRequest{Task: "write a b", UserID: "hank"}, nil); !strings.Contains(msg, "max_sessions") {
			t.Errorf("a second session with max_sessions 1: %q", msg)
		}
		for deadline := time.Now().Add(20 * time.Second); len(listSessions(t, cs2, "")) > 0; time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the idle session stayed: %+v", listSessions(t, cs2, ""))
			}
		}
		if _, err := os.Stat(filepath.Join(w.Dir, "state", "sessions", ses2, res.SessionID)); !os.IsNotExist(err) {
			t.Errorf("the idle session's workspace stayed: %v", err)
		}
	})

	t.Run("REST and metrics", func(t *testing.T) {
		status, body := callAt(t, http.DefaultClient, sesAPI, token, "GET", "/sandboxes/"+ses1+"/sessions/"+netID+"?user_id=carol", "")
		if status != 200 || !strings.Contains(body, `"member":"session:`+netID+`"`) {
			t.Errorf("get session: %d %s", status, body)
		}
		if status, body := callAt(t, http.DefaultClient, sesAPI, token, "GET", "/sandboxes/"+ses1+"/sessions/"+netID+"?user_id=mallory", ""); status != 403 {
			t.Errorf("another user's session: %d %s", status, body)
		}
		if status, body := callAt(t, http.DefaultClient, sesAPI, token, "POST", "/sandboxes/"+ses1+"/sessions/"+netID+"/files", `{"paths":["../x"]}`); status != 400 || !strings.Contains(body, ".. segment") {
			t.Errorf("files with ..: %d %s", status, body)
		}
		if status, body := callAt(t, http.DefaultClient, sesAPI, token, "DELETE", "/sandboxes/"+ses1+"/sessions/"+netID, ""); status != 200 {
			t.Errorf("delete: %d %s", status, body)
		}
		resp, err := http.Get("http://127.0.0.1:" + sesPort + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		b := string(raw)
		resp.Body.Close()
		for _, want := range []string{
			`airlock_session_executions_total{sandbox="` + ses1 + `",status="timeout"} 1`,
			`airlock_session_timeouts_total{sandbox="` + ses1 + `"} 1`,
			`airlock_sessions_active{sandbox="` + ses1 + `"}`,
			`airlock_session_execution_seconds_count{sandbox="` + ses1 + `"}`,
		} {
			if !strings.Contains(b, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})
}
