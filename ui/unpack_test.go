package ui

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// tree lists what is under dir: "name mode [-> target | = content]".
func tree(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, _ := os.Lstat(p)
		line := rel + " " + fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			line += " = " + string(b)
		}
		out = append(out, line)
		return nil
	})
	return out
}

var goodArchive = []tarEntry{
	{tar.TypeDir, "dist/", "", 0o755, ""},
	{tar.TypeReg, "dist/app", "", 0o4755, "binary"},
	{tar.TypeDir, "dist/sub/", "", 0o700, ""},
	{tar.TypeReg, "dist/sub/notes.txt", "", 0o644, "hello\n"},
	{tar.TypeSymlink, "dist/latest", "app", 0o777, ""},
	{tar.TypeSymlink, "dist/sub/up", "../app", 0o777, ""},
	{tar.TypeLink, "dist/again", "dist/sub/notes.txt", 0o644, ""},
}

func TestUnpackArchive(t *testing.T) {
	tests := []struct {
		name    string
		dest    string // under the test's directory; "" is the directory itself
		archive []tarEntry
		want    []string
	}{
		{name: "into a directory", archive: goodArchive, want: []string{
			"dist drwxr-xr-x", "dist/again -rw-r--r-- = hello\n", "dist/app -rwxr-xr-x = binary", "dist/latest Lrwxrwxrwx -> app",
			"dist/sub drwx------", "dist/sub/notes.txt -rw-r--r-- = hello\n", "dist/sub/up Lrwxrwxrwx -> ../app",
		}},
		{name: "as a new name", dest: "out", archive: goodArchive, want: []string{
			"out drwxr-xr-x", "out/again -rw-r--r-- = hello\n", "out/app -rwxr-xr-x = binary", "out/latest Lrwxrwxrwx -> app",
			"out/sub drwx------", "out/sub/notes.txt -rw-r--r-- = hello\n", "out/sub/up Lrwxrwxrwx -> ../app",
		}},
		{name: "one file", archive: []tarEntry{{tar.TypeReg, "notes.txt", "", 0o640, "hi"}}, want: []string{"notes.txt -rw-r----- = hi"}},
		{name: "one file, new name", dest: "copy.txt", archive: []tarEntry{{tar.TypeReg, "notes.txt", "", 0o640, "hi"}}, want: []string{"copy.txt -rw-r----- = hi"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			n, err := UnpackArchive(bytes.NewReader(makeTar(t, tt.archive, nil)), filepath.Join(dir, tt.dest), UnpackLimits{})
			if err != nil || n != len(tt.archive) {
				t.Fatalf("UnpackArchive = %d, %v", n, err)
			}
			if diff := cmp.Diff(tt.want, tree(t, dir)); diff != "" {
				t.Errorf("unpacked (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUnpackArchiveRefuses: an entry that would land or point outside the
// archive's top entry, or is no file, directory or link, stops the
// unpacking there; nothing is written outside the destination.
func TestUnpackArchiveRefuses(t *testing.T) {
	ok := tarEntry{tar.TypeDir, "dist/", "", 0o755, ""}
	tests := []struct {
		name  string
		entry tarEntry
		want  string
	}{
		{"dot dot", tarEntry{tar.TypeReg, "dist/../evil", "", 0o644, "x"}, "not a plain path"},
		{"leading dot dot", tarEntry{tar.TypeReg, "../evil", "", 0o644, "x"}, ".. segment"},
		{"absolute", tarEntry{tar.TypeReg, "/tmp/evil", "", 0o644, "x"}, "absolute"},
		{"another top", tarEntry{tar.TypeReg, "other/evil", "", 0o644, "x"}, "not under"},
		{"dot segment", tarEntry{tar.TypeReg, "dist/./evil", "", 0o644, "x"}, "not a plain path"},
		{"absolute link", tarEntry{tar.TypeSymlink, "dist/etc", "/etc", 0o777, ""}, "only relative links"},
		{"link out", tarEntry{tar.TypeSymlink, "dist/up", "../../evil", 0o777, ""}, "leads out"},
		{"link beside the top", tarEntry{tar.TypeSymlink, "dist/side", "../sibling", 0o777, ""}, "leads out"},
		{"hard link out", tarEntry{tar.TypeLink, "dist/h", "../evil", 0o644, ""}, ".. segment"},
		{"hard link to another top", tarEntry{tar.TypeLink, "dist/h", "etc/passwd", 0o644, ""}, "not under"},
		{"device", tarEntry{tar.TypeChar, "dist/null", "", 0o666, ""}, "not unpacked"},
		{"pipe", tarEntry{tar.TypeFifo, "dist/pipe", "", 0o644, ""}, "not unpacked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent := t.TempDir()
			dest := filepath.Join(parent, "dest")
			os.Mkdir(dest, 0o755)
			_, err := UnpackArchive(bytes.NewReader(makeTar(t, []tarEntry{ok, tt.entry}, nil)), dest, UnpackLimits{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("UnpackArchive = %v, want an error saying %q", err, tt.want)
			}
			if diff := cmp.Diff([]string{"dest drwxr-xr-x", "dest/dist drwxr-xr-x"}, tree(t, parent)); diff != "" {
				t.Errorf("written (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := UnpackArchive(bytes.NewReader(makeTar(t, nil, nil)), t.TempDir(), UnpackLimits{}); err == nil {
		t.Error("an empty archive unpacked")
	}
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o644)
	if _, err := UnpackArchive(bytes.NewReader(makeTar(t, goodArchive, nil)), file, UnpackLimits{}); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("onto a file: %v", err)
	}
}

// TestUnpackArchiveReplacesLinks: a link already at the place of a file
// (an earlier copy, or a trap) is replaced, not written through.
func TestUnpackArchiveReplacesLinks(t *testing.T) {
	parent := t.TempDir()
	outside := filepath.Join(parent, "outside")
	os.WriteFile(outside, []byte("keep"), 0o644)
	dest := filepath.Join(parent, "dest")
	os.MkdirAll(filepath.Join(dest, "dist"), 0o755)
	os.Symlink(outside, filepath.Join(dest, "dist", "app"))
	if _, err := UnpackArchive(bytes.NewReader(makeTar(t, goodArchive, nil)), dest, UnpackLimits{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside); string(b) != "keep" {
		t.Errorf("a file outside the destination was written through a link: %q", b)
	}
	if fi, err := os.Lstat(filepath.Join(dest, "dist", "app")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("dist/app: %v %v, want the archive's file", fi, err)
	}
}

// FuzzUnpackArchive: whatever the archive, nothing is written outside the
// destination and no link there leads out of it.
func FuzzUnpackArchive(f *testing.F) {
	f.Add(makeTar(f, goodArchive, nil))
	f.Add(makeTar(f, []tarEntry{{tar.TypeSymlink, "d/l", "../x", 0o777, ""}}, nil))
	f.Add(makeTar(f, []tarEntry{{tar.TypeReg, "d/../x", "", 0o644, "x"}}, nil))
	f.Add(makeTar(f, []tarEntry{{tar.TypeDir, "d/", "", 0o755, ""}, {tar.TypeSymlink, "d/s", ".", 0o777, ""}, {tar.TypeSymlink, "d/u", "s/..", 0o777, ""}, {tar.TypeSymlink, "d/w", "u/..", 0o777, ""}}, nil))
	f.Fuzz(func(t *testing.T, archive []byte) {
		parent := t.TempDir()
		dest := filepath.Join(parent, "dest")
		os.Mkdir(dest, 0o755)
		UnpackArchive(bytes.NewReader(archive), dest, UnpackLimits{MaxBytes: 1 << 20, MaxEntries: 1000})
		// Links are followed as the kernel follows them: each may look
		// inside on its own and lead out through another.
		if got := outside(t, parent, dest); len(got) > 0 {
			t.Fatalf("outside the destination:\n%s", strings.Join(got, "\n"))
		}
	})
}

// resolve returns where p leads once every symbolic link on the way is
// followed, as the kernel follows them; components that are not there
// are taken as written.
func resolve(t testing.TB, p string) string {
	t.Helper()
	rest := strings.Split(strings.TrimPrefix(filepath.Clean(p), "/"), "/")
	cur := "/"
	for hops := 0; len(rest) > 0; {
		seg := rest[0]
		rest = rest[1:]
		next := filepath.Join(cur, seg)
		fi, err := os.Lstat(next)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return next // a loop: the kernel gives up (ELOOP)
		}
		target, _ := os.Readlink(next)
		if filepath.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(strings.Trim(target, "/"), "/"), rest...)
	}
	return cur
}

// outside lists what an unpacking into top, a directory in parent, left
// that is not under top: files beside it but those in keep (names under
// parent), and links under it that lead out of it when followed.
func outside(t testing.TB, parent, top string, keep ...string) []string {
	t.Helper()
	var out []string
	for _, line := range tree(t, parent) {
		name, _, _ := strings.Cut(line, " ")
		p := filepath.Join(parent, name)
		if p != top && !strings.HasPrefix(p, top+"/") {
			if !slices.Contains(keep, name) && !strings.HasPrefix(top, p+"/") {
				out = append(out, "written: "+line)
			}
		} else if to := resolve(t, p); to != top && !strings.HasPrefix(to, top+"/") {
			out = append(out, "leads to "+to+": "+line)
		}
	}
	return out
}

// TestUnpackArchiveLinkChains: links that each look inside the top entry
// when read on their own but lead out of it together (through another
// link, or a hard link to a link that moves it elsewhere) are refused, in
// any order, and nothing is written through them; into a new name, the
// directory the destination goes in is kept as well.
func TestUnpackArchiveLinkChains(t *testing.T) {
	dir := tarEntry{tar.TypeDir, "dist/", "", 0o755, ""}
	tests := []struct {
		name    string
		archive []tarEntry
		want    string // in the error
	}{
		{"up through a link to the top", []tarEntry{dir,
			{tar.TypeSymlink, "dist/s", ".", 0o777, ""},
			{tar.TypeSymlink, "dist/up", "s/..", 0o777, ""},
			{tar.TypeReg, "dist/up/victim", "", 0o644, "pwned"},
		}, "leads out"},
		{"up through a link made later", []tarEntry{dir,
			{tar.TypeSymlink, "dist/up", "s/..", 0o777, ""},
			{tar.TypeSymlink, "dist/s", ".", 0o777, ""},
			{tar.TypeReg, "dist/up/victim", "", 0o644, "pwned"},
		}, "leads out"},
		{"up through a deeper link", []tarEntry{dir,
			{tar.TypeDir, "dist/a/", "", 0o755, ""},
			{tar.TypeDir, "dist/a/b/", "", 0o755, ""},
			{tar.TypeSymlink, "dist/a/b/top", "../..", 0o777, ""},
			{tar.TypeSymlink, "dist/up", "a/b/top/..", 0o777, ""},
		}, "leads out"},
		{"a name through a link", []tarEntry{dir,
			{tar.TypeSymlink, "dist/s", ".", 0o777, ""},
			{tar.TypeSymlink, "dist/s/s/l", "../../victim", 0o777, ""},
		}, "symbolic link"},
		{"a file through a link", []tarEntry{dir,
			{tar.TypeDir, "dist/a/", "", 0o755, ""},
			{tar.TypeSymlink, "dist/l", "a", 0o777, ""},
			{tar.TypeReg, "dist/l/victim", "", 0o644, "pwned"},
		}, "symbolic link"},
		{"a hard link to a link", []tarEntry{dir,
			{tar.TypeDir, "dist/a/", "", 0o755, ""},
			{tar.TypeSymlink, "dist/a/l", "../victim", 0o777, ""},
			{tar.TypeLink, "dist/h", "dist/a/l", 0o644, ""},
		}, "hard link"},
		{"a hard link to a directory's link", []tarEntry{dir,
			{tar.TypeDir, "dist/a/", "", 0o755, ""},
			{tar.TypeReg, "dist/a/f", "", 0o644, "x"},
			{tar.TypeSymlink, "dist/l", "a", 0o777, ""},
			{tar.TypeLink, "dist/h", "dist/l/f", 0o644, ""},
		}, "symbolic link"},
	}
	for _, tt := range tests {
		for _, into := range []string{"dest", "new"} {
			t.Run(tt.name+"/"+into, func(t *testing.T) {
				parent := t.TempDir()
				os.WriteFile(filepath.Join(parent, "victim"), []byte("keep"), 0o644)
				dest := filepath.Join(parent, "dest")
				os.Mkdir(dest, 0o755)
				os.WriteFile(filepath.Join(dest, "victim"), []byte("keep"), 0o644)
				target := dest
				if into == "new" {
					target = filepath.Join(dest, "new")
				}
				_, err := UnpackArchive(bytes.NewReader(makeTar(t, tt.archive, nil)), target, UnpackLimits{})
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("UnpackArchive = %v, want an error saying %q", err, tt.want)
				}
				top := filepath.Join(dest, "dist")
				if into == "new" {
					top = target
				}
				if got := outside(t, parent, top, "victim", "dest/victim"); len(got) > 0 {
					t.Errorf("outside the top entry:\n%s", strings.Join(got, "\n"))
				}
				for _, f := range []string{filepath.Join(parent, "victim"), filepath.Join(dest, "victim")} {
					if b, _ := os.ReadFile(f); string(b) != "keep" {
						t.Errorf("%s was written: %q", f, b)
					}
				}
			})
		}
	}
}

// TestUnpackArchiveBounds: a member's archive cannot make the unpacking
// write more files or bytes than its bounds, also with a header that claims
// a size far beyond what follows (a sparse file counts at its full size):
// it is refused before a byte of it is written.
func TestUnpackArchiveBounds(t *testing.T) {
	files := []tarEntry{
		{Type: tar.TypeDir, Name: "out/", Mode: 0o755},
		{Type: tar.TypeReg, Name: "out/a", Mode: 0o644, Body: "0123456789"},
		{Type: tar.TypeReg, Name: "out/b", Mode: 0o644, Body: "0123456789"},
		{Type: tar.TypeReg, Name: "out/c", Mode: 0o644, Body: "0123456789"},
	}
	dest := filepath.Join(t.TempDir(), "dest")
	n, err := UnpackArchive(bytes.NewReader(makeTar(t, files, nil)), dest, UnpackLimits{MaxBytes: 25})
	if err == nil || !strings.Contains(err.Error(), "bound on bytes") || n != 3 {
		t.Errorf("past the bound on bytes: %d entries, %v", n, err)
	}
	if _, err := os.Stat(filepath.Join(dest, "c")); err == nil {
		t.Errorf("the file past the bound was written")
	}
	dest = filepath.Join(t.TempDir(), "dest")
	n, err = UnpackArchive(bytes.NewReader(makeTar(t, files, nil)), dest, UnpackLimits{MaxEntries: 2})
	if err == nil || !strings.Contains(err.Error(), "more than 2 entries") || n != 2 {
		t.Errorf("past the bound on entries: %d entries, %v", n, err)
	}
	if n, err := UnpackArchive(bytes.NewReader(makeTar(t, files, nil)), filepath.Join(t.TempDir(), "dest"), UnpackLimits{MaxBytes: 30, MaxEntries: 4}); err != nil || n != 4 {
		t.Errorf("within the bounds: %d entries, %v", n, err)
	}

	// A header that claims 1 TiB, with nothing behind it.
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "big", Mode: 0o644, Size: 1 << 40})
	tw.Flush()
	parent := t.TempDir()
	_, err = UnpackArchive(bytes.NewReader(b.Bytes()), filepath.Join(parent, "dest"), DefaultUnpackLimits)
	if err == nil || !strings.Contains(err.Error(), "bound on bytes") {
		t.Errorf("a 1 TiB entry: %v", err)
	}
	if _, err := os.Stat(filepath.Join(parent, "dest")); err == nil {
		t.Errorf("the refused entry was created")
	}
}
