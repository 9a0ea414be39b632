// Package testenv holds the helpers every package's tests share. Privileged
// decides whether a test can run here: privileged tests (root, network
// namespaces, nftables, Docker) go through it, which skips them on a
// developer's unprivileged machine and fails them where they must run (CI,
// `make test`). WaitFor and Poll wait on an event with a deadline, so that no
// test sleeps first and hopes.
package testenv

import (
	"os"
	"testing"
)

// RequireEnv is the environment variable that turns a skipped privileged test
// into a failure. `make test` and .ci/run set it, so a privileged test that
// could not run is never mistaken for one that passed.
const RequireEnv = "AIRLOCK_REQUIRE_PRIVILEGED"

// Privileged skips the test unless it runs as root. When RequireEnv is "1" it
// fails the test instead of skipping it.
func Privileged(t testing.TB) {
	t.Helper()
	check(t, os.Geteuid() == 0, "needs root (network namespaces, nftables)")
}

// Required reports whether skipped privileged tests must fail.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// check skips or fails t when ok is false; why says what is missing.
func check(t testing.TB, ok bool, why string) {
	t.Helper()
	if ok {
		t.Log("airlock-privileged: running")
		return
	}
	if Required() {
		t.Fatalf("privileged test cannot run: %s, and %s=1 forbids skipping it", why, RequireEnv)
	}
	t.Skipf("privileged test skipped: %s (set %s=1 to fail instead)", why, RequireEnv)
}
