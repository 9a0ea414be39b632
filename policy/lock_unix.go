//go:build unix

package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// lockFile takes an exclusive flock(2) on the file at path, creating it,
// and returns the function that releases the lock. The lock file is never
// removed: deleting it while another process waits on it would let two
// editors in at once.
//
// flock locks belong to the open file description, so two goroutines of
// one process that each call lockFile exclude each other just as two
// processes do; no in-process mutex is needed.
func lockFile(path string) (unlock func(), err error) {
	// Never through a link: the lock sits in the project, which a sandbox
	// member may write, and airlockd, as root, would create or open the
	// file the link names.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock policy file: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
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
