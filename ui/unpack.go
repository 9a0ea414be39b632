package ui

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// UnpackArchive writes the entries of a member's archive (the archive
// route's answer, un-gzipped) to dest, the way `docker cp` does: into dest
// when it is a directory, or as dest when it does not exist yet (the
// archive's top entry takes dest's name). What a member named is never
// trusted: every entry must be a plain relative name under the archive's
// one top entry (no "..", not absolute), and the directories on its way
// there must be directories, not symbolic links; only directories, regular
// files and links are written, without set-id bits; a symbolic link must
// lead, from where it stands, to a place under the top entry, whatever
// other links the archive holds (its ".." segments, if any, come first),
// and a hard link name a regular file there. Any other entry fails the
// whole unpacking at that entry. Writes go through an os.Root at dest (or
// its parent), so nothing lands outside it whatever links are on the disk
// already; a link where a file, directory or link is to be written is
// replaced, not followed.
//
// lim bounds what the member can make it write: the regular files' bytes
// (as their headers say, before any is written: a sparse file counts at
// its full size) and the entries. Past either, unpacking stops with an
// error; what was written before stays.
func UnpackArchive(r io.Reader, dest string, lim UnpackLimits) (entries int, err error) {
	rootDir, rename := dest, ""
	fi, err := os.Stat(dest)
	switch {
	case err == nil && !fi.IsDir():
		return 0, fmt.Errorf("%s exists and is not a directory", dest)
	case errors.Is(err, fs.ErrNotExist):
		rootDir, rename = filepath.Dir(dest), filepath.Base(dest)
	case err != nil:
		return 0, err
	}
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	top := ""
	var written int64 // the regular files' bytes so far
	// place checks an entry's name and returns where it goes under root.
	place := func(raw string) (string, error) {
		name, err := entryName(raw)
		if err != nil {
			return "", err
		}
		first, rest, _ := strings.Cut(name, "/")
		if top == "" {
			top = first
		}
		if first != top {
			return "", fmt.Errorf("archive entry %q is not under %q, the archive's top entry", raw, top)
		}
		if rename != "" {
			name = path.Join(rename, rest)
		}
		// A link on the way would take the entry elsewhere than its name
		// says: a link each of whose targets looks inside the top entry
		// can lead out of it through another (a link to "." and one to
		// "s/..", say), and a file written through it lands there.
		if err := plainParents(root, name); err != nil {
			return "", fmt.Errorf("archive entry %q: %w", raw, err)
		}
		return name, nil
	}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if entries == 0 {
				return 0, errors.New("the archive is empty")
			}
			return entries, nil
		}
		if err != nil {
			return entries, fmt.Errorf("read the archive: %w", err)
		}
		if lim.MaxEntries > 0 && entries >= lim.MaxEntries {
			return entries, fmt.Errorf("the archive holds more than %d entries (the bound on entries)", lim.MaxEntries)
		}
		if h.Typeflag == tar.TypeReg && lim.MaxBytes > 0 {
			if h.Size > lim.MaxBytes-written {
				return entries, fmt.Errorf("archive entry %q is %d bytes, which would take the files past %d bytes (the bound on bytes)", h.Name, h.Size, lim.MaxBytes)
			}
			written += h.Size
		}
		name, err := place(h.Name)
		if err != nil {
			return entries, err
		}
		if err := unpackEntry(root, tr, h, name, place); err != nil {
			return entries, fmt.Errorf("archive entry %q: %w", h.Name, err)
		}
		entries++
	}
}

// UnpackLimits bounds an unpacking; a zero field means no bound.
type UnpackLimits struct {
	MaxBytes   int64 // the regular files' bytes in all
	MaxEntries int
}

// DefaultUnpackLimits are `airlock docker cp`'s bounds unless its flags say
// otherwise: room for a workspace's build output, not for a member that
// means to fill the host's disk.
var DefaultUnpackLimits = UnpackLimits{MaxBytes: 2 << 30, MaxEntries: 100_000}

// entryName checks an entry's name: relative, plain, UTF-8 free of NUL.
func entryName(raw string) (string, error) {
	name := strings.TrimSuffix(raw, "/")
	switch {
	case name == "" || strings.ContainsRune(name, 0):
		return "", fmt.Errorf("archive entry %q has no usable name", raw)
	case path.IsAbs(name) || filepath.IsAbs(name):
		return "", fmt.Errorf("archive entry %q is an absolute path", raw)
	case path.Clean(name) != name || name == ".":
		return "", fmt.Errorf("archive entry %q is not a plain path", raw)
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == ".." {
			return "", fmt.Errorf("archive entry %q has a .. segment", raw)
		}
	}
	return name, nil
}

// unpackEntry writes one entry at name under root; place says where
// another entry's name goes (a hard link's target).
func unpackEntry(root *os.Root, tr *tar.Reader, h *tar.Header, name string, place func(string) (string, error)) error {
	perm := fs.FileMode(h.Mode) & 0o777
	switch h.Typeflag {
	case tar.TypeDir:
		if err := clearLink(root, name); err != nil {
			return err
		}
		if err := root.MkdirAll(name, perm|0o700); err != nil {
			return err
		}
		return root.Chmod(name, perm|0o700)
	case tar.TypeReg:
		if err := clearLink(root, name); err != nil {
			return err
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm|0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = root.Chmod(name, perm)
		}
		if err == nil && !h.ModTime.IsZero() {
			err = root.Chtimes(name, h.ModTime, h.ModTime)
		}
		return err
	case tar.TypeSymlink:
		target := h.Linkname
		if target == "" || strings.ContainsRune(target, 0) || path.IsAbs(target) {
			return fmt.Errorf("symbolic link to %q: only relative links are unpacked", target)
		}
		// The kernel follows each link on a target's way before it takes
		// the ".." after it, so only ".." segments that come first move
		// up as they read: from the link's own directory, whose way is
		// plain (plainParents), to a place under the top entry; what
		// follows goes down from there, through links that each lead
		// under the top entry too.
		top, _, _ := strings.Cut(name, "/")
		if to := path.Join(path.Dir(name), target); to != top && !strings.HasPrefix(to, top+"/") {
			return fmt.Errorf("symbolic link to %q leads out of %s", target, top)
		}
		down := false
		for _, seg := range strings.Split(target, "/") {
			switch {
			case seg == ".." && down:
				return fmt.Errorf("symbolic link to %q leads out of %s: a .. after a name may go up from wherever that name leads", target, top)
			case seg != ".." && seg != "." && seg != "":
				down = true
			}
		}
		if err := clearLink(root, name); err != nil {
			return err
		}
		return root.Symlink(target, name)
	case tar.TypeLink:
		old, err := place(h.Linkname)
		if err != nil {
			return fmt.Errorf("hard link: %w", err)
		}
		// A hard link to a symbolic link is a symbolic link elsewhere,
		// whose target reads from its new place.
		if fi, err := root.Lstat(old); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("hard link to %q: only regular files of the archive are linked", h.Linkname)
		}
		if err := clearLink(root, name); err != nil {
			return err
		}
		return root.Link(old, name)
	}
	return fmt.Errorf("entries of type %q (devices, pipes) are not unpacked", h.Typeflag)
}

// plainParents checks that every directory on name's way under root is a
// directory, not a symbolic link, or not there yet.
func plainParents(root *os.Root, name string) error {
	for i := range len(name) {
		if name[i] != '/' {
			continue
		}
		fi, err := root.Lstat(name[:i])
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("%s is a symbolic link: nothing is unpacked through one", name[:i])
		case !fi.IsDir():
			return fmt.Errorf("%s is not a directory", name[:i])
		}
	}
	return nil
}

// clearLink removes a symbolic link at name, so that what is written there
// replaces it rather than going where it points.
func clearLink(root *os.Root, name string) error {
	fi, err := root.Lstat(name)
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		return nil
	}
	return root.Remove(name)
}
