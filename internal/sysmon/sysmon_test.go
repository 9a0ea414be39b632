package sysmon

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary is also the program Setup starts again: with
// SYSMON_HELPER set, TestMain runs helper instead of the tests.
func TestMain(m *testing.M) {
	switch os.Getenv("SYSMON_HELPER") {
	case "setup":
		err := Setup()
		// What the kernel gave the process, not what os.Setenv may
		// have changed since.
		environ, _ := os.ReadFile("/proc/self/environ")
		var godebug []string
		for kv := range strings.SplitSeq(string(environ), "\x00") {
			if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
				godebug = append(godebug, v)
			}
		}
		comm, _ := os.ReadFile("/proc/self/comm")
		fmt.Printf("GODEBUG=%q args=%q name=%q err=%v\n", godebug, os.Args, strings.TrimSpace(string(comm)), err)
		os.Exit(0)
	case "idle":
		idleThenCall()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helperCmd is the test binary as the helper named mode, with env added
// and GODEBUG removed unless env sets it.
func helperCmd(mode string, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GODEBUG=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, append([]string{"SYSMON_HELPER=" + mode}, env...)...)
	return cmd
}

// helper runs helperCmd and returns its output.
func helper(t testing.TB, mode string, env []string, args ...string) string {
	t.Helper()
	cmd := helperCmd(mode, env, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v: %s", cmd, err, out)
	}
	return strings.TrimSpace(string(out))
}

// Setup starts the test binary again as the same program (its arguments
// and its name), with the setting in the environment the kernel hands it,
// and only when GODEBUG does not set schedtrace already.
func TestSetupStartsTheProgramAgainWithTheSetting(t *testing.T) {
	args := []string{os.Args[0], "-test.run=^$", "an argument", ""}
	name := filepath.Base(os.Args[0])
	name = name[:min(len(name), 15)] // the kernel's limit
	for _, c := range []struct {
		name string
		env  []string
		want string
	}{
		{"no GODEBUG", nil, Setting},
		{"empty GODEBUG", []string{"GODEBUG="}, Setting},
		{"other settings kept", []string{"GODEBUG=madvdontneed=1,gctrace=0"}, "madvdontneed=1,gctrace=0," + Setting},
		{"the user's own schedtrace kept", []string{"GODEBUG=gctrace=0,schedtrace=0"}, "gctrace=0,schedtrace=0"},
		{"a schedtrace the runtime ignores", []string{"GODEBUG=schedtrace=abc"}, "schedtrace=abc," + Setting},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := helper(t, "setup", c.env, args[1:]...)
			want := fmt.Sprintf("GODEBUG=%q args=%q name=%q err=<nil>", []string{c.want}, args, name)
			if got != want {
				t.Errorf("after Setup:\n got %s\nwant %s", got, want)
			}
		})
	}
}

// withSetting keeps the first GODEBUG, as the runtime reads it, and drops
// the others; it leaves an environment alone whose GODEBUG sets schedtrace.
func TestWithSetting(t *testing.T) {
	for _, c := range []struct {
		env  []string
		want []string
		ok   bool
	}{
		{[]string{"A=1"}, []string{"A=1", "GODEBUG=" + Setting}, true},
		{[]string{"GODEBUG=a=1", "B=2", "GODEBUG=schedtrace=0"}, []string{"B=2", "GODEBUG=a=1," + Setting}, true},
		{[]string{"GODEBUG=schedtrace=0", "GODEBUG=a=1"}, []string{"GODEBUG=schedtrace=0", "GODEBUG=a=1"}, false},
		{[]string{"GODEBUGX=schedtrace=1"}, []string{"GODEBUGX=schedtrace=1", "GODEBUG=" + Setting}, true},
	} {
		got, ok := withSetting(c.env)
		if ok != c.ok || !slices.Equal(got, c.want) {
			t.Errorf("withSetting(%q) = %q, %v; want %q, %v", c.env, got, ok, c.want, c.ok)
		}
	}
}

// setsSchedtrace reads GODEBUG as the runtime's parser does: fields split
// at commas, the key exactly "schedtrace", the value an int32 (any other
// value is ignored, and so is the field).
func TestSetsSchedtrace(t *testing.T) {
	for s, want := range map[string]bool{
		"": false, "schedtrace=1": true, "a=1,schedtrace=0": true, "schedtrace=-1": true, "schedtrace=+7": true,
		"schedtrace=abc,schedtrace=3": true, "schedtrace=2147483647": true,
		" schedtrace=1": false, "schedtrace =1": false, "schedtrace=1 ": false, "schedtrace=": false,
		"schedtrace=abc": false, "schedtrace=2147483648": false, "schedtracex=1": false, "xschedtrace=1": false,
		"scheddetail=1": false, "schedtrace": false,
	} {
		if got := setsSchedtrace(s); got != want {
			t.Errorf("setsSchedtrace(%q) = %v, want %v", s, got, want)
		}
	}
}

// idleThenCall is what a server does between requests: every processor
// idles, waiting on the network, until a datagram comes (from the
// benchmark, every 200 µs); the goroutine reads it, and reading is an
// ordinary system call, as every call of Go's net and os is. It prints the
// thread switches the process made per datagram.
func idleThenCall() {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		panic(err)
	}
	fmt.Println(c.LocalAddr().(*net.UDPAddr).Port)
	buf := make([]byte, 8)
	var before, after unix.Rusage
	c.Read(buf) // the first
	unix.Getrusage(unix.RUSAGE_SELF, &before)
	for range rounds {
		c.Read(buf)
	}
	unix.Getrusage(unix.RUSAGE_SELF, &after)
	fmt.Printf("%.3f\n", float64(after.Nvcsw+after.Nivcsw-before.Nvcsw-before.Nivcsw)/rounds)
}

const rounds = 2000

// BenchmarkSyscallAfterIdle reports the thread switches per datagram of
// idleThenCall, in a process with the runtime's default (default) and one
// with Setting (schedtrace): the wake-ups and naps of sysmon that Setup
// saves. It runs its rounds in helpers of its own, once whatever b.N.
func BenchmarkSyscallAfterIdle(b *testing.B) {
	for _, c := range []struct{ name, godebug string }{{"default", "schedtrace=0"}, {"schedtrace", Setting}} {
		b.Run(c.name, func(b *testing.B) {
			var vs []float64
			for range 3 {
				vs = append(vs, idleRounds(b, c.godebug))
			}
			slices.Sort(vs)
			for b.Loop() {
			}
			b.ReportMetric(vs[1], "switches/round")
		})
	}
}

// idleRounds runs idleThenCall in a helper with GODEBUG=godebug, sends it
// its datagrams and returns what it printed.
func idleRounds(b *testing.B, godebug string) float64 {
	cmd := helperCmd("idle", []string{"GODEBUG=" + godebug})
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer cmd.Wait()
	r := bufio.NewReader(out)
	var port int
	var perRound float64
	if _, err := fmt.Fscanln(r, &port); err != nil {
		b.Fatal(err)
	}
	c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fmt.Fscanln(r, &perRound)
	}()
	for {
		c.Write([]byte("x"))
		select {
		case <-done:
			if perRound == 0 {
				b.Fatal("the helper printed no figure")
			}
			return perRound
		case <-time.After(200 * time.Microsecond):
		}
	}
}
