// Package sysmon keeps the Go runtime's monitor thread (sysmon) out of its
// deep sleep, for a server whose system calls would otherwise wake it over
// and over.
//
// sysmon sleeps deeply while every processor is idle. The first ordinary
// system call after that wakes it, and it then naps every 20 µs, a bet
// that some call will soon need its processor taken back, until it finds
// every processor idle again. airlockd goes idle many times a second under
// load (between a request and its answer, between connections), and the
// end of every idle moment is a system call: an accept, a socket read, the
// audit journal's write. Those wake-ups and naps were about a tenth of
// airlockd's CPU per intercepted request and a quarter of its thread
// switches per new connection (BENCHMARKS.md's notes). With GODEBUG's
// schedtrace set, the runtime never lets sysmon sleep deeply, so it keeps
// its ordinary schedule: 20 µs naps only after it had to take a processor
// back from a call that waited, and otherwise backing off to one nap every
// 10 ms, idle or busy (about a hundred wake-ups a second of an idle
// airlockd).
//
// GODEBUG is read once, when the program starts, so Setup starts the
// program again in place with the setting. Its price, besides the idle
// wake-ups: schedtrace's trace line ("SCHED ...") is printed to standard
// error every 24.8 days (the longest interval it takes), and at start on a
// host up for longer than that; a fatal error (an unrecovered panic) first
// prints the scheduler's state, a line per goroutine, before its message;
// and the one fatal error the runtime raises while holding its scheduler
// lock (more than 10,000 threads) then hangs instead of exiting, until a
// watchdog kills the process. GODEBUG=schedtrace=0 in the environment keeps
// the runtime's default.
package sysmon

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Setting is the GODEBUG setting Setup adds: schedtrace's longest interval,
// in milliseconds.
const Setting = "schedtrace=2147483647"

// Setup starts the program again (execve of its own file: the same
// process, arguments and name) with Setting added to GODEBUG, unless
// GODEBUG already sets schedtrace. It returns nil when there is nothing to
// do, and the reason when the program could not be started again, which
// then runs on as before, only with the runtime's default.
func Setup() error {
	env, ok := withSetting(os.Environ())
	if !ok {
		return nil
	}
	return syscall.Exec(self(), os.Args, env)
}

// withSetting returns env with Setting added at the end of its GODEBUG,
// which the runtime applies last; only the first GODEBUG entry counts, as
// for the runtime, and the others are dropped. It returns false when that
// GODEBUG sets schedtrace already.
func withSetting(env []string) ([]string, bool) {
	godebug, found := "", false
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			if !found {
				godebug, found = v, true
			}
			continue
		}
		out = append(out, kv)
	}
	if setsSchedtrace(godebug) {
		return env, false
	}
	v := Setting
	if godebug != "" {
		v = godebug + "," + Setting
	}
	return append(out, "GODEBUG="+v), true
}

// setsSchedtrace reports whether the runtime, reading the GODEBUG value
// godebug, sets schedtrace: as it parses, a comma-separated field whose
// key is exactly "schedtrace" and whose value is an int32 (one that is not
// is ignored).
func setsSchedtrace(godebug string) bool {
	for field := range strings.SplitSeq(godebug, ",") {
		if v, ok := strings.CutPrefix(field, "schedtrace="); ok {
			if _, err := strconv.ParseInt(v, 10, 32); err == nil {
				return true
			}
		}
	}
	return false
}

// self is the file to start again: the program's own path, since the
// kernel names a process after the path execve is given (/proc/self/exe
// would make it "exe" for ps, pgrep and the journal), unless that path no
// longer holds this program (replaced or removed since it started); then
// /proc/self/exe, which still does.
func self() string {
	const proc = "/proc/self/exe"
	p, err := os.Executable()
	if err != nil {
		return proc
	}
	var a, b syscall.Stat_t
	if syscall.Stat(p, &a) != nil || syscall.Stat(proc, &b) != nil || a.Dev != b.Dev || a.Ino != b.Ino {
		return proc
	}
	return p
}
