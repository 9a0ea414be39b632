package policy

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// InternalName is the reserved name under which a sandbox's members reach
// the member API: the DNS gate answers it with the gateway's address, and
// the proxy serves the API there on port 80 (design §5.10). Nothing under
// it resolves, and no rule ever lets a connection to it go upstream.
const InternalName = "airlock.internal"

// IsInternalName reports whether a normalised host is InternalName or a
// name under it.
func IsInternalName(host string) bool {
	return host == InternalName || strings.HasSuffix(host, "."+InternalName)
}

// AskKind is what an approval asks a person for.
type AskKind string

// Kinds of approvals.
const (
	// AskNetwork is traffic to a host: a held connection or request, or
	// a member's request for a URL ahead of its traffic.
	AskNetwork AskKind = "network"
	// AskPort is a member's request to reach one of its ports from the
	// host (a preview).
	AskPort AskKind = "port"
	// AskResources is a member's request for other memory, CPU or
	// process limits.
	AskResources AskKind = "resources"
)

// ParseAskKind reads "network", "port" or "resources".
func ParseAskKind(s string) (AskKind, error) {
	switch k := AskKind(s); k {
	case AskNetwork, AskPort, AskResources:
		return k, nil
	}
	return "", fmt.Errorf("unknown kind %q: want port, resources or network", truncate(s, 40))
}

// Errors of Broker.Request, checked with errors.Is.
var (
	// ErrRefused: a request refused without asking anyone (a network
	// request the rules deny, or ErrBeyondBounds).
	ErrRefused = errors.New("refused without asking")
	// ErrBeyondBounds: a resources request outside the sandbox's bounds;
	// it wraps ErrRefused.
	ErrBeyondBounds = fmt.Errorf("%w: beyond the sandbox's resource bounds", ErrRefused)
	// ErrTooManyHeld: the member or the sandbox holds as many asks as it
	// may.
	ErrTooManyHeld = errors.New("too many open requests")
	// ErrWrongAction is wrapped by Decide's error for an action that does
	// not apply to the approval's kind.
	ErrWrongAction = errors.New("action does not apply")
	// ErrGrantFailed is wrapped by Decide's error for an allowed port or
	// resources request that could not be carried out; the member is told.
	ErrGrantFailed = errors.New("approved, but it could not be done")
)

// MaxReasonLen bounds the reason a member gives, in bytes.
const MaxReasonLen = 500

// CleanReason makes a member's reason fit to keep: control and format
// characters (line breaks, terminal escapes, bidi controls, zero-width
// characters) and invalid UTF-8 become spaces, runs of white space one
// space, and it is cut to MaxReasonLen bytes at a character boundary.
// Readers still escape what is left (design §8, invariant 16).
func CleanReason(s string) string {
	var b strings.Builder
	space := false
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) || unicode.IsSpace(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp, unicode.Co, unicode.Cs) {
			space = b.Len() > 0
			continue
		}
		add := len(string(r))
		if space {
			add++
		}
		if b.Len()+add > MaxReasonLen {
			break
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		b.WriteRune(r)
	}
	return b.String()
}

// RequestedURL reads the url of a member's network request:
// "https://host/path", "http://host:8080/", or a bare "host" (https). It
// returns the normalised host, the port and the URL as a person is shown
// it. A URL with credentials, a fragment, a scheme other than http and
// https, or a space, control or format character anywhere (Unicode's too:
// bidi controls, zero-width characters, line separators, invalid UTF-8) is
// refused, and so is the reserved InternalName.
func RequestedURL(s string) (host string, port uint16, url string, err error) {
	if len(s) > 2048 {
		return "", 0, "", errors.New("url is longer than 2048 bytes")
	}
	if !utf8.ValidString(s) || strings.ContainsFunc(s, unsafeInURL) {
		return "", 0, "", errors.New("url holds a space or control character")
	}
	if strings.ContainsAny(s, "@#") {
		return "", 0, "", errors.New("url holds credentials or a fragment; send scheme://host[:port]/path")
	}
	q, err := SampleQuery(s)
	if err != nil {
		return "", 0, "", err
	}
	if IsInternalName(q.Host) {
		return "", 0, "", errors.New(InternalName + " is airlock's own name; nothing needs approving for it")
	}
	scheme := "https"
	if strings.HasPrefix(strings.ToLower(s), "http://") {
		scheme = "http"
	}
	authority := q.Host
	if strings.Contains(authority, ":") {
		authority = "[" + authority + "]"
	}
	if scheme == "https" && q.Port != 443 || scheme == "http" && q.Port != 80 {
		authority += ":" + strconv.Itoa(int(q.Port))
	}
	return q.Host, q.Port, scheme + "://" + authority + q.Path, nil
}

// unsafeInURL reports a character a member's url may not hold anywhere:
// white space and every control, format (bidi, zero-width) and separator
// character, Unicode's as well as ASCII's. url.Parse passes them through
// in a query, and the url is shown to a person and kept in the records.
func unsafeInURL(r rune) bool {
	return r <= ' ' || r == 0x7f || unicode.IsControl(r) || unicode.IsSpace(r) ||
		unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp, unicode.Zs, unicode.Co, unicode.Cs)
}

// Bound is one end of what members may ask for of a resource: a number,
// or (Host) as much as this host has.
type Bound struct {
	Value float64
	Host  bool
}

func (b Bound) String() string {
	if b.Host {
		return "host"
	}
	return strconv.FormatFloat(b.Value, 'f', -1, 64)
}

// Range bounds what members may ask for of one resource.
type Range struct{ Min, Max Bound }

// ResourceBounds are what members may ask for through the member API:
// a resources request outside them is refused without asking anyone.
type ResourceBounds struct {
	CPUs     Range
	MemoryMB Range
	Pids     Range
}

// HostResources are what "host" stands for in bounds.
type HostResources struct {
	CPUs     float64 // CPUs online
	MemoryMB int     // physical memory
}

// Defaults of the bounds.
const (
	DefaultMinCPUs     = 0.5
	DefaultMinMemoryMB = 512
	DefaultMinPids     = 10
	DefaultMaxPids     = 1000
)

// DefaultBounds are the bounds of a policy file that names none: CPUs 0.5
// to the host's, memory 512 MB to the host's, processes 10 to 1000.
func DefaultBounds() ResourceBounds {
	return ResourceBounds{
		CPUs:     Range{Min: Bound{Value: DefaultMinCPUs}, Max: Bound{Host: true}},
		MemoryMB: Range{Min: Bound{Value: DefaultMinMemoryMB}, Max: Bound{Host: true}},
		Pids:     Range{Min: Bound{Value: DefaultMinPids}, Max: Bound{Value: DefaultMaxPids}},
	}
}

// Check reports whether a request for memoryMB, cpus and pids (0: left as
// it is) lies within the bounds; the error, wrapping ErrBeyondBounds, says
// which value is out and what the bounds are.
func (b ResourceBounds) Check(memoryMB int, cpus float64, pids int, host HostResources) error {
	check := func(name string, v float64, r Range, have float64) error {
		if v == 0 {
			return nil
		}
		lo, hi := r.Min.Value, r.Max.Value
		if r.Min.Host {
			lo = have
		}
		if r.Max.Host {
			hi = have
		}
		if (r.Min.Host || r.Max.Host) && have <= 0 {
			return fmt.Errorf("%w: %s is bounded by the host's, which airlockd could not read", ErrBeyondBounds, name)
		}
		if v < lo || v > hi {
			return fmt.Errorf("%w: %s %s is outside %s to %s (%s to %s here); the sandbox's policy file sets the bounds under resources.bounds",
				ErrBeyondBounds, name, strconv.FormatFloat(v, 'f', -1, 64), r.Min, r.Max,
				strconv.FormatFloat(lo, 'f', -1, 64), strconv.FormatFloat(hi, 'f', -1, 64))
		}
		return nil
	}
	return errors.Join(
		check("memory_mb", float64(memoryMB), b.MemoryMB, float64(host.MemoryMB)),
		check("cpus", cpus, b.CPUs, host.CPUs),
		check("pids", float64(pids), b.Pids, 0),
	)
}

// checkKind checks that an ask carries the fields of its kind and no
// others.
func (req *AskRequest) checkKind() error {
	if req.Kind == "" {
		req.Kind = AskNetwork
	}
	resources := req.MemoryMB != 0 || req.CPUs != 0 || req.Pids != 0
	switch req.Kind {
	case AskNetwork:
		switch {
		case req.Host == "" || req.Port == 0:
			return errors.New("a network request needs a url")
		case resources:
			return errors.New("memory_mb, cpus and pids belong to a resources request")
		}
	case AskPort:
		switch {
		case req.Port == 0:
			return errors.New("a port request needs a port from 1 to 65535")
		case resources:
			return errors.New("memory_mb, cpus and pids belong to a resources request")
		case req.Host != "" || req.URL != "":
			return errors.New("url belongs to a network request")
		}
	case AskResources:
		switch {
		case !resources:
			return errors.New("a resources request needs memory_mb, cpus or pids")
		case req.MemoryMB < 0 || req.Pids < 0 || req.CPUs < 0 || math.IsNaN(req.CPUs) || math.IsInf(req.CPUs, 0):
			return errors.New("memory_mb, cpus and pids must be positive")
		case req.Port != 0:
			return errors.New("port belongs to a port request")
		case req.Host != "" || req.URL != "":
			return errors.New("url belongs to a network request")
		}
	default:
		_, err := ParseAskKind(string(req.Kind))
		return err
	}
	return nil
}

// Summary says in a few words what a member's request asks for: "port
// 8080", "memory_mb 1024, cpus 2", or the URL.
func (p Pending) Summary() string {
	switch p.Kind {
	case AskPort:
		return "port " + strconv.Itoa(int(p.Port))
	case AskResources:
		var parts []string
		if p.MemoryMB != 0 {
			parts = append(parts, "memory_mb "+strconv.Itoa(p.MemoryMB))
		}
		if p.CPUs != 0 {
			parts = append(parts, "cpus "+strconv.FormatFloat(p.CPUs, 'f', -1, 64))
		}
		if p.Pids != 0 {
			parts = append(parts, "pids "+strconv.Itoa(p.Pids))
		}
		return strings.Join(parts, ", ")
	}
	if p.Method != "" {
		return p.Method + " " + p.URL
	}
	return p.URL
}

// Actions are the actions that apply to a pending approval: deny,
// allow_once and allow_pattern for held traffic; deny and allow_pattern for
// a member's network request (it holds no traffic to let through once);
// deny and allow for a port or resources request.
func (p Pending) Actions() []Resolution {
	switch {
	case p.Kind == AskPort || p.Kind == AskResources:
		return []Resolution{ResolveDeny, ResolveAllow}
	case p.Requested:
		return []Resolution{ResolveDeny, ResolveAllowPattern}
	}
	return []Resolution{ResolveDeny, ResolveAllowOnce, ResolveAllowPattern}
}

// Ticket is a member's request as the member API keeps it: its approval's
// ID and deadline and, once decided, the outcome.
type Ticket struct {
	b        *Broker // nil for a request answered at once
	id       string
	deadline time.Time
	w        *waiter
}

// ID is the ID of the approval it waits on, which a person decides and the
// member polls: the one it opened or joined, unless it was asked about
// anew in another since.
func (t *Ticket) ID() string {
	id, _ := t.current()
	return id
}

// Deadline is when its approval times out if nobody decides.
func (t *Ticket) Deadline() time.Time {
	_, deadline := t.current()
	return deadline
}

func (t *Ticket) current() (string, time.Time) {
	if t.b == nil {
		return t.id, t.deadline
	}
	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	if ps := t.w.ps; ps != nil {
		t.id, t.deadline = ps.ID, ps.Deadline
	}
	return t.id, t.deadline
}

// Done is closed once the request is decided or has timed out.
func (t *Ticket) Done() <-chan struct{} { return t.w.done }

// Outcome is the decision, and false while there is none.
func (t *Ticket) Outcome() (Outcome, bool) {
	select {
	case <-t.w.done:
		return t.w.out, true
	default:
		return Outcome{}, false
	}
}

// Request opens an approval for what a member asked through the member
// API and returns at once. Unlike Ask, nobody has to wait on it: the
// approval stays until a person decides or it times out, and a grant
// (port, resources) is carried out when a person allows it. A request of
// the member's equal to one that is open (the same kind and values; the
// reason aside) shares its approval.
//
// A network request the rules decide already is not asked about: one
// they allow is answered at once (Action "allowed"), one they deny is
// refused (ErrRefused), as held traffic would be.
//
// A request whose fields do not fit its kind is an error; a resources
// request outside the sandbox's bounds wraps ErrBeyondBounds and one over
// the bounds on held asks ErrTooManyHeld: none opens an approval.
func (b *Broker) Request(req AskRequest) (*Ticket, error) {
	req.Requested, req.Headers, req.Method = true, nil, ""
	if err := req.checkKind(); err != nil {
		return nil, err
	}
	if req.Kind == AskNetwork {
		switch d := b.cfg.Sandbox.Decide(queryOf(req)); d.Verdict {
		case Allow:
			id := make([]byte, 8)
			rand.Read(id)
			w := &waiter{done: make(chan struct{}), out: Outcome{Allowed: true, Rule: d.Rule, Action: "allowed", Reason: "allowed already: " + d.Explain(req.Host)}}
			close(w.done)
			return &Ticket{id: hex.EncodeToString(id), deadline: b.cfg.Now(), w: w}, nil
		case Deny:
			return nil, fmt.Errorf("%w: %s", ErrRefused, d.Explain(req.Host))
		}
	}
	if req.Kind == AskResources {
		if err := b.cfg.Sandbox.Spec().Resources.Bounds.Check(req.MemoryMB, req.CPUs, req.Pids, b.cfg.Host); err != nil {
			return nil, err
		}
	}
	if req.Kind != AskNetwork {
		req.Host, req.URL = "", ""
	}
	w := newWaiter(req)
	if why := b.join(req, w); why != "" {
		return nil, fmt.Errorf("%w: %s", ErrTooManyHeld, why)
	}
	t := &Ticket{b: b, w: w}
	t.current()
	return t, nil
}
