//go:build unix && !linux

package policy

import (
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// openRegular opens path for reading only if it is a regular file; see
// openRegularAt.
func openRegular(path string, follow bool) (*os.File, fs.FileInfo, error) {
	return openRegularAt(unix.AT_FDCWD, path, follow, os.O_RDONLY, path)
}

// openRegularAt opens name, relative to the directory dirfd, with flag
// (os.O_RDONLY or os.O_RDWR) only if it is a regular file: checked before
// it is opened (so a device is not opened), opened without blocking, and
// checked again through the descriptor. With follow false, a name that is
// a symbolic link is refused. Errors name the file as path.
func openRegularAt(dirfd int, name string, follow bool, flag int, path string) (*os.File, fs.FileInfo, error) {
	statFlags, flags := 0, flag|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC
	if !follow {
		statFlags, flags = unix.AT_SYMLINK_NOFOLLOW, flags|unix.O_NOFOLLOW
	}
	var before unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &before, statFlags); err != nil {
		return nil, nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if mode := statMode(uint32(before.Mode)); !mode.IsRegular() {
		return nil, nil, notRegular(path, mode)
	}
	fd, err := unix.Openat(dirfd, name, flags, 0)
	if err != nil {
		return nil, nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	info, err := f.Stat()
	if err == nil {
		st, ok := info.Sys().(*unix.Stat_t)
		if !info.Mode().IsRegular() || !ok || st.Dev != before.Dev || st.Ino != before.Ino {
			err = fmt.Errorf("open %s: the file changed while it was opened", path)
		}
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, info, nil
}

// statMode returns the type bits of a stat mode as an fs.FileMode.
func statMode(m uint32) fs.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFREG:
		return 0
	case unix.S_IFDIR:
		return fs.ModeDir
	case unix.S_IFLNK:
		return fs.ModeSymlink
	case unix.S_IFIFO:
		return fs.ModeNamedPipe
	case unix.S_IFSOCK:
		return fs.ModeSocket
	case unix.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	default:
		return fs.ModeDevice
	}
}

// openDir opens the directory dir (an absolute path with no symbolic link
// in it, as resolveDir returns) for an edit, refusing to follow a symbolic
// link in any component: a sandbox member that can write the project may
// have replaced one of its directories with a link since dir was resolved.
func openDir(dir string) (*os.File, error) {
	return walkDir(dir, unix.O_RDONLY)
}
