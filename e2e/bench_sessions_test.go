package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/internal/session"
)

// ownRSSKiB is the resident memory of pid alone, without its children
// (a session member's init is airlockd's child).
func ownRSSKiB(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			k, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return k
		}
	}
	return 0
}

// BenchmarkSessions starts 100 sessions at once (20 with make bench-quick),
// each a client of its own calling execute_task over MCP (streamable HTTP)
// with a task that writes a file and fetches an allowed host. The test
// world's airlockd has no Docker Engine, so each task is an `airlock run`
// member (namespaces, a veth on the bridge, a root of its own). It reports
// the time from each call to its result (the first of all, the median, the
// 99th percentile, and until all were back), and airlockd's own resident
// memory (not its members') per session: at its peak while the tasks run,
// and once they are all done and idle.
func BenchmarkSessions(b *testing.B) {
	n := scale(100, 20)
	w, _, d, token := sessionsWorld(b, fmt.Sprintf("    timeout: 120\n    max_sessions: %d\n", n))
	hc := &http.Client{Transport: bearer{token: token, base: w.HostClient().Transport}}
	clients := make([]*mcp.ClientSession, n)
	for i := range clients {
		clients[i] = mcpConnect(b, &mcp.StreamableClientTransport{Endpoint: "http://127.0.0.1:7433/mcp", HTTPClient: hc, MaxRetries: -1})
	}
	base := ownRSSKiB(d.Pid())
	peak := base
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				peak = max(peak, ownRSSKiB(d.Pid()))
			}
		}
	})

	lat := make([]time.Duration, n)
	errs := make([]string, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i, cs := range clients {
		wg.Go(func() {
			t0 := time.Now()
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "execute_task", Arguments: session.ExecuteRequest{
				Task: "write out.txt done; fetch http://allowed.test/bench", UserID: fmt.Sprintf("user%d", i)}})
			lat[i] = time.Since(t0)
			var out session.ExecuteResult
			switch {
			case err != nil:
				errs[i] = err.Error()
			case res.IsError:
				errs[i] = fmt.Sprint(res.Content)
			default:
				raw, _ := json.Marshal(res.StructuredContent)
				json.Unmarshal(raw, &out)
				if out.Status != session.StatusCompleted || !strings.Contains(out.Output, "status 200") {
					errs[i] = fmt.Sprintf("%s: %.200s", out.Status, out.Output)
				}
			}
		})
	}
	wg.Wait()
	all := time.Since(start)
	close(stop)
	sampler.Wait()
	idle := ownRSSKiB(d.Pid())
	peak = max(peak, idle)
	if failed := slices.DeleteFunc(slices.Clone(errs), func(s string) bool { return s == "" }); len(failed) > 0 {
		b.Fatalf("%d of %d tasks failed; the first: %s", len(failed), n, failed[0])
	}
	var list session.ListResult
	if msg := callTool(b, clients[0], "list_sessions", session.ListRequest{}, &list); msg != "" || len(list.Sessions) != n {
		b.Fatalf("list_sessions: %s, %d sessions, want %d", msg, len(list.Sessions), n)
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(float64(n), "sessions")
	b.ReportMetric(ms(lat[0]), "first-ms")
	b.ReportMetric(ms(lat[n/2]), "p50-ms")
	b.ReportMetric(ms(lat[n*99/100]), "p99-ms")
	b.ReportMetric(all.Seconds(), "all-s")
	b.ReportMetric(float64(peak-base)/float64(n), "KiB/session-peak")
	b.ReportMetric(float64(idle-base)/float64(n), "KiB/session-idle")
	b.ReportMetric(float64(base)/1024, "MiB-before")
}
