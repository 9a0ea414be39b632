package netns

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
)

func TestSameNetns(t *testing.T) {
	if err := sameNetns("tcp://127.0.0.1:2375"); err == nil || !strings.Contains(err.Error(), "not on a local unix socket") {
		t.Errorf("an engine over TCP: %v, want refused", err)
	}
	sock := filepath.Join(t.TempDir(), "here.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if err := sameNetns("unix://" + sock); err != nil {
		t.Errorf("an engine in this namespace: %v", err)
	}

	// An engine in a namespace of its own: a listener started in another
	// network namespace.
	testenv.Privileged(t)
	ns := fmt.Sprintf("alt-samens-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	other := filepath.Join(t.TempDir(), "other.sock")
	srv := exec.Command("ip", "netns", "exec", ns, "python3", "-c",
		"import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\ns.listen(8)\nwhile True:\n c,_=s.accept()\n c.close()\n", other)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	testenv.WaitFor(t, 5*time.Second, "the other namespace's engine to listen", func() bool { _, err := os.Stat(other); return err == nil })
	if err := sameNetns("unix://" + other); err == nil || !strings.Contains(err.Error(), "another network namespace") {
		t.Errorf("an engine in another namespace: %v, want refused", err)
	}
}

func TestLaunchRefusesRootAndBadInput(t *testing.T) {
	ok := Launch{Sandbox: "s", Image: "img", CAFile: "/ca.pem", CABundle: "/bundle.pem"}
	if err := ok.check(); err != nil {
		t.Fatalf("a plain launch: %v", err)
	}
	for _, tc := range []struct {
		mod  func(*Launch)
		want string
	}{
		{func(l *Launch) { l.User = "root" }, "other than 0"},
		{func(l *Launch) { l.User = "0" }, "other than 0"},
		{func(l *Launch) { l.User = "00:00" }, "other than 0"},
		{func(l *Launch) { l.User = "1000:0" }, "other than 0"},
		{func(l *Launch) { l.User = "node" }, "numeric"},
		{func(l *Launch) { l.Image = "" }, "no image"},
		{func(l *Launch) { l.Name = "../x" }, "container name"},
		{func(l *Launch) { l.Workspace = "rel/dir" }, "not an absolute path"},
		{func(l *Launch) { l.Env = []string{"NOEQUALS"} }, "KEY=VALUE"},
		{func(l *Launch) { l.Trust = "root" }, "trust"},
		{func(l *Launch) { l.MemoryMB = -1 }, "negative"},
	} {
		l := ok
		tc.mod(&l)
		if err := l.check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error with %q", l, err, tc.want)
		}
	}
	l := ok
	l.User = "1000:1000"
	if err := l.check(); err != nil {
		t.Errorf("user 1000:1000: %v", err)
	}
	for user, root := range map[string]bool{"": true, "root": true, "0": true, "000": true, "0:0": true, "1000:0": true, "app:root": true, "node": false, "1000": false, "1000:1000": false} {
		if isRoot(user) != root {
			t.Errorf("isRoot(%q) = %v", user, !root)
		}
	}
}
