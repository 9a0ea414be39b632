//go:build unix && !linux

package policy

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// openRegular opens path for reading only if it is a regular file:
// checked before it is opened (so a device is not opened), opened without
// blocking, and checked again through the descriptor. With follow false,
// a path that is a symbolic link is refused.
func openRegular(path string, follow bool) (*os.File, fs.FileInfo, error) {
	stat, flags := os.Stat, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY
	if !follow {
		stat, flags = os.Lstat, flags|syscall.O_NOFOLLOW
	}
	before, err := stat(path)
	if err != nil {
		return nil, nil, err
	}
	if !before.Mode().IsRegular() {
		return nil, before, notRegular(path, before.Mode())
	}
	f, err := os.OpenFile(path, flags, 0)
	if err != nil {
		return nil, before, err
	}
	info, err := f.Stat()
	if err == nil && (!info.Mode().IsRegular() || !os.SameFile(before, info)) {
		err = fmt.Errorf("open %s: the file changed while it was opened", path)
	}
	if err != nil {
		f.Close()
		return nil, before, err
	}
	return f, info, nil
}
