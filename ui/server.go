package ui

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/jsonbody"
	"github.com/airlockhq/airlock/policy"
)

// Sandbox is what the API needs of a running sandbox.
type Sandbox interface {
	Name() string
	Subnet() string
	Policy() *policy.Sandbox
	Broker() *policy.Broker
	Journal() *audit.Journal
	// CAPEM returns the sandbox CA certificate in PEM.
	CAPEM() []byte
}

// Manager creates and deletes sandboxes at run time (airlockd).
type Manager interface {
	// CreateSandbox starts a sandbox; policy may be "" for the default
	// path. A *ManagerError says what was wrong with the request.
	CreateSandbox(name, policy, subnet string) (Sandbox, error)
	// DeleteSandbox stops a sandbox and removes its network.
	DeleteSandbox(name string) error
	// Reload re-reads the config file and every policy file, and brings
	// sandboxes up or down to match. A config file that does not parse is
	// a *ManagerError and changes nothing; a policy file that does not
	// parse keeps its sandbox's last good policy and is listed in Errors.
	Reload() (ReloadResult, error)
}

// ReloadResult says what a reload did, by sandbox name.
type ReloadResult struct {
	Added    []string `json:"added"`
	Removed  []string `json:"removed"`
	Changed  []string `json:"changed"`  // subnet or policy path changed: restarted
	Reloaded []string `json:"reloaded"` // unchanged sandboxes whose policy file was re-read
	// Widened names the re-read sandboxes whose policy file gave their
	// members more than the policy it replaced, and how ("myapp:
	// unknown_action: ask → allow"). Polling leaves such edits for a
	// reload to apply.
	Widened []string `json:"widened"`
	// Errors are the problems that left something as it was, each naming
	// its file and line where it has one.
	Errors []string `json:"errors"`
	// Restart lists config keys that changed but take effect only when
	// airlockd restarts.
	Restart []string `json:"restart"`
}

// ManagerError is a Manager's refusal of a request.
type ManagerError struct {
	Msg, Hint          string
	NotFound, Conflict bool
	Unavailable        bool // the host lacks what the request needs (503)
}

func (e *ManagerError) Error() string { return e.Msg }

// Config configures a Server.
type Config struct {
	// Listen is "127.0.0.1:PORT" (loopback only) or "unix:/path". Required.
	Listen string
	// TokenFile holds the API token; it is created 0600 with a random
	// token when missing. Required.
	TokenFile string
	// Sandboxes returns the running sandboxes. Required.
	Sandboxes func() []Sandbox
	// Manager creates and deletes sandboxes; nil means the API cannot.
	Manager Manager
	// Containers runs Docker members; nil means there is no Docker Engine
	// and the container routes answer 503.
	Containers Containers
	// Sessions returns a sandbox's sessions for the sessions routes and
	// /mcp; nil means the server runs none.
	Sessions SessionsOf
	// Exposures opens and closes exposures of members' ports; nil means
	// the exposure routes answer 503.
	Exposures Exposer
	// MCPIdleTimeout closes an MCP session (of /mcp) that has had no
	// request for this long: a client that went away without ending its
	// session leaves nothing behind for longer. 0 means DefaultMCPIdleTimeout.
	MCPIdleTimeout time.Duration
	// Registry receives the metrics served at /metrics; nil means none.
	Registry *prometheus.Registry
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// MaxBody caps request bodies.
const MaxBody = 64 << 10

// Server is airlockd's HTTP face: the REST API, server-sent events and
// (with the web page) the approval UI.
type Server struct {
	cfg   Config
	log   *slog.Logger
	token string
	e     *echo.Echo
	ln    net.Listener
	srv   *http.Server
	wg    sync.WaitGroup

	// mu guards sessions.
	mu       sync.Mutex
	sessions map[string]session // cookie value → session
}

type session struct {
	csrf    string
	expires time.Time
}

// New loads (or creates) the token and builds the routes; Start listens.
func New(cfg Config) (*Server, error) {
	if cfg.Listen == "" || cfg.TokenFile == "" || cfg.Sandboxes == nil {
		return nil, errors.New("ui: listen address, token file and sandboxes are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	token, err := loadOrCreateToken(cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "ui"), token: token, sessions: map[string]session{}}
	s.e = s.routes()
	return s, nil
}

// Token returns the API token.
func (s *Server) Token() string { return s.token }

// Handler returns the server's handler, for tests.
func (s *Server) Handler() http.Handler { return s.e }

func loadOrCreateToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			return "", fmt.Errorf("API token %s is readable by others (mode %v); chmod 600 it", path, fi.Mode().Perm())
		}
		t := strings.TrimSpace(string(b))
		if len(t) < 32 {
			return "", fmt.Errorf("API token in %s is shorter than 32 characters; remove the file to get a new one", path)
		}
		return t, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("API token: %w", err)
	}
	t := randomHex(32)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", fmt.Errorf("API token: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(t + "\n"); err != nil {
		return "", err
	}
	return t, f.Sync()
}

// Start listens on the configured address and serves until Close.
func (s *Server) Start() error {
	var ln net.Listener
	var err error
	if path, ok := strings.CutPrefix(s.cfg.Listen, "unix:"); ok {
		os.Remove(path)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		ln, err = net.Listen("unix", path)
		if err == nil {
			err = os.Chmod(path, 0o600)
		}
	} else {
		ln, err = net.Listen("tcp", s.cfg.Listen)
	}
	if err != nil {
		return fmt.Errorf("API listen %s: %w", s.cfg.Listen, err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s.e, ReadHeaderTimeout: 10 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("API server", "err", err)
		}
	}()
	s.log.Info("API listening", "addr", s.cfg.Listen)
	return nil
}

// Addr returns the listener's address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server: requests get a few seconds, event streams end.
// It is idempotent.
func (s *Server) Close() error {
	if s.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = s.srv.Close()
	}
	s.wg.Wait()
	return err
}

// apiError is every error the API returns: what went wrong, and what to do.
type apiError struct {
	Status  int    `json:"-"`
	Message string `json:"error"`
	Hint    string `json:"hint,omitempty"`
}

func (e *apiError) Error() string { return e.Message }

func fail(status int, msg, hint string) error {
	return &apiError{Status: status, Message: msg, Hint: hint}
}

func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var ae *apiError
	var he *echo.HTTPError
	out := apiError{Status: http.StatusInternalServerError, Message: err.Error()}
	switch {
	case errors.As(err, &ae):
		out = *ae
	case errors.As(err, &he):
		out = apiError{Status: he.Code, Message: strings.ToLower(fmt.Sprint(he.Message))}
		switch he.Code {
		case http.StatusNotFound:
			out.Hint = "the API lives under /api/v1; see docs/api.md"
		case http.StatusRequestEntityTooLarge:
			out.Message, out.Hint = "request body too large", fmt.Sprintf("bodies are limited to %d bytes", MaxBody)
		case http.StatusMethodNotAllowed:
			out.Hint = "check the method for this path in docs/api.md"
		}
	default:
		s.log.Error("API", "path", c.Path(), "err", err)
	}
	c.JSON(out.Status, out)
}

func (s *Server) routes() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.errorHandler
	if !strings.HasPrefix(s.cfg.Listen, "unix:") {
		e.Pre(loopbackOnly)
	}
	e.Use(s.bodyLimit)
	e.GET("/healthz", func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]any{"status": "ok", "sandboxes": len(s.cfg.Sandboxes())})
	})
	if s.cfg.Registry != nil {
		e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{})))
	}
	e.POST("/api/v1/login", s.login)
	s.webRoutes(e)
	api := e.Group("/api/v1", s.auth)
	api.GET("/sandboxes", s.listSandboxes)
	api.GET("/presets", s.listPresets)
	if s.cfg.Manager != nil {
		api.POST("/sandboxes", s.createSandbox)
		api.DELETE("/sandboxes/:sb", s.deleteSandbox)
		api.POST("/reload", s.reload)
	}
	sb := api.Group("/sandboxes/:sb", s.withSandbox)
	sb.GET("", s.getSandbox)
	for _, l := range []policy.List{policy.Allowlist, policy.Denylist} {
		name := l.String()
		sb.GET("/"+name, s.listRules(l))
		sb.POST("/"+name, s.addRule(l))
		sb.DELETE("/"+name+"/:id", s.removeRule(l))
		sb.PUT("/"+name+"/:id", s.replaceRule(l))
	}
	sb.GET("/proposal", s.getProposal)
	sb.POST("/proposal", s.saveProposal)
	sb.GET("/settings", s.getSettings)
	sb.PATCH("/settings", s.patchSettings)
	sb.POST("/allowlist/test", s.testPattern)
	sb.GET("/approvals", s.listApprovals)
	sb.POST("/approvals/:id", s.decide)
	sb.GET("/requests", s.listRequests)
	sb.GET("/requests.har", s.har)
	sb.GET("/events", s.events)
	s.containerRoutes(sb)
	s.sessionRoutes(e, sb)
	s.exposureRoutes(sb)
	sb.GET("/ca.pem", func(c echo.Context) error {
		return c.Blob(http.StatusOK, "application/x-pem-file", sandboxOf(c).CAPEM())
	})
	return e
}

// loopbackOnly refuses a request whose Host is not localhost or a loopback
// address, before anything else looks at it. The API listens on loopback
// only, so every client of its own names it so; a web page that rebinds
// its own name to 127.0.0.1 (DNS rebinding) reaches the port but sends
// its name, and must read nothing, not even /healthz or /metrics. (A unix
// socket is out of a page's reach: it is not checked.)
func loopbackOnly(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !loopbackHost(c.Request().Host) {
			return fail(http.StatusMisdirectedRequest, "the API answers only requests addressed to localhost or a loopback address",
				"use http://127.0.0.1:PORT or http://localhost:PORT; a request naming another host (a web page that rebound its name to this address) is refused")
		}
		return next(c)
	}
}

// loopbackHost reports whether a Host header (with or without a port)
// names localhost or a loopback address, or is missing: an HTTP/1.0
// client without one (a health check) is no browser, which always sends
// the name of the page.
func loopbackHost(h string) bool {
	if h == "" {
		return true
	}
	host, _, err := net.SplitHostPort(h)
	if err != nil {
		host = h // no port
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Zone() == "" && a.Unmap().IsLoopback()
}

// bodyLimit refuses bodies over MaxBody (MaxSessionBody for the routes
// that carry uploads) before a handler reads them.
func (s *Server) bodyLimit(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		limit := int64(MaxBody)
		if carriesUploads(r.URL.Path) {
			limit = MaxSessionBody
		}
		if r.ContentLength > limit {
			return fail(http.StatusRequestEntityTooLarge, "request body too large", fmt.Sprintf("bodies are limited to %d bytes", limit))
		}
		r.Body = http.MaxBytesReader(c.Response(), r.Body, limit)
		return next(c)
	}
}

// carriesUploads reports whether path is one of the routes that carry
// uploads: /mcp, /mcp/NAME and /api/v1/sandboxes/NAME/sessions[/...].
func carriesUploads(path string) bool {
	if path == "/mcp" || strings.HasPrefix(path, "/mcp/") && !strings.Contains(path[len("/mcp/"):], "/") {
		return true
	}
	rest, ok := strings.CutPrefix(path, "/api/v1/sandboxes/")
	if !ok {
		return false
	}
	_, rest, _ = strings.Cut(rest, "/")
	return rest == "sessions" || strings.HasPrefix(rest, "sessions/")
}

const (
	sessionCookie = "airlock_session"
	csrfHeader    = "X-Airlock-CSRF"
)

// auth lets a request through with the bearer token, or with a session
// cookie from /login (then mutations also need the CSRF header).
func (s *Server) auth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if h := r.Header.Get("Authorization"); h != "" {
			t, ok := strings.CutPrefix(h, "Bearer ")
			if ok && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(t)), []byte(s.token)) == 1 {
				return next(c)
			}
			return fail(http.StatusUnauthorized, "wrong token", "send Authorization: Bearer $(sudo cat "+s.cfg.TokenFile+")")
		}
		if ck, err := r.Cookie(sessionCookie); err == nil {
			s.mu.Lock()
			sess, ok := s.sessions[ck.Value]
			s.mu.Unlock()
			if ok && time.Now().Before(sess.expires) {
				if r.Method == http.MethodGet || subtle.ConstantTimeCompare([]byte(r.Header.Get(csrfHeader)), []byte(sess.csrf)) == 1 {
					return next(c)
				}
				return fail(http.StatusForbidden, "missing or wrong "+csrfHeader+" header", "the page sends the value /api/v1/login returned")
			}
		}
		return fail(http.StatusUnauthorized, "missing token", "send Authorization: Bearer $(sudo cat "+s.cfg.TokenFile+")")
	}
}

// login trades the token for an HttpOnly, SameSite=Strict session cookie
// and a CSRF value, for the web page.
func (s *Server) login(c echo.Context) error {
	var req struct {
		Token string `json:"token"`
	}
	if err := decode(c, &req); err != nil {
		return err
	}
	if subtle.ConstantTimeCompare([]byte(req.Token), []byte(s.token)) != 1 {
		return fail(http.StatusUnauthorized, "wrong token", "the token is in "+s.cfg.TokenFile)
	}
	id, csrf := randomHex(32), randomHex(32)
	s.mu.Lock()
	now := time.Now()
	for k, v := range s.sessions {
		if now.After(v.expires) {
			delete(s.sessions, k)
		}
	}
	s.sessions[id] = session{csrf: csrf, expires: now.Add(12 * time.Hour)}
	s.mu.Unlock()
	c.SetCookie(&http.Cookie{Name: sessionCookie, Value: id, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: 12 * 3600})
	return c.JSON(http.StatusOK, map[string]string{"csrf": csrf})
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// decode reads exactly one JSON object into v, refusing unknown fields.
func decode(c echo.Context, v any) error {
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fail(http.StatusRequestEntityTooLarge, "request body too large", fmt.Sprintf("bodies are limited to %d bytes", MaxBody))
		}
		return fail(http.StatusBadRequest, "cannot read the request body", "")
	}
	if err := jsonbody.Decode(body, v); err != nil {
		return fail(http.StatusBadRequest, "bad JSON body: "+err.Error(), "send one JSON object with the fields docs/api.md lists")
	}
	return nil
}

const sandboxKey = "airlock.sandbox"

func sandboxOf(c echo.Context) Sandbox { return c.Get(sandboxKey).(Sandbox) }

// withSandbox resolves :sb, or answers 404 naming the sandboxes there are.
func (s *Server) withSandbox(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		name := c.Param("sb")
		var names []string
		for _, sb := range s.cfg.Sandboxes() {
			if sb.Name() == name {
				c.Set(sandboxKey, sb)
				return next(c)
			}
			names = append(names, sb.Name())
		}
		slices.Sort(names)
		return fail(http.StatusNotFound, fmt.Sprintf("no sandbox %q", truncate(name, 40)), "sandboxes: "+strings.Join(names, ", "))
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
