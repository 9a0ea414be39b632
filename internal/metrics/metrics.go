// Package metrics counts what the audit journal records, for Prometheus:
// DNS queries, connections and requests by verdict, bytes, upstream errors.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockhq/airlock/internal/audit"
)

// Metrics are airlock's counters.
type Metrics struct {
	dns       *prometheus.CounterVec
	conns     *prometheus.CounterVec
	requests  *prometheus.CounterVec
	bytes     *prometheus.CounterVec
	approvals *prometheus.CounterVec
	upstream  *prometheus.CounterVec
	trips     *prometheus.CounterVec
}

// New registers the counters with reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		dns:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_dns_queries_total", Help: "DNS queries answered by the gate."}, []string{"sandbox", "verdict"}),
		conns:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_connections_total", Help: "TCP connections handled by the proxy."}, []string{"sandbox", "verdict"}),
		requests:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_requests_total", Help: "Intercepted HTTP requests."}, []string{"sandbox", "verdict"}),
		bytes:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_bytes_total", Help: "Bytes carried by the proxy."}, []string{"sandbox", "direction"}),
		approvals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_approvals_total", Help: "Approvals opened and decided."}, []string{"sandbox", "action"}),
		upstream:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_upstream_errors_total", Help: "Intercepted requests the upstream failed (502)."}, []string{"sandbox"}),
		trips:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_exfiltration_trips_total", Help: "DNS exfiltration guard trips."}, []string{"sandbox"}),
	}
	reg.MustRegister(m.dns, m.conns, m.requests, m.bytes, m.approvals, m.upstream, m.trips)
	return m
}

// Observe counts one journal entry.
func (m *Metrics) Observe(e audit.Entry) {
	switch e.Kind {
	case audit.KindDNS:
		m.dns.WithLabelValues(e.Sandbox, e.Verdict).Inc()
	case audit.KindConnection:
		m.conns.WithLabelValues(e.Sandbox, e.Verdict).Inc()
		m.bytes.WithLabelValues(e.Sandbox, "up").Add(float64(e.BytesUp))
		m.bytes.WithLabelValues(e.Sandbox, "down").Add(float64(e.BytesDown))
	case audit.KindRequest:
		m.requests.WithLabelValues(e.Sandbox, e.Verdict).Inc()
		if e.Status == 502 {
			m.upstream.WithLabelValues(e.Sandbox).Inc()
		}
	case audit.KindApproval:
		m.approvals.WithLabelValues(e.Sandbox, e.Action).Inc()
	case audit.KindExfil:
		m.trips.WithLabelValues(e.Sandbox).Inc()
	}
}

// Sessions are the counters of sandbox sessions' tasks.
type Sessions struct {
	executions *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	timeouts   *prometheus.CounterVec
	errors     *prometheus.CounterVec
}

// NewSessions registers the session counters with reg. Active sessions
// are a gauge per sandbox that its owner registers
// (airlock_sessions_active).
func NewSessions(reg prometheus.Registerer) *Sessions {
	m := &Sessions{
		executions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_session_executions_total", Help: "Session tasks run, by how they ended."}, []string{"sandbox", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "airlock_session_execution_seconds", Help: "How long session tasks ran.",
			Buckets: []float64{0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}}, []string{"sandbox"}),
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_session_timeouts_total", Help: "Session tasks killed at their timeout."}, []string{"sandbox"}),
		errors:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_session_errors_total", Help: "Session tasks that could not run (image missing, engine failing)."}, []string{"sandbox"}),
	}
	reg.MustRegister(m.executions, m.duration, m.timeouts, m.errors)
	return m
}

// Executed counts one task: its status (completed, failed, timeout), how
// long it ran, and whether it could not run at all.
func (m *Sessions) Executed(sandbox, status string, seconds float64, couldNotRun bool) {
	m.executions.WithLabelValues(sandbox, status).Inc()
	m.duration.WithLabelValues(sandbox).Observe(seconds)
	if status == "timeout" {
		m.timeouts.WithLabelValues(sandbox).Inc()
	}
	if couldNotRun {
		m.errors.WithLabelValues(sandbox).Inc()
	}
}
