// Package session runs the tasks an agent platform hands airlockd (over
// MCP or the REST API), each session a member of a sandbox of its own
// ("session:ID") with a workspace directory on the host mounted at
// /workspace: the session table, per-user ownership, busy and idle states,
// max_sessions, the idle clean-up and task timeouts, and the workspace's
// safety (uploads and reads resolved inside it with os.Root, size caps,
// the files a task created). How a task runs is a Runner's: a hardened
// Docker member, or an `airlock run`-style member without Docker.
package session

import (
	"fmt"
	"time"
)

// Bounds of requests and answers.
const (
	// MaxOutput is how much of a task's standard output and error an answer
	// carries: the last 64 KiB.
	MaxOutput = 64 << 10
	// MaxUploadFile and MaxUploadTotal cap the files of one execute_task
	// (decoded bytes).
	MaxUploadFile  = 1 << 20
	MaxUploadTotal = 4 << 20
	// MaxReadFile and MaxReadTotal cap the files of one get_files.
	MaxReadFile  = 1 << 20
	MaxReadTotal = 4 << 20
	// MaxFiles caps the files of one upload or one read.
	MaxFiles = 100
	// MaxTask caps a task's text.
	MaxTask = 64 << 10
	// MaxFilesCreated caps the files_created list of an answer.
	MaxFilesCreated = 1000
	// maxSnapshot caps the entries (of any kind) a workspace snapshot
	// visits, and maxDepth how deep it goes; maxHashed is the largest file
	// whose content is hashed and maxHashedTotal the bytes one snapshot
	// hashes (other files compare by size and time).
	maxSnapshot    = 20000
	maxDepth       = 64
	maxHashed      = 16 << 20
	maxHashedTotal = 256 << 20
	maxUserID      = 128
	maxHosts       = 100 // of a Network
	maxPath        = 1024
)

// Task statuses.
const (
	StatusCompleted = "completed"
	StatusFailed    = "failed"
	StatusTimeout   = "timeout"
)

// UploadFile is a file an execute_task puts in the workspace first.
type UploadFile struct {
	Path    string `json:"path" jsonschema:"path relative to /workspace, without .. segments"`
	Content string `json:"content" jsonschema:"the file's content, base64 (standard alphabet, padded)"`
}

// ExecuteRequest is execute_task's input.
type ExecuteRequest struct {
	Task      string       `json:"task" jsonschema:"what the agent is to do; also in AIRLOCK_TASK and on its standard input"`
	UserID    string       `json:"user_id" jsonschema:"the platform's user; a session belongs to the user that made it"`
	SessionID string       `json:"session_id,omitempty" jsonschema:"run in this session of the same user; empty starts a new session"`
	Files     []UploadFile `json:"files,omitempty" jsonschema:"files written into /workspace before the task (at most 100, 1 MiB each, 4 MiB in all)"`
	Timeout   int          `json:"timeout,omitempty" jsonschema:"seconds the task may run, 1 to 3600; default the policy file's sessions.timeout"`
}

// Network sums up what a session's member did on the network during a
// task, from the sandbox's records.
type Network struct {
	Allowed int      `json:"allowed" jsonschema:"connections and requests let through"`
	Denied  int      `json:"denied" jsonschema:"connections, requests and DNS queries refused"`
	Held    int      `json:"held" jsonschema:"requests held for a person to approve"`
	Hosts   []string `json:"hosts" jsonschema:"the hosts it asked for (at most 100)"`
}

// ExecuteResult is execute_task's answer.
type ExecuteResult struct {
	SessionID       string   `json:"session_id"`
	Status          string   `json:"status" jsonschema:"completed, failed or timeout"`
	Output          string   `json:"output" jsonschema:"standard output and error, the last 64 KiB"`
	FilesCreated    []string `json:"files_created" jsonschema:"files under /workspace the task created or changed (at most 1000)"`
	DurationSeconds float64  `json:"duration_seconds"`
	Error           string   `json:"error" jsonschema:"why the task failed, or empty"`
	Network         Network  `json:"network"`
}

// FilesRequest is get_files's input.
type FilesRequest struct {
	SessionID string   `json:"session_id"`
	Paths     []string `json:"paths" jsonschema:"paths relative to /workspace (at most 100; 1 MiB each, 4 MiB in all)"`
	UserID    string   `json:"user_id,omitempty" jsonschema:"when given, the session must be this user's"`
}

// FileContent is one file get_files returns.
type FileContent struct {
	Path      string `json:"path"`
	Content   string `json:"content" jsonschema:"base64"`
	SizeBytes int64  `json:"size_bytes"`
	MimeType  string `json:"mime_type"`
}

// FilesResult is get_files's answer.
type FilesResult struct {
	Files []FileContent `json:"files"`
}

// CleanupRequest is cleanup_session's input.
type CleanupRequest struct {
	SessionID string `json:"session_id"`
	UserID    string `json:"user_id,omitempty" jsonschema:"when given, the session must be this user's"`
}

// CleanupResult is cleanup_session's answer.
type CleanupResult struct {
	SessionID string `json:"session_id"`
	Removed   bool   `json:"removed"`
}

// ListRequest is list_sessions's input.
type ListRequest struct {
	UserID string `json:"user_id,omitempty" jsonschema:"only this user's sessions; empty lists all"`
}

// Info is a session as list_sessions shows it.
type Info struct {
	SessionID   string    `json:"session_id"`
	UserID      string    `json:"user_id"`
	Member      string    `json:"member" jsonschema:"the name records and approvals give it: session:ID"`
	Status      string    `json:"status" jsonschema:"idle or busy"`
	Created     time.Time `json:"created"`
	LastUsed    time.Time `json:"last_used"`
	AgeSeconds  float64   `json:"age_seconds"`
	IdleSeconds float64   `json:"idle_seconds"`
	Tasks       int       `json:"tasks"`
	LastStatus  string    `json:"last_status,omitempty" jsonschema:"how its last task ended"`
	// LastDuration and FilesCreated are of the last task; Network sums up
	// all of its tasks.
	LastDuration float64  `json:"last_duration_seconds" jsonschema:"how long its last task ran"`
	FilesCreated []string `json:"files_created" jsonschema:"files its last task created or changed (at most 1000)"`
	Network      Network  `json:"network" jsonschema:"what all of its tasks did on the network; hosts at most 100"`
}

// ListResult is list_sessions's answer.
type ListResult struct {
	Sessions []Info `json:"sessions"`
}

// Kind says what was wrong with a refused request.
type Kind int

const (
	BadInput    Kind = iota + 1 // the request itself: a path, base64, a size, a timeout
	NotFound                    // no such session
	OtherUser                   // the session is another user's
	Busy                        // the session runs a task
	Full                        // max_sessions reached
	Unavailable                 // the sandbox runs no sessions
)

// Error is a refused request. Nothing changed.
type Error struct {
	Kind Kind
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

func errorf(k Kind, format string, args ...any) error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...)}
}
