package memberapi

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/policy"
)

var gateway = netip.MustParseAddr("10.88.0.1")

// Source addresses of the test's members.
const (
	agentAddr  = "10.88.0.130:40000" // a Docker member, "agent"
	otherAddr  = "10.88.0.131:40000" // a Docker member, "other"
	runnerAddr = "10.88.0.2:40000"   // an `airlock run` member, "runner": no container
)

type fixture struct {
	h      *Handler
	broker *policy.Broker
	grants chan policy.Pending
	logs   *syncBuffer
	now    time.Time
	mu     sync.Mutex
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newFixture serves the member API of a sandbox whose policy file says
// policyYAML, with a broker that records grants and a clock that stands
// still unless the test moves it.
func newFixture(t *testing.T, policyYAML string) *fixture {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	path := filepath.Join(t.TempDir(), "app.yaml")
	if err := os.WriteFile(path, []byte(policyYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	sb, err := policy.OpenSandbox(policy.SandboxConfig{Name: "test", Path: path})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{grants: make(chan policy.Pending, 16), logs: &syncBuffer{}, now: time.Now()}
	clock := func() time.Time {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.now
	}
	f.broker, err = policy.NewBroker(policy.BrokerConfig{Sandbox: sb, Timeout: 30 * time.Second, Now: clock,
		Host: policy.HostResources{CPUs: 4, MemoryMB: 8192},
		Grant: func(p policy.Pending) (string, error) {
			f.grants <- p
			if p.Kind == policy.AskPort {
				return "port 8080 is reachable from the host at 127.0.0.1:40123", nil
			}
			return "the limits are now " + p.Summary(), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	members := map[string]Member{
		"10.88.0.130": {Name: "agent", ID: "c0ffee"},
		"10.88.0.131": {Name: "other", ID: "beef"},
		"10.88.0.2":   {Name: "runner"},
	}
	f.h, err = New(Config{Sandbox: "test", Gateway: gateway, Requests: f.broker,
		Members: func(a netip.Addr) Member { return members[a.String()] },
		Logger:  slog.New(slog.NewTextHandler(f.logs, nil)),
		Now:     clock})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// do sends one request to the API from remote and returns the response.
func (f *fixture) do(ctx context.Context, remote, method, target, body string, header map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequestWithContext(ctx, method, target, strings.NewReader(body))
	r.RemoteAddr = remote
	r.Host = "airlock.internal"
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		if k == "Host" {
			r.Host = v
			continue
		}
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

func (f *fixture) post(remote, body string) *httptest.ResponseRecorder {
	return f.do(context.Background(), remote, "POST", "/v1/requests?wait=0", body, nil)
}

func answerOf(t *testing.T, w *httptest.ResponseRecorder) Answer {
	t.Helper()
	var a Answer
	if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
		t.Fatalf("answer %d %q: %v", w.Code, w.Body, err)
	}
	return a
}

// The API has two routes, for members, and nothing else: no listing, no
// deciding, none of the control API's paths; a Host that is not
// airlock.internal and a web page's Origin are refused.
func TestMemberAPIRoutes(t *testing.T) {
	f := newFixture(t, "")
	w := f.post(agentAddr, `{"kind":"port","port":8080,"reason":"x"}`)
	if w.Code != 202 {
		t.Fatalf("POST: %d %s", w.Code, w.Body)
	}
	tk := answerOf(t, w)
	tests := []struct {
		name, method, target string
		header               map[string]string
		status               int
	}{
		{name: "list requests", method: "GET", target: "/v1/requests", status: 405},
		{name: "decide a request", method: "POST", target: "/v1/requests/" + tk.ID, status: 405},
		{name: "delete a request", method: "DELETE", target: "/v1/requests/" + tk.ID, status: 405},
		{name: "approvals", method: "GET", target: "/v1/approvals", status: 404},
		{name: "control API", method: "GET", target: "/api/v1/sandboxes/test/approvals", status: 404},
		{name: "control API decide", method: "POST", target: "/api/v1/sandboxes/test/approvals/" + tk.ID, status: 404},
		{name: "a path under an id", method: "GET", target: "/v1/requests/" + tk.ID + "/x", status: 404},
		{name: "root", method: "GET", target: "/", status: 404},
		{name: "another Host", method: "GET", target: "/v1/requests/" + tk.ID, header: map[string]string{"Host": "example.com"}, status: 400},
		{name: "a Host under the name", method: "GET", target: "/v1/requests/" + tk.ID, header: map[string]string{"Host": "x.airlock.internal"}, status: 400},
		{name: "another port", method: "GET", target: "/v1/requests/" + tk.ID, header: map[string]string{"Host": "airlock.internal:8080"}, status: 400},
		{name: "a web page's Origin", method: "POST", target: "/v1/requests", header: map[string]string{"Origin": "https://evil.example"}, status: 403},
		{name: "the gateway as Host", method: "GET", target: "/v1/requests/" + tk.ID, header: map[string]string{"Host": "10.88.0.1:80"}, status: 200},
		{name: "mixed case Host", method: "GET", target: "/v1/requests/" + tk.ID, header: map[string]string{"Host": "AIRLOCK.Internal."}, status: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := f.do(context.Background(), agentAddr, tt.method, tt.target, "", tt.header)
			if w.Code != tt.status {
				t.Errorf("%s %s = %d %s, want %d", tt.method, tt.target, w.Code, w.Body, tt.status)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
	if n := len(f.broker.List()); n != 1 {
		t.Errorf("%d approvals, want the one", n)
	}
}

// Every bad body is a 400 (415 for another content type) that says what
// is wrong, and opens nothing.
func TestMemberAPIRefusesBadBodies(t *testing.T) {
	f := newFixture(t, "")
	tests := []struct {
		name   string
		body   string
		ctype  string
		status int
		want   string
	}{
		{name: "unknown field", body: `{"kind":"port","port":8080,"reason":"x","approve":true}`, want: `unknown field "approve"`},
		{name: "wrong type", body: `{"kind":"port","port":"8080","reason":"x"}`, want: "cannot unmarshal string"},
		{name: "port too big", body: `{"kind":"port","port":70000,"reason":"x"}`, want: "bad JSON"},
		{name: "negative port", body: `{"kind":"port","port":-1,"reason":"x"}`, want: "bad JSON"},
		{name: "port zero", body: `{"kind":"port","port":0,"reason":"x"}`, want: "needs a port"},
		{name: "missing kind", body: `{"port":8080,"reason":"x"}`, want: `unknown kind ""`},
		{name: "unknown kind", body: `{"kind":"root","reason":"x"}`, want: `unknown kind "root"`},
		{name: "missing reason", body: `{"kind":"port","port":8080}`, want: "reason is missing"},
		{name: "reason of control characters only", body: `{"kind":"port","port":8080,"reason":"\u001b\n\t"}`, want: "reason is missing"},
		{name: "not an object", body: `["port"]`, want: "bad JSON"},
		{name: "two objects", body: `{"kind":"port","port":8080,"reason":"x"}{"kind":"port","port":8081,"reason":"x"}`, want: "data after the JSON value"},
		{name: "a stray bracket after the object", body: `{"kind":"port","port":8080,"reason":"x"}]`, want: "data after the JSON value"},
		{name: "trailing bytes", body: `{"kind":"port","port":8080,"reason":"x"} x`, want: "bad JSON"},
		{name: "oversize", body: `{"kind":"port","port":8080,"reason":"` + strings.Repeat("a", MaxBody) + `"}`, want: "over 4096 bytes"},
		{name: "url on a port request", body: `{"kind":"port","port":8080,"url":"https://a.test/","reason":"x"}`, want: "url belongs to a network request"},
		{name: "network without url", body: `{"kind":"network","reason":"x"}`, want: "needs a url"},
		{name: "network with a port", body: `{"kind":"network","url":"https://a.test/","port":22,"reason":"x"}`, want: "port is the url's"},
		{name: "network to airlock", body: `{"kind":"network","url":"http://airlock.internal/","reason":"x"}`, want: "airlock's own name"},
		{name: "network with credentials", body: `{"kind":"network","url":"https://u:p@a.test/","reason":"x"}`, want: "credentials"},
		{name: "resources with nothing", body: `{"kind":"resources","reason":"x"}`, want: "needs memory_mb, cpus or pids"},
		{name: "resources negative", body: `{"kind":"resources","memory_mb":-5,"reason":"x"}`, want: "must be positive"},
		{name: "text/plain", body: `{"kind":"port","port":8080,"reason":"x"}`, ctype: "text/plain", status: 415, want: "application/json"},
		{name: "form", body: `kind=port`, ctype: "application/x-www-form-urlencoded", status: 415, want: "application/json"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.mu.Lock()
			f.now = f.now.Add(time.Duration(i+1) * time.Minute) // the rate limit is another test's
			f.mu.Unlock()
			h := map[string]string{}
			if tt.ctype != "" {
				h["Content-Type"] = tt.ctype
			}
			w := f.do(context.Background(), agentAddr, "POST", "/v1/requests?wait=0", tt.body, h)
			status := tt.status
			if status == 0 {
				status = 400
			}
			var e apiError
			json.Unmarshal(w.Body.Bytes(), &e)
			if w.Code != status || !strings.Contains(e.Error, tt.want) {
				t.Errorf("= %d %s, want %d saying %q", w.Code, w.Body, status, tt.want)
			}
			if n := len(f.broker.List()); n != 0 {
				t.Errorf("a refused request opened %d approvals", n)
			}
		})
	}
	if w := f.do(context.Background(), agentAddr, "POST", "/v1/requests?wait=yes", `{"kind":"port","port":8080,"reason":"x"}`, nil); w.Code != 400 {
		t.Errorf("wait=yes: %d %s", w.Code, w.Body)
	}
}

// A port request waits for the decision and answers it, with the host
// address; the approval names the member and shows its reason, cleaned.
func TestMemberAPIPortRequestWaits(t *testing.T) {
	f := newFixture(t, "")
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		done <- f.do(context.Background(), agentAddr, "POST", "/v1/requests", `{"kind":"port","port":8080,"reason":"preview\u001b[2J the\napp"}`, nil)
	}()
	var p []policy.Pending
	if !testenv.Poll(5*time.Second, func() bool { p = f.broker.List(); return len(p) == 1 }) {
		t.Fatal("no approval opened")
	}
	if p[0].Kind != policy.AskPort || p[0].Source != "agent" || p[0].Port != 8080 || p[0].Reason != "preview [2J the app" || p[0].MemberID != "c0ffee" {
		t.Errorf("pending = %+v", p[0])
	}
	select {
	case w := <-done:
		t.Fatalf("answered before the decision: %d %s", w.Code, w.Body)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := f.broker.Decide(p[0].ID, policy.Choice{Action: policy.ResolveAllow}); err != nil {
		t.Fatal(err)
	}
	w := <-done
	a := answerOf(t, w)
	if w.Code != 200 || a.ID != p[0].ID || a.Kind != "port" || a.Status != "approved" || !strings.Contains(a.Detail, "127.0.0.1:40123") {
		t.Errorf("answer %d %+v", w.Code, a)
	}
	if g := <-f.grants; g.Port != 8080 || g.Source != "agent" {
		t.Errorf("granted %+v", g)
	}
}

// With wait=0 the API answers at once with an id to poll; a member polls
// its own requests only; a member that goes away while waiting leaves its
// request open.
func TestMemberAPIPoll(t *testing.T) {
	f := newFixture(t, "")
	w := f.post(agentAddr, `{"kind":"network","url":"https://Pypi.org/simple/","reason":"pip install"}`)
	a := answerOf(t, w)
	if w.Code != 202 || a.Status != "pending" || a.ID == "" || a.SecondsLeft != 30 || w.Header().Get("Location") != "/v1/requests/"+a.ID {
		t.Fatalf("POST wait=0: %d %+v %v", w.Code, a, w.Header())
	}
	poll := func(remote string) (int, Answer) {
		w := f.do(context.Background(), remote, "GET", "/v1/requests/"+a.ID, "", nil)
		if w.Code != 200 {
			return w.Code, Answer{}
		}
		return w.Code, answerOf(t, w)
	}
	if code, got := poll(agentAddr); code != 200 || got.Status != "pending" || got.Kind != "network" {
		t.Errorf("own poll: %d %+v", code, got)
	}
	if code, _ := poll(otherAddr); code != 404 {
		t.Errorf("another member's poll: %d, want 404", code)
	}
	if w := f.do(context.Background(), agentAddr, "GET", "/v1/requests/0123456789abcdef", "", nil); w.Code != 404 {
		t.Errorf("unknown id: %d", w.Code)
	}
	r, err := f.broker.Decide(a.ID, policy.Choice{Action: policy.ResolveAllowPattern, Pattern: "pypi.org"})
	if err != nil {
		t.Fatal(err)
	}
	if code, got := poll(agentAddr); code != 200 || got.Status != "approved" || got.Rule != r.Pattern.String() {
		t.Errorf("after approval: %d %+v", code, got)
	}
	if code, _ := poll(otherAddr); code != 404 {
		t.Errorf("another member's poll after the decision: %d, want 404", code)
	}

	// The member gives up waiting: its request stays, and can be polled.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		done <- f.do(ctx, otherAddr, "POST", "/v1/requests", `{"kind":"port","port":3000,"reason":"preview"}`, nil)
	}()
	var p []policy.Pending
	if !testenv.Poll(5*time.Second, func() bool { p = f.broker.List(); return len(p) == 1 }) {
		t.Fatal("no approval opened")
	}
	cancel()
	<-done
	if _, err := f.broker.Decide(p[0].ID, policy.Choice{Action: policy.ResolveDeny}); err != nil {
		t.Fatal(err)
	}
	if w := f.do(context.Background(), otherAddr, "GET", "/v1/requests/"+p[0].ID, "", nil); w.Code != 200 || answerOf(t, w).Status != "denied" {
		t.Errorf("poll after giving up: %d %s", w.Code, w.Body)
	}
}

// Resources requests: outside the bounds, or from a member airlock cannot
// resize, refused without asking; inside, an approval with the values.
func TestMemberAPIResources(t *testing.T) {
	f := newFixture(t, "")
	tests := []struct {
		name, remote, body string
		status             int
		answer             string
	}{
		{name: "not a Docker member", remote: runnerAddr, body: `{"kind":"resources","memory_mb":1024,"reason":"x"}`, status: 403, answer: "only Docker members"},
		{name: "over the host's memory", remote: agentAddr, body: `{"kind":"resources","memory_mb":9000,"reason":"x"}`, status: 403, answer: "memory_mb 9000 is outside 512 to host (512 to 8192 here)"},
		{name: "too few CPUs", remote: agentAddr, body: `{"kind":"resources","cpus":0.1,"reason":"x"}`, status: 403, answer: "cpus 0.1 is outside 0.5 to host"},
		{name: "too many processes", remote: agentAddr, body: `{"kind":"resources","pids":5000,"reason":"x"}`, status: 403, answer: "pids 5000 is outside 10 to 1000"},
		{name: "inside", remote: agentAddr, body: `{"kind":"resources","memory_mb":2048,"cpus":2,"reason":"the build needs it"}`, status: 202},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := f.post(tt.remote, tt.body)
			a := answerOf(t, w)
			if w.Code != tt.status || !strings.Contains(a.Detail, tt.answer) {
				t.Errorf("= %d %+v, want %d saying %q", w.Code, a, tt.status, tt.answer)
			}
			if tt.status == 403 && (a.Status != "refused" || a.ID != "" || len(f.broker.List()) != 0) {
				t.Errorf("refused, yet %+v and approvals %+v", a, f.broker.List())
			}
		})
	}
	p := f.broker.List()
	if len(p) != 1 || p[0].Kind != policy.AskResources || p[0].MemoryMB != 2048 || p[0].CPUs != 2 || p[0].MemberID != "c0ffee" {
		t.Fatalf("approvals = %+v", p)
	}
}

// A flood of 1,000 requests from one member: at most a burst gets through,
// at most MaxOpen wait, every other one is a 429 with Retry-After, the
// refusals are logged once per interval, what is kept stays bounded, and
// another member and a person still get their way.
func TestMemberAPIFlood(t *testing.T) {
	f := newFixture(t, "")
	codes := map[int]int{}
	for i := range 1000 {
		w := f.post(agentAddr, `{"kind":"port","port":`+itoa(1000+i)+`,"reason":"flood"}`)
		codes[w.Code]++
		if w.Code == 429 && w.Header().Get("Retry-After") == "" {
			t.Fatalf("429 without Retry-After: %v", w.Header())
		}
	}
	if codes[202] != 4 || codes[429] != 996 {
		t.Errorf("statuses %v, want 4 accepted (MaxOpen) and 996 refused", codes)
	}
	if n := len(f.broker.List()); n != 4 {
		t.Errorf("%d approvals after the flood, want 4", n)
	}
	if n := f.h.Kept(); n != 4 {
		t.Errorf("%d requests kept, want 4", n)
	}
	if n := strings.Count(f.logs.String(), "member request refused"); n != 1 {
		t.Errorf("%d refusal lines for one interval, want 1:\n%s", n, f.logs)
	}
	// Another member is not held back, and a person decides as ever.
	w := f.post(otherAddr, `{"kind":"port","port":8080,"reason":"preview"}`)
	if w.Code != 202 {
		t.Fatalf("another member after the flood: %d %s", w.Code, w.Body)
	}
	if _, err := f.broker.Decide(answerOf(t, w).ID, policy.Choice{Action: policy.ResolveAllow}); err != nil {
		t.Fatal(err)
	}
	<-f.grants
	// Time passes, tokens come back: the flooder's open requests still
	// bound it until they are decided.
	f.mu.Lock()
	f.now = f.now.Add(time.Minute)
	f.mu.Unlock()
	if w := f.post(agentAddr, `{"kind":"port","port":9999,"reason":"again"}`); w.Code != 429 || !strings.Contains(w.Body.String(), "open requests") {
		t.Errorf("with 4 open: %d %s", w.Code, w.Body)
	}
	for _, p := range f.broker.List() {
		if p.Source == "agent" {
			f.broker.Decide(p.ID, policy.Choice{Action: policy.ResolveDeny})
		}
	}
	if w := f.post(agentAddr, `{"kind":"port","port":9999,"reason":"again"}`); w.Code != 202 {
		t.Errorf("after the decisions: %d %s", w.Code, w.Body)
	}
}

// gate is a Requester that holds each call until n calls are in, or a
// moment has passed: the requests of a burst reach it together.
type gate struct {
	next Requester
	n    int
	mu   sync.Mutex
	in   int
	all  chan struct{}
}

func (g *gate) Request(req policy.AskRequest) (*policy.Ticket, error) {
	g.mu.Lock()
	if g.in++; g.in == g.n {
		close(g.all)
	}
	g.mu.Unlock()
	select {
	case <-g.all:
	case <-time.After(300 * time.Millisecond):
	}
	return g.next.Request(req)
}

// A burst of requests sent at once on as many connections opens no more
// than MaxOpen: the bound is not only checked, but held, while a request
// is being opened.
func TestMemberAPIConcurrentBurstKeepsMaxOpen(t *testing.T) {
	f := newFixture(t, "")
	f.h.cfg.Burst = 8
	g := &gate{next: f.broker, n: 8, all: make(chan struct{})}
	f.h.cfg.Requests = g
	var wg sync.WaitGroup
	codes := make([]int, 8)
	for i := range 8 {
		wg.Go(func() { codes[i] = f.post(agentAddr, `{"kind":"port","port":`+itoa(4000+i)+`,"reason":"burst"}`).Code })
	}
	wg.Wait()
	accepted := 0
	for _, c := range codes {
		if c == 202 {
			accepted++
		} else if c != 429 {
			t.Errorf("status %d, want 202 or 429", c)
		}
	}
	if n := len(f.broker.List()); accepted != 4 || n != 4 {
		t.Errorf("%d accepted, %d approvals open after a burst of 8, want 4 (MaxOpen)", accepted, n)
	}
}

// The rate alone: a burst, then one a second.
func TestMemberAPIRate(t *testing.T) {
	f := newFixture(t, "")
	f.h.cfg.MaxOpen = 100
	accepted := 0
	for i := range 20 {
		if w := f.post(agentAddr, `{"kind":"port","port":`+itoa(2000+i)+`,"reason":"r"}`); w.Code == 202 {
			accepted++
		} else if ra := w.Header().Get("Retry-After"); w.Code != 429 || ra != "1" {
			t.Fatalf("= %d Retry-After %q", w.Code, ra)
		}
	}
	if accepted != 5 {
		t.Errorf("%d accepted at once, want the burst of 5", accepted)
	}
	f.mu.Lock()
	f.now = f.now.Add(2 * time.Second)
	f.mu.Unlock()
	accepted = 0
	for i := range 5 {
		if w := f.post(agentAddr, `{"kind":"port","port":`+itoa(3000+i)+`,"reason":"r"}`); w.Code == 202 {
			accepted++
		}
	}
	if accepted != 2 {
		t.Errorf("%d accepted after 2 s, want 2", accepted)
	}
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// FuzzDecode: no body makes decode panic, and what it accepts has a kind
// and a clean, bounded reason.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"kind":"port","port":8080,"reason":"x"}`,
		`{"kind":"resources","memory_mb":2048,"cpus":1.5,"pids":100,"reason":"x"}`,
		`{"kind":"network","url":"https://a.test/v1","reason":"x"}`,
		`{"kind":"network","url":"http://[::1]:80/","reason":"\u202e"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest("POST", "/v1/requests", strings.NewReader(body))
		req, err := decode(r)
		if err != nil {
			return
		}
		if _, err := policy.ParseAskKind(string(req.Kind)); err != nil {
			t.Errorf("accepted kind %q", req.Kind)
		}
		if req.Reason == "" || len(req.Reason) > policy.MaxReasonLen || req.Reason != policy.CleanReason(req.Reason) {
			t.Errorf("accepted reason %q", req.Reason)
		}
	})
}

var _ http.Handler = (*Handler)(nil)

// A network request the rules decide is answered at once: approved with
// the rule, or refused; nobody is asked.
func TestMemberAPINetworkDecidedByRules(t *testing.T) {
	f := newFixture(t, "sandbox:\n  network_allowlist:\n    user:\n      - pattern: pypi.org\n  network_denylist:\n    - pattern: pastebin.com\n")
	w := f.post(agentAddr, `{"kind":"network","url":"https://pypi.org/simple/","reason":"pip"}`)
	if a := answerOf(t, w); w.Code != 200 || a.Status != "approved" || a.Rule != "pypi.org" || a.ID == "" {
		t.Errorf("allowed: %d %+v", w.Code, a)
	}
	w = f.post(agentAddr, `{"kind":"network","url":"https://pastebin.com/x","reason":"paste"}`)
	if a := answerOf(t, w); w.Code != 403 || a.Status != "refused" || !strings.Contains(a.Detail, "pastebin.com") {
		t.Errorf("denied: %d %+v", w.Code, a)
	}
	if n := len(f.broker.List()); n != 0 {
		t.Errorf("%d approvals opened", n)
	}
}
