package ui

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	sess "github.com/airlockhq/airlock/internal/session"
	"github.com/airlockhq/airlock/internal/testenv"
)

// idleTable is a session table that holds nothing.
type idleTable struct{}

func (idleTable) Execute(context.Context, sess.ExecuteRequest) (sess.ExecuteResult, error) {
	return sess.ExecuteResult{}, nil
}
func (idleTable) Files(context.Context, sess.FilesRequest) (sess.FilesResult, error) {
	return sess.FilesResult{}, nil
}
func (idleTable) Cleanup(context.Context, sess.CleanupRequest) (sess.CleanupResult, error) {
	return sess.CleanupResult{}, nil
}
func (idleTable) List(context.Context, sess.ListRequest) (sess.ListResult, error) {
	return sess.ListResult{Sessions: []sess.Info{}}, nil
}
func (idleTable) Get(context.Context, string, string) (sess.Info, error) { return sess.Info{}, nil }

// TestMCPIdleSessionsClosed: an MCP client that initializes and goes away
// without ending its session (a crash, a reconnect loop) leaves nothing
// behind past MCPIdleTimeout; a session in use stays.
func TestMCPIdleSessionsClosed(t *testing.T) {
	h := newAPI(t, "")
	h.srv.cfg.Sessions = func(string) (SessionTable, error) { return idleTable{}, nil }
	h.srv.cfg.MCPIdleTimeout = 300 * time.Millisecond
	h.reroute()
	post := func(session, body string) *http.Response {
		req, _ := http.NewRequest("POST", h.ts.URL+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+h.srv.Token())
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	resp := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`)
	id := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || id == "" {
		t.Fatalf("initialize: %d, session %q", resp.StatusCode, id)
	}
	post(id, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}`
	// In use: requests closer together than the timeout keep it.
	for range 4 {
		if st := post(id, list).StatusCode; st != 200 {
			t.Fatalf("tools/list on a session in use: %d", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	testenv.WaitFor(t, 5*time.Second, "the idle MCP session to be closed", func() bool {
		time.Sleep(400 * time.Millisecond)
		return post(id, list).StatusCode == http.StatusNotFound
	})
}
