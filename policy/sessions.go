package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Sessions is a policy file's sessions: section: how airlockd runs the
// tasks an agent platform hands it over MCP, each session a member of the
// sandbox of its own ("session:ID") with its own workspace.
type Sessions struct {
	// Image is the agent's image. Required.
	Image string
	// Command is the agent's command; each argument's "{task}" is replaced
	// by the task. Empty: the image's own command. The task also arrives in
	// AIRLOCK_TASK and on standard input either way.
	Command []string
	// Env are NAME=VALUE entries, and bare NAMEs whose value airlockd
	// passes from its own environment at each task (the value is never
	// written into the file).
	Env []string
	// User runs the agent as UID:GID; never root. Default 65534:65534.
	User string
	// Timeout bounds one task, unless a request names a shorter or longer
	// one (1 s to MaxSessionTaskTimeout). Default 300 s.
	Timeout time.Duration
	// IdleCleanup removes a session unused for this long. Default 30 min.
	IdleCleanup time.Duration
	// MaxSessions bounds the sandbox's sessions at once. Default 20.
	MaxSessions int
	// Limits are each session member's resources; zero fields take the
	// agent defaults.
	Limits Limits
}

// Defaults and bounds of the sessions: section.
const (
	DefaultSessionTimeout     = 300 * time.Second
	DefaultSessionIdleCleanup = 30 * time.Minute
	DefaultMaxSessions        = 20
	DefaultSessionUser        = "65534:65534"
	// MaxSessionTaskTimeout bounds a task's timeout, in the file and in a
	// request.
	MaxSessionTaskTimeout = time.Hour
	maxSessionIdleCleanup = 7 * 24 * time.Hour
	maxSessions           = 1000
)

// Equal reports whether s and o say the same; nil equals nil only.
func (s *Sessions) Equal(o *Sessions) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.Image == o.Image && slices.Equal(s.Command, o.Command) && slices.Equal(s.Env, o.Env) &&
		s.User == o.User && s.Timeout == o.Timeout && s.IdleCleanup == o.IdleCleanup &&
		s.MaxSessions == o.MaxSessions && s.Limits == o.Limits
}

// sessionsWiden says how next's sessions give members more than old's:
// sessions turned on, another image, command, environment or user.
func sessionsWiden(old, next *Sessions) []string {
	switch {
	case next == nil:
		return nil
	case old == nil:
		return []string{"sessions added: image " + next.Image}
	}
	var out []string
	if old.Image != next.Image {
		out = append(out, fmt.Sprintf("sessions: image %q → %q", old.Image, next.Image))
	}
	if !slices.Equal(old.Command, next.Command) {
		out = append(out, "sessions: command changed")
	}
	if !slices.Equal(old.Env, next.Env) {
		out = append(out, "sessions: env changed")
	}
	if old.User != next.User {
		out = append(out, fmt.Sprintf("sessions: user %s → %s", old.User, next.User))
	}
	return out
}

func (d *decoder) sessions(path string, n *yaml.Node) (*Sessions, error) {
	s := &Sessions{Timeout: DefaultSessionTimeout, IdleCleanup: DefaultSessionIdleCleanup, MaxSessions: DefaultMaxSessions, User: DefaultSessionUser}
	if n.Kind != yaml.MappingNode {
		return nil, d.errorf(n, path, "want a mapping with at least image, got %s", describeNode(n))
	}
	seconds := func(dst *time.Duration, hi time.Duration) func(string, *yaml.Node) error {
		return func(p string, v *yaml.Node) error {
			secs, err := d.int(p, v, 1, int64(hi/time.Second))
			*dst = time.Duration(secs) * time.Second
			return err
		}
	}
	var env map[string]int // name → line
	err := d.fields(n, path, map[string]func(string, *yaml.Node) error{
		"image":   d.image(&s.Image, "my-agent:1.0"),
		"command": d.command(&s.Command),
		"env": func(p string, v *yaml.Node) error {
			env = map[string]int{}
			return d.items(v, p, func(p string, v *yaml.Node) error {
				e, err := d.str(p, v)
				if err != nil {
					return d.errorf(v, p, "want NAME=VALUE, or a NAME whose value airlockd passes from its own environment, got %s", describeNode(v))
				}
				name, _, _ := strings.Cut(e, "=")
				switch {
				case !envName.MatchString(name):
					return d.errorf(v, p, "environment name %q: want letters, digits and _", truncate(name, 40))
				case strings.HasPrefix(strings.ToUpper(name), "AIRLOCK_"):
					return d.errorf(v, p, "%s: AIRLOCK_ variables are airlock's own and never reach a member", name)
				case strings.ContainsRune(e, 0):
					return d.errorf(v, p, "holds a NUL byte")
				}
				if line, dup := env[name]; dup {
					return d.errorf(v, p, "%s is set twice (first at line %d)", name, line)
				}
				env[name] = v.Line
				s.Env = append(s.Env, e)
				return nil
			})
		},
		"user": func(p string, v *yaml.Node) (err error) {
			if s.User, err = d.str(p, v); err != nil {
				return err
			}
			if !nonRootUser(s.User) {
				return d.errorf(v, p, "user %q: want a numeric UID:GID other than 0 (members never run as root)", truncate(s.User, 40))
			}
			return nil
		},
		"timeout":      seconds(&s.Timeout, MaxSessionTaskTimeout),
		"idle_cleanup": seconds(&s.IdleCleanup, maxSessionIdleCleanup),
		"max_sessions": func(p string, v *yaml.Node) error {
			n, err := d.int(p, v, 1, maxSessions)
			s.MaxSessions = int(n)
			return err
		},
		"resources": d.limits(&s.Limits),
	})
	if err != nil {
		return nil, err
	}
	if s.Image == "" {
		return nil, d.errorf(n, path, "missing image: the agent image each session runs")
	}
	return s, nil
}

// nonRootUser reports whether u is "UID:GID", both numeric and not 0.
func nonRootUser(u string) bool {
	uid, gid, ok := strings.Cut(u, ":")
	if !ok {
		return false
	}
	for _, id := range []string{uid, gid} {
		if n, err := strconv.ParseUint(id, 10, 32); err != nil || n == 0 {
			return false
		}
	}
	return true
}
