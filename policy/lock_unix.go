//go:build unix

package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// lockWait is how long lockFile waits for a lock another process holds.
// The lock file sits in the project, which a sandbox member may write, so
// a member may hold it: an edit then fails after lockWait, saying why,
// instead of waiting for ever with the sandbox's edits behind it.
var lockWait = 5 * time.Second

// lockFile takes an exclusive flock(2) on the file at path, creating it,
// and returns the function that releases the lock. The lock file is never
// removed: deleting it while another process waits on it would let two
// editors in at once. A lock held elsewhere for longer than lockWait is an
// error.
//
// flock locks belong to the open file description, so two goroutines of
// one process that each call lockFile exclude each other just as two
// processes do; no in-process mutex is needed.
func lockFile(path string) (unlock func(), err error) {
	// Never through a link: the lock sits in the project, which a sandbox
	// member may write, and airlockd, as root, would create or open the
	// file the link names. Nor a device or a pipe, which opening may act
	// on.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock policy file: %w", err)
	}
	if info, err := f.Stat(); err != nil || !info.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("lock policy file: %s is not a regular file; remove it", path)
	}
	deadline := time.Now().Add(lockWait)
	for pause := time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if errors.Is(err, syscall.EWOULDBLOCK) && time.Now().Before(deadline) {
			time.Sleep(pause)
			continue
		}
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if errors.Is(err, syscall.EWOULDBLOCK) {
		f.Close()
		return nil, fmt.Errorf("lock policy file: another process has held %s for over %s; nothing was changed", path, lockWait)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock policy file: flock %s: %w", path, err)
	}
	return func() {
		// Closing the only descriptor releases the lock.
		f.Close()
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

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
