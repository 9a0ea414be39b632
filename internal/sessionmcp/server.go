// Package sessionmcp serves a sandbox's sessions as MCP tools with the
// official Go SDK: execute_task, get_files, cleanup_session and
// list_sessions. airlockd serves them over streamable HTTP at /mcp with the
// session table itself as the backend; `airlock mcp` serves them over
// stdio with airlockd's REST API as the backend.
package sessionmcp

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/session"
)

// Backend carries out the tools. *session.Manager is one; the REST client
// of `airlock mcp` another. Its errors become tool errors, whose text the
// client reads.
type Backend interface {
	Execute(context.Context, session.ExecuteRequest) (session.ExecuteResult, error)
	Files(context.Context, session.FilesRequest) (session.FilesResult, error)
	Cleanup(context.Context, session.CleanupRequest) (session.CleanupResult, error)
	List(context.Context, session.ListRequest) (session.ListResult, error)
}

// Version is the server's version in the MCP handshake.
const Version = "1.0.0"

// NewServer returns an MCP server with the four tools over b, for the
// sandbox named sandbox.
func NewServer(b Backend, sandbox string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "airlock-sessions", Title: "airlock sandbox sessions", Version: Version}, &mcp.ServerOptions{
		Instructions: fmt.Sprintf("Tasks run unattended in caged containers of airlock sandbox %q: every network request passes its allowlist, and unknown hosts wait for a person's approval.", sandbox),
	})
	mcp.AddTool(s, &mcp.Tool{
		Name: "execute_task",
		Description: "Run a task in a sandboxed agent container. A new session unless session_id names one of the same user_id. " +
			"Files are written into /workspace first. Answers the status (completed, failed, timeout), the agent's output (the last 64 KiB of stdout and stderr), " +
			"the files under /workspace it created or changed, and a summary of its network traffic.",
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in session.ExecuteRequest) (*mcp.CallToolResult, session.ExecuteResult, error) {
		out, err := b.Execute(ctx, in)
		return nil, out, err
	})
	mcp.AddTool(s, &mcp.Tool{
		Name:        "get_files",
		Description: "Fetch files from a session's /workspace, base64-encoded (at most 100 files, 1 MiB each, 4 MiB in all). Paths are relative to /workspace.",
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in session.FilesRequest) (*mcp.CallToolResult, session.FilesResult, error) {
		out, err := b.Files(ctx, in)
		return nil, out, err
	})
	mcp.AddTool(s, &mcp.Tool{
		Name:        "cleanup_session",
		Description: "End a session: stop its container (a running task is killed) and remove its workspace.",
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in session.CleanupRequest) (*mcp.CallToolResult, session.CleanupResult, error) {
		out, err := b.Cleanup(ctx, in)
		return nil, out, err
	})
	mcp.AddTool(s, &mcp.Tool{
		Name:        "list_sessions",
		Description: "List sessions with their status (idle or busy), age, last use, the last task's files and the network of all their tasks; with user_id, only that user's.",
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in session.ListRequest) (*mcp.CallToolResult, session.ListResult, error) {
		out, err := b.List(ctx, in)
		return nil, out, err
	})
	return s
}
