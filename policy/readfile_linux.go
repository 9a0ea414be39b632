package policy

import (
	"io/fs"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// openRegular opens path for reading only if it is a regular file. The
// path is first opened with O_PATH, which opens nothing (no device driver,
// no pipe peer to wait for), and checked through that descriptor; the file
// is then reopened through /proc/self/fd, so what is read is the very file
// checked, however the path changes meanwhile. With follow false, a path
// that is a symbolic link opens the link itself, which is refused.
func openRegular(path string, follow bool) (*os.File, fs.FileInfo, error) {
	flags := unix.O_PATH | unix.O_CLOEXEC
	if !follow {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := unix.Open(path, flags, 0)
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
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, info, err
	}
	return f, info, nil
}
