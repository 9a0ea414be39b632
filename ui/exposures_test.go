package ui

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeExposer keeps exposures in memory; member "web" is the only one.
type fakeExposer struct {
	mu    sync.Mutex
	calls int // ExposePort calls that reached it
	open  []Exposure
	// listen is ExposeListen's answer; "" means 127.0.0.1.
	listen string
}

func (f *fakeExposer) ExposePort(sb string, req ExposeRequest) (Exposure, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if req.Member != "web" {
		return Exposure{}, &ManagerError{Msg: "no live member " + req.Member, NotFound: true}
	}
	x := Exposure{ID: "x1", Sandbox: sb, Member: req.Member, Addr: "10.88.0.2", Port: uint16(req.Port), HostAddr: "127.0.0.1:40000", URL: "http://127.0.0.1:40000/", Created: time.Unix(0, 0).UTC()}
	f.open = append(f.open, x)
	return x, nil
}

func (f *fakeExposer) Exposures(sb string) []Exposure {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Exposure(nil), f.open...)
}

func (f *fakeExposer) CloseExposure(sb, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, x := range f.open {
		if x.ID == id {
			f.open = append(f.open[:i], f.open[i+1:]...)
			return nil
		}
	}
	return &ManagerError{Msg: "no open exposure " + id, NotFound: true}
}

func (f *fakeExposer) ExposeListen() string {
	if f.listen == "" {
		return "127.0.0.1"
	}
	return f.listen
}

func (f *fakeExposer) Members(sb string) []MemberView {
	return []MemberView{{Name: "web", Addr: "10.88.0.2", Kind: "run"}}
}

func TestExposeRequestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  ExposeRequest
		want string // "" means accepted
	}{
		{"plain", ExposeRequest{Member: "web", Port: 8080}, ""},
		{"with a host port", ExposeRequest{Member: "web", Port: 1, HostPort: 65535}, ""},
		{"by address", ExposeRequest{Member: "10.88.0.2", Port: 65535}, ""},
		{"no member", ExposeRequest{Port: 8080}, "member is required"},
		{"long member", ExposeRequest{Member: strings.Repeat("x", MaxMemberName+1), Port: 8080}, "member name too long"},
		{"port 0", ExposeRequest{Member: "web"}, "port must be 1 to 65535"},
		{"negative port", ExposeRequest{Member: "web", Port: -1}, "port must be 1 to 65535"},
		{"port 65536", ExposeRequest{Member: "web", Port: 65536}, "port must be 1 to 65535"},
		{"host port 65536", ExposeRequest{Member: "web", Port: 80, HostPort: 65536}, "host_port must be"},
		{"negative host port", ExposeRequest{Member: "web", Port: 80, HostPort: -5}, "host_port must be"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.req.Check()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Check() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Check() = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestExposuresThroughTheAPI(t *testing.T) {
	h := newAPI(t, "")
	const base = "/api/v1/sandboxes/myapp/exposures"
	if code, body := h.do(t, "GET", base, ""); code != 503 {
		t.Errorf("without an exposer: %d %s", code, body)
	}
	f := &fakeExposer{}
	h.srv.cfg.Exposures = f
	h.reroute()
	if code, body := h.do(t, "GET", base, ""); code != 200 || body != "[]\n" {
		t.Errorf("no exposures: %d %q", code, body)
	}
	for _, bad := range []struct {
		body string
		code int
	}{
		{`{}`, 400}, {`{"member": "web"}`, 400}, {`{"member": "web", "port": 99999}`, 400}, {`{"member": "web", "port": "80"}`, 400},
		{`{"member": "web", "port": 80, "listen": "0.0.0.0"}`, 400}, {`not json`, 400}, {`{"member": "web", "port": 80}{}`, 400},
		{`{"member": "db", "port": 80}`, 404},
	} {
		if code, body := h.do(t, "POST", base, bad.body); code != bad.code || !json.Valid([]byte(body)) {
			t.Errorf("POST %s: %d %s, want %d", bad.body, code, body, bad.code)
		}
	}
	if f.calls != 1 {
		t.Errorf("%d bad requests reached the exposer, want only the one naming an unknown member", f.calls)
	}
	code, body := h.do(t, "POST", base, `{"member": "web", "port": 8080}`)
	var x Exposure
	if code != 201 || json.Unmarshal([]byte(body), &x) != nil || x.Port != 8080 || x.Sandbox != "myapp" {
		t.Fatalf("expose: %d %s", code, body)
	}
	for _, want := range []string{`"id":"x1"`, `"member":"web"`, `"host_addr":"127.0.0.1:40000"`, `"url":"http://127.0.0.1:40000/"`, `"created":`} {
		if !strings.Contains(body, want) {
			t.Errorf("exposure JSON %s lacks %s", body, want)
		}
	}
	if code, body := h.do(t, "GET", base, ""); code != 200 || !strings.Contains(body, `"id":"x1"`) {
		t.Errorf("list: %d %s", code, body)
	}
	if code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/members", ""); code != 200 || !strings.Contains(body, `"name":"web"`) {
		t.Errorf("members: %d %s", code, body)
	}
	if code, body := h.do(t, "DELETE", base+"/x1", ""); code != 200 || !strings.Contains(body, `"closed":"x1"`) {
		t.Errorf("close: %d %s", code, body)
	}
	if code, body := h.do(t, "DELETE", base+"/x1", ""); code != 404 {
		t.Errorf("close twice: %d %s", code, body)
	}
	if code, _ := h.do(t, "GET", "/api/v1/sandboxes/nope/exposures", ""); code != 404 {
		t.Errorf("unknown sandbox: %d", code)
	}
}

// FuzzExposeBody: no body makes the API fail, answer anything but JSON,
// or pass a request Check refuses to the exposer.
func FuzzExposeBody(f *testing.F) {
	for _, s := range []string{`{"member":"web","port":8080}`, `{"member":"web","port":8080,"host_port":9000}`, `{}`, `[`, `{"member":"","port":-1}`, `{"port":1e9}`} {
		f.Add(s)
	}
	h := newAPI(f, "")
	fx := &fakeExposer{}
	h.srv.cfg.Exposures = fx
	h.reroute()
	f.Fuzz(func(t *testing.T, body string) {
		before := fx.calls
		code, resp := h.do(t, "POST", "/api/v1/sandboxes/myapp/exposures", body)
		if code >= 500 || !json.Valid([]byte(resp)) {
			t.Fatalf("%d %q for %q", code, resp, body)
		}
		var req ExposeRequest
		if fx.calls != before && (json.Unmarshal([]byte(body), &req) != nil || req.Check() != nil) {
			t.Fatalf("a request Check refuses reached the exposer: %q", body)
		}
	})
}
