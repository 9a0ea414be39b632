package dnsgate

import (
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"

	"github.com/airlockhq/airlock/internal/testworld"
)

// TestGateLogsRefusedCountAtClose: queries refused while
// records could not be written have no record each; the only trace is the
// log's count. Once records are written again and the gate closes (the
// sandbox stops) before any other query, the count must still be logged.
func TestGateLogsRefusedCountAtClose(t *testing.T) {
	var failing atomic.Bool
	var logs testworld.SyncBuffer
	w := newWorldWith(t, GuardConfig{}, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.OnEventHeld = func(Event) {}
		c.Commit = func() {}
		c.Recording = func() error {
			if failing.Load() {
				return errors.New("disk full")
			}
			return nil
		}
	}, "allowed.test")
	failing.Store(true)
	for range 3 {
		w.query(t, "udp", "allowed.test.", dns.TypeA)
	}
	failing.Store(false) // the journal is written again (by the proxy, say)
	w.gate.Close()
	const said = "queries were answered SERVFAIL, unrecorded"
	if got := logs.String(); !strings.Contains(got, said) {
		t.Errorf("3 queries refused unrecorded, records written again, gate closed: the log never counts them:\n%s", got)
	}
}
