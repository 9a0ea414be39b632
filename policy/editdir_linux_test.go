//go:build linux

package policy

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestEditOfMissingDirectoryFollowsNoMemberLink: a policy file whose
// directory does not exist when the sandbox is opened; a member makes it a
// symbolic link to another directory; the first edit is refused and
// writes nothing there.
func TestEditOfMissingDirectoryFollowsNoMemberLink(t *testing.T) {
	base := t.TempDir()
	proj := filepath.Join(base, "proj") // the member may write this
	outside := filepath.Join(base, "outside")
	for _, d := range []string{proj, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(proj, "conf", "app.yaml") // conf missing at open
	s, err := OpenSandbox(SandboxConfig{Name: "a", Path: path})
	if err != nil {
		t.Fatal(err)
	}
	// The member creates the missing directory as a link.
	if err := os.Symlink(outside, filepath.Join(proj, "conf")); err != nil {
		t.Fatal(err)
	}
	_, err = s.Add(AddRequest{Pattern: "pastebin.com", List: Denylist, Persist: true})
	t.Logf("Add: err=%v", err)
	for _, n := range []string{"app.yaml", "app.yaml.lock"} {
		if fi, err := os.Lstat(filepath.Join(outside, n)); err == nil {
			t.Errorf("the edit created %s outside the project (uid %d, mode %v)", filepath.Join(outside, n), fi.Sys().(*syscall.Stat_t).Uid, fi.Mode())
		}
	}
}

// TestEditFollowsNoMemberLinkPresentAtOpen: a directory on the path that
// is already a symbolic link of another user (a member) when the sandbox
// is opened is not followed: edits are refused, nothing is written where
// it points.
func TestEditFollowsNoMemberLinkPresentAtOpen(t *testing.T) {
	base := t.TempDir()
	proj := filepath.Join(base, "proj")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{proj, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(proj, "conf")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 65534, 65534); err != nil { // the member's link
		t.Skip(err)
	}
	path := filepath.Join(link, "app.yaml")
	s, err := OpenSandbox(SandboxConfig{Name: "a", Path: path})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Add(AddRequest{Pattern: "pastebin.com", List: Denylist, Persist: true})
	t.Logf("Add: err=%v", err)
	if _, err := os.Lstat(filepath.Join(outside, "app.yaml")); err == nil {
		t.Errorf("the edit wrote a root-owned policy file into %s, through a link owned by uid 65534", outside)
	}
}

// TestWalkDirRefusesLinks: the fallback without openat2 refuses a link or
// a FIFO on the path.
func TestWalkDirRefusesLinks(t *testing.T) {
	base := t.TempDir()
	if err := os.MkdirAll(filepath.Join(base, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Symlink(filepath.Join(base, "real"), filepath.Join(base, "ln"))
	syscall.Mkfifo(filepath.Join(base, "fifo"), 0o644)
	for _, p := range []string{"ln", "ln/x", "fifo", "fifo/x"} {
		if f, err := walkDir(filepath.Join(base, p), 0x200000); err == nil {
			f.Close()
			t.Errorf("walkDir(%s) opened it", p)
		}
	}
	f, err := walkDir(filepath.Join(base, "real"), 0x200000)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// TestReloadResolvesThePersonsLinkAgain: a person's own link configured at
// start (conf -> v1), re-pointed (conf -> v2), then a reload: later saves
// go to v2, the file the path names.
func TestReloadResolvesThePersonsLinkAgain(t *testing.T) {
	const content = "sandbox:\n  enabled: true\n  unknown_action: deny\n"
	base := t.TempDir()
	v1, v2 := filepath.Join(base, "v1"), filepath.Join(base, "v2")
	for _, d := range []string{v1, v2} {
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "app.yaml"), []byte(content), 0o644)
	}
	link := filepath.Join(base, "conf")
	os.Symlink(v1, link)
	path := filepath.Join(link, "app.yaml")
	s, err := OpenSandbox(SandboxConfig{Name: "a", Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(AddRequest{Pattern: "one.example.com", List: Denylist, Persist: true}); err != nil {
		t.Fatalf("a person's link configured at start: %v", err)
	}
	os.Remove(link)
	os.Symlink(v2, link)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	_, err = s.Add(AddRequest{Pattern: "two.example.com", List: Denylist, Persist: true})
	got, _ := os.ReadFile(path)
	if err == nil && !strings.Contains(string(got), "two.example.com") {
		t.Errorf("after reload, Add succeeded but %s (-> v2) lacks the rule; it went to v1", path)
	}
}

// TestEditFollowsNoMemberLinkInMemberDir: a member (uid 65534) makes a
// real directory in the person's project and a link inside it, before the
// sandbox opens or before a person's reload: the edit is refused and
// writes nothing where the link points.
func TestEditFollowsNoMemberLinkInMemberDir(t *testing.T) {
	for _, atOpen := range []bool{true, false} {
		base := t.TempDir()
		proj := filepath.Join(base, "proj")
		outside := filepath.Join(base, "outside")
		os.MkdirAll(proj, 0o755)
		os.MkdirAll(outside, 0o755)
		a := filepath.Join(proj, "a")
		link := filepath.Join(a, "b")
		path := filepath.Join(link, "app.yaml")
		plant := func() {
			os.Mkdir(a, 0o755)
			if err := os.Symlink(outside, link); err != nil {
				t.Fatal(err)
			}
			if err := os.Lchown(a, 65534, 65534); err != nil {
				t.Skip(err)
			}
			if err := os.Lchown(link, 65534, 65534); err != nil {
				t.Skip(err)
			}
		}
		if atOpen {
			plant()
		}
		s, err := OpenSandbox(SandboxConfig{Name: "a", Path: path})
		if err != nil {
			t.Fatal(err)
		}
		if !atOpen {
			plant()
			s.Reload() // a person's reload, after the member planted the link
		}
		_, err = s.Add(AddRequest{Pattern: "pastebin.com", List: Denylist, Persist: true})
		t.Logf("atOpen=%v Add: err=%v", atOpen, err)
		if _, err := os.Lstat(filepath.Join(outside, "app.yaml")); err == nil {
			t.Errorf("atOpen=%v: the edit wrote a policy file into %s through a uid-65534 link in a uid-65534 directory", atOpen, outside)
		}
	}
}
