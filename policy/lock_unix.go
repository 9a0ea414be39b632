//go:build unix

package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// lockWait is how long lockFile waits for the lock, from its call: for
// this process's other edits of the file and for another process's hold.
// The lock file sits in the project, which a sandbox member may write, so
// a member may hold it: an edit then fails after lockWait, saying why,
// instead of waiting for ever with the sandbox's edits behind it.
var lockWait = 5 * time.Second

// lockPoll is the longest pause between two tries of a lock another
// process holds.
const lockPoll = 20 * time.Millisecond

// pathLocks serialises this process's edits of one lock file (its real
// path → a channel that holds a token while an edit has the lock or tries
// to take it).
var pathLocks sync.Map

// lockFile takes an exclusive flock(2) on the file name in d (PATH.lock),
// creating it, and returns the function that releases the lock. The lock
// file is never removed: deleting it while another process waits on it
// would let two editors in at once. The whole wait, behind this process's
// other edits of the file and then for another process's hold, is bounded
// by lockWait from the call; past it, the edit fails and changes nothing.
//
// The kernel lock is tried without blocking, again and again until the
// deadline, never waited for in flock(2) itself: no deadline reaches a
// blocked flock, so each timed-out edit would leave a thread and a
// descriptor behind for as long as the member holds the lock.
func lockFile(d *editDir, name string) (unlock func(), err error) {
	deadline := time.NewTimer(lockWait)
	defer deadline.Stop()
	path := filepath.Join(filepath.Dir(d.path), name)
	held := func() error {
		return fmt.Errorf("lock policy file: another process has held %s for over %s; nothing was changed", path, lockWait)
	}
	v, _ := pathLocks.LoadOrStore(filepath.Join(d.real, name), make(chan struct{}, 1))
	turn := v.(chan struct{})
	select {
	case turn <- struct{}{}:
	case <-deadline.C:
		return nil, held()
	}
	release := func() { <-turn }
	// Never through a link: the lock sits in the project, which a sandbox
	// member may write, and airlockd, as root, would create or open the
	// file the link names. Nor a device or a pipe, which opening may act
	// on: neither is even opened.
	f, err := d.openLock(name)
	if err != nil {
		release()
		var pe *fs.PathError
		if errors.As(err, &pe) && (errors.Is(err, ErrSymlink) || errors.Is(err, ErrNotRegular)) {
			return nil, fmt.Errorf("lock policy file: %s is not a regular file (%w); remove it", path, pe.Err)
		}
		return nil, fmt.Errorf("lock policy file: %w", err)
	}
	for pause := time.Millisecond; ; pause = min(2*pause, lockPoll) {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			release()
			return nil, fmt.Errorf("lock policy file: flock %s: %w", path, err)
		}
		select {
		case <-time.After(pause):
		case <-deadline.C:
			f.Close()
			release()
			return nil, held()
		}
	}
	return func() {
		// Closing the only descriptor releases the lock.
		f.Close()
		release()
	}, nil
}

// keepOwner gives f the owner and group of the file old describes. Only
// root may give a file away, so other users leave the new file theirs.
func keepOwner(f *os.File, old fs.FileInfo) error {
	st, ok := old.Sys().(*syscall.Stat_t)
	if !ok || os.Geteuid() != 0 {
		return nil
	}
	return f.Chown(int(st.Uid), int(st.Gid))
}
