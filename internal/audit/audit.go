// Package audit keeps a sandbox's history: every connection and request
// record, DNS decision, approval and rule change, as one Entry each. The
// latest entries stay in memory for fast listing and are streamed to
// subscribers; all of them are appended as JSON lines to files in the state
// directory, rotated by size, so history survives restarts and can be
// listed further back than memory holds.
package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
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
	// MaxPendingBytes bounds the records kept in memory for the file while
	// it cannot be written (those waiting and those of a write in flight);
	// 0 means 16 MiB. Records past it are dropped
	// from the file (they stay in memory) and counted.
	MaxPendingBytes int
	// RetryEvery is how often, at most, a write is tried again while the
	// file cannot be written (by Add, Commit or Err); 0 means 100 ms.
	RetryEvery time.Duration
	// Logger is told when the file cannot be written and when it can
	// again; nil means slog.Default().
	Logger *slog.Logger
}

// Journal is one sandbox's history. It is safe for concurrent use.
type Journal struct {
	cfg  Config
	ring *ring.Ring[Entry]

	// mu guards the following fields.
	mu   sync.Mutex
	seq  uint64
	f    *os.File // nil while no file is open (a rotation that could not open the next)
	size int64
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
	flying  int        // bytes of the write in flight
	written uint64     // every record up to this seq has been written, or dropped
	tried   uint64     // the last write tried every record up to this seq
	wrote   *sync.Cond // on mu, broadcast when a write returns
	writes  uint64     // write(2) calls made, for benchmarks

	// A write that fails keeps what it could not write at the head of buf
	// for the next one, so records reach the file in order and whole once
	// it can be written again. Until then failed holds why.
	failed      error
	failedSince time.Time
	lastTry     time.Time   // of the last write that failed
	dropped     uint64      // records left out of the file since failed was set: buf was full
	failing     atomic.Bool // failed != nil, read without mu
	closed      bool        // by Close: records stay in memory only
}

const currentFile = "current.jsonl"

var errClosed = errors.New("audit: the journal is closed")

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
	if cfg.MaxPendingBytes == 0 {
		cfg.MaxPendingBytes = 16 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RetryEvery == 0 {
		cfg.RetryEvery = 100 * time.Millisecond
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
	name := filepath.Join(j.cfg.Dir, currentFile)
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if errors.Is(err, fs.ErrNotExist) {
		// The directory is gone (removed by hand): made again.
		if err = os.MkdirAll(j.cfg.Dir, 0o700); err == nil {
			f, err = os.OpenFile(name, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
		}
	}
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit: %w", err)
	}
	size := fi.Size()
	// A line cut short (a write that failed part way, then a crash or a
	// full disk) is ended, so that the next record is a line of its own.
	var last [1]byte
	if _, err := f.ReadAt(last[:], size-1); size > 0 && err == nil && last[0] != '\n' {
		if _, err := f.Write([]byte{'\n'}); err != nil {
			f.Close()
			return fmt.Errorf("audit: %w", err)
		}
		size++
	}
	j.f, j.size = f, size
	return nil
}

// Add numbers an entry, keeps it in memory, hands it to subscribers and
// appends it to the file (in the kernel when Add returns, so it survives
// the process dying). When the file cannot be written the record waits in
// memory for a later write, and Err says why: callers that answer a
// member check it and refuse what they could not record.
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
// when Commit returns, unless Err then reports why not.
func (j *Journal) Commit() {
	j.mu.Lock()
	j.commitLocked(j.seq)
	j.mu.Unlock()
}

// Err returns why records are not reaching the file: the error of the
// last write, until a write succeeds (or errClosed after Close). Records
// added meanwhile wait in memory and go to the file, in order, with the
// first write that succeeds (Add, Commit and Err each try one, at most one
// per RetryEvery); past MaxPendingBytes they are left out of the file,
// leaving a gap in its sequence numbers. Err costs no lock while the file
// is written.
func (j *Journal) Err() error {
	if !j.failing.Load() {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	// A refusal records nothing, so Err tries the write itself: once the
	// file takes it, what was refused goes through again.
	if j.retry() {
		j.writeLocked()
	}
	return j.failed
}

// retry reports whether a write should be tried now: not while one is in
// flight, and while writes fail, at most once per RetryEvery.
func (j *Journal) retry() bool {
	return !j.closed && !j.writing && (j.failed == nil || time.Since(j.lastTry) >= j.cfg.RetryEvery)
}

func (j *Journal) add(e Entry, commit bool) Entry {
	bound(&e)
	j.mu.Lock()
	if j.failed != nil && j.pendingLocked() >= j.cfg.MaxPendingBytes && j.retry() {
		// Room, if the file takes what waits now. (Before e is numbered: a
		// write covers every record numbered when it starts.)
		j.writeLocked()
	}
	j.seq++
	e.Seq = j.seq
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	switch {
	case j.closed:
	case j.failed != nil && j.pendingLocked() >= j.cfg.MaxPendingBytes:
		j.dropped++
	default:
		j.buf = appendEntry(j.buf, &e)
		j.buf = append(j.buf, '\n')
	}
	if commit {
		j.commitLocked(e.Seq)
	}
	j.mu.Unlock()
	j.ring.Add(e)
	return e
}

// pendingLocked is how many bytes of records are held for the file: those
// waiting and those of a write in flight (while the file fails, a write
// that is tried again carries everything that waited).
func (j *Journal) pendingLocked() int { return len(j.buf) + j.flying }

// commitLocked returns once every entry up to seq is written (or left
// out), or a write that tried them failed: it waits for a write in flight
// that covers them, or tries one itself.
func (j *Journal) commitLocked(seq uint64) {
	for !j.closed && j.written < seq {
		if j.writing {
			j.wrote.Wait()
			if j.failed != nil && j.tried >= seq {
				return // tried, and failed: Err says why
			}
			continue
		}
		if !j.retry() {
			return // failed a moment ago: Err says why
		}
		if j.writeLocked(); j.failed != nil {
			return
		}
	}
}

// maxSpare is the largest buffer kept for reuse after a write.
const maxSpare = 256 << 10

// writeLocked writes what buf holds, every record up to j.seq, with mu
// released during the write, and rotates the file past MaxFileBytes.
// Whatever a failed write left unwritten stays at the head of buf.
func (j *Journal) writeLocked() {
	b, last := j.buf, j.seq
	j.buf, j.spare = j.spare[:0], nil
	var n int
	var err error
	if j.f == nil {
		err = j.openCurrent()
	}
	if f := j.f; f != nil && len(b) > 0 {
		j.writing, j.flying = true, len(b)
		j.mu.Unlock()
		n, err = f.Write(b)
		j.mu.Lock()
		j.writing, j.flying = false, 0
		j.writes++
		j.size += int64(n)
	}
	j.tried = last
	if err != nil {
		// What came meanwhile goes after what is left: the file gets every
		// record in order. A record cut short is written again whole, on a
		// line of its own (openCurrent ends the cut one).
		if n > 0 && b[n-1] != '\n' {
			if n < len(b) && b[n] == '\n' {
				// All of it but its newline: the record is whole in the
				// file, and openCurrent ends its line.
				n++
			} else {
				n = bytes.LastIndexByte(b[:n], '\n') + 1
			}
		}
		rest := b[:copy(b, b[n:])]
		j.spare = j.buf[:0]
		j.buf = append(rest, j.buf...)
		// Opened again by the next write: a file deleted or replaced
		// meanwhile is followed.
		if j.f != nil {
			j.f.Close()
			j.f = nil
		}
		j.fail(err)
		j.lastTry = time.Now()
		j.wrote.Broadcast()
		return
	}
	if cap(b) <= maxSpare {
		j.spare = b[:0]
	}
	j.written = last
	if j.failed != nil {
		j.recovered()
	}
	if j.size >= j.cfg.MaxFileBytes {
		j.rotateLocked()
	}
	j.wrote.Broadcast()
}

// fail records that the file cannot be written, and says so once.
func (j *Journal) fail(err error) {
	if j.failed == nil {
		j.failedSince = time.Now()
		j.cfg.Logger.Error("audit: records cannot be written to the journal: its sandbox's traffic is refused until they can",
			"dir", j.cfg.Dir, "err", err)
	}
	j.failed = err
	j.failing.Store(true)
}

// recovered records that a write succeeded after failed ones.
func (j *Journal) recovered() {
	attrs := []any{"dir", j.cfg.Dir, "failed_for", time.Since(j.failedSince).Round(time.Millisecond)}
	if j.dropped > 0 {
		attrs = append(attrs, "records_left_out", j.dropped)
	}
	j.cfg.Logger.Warn("audit: the journal is written again", attrs...)
	j.failed, j.dropped = nil, 0
	j.failing.Store(false)
}

// Flush syncs the file to disk. It returns the sync's error, or why
// records are not reaching the file (Err).
func (j *Journal) Flush() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.flushLocked()
}

func (j *Journal) flushLocked() error {
	if j.f != nil {
		if err := j.f.Sync(); err != nil {
			return fmt.Errorf("audit: %w", err)
		}
	}
	return j.failed
}

// rotateLocked renames the current file to one named after its last
// sequence number and drops the oldest beyond MaxFiles. No write is in
// flight. When the next file cannot be opened, the next write tries again.
func (j *Journal) rotateLocked() {
	if err := j.f.Sync(); err != nil {
		j.cfg.Logger.Error("audit: sync before rotation", "dir", j.cfg.Dir, "err", err)
	}
	j.f.Close()
	j.f = nil
	if err := os.Rename(filepath.Join(j.cfg.Dir, currentFile), filepath.Join(j.cfg.Dir, fmt.Sprintf("%020d.jsonl", j.written))); err != nil {
		// The current file goes on growing; the next write past the size
		// tries again.
		j.cfg.Logger.Error("audit: rotation", "dir", j.cfg.Dir, "err", err)
	}
	old := j.rotated()
	for len(old) > j.cfg.MaxFiles {
		os.Remove(filepath.Join(j.cfg.Dir, old[0]))
		old = old[1:]
	}
	if err := j.openCurrent(); err != nil {
		j.fail(err)
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
		more := scanLines(file, func(line []byte) bool {
			var e Entry
			if json.Unmarshal(line, &e) != nil {
				return true
			}
			bound(&e) // a record written before records were bounded
			return f(e)
		})
		file.Close()
		if !more {
			return
		}
	}
}

// maxLine is the longest line scan reads; a longer one (a record written
// before records were bounded, or not by this journal) is skipped.
const maxLine = 4 << 20

// scanLines calls f with each line of r (without its '\n') until f
// returns false, and reports whether f wanted more. A line longer than
// maxLine is skipped whole, not taken for the end of the file.
func scanLines(r io.Reader, f func([]byte) bool) bool {
	br := bufio.NewReaderSize(r, 64<<10)
	var long []byte // the start of a line longer than br's buffer
	skip := false   // the line so far is longer than maxLine
	for {
		piece, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			if skip {
				continue // the rest of a line already too long
			}
			if long = append(long, piece...); len(long) > maxLine {
				skip, long = true, long[:0]
			}
			continue
		}
		ended := len(piece) > 0 && piece[len(piece)-1] == '\n'
		line := bytes.TrimSuffix(piece, []byte{'\n'})
		if len(long) > 0 {
			line = append(long, line...)
		}
		// A last line without '\n' is a record cut short by a crash, or
		// whole: it is read like any.
		if len(line) > 0 && !skip && len(line) <= maxLine && !f(line) {
			return false
		}
		if !ended {
			return true // the end of the file (or an error reading it)
		}
		long, skip = long[:0], false
		if cap(long) > 1<<20 {
			long = nil // not kept for the lines after
		}
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

// Close writes the records still waiting, flushes and closes the file;
// it returns an error when records could not be written. Entries added
// after Close stay in memory only. It is idempotent.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.writing {
		j.wrote.Wait()
	}
	if j.closed {
		return nil
	}
	if j.written < j.seq {
		j.writeLocked()
	}
	j.closed = true
	err := j.flushLocked()
	j.failed = errClosed // Err from now on: nothing more is written
	j.failing.Store(true)
	if err != nil && j.written < j.seq {
		err = fmt.Errorf("audit: %d records not written: %w", j.seq-j.written, err)
	}
	if j.f != nil {
		if cerr := j.f.Close(); err == nil {
			err = cerr
		}
		j.f = nil
	}
	return err
}
