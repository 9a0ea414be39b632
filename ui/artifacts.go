package ui

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
)

// MemberOutput reads a Docker member's files and output: what an agent
// built in its workspace, and what it printed. Containers that also
// implement it get the archive and logs routes. Its errors are
// *ManagerError where the request was at fault.
type MemberOutput interface {
	// Archive returns a tar stream of path, which CheckWorkspacePath
	// accepted, from member id of the sandbox, as `docker cp` reads it
	// (symbolic links stored as links). The caller closes it.
	Archive(ctx context.Context, sandbox, id, path string) (io.ReadCloser, error)
	// Logs finds member id of the sandbox and opens its output, calls
	// ready, then line for each line of it until the output ends (with
	// Follow: until the member ends), ctx ends, or ready or line return
	// an error. An error before ready means nothing was read.
	Logs(ctx context.Context, sandbox, id string, q LogQuery, ready func() error, line func(LogLine) error) error
}

// LogQuery says which of a member's output to read.
type LogQuery struct {
	Follow bool // go on with new output until the member ends
	Tail   int  // the last this many lines to start with; 0 means all
}

// LogLine is one line of a member's output, without its line break. A
// line longer than MaxLogLine bytes comes in pieces, each but the last
// Partial.
type LogLine struct {
	Stream  string `json:"stream"` // stdout or stderr
	Line    string `json:"line"`
	Partial bool   `json:"partial,omitempty"`
}

// Bounds of the logs route.
const (
	MaxLogLine     = 16 << 10 // bytes of a line in one event
	DefaultLogTail = 10000    // lines, when the request names none
	maxLogTail     = 1000000
	maxArchivePath = 4096 // bytes
)

// CheckWorkspacePath accepts the path of an archive: absolute,
// /workspace or below it, written the one way path.Clean writes it (no
// "." or ".." segments, no doubled or trailing slash), UTF-8 without
// control characters, at most 4096 bytes. It refuses rather than
// normalises: what is read is exactly what was asked for.
func CheckWorkspacePath(p string) error {
	switch {
	case p == "":
		return errors.New("path is required: name a file or directory under /workspace, such as /workspace/dist")
	case len(p) > maxArchivePath:
		return fmt.Errorf("path is longer than %d bytes", maxArchivePath)
	case !utf8.ValidString(p):
		return errors.New("path is not UTF-8")
	case strings.ContainsFunc(p, unicode.IsControl):
		return errors.New("path holds a control character")
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is not absolute: write /workspace/…", p)
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return fmt.Errorf("path %q has a .. segment: archives are read only under /workspace", p)
		}
	}
	if c := path.Clean(p); c != p {
		return fmt.Errorf("path %q is not in its plain form: write %q", p, c)
	}
	if p != "/workspace" && !strings.HasPrefix(p, "/workspace/") {
		return fmt.Errorf("path %q is outside /workspace: archives are read only under /workspace", p)
	}
	return nil
}

func (s *Server) memberOutput() (MemberOutput, error) {
	cs, err := s.containers()
	if err != nil {
		return nil, err
	}
	mo, ok := cs.(MemberOutput)
	if !ok {
		return nil, fail(http.StatusServiceUnavailable, "this airlockd cannot read members' files or output", "")
	}
	return mo, nil
}

// containerArchive streams a tar.gz of a path under the member's
// /workspace. The path is checked before anything is read.
func (s *Server) containerArchive(c echo.Context) error {
	mo, err := s.memberOutput()
	if err != nil {
		return err
	}
	paths := c.QueryParams()["path"]
	if len(paths) > 1 {
		return fail(http.StatusBadRequest, "path is given more than once", "name one path, such as ?path=/workspace/dist")
	}
	p := ""
	if len(paths) == 1 {
		p = paths[0]
	}
	if err := CheckWorkspacePath(p); err != nil {
		return fail(http.StatusBadRequest, err.Error(), "archives are read from a member's /workspace: ?path=/workspace/dist")
	}
	ctx := c.Request().Context()
	rc, err := mo.Archive(ctx, sandboxOf(c).Name(), c.Param("id"), p)
	if err != nil {
		return managerError(err)
	}
	defer rc.Close()
	w := c.Response()
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Disposition", `attachment; filename="`+archiveName(p)+`"`)
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
	err = copyArchive(gz, rc, path.Base(p))
	if err == nil {
		err = gz.Close()
	}
	if err != nil {
		// The status is out already: cut the response short, so that the
		// client's gzip reader fails rather than take a truncated archive
		// for a whole one.
		if ctx.Err() == nil {
			s.log.Warn("archive cut short", "sandbox", sandboxOf(c).Name(), "container", c.Param("id"), "path", p, "err", err)
		}
		panic(http.ErrAbortHandler)
	}
	return nil
}

// archiveName is the download's file name: the path's last element,
// letters, digits, '.', '_' and '-' only, then ".tar.gz".
func archiveName(p string) string {
	name := strings.TrimLeft(strings.Map(func(r rune) rune {
		if r < 0x80 && (unicode.IsLetter(r) || unicode.IsDigit(r) || r == '.' || r == '_' || r == '-') {
			return r
		}
		return -1
	}, path.Base(p)), ".")
	if name == "" {
		name = "workspace"
	}
	return name + ".tar.gz"
}

// copyArchive copies the engine's tar stream into a fresh one: every
// entry must be named under base, plainly (no "..", not absolute); only
// directories, regular files and links are kept (no devices or pipes),
// with their permission bits (no set-id bits), size, time and link target,
// and nothing else (no owners, extended attributes or PAX records).
func copyArchive(dst io.Writer, src io.Reader, base string) error {
	tr, tw := tar.NewReader(src), tar.NewWriter(dst)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return tw.Close()
		}
		if err != nil {
			return fmt.Errorf("read the member's archive: %w", err)
		}
		switch h.Typeflag {
		case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
		default:
			continue
		}
		if !underBase(h.Name, base) || h.Typeflag == tar.TypeLink && !underBase(h.Linkname, base) {
			return fmt.Errorf("the member's archive holds an entry outside %s: %q", base, h.Name)
		}
		// The writer picks the format the names and times need.
		out := &tar.Header{Typeflag: h.Typeflag, Name: h.Name, Linkname: h.Linkname, Mode: h.Mode & 0o777, ModTime: h.ModTime}
		if h.Typeflag == tar.TypeReg {
			out.Size = h.Size
		}
		if err := tw.WriteHeader(out); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return err
			}
		}
	}
}

// underBase reports whether a tar entry's name is base or below it,
// written plainly.
func underBase(name, base string) bool {
	name = strings.TrimSuffix(name, "/")
	if name == "" || path.IsAbs(name) || path.Clean(name) != name {
		return false
	}
	first, _, _ := strings.Cut(name, "/")
	return first == base && !strings.Contains("/"+name+"/", "/../")
}

// containerLogs streams a member's output as server-sent events: one
// event per line, named by its stream (stdout, stderr), its data a
// LogLine as JSON (which escapes every control character), and a last
// "end" event when the output ends, so that an EventSource does not
// reconnect and read it all again.
func (s *Server) containerLogs(c echo.Context) error {
	mo, err := s.memberOutput()
	if err != nil {
		return err
	}
	q, err := logQueryOf(c)
	if err != nil {
		return err
	}
	w := c.Response()
	var mu sync.Mutex // guards writes to w
	write := func(format string, args ...any) error {
		mu.Lock()
		defer mu.Unlock()
		if _, err := fmt.Fprintf(w, format, args...); err != nil {
			return err
		}
		w.Flush()
		return nil
	}
	stop := make(chan struct{})
	var pings sync.WaitGroup
	ready := func() error {
		// Before the pings start: nothing else writes yet.
		if err := openEventStream(w, "airlock logs"); err != nil {
			return err
		}
		pings.Go(func() {
			t := time.NewTicker(eventPing)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					write(": ping\n\n")
				}
			}
		})
		return nil
	}
	err = mo.Logs(c.Request().Context(), sandboxOf(c).Name(), c.Param("id"), q, ready, func(l LogLine) error {
		b, _ := json.Marshal(l)
		return write("event: %s\ndata: %s\n\n", l.Stream, b)
	})
	close(stop)
	pings.Wait()
	if !w.Committed {
		if err == nil {
			err = errors.New("the member's output could not be opened")
		}
		return managerError(err)
	}
	if c.Request().Context().Err() != nil {
		return nil
	}
	end := map[string]string{}
	if err != nil {
		end["error"] = err.Error()
	}
	b, _ := json.Marshal(end)
	write("event: end\ndata: %s\n\n", b)
	return nil
}

// logQueryOf reads follow (1, true, 0 or false) and tail (a number of
// lines, or all).
func logQueryOf(c echo.Context) (LogQuery, error) {
	q := LogQuery{Tail: DefaultLogTail}
	switch v := c.QueryParam("follow"); v {
	case "", "0", "false":
	case "1", "true":
		q.Follow = true
	default:
		return q, fail(http.StatusBadRequest, fmt.Sprintf("follow=%s: want 1 or 0", truncate(v, 20)), "")
	}
	switch v := c.QueryParam("tail"); v {
	case "":
	case "all":
		q.Tail = 0
	default:
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLogTail {
			return q, fail(http.StatusBadRequest, fmt.Sprintf("tail=%s: want a number of lines from 1 to %d, or all", truncate(v, 20), maxLogTail), "")
		}
		q.Tail = n
	}
	return q, nil
}
