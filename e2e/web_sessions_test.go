package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/airlockhq/airlock/internal/session"
	"github.com/airlockhq/airlock/internal/testworld"
)

// hostAgent builds the test agent (e2e/testdata/agent) for the host, in a
// directory every user may read, so that a session member running as
// nobody can start it without Docker.
func hostAgent(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "airlock-agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "agent")
	build := exec.Command("go", "build", "-o", bin, "./testdata/agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build agent: %v\n%s", err, out)
	}
	return bin
}

// sessionsWorld starts airlockd in the test world (no Docker Engine there)
// with sandbox default running sessions of the host agent.
func sessionsWorld(t testing.TB, sessions string) (*testworld.World, string, *testworld.Daemon, string) {
	t.Helper()
	w := testworld.New(t)
	if _, ok := t.(*testing.B); ok {
		w.DaemonLogLevel = "info" // a benchmark's thousands of decisions
	}
	agent := hostAgent(t)
	pol := filepath.Join(w.Dir, "default.yaml")
	write(t, pol, fmt.Sprintf("sandbox:\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n  network_denylist:\n    - pattern: other.test\n  sessions:\n    image: unused-without-docker\n    command: [%q, \"{task}\"]\n%s", agent, sessions))
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	write(t, cfg, fmt.Sprintf("state_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nupstream_ca_file: %[3]s\nsandboxes:\n  - name: default\n    subnet: 10.88.0.0/24\n    policy: %[4]s\n",
		w.Dir, testworld.DNSAddr, w.CAFile, pol))
	d := w.StartDaemon(cfg)
	token, err := os.ReadFile(filepath.Join(w.Dir, "state", "token"))
	if err != nil {
		t.Fatal(err)
	}
	return w, cfg, d, strings.TrimSpace(string(token))
}

// TestWebSessions: a session a platform started through the REST API is
// listed in the Sessions view with its user (escaped), status, files and
// network; its traffic button filters the monitor by session:ID; its
// cleanup button ends it.
func TestWebSessions(t *testing.T) {
	w, cfg, _, token := sessionsWorld(t, "    timeout: 30\n")
	ctx, _ := browserFor(t, w, token)
	// Traffic of another member, which the session's filter hides.
	w.Run(cfg, "default", "agent", 20*time.Second, "curl", "-sS", "http://allowed.test/")

	status, body := call(t, w, token, "POST", "/sandboxes/default/sessions", `{"task": "fetch http://allowed.test/from-session; write out/report\u2028txt.exe done", "user_id": "mallory\u202egpj"}`)
	var res session.ExecuteResult
	if err := json.Unmarshal([]byte(body), &res); status != 200 || err != nil || res.Status != session.StatusCompleted {
		t.Fatalf("execute: %d %s", status, body)
	}
	member := session.MemberName(res.SessionID)
	row := fmt.Sprintf(`#session-rows tr[data-session=%q]`, res.SessionID)
	var text string
	if err := chromedp.Run(ctx,
		click(`.tabs button[data-tab="sessions"]`),
		onScreen(row),
		chromedp.Evaluate(`document.querySelector(`+jsString(row)+`).innerText.replace(/\s+/g, " ")`, &text),
	); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{res.SessionID[:8], `mallory\u{202e}gpj`, "idle · last completed", " ago",
		`out/report\u{2028}txt.exe`, "1 allowed · 0 denied · 0 held", "allowed.test"} {
		if !strings.Contains(text, want) {
			t.Errorf("the session's row %q lacks %q", text, want)
		}
	}
	if strings.ContainsAny(text, "\u202e\u2028") {
		t.Errorf("a raw bidi control in the row: %q", text)
	}
	checkAccessible(t, ctx, "sessions view")
	shot(t, ctx, w, "sessions.png")

	// Its traffic: the monitor, filtered by session:ID.
	var source string
	if err := chromedp.Run(ctx,
		click(row+` button[aria-label="traffic of `+member+`"]`),
		onScreen("#tab-monitor"),
		chromedp.Evaluate(`document.querySelector("#f-source").value`, &source),
	); err != nil {
		t.Fatal(err)
	}
	if source != member {
		t.Errorf("the monitor's source filter is %q, want %q", source, member)
	}
	if rows := visibleRows(t, ctx); strings.Contains(rows, "agent ") || !strings.Contains(rows, member+" GET http://allowed.test/from-session 200") {
		t.Errorf("the monitor filtered by %s shows:\n%s\nwant its request and no other member's", member, rows)
	}

	// Clean up: the row goes, and so does the session on the server.
	if err := chromedp.Run(ctx,
		click(`.tabs button[data-tab="sessions"]`),
		click(row+` button[aria-label="clean up `+member+`"]`),
		offScreen(row),
	); err != nil {
		t.Fatal(err)
	}
	if status, body := call(t, w, token, "GET", "/sandboxes/default/sessions/"+res.SessionID, ""); status != 404 {
		t.Errorf("the session after its cleanup: %d %s", status, body)
	}
	if _, err := os.Stat(filepath.Join(w.Dir, "state", "sessions", "default", res.SessionID)); !os.IsNotExist(err) {
		t.Errorf("the session's workspace stayed: %v", err)
	}
}

// jsString is s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
