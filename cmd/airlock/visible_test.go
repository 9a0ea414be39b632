package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/visible"
)

// hostile is what a member can make an approval's or a record's URL say:
// terminal escapes (clear screen, OSC 52 clipboard write, a C1 CSI), a
// forged line, line separators as padding and a right-to-left override.
const hostile = "http://unknown.test/\x1b[2J\x1b]52;c;ZXZpbA==\a\u009b31m\nDENIED nothing\u2028\u2028\u2029\u202eexe.gpj\u200b"

// TestCLIEscapesMemberText runs `airlock pending` and `airlock log`, as
// tables and as --json, against an API that answers with hostile member
// text: no byte of it that a terminal acts on comes out raw.
func TestCLIEscapesMemberText(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/approvals"):
			json.NewEncoder(w).Encode([]map[string]any{{"id": "abc123", "source": "agent" + hostile, "url": hostile, "host": "unknown.test",
				"seconds_left": 20, "suggestions": []map[string]string{{"pattern": "unknown.test\u202e"}}}})
		case strings.HasSuffix(r.URL.Path, "/requests"):
			json.NewEncoder(w).Encode([]map[string]any{{"kind": "request", "time": "2026-11-24T00:00:00Z", "sandbox": "default",
				"source": "agent\u2028", "method": "GET", "url": hostile, "verdict": "deny", "rule": "x\x1b[31m"}})
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("t"), 0o600)
	for _, args := range [][]string{
		{"pending", "default"},
		{"pending", "default", "--json"},
		{"log", "default"},
		{"log", "default", "--json"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var out bytes.Buffer
			stdout, stderr, jsonOut = terminalWriter{&out}, terminalWriter{&out}, &out
			defer func() { stdout, stderr, jsonOut = terminalWriter{os.Stdout}, terminalWriter{os.Stderr}, os.Stdout }()
			code := run(append(args, "--api", srv.URL, "--token-file", token))
			got := out.String()
			if code != 0 {
				t.Fatalf("exit %d: %s", code, got)
			}
			for i, r := range got {
				if r != '\n' && r != '\t' && visible.Unsafe(r) || r == utf8.RuneError {
					t.Fatalf("raw %U at %d in:\n%q", r, i, got)
				}
			}
			if strings.Contains(got, "\nDENIED") {
				t.Errorf("a member forged a line:\n%s", got)
			}
			if strings.Contains(strings.Join(args, " "), "json") {
				for _, line := range strings.Split(strings.TrimSpace(got), "\n") {
					if strings.HasPrefix(args[0], "log") && !json.Valid([]byte(line)) {
						t.Errorf("not JSON: %q", line)
					}
				}
				if args[0] == "pending" && !json.Valid(out.Bytes()) {
					t.Errorf("not JSON: %q", got)
				}
				if !strings.Contains(got, `\u202e`) {
					t.Errorf("the JSON lacks the escaped override: %s", got)
				}
				return
			}
			if !strings.Contains(got, `\x1b[2J`) || !strings.Contains(got, `\u{2028}`) || !strings.Contains(got, `\u{202e}`) {
				t.Errorf("the escapes are not shown:\n%s", got)
			}
		})
	}
}

// TestJSONIsTheAPIs: --json prints the API's own JSON, keys and all, not
// the CLI's Go field names.
func TestJSONIsTheAPIs(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/approvals"):
			io.WriteString(w, `[{"id":"abc","sandbox":"default","source":"agent","sources":["agent"],"host":"x.test","port":443,"url":"x.test:443","created":"2026-11-24T00:00:00Z","seconds_left":20,"waiting":1,"suggestions":[{"pattern":"x.test","label":"only x.test"}],"llm":false}]`)
		case strings.HasSuffix(r.URL.Path, "/sandboxes"):
			io.WriteString(w, `[{"name":"default","subnet":"10.88.0.0/24","policy":"/p.yaml","enabled":true,"unknown_action":"ask","approval_timeout":30,"inspect":"needed","rules":1,"pending":1,"mcp_servers":[]}]`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("t"), 0o600)
	for _, tc := range []struct {
		args []string
		keys []string
	}{
		{[]string{"pending", "default", "--json"}, []string{"id", "sandbox", "source", "url", "seconds_left", "suggestions", "waiting"}},
		{[]string{"ls", "--json"}, []string{"name", "subnet", "policy", "unknown_action", "rules", "pending"}},
	} {
		var out bytes.Buffer
		stdout, jsonOut = terminalWriter{&out}, &out
		code := run(append(tc.args, "--api", srv.URL, "--token-file", token))
		stdout, jsonOut = terminalWriter{os.Stdout}, os.Stdout
		var got []map[string]any
		if err := json.Unmarshal(out.Bytes(), &got); code != 0 || err != nil || len(got) != 1 {
			t.Fatalf("%v: exit %d, %v: %s", tc.args, code, err, out.String())
		}
		for _, k := range tc.keys {
			if _, ok := got[0][k]; !ok {
				t.Errorf("%v: no %q in %s", tc.args, k, out.String())
			}
		}
		for k := range got[0] {
			if strings.ToLower(k) != k {
				t.Errorf("%v: key %q is not the API's", tc.args, k)
			}
		}
	}
}

// TestApproveByKind: airlock approve sends the action an approval's kind
// takes (allow for a port or resources request, allow_once for held
// traffic, allow_pattern with --pattern), refuses what does not apply, and
// airlock pending shows the kind, what is asked and the member's reason.
func TestApproveByKind(t *testing.T) {
	var mu sync.Mutex
	var posted []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == "POST":
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			posted = append(posted, r.URL.Path+" "+strings.TrimSpace(string(b)))
			mu.Unlock()
			io.WriteString(w, `{"decided":"x","action":"y"}`)
		case strings.HasSuffix(r.URL.Path, "/approvals"):
			io.WriteString(w, `[
{"id":"held","source":"agent","host":"x.test","port":443,"url":"x.test:443","kind":"network","actions":["deny","allow_once","allow_pattern"],"suggestions":[{"pattern":"x.test"}]},
{"id":"port","source":"agent","port":8080,"url":"","kind":"port","requested":true,"reason":"preview \u001b[2J","actions":["deny","allow"],"suggestions":[]},
{"id":"res","source":"agent","url":"","kind":"resources","requested":true,"memory_mb":2048,"cpus":1.5,"reason":"build","actions":["deny","allow"],"suggestions":[]},
{"id":"net","source":"agent","host":"pypi.org","port":443,"url":"https://pypi.org/","kind":"network","requested":true,"reason":"pip","actions":["deny","allow_pattern"],"suggestions":[{"pattern":"pypi.org"}]}]`)
		case strings.HasSuffix(r.URL.Path, "/sandboxes"):
			io.WriteString(w, `[{"name":"default"}]`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("t"), 0o600)
	cli := func(args ...string) (string, int) {
		var out bytes.Buffer
		stdout, stderr = terminalWriter{&out}, terminalWriter{&out}
		defer func() { stdout, stderr = terminalWriter{os.Stdout}, terminalWriter{os.Stderr} }()
		code := run(append(args, "--api", srv.URL, "--token-file", token))
		return out.String(), code
	}
	out, code := cli("pending")
	for _, want := range []string{"KIND", "REASON", "port             agent   port 8080", "memory_mb 2048, cpus 1.5", "network request", `preview \x1b[2J`} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("pending lacks %q (exit %d):\n%s", want, code, out)
		}
	}
	tests := []struct {
		args []string
		post string // the body sent, or "" for none
		err  string // in the output when it fails
	}{
		{args: []string{"approve", "held"}, post: `{"action":"allow_once","pattern":"","persist":false,"force":false}`},
		{args: []string{"approve", "port"}, post: `{"action":"allow","pattern":"","persist":false,"force":false}`},
		{args: []string{"approve", "res"}, post: `{"action":"allow","pattern":"","persist":false,"force":false}`},
		{args: []string{"approve", "port", "--pattern", "x.test"}, err: "without --pattern"},
		{args: []string{"reject", "port", "--save"}, err: "--save applies to network approvals"},
		{args: []string{"reject", "port"}, post: `{"action":"deny","pattern":"","persist":false,"force":false}`},
		{args: []string{"approve", "net"}, err: "approve it with --pattern P (suggested: pypi.org)"},
		{args: []string{"approve", "net", "--pattern", "pypi.org"}, post: `{"action":"allow_pattern","pattern":"pypi.org","persist":false,"force":false}`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			mu.Lock()
			posted = nil
			mu.Unlock()
			out, code := cli(tt.args...)
			mu.Lock()
			defer mu.Unlock()
			if tt.err != "" {
				if code == 0 || !strings.Contains(out, tt.err) || len(posted) != 0 {
					t.Errorf("exit %d, posted %v: %s; want a refusal saying %q", code, posted, out, tt.err)
				}
				return
			}
			if code != 0 || len(posted) != 1 || !strings.HasSuffix(posted[0], " "+tt.post) || !strings.Contains(posted[0], "/approvals/"+tt.args[1]) {
				t.Errorf("exit %d, posted %v: %s; want %s", code, posted, out, tt.post)
			}
		})
	}
}

// openPTY returns the terminal end of a new pseudo-terminal, and its
// other end, which reads what is written to it.
func openPTY(t *testing.T) (tty, ptm *os.File) {
	t.Helper()
	// Not blocking, so that reads of it take a deadline.
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	ptm = os.NewFile(uintptr(fd), "/dev/ptmx")
	t.Cleanup(func() { ptm.Close() })
	if err := unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	return tty, ptm
}

// TestDockerCpToATerminal: `airlock docker cp … -` writes the archive's
// raw bytes, the member's among them, to a file or a pipe, but refuses a
// terminal, which would act on the escapes they hold.
func TestDockerCpToATerminal(t *testing.T) {
	// Incompressible bytes are stored by gzip as they are.
	payload := []byte("\x1b]52;c;ZXZpbA==\a\x1b[2J")
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.NoCompression)
	zw.Write(payload)
	zw.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/gzip")
		w.Write(gz.Bytes())
	}))
	defer srv.Close()
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("t"), 0o600)
	tty, ptm := openPTY(t)
	pipeR, pipeW, _ := os.Pipe()
	defer pipeR.Close()
	for _, tc := range []struct {
		name string
		out  *os.File
		code int
	}{
		{"a terminal", tty, 2},
		{"a pipe", pipeW, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var msgs bytes.Buffer
			rawOut, stdout, stderr = tc.out, terminalWriter{&msgs}, terminalWriter{&msgs}
			defer func() { rawOut, stdout, stderr = os.Stdout, terminalWriter{os.Stdout}, terminalWriter{os.Stderr} }()
			code := run([]string{"docker", "cp", "--api", srv.URL, "--token-file", token, "default", "abc:/workspace/dist", "-"})
			if code != tc.code {
				t.Errorf("exit %d, want %d: %s", code, tc.code, msgs.String())
			}
			if said := strings.Contains(msgs.String(), "output is a terminal"); said != (tc.code == 2) {
				t.Errorf("said %q", msgs.String())
			}
		})
	}
	pipeW.Close()
	if b, _ := io.ReadAll(pipeR); !bytes.Equal(b, gz.Bytes()) {
		t.Errorf("the pipe got %q, want the archive", b)
	}
	if err := ptm.SetReadDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(ptm); bytes.Contains(b, []byte("\x1b")) {
		t.Errorf("the terminal got %q", b)
	}
}

// TestHARIsEscaped: `airlock har` prints the API's HAR with a member's
// bidi controls and separators escaped, as --json prints, and the same
// JSON.
func TestHARIsEscaped(t *testing.T) {
	har := map[string]any{"log": map[string]any{"entries": []map[string]any{{"request": map[string]any{"url": hostile}}}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(har)
	}))
	defer srv.Close()
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("t"), 0o600)
	var out bytes.Buffer
	jsonOut = &out
	defer func() { jsonOut = os.Stdout }()
	if code := run([]string{"har", "default", "--api", srv.URL, "--token-file", token}); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	for i, r := range out.String() {
		if r != '\n' && r != '\t' && visible.Unsafe(r) || r == utf8.RuneError {
			t.Fatalf("raw %U at %d in:\n%q", r, i, out.String())
		}
	}
	var got map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(har)
	back, _ := json.Marshal(got)
	if string(back) != string(want) {
		t.Errorf("the HAR changed:\n%s\nwant\n%s", back, want)
	}
}
