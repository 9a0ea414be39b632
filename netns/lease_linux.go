package netns

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/nowait"
)

// A Lease holds one member address of a sandbox for as long as the member
// lives. It is a file named after the address in the sandbox's lease
// directory, locked with flock(2) by the process that holds it: when that
// process dies, however it dies, the lock goes and the address is free
// again. The file also names the member (its source label), which is how
// airlockd attributes the member's traffic.
type Lease struct {
	Addr netip.Addr
	f    *os.File
}

type leaseInfo struct {
	Source string    `json:"source"`
	PID    int       `json:"pid"`
	Taken  time.Time `json:"taken"` // when the lease was taken: with PID, which member holds it
}

// RunRange returns the addresses `airlock run` members take: the lower half
// of the subnet's hosts after the gateway. The upper half is left to Docker.
func (n Network) RunRange() (first, last netip.Addr) {
	size := uint32(1) << (32 - n.Subnet.Bits())
	first = n.Gateway.Next()
	last = addU32(n.Subnet.Addr(), size/2-1)
	return first, last
}

func addU32(a netip.Addr, n uint32) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + n
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// AcquireLease takes a free address of the network's run range and records
// source for it in dir (created 0755 when missing). Addresses are handed
// out in turn, from the one after the address last handed out, not the
// lowest free one: an address a member has just left stays unused as long
// as others are free. The kernel keeps a gone member's connections for a
// while (in TIME-WAIT, or in LAST-ACK toward a namespace that no longer
// answers); a new member on the same address would reuse their ports and
// wait on them, and a late packet of theirs could pass for the new one's.
func AcquireLease(dir string, n Network, source string) (*Lease, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("lease directory: %w", err)
	}
	// The turn is kept in a file of its own, locked while a lease is taken,
	// so that members starting at once take turns too. It only chooses
	// where to start looking: without it (unreadable, or its lock held
	// for long by a stopped process) the search starts at the first
	// address, and each address's own lock still keeps members apart.
	turn := lockTurn(filepath.Join(dir, leaseTurnFile))
	if turn != nil {
		defer turn.Close()
	}
	first, last := n.RunRange()
	start := first
	if turn != nil {
		if b, err := io.ReadAll(turn); err == nil {
			if a, err := netip.ParseAddr(strings.TrimSpace(string(b))); err == nil && a.Compare(first) >= 0 && a.Compare(last) <= 0 {
				start = a
			}
		}
	}
	a := start
	for {
		l, err := tryLease(dir, a, source)
		if err != nil {
			return nil, err
		}
		next := a.Next()
		if next.Compare(last) > 0 {
			next = first
		}
		if l != nil {
			if turn != nil {
				turn.Truncate(0)
				turn.WriteAt([]byte(next.String()+"\n"), 0)
			}
			return l, nil
		}
		if a = next; a == start {
			return nil, fmt.Errorf("sandbox network %s has no free member address (%s to %s are all in use)", n.Subnet, first, last)
		}
	}
}

// leaseTurnFile holds the address the next lease starts looking at.
const leaseTurnFile = "next"

// lockTurn opens and locks the turn file at path, waiting at most two
// seconds for the lock; nil when it cannot.
func lockTurn(path string) *os.File {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil
	}
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil
		}
	}
}

// stillNamed reports whether the open file f is still the file at path: a
// member that leaves removes its lease file before it lets go of the lock,
// so a lock taken on a file opened just before that is a lock on a file
// nobody else will look at again.
func stillNamed(f *os.File, path string) bool {
	var open, named unix.Stat_t
	if unix.Fstat(int(f.Fd()), &open) != nil || unix.Stat(path, &named) != nil {
		return false
	}
	return open.Dev == named.Dev && open.Ino == named.Ino
}

// tryLease takes address a for source, or returns nil when a live member
// holds it.
func tryLease(dir string, a netip.Addr, source string) (*Lease, error) {
	f, err := os.OpenFile(filepath.Join(dir, a.String()), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", a, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil // held by a live member
		}
		return nil, fmt.Errorf("lock lease %s: %w", a, err)
	}
	if !stillNamed(f, f.Name()) {
		f.Close()
		return nil, nil // just released: the next acquisition takes it
	}
	info, _ := json.Marshal(leaseInfo{Source: source, PID: os.Getpid(), Taken: time.Now()})
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt(info, 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("write lease %s: %w", a, err)
	}
	return &Lease{Addr: a, f: f}, nil
}

// Release frees the address. It is idempotent.
func (l *Lease) Release() {
	if l.f == nil {
		return
	}
	os.Remove(l.f.Name())
	l.f.Close()
	l.f = nil
}

// LeaseSource returns the source label of the live member holding addr in
// dir, or "" when no live member holds it.
func LeaseSource(dir string, addr netip.Addr) string {
	h, _ := LeaseHolderOf(dir, addr)
	return h.Source
}

// A LeaseHolder is the live member holding a lease.
type LeaseHolder struct {
	Addr   netip.Addr
	Source string
	PID    int
	Taken  time.Time
}

// Same reports whether h and o are the same member: a later member on the
// address took its lease at another time, and runs as another process.
func (h LeaseHolder) Same(o LeaseHolder) bool {
	return h.Addr == o.Addr && h.Source == o.Source && h.PID == o.PID && h.Taken.Equal(o.Taken)
}

// LeaseHolderOf returns the live member holding addr in dir; false when
// no live member holds it.
func LeaseHolderOf(dir string, addr netip.Addr) (LeaseHolder, bool) {
	f, err := os.Open(filepath.Join(dir, addr.String()))
	if err != nil {
		return LeaseHolder{}, false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err == nil {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		return LeaseHolder{}, false // nobody holds it: a stale file
	}
	var info leaseInfo
	if err := json.NewDecoder(io.LimitReader(f, 4096)).Decode(&info); err != nil || info.Source == "" {
		return LeaseHolder{}, false
	}
	return LeaseHolder{Addr: addr, Source: info.Source, PID: info.PID, Taken: info.Taken}, true
}

// LeaseHolders returns the live members holding leases in dir, by address.
func LeaseHolders(dir string) []LeaseHolder {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []LeaseHolder
	for _, e := range entries {
		a, err := netip.ParseAddr(e.Name())
		if err != nil || !a.Is4() || !e.Type().IsRegular() {
			continue // the turn file, or not ours
		}
		if h, ok := LeaseHolderOf(dir, a); ok {
			out = append(out, h)
		}
	}
	return out
}

// LeaseCache answers LeaseSource for one lease directory from memory, so
// that attributing a connection or a DNS query costs no file to open,
// lock and read. It watches the directory with inotify and forgets an
// address's answer on every event of its lease file: a lease is taken by
// creating or opening its file, locking it and then writing it (tryLease
// writes after the lock, never before), and it ends by removing the file
// or, when its holder dies, by the kernel closing it after writing; each
// of these queues an event. Every lookup first reads the events queued so
// far, under the lock that guards the cache, so an answer is never older
// than the last change whose event was queued before the lookup began.
// A member that takes an address has queued its events before it can
// have the address, let alone send from it: its first connection or
// query is never attributed to the address's previous holder.
//
// A queue that overflowed, or a watch that is lost (the directory removed
// or renamed), forgets every answer; while the directory is not watched,
// each lookup reads the lease file as LeaseSource does. It is safe for
// concurrent use.
type LeaseCache struct {
	dir string

	// mu guards the following fields.
	mu      sync.Mutex
	fd      int // the inotify instance; -1 once closed
	wd      int // the directory's watch; -1 while there is none
	retry   time.Time
	sources map[netip.Addr]string // answers since the watch began
	reads   int                   // lease files read (for tests)
	events  [4096]byte
}

// leaseEvents are the events that may change an address's answer.
const leaseEvents = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// maxCachedLeases bounds the answers kept: a sandbox has at most a few
// hundred member addresses, but lookups may name any address.
const maxCachedLeases = 4096

// NewLeaseCache watches the lease directory dir, creating it (0755) when
// missing, as AcquireLease would. It fails only when no inotify instance
// can be had (fs.inotify.max_user_instances); Close releases it.
func NewLeaseCache(dir string) (*LeaseCache, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("lease directory: %w", err)
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("watch lease directory %s: inotify_init1: %w", dir, err)
	}
	c := &LeaseCache{dir: dir, fd: fd, wd: -1, sources: make(map[netip.Addr]string)}
	c.mu.Lock()
	c.watchLocked()
	c.mu.Unlock()
	return c, nil
}

// Source returns what LeaseSource(dir, addr) returns.
func (c *LeaseCache) Source(addr netip.Addr) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.syncLocked() {
		return LeaseSource(c.dir, addr)
	}
	if src, ok := c.sources[addr]; ok {
		return src
	}
	// Read under the lock: an event queued from here on stays queued
	// until the next lookup, which forgets what is stored now.
	src := LeaseSource(c.dir, addr)
	c.reads++
	if len(c.sources) >= maxCachedLeases {
		clear(c.sources)
	}
	c.sources[addr] = src
	return src
}

// Close stops watching; later lookups read the lease files. It is
// idempotent.
func (c *LeaseCache) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return nil
	}
	err := unix.Close(c.fd)
	c.fd, c.wd = -1, -1
	clear(c.sources)
	return err
}

// syncLocked applies the events queued so far and reports whether the
// cache may answer: the directory is watched.
func (c *LeaseCache) syncLocked() bool {
	if c.fd < 0 {
		return false
	}
	if c.wd < 0 {
		return c.watchLocked()
	}
	for {
		// Made raw (the descriptor is non-blocking): a lookup's read
		// usually finds nothing, and need not wake the runtime's monitor.
		n, err := nowait.Read(c.fd, c.events[:])
		switch {
		case err == unix.EAGAIN:
			return c.wd >= 0
		case err != nil || n <= 0:
			// Not expected of an inotify instance: stop trusting it.
			unix.Close(c.fd)
			c.fd, c.wd = -1, -1
			clear(c.sources)
			return false
		}
		c.applyLocked(c.events[:n])
	}
}

// applyLocked forgets what the events in b may have changed.
func (c *LeaseCache) applyLocked(b []byte) {
	for len(b) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		end := unix.SizeofInotifyEvent + int(ev.Len)
		if end > len(b) {
			end = len(b)
		}
		name := b[unix.SizeofInotifyEvent:end]
		b = b[end:]
		switch {
		case ev.Mask&unix.IN_Q_OVERFLOW != 0:
			// Events were lost: any answer may be stale.
			clear(c.sources)
		case int(ev.Wd) != c.wd:
			// A watch given up before (IN_IGNORED of a removed one).
		case ev.Mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_UNMOUNT) != 0:
			// The directory is gone from its path: watch it again later
			// (a member taking a lease makes it anew).
			if ev.Mask&unix.IN_IGNORED == 0 {
				unix.InotifyRmWatch(c.fd, uint32(c.wd))
			}
			c.wd = -1
			clear(c.sources)
		default:
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if a, err := netip.ParseAddr(string(name)); err == nil {
				delete(c.sources, a)
			}
		}
	}
}

// watchLocked adds the directory's watch, at most once a second while it
// fails, and reports whether it is in place. Answers start anew with it.
func (c *LeaseCache) watchLocked() bool {
	now := time.Now()
	if now.Before(c.retry) {
		return false
	}
	wd, err := unix.InotifyAddWatch(c.fd, c.dir, leaseEvents)
	if err != nil {
		c.retry = now.Add(time.Second)
		return false
	}
	c.wd = wd
	clear(c.sources)
	return true
}
