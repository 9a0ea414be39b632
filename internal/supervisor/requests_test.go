package supervisor

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/memberapi"
	"github.com/airlockhq/airlock/policy"
)

// portFlow wires a sandbox's broker to the daemon's grant and serves the
// member API in front of it, as startProxy does.
func portFlow(t *testing.T, d *Daemon) (*policy.Broker, *memberapi.Handler) {
	t.Helper()
	pol, err := policy.OpenSandbox(policy.SandboxConfig{Name: "sb", Path: filepath.Join(t.TempDir(), "sb.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	s := &sandbox{cfg: config.Sandbox{Name: "sb"}, policy: pol}
	b, err := policy.NewBroker(policy.BrokerConfig{Sandbox: pol, Timeout: time.Minute, Grant: d.grant(s), Host: hostResources()})
	if err != nil {
		t.Fatal(err)
	}
	h, err := memberapi.New(memberapi.Config{Sandbox: "sb", Gateway: netip.MustParseAddr("10.88.0.1"), Requests: b,
		Members: func(netip.Addr) memberapi.Member { return memberapi.Member{Name: "agent"} }})
	if err != nil {
		t.Fatal(err)
	}
	return b, h
}

// askPort is a member's POST for port 8080, waiting for the decision.
func askPort(h *memberapi.Handler) chan memberapi.Answer {
	out := make(chan memberapi.Answer, 1)
	go func() {
		r := httptest.NewRequestWithContext(context.Background(), "POST", "/v1/requests", strings.NewReader(`{"kind":"port","port":8080,"reason":"preview"}`))
		r.Host, r.RemoteAddr = "airlock.internal", "10.88.0.130:40000"
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var a memberapi.Answer
		json.Unmarshal(w.Body.Bytes(), &a)
		out <- a
	}()
	return out
}

func allowFirst(t *testing.T, b *policy.Broker) error {
	t.Helper()
	var ps []policy.Pending
	if !testenv.Poll(5*time.Second, func() bool { ps = b.List(); return len(ps) == 1 }) {
		t.Fatal("no approval")
	}
	_, err := b.Decide(ps[0].ID, policy.Choice{Action: policy.ResolveAllow})
	return err
}

// An approved port request calls the exposer with the sandbox, the
// member's name and its port, and the member learns the host address.
func TestPortRequestExposes(t *testing.T) {
	type call struct {
		sandbox, member string
		port            uint16
	}
	calls := make(chan call, 1)
	d := &Daemon{expose: func(sandbox, member, _ string, port uint16) (string, error) {
		calls <- call{sandbox, member, port}
		return "127.0.0.1:40123", nil
	}}
	b, h := portFlow(t, d)
	answer := askPort(h)
	if err := allowFirst(t, b); err != nil {
		t.Fatal(err)
	}
	if c := <-calls; c != (call{"sb", "agent", 8080}) {
		t.Errorf("exposer called with %+v", c)
	}
	if a := <-answer; a.Status != "approved" || !strings.Contains(a.Detail, "127.0.0.1:40123") {
		t.Errorf("the member's answer: %+v", a)
	}
}

// A port request that cannot be exposed (here: the daemon runs no such
// sandbox) fails, and says why, to the person and to the member.
func TestPortRequestExposeFails(t *testing.T) {
	b, h := portFlow(t, &Daemon{})
	answer := askPort(h)
	if err := allowFirst(t, b); err == nil || !strings.Contains(err.Error(), `no sandbox "sb"`) {
		t.Errorf("Decide = %v", err)
	}
	if a := <-answer; a.Status != "failed" || !strings.Contains(a.Detail, `no sandbox "sb"`) {
		t.Errorf("the member's answer: %+v", a)
	}
}

// A resources request of a member airlockd cannot resize fails closed.
func TestResourcesGrantWithoutDocker(t *testing.T) {
	d := &Daemon{host: policy.HostResources{CPUs: 4, MemoryMB: 8192}}
	pol, err := policy.OpenSandbox(policy.SandboxConfig{Name: "sb", Path: filepath.Join(t.TempDir(), "sb.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	s := &sandbox{cfg: config.Sandbox{Name: "sb"}, policy: pol}
	for _, p := range []policy.Pending{
		{Kind: policy.AskResources, Source: "agent", MemberID: "c0ffee", MemoryMB: 1024},
		{Kind: policy.AskResources, Source: "agent", MemberID: "c0ffee", MemoryMB: 100000},
	} {
		if _, err := d.grant(s)(p); err == nil {
			t.Errorf("grant(%+v) = nil error", p)
		}
	}
}
