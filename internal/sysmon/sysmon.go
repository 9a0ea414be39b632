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
// program again in place with the setting. Its price: schedtrace's trace
// line ("SCHED ...") is printed to standard error every 24.8 days (the
// longest interval it takes), at start on a host up for longer than that,
// and the runtime dumps the scheduler's state on a fatal error.
// GODEBUG=schedtrace=0 in airlockd's environment keeps the runtime's
// default.
package sysmon

import (
	"os"
	"strings"
	"syscall"
)

// Setting is the GODEBUG setting Setup adds: schedtrace's longest interval,
// in milliseconds.
const Setting = "schedtrace=2147483647"

// Setup starts the program again (execve of /proc/self/exe, the same
// process with the same arguments) with Setting added to GODEBUG, unless
// GODEBUG already sets schedtrace. It returns nil when there is nothing to
// do, and the reason when the program could not be started again, which
// then runs on as before, only with the runtime's default.
func Setup() error {
	godebug, set := os.LookupEnv("GODEBUG")
	if setsSchedtrace(godebug) {
		return nil
	}
	v := Setting
	if set && godebug != "" {
		v = godebug + "," + Setting
	}
	env := os.Environ()
	for i := 0; i < len(env); i++ {
		if strings.HasPrefix(env[i], "GODEBUG=") {
			env = append(env[:i], env[i+1:]...)
			i--
		}
	}
	return syscall.Exec("/proc/self/exe", os.Args, append(env, "GODEBUG="+v))
}

// setsSchedtrace reports whether the GODEBUG value godebug sets
// schedtrace, to anything.
func setsSchedtrace(godebug string) bool {
	for kv := range strings.SplitSeq(godebug, ",") {
		if k, _, ok := strings.Cut(kv, "="); ok && strings.TrimSpace(k) == "schedtrace" {
			return true
		}
	}
	return false
}
