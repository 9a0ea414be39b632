package netns

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func newLeaseCache(t testing.TB, dir string) *LeaseCache {
	t.Helper()
	c, err := NewLeaseCache(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// mustLease takes address a for source. A lookup that finds the file
// unlocked holds a shared lock on it for a moment, when tryLease finds
// the address taken: it tries again.
func mustLease(t testing.TB, dir string, a netip.Addr, source string) *Lease {
	t.Helper()
	for range 1000 {
		l, err := tryLease(dir, a, source)
		if err != nil {
			t.Fatalf("lease %s for %s: %v", a, source, err)
		}
		if l != nil {
			return l
		}
	}
	t.Fatalf("lease %s for %s: held", a, source)
	return nil
}

// TestLeaseCacheFollowsLeases: the cache answers what LeaseSource
// answers at every step of an address's life, with no wait after any of
// them, and reads a lease file only when something changed it.
func TestLeaseCacheFollowsLeases(t *testing.T) {
	dir := t.TempDir()
	c := newLeaseCache(t, dir)
	x := netip.MustParseAddr("10.88.0.2")
	step := func(what, want string) {
		t.Helper()
		if got := c.Source(x); got != want {
			t.Fatalf("%s: cache says %q, want %q", what, got, want)
		}
		if got := LeaseSource(dir, x); got != want {
			t.Fatalf("%s: the lease file says %q, want %q", what, got, want)
		}
	}
	step("never leased", "")
	alice := mustLease(t, dir, x, "alice")
	step("leased", "alice")
	reads := c.reads
	for range 100 {
		step("unchanged", "alice")
	}
	if c.reads != reads {
		t.Errorf("100 lookups of an unchanged lease read its file %d times; want none", c.reads-reads)
	}
	// Another address's lease and the turn file do not touch x's answer.
	other := mustLease(t, dir, x.Next(), "other")
	os.WriteFile(filepath.Join(dir, leaseTurnFile), []byte("10.88.0.3\n"), 0o644)
	step("a neighbour leased", "alice")
	other.Release()

	alice.Release()
	step("released", "")
	bob := mustLease(t, dir, x, "bob")
	step("leased again", "bob")
	// A member that dies leaves its file; the kernel closes it.
	bob.f.Close()
	bob.f = nil
	step("holder died", "")
	carol := mustLease(t, dir, x, "carol")
	step("stale file taken over", "carol")

	// The directory removed (a sandbox torn down) and made anew: answers
	// stay right while it is not watched, and once it is again.
	carol.Release()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	step("directory gone", "")
	os.MkdirAll(dir, 0o755)
	dave := mustLease(t, dir, x, "dave")
	step("directory made anew", "dave")
	dave.Release()
	step("released in the new directory", "")
}

// TestLeaseCacheAfterClose: a closed cache still answers, from the files.
func TestLeaseCacheAfterClose(t *testing.T) {
	dir := t.TempDir()
	c := newLeaseCache(t, dir)
	x := netip.MustParseAddr("10.88.0.2")
	l := mustLease(t, dir, x, "alice")
	c.Source(x)
	c.Close()
	c.Close()
	l.Release()
	defer mustLease(t, dir, x, "bob").Release() // held (its file open) until the end
	if got := c.Source(x); got != "bob" {
		t.Errorf("closed cache says %q, want bob", got)
	}
}

// TestLeaseCacheOverflow: when more events come than the kernel queues,
// those that are dropped may be a lease's: every answer is forgotten.
func TestLeaseCacheOverflow(t *testing.T) {
	dir := t.TempDir()
	c := newLeaseCache(t, dir)
	x := netip.MustParseAddr("10.88.0.2")
	alice := mustLease(t, dir, x, "alice")
	if got := c.Source(x); got != "alice" {
		t.Fatalf("cache says %q, want alice", got)
	}
	limit := 16384
	if b, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events"); err == nil {
		limit, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	// Alternate two files: the kernel merges an event into the one
	// queued just before it when they are the same.
	var f [2]*os.File
	for i := range f {
		f[i], _ = os.Create(filepath.Join(dir, fmt.Sprint("noise", i)))
		defer f[i].Close()
	}
	for i := range limit + 10 {
		f[i%2].Write([]byte{1})
	}
	alice.Release()
	defer mustLease(t, dir, x, "bob").Release() // held (its file open) until the end
	if got := c.Source(x); got != "bob" {
		t.Errorf("after a queue overflow the cache says %q, want bob", got)
	}
}

// TestLeaseCacheRace: while readers look x up without pause, x is leased
// to one member after another. A lookup that starts after a lease is
// taken and ends before it is released must name that lease's member;
// run with -race.
func TestLeaseCacheRace(t *testing.T) {
	dir := t.TempDir()
	c := newLeaseCache(t, dir)
	x := netip.MustParseAddr("10.88.0.2")
	var held atomic.Int64 // the member holding x, -1 while none does
	held.Store(-1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var checked, wrong atomic.Int64
	var first sync.Once
	var example string
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				before := held.Load()
				got := c.Source(x)
				if after := held.Load(); before >= 0 && before == after {
					checked.Add(1)
					if want := fmt.Sprint("m", before); got != want {
						wrong.Add(1)
						first.Do(func() { example = fmt.Sprintf("%q while %s held it", got, want) })
					}
				}
			}
		})
	}
	for i := range 300 {
		l := mustLease(t, dir, x, fmt.Sprint("m", i))
		held.Store(int64(i))
		for j := 0; j < 200 && checked.Load() < int64(i+1)*4; j++ {
			c.Source(x) // give the readers a turn
		}
		held.Store(-1)
		if i%2 == 0 {
			l.Release()
		} else {
			l.f.Close() // as if it died
			l.f = nil
		}
	}
	close(stop)
	wg.Wait()
	if wrong.Load() > 0 {
		t.Errorf("%d of %d lookups named the wrong member, such as %s", wrong.Load(), checked.Load(), example)
	}
	if checked.Load() < 300 {
		t.Errorf("only %d lookups fell within a lease; the test checked little", checked.Load())
	}
}

// TestLeaseCacheDeadProcess: a member process killed with SIGKILL leaves
// its lease file behind; the kernel's closing of it is enough for the
// cache, with no wait.
func TestLeaseCacheDeadProcess(t *testing.T) {
	dir := t.TempDir()
	c := newLeaseCache(t, dir)
	cmd := exec.Command(os.Args[0], "-test.run=^TestLeaseHolderProcess$")
	cmd.Env = append(os.Environ(), "AIRLOCK_TEST_LEASE_DIR="+dir)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	addr, perr := netip.ParseAddr(strings.TrimSpace(line))
	if err != nil || perr != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("holder said %q: %v %v", line, err, perr)
	}
	if got := c.Source(addr); got != "child" {
		t.Errorf("cache says %q for the live child's address, want child", got)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if got := c.Source(addr); got != "" {
		t.Errorf("cache says %q for the address of a killed member, want none", got)
	}
}

// TestLeaseHolderProcess is TestLeaseCacheDeadProcess's member: it takes
// a lease, prints its address and waits to be killed.
func TestLeaseHolderProcess(t *testing.T) {
	dir := os.Getenv("AIRLOCK_TEST_LEASE_DIR")
	if dir == "" {
		t.Skip("run by TestLeaseCacheDeadProcess")
	}
	n, _ := NewNetwork("sb", netip.MustParsePrefix("10.88.0.0/29"))
	l, err := AcquireLease(dir, n, "child")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(l.Addr)
	select {}
}

// BenchmarkLeaseSource is the attribution of one connection or DNS query
// to an `airlock run` member: by its lease file, or by the cache.
func BenchmarkLeaseSource(b *testing.B) {
	dir := b.TempDir()
	x := netip.MustParseAddr("10.88.0.2")
	defer mustLease(b, dir, x, "agent").Release()
	b.Run("file", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if LeaseSource(dir, x) != "agent" {
				b.Fatal("wrong member")
			}
		}
	})
	b.Run("cache", func(b *testing.B) {
		c := newLeaseCache(b, dir)
		b.ReportAllocs()
		for b.Loop() {
			if c.Source(x) != "agent" {
				b.Fatal("wrong member")
			}
		}
	})
}
