package session

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

// checkPath refuses a path that is not plainly inside the workspace:
// empty, absolute, with a ".." segment, a NUL, or too long. Symbolic links
// are the business of os.Root, which resolves every path these pass.
func checkPath(p string) (string, error) {
	switch {
	case p == "":
		return "", errorf(BadInput, "empty path; paths are relative to /workspace")
	case len(p) > maxPath:
		return "", errorf(BadInput, "path %q… is longer than %d bytes", p[:40], maxPath)
	case strings.ContainsRune(p, 0) || !utf8.ValidString(p):
		return "", errorf(BadInput, "path %q holds a NUL byte or is not UTF-8", p)
	case path.IsAbs(p):
		return "", errorf(BadInput, "path %q is absolute; paths are relative to /workspace (write %q)", p, strings.TrimLeft(strings.TrimPrefix(p, "/workspace"), "/"))
	}
	if slices.Contains(strings.Split(p, "/"), "..") {
		return "", errorf(BadInput, "path %q has a .. segment; paths stay inside /workspace", p)
	}
	c := path.Clean(p)
	if c == "." {
		return "", errorf(BadInput, "path %q names the workspace itself; name a file in it", p)
	}
	return c, nil
}

// decoded is an upload checked and decoded.
type decoded struct {
	path string
	data []byte
}

// decodeUploads checks every upload's path, base64 and size, before any is
// written.
func decodeUploads(files []UploadFile) ([]decoded, error) {
	if len(files) > MaxFiles {
		return nil, errorf(BadInput, "%d files; at most %d per task", len(files), MaxFiles)
	}
	out := make([]decoded, 0, len(files))
	total := 0
	seen := map[string]bool{}
	for i, f := range files {
		p, err := checkPath(f.Path)
		if err != nil {
			return nil, fmt.Errorf("files[%d]: %w", i, err)
		}
		if seen[p] {
			return nil, errorf(BadInput, "files[%d]: %q is given twice", i, p)
		}
		seen[p] = true
		if base64.StdEncoding.DecodedLen(len(f.Content)) > MaxUploadFile+2 {
			return nil, errorf(BadInput, "files[%d] %q: over the %d-byte cap of one upload", i, p, MaxUploadFile)
		}
		data, err := base64.StdEncoding.Strict().DecodeString(f.Content)
		if err != nil {
			return nil, errorf(BadInput, "files[%d] %q: content is not valid base64 (standard alphabet, padded): %v", i, p, err)
		}
		if len(data) > MaxUploadFile {
			return nil, errorf(BadInput, "files[%d] %q: %d bytes, over the %d-byte cap of one upload", i, p, len(data), MaxUploadFile)
		}
		if total += len(data); total > MaxUploadTotal {
			return nil, errorf(BadInput, "uploads add up to over %d bytes, the cap of one task", MaxUploadTotal)
		}
		out = append(out, decoded{p, data})
	}
	// A file and another under it ("new" and "new/x") cannot both be
	// written: refused here, before anything is.
	for i := range out {
		for j := range out {
			if strings.HasPrefix(out[j].path, out[i].path+"/") {
				return nil, errorf(BadInput, "files: %q is given as a file and as a directory of %q", out[i].path, out[j].path)
			}
		}
	}
	return out, nil
}

// workspace is a session's directory, opened as an os.Root so that no
// path, however its links point, resolves outside it.
type workspace struct {
	dir      string
	uid, gid int // the member's user, who owns what is written for it
}

func (w workspace) open() (*os.Root, error) {
	r, err := os.OpenRoot(w.dir)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	return r, nil
}

// escapeError says that p resolves outside the workspace, or cannot be
// used as asked.
func escapeError(p string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes") {
		return errorf(BadInput, "path %q resolves outside /workspace (a symbolic link in it points out)", p)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return errorf(BadInput, "path %q does not exist in /workspace", p)
	}
	return errorf(BadInput, "path %q: %v", p, unwrapPath(err))
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// checkUploads resolves each upload's directories and file in the
// workspace without writing: what exists on the way must be a directory
// (the file itself a regular file) inside the workspace.
func (w workspace) checkUploads(files []decoded) error {
	r, err := w.open()
	if err != nil {
		return err
	}
	defer r.Close()
	for _, f := range files {
		parts := strings.Split(f.path, "/")
		for i := range parts {
			sub := strings.Join(parts[:i+1], "/")
			fi, err := r.Stat(sub)
			if errors.Is(err, fs.ErrNotExist) {
				if _, lerr := r.Lstat(sub); lerr == nil {
					return errorf(BadInput, "path %q: %q is a dangling symbolic link", f.path, sub)
				}
				break // created on the way
			}
			if err != nil {
				return escapeError(f.path, err)
			}
			last := i == len(parts)-1
			switch {
			case !last && !fi.IsDir():
				return errorf(BadInput, "path %q: %q is not a directory", f.path, sub)
			case last && !fi.Mode().IsRegular():
				return errorf(BadInput, "path %q exists and is not a regular file", f.path)
			}
		}
	}
	return nil
}

// write puts the uploads in the workspace, owned by the member's user.
// checkUploads has passed and nothing else writes there meanwhile.
func (w workspace) write(files []decoded) error {
	r, err := w.open()
	if err != nil {
		return err
	}
	defer r.Close()
	for _, f := range files {
		parts := strings.Split(f.path, "/")
		for i := range parts[:len(parts)-1] {
			sub := strings.Join(parts[:i+1], "/")
			if err := r.Mkdir(sub, 0o755); err == nil {
				w.chown(r, sub)
			} else if !errors.Is(err, fs.ErrExist) {
				return escapeError(f.path, err)
			}
		}
		fh, err := r.OpenFile(f.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NONBLOCK, 0o644)
		if err != nil {
			return escapeError(f.path, err)
		}
		_, err = fh.Write(f.data)
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", f.path, err)
		}
		w.chown(r, f.path)
	}
	return nil
}

// chown gives what airlockd wrote to the member's user. Without root (unit
// tests) it cannot, and everything stays the caller's.
func (w workspace) chown(r *os.Root, p string) {
	if os.Geteuid() == 0 {
		r.Lchown(p, w.uid, w.gid)
	}
}

// read returns the files at paths, each a regular file inside the
// workspace, within the caps; one bad path refuses them all.
func (w workspace) read(paths []string) ([]FileContent, error) {
	if len(paths) == 0 {
		return nil, errorf(BadInput, "no paths; name the files to fetch, relative to /workspace")
	}
	if len(paths) > MaxFiles {
		return nil, errorf(BadInput, "%d paths; at most %d per call", len(paths), MaxFiles)
	}
	r, err := w.open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	out := make([]FileContent, 0, len(paths))
	total := 0
	for i, raw := range paths {
		p, err := checkPath(raw)
		if err != nil {
			return nil, fmt.Errorf("paths[%d]: %w", i, err)
		}
		// Non-blocking: a FIFO the member made must not hang airlockd.
		fh, err := r.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, escapeError(p, err)
		}
		data, err := readRegular(fh, p)
		fh.Close()
		if err != nil {
			return nil, err
		}
		if total += len(data); total > MaxReadTotal {
			return nil, errorf(BadInput, "the files add up to over %d bytes, the cap of one get_files; ask for fewer at once", MaxReadTotal)
		}
		out = append(out, FileContent{Path: p, Content: base64.StdEncoding.EncodeToString(data), SizeBytes: int64(len(data)), MimeType: mimeType(p, data)})
	}
	return out, nil
}

func readRegular(fh *os.File, p string) ([]byte, error) {
	fi, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", p, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, errorf(BadInput, "path %q is not a regular file (%s)", p, fi.Mode().Type())
	}
	if fi.Size() > MaxReadFile {
		return nil, errorf(BadInput, "path %q is %d bytes, over the %d-byte cap of one file", p, fi.Size(), MaxReadFile)
	}
	data, err := io.ReadAll(io.LimitReader(fh, MaxReadFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if len(data) > MaxReadFile {
		return nil, errorf(BadInput, "path %q is over the %d-byte cap of one file", p, MaxReadFile)
	}
	return data, nil
}

func mimeType(p string, data []byte) string {
	if t := mime.TypeByExtension(path.Ext(p)); t != "" {
		return t
	}
	return http.DetectContentType(data)
}

// fileState is what a snapshot keeps of a file.
type fileState struct {
	mode  fs.FileMode // type bits only
	size  int64
	mtime time.Time
	hash  [32]byte // content, or a link's target; zero for big files
}

// snapshot walks the workspace without following links: path → state of
// regular files and symbolic links. What the member left there is hostile,
// so the walk is bounded: at most maxSnapshot entries of any kind, no
// deeper than maxDepth and no path longer than maxPath (get_files could
// not name it), at most maxHashedTotal bytes hashed (files past it compare
// by size and time), each directory opened once (no path is resolved
// again from the top) and read in batches.
func (w workspace) snapshot() (map[string]fileState, error) {
	r, err := w.open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	sn := snapshotter{out: map[string]fileState{}}
	sn.dir(r, "", 0)
	return sn.out, nil
}

type snapshotter struct {
	out     map[string]fileState
	visited int   // entries seen, of any kind
	hashed  int64 // bytes hashed
}

// dir records the entries of the directory r, which is prefix in the
// workspace, depth directories down.
func (sn *snapshotter) dir(r *os.Root, prefix string, depth int) {
	d, err := r.Open(".")
	if err != nil {
		return // unreadable: skipped
	}
	var subdirs []string
	for sn.visited < maxSnapshot {
		ents, err := d.ReadDir(min(256, maxSnapshot-sn.visited))
		for _, e := range ents {
			sn.visited++
			p := prefix + e.Name()
			switch t := e.Type(); {
			case len(p) > maxPath:
			case t.IsDir():
				if depth < maxDepth {
					subdirs = append(subdirs, e.Name())
				}
			case t&fs.ModeSymlink != 0:
				if target, err := r.Readlink(e.Name()); err == nil {
					sn.out[p] = fileState{mode: fs.ModeSymlink, hash: sha256.Sum256([]byte(target))}
				}
			case t.IsRegular():
				sn.out[p] = sn.file(r, e.Name())
			}
		}
		if err != nil || len(ents) == 0 {
			break
		}
	}
	d.Close()
	for _, name := range subdirs {
		if sn.visited >= maxSnapshot {
			return
		}
		sub, err := r.OpenRoot(name)
		if err != nil {
			continue
		}
		sn.dir(sub, prefix+name+"/", depth+1)
		sub.Close()
	}
}

func (sn *snapshotter) file(r *os.Root, name string) fileState {
	fh, err := r.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fileState{}
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return fileState{}
	}
	st := fileState{size: fi.Size(), mtime: fi.ModTime()}
	if fi.Size() <= maxHashed && sn.hashed+fi.Size() <= maxHashedTotal {
		sn.hashed += fi.Size()
		h := sha256.New()
		io.Copy(h, io.LimitReader(fh, maxHashed))
		h.Sum(st.hash[:0])
	}
	return st
}

// same says whether two states are one content: by hash where both were
// hashed, else by size and modification time.
func (a fileState) same(b fileState) bool {
	if a.mode != b.mode || a.size != b.size {
		return false
	}
	var zero [32]byte
	if a.hash != zero && b.hash != zero {
		return a.hash == b.hash
	}
	return a.mtime.Equal(b.mtime)
}

// changed lists the paths of after that are not in before or whose
// content differs,
// sorted, at most MaxFilesCreated.
func changed(before, after map[string]fileState) []string {
	out := []string{}
	for p, st := range after {
		if old, ok := before[p]; !ok || !old.same(st) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	if len(out) > MaxFilesCreated {
		out = out[:MaxFilesCreated]
	}
	return out
}

// tail keeps the last MaxOutput bytes of out as valid UTF-8, saying when
// it cut.
func tail(out []byte) string {
	if len(out) <= MaxOutput {
		return strings.ToValidUTF8(string(out), "\uFFFD")
	}
	cut := len(out) - MaxOutput
	note := fmt.Sprintf("[airlock: %d earlier bytes cut; output keeps the last %d]\n", cut, MaxOutput)
	return note + strings.ToValidUTF8(string(bytes.Clone(out[cut:])), "\uFFFD")
}
