//go:build unix

package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// resolveDir returns the real path of the directory holding the policy
// file at path: absolute, with every symbolic link on it resolved. It is
// called at a trusted moment (OpenSandbox, a person's reload, or the call
// of a package-level edit); each edit then opens that directory with
// openDir, which follows no link, so a directory a member replaces with a
// link afterwards is refused, not followed. Where the directory does not
// exist yet, only its deepest existing ancestor is resolved, and the
// missing rest is kept as written: a link a member makes there later is
// refused too.
func resolveDir(path string) (string, error) {
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return "", fmt.Errorf("resolve the directory of %s: %w", path, err)
	}
	rest := ""
	for {
		real, err := realDir(dir)
		if err == nil {
			return filepath.Join(real, rest), nil
		}
		parent := filepath.Dir(dir)
		if !errors.Is(err, fs.ErrNotExist) || parent == dir {
			return "", fmt.Errorf("resolve the directory of %s: %w", path, err)
		}
		rest = filepath.Join(filepath.Base(dir), rest)
		dir = parent
	}
}

// realDir resolves the absolute path dir as filepath.EvalSymlinks does,
// but follows only symbolic links root owns: whose project a directory is
// cannot be told from its owner (a member of another user can make a
// directory, and a link in it, in a project root owns), so a link of any
// other user is refused, even when it was there before airlockd started.
// A person who keeps a policy file behind a link of theirs names its real
// path in the config.
func realDir(dir string) (string, error) {
	todo := strings.Split(filepath.Clean(dir), "/")
	cur, links := "/", 0
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, name)
		fi, err := os.Lstat(next)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			if !fi.IsDir() {
				return "", &fs.PathError{Op: "resolve", Path: next, Err: unix.ENOTDIR}
			}
			cur = next
			continue
		}
		if links++; links > 40 {
			return "", &fs.PathError{Op: "resolve", Path: dir, Err: unix.ELOOP}
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != 0 {
			return "", fmt.Errorf("%s is a symbolic link root does not own, which airlock does not follow to write a policy file; name the real path in the config", next)
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return cur, nil
}

// walkDir opens the absolute path dir one component at a time, each with
// O_NOFOLLOW: a symbolic link anywhere on it is an error. Directories on
// the way are opened with flag (O_PATH where there is one), the last one
// for reading, so that it can be synced.
func walkDir(dir string, flag int) (*os.File, error) {
	if !filepath.IsAbs(dir) {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: errors.New("not an absolute path")}
	}
	parts := strings.FieldsFunc(filepath.Clean(dir), func(r rune) bool { return r == filepath.Separator })
	fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	for i, name := range parts {
		if err != nil {
			break
		}
		f := flag
		if i == len(parts)-1 {
			f = unix.O_RDONLY
		}
		var next int
		next, err = unix.Openat(fd, name, f|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		fd = next
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// editDir is the directory of a policy file under edit, opened once at
// the start of the edit (openDir): the lock, the read, the temporary file,
// the rename and the sync all go through this one descriptor, never
// through the path again.
type editDir struct {
	dir  *os.File
	real string // the directory's real path
	path string // the policy file as configured, for messages
	name string // the policy file's name in dir
}

// openEditDir opens the directory of the policy file at path; real is its
// real path (resolveDir), or "" to resolve it now.
func openEditDir(path, real string) (*editDir, error) {
	if real == "" {
		var err error
		if real, err = resolveDir(path); err != nil {
			return nil, err
		}
	}
	d, err := openDir(real)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
			err = fmt.Errorf("%s is no longer the directory it was (a symbolic link or other file has replaced a directory on its path), so nothing was changed: %w", real, err)
		}
		return nil, fmt.Errorf("open the directory of %s: %w", path, err)
	}
	return &editDir{dir: d, real: real, path: path, name: filepath.Base(path)}, nil
}

func (d *editDir) close() { d.dir.Close() }

func (d *editDir) fd() int { return int(d.dir.Fd()) }

// read reads the policy file as ReadFile does, but never through a link:
// a policy file that is a symbolic link is an error that wraps ErrSymlink.
func (d *editDir) read() ([]byte, fs.FileInfo, error) {
	f, info, err := openRegularAt(d.fd(), d.name, false, os.O_RDONLY, d.path)
	if err != nil {
		return nil, info, fmt.Errorf("read policy file: %w", err)
	}
	defer f.Close()
	return readCapped(f, info, d.path)
}

// readlink returns what the policy file, a symbolic link, points to.
func (d *editDir) readlink() string {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(d.fd(), d.name, buf)
	if err != nil {
		return "?"
	}
	return string(buf[:n])
}

// openLock opens the lock file name, a regular file, creating it when it
// is missing; anything else there (a link, a pipe, a device) is refused
// without being opened.
func (d *editDir) openLock(name string) (*os.File, error) {
	path := filepath.Join(filepath.Dir(d.path), name)
	for range 10 {
		f, _, err := openRegularAt(d.fd(), name, false, os.O_RDONLY, path)
		if !errors.Is(err, fs.ErrNotExist) {
			return f, err
		}
		fd, err := unix.Openat(d.fd(), name, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		if err == nil {
			return os.NewFile(uintptr(fd), path), nil
		}
		if !errors.Is(err, unix.EEXIST) {
			return nil, &fs.PathError{Op: "create", Path: path, Err: err}
		}
		// Someone created it meanwhile: open what is there.
	}
	return nil, fmt.Errorf("%s keeps appearing and disappearing", path)
}

// createTemp creates a new file with a random name next to the policy
// file, for writing.
func (d *editDir) createTemp() (f *os.File, name string, err error) {
	for range 100 {
		name = "." + d.name + ".tmp-" + strconv.FormatUint(rand.Uint64(), 36)
		fd, err := unix.Openat(d.fd(), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == nil {
			return os.NewFile(uintptr(fd), filepath.Join(d.real, name)), name, nil
		}
		if !errors.Is(err, unix.EEXIST) {
			return nil, "", &fs.PathError{Op: "create", Path: filepath.Join(d.real, name), Err: err}
		}
	}
	return nil, "", fmt.Errorf("create a temporary file in %s: too many tries", d.real)
}

// replace renames the file tmp over the policy file.
func (d *editDir) replace(tmp string) error {
	if err := unix.Renameat(d.fd(), tmp, d.fd(), d.name); err != nil {
		return &os.LinkError{Op: "rename", Old: filepath.Join(d.real, tmp), New: d.path, Err: err}
	}
	return nil
}

// remove removes the file name (a temporary file left by a failed write).
func (d *editDir) remove(name string) { unix.Unlinkat(d.fd(), name, 0) }

// sync makes a rename in the directory durable.
func (d *editDir) sync() error { return d.dir.Sync() }
