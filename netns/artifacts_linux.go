package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/errdefs"
	"github.com/docker/docker/pkg/stdcopy"
)

// ErrOutsideWorkspace refuses an archive whose path is not plainly under
// ContainerWorkspace inside the container: the caller's path is not, or a
// symbolic link on the way leads elsewhere.
var ErrOutsideWorkspace = errors.New("outside " + ContainerWorkspace)

// maxWorkspaceDepth bounds the directories Archive checks one by one.
const maxWorkspaceDepth = 64

// member inspects container id (an ID, a prefix of one, or a name) and
// returns it when it is a member of the sandbox: on its Docker network, or
// made by airlock for it. Anything else is errdefs.NotFound, as a
// container of another sandbox must look the same as none at all.
func (d *Docker) member(ctx context.Context, sandbox, id string) (container.InspectResponse, error) {
	// An ID or a name, nothing the engine's URL would read as more of
	// the path ("..") or a query.
	if len(id) > containerNameMaxLen || !containerName.MatchString(id) {
		return container.InspectResponse{}, errdefs.NotFound(fmt.Errorf("no container %q: want a container's ID or name", id))
	}
	info, err := d.cli.ContainerInspect(ctx, id)
	if err != nil {
		return info, err
	}
	onNet := false
	if info.NetworkSettings != nil {
		_, onNet = info.NetworkSettings.Networks[DockerNetworkName(sandbox)]
	}
	if !onNet && (info.Config == nil || info.Config.Labels[LabelSandbox] != sandbox) {
		return info, errdefs.NotFound(fmt.Errorf("container %s is not in sandbox %s", id, sandbox))
	}
	return info, nil
}

// Archive returns a tar stream of path, a file or directory under
// ContainerWorkspace, from member id of the sandbox, the way `docker cp`
// reads it: entries named from path's last element down, symbolic links
// stored as links, not followed. path must be clean and absolute, and
// ContainerWorkspace or below it (the API checks it first: ui); every
// directory from ContainerWorkspace down to path's parent must be a
// directory and not a symbolic link, and path itself, when it is a link,
// must resolve inside ContainerWorkspace, else the error wraps
// ErrOutsideWorkspace. A path that is not there is errdefs.NotFound.
//
// The checks and the copy are separate requests to the engine: a member
// that swaps a checked directory for a link in between gets files of its
// own container's root into the archive (never the host's: the engine
// resolves every path inside the container), for a person who may read
// that container anyway.
func (d *Docker) Archive(ctx context.Context, sandbox, id, path string) (io.ReadCloser, error) {
	rel, ok := strings.CutPrefix(path, ContainerWorkspace)
	if !ok || rel != "" && rel[0] != '/' {
		return nil, fmt.Errorf("%s: %w", path, ErrOutsideWorkspace)
	}
	info, err := d.member(ctx, sandbox, id)
	if err != nil {
		return nil, err
	}
	dir := ContainerWorkspace
	parts := strings.Split(strings.TrimPrefix(rel, "/"), "/")
	if rel == "" {
		parts = nil
	}
	if len(parts) > maxWorkspaceDepth {
		return nil, fmt.Errorf("%s is more than %d directories deep", path, maxWorkspaceDepth)
	}
	// The workspace and each directory below it on the way to path.
	for i := 0; i <= len(parts); i++ {
		if i > 0 {
			dir += "/" + parts[i-1]
		}
		st, err := d.cli.ContainerStatPath(ctx, info.ID, dir)
		if err != nil {
			return nil, err
		}
		if i == len(parts) {
			// path itself: a link is archived as a link, but one that
			// leads out of the workspace is refused all the same.
			if st.Mode&os.ModeSymlink != 0 && !inWorkspace(st.LinkTarget) {
				return nil, fmt.Errorf("%s is a symbolic link to %s: %w", path, st.LinkTarget, ErrOutsideWorkspace)
			}
			break
		}
		if st.Mode&os.ModeSymlink != 0 {
			return nil, fmt.Errorf("%s is a symbolic link (to %s): %w", dir, st.LinkTarget, ErrOutsideWorkspace)
		}
		if !st.Mode.IsDir() {
			return nil, errdefs.NotFound(fmt.Errorf("%s is not a directory", dir))
		}
	}
	rc, _, err := d.cli.CopyFromContainer(ctx, info.ID, path)
	return rc, err
}

// inWorkspace reports whether an absolute path inside a container is
// ContainerWorkspace or below it.
func inWorkspace(p string) bool {
	return p == ContainerWorkspace || strings.HasPrefix(p, ContainerWorkspace+"/")
}

// LogOptions say which of a member's output Logs reads.
type LogOptions struct {
	// Follow goes on with new output until the member ends or ctx does.
	Follow bool
	// Tail is how many of the last lines to start with; 0 means all.
	Tail int
	// MaxLine cuts lines longer than this many bytes into pieces; 0 means
	// 16 KiB.
	MaxLine int
}

// Logs reads the output of member id of the sandbox, line by line: ready
// is called once the member is found and its log opened, then line for
// each line of standard output ("stdout") or error ("stderr"), without its
// line break, in pieces of at most MaxLine bytes (partial: the line goes
// on in the next piece). It returns at the end of the log, when ctx ends,
// or with the error line or ready returns. Before ready, a container that
// is not the sandbox's member is errdefs.NotFound.
func (d *Docker) Logs(ctx context.Context, sandbox, id string, o LogOptions, ready func() error, line func(stream string, text []byte, partial bool) error) error {
	info, err := d.member(ctx, sandbox, id)
	if err != nil {
		return err
	}
	tail := "all"
	if o.Tail > 0 {
		tail = fmt.Sprint(o.Tail)
	}
	if o.MaxLine <= 0 {
		o.MaxLine = 16 << 10
	}
	rc, err := d.cli.ContainerLogs(ctx, info.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true, Follow: o.Follow, Tail: tail})
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := ready(); err != nil {
		return err
	}
	writer := func(stream string) *LineWriter {
		return &LineWriter{Max: o.MaxLine, Emit: func(text []byte, partial bool) error { return line(stream, text, partial) }}
	}
	stdout, stderr := writer("stdout"), writer("stderr")
	if info.Config != nil && info.Config.Tty {
		// A terminal's output comes as one stream, not multiplexed.
		_, err = io.Copy(stdout, rc)
	} else {
		_, err = stdcopy.StdCopy(stdout, stderr, rc)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return err
	}
	return errors.Join(stdout.Flush(), stderr.Flush())
}
