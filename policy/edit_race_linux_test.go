//go:build linux

package policy

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestEditPutsInForceWhatItWrote: a member that can write the project
// renames a widening policy file over app.yaml right after airlockd's own
// rename of a saved rule. What goes in force is what the edit wrote, never
// the member's file: a widening edit waits for a person's reload (design
// §3.4).
func TestEditPutsInForceWhatItWrote(t *testing.T) {
	const safe = "sandbox:\n  enabled: true\n  unknown_action: deny\n"
	const wide = "sandbox:\n  enabled: true\n  unknown_action: allow\n"
	s, path := openTestSandbox(t, safe)
	dir := filepath.Dir(path)
	evil := filepath.Join(dir, "evil.yaml")

	in, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Skip("inotify:", err)
	}
	if _, err := unix.InotifyAddWatch(in, dir, unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	var armed, done atomic.Bool
	fired := make(chan struct{}, 1)
	exited := make(chan struct{})
	defer func() {
		// Wake the watcher so it ends before its descriptor is closed.
		done.Store(true)
		os.WriteFile(evil, nil, 0o644)
		os.Rename(evil, filepath.Join(dir, "wake"))
		<-exited
		unix.Close(in)
	}()
	go func() {
		defer close(exited)
		runtime.LockOSThread()
		buf := make([]byte, 4096)
		for {
			n, err := unix.Read(in, buf)
			if err != nil {
				return
			}
			if done.Load() {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				name = bytes.TrimRight(name, "\x00")
				if string(name) == "app.yaml" && armed.CompareAndSwap(true, false) {
					os.Rename(evil, path) // the member's move, no lock taken
					fired <- struct{}{}
				}
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}()
	for i := range 300 {
		if err := os.WriteFile(evil, []byte(wide), 0o644); err != nil {
			t.Fatal(err)
		}
		armed.Store(true)
		if _, err := s.Add(AddRequest{Pattern: fmt.Sprintf("h%d.example.com", i), List: Allowlist, Persist: true}); err != nil {
			t.Fatalf("edit %d: %v", i, err)
		}
		<-fired
		if got := s.Spec().UnknownAction; got == ActionAllow {
			t.Fatalf("edit %d: a member's unknown_action: allow, renamed in after airlockd's own rename, is in force without a person's reload", i)
		}
		// Lost the race: the member puts the file back as in force.
		if err := os.WriteFile(path, []byte(safe), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEditSyncNeverOpensSwappedDirectory: a member that controls a
// directory on the policy file's path (here conf, a link the config names)
// swaps it, right after airlockd's rename, for a link to a named pipe. The
// edit syncs the directory it opened at its start: it never opens the
// path again, so it never blocks on the pipe with the lock held.
func TestEditSyncNeverOpensSwappedDirectory(t *testing.T) {
	base := t.TempDir()
	real := filepath.Join(base, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(base, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	link, bad := filepath.Join(base, "conf"), filepath.Join(base, "bad")
	arm := func() {
		os.Remove(link)
		os.Remove(bad)
		if err := os.Symlink(real, link); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(fifo, bad); err != nil {
			t.Fatal(err)
		}
	}
	arm()
	path := filepath.Join(link, "app.yaml")

	in, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Skip("inotify:", err)
	}
	if _, err := unix.InotifyAddWatch(in, real, unix.IN_MOVED_TO|unix.IN_CREATE); err != nil {
		t.Fatal(err)
	}
	var armed, done atomic.Bool
	fired := make(chan struct{}, 1)
	exited := make(chan struct{})
	defer func() {
		// Wake the watcher so it ends before its descriptor is closed.
		done.Store(true)
		os.WriteFile(filepath.Join(real, "wake"), nil, 0o644)
		<-exited
		unix.Close(in)
	}()
	go func() {
		defer close(exited)
		runtime.LockOSThread()
		buf := make([]byte, 4096)
		for {
			n, err := unix.Read(in, buf)
			if err != nil || done.Load() {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)], "\x00")
				if ev.Mask&unix.IN_MOVED_TO != 0 && string(name) == "app.yaml" && armed.CompareAndSwap(true, false) {
					os.Rename(bad, link) // one atomic rename: conf now names the pipe
					fired <- struct{}{}
				}
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}()
	for i := range 300 {
		armed.Store(true)
		edited := make(chan error, 1)
		go func() {
			edited <- AddRule(path, NewRule(Allowlist, User, MustParse(fmt.Sprintf("h%d.example.com", i)), "", "", time.Time{}))
		}()
		select {
		case err := <-edited:
			// The swap, if it has not happened yet, is called off.
			swapped := !armed.CompareAndSwap(true, false)
			if swapped {
				<-fired
			}
			// The watcher may take an earlier edit's rename late and swap
			// before this edit resolves the directory: refusing it is
			// right too (what must not happen is blocking on the pipe).
			if err != nil && !(swapped && (errors.Is(err, unix.ENOTDIR) || strings.Contains(err.Error(), "no longer the directory"))) {
				t.Fatalf("edit %d: %v", i, err)
			}
		case <-time.After(2 * time.Second):
			// Release the blocked open so the test can end.
			if f, err := os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
				<-edited
				f.Close()
			}
			t.Fatalf("edit %d blocked opening the pipe swapped in for the policy file's directory, with the lock held", i)
		}
		arm()
	}
}
