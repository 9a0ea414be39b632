package ui

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
)

// Exposure is a member's port that airlockd forwards a host port to (a
// preview, docs/design.md §6.2): connections to HostAddr reach Port of
// Member, and nothing else of the sandbox.
type Exposure struct {
	ID      string `json:"id"`
	Sandbox string `json:"sandbox"`
	Member  string `json:"member"` // the member's source name, as records and approvals show it
	Addr    string `json:"addr"`   // the member's address when it was exposed
	Port    uint16 `json:"port"`
	// HostAddr is where the host reaches it: "127.0.0.1:HOSTPORT", or
	// expose_listen's address.
	HostAddr string    `json:"host_addr"`
	URL      string    `json:"url"` // http://HOSTADDR/
	Created  time.Time `json:"created"`
}

// ExposeRequest is the body of POST …/exposures.
type ExposeRequest struct {
	// Member names the member: its source name, or its address in the
	// sandbox when several members share a name.
	Member string `json:"member"`
	Port   int    `json:"port"` // the member's port, 1 to 65535
	// HostPort is the host port to listen on; 0 lets the kernel pick one.
	HostPort int `json:"host_port,omitempty"`
}

// MemberView is a live member of a sandbox, as GET …/members lists it.
type MemberView struct {
	Name string `json:"name"` // its source name
	Addr string `json:"addr"`
	Kind string `json:"kind"` // run (airlock run, a session without Docker) or docker
}

// Exposer opens, lists and closes exposures (airlockd). Its errors are
// *ManagerError where the request was at fault.
type Exposer interface {
	// ExposePort starts forwarding a host port to a member's port. The
	// exposure ends when it is closed, when its member ends, and when the
	// sandbox or airlockd stops.
	ExposePort(sandbox string, req ExposeRequest) (Exposure, error)
	// Exposures lists the sandbox's open exposures, oldest first.
	Exposures(sandbox string) []Exposure
	// CloseExposure ends an exposure and the connections it carries.
	CloseExposure(sandbox, id string) error
	// Members lists the sandbox's live members, which can be exposed.
	Members(sandbox string) []MemberView
	// ExposeListen is the host address exposures listen on (expose_listen),
	// also those an allowed port request opens.
	ExposeListen() string
}

// MaxMemberName bounds a member name in a request.
const MaxMemberName = 128

func (s *Server) exposureRoutes(sb *echo.Group) {
	sb.GET("/members", s.listMembers)
	sb.GET("/exposures", s.listExposures)
	sb.POST("/exposures", s.expose)
	sb.DELETE("/exposures/:id", s.closeExposure)
}

func (s *Server) exposer() (Exposer, error) {
	if s.cfg.Exposures == nil {
		return nil, fail(http.StatusServiceUnavailable, "this server exposes no ports", "")
	}
	return s.cfg.Exposures, nil
}

func (s *Server) listMembers(c echo.Context) error {
	x, err := s.exposer()
	if err != nil {
		return err
	}
	list := x.Members(sandboxOf(c).Name())
	if list == nil {
		list = []MemberView{}
	}
	return c.JSON(http.StatusOK, list)
}

func (s *Server) listExposures(c echo.Context) error {
	x, err := s.exposer()
	if err != nil {
		return err
	}
	list := x.Exposures(sandboxOf(c).Name())
	if list == nil {
		list = []Exposure{}
	}
	return c.JSON(http.StatusOK, list)
}

func (s *Server) expose(c echo.Context) error {
	x, err := s.exposer()
	if err != nil {
		return err
	}
	var req ExposeRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if err := req.Check(); err != nil {
		return managerError(err)
	}
	out, err := x.ExposePort(sandboxOf(c).Name(), req)
	if err != nil {
		return managerError(err)
	}
	return c.JSON(http.StatusCreated, out)
}

// Check refuses a request that names no member or a port out of range.
func (r ExposeRequest) Check() error {
	const example = `send {"member": "web", "port": 8080}`
	switch {
	case r.Member == "":
		return &ManagerError{Msg: "member is required", Hint: example + "; GET …/members lists them"}
	case len(r.Member) > MaxMemberName:
		return &ManagerError{Msg: "member name too long", Hint: "member names are at most 128 bytes"}
	case r.Port < 1 || r.Port > 65535:
		return &ManagerError{Msg: "port must be 1 to 65535", Hint: example}
	case r.HostPort < 0 || r.HostPort > 65535:
		return &ManagerError{Msg: "host_port must be 1 to 65535, or 0 (left out) for one the kernel picks", Hint: example}
	}
	return nil
}

func (s *Server) closeExposure(c echo.Context) error {
	x, err := s.exposer()
	if err != nil {
		return err
	}
	if err := x.CloseExposure(sandboxOf(c).Name(), c.Param("id")); err != nil {
		return managerError(err)
	}
	return c.JSON(http.StatusOK, map[string]string{"closed": c.Param("id")})
}
