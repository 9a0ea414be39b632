// Package memberapi is the member API: what a sandbox's members may ask of
// airlock, at http://airlock.internal/ (design §5.10). The proxy hands it
// the connections members make to their gateway's port 80.
//
// A member can only ask. POST /v1/requests opens an approval of kind port,
// resources or network in the sandbox's one approvals queue, attributed to
// the member its source address names, and answers with the decision (or
// at once, with ?wait=0, with an ID to poll); GET /v1/requests/{id} polls
// one of the member's own requests. Nothing here lists, approves or
// reaches anything else, and every body is hostile: read strictly, bounded,
// refused with a clear error that changes nothing.
package memberapi

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/jsonbody"
	"github.com/airlockhq/airlock/internal/ratelog"
	"github.com/airlockhq/airlock/policy"
)

// Requester opens approvals for members' requests (policy.Broker).
type Requester interface {
	// Request opens (or joins) an approval and returns at once; see
	// policy.Broker.Request for its errors.
	Request(req policy.AskRequest) (*policy.Ticket, error)
}

// Member is who stands behind a source address.
type Member struct {
	// Name is the member as records and approvals name it; "" means the
	// address names it.
	Name string
	// ID is a Docker container's ID; "" means a member whose limits
	// airlock cannot change (resources requests are refused).
	ID string
	// Lease names a run member (airlock run, a session without Docker) by
	// its lease, which another member that later takes its name or
	// address does not have; "" for others.
	Lease string
}

// Config configures a Handler. Zero values take the defaults named.
type Config struct {
	// Sandbox names the sandbox, for logs. Required.
	Sandbox string
	// Gateway is the sandbox's gateway address: a request's Host must name
	// it or airlock.internal. Required.
	Gateway netip.Addr
	// Requests opens the approvals. Required.
	Requests Requester
	// Members names the member behind a source address; nil names every
	// member by its address.
	Members func(netip.Addr) Member
	// Rate is how many requests a second a member may open, on average;
	// default 1.
	Rate float64
	// Burst is how many it may open at once; default 5.
	Burst int
	// MaxOpen bounds a member's requests waiting for a decision at once;
	// default 4.
	MaxOpen int
	// Keep is how long a decided request can still be polled; default 10
	// minutes.
	Keep time.Duration
	// Logger gets the refusals, once per 10 s per member; nil means
	// slog.Default().
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// MaxBody bounds a request's body, in bytes.
const MaxBody = 4 << 10

// maxKept bounds the requests kept for polling, per member and in all.
const (
	maxKeptPerMember = 32
	maxKept          = 4096
)

// Handler serves the member API. It is safe for concurrent use.
type Handler struct {
	cfg      Config
	log      *slog.Logger
	refusals ratelog.Limiter

	// mu guards the following fields.
	mu      sync.Mutex
	buckets map[string]*bucket // by member
	kept    map[string]*kept   // by approval ID
	// opening counts, by member, the requests open let through that are
	// not kept yet: they hold their place under MaxOpen meanwhile.
	opening map[string]int
}

// bucket is a member's token bucket.
type bucket struct {
	tokens float64
	last   time.Time
}

// kept is a request a member may poll.
type kept struct {
	member string
	kind   policy.AskKind
	ticket *policy.Ticket
}

// New checks cfg and returns a handler.
func New(cfg Config) (*Handler, error) {
	switch {
	case cfg.Sandbox == "":
		return nil, errors.New("memberapi: no sandbox name")
	case !cfg.Gateway.IsValid():
		return nil, errors.New("memberapi: no gateway address")
	case cfg.Requests == nil:
		return nil, errors.New("memberapi: no requester")
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 1
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 5
	}
	if cfg.MaxOpen <= 0 {
		cfg.MaxOpen = 4
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 10 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Handler{cfg: cfg, log: log.With("component", "memberapi", "sandbox", cfg.Sandbox),
		buckets: map[string]*bucket{}, kept: map[string]*kept{}, opening: map[string]int{}}, nil
}

// Body is the body of POST /v1/requests.
type Body struct {
	Kind     string  `json:"kind"`                // port, resources or network
	Port     uint16  `json:"port,omitempty"`      // port: the member's port to reach from the host
	MemoryMB int     `json:"memory_mb,omitempty"` // resources: the memory limit asked for
	CPUs     float64 `json:"cpus,omitempty"`      // resources: the CPUs asked for
	Pids     int     `json:"pids,omitempty"`      // resources: the process limit asked for
	URL      string  `json:"url,omitempty"`       // network: the URL or host asked for
	Reason   string  `json:"reason"`              // why, for the person deciding
}

// Answer is what the API answers about a request.
type Answer struct {
	ID   string `json:"id,omitempty"`
	Kind string `json:"kind"`
	// Status is pending, approved (by a person, or by a rule already),
	// denied, timeout, failed (approved, but it could not be done) or
	// refused (never asked: the rules deny it, it is beyond the bounds, or
	// it is not possible for this member).
	Status      string  `json:"status"`
	Detail      string  `json:"detail,omitempty"`
	Rule        string  `json:"rule,omitempty"`         // the pattern an approved network request added
	SecondsLeft float64 `json:"seconds_left,omitempty"` // while pending
}

type apiError struct {
	Error string `json:"error"`
	Hint  string `json:"hint,omitempty"`
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if err := h.checkHost(r); err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{Error: err.Error(), Hint: "call http://" + policy.InternalName + "/v1/requests"})
		return
	}
	if o := r.Header.Get("Origin"); o != "" && o != "http://"+policy.InternalName {
		// A page a member's browser loaded may not ask in its name.
		writeJSON(w, http.StatusForbidden, apiError{Error: "requests from web pages are refused"})
		return
	}
	m := h.member(r)
	switch id, sub := strings.CutPrefix(r.URL.Path, "/v1/requests/"); {
	case r.URL.Path == "/v1/requests":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			writeJSON(w, http.StatusMethodNotAllowed, apiError{Error: "POST a request here", Hint: `{"kind": "port", "port": 8080, "reason": "…"}`})
			return
		}
		h.post(w, r, m)
	case sub && id != "" && !strings.Contains(id, "/"):
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET")
			writeJSON(w, http.StatusMethodNotAllowed, apiError{Error: "GET polls a request; members cannot decide"})
			return
		}
		h.poll(w, id, m)
	default:
		writeJSON(w, http.StatusNotFound, apiError{Error: "not found", Hint: "the member API has POST /v1/requests and GET /v1/requests/{id}"})
	}
}

// checkHost refuses a Host that names neither airlock.internal nor the
// gateway, on port 80.
func (h *Handler) checkHost(r *http.Request) error {
	host, port := r.Host, ""
	if hp, p, err := net.SplitHostPort(r.Host); err == nil {
		host, port = hp, p
	}
	n, err := policy.NormalizeHost(host)
	if err != nil || (n != policy.InternalName && n != h.cfg.Gateway.String()) || (port != "" && port != "80") {
		return fmt.Errorf("Host %q is not %s", truncate(r.Host, 80), policy.InternalName)
	}
	return nil
}

// member names who sent r.
func (h *Handler) member(r *http.Request) Member {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return Member{Name: r.RemoteAddr}
	}
	addr := ap.Addr().Unmap()
	var m Member
	if h.cfg.Members != nil {
		m = h.cfg.Members(addr)
	}
	if m.Name == "" {
		m.Name = addr.String()
	}
	return m
}

func (h *Handler) post(w http.ResponseWriter, r *http.Request, m Member) {
	if wait := r.URL.Query().Get("wait"); wait != "" && wait != "0" && wait != "1" {
		h.refuse(w, m, http.StatusBadRequest, "wait must be 0 (answer at once with an id to poll) or 1 (wait for the decision, the default)", "")
		return
	}
	if after, ok := h.take(m.Name); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(after))
		h.refuse(w, m, http.StatusTooManyRequests, fmt.Sprintf("too many requests: at most %g a second (%d at once)", h.cfg.Rate, h.cfg.Burst), "")
		return
	}
	if ct := r.Header.Get("Content-Type"); !isJSON(ct) {
		h.refuse(w, m, http.StatusUnsupportedMediaType, "send the request as Content-Type: application/json", "")
		return
	}
	req, err := decode(r)
	if err != nil {
		h.refuse(w, m, http.StatusBadRequest, err.Error(), `{"kind": "port", "port": 8080, "reason": "…"}, {"kind": "resources", "memory_mb": 2048, "cpus": 2, "reason": "…"} or {"kind": "network", "url": "https://api.example.com/", "reason": "…"}`)
		return
	}
	req.Source, req.MemberID = m.Name, cmp.Or(m.ID, m.Lease)
	if req.Kind == policy.AskResources && m.ID == "" {
		h.refused(w, m, req.Kind, "the limits of this member cannot be changed: only Docker members' can")
		return
	}
	if after, ok := h.open(m.Name); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(after))
		h.refuse(w, m, http.StatusTooManyRequests, fmt.Sprintf("too many open requests: at most %d of a member wait for a decision at once", h.cfg.MaxOpen), "")
		return
	}
	t, err := h.cfg.Requests.Request(req)
	if err != nil {
		h.keep(nil, m.Name, req.Kind)
	}
	switch {
	case errors.Is(err, policy.ErrRefused):
		h.refused(w, m, req.Kind, err.Error())
		return
	case errors.Is(err, policy.ErrTooManyHeld):
		w.Header().Set("Retry-After", "10")
		h.refuse(w, m, http.StatusTooManyRequests, err.Error(), "")
		return
	case err != nil:
		h.refuse(w, m, http.StatusBadRequest, err.Error(), "")
		return
	}
	h.keep(t, m.Name, req.Kind)
	if _, done := t.Outcome(); !done && r.URL.Query().Get("wait") == "0" {
		w.Header().Set("Location", "/v1/requests/"+t.ID())
		writeJSON(w, http.StatusAccepted, h.answer(t, req.Kind))
		return
	}
	select {
	case <-t.Done():
	case <-r.Context().Done():
		// The member went away, or airlockd stops: the request stays open,
		// and can be polled.
		return
	case <-time.After(time.Until(t.Deadline()) + 5*time.Second):
	}
	writeJSON(w, http.StatusOK, h.answer(t, req.Kind))
}

func (h *Handler) poll(w http.ResponseWriter, id string, m Member) {
	h.mu.Lock()
	k, ok := h.kept[id]
	h.mu.Unlock()
	if !ok || k.member != m.Name {
		// Another member's request is as unknown as none.
		writeJSON(w, http.StatusNotFound, apiError{Error: fmt.Sprintf("no request %q of this member", truncate(id, 40)), Hint: "requests can be polled for 10 minutes after their decision"})
		return
	}
	writeJSON(w, http.StatusOK, h.answer(k.ticket, k.kind))
}

// answer says where a request stands.
func (h *Handler) answer(t *policy.Ticket, kind policy.AskKind) Answer {
	a := Answer{ID: t.ID(), Kind: string(kind)}
	out, done := t.Outcome()
	if !done {
		a.Status, a.SecondsLeft = "pending", math.Max(0, math.Ceil(t.Deadline().Sub(h.cfg.Now()).Seconds()))
		return a
	}
	a.Detail = out.Reason
	if out.Rule != nil {
		a.Rule = out.Rule.Pattern.String()
	}
	switch {
	case out.Action == "timeout":
		a.Status = "timeout"
	case out.Action == "failed":
		a.Status = "failed"
	case out.Allowed:
		a.Status = "approved"
	default:
		a.Status = "denied"
	}
	return a
}

// decode reads a request's body strictly: JSON of at most MaxBody bytes,
// one object, known fields of the right types, and the fields its kind
// needs.
func decode(r *http.Request) (policy.AskRequest, error) {
	data, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil {
		return policy.AskRequest{}, fmt.Errorf("read the body: %v", err)
	}
	if len(data) > MaxBody {
		return policy.AskRequest{}, fmt.Errorf("the body is over %d bytes", MaxBody)
	}
	var b Body
	if err := jsonbody.Decode(data, &b); err != nil {
		return policy.AskRequest{}, fmt.Errorf("bad JSON: %v", err)
	}
	kind, err := policy.ParseAskKind(b.Kind)
	if err != nil {
		return policy.AskRequest{}, err
	}
	reason := policy.CleanReason(b.Reason)
	if reason == "" {
		return policy.AskRequest{}, errors.New("reason is missing: say why, for the person who decides")
	}
	req := policy.AskRequest{Kind: kind, Port: b.Port, MemoryMB: b.MemoryMB, CPUs: b.CPUs, Pids: b.Pids, Reason: reason}
	if b.URL != "" {
		if kind != policy.AskNetwork {
			return policy.AskRequest{}, errors.New("url belongs to a network request")
		}
		if req.Port != 0 {
			return policy.AskRequest{}, errors.New("a network request's port is the url's")
		}
		if req.Host, req.Port, req.URL, err = policy.RequestedURL(b.URL); err != nil {
			return policy.AskRequest{}, fmt.Errorf("url: %v", err)
		}
	} else if kind == policy.AskNetwork {
		return policy.AskRequest{}, errors.New("a network request needs a url")
	}
	return req, nil
}

func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

// take takes a token of member's bucket; when there is none, it returns
// the seconds until there is.
func (h *Handler) take(member string) (int, bool) {
	now := h.cfg.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	b, ok := h.buckets[member]
	if !ok {
		if len(h.buckets) >= maxKept {
			// A full bucket is a new one: forget those.
			for k, o := range h.buckets {
				if h.level(o, now) >= float64(h.cfg.Burst) {
					delete(h.buckets, k)
				}
			}
		}
		b = &bucket{tokens: float64(h.cfg.Burst), last: now}
		h.buckets[member] = b
	}
	b.tokens, b.last = h.level(b, now), now
	if b.tokens < 1 {
		return int(math.Ceil((1 - b.tokens) / h.cfg.Rate)), false
	}
	b.tokens--
	return 0, true
}

// level is a bucket's tokens at now.
func (h *Handler) level(b *bucket, now time.Time) float64 {
	return math.Min(float64(h.cfg.Burst), b.tokens+now.Sub(b.last).Seconds()*h.cfg.Rate)
}

// open reports whether member may open another request, and holds its
// place until keep; when not, it returns the seconds until its oldest open
// one times out. It forgets requests decided longer ago than Keep first.
func (h *Handler) open(member string) (int, bool) {
	now := h.cfg.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweepLocked(now)
	n, first := 0, time.Time{}
	for _, k := range h.kept {
		if _, done := k.ticket.Outcome(); k.member == member && !done {
			n++
			if first.IsZero() || k.ticket.Deadline().Before(first) {
				first = k.ticket.Deadline()
			}
		}
	}
	if n+h.opening[member] >= h.cfg.MaxOpen {
		return max(1, int(math.Ceil(first.Sub(now).Seconds()))), false
	}
	h.opening[member]++
	return 0, true
}

// keep remembers a request for polling, within the bounds on what is
// kept: a member's or the sandbox's oldest decided requests go first. It
// gives back the place open held; t nil only gives it back (nothing was
// opened).
func (h *Handler) keep(t *policy.Ticket, member string, kind policy.AskKind) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.opening[member]--; h.opening[member] <= 0 {
		delete(h.opening, member)
	}
	if t == nil {
		return
	}
	if _, ok := h.kept[t.ID()]; ok {
		return // an equal open request, joined
	}
	h.kept[t.ID()] = &kept{member: member, kind: kind, ticket: t}
	mine := 0
	for _, k := range h.kept {
		if k.member == member {
			mine++
		}
	}
	if mine > maxKeptPerMember {
		h.dropOldestLocked(func(k *kept) bool { return k.member == member })
	}
	if len(h.kept) > maxKept {
		h.dropOldestLocked(func(*kept) bool { return true })
	}
}

// dropOldestLocked forgets the decided request with the earliest deadline
// among those match selects.
func (h *Handler) dropOldestLocked(match func(*kept) bool) {
	var oldest string
	var at time.Time
	for id, k := range h.kept {
		if _, done := k.ticket.Outcome(); done && match(k) && (oldest == "" || k.ticket.Deadline().Before(at)) {
			oldest, at = id, k.ticket.Deadline()
		}
	}
	if oldest != "" {
		delete(h.kept, oldest)
	}
}

// sweepLocked forgets requests decided longer ago than Keep (the latest a
// request is decided is its deadline).
func (h *Handler) sweepLocked(now time.Time) {
	for id, k := range h.kept {
		if _, done := k.ticket.Outcome(); done && now.Sub(k.ticket.Deadline()) > h.cfg.Keep {
			delete(h.kept, id)
		}
	}
}

// Kept returns how many requests the handler keeps for polling.
func (h *Handler) Kept() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.kept)
}

// refuse answers an error, and logs it once per interval per member.
func (h *Handler) refuse(w http.ResponseWriter, m Member, status int, msg, hint string) {
	h.refusals.Log(h.log, m.Name, "member request refused", "source", m.Name, "status", status, "reason", msg)
	writeJSON(w, status, apiError{Error: msg, Hint: hint})
}

// refused answers a request refused without asking anyone.
func (h *Handler) refused(w http.ResponseWriter, m Member, kind policy.AskKind, why string) {
	h.refusals.Log(h.log, m.Name+"\x00refused", "member request refused without asking", "source", m.Name, "kind", kind, "reason", why)
	writeJSON(w, http.StatusForbidden, Answer{Kind: string(kind), Status: "refused", Detail: why})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
