// Package audit keeps a sandbox's history: every connection and request
// record, DNS decision, approval and rule change, as one Entry each. The
// latest entries stay in memory for fast listing and are streamed to
// subscribers; all of them are appended as JSON lines to files in the state
// directory, rotated by size, so history survives restarts and can be
// listed further back than memory holds.
package audit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/ring"
)

// Kinds of entries.
const (
	KindConnection = "connection" // a TCP connection, spliced or refused
	KindRequest    = "request"    // an intercepted HTTP request
	KindDNS        = "dns"        // a DNS query
	KindApproval   = "approval"   // an approval opened or decided
	KindRule       = "rule"       // a rule added, replaced or removed
	KindSettings   = "settings"   // a sandbox setting changed
	KindExfil      = "exfiltration"
	KindMember     = "member"   // a Docker member started, ended or crashed
	KindExposure   = "exposure" // a member's port exposed on the host, or no longer
)

// Entry is one thing that happened in a sandbox. Fields that do not apply
// to its Kind are empty.
type Entry struct {
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"`
	Sandbox string    `json:"sandbox"`
	Source  string    `json:"source,omitempty"`
	Agent   string    `json:"agent,omitempty"` // the agent driving Source, when known

	Method  string `json:"method,omitempty"`
	URL     string `json:"url,omitempty"`
	Host    string `json:"host,omitempty"`
	Port    uint16 `json:"port,omitempty"`
	DNSType string `json:"dns_type,omitempty"`

	Verdict string `json:"verdict,omitempty"`
	Rule    string `json:"rule,omitempty"`
	Reason  string `json:"reason,omitempty"`

	Status     int                 `json:"status,omitempty"`
	BytesUp    int64               `json:"bytes_up,omitempty"`
	BytesDown  int64               `json:"bytes_down,omitempty"`
	TTFBMs     float64             `json:"ttfb_ms,omitempty"`
	DurationMs float64             `json:"duration_ms,omitempty"`
	Proto      string              `json:"proto,omitempty"`
	Headers    map[string][]string `json:"headers,omitempty"`
	LLM        bool                `json:"llm,omitempty"`
	Dest       string              `json:"dest,omitempty"`
	Upstream   string              `json:"upstream,omitempty"`
	Close      string              `json:"close,omitempty"`
	ConnID     uint64              `json:"conn_id,omitempty"`

	ApprovalID string `json:"approval_id,omitempty"`
	Action     string `json:"action,omitempty"` // opened, deny, allow_once, allow_pattern, allow, failed, timeout; added, replaced, removed; changed; exposure opened, closed
	// ApprovalKind is an approval's kind: network, port or resources.
	ApprovalKind string `json:"approval_kind,omitempty"`
	// Request is what a member asked for through the member API ("port
	// 8080", "resources memory_mb 2048"); its reason is in Reason.
	Request    string `json:"request,omitempty"`
	RuleID     string `json:"rule_id,omitempty"`
	List       string `json:"list,omitempty"`
	ExposureID string `json:"exposure_id,omitempty"`
}

// Config configures a Journal.
type Config struct {
	// Dir holds the sandbox's files (STATE_DIR/audit/SANDBOX). Required.
	Dir string
	// Memory is how many recent entries stay in memory; 0 means 10,000.
	Memory int
	// MaxFileBytes rotates the current file past this size; 0 means 64 MiB.
	MaxFileBytes int64
	// MaxFiles is how many rotated files are kept; 0 means 8.
	MaxFiles int
}

// Journal is one sandbox's history. It is safe for concurrent use.
type Journal struct {
	cfg  Config
	ring *ring.Ring[Entry]

	// mu guards the following fields.
	mu   sync.Mutex
	seq  uint64
	f    *os.File
	size int64
	err  error // the last write error, reported once
	// Records are written through, so that a kill -9 loses none, but
	// not one write(2) each: Add encodes its record into buf and waits
	// until a write that covers it has returned. Whichever Add finds no
	// write in flight writes all of buf (without mu held); those that
	// come meanwhile add to the next buf and wait on wrote (group
	// commit). AddHeld leaves its record in buf for the next write, which
	// Commit forces.
	buf     []byte
	spare   []byte     // the buffer last written, reused as the next buf
	writing bool       // a write is in flight
	written uint64     // every record up to this seq has been written, or dropped
	wrote   *sync.Cond // on mu, broadcast when a write returns
	writes  uint64     // write(2) calls made, for benchmarks
}

const currentFile = "current.jsonl"

// Open opens (or creates) the journal in cfg.Dir and continues its
// sequence numbers.
func Open(cfg Config) (*Journal, error) {
	if cfg.Dir == "" {
		return nil, errors.New("audit: no directory")
	}
	if cfg.Memory == 0 {
		cfg.Memory = 10000
	}
	if cfg.MaxFileBytes == 0 {
		cfg.MaxFileBytes = 64 << 20
	}
	if cfg.MaxFiles == 0 {
		cfg.MaxFiles = 8
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	j := &Journal{cfg: cfg, ring: ring.New[Entry](cfg.Memory)}
	j.wrote = sync.NewCond(&j.mu)
	// Load the tail of history into memory and continue its numbering.
	var tail []Entry
	j.scan(func(e Entry) bool {
		tail = append(tail, e)
		if len(tail) > cfg.Memory {
			tail = tail[1:]
		}
		j.seq = max(j.seq, e.Seq)
		return true
	})
	for _, e := range tail {
		j.ring.Add(e)
	}
	j.written = j.seq
	if err := j.openCurrent(); err != nil {
		return nil, err
	}
	return j, nil
}

func (j *Journal) openCurrent() error {
	f, err := os.OpenFile(filepath.Join(j.cfg.Dir, currentFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit: %w", err)
	}
	j.f, j.size = f, fi.Size()
	return nil
}

// Add numbers an entry, keeps it in memory, hands it to subscribers and
// appends it to the file (in the kernel when Add returns, so it survives
// the process dying). A failing disk does not stop the sandbox: the error
// is returned once, by Flush.
func (j *Journal) Add(e Entry) Entry {
	return j.add(e, true)
}

// AddHeld is Add without the write: the entry is numbered, kept in memory
// and handed to subscribers at once, and reaches the file with the next
// write, which Commit forces. A caller answering several requests at once
// (the DNS gate, a read of queries) holds their records and commits them
// in one write before it answers, so that a member never sees an answer
// whose record could still be lost.
func (j *Journal) AddHeld(e Entry) Entry {
	return j.add(e, false)
}

// Commit writes every entry added so far (AddHeld's too): in the kernel
// when Commit returns.
func (j *Journal) Commit() {
	j.mu.Lock()
	j.commitLocked(j.seq)
	j.mu.Unlock()
}

func (j *Journal) add(e Entry, commit bool) Entry {
	j.mu.Lock()
	j.seq++
	e.Seq = j.seq
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if j.f != nil {
		j.buf = appendEntry(j.buf, &e)
		j.buf = append(j.buf, '\n')
		if commit {
			j.commitLocked(e.Seq)
		}
	}
	j.mu.Unlock()
	j.ring.Add(e)
	return e
}

// commitLocked returns once every entry up to seq is written (or the
// file is closed): it waits for a write in flight or writes itself.
func (j *Journal) commitLocked(seq uint64) {
	for j.f != nil && j.written < seq {
		if j.writing {
			j.wrote.Wait()
		} else {
			j.writeLocked()
		}
	}
}

// maxSpare is the largest buffer kept for reuse after a write.
const maxSpare = 256 << 10

// writeLocked writes what buf holds, every record up to j.seq, with mu
// released during the write, and rotates the file past MaxFileBytes. The
// records of a file closed meanwhile (a rotation that could not open the
// next one) are dropped, as records are while it stays closed.
func (j *Journal) writeLocked() {
	b, last, f := j.buf, j.seq, j.f
	j.buf, j.spare = j.spare[:0], nil
	if f != nil && len(b) > 0 {
		j.writing = true
		j.mu.Unlock()
		n, err := f.Write(b)
		j.mu.Lock()
		j.writing = false
		j.writes++
		j.size += int64(n)
		if err != nil && j.err == nil {
			j.err = err
		}
	}
	if cap(b) <= maxSpare {
		j.spare = b[:0]
	}
	j.written = last
	if j.f != nil && j.size >= j.cfg.MaxFileBytes {
		j.rotateLocked()
	}
	j.wrote.Broadcast()
}

// Flush syncs the file to disk and returns the first write error since
// the last Flush.
func (j *Journal) Flush() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.flushLocked()
}

func (j *Journal) flushLocked() error {
	if j.f != nil {
		if err := j.f.Sync(); err != nil && j.err == nil {
			j.err = err
		}
	}
	err := j.err
	j.err = nil
	return err
}

// rotateLocked renames the current file to one named after its last
// sequence number and drops the oldest beyond MaxFiles. No write is in
// flight. A write error not yet reported stays for Flush to report.
func (j *Journal) rotateLocked() {
	j.err = j.flushLocked()
	j.f.Close()
	os.Rename(filepath.Join(j.cfg.Dir, currentFile), filepath.Join(j.cfg.Dir, fmt.Sprintf("%020d.jsonl", j.written)))
	old := j.rotated()
	for len(old) > j.cfg.MaxFiles {
		os.Remove(filepath.Join(j.cfg.Dir, old[0]))
		old = old[1:]
	}
	if err := j.openCurrent(); err != nil {
		j.err, j.f = err, nil
	}
}

// rotated lists the rotated files, oldest first.
func (j *Journal) rotated() []string {
	var out []string
	entries, _ := os.ReadDir(j.cfg.Dir)
	for _, e := range entries {
		if n := e.Name(); n != currentFile && strings.HasSuffix(n, ".jsonl") {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// scan reads every entry on disk, oldest first, until f returns false.
// Lines that do not parse (a crash mid-write) are skipped.
func (j *Journal) scan(f func(Entry) bool) {
	for _, name := range append(j.rotated(), currentFile) {
		file, err := os.Open(filepath.Join(j.cfg.Dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(file)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			var e Entry
			if json.Unmarshal(sc.Bytes(), &e) != nil {
				continue
			}
			if !f(e) {
				file.Close()
				return
			}
		}
		file.Close()
	}
}

// Filter selects entries.
type Filter struct {
	Kinds   []string // empty: all
	Source  string
	Verdict string
	LLM     *bool
	Since   time.Time
	// Limit returns at most the last Limit matches; 0 means 1,000.
	Limit int
}

func (f *Filter) match(e *Entry) bool {
	return (len(f.Kinds) == 0 || slices.Contains(f.Kinds, e.Kind)) &&
		(f.Source == "" || e.Source == f.Source) &&
		(f.Verdict == "" || e.Verdict == f.Verdict) &&
		(f.LLM == nil || e.LLM == *f.LLM) &&
		(f.Since.IsZero() || !e.Time.Before(f.Since))
}

// Query returns the last f.Limit entries matching f, oldest first. Memory
// answers when it holds enough; otherwise the files on disk are read for
// what came before it.
func (j *Journal) Query(f Filter) []Entry {
	if f.Limit <= 0 {
		f.Limit = 1000
	}
	var out []Entry
	keep := func(e Entry) {
		if f.match(&e) {
			out = append(out, e)
			if len(out) > f.Limit {
				out = out[1:]
			}
		}
	}
	mem := j.ring.List()
	for _, e := range mem {
		keep(e)
	}
	complete := len(mem) > 0 && (mem[0].Seq == 1 || !f.Since.IsZero() && !mem[0].Time.After(f.Since))
	if len(out) >= f.Limit || complete {
		return out
	}
	// Older history, from disk: everything before the first entry in memory.
	fromMem := out
	out = nil
	first := uint64(1<<64 - 1)
	if len(mem) > 0 {
		first = mem[0].Seq
	}
	j.scan(func(e Entry) bool {
		if e.Seq < first {
			keep(e)
		}
		return true
	})
	out = append(out, fromMem...)
	if len(out) > f.Limit {
		out = out[len(out)-f.Limit:]
	}
	return out
}

// Subscribe streams entries added from now on.
func (j *Journal) Subscribe(buf int) *ring.Sub[Entry] { return j.ring.Subscribe(buf) }

// Close writes the records still waiting, flushes and closes the file.
// It is idempotent.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.writing {
		j.wrote.Wait()
	}
	if j.written < j.seq {
		j.writeLocked()
	}
	err := j.flushLocked()
	if j.f != nil {
		if cerr := j.f.Close(); err == nil {
			err = cerr
		}
		j.f = nil
	}
	return err
}
