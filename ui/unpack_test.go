package ui

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
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
			n, err := UnpackArchive(bytes.NewReader(makeTar(t, tt.archive, nil)), filepath.Join(dir, tt.dest))
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
			_, err := UnpackArchive(bytes.NewReader(makeTar(t, []tarEntry{ok, tt.entry}, nil)), dest)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("UnpackArchive = %v, want an error saying %q", err, tt.want)
			}
			if diff := cmp.Diff([]string{"dest drwxr-xr-x", "dest/dist drwxr-xr-x"}, tree(t, parent)); diff != "" {
				t.Errorf("written (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := UnpackArchive(bytes.NewReader(makeTar(t, nil, nil)), t.TempDir()); err == nil {
		t.Error("an empty archive unpacked")
	}
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o644)
	if _, err := UnpackArchive(bytes.NewReader(makeTar(t, goodArchive, nil)), file); err == nil || !strings.Contains(err.Error(), "not a directory") {
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
	if _, err := UnpackArchive(bytes.NewReader(makeTar(t, goodArchive, nil)), dest); err != nil {
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
	f.Fuzz(func(t *testing.T, archive []byte) {
		parent := t.TempDir()
		dest := filepath.Join(parent, "dest")
		os.Mkdir(dest, 0o755)
		UnpackArchive(bytes.NewReader(archive), dest)
		for _, line := range tree(t, parent) {
			if line != "dest drwxr-xr-x" && !strings.HasPrefix(line, "dest/") {
				t.Fatalf("written outside the destination: %s", line)
			}
			if _, target, ok := strings.Cut(line, " -> "); ok {
				name, _, _ := strings.Cut(line, " ")
				to := filepath.Join(parent, filepath.Dir(name), target)
				if filepath.IsAbs(target) || !strings.HasPrefix(to, dest+"/") {
					t.Fatalf("link %s leads out of the destination", line)
				}
			}
		}
	})
}
