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
// blocking, and checked again through the descriptor.
func openRegular(path string) (*os.File, fs.FileInfo, error) {
	before, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if !before.Mode().IsRegular() {
		return nil, before, notRegular(path, before.Mode())
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
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
