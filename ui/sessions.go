package ui

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	sess "github.com/airlockhq/airlock/internal/session"
	"github.com/airlockhq/airlock/internal/sessionmcp"
)

// SessionsOf returns a sandbox's sessions (airlockd): the backend of the
// sessions routes and of /mcp. A *ManagerError says the sandbox has none.
type SessionsOf func(sandbox string) (SessionTable, error)

// SessionTable is a sandbox's sessions: the MCP tools, and one session.
type SessionTable interface {
	sessionmcp.Backend
	Get(ctx context.Context, id, user string) (sess.Info, error)
}

// MaxSessionBody caps the bodies of the sessions routes and /mcp, which
// carry uploads: base64 of sess.MaxUploadTotal and the JSON around it.
const MaxSessionBody = sess.MaxUploadTotal/3*4 + 1<<20

// DefaultMCPIdleTimeout is Config.MCPIdleTimeout's default.
const DefaultMCPIdleTimeout = 30 * time.Minute

// DefaultMCPSandbox is the sandbox /mcp serves; /mcp/NAME serves NAME.
const DefaultMCPSandbox = "default"

func (s *Server) sessionRoutes(e *echo.Echo, sb *echo.Group) {
	sb.GET("/sessions", s.listSessions)
	sb.POST("/sessions", s.executeTask)
	sb.GET("/sessions/:id", s.getSession)
	sb.POST("/sessions/:id/files", s.sessionFiles)
	sb.DELETE("/sessions/:id", s.cleanupSession)
	idle := s.cfg.MCPIdleTimeout
	if idle <= 0 {
		idle = DefaultMCPIdleTimeout
	}
	h := echo.WrapHandler(mcp.NewStreamableHTTPHandler(s.mcpServer, &mcp.StreamableHTTPOptions{
		MaxRequestBodyBytes: MaxSessionBody,
		SessionTimeout:      idle,
		Logger:              s.log,
	}))
	for _, p := range []string{"/mcp", "/mcp/:sb"} {
		e.Any(p, h, s.auth)
	}
}

// mcpServer is the MCP server of the sandbox /mcp or /mcp/NAME names; nil
// (a 400) when there is no such sandbox.
func (s *Server) mcpServer(r *http.Request) *mcp.Server {
	name := DefaultMCPSandbox
	if rest, ok := strings.CutPrefix(r.URL.Path, "/mcp/"); ok && rest != "" {
		name, _ = url.PathUnescape(rest)
	}
	b, err := s.sessionsOf(name)
	if err != nil {
		s.log.Warn("MCP request for a sandbox without sessions", "sandbox", truncate(name, 40), "err", err)
		return nil
	}
	return sessionmcp.NewServer(b, name)
}

func (s *Server) sessionsOf(sandbox string) (SessionTable, error) {
	if s.cfg.Sessions == nil {
		return nil, fail(http.StatusServiceUnavailable, "this server runs no sessions", "")
	}
	b, err := s.cfg.Sessions(sandbox)
	if err != nil {
		return nil, managerError(err)
	}
	return b, nil
}

func (s *Server) backend(c echo.Context) (SessionTable, error) {
	return s.sessionsOf(sandboxOf(c).Name())
}

// sessionError answers a refused session request with its status.
func sessionError(err error) error {
	var se *sess.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Kind {
	case sess.NotFound:
		return fail(http.StatusNotFound, se.Msg, "list the sessions: GET …/sessions?user_id=USER")
	case sess.OtherUser:
		return fail(http.StatusForbidden, se.Msg, "a session is used by the user_id that started it")
	case sess.Busy, sess.Full:
		return fail(http.StatusConflict, se.Msg, "")
	case sess.Unavailable:
		return fail(http.StatusServiceUnavailable, se.Msg, "")
	}
	return fail(http.StatusBadRequest, se.Msg, "see docs/api.md for the sessions routes")
}

func (s *Server) listSessions(c echo.Context) error {
	b, err := s.backend(c)
	if err != nil {
		return err
	}
	res, err := b.List(c.Request().Context(), sess.ListRequest{UserID: c.QueryParam("user_id")})
	if err != nil {
		return sessionError(err)
	}
	return c.JSON(http.StatusOK, res)
}

func (s *Server) executeTask(c echo.Context) error {
	b, err := s.backend(c)
	if err != nil {
		return err
	}
	var req sess.ExecuteRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	res, err := b.Execute(c.Request().Context(), req)
	if err != nil {
		return sessionError(err)
	}
	return c.JSON(http.StatusOK, res)
}

func (s *Server) getSession(c echo.Context) error {
	b, err := s.backend(c)
	if err != nil {
		return err
	}
	res, err := b.Get(c.Request().Context(), c.Param("id"), c.QueryParam("user_id"))
	if err != nil {
		return sessionError(err)
	}
	return c.JSON(http.StatusOK, res)
}

func (s *Server) sessionFiles(c echo.Context) error {
	b, err := s.backend(c)
	if err != nil {
		return err
	}
	var req sess.FilesRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.SessionID != "" && req.SessionID != c.Param("id") {
		return fail(http.StatusBadRequest, "session_id in the body differs from the one in the path", "leave it out of the body")
	}
	req.SessionID = c.Param("id")
	res, err := b.Files(c.Request().Context(), req)
	if err != nil {
		return sessionError(err)
	}
	return c.JSON(http.StatusOK, res)
}

func (s *Server) cleanupSession(c echo.Context) error {
	b, err := s.backend(c)
	if err != nil {
		return err
	}
	res, err := b.Cleanup(c.Request().Context(), sess.CleanupRequest{SessionID: c.Param("id"), UserID: c.QueryParam("user_id")})
	if err != nil {
		return sessionError(err)
	}
	return c.JSON(http.StatusOK, res)
}

// SessionClient is a sandbox's sessions over the REST API: the backend of
// `airlock mcp`. Its calls wait as long as their context allows.
type SessionClient struct {
	c       *Client
	sandbox string
}

// Sessions returns the sessions of sandbox over the API.
func (c *Client) Sessions(sandbox string) *SessionClient {
	cc := *c
	hc := *c.http
	hc.Timeout = 0 // a task runs up to an hour; the caller's context bounds it
	cc.http = &hc
	return &SessionClient{c: &cc, sandbox: sandbox}
}

func (sc *SessionClient) path(rest string) string {
	return "/sandboxes/" + url.PathEscape(sc.sandbox) + "/sessions" + rest
}

func (sc *SessionClient) Execute(ctx context.Context, req sess.ExecuteRequest) (res sess.ExecuteResult, err error) {
	err = sc.c.Do(ctx, "POST", sc.path(""), req, &res)
	return res, err
}

func (sc *SessionClient) Files(ctx context.Context, req sess.FilesRequest) (res sess.FilesResult, err error) {
	err = sc.c.Do(ctx, "POST", sc.path("/"+url.PathEscape(req.SessionID)+"/files"), sess.FilesRequest{Paths: req.Paths, UserID: req.UserID}, &res)
	return res, err
}

func (sc *SessionClient) Cleanup(ctx context.Context, req sess.CleanupRequest) (res sess.CleanupResult, err error) {
	err = sc.c.Do(ctx, "DELETE", sc.path("/"+url.PathEscape(req.SessionID)+"?user_id="+url.QueryEscape(req.UserID)), nil, &res)
	return res, err
}

func (sc *SessionClient) Get(ctx context.Context, id, user string) (res sess.Info, err error) {
	err = sc.c.Do(ctx, "GET", sc.path("/"+url.PathEscape(id)+"?user_id="+url.QueryEscape(user)), nil, &res)
	return res, err
}

func (sc *SessionClient) List(ctx context.Context, req sess.ListRequest) (res sess.ListResult, err error) {
	err = sc.c.Do(ctx, "GET", sc.path("?user_id="+url.QueryEscape(req.UserID)), nil, &res)
	return res, err
}
