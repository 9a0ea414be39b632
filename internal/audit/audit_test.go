package audit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
	"golang.org/x/sys/unix"
)

func TestJournalSurvivesReopenAndReadsPastMemory(t *testing.T) {
	dir := t.TempDir()
	j, err := Open(Config{Dir: dir, Memory: 5})
	if err != nil {
		t.Fatal(err)
	}
	base := time.Unix(1000, 0)
	for i := 0; i < 20; i++ {
		j.Add(Entry{Time: base.Add(time.Duration(i) * time.Second), Kind: KindConnection, Sandbox: "sb", Host: "h" + strconv.Itoa(i), Verdict: []string{"allow", "deny"}[i%2]})
	}
	got := j.Query(Filter{Limit: 100})
	if len(got) != 20 || got[0].Seq != 1 || got[19].Seq != 20 || got[0].Host != "h0" {
		t.Fatalf("query past a 5-entry memory: %d entries, first %+v", len(got), got[0])
	}
	// A crash: no Close. Reopening continues numbering and keeps history.
	j.Flush()
	j2, err := Open(Config{Dir: dir, Memory: 5})
	if err != nil {
		t.Fatal(err)
	}
	e := j2.Add(Entry{Kind: KindRule, Sandbox: "sb", Action: "added"})
	if e.Seq != 21 {
		t.Errorf("seq after reopen = %d, want 21", e.Seq)
	}
	if got := j2.Query(Filter{Verdict: "deny", Limit: 3}); len(got) != 3 || got[2].Host != "h19" || got[0].Host != "h15" {
		t.Errorf("last 3 denies = %+v", got)
	}
	if got := j2.Query(Filter{Since: base.Add(17 * time.Second), Kinds: []string{KindConnection}}); len(got) != 3 || got[0].Host != "h17" {
		t.Errorf("since filter = %+v", got)
	}
	j2.Close()
	j2.Close()
}

func TestJournalRotatesAndPrunes(t *testing.T) {
	dir := t.TempDir()
	j, _ := Open(Config{Dir: dir, Memory: 10, MaxFileBytes: 2000, MaxFiles: 2})
	for i := 0; i < 200; i++ {
		j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "padding-padding-padding-" + strconv.Itoa(i)})
	}
	j.Close()
	files, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if len(files) != 3 { // current + 2 rotated
		t.Errorf("files = %v, want current and 2 rotated", files)
	}
	j2, _ := Open(Config{Dir: dir, Memory: 10})
	got := j2.Query(Filter{Limit: 1000})
	if len(got) == 0 || got[len(got)-1].Seq != 200 || len(got) >= 200 {
		t.Errorf("after pruning: %d entries, last seq %d; want the newest, not all", len(got), got[len(got)-1].Seq)
	}
}

func TestJournalSkipsTornLines(t *testing.T) {
	dir := t.TempDir()
	j, _ := Open(Config{Dir: dir})
	j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "a"})
	j.Close()
	f, _ := os.OpenFile(filepath.Join(dir, currentFile), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"seq":2,"kind":"dns","host":"tor`) // crash mid-line
	f.Close()
	j2, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := j2.Query(Filter{}); len(got) != 1 || got[0].Host != "a" {
		t.Errorf("entries = %+v", got)
	}
}

func TestJournalSubscribe(t *testing.T) {
	j, _ := Open(Config{Dir: t.TempDir()})
	s := j.Subscribe(4)
	defer s.Close()
	j.Add(Entry{Kind: KindApproval, Action: "opened"})
	select {
	case e := <-s.C():
		if e.Action != "opened" || e.Seq != 1 {
			t.Errorf("got %+v", e)
		}
	case <-time.After(time.Second):
		t.Fatal("no entry")
	}
}

// TestJournalConcurrentAdds: records added from many goroutines at once,
// through rotations, are each in a file when their Add returns (a kill -9
// then loses none), once, and in the files in sequence order; a rotated
// file is named after its last record.
func TestJournalConcurrentAdds(t *testing.T) {
	dir := t.TempDir()
	j, err := Open(Config{Dir: dir, Memory: 10, MaxFileBytes: 4000, MaxFiles: 1000})
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, each = 6, 60
	onDisk := func(seq uint64) bool {
		// Another goroutine's rotation may rename the current file
		// between the listing and the reading: look again.
		for range 5 {
			names, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
			for _, n := range names {
				b, _ := os.ReadFile(n)
				if strings.Contains(string(b), `{"seq":`+strconv.FormatUint(seq, 10)+`,`) {
					return true
				}
			}
		}
		return false
	}
	var wg sync.WaitGroup
	errs := make(chan string, goroutines*each)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				e := j.Add(Entry{Kind: KindRequest, Sandbox: "sb", Host: fmt.Sprintf("g%d-%d.test", g, i)})
				if !onDisk(e.Seq) {
					errs <- fmt.Sprintf("record %d not in a file when Add returned", e.Seq)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	// Still no Close: what is on disk is what a crash leaves.
	names, _ := filepath.Glob(filepath.Join(dir, "0*.jsonl"))
	sort.Strings(names)
	if len(names) < 2 {
		t.Errorf("rotated files %v, want several", names)
	}
	var seqs []uint64
	for _, n := range append(names, filepath.Join(dir, currentFile)) {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			var e Entry
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				t.Fatalf("%s: %q: %v", n, line, err)
			}
			seqs = append(seqs, e.Seq)
		}
		if n != filepath.Join(dir, currentFile) {
			if want := fmt.Sprintf("%020d.jsonl", seqs[len(seqs)-1]); filepath.Base(n) != want {
				t.Errorf("rotated file %s ends with record %d, want it named %s", filepath.Base(n), seqs[len(seqs)-1], want)
			}
		}
	}
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("records in file order: %v..., want 1 to %d in order", seqs[:i+1], goroutines*each)
		}
	}
	if len(seqs) != goroutines*each {
		t.Errorf("%d records on disk, want %d", len(seqs), goroutines*each)
	}
	if err := j.Close(); err != nil {
		t.Error(err)
	}
}

// TestJournalReportsAWriteErrorOnce: a file that cannot be written does
// not stop Add, and Flush reports the error once, also when the file was
// rotated after the failed write.
// TestJournalKeepsWhatItCouldNotWrite: while the file cannot be written
// Err says why and every record waits in memory; the first write that
// succeeds puts them in the file in order, each once, and Err is nil again.
func TestJournalKeepsWhatItCouldNotWrite(t *testing.T) {
	for _, rotate := range []bool{false, true} {
		t.Run(fmt.Sprint("rotating ", rotate), func(t *testing.T) {
			dir := t.TempDir()
			var log strings.Builder
			j, err := Open(Config{Dir: dir, RetryEvery: time.Nanosecond, Logger: slog.New(slog.NewTextHandler(&syncWriter{w: &log}, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer j.Close()
			j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "before"})
			if err := j.Err(); err != nil {
				t.Fatalf("Err before any failure: %v", err)
			}
			mend := breakFile(t, j, rotate)
			var wg sync.WaitGroup
			for i := range 4 {
				wg.Go(func() { j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "during" + strconv.Itoa(i)}) })
			}
			wg.Wait()
			if j.Err() == nil {
				t.Fatal("Err after failed writes: nil")
			}
			if err := j.Flush(); err == nil {
				t.Error("Flush while failing: nil")
			}
			if got := j.Query(Filter{}); len(got) != 5 {
				t.Errorf("%d entries in memory, want 5", len(got))
			}
			if n := countLines(t, dir); n != 1 {
				t.Errorf("%d records on disk while failing, want 1", n)
			}
			// The next write opens the file again, and succeeds.
			mend()
			j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "after"})
			if err := j.Err(); err != nil {
				t.Fatalf("Err after a write succeeded: %v", err)
			}
			onDisk := readAll(t, dir)
			if len(onDisk) != 6 {
				t.Fatalf("%d records on disk, want 6: %+v", len(onDisk), onDisk)
			}
			for i, e := range onDisk {
				if e.Seq != uint64(i+1) {
					t.Errorf("record %d on disk has seq %d", i, e.Seq)
				}
			}
			if onDisk[0].Host != "before" || onDisk[5].Host != "after" {
				t.Errorf("records out of order: %+v", onDisk)
			}
			if !strings.Contains(log.String(), "cannot be written") || !strings.Contains(log.String(), "written again") {
				t.Errorf("log does not say the journal failed and recovered:\n%s", log.String())
			}
		})
	}
}

// breakFile makes the journal's writes fail until the returned func is
// called: a directory stands where its file was (open fails, as root too).
// Rotating, the write that fails is the one after a rotation.
func breakFile(t *testing.T, j *Journal, rotate bool) (mend func()) {
	t.Helper()
	cur := filepath.Join(j.cfg.Dir, currentFile)
	saved := filepath.Join(j.cfg.Dir, "saved.jsonl")
	j.mu.Lock()
	defer j.mu.Unlock()
	if rotate {
		// The next write rotates; the one after opens a new file.
		j.size = j.cfg.MaxFileBytes
		j.writeLocked()
		if err := os.Rename(cur, saved); err != nil {
			t.Fatal(err)
		}
		return j.blockOpen(t, cur, saved)
	}
	j.f.Close()
	j.f = nil
	if err := os.Rename(cur, saved); err != nil {
		t.Fatal(err)
	}
	return j.blockOpen(t, cur, saved)
}

func (j *Journal) blockOpen(t *testing.T, cur, saved string) (mend func()) {
	if j.f != nil {
		j.f.Close()
		j.f = nil
	}
	if err := os.Mkdir(cur, 0o700); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.Remove(cur); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(saved, cur); err != nil {
			t.Fatal(err)
		}
	}
}

// TestJournalEndsALineCutShort: a file whose last line was cut short (a
// write that failed part way, then a stop) gets its next record on a line
// of its own; after Close, Err says nothing more is written.
func TestJournalEndsALineCutShort(t *testing.T) {
	dir := t.TempDir()
	j, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "one"})
	j.Close()
	if j.Err() == nil {
		t.Error("Err after Close: nil")
	}
	f, _ := os.OpenFile(filepath.Join(dir, currentFile), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"seq":2,"kind":"dns","host":"cut`)
	f.Close()
	j, err = Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "three"})
	j.Close()
	got := readAll(t, dir)
	if len(got) != 2 || got[0].Host != "one" || got[1].Host != "three" {
		t.Errorf("records on disk: %+v", got)
	}
}

// TestJournalLeavesOutPastItsBound: records past MaxPendingBytes while
// failing stay in memory but not in the file, and a gap in the file's
// sequence numbers shows where.
func TestJournalLeavesOutPastItsBound(t *testing.T) {
	dir := t.TempDir()
	j, err := Open(Config{Dir: dir, MaxPendingBytes: 1000, RetryEvery: time.Nanosecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	mend := breakFile(t, j, false)
	for range 100 {
		j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "x.example"})
	}
	if j.Err() == nil {
		t.Fatal("Err: nil")
	}
	j.mu.Lock()
	pending, dropped := len(j.buf), j.dropped
	j.mu.Unlock()
	if pending > 1000+200 || dropped == 0 {
		t.Fatalf("pending %d bytes, %d dropped: want at most about 1000 bytes kept and the rest dropped", pending, dropped)
	}
	mend()
	j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "last.example"})
	if err := j.Err(); err != nil {
		t.Fatal(err)
	}
	onDisk := readAll(t, dir)
	if uint64(len(onDisk)) != 101-dropped {
		t.Errorf("%d records on disk, want %d", len(onDisk), 101-dropped)
	}
	if last := onDisk[len(onDisk)-1]; last.Seq != 101 || last.Host != "last.example" {
		t.Errorf("last record on disk: %+v", last)
	}
	if got := len(j.Query(Filter{})); got != 101 {
		t.Errorf("%d entries in memory, want 101", got)
	}
}

// TestJournalFullDisk: on a real filesystem that fills up, the journal
// reports the failure, keeps the records and writes them once there is
// room again.
func TestJournalFullDisk(t *testing.T) {
	testenv.Privileged(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	j, err := Open(Config{Dir: filepath.Join(dir, "audit"), RetryEvery: time.Nanosecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "before.example"})
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(make([]byte, 128<<10)) // ENOSPC past what is left
	f.Close()
	for i := range 50 {
		j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "during" + strconv.Itoa(i) + ".example", Reason: strings.Repeat("r", 200)})
	}
	if err := j.Err(); err == nil || !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Err on a full disk: %v, want ENOSPC", err)
	}
	os.Remove(filler)
	j.Commit()
	if err := j.Err(); err != nil {
		t.Fatalf("Err after room was made: %v", err)
	}
	onDisk := readAll(t, filepath.Join(dir, "audit"))
	if len(onDisk) != 51 {
		t.Fatalf("%d records on disk, want 51", len(onDisk))
	}
	for i, e := range onDisk {
		if e.Seq != uint64(i+1) {
			t.Fatalf("record %d on disk has seq %d", i, e.Seq)
		}
	}
}

// readAll returns every record in dir's files. A line that does not
// parse is skipped, as the journal's own reading skips it: a line cut short
// by a write that failed part way (its record is written again whole).
func readAll(t *testing.T, dir string) []Entry {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	sort.Strings(names) // rotated files (digits) sort before current.jsonl
	var out []Entry
	for _, name := range names {
		if fi, err := os.Stat(name); err == nil && fi.IsDir() {
			continue // breakFile's
		}
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			var e Entry
			if json.Unmarshal([]byte(line), &e) == nil {
				out = append(out, e)
			}
		}
	}
	return out
}

func countLines(t *testing.T, dir string) int { return len(readAll(t, dir)) }

// syncWriter serialises writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// TestJournalGroupsWritesInFlight: records added while a write is in
// flight go out together in the next write, in sequence order, and none
// of their Adds returns before that write has.
func TestJournalGroupsWritesInFlight(t *testing.T) {
	j, err := Open(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	// A full pipe: the next write waits until the test reads.
	pw.Write(make([]byte, 64<<10))
	j.mu.Lock()
	j.f.Close()
	j.f = pw
	j.mu.Unlock()
	const n = 10
	var returned sync.WaitGroup
	var done atomic.Int32
	returned.Go(func() { j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "first"}); done.Add(1) })
	waitFor(t, func() bool { j.mu.Lock(); defer j.mu.Unlock(); return j.writing })
	for range n - 1 {
		returned.Go(func() { j.Add(Entry{Kind: KindDNS, Sandbox: "sb"}); done.Add(1) })
	}
	waitFor(t, func() bool { j.mu.Lock(); defer j.mu.Unlock(); return j.seq == n })
	time.Sleep(10 * time.Millisecond)
	if got := done.Load(); got != 0 {
		t.Fatalf("%d Adds returned before their write did", got)
	}
	r := bufio.NewReader(pr)
	if _, err := r.Discard(64 << 10); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf(`{"seq":%d,`, i+1); !strings.HasPrefix(line, want) {
			t.Fatalf("record %d: %s, want it to begin %s", i+1, line, want)
		}
	}
	returned.Wait()
	j.mu.Lock()
	writes := j.writes
	j.mu.Unlock()
	if writes != 2 {
		t.Errorf("%d records in %d writes, want 2: the one in flight, then the %d added meanwhile", n, writes, n-1)
	}
	j.Close()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// TestJournalHeldEntriesReachTheFileAtCommit: AddHeld keeps and streams an
// entry at once but leaves it out of the file until Commit (or the next
// Add), and a Commit writes everything held in one write.
func TestJournalHeldEntriesReachTheFileAtCommit(t *testing.T) {
	dir := t.TempDir()
	j, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	sub := j.Subscribe(8)
	defer sub.Close()
	lines := func() int {
		b, _ := os.ReadFile(filepath.Join(dir, currentFile))
		return strings.Count(string(b), "\n")
	}
	for i := range 3 {
		e := j.AddHeld(Entry{Kind: KindDNS, Sandbox: "sb", Host: fmt.Sprintf("q%d.test", i)})
		if got := <-sub.C(); got.Seq != e.Seq {
			t.Errorf("subscriber got seq %d, want %d at once", got.Seq, e.Seq)
		}
	}
	if n := lines(); n != 0 {
		t.Errorf("%d held entries in the file before Commit", n)
	}
	if got := j.Query(Filter{}); len(got) != 3 {
		t.Errorf("memory holds %d entries, want the 3 held", len(got))
	}
	writes := j.writes
	j.Commit()
	if n := lines(); n != 3 {
		t.Errorf("%d entries in the file after Commit, want 3", n)
	}
	if w := j.writes - writes; w != 1 {
		t.Errorf("Commit made %d writes, want 1", w)
	}
	// An Add writes what was held before it too.
	j.AddHeld(Entry{Kind: KindDNS, Sandbox: "sb", Host: "held.test"})
	j.Add(Entry{Kind: KindRequest, Sandbox: "sb", Host: "added.test"})
	if n := lines(); n != 5 {
		t.Errorf("%d entries in the file after an Add, want 5", n)
	}
	j.Commit() // nothing held: no write
	if w := j.writes - writes; w != 2 {
		t.Errorf("%d writes in all, want 2", w)
	}
}

// TestJournalBoundCountsAWriteInFlight: while the file fails, a write
// tried again carries every record that waited; until it returns, those
// bytes still count against MaxPendingBytes, so what is held for the file
// stays within the bound instead of reaching twice it.
func TestJournalBoundCountsAWriteInFlight(t *testing.T) {
	dir := t.TempDir()
	const bound = 256 << 10
	j, err := Open(Config{Dir: dir, MaxPendingBytes: bound, RetryEvery: time.Nanosecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	waiting := func() (int, uint64) {
		j.mu.Lock()
		defer j.mu.Unlock()
		return len(j.buf), j.dropped
	}
	cur := filepath.Join(dir, currentFile)
	breakFile(t, j, false)
	long := strings.Repeat("x", 1000)
	for n, _ := waiting(); n < 200<<10; n, _ = waiting() {
		j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "waits.example", Reason: long})
	}
	if j.Err() == nil {
		t.Fatal("Err: nil while the file cannot be opened")
	}
	// The file becomes a pipe that nobody reads yet: the next write takes
	// everything that waits and blocks after the pipe's 64 KiB.
	if err := os.Remove(cur); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(cur, 0o600); err != nil {
		t.Fatal(err)
	}
	inFlight, _ := waiting() // what the next write carries (with one small record)
	added := make(chan struct{})
	go func() {
		j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "starts-the-write.example"})
		close(added)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		j.mu.Lock()
		writing := j.writing
		j.mu.Unlock()
		if writing {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no write in flight")
		}
	}
	for range 300 {
		j.AddHeld(Entry{Kind: KindDNS, Sandbox: "sb", Host: "meanwhile.example", Reason: long})
	}
	n, dropped := waiting()
	if held := inFlight + n; held > bound+2<<10 || dropped == 0 {
		t.Errorf("with a write in flight: %d bytes held for the file, %d records left out; want at most the bound (%d) held", held, dropped, bound)
	}
	// Read the pipe: the write returns, and Commit writes what was kept.
	r, err := os.Open(cur)
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		read <- b
	}()
	<-added
	if err := j.Err(); err != nil {
		t.Fatalf("Err after the write returned: %v", err)
	}
	j.Commit()
	j.Close()         // its sync fails on a pipe: nothing more to write
	through := <-read // to the end: the journal's end of the pipe is closed
	r.Close()
	var seqs []uint64
	for _, line := range strings.Split(strings.TrimSuffix(string(through), "\n"), "\n") {
		var e Entry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		seqs = append(seqs, e.Seq)
	}
	total := j.seq
	if uint64(len(seqs)) != total-dropped {
		t.Errorf("%d records through the pipe, want %d (%d added, %d left out)", len(seqs), total-dropped, total, dropped)
	}
	if !sort.SliceIsSorted(seqs, func(a, b int) bool { return seqs[a] < seqs[b] }) {
		t.Error("records out of order")
	}
}

// TestJournalWritesOnceARecordCutBeforeItsNewline: a write that fails with
// every byte of a record on disk but its newline (a full disk whose last
// free byte is the record's '}') leaves the record in the file once, its
// line ended when writes succeed again.
//
// The full disk is RLIMIT_FSIZE: write(2) writes up to the limit and
// fails (EFBIG) past it, as on a filesystem with that many bytes free.
func TestJournalWritesOnceARecordCutBeforeItsNewline(t *testing.T) {
	dir := t.TempDir()
	j, err := Open(Config{Dir: dir, RetryEvery: time.Nanosecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "one.example"})
	fi, err := os.Stat(filepath.Join(dir, currentFile))
	if err != nil {
		t.Fatal(err)
	}
	when := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	two := Entry{Seq: 2, Time: when, Kind: KindDNS, Sandbox: "sb", Host: "two.example"}
	line := appendEntry(nil, &two) // without its newline

	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = uint64(fi.Size()) + uint64(len(line)) // room for all of it but the '\n'
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	two.Seq = 0
	j.Add(two)
	failed := j.Err()
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	if failed == nil {
		t.Fatal("Err after a write past the limit: nil")
	}
	j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "three.example"})
	if err := j.Err(); err != nil {
		t.Fatalf("Err once there is room: %v", err)
	}
	seen := map[uint64]int{}
	var seqs []uint64
	for _, e := range readAll(t, dir) {
		seen[e.Seq]++
		seqs = append(seqs, e.Seq)
	}
	for seq, n := range seen {
		if n != 1 {
			t.Errorf("record %d is in the file %d times (seqs on disk %v)", seq, n, seqs)
		}
	}
	if len(seqs) != 3 {
		t.Errorf("seqs on disk %v, want [1 2 3]", seqs)
	}
}

// TestJournalBoundsWhatAMemberSent: a record keeps at most a bounded part
// of what a member sent (here a request with a megabyte of header bytes
// that each take six to write, a long URL and a long reason) and says how
// much was cut; the records after it are read back after a restart.
func TestJournalBoundsWhatAMemberSent(t *testing.T) {
	dir := t.TempDir()
	j, err := Open(Config{Dir: dir, Memory: 10, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "before.example"})
	headers := map[string][]string{"A-Pad": {strings.Repeat("\xff", 1<<20)}, "Accept": {"*/*"}}
	for i := range 100 {
		headers[fmt.Sprintf("X-Many-%03d", i)] = []string{strings.Repeat("v", 500)}
	}
	url := "https://x.example/" + strings.Repeat("a", 100<<10)
	got := j.Add(Entry{Kind: KindRequest, Sandbox: "sb", Host: "x.example", URL: url, Reason: strings.Repeat("r", 10<<10), Headers: headers})
	for range 20 {
		j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "after.example"})
	}
	if len(headers["A-Pad"][0]) != 1<<20 {
		t.Error("the caller's headers were changed")
	}
	if !strings.HasPrefix(got.URL, url[:maxURL]) || !strings.HasSuffix(got.URL, "…[cut: "+strconv.Itoa(len(url))+" bytes]") {
		t.Errorf("URL kept: %d bytes ending %q", len(got.URL), got.URL[len(got.URL)-40:])
	}
	if !strings.HasSuffix(got.Reason, "…[cut: 10240 bytes]") || len(got.Reason) > maxText+40 {
		t.Errorf("reason kept: %d bytes", len(got.Reason))
	}
	size := 0
	for k, vv := range got.Headers {
		for _, v := range vv {
			size += len(k) + len(v)
		}
	}
	first := func(k string) string {
		if v := got.Headers[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	if size > maxHeaders+100 || first("Accept") != "*/*" || !strings.Contains(first(cutHeader), "header values left out") ||
		!strings.HasSuffix(first("A-Pad"), "…[cut: 1048576 bytes]") {
		t.Errorf("headers kept: %d bytes, Accept %q, %s %q", size, got.Headers["Accept"], cutHeader, got.Headers[cutHeader])
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, currentFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 200<<10 {
		t.Errorf("the file holds %d bytes for 22 records", fi.Size())
	}
	j, err = Open(Config{Dir: dir, Memory: 10, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if e := j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "restarted.example"}); e.Seq != 23 {
		t.Errorf("the first record after a restart has seq %d, want 23", e.Seq)
	}
	if got := j.Query(Filter{Limit: 100}); len(got) != 23 {
		t.Errorf("Query lists %d records after a restart, want 23", len(got))
	}
}

// TestJournalReadsPastAnOverLongLine: a line longer than scan reads (a
// record from before records were bounded) is skipped, not taken for the
// end of its file: the records after it are listed and numbered on.
func TestJournalReadsPastAnOverLongLine(t *testing.T) {
	dir := t.TempDir()
	var file []byte
	for seq, host := range []string{"one.example", "", "three.example", "", "five.example"} {
		switch e := (Entry{Seq: uint64(seq + 1), Kind: KindDNS, Sandbox: "sb", Host: host}); {
		case seq == 1:
			e.Reason = strings.Repeat("x", maxLine+1) // a valid record, too long to read
			file = appendEntry(file, &e)
		case seq == 3:
			file = append(file, strings.Repeat("y", 200<<10)...) // long, within maxLine, not JSON
		default:
			file = appendEntry(file, &e)
		}
		file = append(file, '\n')
	}
	j := openHistory(t, dir, file)
	var hosts []string
	for _, e := range j.Query(Filter{}) {
		hosts = append(hosts, e.Host)
	}
	if !slices.Equal(hosts, []string{"one.example", "three.example", "five.example"}) {
		t.Errorf("records read: %q", hosts)
	}
	if e := j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "six.example"}); e.Seq != 6 {
		t.Errorf("the next record has seq %d, want 6", e.Seq)
	}
}

// TestJournalMakesItsDirectoryAgain: a journal whose directory was
// removed while its file could not be written makes it again, and the
// records waiting reach the new file.
func TestJournalMakesItsDirectoryAgain(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "sb")
	j, err := Open(Config{Dir: dir, RetryEvery: time.Nanosecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "one.example"})
	breakFile(t, j, false)
	j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "waits.example"})
	if j.Err() == nil {
		t.Fatal("Err: nil while the file cannot be opened")
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "after.example"})
	if err := j.Err(); err != nil {
		t.Fatalf("Err with the directory gone: %v", err)
	}
	var hosts []string
	for _, e := range readAll(t, dir) {
		hosts = append(hosts, e.Host)
	}
	if !slices.Equal(hosts, []string{"waits.example", "after.example"}) {
		t.Errorf("records in the directory made again: %q", hosts)
	}
}

// openHistory opens a journal in dir whose current file holds file, and
// closes it when the test ends.
func openHistory(t *testing.T, dir string, file []byte) *Journal {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, currentFile), file, 0o600); err != nil {
		t.Fatal(err)
	}
	j, err := Open(Config{Dir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	return j
}
