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

// lockWait is how long lockFile waits for a lock another process holds.
// The lock file sits in the project, which a sandbox member may write, so
// a member may hold it: an edit then fails after lockWait, saying why,
// instead of waiting for ever with the sandbox's edits behind it.
var lockWait = 5 * time.Second

// pathLocks serialises this process's edits of one path (path → *sync.Mutex),
// so that only other processes' holds count against lockWait.
var pathLocks sync.Map

// lockFile takes an exclusive flock(2) on the file name in d (PATH.lock),
// creating it, and returns the function that releases the lock. The lock
// file is never removed: deleting it while another process waits on it
// would let two editors in at once. A lock another process holds for
// longer than lockWait is an error.
func lockFile(d *editDir, name string) (unlock func(), err error) {
	path := filepath.Join(filepath.Dir(d.path), name)
	mu, _ := pathLocks.LoadOrStore(filepath.Join(d.real, name), new(sync.Mutex))
	m := mu.(*sync.Mutex)
	m.Lock()
	// Never through a link: the lock sits in the project, which a sandbox
	// member may write, and airlockd, as root, would create or open the
	// file the link names. Nor a device or a pipe, which opening may act
	// on: neither is even opened.
	f, err := d.openLock(name)
	if err != nil {
		m.Unlock()
		var pe *fs.PathError
		if errors.As(err, &pe) && (errors.Is(err, ErrSymlink) || errors.Is(err, ErrNotRegular)) {
			return nil, fmt.Errorf("lock policy file: %s is not a regular file (%w); remove it", path, pe.Err)
		}
		return nil, fmt.Errorf("lock policy file: %w", err)
	}
	// flock(2) waits in the kernel, where no deadline reaches it: it waits
	// in a goroutine of its own, which a timed-out edit leaves behind to
	// let go of the lock as soon as it has it.
	got := make(chan error, 1)
	go func() {
		for {
			err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
			if !errors.Is(err, syscall.EINTR) {
				got <- err
				return
			}
		}
	}()
	timer := time.NewTimer(lockWait)
	defer timer.Stop()
	select {
	case err = <-got:
	case <-timer.C:
		go func() {
			<-got
			f.Close()
		}()
		m.Unlock()
		return nil, fmt.Errorf("lock policy file: another process has held %s for over %s; nothing was changed", path, lockWait)
	}
	if err != nil {
		f.Close()
		m.Unlock()
		return nil, fmt.Errorf("lock policy file: flock %s: %w", path, err)
	}
	return func() {
		// Closing the only descriptor releases the lock.
		f.Close()
		m.Unlock()
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
