package sessionmcp

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/session"
)

type stub struct{ got session.ExecuteRequest }

func (s *stub) Execute(_ context.Context, r session.ExecuteRequest) (session.ExecuteResult, error) {
	s.got = r
	if r.SessionID == "busy" {
		return session.ExecuteResult{}, &session.Error{Kind: session.Busy, Msg: "session busy is running a task"}
	}
	return session.ExecuteResult{SessionID: "s1", Status: session.StatusCompleted, FilesCreated: []string{"a"}, Network: session.Network{Hosts: []string{}}}, nil
}
func (s *stub) Files(context.Context, session.FilesRequest) (session.FilesResult, error) {
	return session.FilesResult{}, nil
}
func (s *stub) Cleanup(context.Context, session.CleanupRequest) (session.CleanupResult, error) {
	return session.CleanupResult{}, nil
}
func (s *stub) List(context.Context, session.ListRequest) (session.ListResult, error) {
	return session.ListResult{Sessions: []session.Info{}}, nil
}

func TestTools(t *testing.T) {
	ctx := context.Background()
	b := &stub{}
	st, ct := mcp.NewInMemoryTransports()
	ss, err := NewServer(b, "default").Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if tl.Name == "execute_task" {
			req := tl.InputSchema.(map[string]any)["required"]
			for _, want := range []string{"task", "user_id"} {
				if !slices.Contains(req.([]any), any(want)) {
					t.Errorf("execute_task requires %v, want %s among them", req, want)
				}
			}
		}
	}
	slices.Sort(names)
	if want := []string{"cleanup_session", "execute_task", "get_files", "list_sessions"}; !slices.Equal(names, want) {
		t.Errorf("tools %v, want %v", names, want)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_task", Arguments: map[string]any{"task": "do", "user_id": "u", "timeout": 5}})
	if err != nil || res.IsError {
		t.Fatalf("execute_task: %v %+v", err, res)
	}
	if out := res.StructuredContent.(map[string]any); out["session_id"] != "s1" || out["status"] != "completed" || b.got.Timeout != 5 {
		t.Errorf("answer %v, request %+v", out, b.got)
	}
	// A refusal is a tool error whose text says why.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_task", Arguments: map[string]any{"task": "do", "user_id": "u", "session_id": "busy"}})
	if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "running a task") {
		t.Errorf("busy session: %v %+v", err, res)
	}
	// A wrong type never reaches the backend.
	b.got = session.ExecuteRequest{}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_task", Arguments: map[string]any{"task": "do", "user_id": "u", "timeout": "soon"}})
	if (err == nil && !res.IsError) || b.got.Task != "" {
		t.Errorf("a string timeout was accepted: %v %+v", err, res)
	}
}
