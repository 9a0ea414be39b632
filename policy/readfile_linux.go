package policy

import (
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// openRegular opens path for reading only if it is a regular file; see
// openRegularAt.
func openRegular(path string, follow bool) (*os.File, fs.FileInfo, error) {
	return openRegularAt(unix.AT_FDCWD, path, follow, os.O_RDONLY, path)
}

// openRegularAt opens name, relative to the directory dirfd, with flag
// (os.O_RDONLY or os.O_RDWR) only if it is a regular file. The name is
// first opened with O_PATH, which opens nothing (no device driver, no pipe
// peer to wait for), and checked through that descriptor; the file is then
// reopened through /proc/self/fd, so what is opened is the very file
// checked, however the name changes meanwhile. With follow false, a name
// that is a symbolic link opens the link itself, which is refused. Errors
// name the file as path.
func openRegularAt(dirfd int, name string, follow bool, flag int, path string) (*os.File, fs.FileInfo, error) {
	flags := unix.O_PATH | unix.O_CLOEXEC
	if !follow {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := unix.Openat(dirfd, name, flags, 0)
	if err != nil {
		return nil, nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	ref := os.NewFile(uintptr(fd), path)
	defer ref.Close()
	info, err := ref.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, info, notRegular(path, info.Mode())
	}
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), flag|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, info, err
	}
	return f, info, nil
}

// openDir opens the directory dir (an absolute path with no symbolic link
// in it, as resolveDir returns) for an edit, refusing to follow a symbolic
// link in any component: a sandbox member that can write the project may
// have replaced one of its directories with a link since dir was resolved.
func openDir(dir string) (*os.File, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, dir, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS,
	})
	if err == unix.ENOSYS {
		// Before Linux 5.6: walk the path one directory at a time.
		return walkDir(dir, unix.O_PATH)
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return os.NewFile(uintptr(fd), dir), nil
}
