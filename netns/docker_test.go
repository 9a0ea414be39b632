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
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(other); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err := sameNetns("unix://" + other); err == nil || !strings.Contains(err.Error(), "another network namespace") {
		t.Errorf("an engine in another namespace: %v, want refused", err)
	}
}
