package ui

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

// fakeOutput is a Docker Engine's members for the archive and logs routes:
// member "abc" has a workspace, "gone" is no member of the sandbox.
type fakeOutput struct {
	fakeContainers
	mu       sync.Mutex
	archived []string // the paths Archive was asked for
	tarball  []byte   // what Archive returns
	lines    []LogLine
	query    LogQuery
	block    bool // Logs waits for ctx after its lines (follow)
}

func (f *fakeOutput) Archive(ctx context.Context, sb, id, p string) (io.ReadCloser, error) {
	f.mu.Lock()
	f.archived = append(f.archived, p)
	f.mu.Unlock()
	if id != "abc" {
		return nil, &ManagerError{Msg: "container " + id + " is not in sandbox " + sb, NotFound: true}
	}
	return io.NopCloser(bytes.NewReader(f.tarball)), nil
}

func (f *fakeOutput) Logs(ctx context.Context, sb, id string, q LogQuery, ready func() error, line func(LogLine) error) error {
	f.mu.Lock()
	f.query = q
	f.mu.Unlock()
	if id != "abc" {
		return &ManagerError{Msg: "container " + id + " is not in sandbox " + sb, NotFound: true}
	}
	if err := ready(); err != nil {
		return err
	}
	for _, l := range f.lines {
		if err := line(l); err != nil {
			return err
		}
	}
	if f.block {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

type tarEntry struct {
	Type     byte
	Name     string
	Linkname string
	Mode     int64
	Body     string
}

func makeTar(t testing.TB, entries []tarEntry, extra func(*tar.Header)) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Typeflag: e.Type, Name: e.Name, Linkname: e.Linkname, Mode: e.Mode, Size: int64(len(e.Body)),
			Uid: 1000, Gid: 1000, Uname: "agent", ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if e.Type != tar.TypeReg {
			h.Size = 0
		}
		if extra != nil {
			extra(h)
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.Body)
	}
	tw.Close()
	return b.Bytes()
}

// readArchive un-gzips and lists a downloaded archive.
func readArchive(body []byte) ([]tarEntry, error) {
	gz, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	var out []tarEntry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if h.Uid != 0 || h.Uname != "" {
			return out, errors.New("owner passed on: " + h.Name)
		}
		for k := range h.PAXRecords {
			// The writer's own, for a long name; nothing of the source's.
			if k != "path" && k != "linkpath" {
				return out, fmt.Errorf("PAX record %s passed on: %s", k, h.Name)
			}
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return out, err
		}
		out = append(out, tarEntry{h.Typeflag, h.Name, h.Linkname, h.Mode, string(b)})
	}
}

// noLeaks checks, after the test's server is closed, that no goroutine
// the test started is left.
func noLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		goleak.VerifyNone(t, opt)
	})
}

func outputAPI(t *testing.T) (*apiHarness, *fakeOutput) {
	t.Helper()
	h := newAPI(t, "")
	f := &fakeOutput{}
	h.srv.cfg.Containers = f
	h.reroute()
	return h, f
}

func TestArchivePathRules(t *testing.T) {
	h, f := outputAPI(t)
	for _, bad := range []string{
		"", "/etc", "/", "/workspace/../etc", "/workspace/./x", "workspace/x", "/workspacefoo", "/workspace/", "/workspace//x",
		"/workspace/x/..", "/workspace/x/../../etc", "/workspace/a\x00b", "/workspace/a\nb", "/workspace/\x7f", "/workspace/\xff",
		"/./workspace", "//workspace", "/workspace/" + strings.Repeat("a", 4100),
	} {
		code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/containers/abc/archive?path="+queryEscape(bad), "")
		if code != 400 || !strings.Contains(body, "workspace") && !strings.Contains(body, "path") {
			t.Errorf("path %q: %d %s, want 400", bad, code, body)
		}
	}
	for _, q := range []string{"", "?path=/workspace/a&path=/workspace/b", "?p=/workspace"} {
		if code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/containers/abc/archive"+q, ""); code != 400 {
			t.Errorf("query %q: %d %s, want 400", q, code, body)
		}
	}
	if len(f.archived) != 0 {
		t.Fatalf("refused paths were read: %q", f.archived)
	}
	for _, good := range []string{"/workspace", "/workspace/dist", "/workspace/a b/ü.txt", "/workspace/.hidden", "/workspace/...x"} {
		if err := CheckWorkspacePath(good); err != nil {
			t.Errorf("CheckWorkspacePath(%q) = %v, want accepted", good, err)
		}
	}
}

func queryEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("/-_.~", c) >= 0 {
			b.WriteByte(c)
		} else {
			b.WriteString("%" + strings.ToUpper(string("0123456789abcdef"[c>>4])+string("0123456789abcdef"[c&15])))
		}
	}
	return b.String()
}

// TestArchiveDownload: the archive comes as gzip with a safe file name;
// directories, files and links keep their names, targets and permission
// bits; devices and pipes, set-id bits, owners and PAX records do not
// come along.
func TestArchiveDownload(t *testing.T) {
	noLeaks(t)
	h, f := outputAPI(t)
	f.tarball = makeTar(t, []tarEntry{
		{tar.TypeDir, "dist/", "", 0o755, ""},
		{tar.TypeReg, "dist/app", "", 0o4755, "binary"},
		{tar.TypeReg, "dist/notes.txt", "", 0o644, "hello\n"},
		{tar.TypeSymlink, "dist/latest", "app", 0o777, ""},
		{tar.TypeSymlink, "dist/etc", "/etc", 0o777, ""},
		{tar.TypeLink, "dist/again", "dist/notes.txt", 0o644, ""},
		{tar.TypeReg, "dist/latin1-\xe9t\xe9-" + strings.Repeat("long", 30), "", 0o644, "name not UTF-8"},
		{tar.TypeChar, "dist/null", "", 0o666, ""},
		{tar.TypeFifo, "dist/pipe", "", 0o644, ""},
	}, func(h *tar.Header) { h.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": "x"} })
	resp, err := http.DefaultClient.Do(authed(t, h, "/api/v1/sandboxes/myapp/containers/abc/archive?path=/workspace/dist"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/gzip" || resp.Header.Get("Content-Disposition") != `attachment; filename="dist.tar.gz"` {
		t.Fatalf("archive: %d %v", resp.StatusCode, resp.Header)
	}
	got, err := readArchive(body)
	if err != nil {
		t.Fatal(err)
	}
	want := []tarEntry{
		{tar.TypeDir, "dist/", "", 0o755, ""},
		{tar.TypeReg, "dist/app", "", 0o755, "binary"},
		{tar.TypeReg, "dist/notes.txt", "", 0o644, "hello\n"},
		{tar.TypeSymlink, "dist/latest", "app", 0o777, ""},
		{tar.TypeSymlink, "dist/etc", "/etc", 0o777, ""},
		{tar.TypeLink, "dist/again", "dist/notes.txt", 0o644, ""},
		{tar.TypeReg, "dist/latin1-\xe9t\xe9-" + strings.Repeat("long", 30), "", 0o644, "name not UTF-8"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("archive entries (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"/workspace/dist"}, f.archived); diff != "" {
		t.Errorf("paths read (-want +got):\n%s", diff)
	}
	if code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/containers/gone/archive?path=/workspace", ""); code != 404 {
		t.Errorf("archive of a container of another sandbox: %d %s", code, body)
	}
	for p, name := range map[string]string{"/workspace": "workspace.tar.gz", "/workspace/..x\"y": "xy.tar.gz", "/workspace/;;": "workspace.tar.gz", "/workspace/Build-1.0_a": "Build-1.0_a.tar.gz"} {
		if got := archiveName(p); got != name {
			t.Errorf("archiveName(%q) = %q, want %q", p, got, name)
		}
	}
}

// TestArchiveCutShort: an entry that names something outside the path
// asked for ends the download (without a gzip trailer, or before the
// status), so no client takes it for a whole archive.
func TestArchiveCutShort(t *testing.T) {
	h, f := outputAPI(t)
	for _, name := range []string{"../evil", "/etc/passwd", "other/x", "dist/../../x"} {
		f.tarball = makeTar(t, []tarEntry{{tar.TypeReg, "dist/ok", "", 0o644, "fine"}, {tar.TypeReg, name, "", 0o644, "evil"}}, nil)
		resp, err := http.DefaultClient.Do(authed(t, h, "/api/v1/sandboxes/myapp/containers/abc/archive?path=/workspace/dist"))
		if err != nil {
			continue // cut before the status was sent: nothing to take
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got, err := readArchive(body)
		if err == nil {
			t.Errorf("entry %q: the archive read as whole: %+v", name, got)
		}
		for _, e := range got {
			if e.Body == "evil" {
				t.Errorf("entry %q came through", name)
			}
		}
	}
}

func authed(t *testing.T, h *apiHarness, path string) *http.Request {
	t.Helper()
	req, err := http.NewRequest("GET", h.ts.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+h.srv.Token())
	return req
}

// sseEvent is one server-sent event as a client parses it.
type sseEvent struct{ Event, Data string }

func readEvents(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case l == "":
			if cur != (sseEvent{}) {
				out = append(out, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(l, "event: "):
			cur.Event = l[len("event: "):]
		case strings.HasPrefix(l, "data: "):
			if cur.Data != "" {
				t.Errorf("an event with two data lines: %q", l)
			}
			cur.Data = l[len("data: "):]
		case strings.HasPrefix(l, ":"):
		default:
			t.Errorf("stray line in the stream: %q", l)
		}
	}
	return out
}

// TestLogsAsEvents: each line is one event named by its stream; what a
// member printed, control characters and all, arrives as JSON and reads
// back as it was, never as a line of the stream of its own; the stream
// ends with "end".
func TestLogsAsEvents(t *testing.T) {
	h, f := outputAPI(t)
	f.lines = []LogLine{
		{Stream: "stdout", Line: "building"},
		{Stream: "stderr", Line: "warn: x\r\ndata: forged\n\nevent: end"},
		{Stream: "stdout", Line: "</script><b>\u2028\x1b[31m", Partial: true},
		{Stream: "stdout", Line: "rest"},
	}
	resp, err := http.DefaultClient.Do(authed(t, h, "/api/v1/sandboxes/myapp/containers/abc/logs"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("logs: %d %v", resp.StatusCode, resp.Header)
	}
	events := readEvents(t, resp.Body)
	resp.Body.Close()
	var got []LogLine
	for i, e := range events {
		if i == len(events)-1 {
			if e.Event != "end" || e.Data != "{}" {
				t.Errorf("last event %+v, want end", e)
			}
			break
		}
		var l LogLine
		if err := json.Unmarshal([]byte(e.Data), &l); err != nil || l.Stream != e.Event {
			t.Errorf("event %+v: %v", e, err)
		}
		if strings.ContainsFunc(e.Data, func(r rune) bool { return r == '\u2028' || unicode.IsControl(r) }) {
			t.Errorf("event data holds a raw control or separator character: %q", e.Data)
		}
		got = append(got, l)
	}
	if diff := cmp.Diff(f.lines, got); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	if f.query != (LogQuery{Tail: DefaultLogTail}) {
		t.Errorf("query %+v, want the default tail without follow", f.query)
	}
	if code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/containers/gone/logs", ""); code != 404 || !strings.Contains(body, "not in sandbox") {
		t.Errorf("logs of a container of another sandbox: %d %s", code, body)
	}
	for _, q := range []string{"follow=yes", "tail=0", "tail=-1", "tail=x", "tail=2000000"} {
		if code, body := h.do(t, "GET", "/api/v1/sandboxes/myapp/containers/abc/logs?"+q, ""); code != 400 {
			t.Errorf("logs?%s: %d %s, want 400", q, code, body)
		}
	}
	h.do(t, "GET", "/api/v1/sandboxes/myapp/containers/abc/logs?follow=1&tail=all", "")
	if f.query != (LogQuery{Follow: true}) {
		t.Errorf("follow=1&tail=all read as %+v", f.query)
	}
}

// TestLogsFollowEndsWithTheClient: a followed log streams until the
// client goes; then the handler and its pings are gone.
func TestLogsFollowEndsWithTheClient(t *testing.T) {
	noLeaks(t)
	h, f := outputAPI(t)
	f.lines = []LogLine{{Stream: "stdout", Line: "first"}}
	f.block = true
	ctx, cancel := context.WithCancel(context.Background())
	req := authed(t, h, "/api/v1/sandboxes/myapp/containers/abc/logs?follow=1").WithContext(ctx)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before the first line: %v", err)
		}
		if strings.Contains(l, `"line":"first"`) {
			break
		}
	}
	cancel()
	resp.Body.Close()
}

// FuzzCheckWorkspacePath: a path it accepts is plainly /workspace or
// below it, with nothing a shell, a terminal or a path resolver would read
// another way.
func FuzzCheckWorkspacePath(f *testing.F) {
	for _, s := range []string{"/workspace", "/workspace/dist", "/workspace/../etc", "/workspace/./x", "workspace/x", "/workspacefoo", "/workspace/a\x00", "/workspace/\u202e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if CheckWorkspacePath(p) != nil {
			return
		}
		if path.Clean(p) != p || p != "/workspace" && !strings.HasPrefix(p, "/workspace/") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") ||
			strings.ContainsFunc(p, unicode.IsControl) || len(p) > maxArchivePath {
			t.Errorf("CheckWorkspacePath(%q) accepted it", p)
		}
	})
}
