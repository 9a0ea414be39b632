//go:build linux

package policy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
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
