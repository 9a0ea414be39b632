package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
)

// fileTree lists what is under dir: "name mode [-> target | = content]".
func fileTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		line := rel + " " + fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			line += fmt.Sprintf(" = %d bytes %.12q", len(b), b)
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// dockerTime is t as `docker events` reads it: Unix seconds with
// nanoseconds.
func dockerTime(t time.Time) string { return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond()) }

// testMemberOutput runs inside TestDocker: a container on sandbox dk1's
// network writes /workspace/dist and prints lines. `airlock docker cp`
// unpacks the archive of /workspace/dist to the member's files; a path
// outside /workspace, through a link out of it, or written another way is
// a 400 and the engine reads nothing (it logs an archive-path event for
// every archive it reads); `airlock docker logs -f` streams lines the
// member prints after it started, escaped, and ends when the member does.
func testMemberOutput(t *testing.T, w *testworld.World, token string) {
	if out, err := docker(t, "run", "-d", "--network", "airlock-"+dk1, "--name", "e2e-artifacts", dkImage, "workspace"); err != nil {
		t.Fatal(out)
	}
	testenv.WaitFor(t, 20*time.Second, "the member's workspace", func() bool {
		out, _ := docker(t, "logs", "e2e-artifacts")
		return strings.Contains(out, "ready")
	})
	bin := testworld.Binaries(t)
	airlock := func(ctx context.Context, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, filepath.Join(bin, "airlock"), append([]string{args[0], args[1], "--api", strings.TrimSuffix(dkAPI, "/api/v1"), "--token-file", filepath.Join(w.Dir, "state", "token")}, args[2:]...)...)
	}
	run := func(args ...string) (string, int) {
		cmd := airlock(context.Background(), args...)
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}
	started := time.Now()

	t.Run("docker cp unpacks the member's files", func(t *testing.T) {
		dest := t.TempDir()
		if out, code := run("docker", "cp", dk1, "e2e-artifacts:/workspace/dist", dest); code != 0 || !strings.Contains(out, "copied") {
			t.Fatalf("airlock docker cp: exit %d %s", code, out)
		}
		data := make([]byte, 3000)
		for i := range data {
			data[i] = byte(i % 251)
		}
		want := []string{
			"dist drwxr-xr-x",
			"dist/app.txt -rw-r--r-- = 11 bytes \"artifact 1\\n\"",
			"dist/latest Lrwxrwxrwx -> app.txt",
			"dist/run.sh -rwxr-xr-x = 21 bytes \"#!/bin/sh\\nec\"",
			"dist/sub drwxr-xr-x",
			"dist/sub/data.bin -rw------- = 3000 bytes " + fmt.Sprintf("%.12q", data),
			"dist/sub/empty -rw-r--r-- = 0 bytes \"\"",
		}
		if diff := cmp.Diff(want, fileTree(t, dest)); diff != "" {
			t.Errorf("unpacked /workspace/dist (-want +got):\n%s", diff)
		}
		b, err := os.ReadFile(filepath.Join(dest, "dist", "sub", "data.bin"))
		if err != nil || string(b) != string(data) {
			t.Errorf("data.bin differs from what the member wrote (%d bytes, %v)", len(b), err)
		}
		// A file, under a new name.
		if out, code := run("docker", "cp", dk1, "e2e-artifacts:/workspace/dist/app.txt", filepath.Join(dest, "copy.txt")); code != 0 {
			t.Fatalf("airlock docker cp of a file: exit %d %s", code, out)
		}
		if b, _ := os.ReadFile(filepath.Join(dest, "copy.txt")); string(b) != "artifact 1\n" {
			t.Errorf("copy.txt = %q", b)
		}
	})

	t.Run("docker cp stops at its bounds", func(t *testing.T) {
		dest := t.TempDir()
		// dist holds 3,053 bytes of files in 7 entries.
		out, code := run("docker", "cp", "--max-entries", "3", dk1, "e2e-artifacts:/workspace/dist", dest)
		if code == 0 || !strings.Contains(out, "more than 3 entries") {
			t.Errorf("--max-entries 3: exit %d %s", code, out)
		}
		if out, code := run("docker", "cp", "--max-mib", "-1", dk1, "e2e-artifacts:/workspace/dist", t.TempDir()); code != 2 || !strings.Contains(out, "want 0") {
			t.Errorf("--max-mib -1: exit %d %s", code, out)
		}
		if out, code := run("docker", "cp", "--max-mib", "0", "--max-entries", "0", dk1, "e2e-artifacts:/workspace/dist", t.TempDir()); code != 0 {
			t.Errorf("no bounds: exit %d %s", code, out)
		}
	})

	t.Run("docker cp refuses a link out of DEST", func(t *testing.T) {
		parent := t.TempDir()
		dest := filepath.Join(parent, "dest")
		os.Mkdir(dest, 0o755)
		out, code := run("docker", "cp", dk1, "e2e-artifacts:/workspace/trap", dest)
		if code == 0 || !strings.Contains(out, "only relative links") {
			t.Errorf("airlock docker cp of a link to /etc: exit %d %s", code, out)
		}
		for _, line := range fileTree(t, parent) {
			if strings.Contains(line, "->") || !strings.HasPrefix(line, "dest") {
				t.Errorf("written: %s", line)
			}
		}
	})

	t.Run("a path outside /workspace is a 400 and reads nothing", func(t *testing.T) {
		since := time.Now()
		for _, bad := range []string{"/etc", "/workspace/../etc", "/workspace/./x", "workspace/x", "/workspacefoo", "/workspace/", "/workspace/out", "/workspace/out/hostname", "/workspace/trap/etc"} {
			status, body := dkCall(t, token, "GET", "/sandboxes/"+dk1+"/containers/e2e-artifacts/archive?path="+url.QueryEscape(bad), "")
			if status != 400 {
				t.Errorf("archive of %q: %d %.200s, want 400", bad, status, body)
			}
		}
		out, code := run("docker", "cp", dk1, "e2e-artifacts:/workspace/../etc", t.TempDir())
		if code == 0 || !strings.Contains(out, ".. segment") {
			t.Errorf("airlock docker cp of /workspace/../etc: exit %d %s", code, out)
		}
		events, err := docker(t, "events", "--since", dockerTime(since), "--until", dockerTime(time.Now().Add(time.Second)),
			"--filter", "container=e2e-artifacts", "--filter", "event=archive-path")
		if err != nil || strings.TrimSpace(events) != "" {
			t.Errorf("the engine read archives for refused paths: %v\n%s", err, events)
		}
		// The events are there to see: the good path of the subtest before
		// read one each.
		events, _ = docker(t, "events", "--since", dockerTime(started), "--until", dockerTime(since),
			"--filter", "container=e2e-artifacts", "--filter", "event=archive-path")
		if strings.Count(events, "archive-path") < 2 {
			t.Errorf("no archive-path events for the archives read: %q", events)
		}
	})

	t.Run("a container of no sandbox is not found", func(t *testing.T) {
		if out, err := docker(t, "run", "-d", "--name", "e2e-stranger", dkImage, "workspace"); err != nil {
			t.Fatal(out)
		}
		for _, path := range []string{"/archive?path=/workspace/dist", "/logs"} {
			if status, body := dkCall(t, token, "GET", "/sandboxes/"+dk1+"/containers/e2e-stranger"+path, ""); status != 404 {
				t.Errorf("%s of a container of no sandbox: %d %.200s, want 404", path, status, body)
			}
		}
	})

	t.Run("docker logs -f streams new lines and ends with the member", func(t *testing.T) {
		out, _ := docker(t, "logs", "e2e-artifacts")
		before := 0
		for _, m := range regexp.MustCompile(`tick (\d+)`).FindAllStringSubmatch(out, -1) {
			before, _ = strconv.Atoi(m[1])
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := airlock(ctx, "docker", "logs", "-f", "--tail", "1", dk1, "e2e-artifacts")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr testworld.SyncBuffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		deadline := time.After(20 * time.Second)
		for seen := 0; seen < before+20; {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("airlock docker logs -f ended before tick %d: %s", before+20, stderr.String())
				}
				if n, err := strconv.Atoi(strings.TrimPrefix(l, "tick ")); err == nil {
					seen = n
				}
			case <-deadline:
				t.Fatalf("no tick after %d within 20 s; stderr: %s", before+20, stderr.String())
			}
		}
		// stderr is the member's, escaped for the terminal.
		testenv.WaitFor(t, 5*time.Second, "a warning on stderr", func() bool { return strings.Contains(stderr.String(), `\x1b[31mred`) })
		if strings.Contains(stderr.String(), "\x1b") {
			t.Errorf("a raw escape reached the terminal: %q", stderr.String())
		}
		// The member ends: so does the stream, with exit 0.
		if out, err := docker(t, "kill", "e2e-artifacts"); err != nil {
			t.Fatal(out)
		}
		go func() {
			for range lines {
			}
		}()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("airlock docker logs -f after the member ended: %v %s", err, stderr.String())
			}
		case <-time.After(20 * time.Second):
			t.Error("airlock docker logs -f went on after the member ended")
		}
	})
}
