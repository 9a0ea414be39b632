package ui

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
)

// Containers starts, lists and stops a sandbox's Docker members (airlockd
// with a Docker Engine). Its errors are *ManagerError where the request was
// at fault.
type Containers interface {
	ListContainers(sandbox string) ([]Container, error)
	StartContainer(sandbox string, req ContainerRequest) (Container, error)
	// WaitContainer waits for a member started with StartContainer to end,
	// or for its run timeout, and returns its exit code and output.
	WaitContainer(ctx context.Context, sandbox, id string) (ContainerResult, error)
	RemoveContainer(sandbox, id string) error
}

// ContainerRequest asks for a hardened member.
type ContainerRequest struct {
	Image     string   `json:"image"`
	Cmd       []string `json:"cmd,omitempty"`
	Env       []string `json:"env,omitempty"`  // KEY=VALUE
	Name      string   `json:"name,omitempty"` // the container's name; "" lets Docker pick
	Source    string   `json:"source,omitempty"`
	Agent     string   `json:"agent,omitempty"`
	Kind      string   `json:"kind,omitempty"` // agent (default) or mcp: which resources: limits apply
	Workspace string   `json:"workspace,omitempty"`
	User      string   `json:"user,omitempty"`
	Trust     string   `json:"trust,omitempty"`
}

// Container is a member container as the API shows it.
type Container struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Source  string `json:"source"`
	Agent   string `json:"agent,omitempty"`
	Trust   string `json:"trust,omitempty"`
	Addr    string `json:"addr,omitempty"`
	Managed string `json:"managed,omitempty"` // member or sidecar when airlock started it
}

// ContainerResult is how a member ended.
type ContainerResult struct {
	ID       string `json:"id"`
	ExitCode int    `json:"exit_code"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Output   string `json:"output"`
	// Running says the member is still running after WaitPoll: ask again.
	Running bool `json:"running,omitempty"`
}

// WaitPoll is how long one wait request waits before it answers
// {"running": true}, so clients with request timeouts can ask again.
var WaitPoll = 20 * time.Second

func (s *Server) containerRoutes(sb *echo.Group) {
	sb.GET("/containers", s.listContainers)
	sb.POST("/containers", s.startContainer)
	sb.GET("/containers/:id/wait", s.waitContainer)
	sb.DELETE("/containers/:id", s.removeContainer)
	sb.GET("/containers/:id/archive", s.containerArchive) // artifacts.go
	sb.GET("/containers/:id/logs", s.containerLogs)
}

func (s *Server) containers() (Containers, error) {
	if s.cfg.Containers == nil {
		return nil, fail(http.StatusServiceUnavailable, "no Docker Engine on this host", "airlockd runs `airlock run` members only; start Docker and restart airlockd")
	}
	return s.cfg.Containers, nil
}

func (s *Server) listContainers(c echo.Context) error {
	cs, err := s.containers()
	if err != nil {
		return err
	}
	list, err := cs.ListContainers(sandboxOf(c).Name())
	if err != nil {
		return managerError(err)
	}
	if list == nil {
		list = []Container{}
	}
	return c.JSON(http.StatusOK, list)
}

func (s *Server) startContainer(c echo.Context) error {
	cs, err := s.containers()
	if err != nil {
		return err
	}
	var req ContainerRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.Image == "" {
		return fail(http.StatusBadRequest, "image is required", `send {"image": "my-agent:latest", "cmd": ["run"]}`)
	}
	out, err := cs.StartContainer(sandboxOf(c).Name(), req)
	if err != nil {
		return managerError(err)
	}
	return c.JSON(http.StatusCreated, out)
}

func (s *Server) waitContainer(c echo.Context) error {
	cs, err := s.containers()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), WaitPoll)
	defer cancel()
	res, err := cs.WaitContainer(ctx, sandboxOf(c).Name(), c.Param("id"))
	if errors.Is(err, context.DeadlineExceeded) && c.Request().Context().Err() == nil {
		return c.JSON(http.StatusOK, ContainerResult{ID: c.Param("id"), Running: true})
	}
	if err != nil {
		return managerError(err)
	}
	return c.JSON(http.StatusOK, res)
}

func (s *Server) removeContainer(c echo.Context) error {
	cs, err := s.containers()
	if err != nil {
		return err
	}
	if err := cs.RemoveContainer(sandboxOf(c).Name(), c.Param("id")); err != nil {
		return managerError(err)
	}
	return c.JSON(http.StatusOK, map[string]string{"removed": c.Param("id")})
}
