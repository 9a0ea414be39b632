package audit

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/ring"
)

// benchEntry is a request record as the proxy writes one per intercepted
// request.
func benchEntry() Entry {
	return Entry{
		Time: time.Date(2026, 11, 24, 23, 2, 43, 123456789, time.UTC), Kind: KindRequest, Sandbox: "dev",
		Source: "10.88.0.2", Agent: "claude", Method: "GET", URL: "https://api.allowed.test/v1/models?limit=10",
		Host: "api.allowed.test", Port: 443, Verdict: "allow", Rule: "api.allowed.test/v1/*", Reason: "user allowlist",
		Status: 200, BytesUp: 312, BytesDown: 5120, TTFBMs: 12.345, DurationMs: 13.5, Proto: "HTTP/1.1",
		Headers: map[string][]string{"Accept": {"*/*"}, "User-Agent": {"curl/8.5.0"}}, Upstream: "203.0.113.7:443", ConnID: 42,
	}
}

// BenchmarkJournalAdd measures one record added from one goroutine: its
// encoding and its write(2).
func BenchmarkJournalAdd(b *testing.B) {
	j := benchJournal(b)
	e := benchEntry()
	b.ReportAllocs()
	for b.Loop() {
		j.Add(e)
	}
}

// BenchmarkJournalAddParallel measures records added from many goroutines
// at once, as a busy sandbox's connections add them (writes/op: write(2)
// calls per record). "one write each" is the journal's path before group
// commit, for comparison in the same run: json.Marshal and one write(2)
// per record under the lock.
func BenchmarkJournalAddParallel(b *testing.B) {
	b.Run("group commit", func(b *testing.B) {
		j := benchJournal(b)
		b.SetParallelism(4)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			e := benchEntry()
			for pb.Next() {
				j.Add(e)
			}
		})
		j.mu.Lock()
		b.ReportMetric(float64(j.writes)/float64(b.N), "writes/op")
		j.mu.Unlock()
	})
	b.Run("one write each", func(b *testing.B) {
		f, err := os.OpenFile(filepath.Join(b.TempDir(), currentFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		r := ring.New[Entry](10000)
		var mu sync.Mutex
		var seq uint64
		b.SetParallelism(4)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			e := benchEntry()
			for pb.Next() {
				mu.Lock()
				seq++
				e.Seq = seq
				line, _ := json.Marshal(e)
				f.Write(append(line, '\n'))
				mu.Unlock()
				r.Add(e)
			}
		})
		b.ReportMetric(1, "writes/op")
	})
}

// BenchmarkEncodeEntry compares the journal's encoder with encoding/json.
func BenchmarkEncodeEntry(b *testing.B) {
	e := benchEntry()
	e.Seq = 123456
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			json.Marshal(&e)
		}
	})
	b.Run("appendEntry", func(b *testing.B) {
		buf := make([]byte, 0, 4096)
		b.ReportAllocs()
		for b.Loop() {
			buf = appendEntry(buf[:0], &e)
		}
	})
}

// BenchmarkJournalAddHeld measures records added as the DNS gate adds a
// read's worth: 32 held, then one Commit (writes/op: write(2) calls per
// record), beside 32 Adds.
func BenchmarkJournalAddHeld(b *testing.B) {
	const batch = 32
	for _, held := range []bool{true, false} {
		name := "held, one commit"
		if !held {
			name = "one add each"
		}
		b.Run(name, func(b *testing.B) {
			j := benchJournal(b)
			e := benchEntry()
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				if held {
					j.AddHeld(e)
				} else {
					j.Add(e)
				}
				if n++; n%batch == 0 {
					j.Commit()
				}
			}
			j.Commit()
			b.ReportMetric(float64(j.writes)/float64(n), "writes/op")
		})
	}
}

// benchJournal opens a journal in a temporary directory whose file does
// not rotate during a benchmark; it is closed when b ends.
func benchJournal(b *testing.B) *Journal {
	b.Helper()
	j, err := Open(Config{Dir: b.TempDir(), MaxFileBytes: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { j.Close() })
	return j
}
