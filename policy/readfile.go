package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// ErrNotRegular is wrapped by ReadFile's error for a policy path that is
// not a regular file (a named pipe, a device, a directory, a socket).
var ErrNotRegular = errors.New("not a regular file")

// ErrSymlink is wrapped by the error of an edit of a policy file whose path
// is a symbolic link: airlock reads through one but never writes through
// one, since a sandbox member that can write the project could point it at
// any file of the host.
var ErrSymlink = errors.New("airlock does not write through a symbolic link")

// ReadFile reads the policy file at path as airlockd must: it runs as root
// while a sandbox member may control the file (a container with the
// project mounted). So it never blocks on opening the file, never opens
// anything but a regular file (a device node is not even opened: opening
// one can have effects of its own, such as arming a watchdog), and reads at
// most MaxFileSize+1 bytes, whatever size the file claims.
//
// A symbolic link is followed (to a regular file). info describes the file
// read; it is set whenever the file could be opened, also when err says it
// is too big. A missing file is an error that wraps fs.ErrNotExist; a path
// that is not a regular file one that wraps ErrNotRegular; a file over
// MaxFileSize is a *FileError.
func ReadFile(path string) (data []byte, info fs.FileInfo, err error) {
	f, info, err := openRegular(path, true)
	if err != nil {
		return nil, info, fmt.Errorf("read policy file: %w", err)
	}
	defer f.Close()
	return readCapped(f, info, path)
}

// readCapped reads the policy file f, which info describes, up to
// MaxFileSize: a bigger one is an error naming path.
func readCapped(f io.Reader, info fs.FileInfo, path string) ([]byte, fs.FileInfo, error) {
	if info.Size() > MaxFileSize {
		return nil, info, tooBig(path)
	}
	// The size said is a hint (the file may grow, and some regular files,
	// such as those of /proc, say 0): read up to the cap whatever it says.
	buf := bytes.NewBuffer(make([]byte, 0, info.Size()+bytes.MinRead))
	if _, err := buf.ReadFrom(io.LimitReader(f, MaxFileSize+1)); err != nil {
		return nil, info, fmt.Errorf("read policy file: %w", err)
	}
	if buf.Len() > MaxFileSize {
		return nil, info, tooBig(path)
	}
	return buf.Bytes(), info, nil
}

func notRegular(path string, mode fs.FileMode) error {
	if mode&fs.ModeSymlink != 0 {
		return &fs.PathError{Op: "open", Path: path, Err: ErrSymlink}
	}
	return &fs.PathError{Op: "open", Path: path, Err: fmt.Errorf("%w (%s)", ErrNotRegular, typeName(mode))}
}

func typeName(mode fs.FileMode) string {
	switch t := mode.Type(); {
	case t&fs.ModeDir != 0:
		return "a directory"
	case t&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeDevice != 0:
		return "a device"
	default:
		return "type " + t.String()
	}
}
