package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/airlockhq/airlock/internal/audit"
)

func TestObserve(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Observe(audit.Entry{Kind: audit.KindConnection, Sandbox: "sb", Verdict: "allow", BytesUp: 10, BytesDown: 90})
	m.Observe(audit.Entry{Kind: audit.KindConnection, Sandbox: "sb", Verdict: "deny"})
	m.Observe(audit.Entry{Kind: audit.KindRequest, Sandbox: "sb", Verdict: "allow", Status: 502})
	m.Observe(audit.Entry{Kind: audit.KindDNS, Sandbox: "sb", Verdict: "fake-ip"})
	want := `
# HELP airlock_bytes_total Bytes carried by the proxy.
# TYPE airlock_bytes_total counter
airlock_bytes_total{direction="down",sandbox="sb"} 90
airlock_bytes_total{direction="up",sandbox="sb"} 10
# HELP airlock_connections_total TCP connections handled by the proxy.
# TYPE airlock_connections_total counter
airlock_connections_total{sandbox="sb",verdict="allow"} 1
airlock_connections_total{sandbox="sb",verdict="deny"} 1
# HELP airlock_upstream_errors_total Intercepted requests the upstream failed (502).
# TYPE airlock_upstream_errors_total counter
airlock_upstream_errors_total{sandbox="sb"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "airlock_bytes_total", "airlock_connections_total", "airlock_upstream_errors_total"); err != nil {
		t.Error(err)
	}
}

func TestSessions(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewSessions(reg)
	m.Executed("sb", "completed", 1.5, false)
	m.Executed("sb", "timeout", 400, false)
	m.Executed("sb", "failed", 0.1, true)
	want := `
# HELP airlock_session_errors_total Session tasks that could not run (image missing, engine failing).
# TYPE airlock_session_errors_total counter
airlock_session_errors_total{sandbox="sb"} 1
# HELP airlock_session_executions_total Session tasks run, by how they ended.
# TYPE airlock_session_executions_total counter
airlock_session_executions_total{sandbox="sb",status="completed"} 1
airlock_session_executions_total{sandbox="sb",status="failed"} 1
airlock_session_executions_total{sandbox="sb",status="timeout"} 1
# HELP airlock_session_timeouts_total Session tasks killed at their timeout.
# TYPE airlock_session_timeouts_total counter
airlock_session_timeouts_total{sandbox="sb"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "airlock_session_errors_total", "airlock_session_executions_total", "airlock_session_timeouts_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.duration); n != 1 {
		t.Errorf("%d duration series, want 1", n)
	}
}
