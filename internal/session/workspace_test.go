package session

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestSnapshotBounded: what a member leaves in its workspace cannot make
// airlockd's snapshot of it unbounded: hard links of one big sparse file
// (no disk, yet each hashed), a directory of many entries that are not
// files, a tree deeper than any path get_files takes.
func TestSnapshotBounded(t *testing.T) {
	t.Run("hard links of a sparse file", func(t *testing.T) {
		dir := t.TempDir()
		big := filepath.Join(dir, "big")
		fh, err := os.Create(big)
		if err != nil {
			t.Fatal(err)
		}
		fh.Truncate(maxHashed)
		fh.Close()
		n := int(maxHashedTotal/maxHashed) + 8
		for i := range n {
			if err := os.Link(big, filepath.Join(dir, fmt.Sprint("l", i))); err != nil {
				t.Fatal(err)
			}
		}
		r, _ := workspace{dir: dir}.open()
		defer r.Close()
		sn := snapshotter{out: map[string]fileState{}}
		sn.dir(r, "", 0)
		if sn.hashed > maxHashedTotal {
			t.Errorf("hashed %d bytes, over the %d-byte budget", sn.hashed, int64(maxHashedTotal))
		}
		if len(sn.out) != n+1 {
			t.Errorf("recorded %d files, want all %d", len(sn.out), n+1)
		}
	})
	t.Run("many directories", func(t *testing.T) {
		dir := t.TempDir()
		for i := range maxSnapshot + 100 {
			if err := os.Mkdir(filepath.Join(dir, fmt.Sprintf("d%06d", i)), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		r, _ := workspace{dir: dir}.open()
		defer r.Close()
		sn := snapshotter{out: map[string]fileState{}}
		sn.dir(r, "", 0)
		if sn.visited > maxSnapshot {
			t.Errorf("visited %d entries, over the cap of %d", sn.visited, maxSnapshot)
		}
	})
	t.Run("deep tree", func(t *testing.T) {
		dir := t.TempDir()
		fd, err := syscall.Open(dir, syscall.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for i := range 3 * maxDepth {
			if err := syscall.Mkdirat(fd, "a", 0o755); err != nil {
				t.Fatal(err)
			}
			next, err := syscall.Openat(fd, "a", syscall.O_DIRECTORY, 0)
			syscall.Close(fd)
			if err != nil {
				t.Fatal(err)
			}
			fd = next
			if i < 5 {
				f, _ := syscall.Openat(fd, "f", syscall.O_CREAT|syscall.O_WRONLY, 0o644)
				syscall.Close(f)
				want = append(want, strings.Repeat("a/", i+1)+"f")
			}
		}
		bottom, _ := syscall.Openat(fd, "deepest", syscall.O_CREAT|syscall.O_WRONLY, 0o644)
		syscall.Close(bottom)
		syscall.Close(fd)
		got, err := workspace{dir: dir}.snapshot()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range want {
			if _, ok := got[p]; !ok {
				t.Errorf("snapshot misses %s", p)
			}
		}
		for p := range got {
			if strings.HasSuffix(p, "deepest") {
				t.Errorf("snapshot went %d directories deep, past the cap of %d", strings.Count(p, "/"), maxDepth)
			}
		}
	})
}

// TestRefusedUploadChangesNothing: uploads that name a file and a file
// under it ("new" and "new/x") are refused before any is written, so a
// file of the session the same request names keeps its content.
func TestRefusedUploadChangesNothing(t *testing.T) {
	m, _ := newManager(t, t.TempDir(), settings())
	ctx := context.Background()
	res, err := m.Execute(ctx, ExecuteRequest{Task: "write notes.txt the agent's work", UserID: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Execute(ctx, ExecuteRequest{Task: "say x", UserID: "alice", SessionID: res.SessionID,
		Files: []UploadFile{{Path: "notes.txt", Content: b64("clobbered")}, {Path: "new", Content: b64("y")}, {Path: "new/x", Content: b64("y")}}})
	if kindOf(err) != BadInput {
		t.Fatalf("err %v, want a BadInput refusal", err)
	}
	got, err := m.Files(ctx, FilesRequest{SessionID: res.SessionID, Paths: []string{"notes.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := base64.StdEncoding.DecodeString(got.Files[0].Content); string(b) != "the agent's work" {
		t.Errorf("the refused request (%v) changed notes.txt to %q", err, b)
	}
}
