package netns

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestBridgeName(t *testing.T) {
	tests := []struct{ sandbox, want string }{
		{"default", "al-default"},
		{"abcdefghijkl", "al-abcdefghijkl"}, // 15: fits
	}
	for _, tt := range tests {
		if got := BridgeName(tt.sandbox); got != tt.want {
			t.Errorf("BridgeName(%q) = %q, want %q", tt.sandbox, got, tt.want)
		}
	}
	long1, long2 := BridgeName("abcdefghijklm"), BridgeName("abcdefghijkln")
	if len(long1) != 15 || len(long2) != 15 || long1 == long2 || !strings.HasPrefix(long1, "al-abcdefg") {
		t.Errorf("long names: %q %q; want distinct 15-character names", long1, long2)
	}
	if n := BridgeName(strings.Repeat("z", 31)); len(n) > 15 {
		t.Errorf("31-character sandbox gives %q", n)
	}
}

func TestNewNetwork(t *testing.T) {
	n, err := NewNetwork("sb", netip.MustParsePrefix("10.88.0.0/24"))
	if err != nil || n.Gateway.String() != "10.88.0.1" || n.Bridge != "al-sb" {
		t.Fatalf("%+v %v", n, err)
	}
	first, last := n.RunRange()
	if first.String() != "10.88.0.2" || last.String() != "10.88.0.127" {
		t.Errorf("RunRange = %s..%s, want 10.88.0.2..10.88.0.127 (the upper half is Docker's)", first, last)
	}
	for _, bad := range []string{"10.88.0.1/24", "10.88.0.0/30", "fd00::/64"} {
		if _, err := NewNetwork("sb", netip.MustParsePrefix(bad)); err == nil {
			t.Errorf("NewNetwork(%s) succeeded", bad)
		}
	}
}

func TestLeases(t *testing.T) {
	dir := t.TempDir()
	n, _ := NewNetwork("sb", netip.MustParsePrefix("10.88.0.0/29")) // run range .2-.3
	a, err := AcquireLease(dir, n, "agent")
	if err != nil {
		t.Fatal(err)
	}
	b, err := AcquireLease(dir, n, "mcp:github")
	if err != nil {
		t.Fatal(err)
	}
	if a.Addr == b.Addr {
		t.Fatalf("two members got %s", a.Addr)
	}
	// flock is per open file: a lease held by this process blocks another
	// acquisition of the same address from this process too.
	if _, err := AcquireLease(dir, n, "third"); err == nil || !strings.Contains(err.Error(), "no free member address") {
		t.Errorf("third lease in a full range: %v", err)
	}
	if got := LeaseSource(dir, b.Addr); got != "mcp:github" {
		t.Errorf("LeaseSource = %q, want mcp:github", got)
	}
	holders := map[string]LeaseHolder{}
	for _, h := range LeaseHolders(dir) {
		holders[h.Source] = h
	}
	if len(holders) != 2 || holders["agent"].Addr != a.Addr || holders["mcp:github"].Addr != b.Addr || holders["agent"].PID != os.Getpid() {
		t.Errorf("LeaseHolders = %+v, want agent at %s and mcp:github at %s", holders, a.Addr, b.Addr)
	}
	wasB := holders["mcp:github"]
	b.Release()
	b.Release() // idempotent
	if got := LeaseSource(dir, b.Addr); got != "" {
		t.Errorf("released lease still names %q", got)
	}
	// A stale file (its holder died) is taken over.
	os.WriteFile(filepath.Join(dir, b.Addr.String()), []byte(`{"source":"dead"}`), 0o644)
	if got := LeaseSource(dir, b.Addr); got != "" {
		t.Errorf("stale lease names %q", got)
	}
	c, err := AcquireLease(dir, n, "new")
	if err != nil || c.Addr != b.Addr {
		t.Fatalf("stale address not reused: %v %v", c, err)
	}
	// Another member on the address is another holder, even under the
	// old member's name.
	c.Release()
	if c, err = AcquireLease(dir, n, "mcp:github"); err != nil || c.Addr != b.Addr {
		t.Fatalf("address not reused: %v %v", c, err)
	}
	if h, ok := LeaseHolderOf(dir, c.Addr); !ok || h.Same(wasB) || !h.Same(h) || h.Source != "mcp:github" {
		t.Errorf("a new member on %s is %+v, %v; the old one was %+v", c.Addr, h, ok, wasB)
	}
	a.Release()
	c.Release()
}

// TestLeaseLockOnARemovedFile: a member that leaves removes its lease file,
// then unlocks it; a process that opened the file just before and locks
// it just after holds a file nobody looks at, so it must not take the
// address.
func TestLeaseLockOnARemovedFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "10.88.0.2")
	os.WriteFile(path, nil, 0o644)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !stillNamed(f, path) {
		t.Fatal("an open lease file is not the file at its path")
	}
	os.Remove(path)
	if stillNamed(f, path) {
		t.Error("a removed lease file still counts")
	}
	os.WriteFile(path, nil, 0o644) // a new lease file of the same name
	if stillNamed(f, path) {
		t.Error("a removed lease file counts as its successor")
	}
}

// TestLeasesWithoutTheTurn: a turn file that cannot be used only costs
// the turn.
func TestLeasesWithoutTheTurn(t *testing.T) {
	dir := t.TempDir()
	n, _ := NewNetwork("sb", netip.MustParsePrefix("10.88.0.0/29"))
	os.Mkdir(filepath.Join(dir, leaseTurnFile), 0o755) // not a file
	l, err := AcquireLease(dir, n, "a")
	if err != nil || l.Addr.String() != "10.88.0.2" {
		t.Fatalf("with a directory for the turn file: %v %v", l, err)
	}
	l.Release()
	// A turn file whose lock a stopped process holds: the lease comes
	// after a short wait.
	dir = t.TempDir()
	held, _ := os.Create(filepath.Join(dir, leaseTurnFile))
	defer held.Close()
	unix.Flock(int(held.Fd()), unix.LOCK_EX)
	if l, err := AcquireLease(dir, n, "b"); err != nil {
		t.Errorf("with the turn locked: %v", err)
	} else {
		l.Release()
	}
}

// TestLeasesTakeTurns checks that a member that leaves does not hand its
// address to the next member while others are free, and that the turn
// wraps around the run range.
func TestLeasesTakeTurns(t *testing.T) {
	dir := t.TempDir()
	n, _ := NewNetwork("sb", netip.MustParsePrefix("10.88.0.0/28")) // run range .2-.7
	var got []string
	for i := range 8 {
		l, err := AcquireLease(dir, n, fmt.Sprint("member", i))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, l.Addr.String())
		l.Release()
	}
	if want := "10.88.0.2 10.88.0.3 10.88.0.4 10.88.0.5 10.88.0.6 10.88.0.7 10.88.0.2 10.88.0.3"; strings.Join(got, " ") != want {
		t.Errorf("one member after another got %s, want %s", strings.Join(got, " "), want)
	}
	// A held address is skipped and the turn goes on after it.
	held, _ := AcquireLease(dir, n, "held") // .4
	next, err := AcquireLease(dir, n, "next")
	if err != nil || held.Addr.String() != "10.88.0.4" || next.Addr.String() != "10.88.0.5" {
		t.Errorf("held %v, next %v %v", held.Addr, next.Addr, err)
	}
	held.Release()
	next.Release()
	// A turn file that names no address of the range starts at the first.
	os.WriteFile(filepath.Join(dir, leaseTurnFile), []byte("garbage"), 0o644)
	if l, err := AcquireLease(dir, n, "after garbage"); err != nil || l.Addr.String() != "10.88.0.2" {
		t.Errorf("after a broken turn file: %v %v", l, err)
	} else {
		l.Release()
	}
}

func TestLocalAddrs(t *testing.T) {
	var l LocalAddrs
	if !l.Contains(netip.MustParseAddr("127.0.0.1")) {
		t.Error("127.0.0.1 is not local")
	}
	if l.Contains(netip.MustParseAddr("203.0.113.199")) {
		t.Error("a documentation address is local")
	}
}

func TestWithin(t *testing.T) {
	tests := []struct {
		path, dir string
		want      bool
	}{
		{"/var/lib/airlock", "/var/lib/airlock", true},
		{"/var/lib/airlock/ca/x/bundle.pem", "/var/lib/airlock", true},
		{"/var/lib/airlock-old", "/var/lib/airlock", false},
		{"/var/lib", "/var/lib/airlock", false},
		{"/run/airlock", "/var/lib/airlock", false},
		{"/var/lib/..airlock", "/var/lib", true},
	}
	for _, tt := range tests {
		if got := within(tt.path, tt.dir); got != tt.want {
			t.Errorf("within(%q, %q) = %v, want %v", tt.path, tt.dir, got, tt.want)
		}
	}
}

func TestMemberEnv(t *testing.T) {
	in := []string{"PATH=/bin", "AIRLOCK_TOKEN=sekrit", "AIRLOCK_API=http://127.0.0.1:7433", "AIRLOCK_CONFIG=/etc/airlock/airlockd.yaml",
		"AIRLOCK_TOKEN_FILE=/var/lib/airlock/token", "airlock_token=lower", "Airlock_Api=mixed", "AIRLOCK_=x", "FOO=bar", "AIRLOCKED=kept", "noequals", "=empty"}
	got := MemberEnv(in)
	want := []string{"PATH=/bin", "FOO=bar", "AIRLOCKED=kept"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("MemberEnv = %q, want %q", got, want)
	}
}

// TestLocalAddrsAskTheKernel: the host's own addresses and whatever the kernel
// delivers locally count as local; an address routed elsewhere does not.
func TestLocalAddrsAskTheKernel(t *testing.T) {
	var l LocalAddrs
	for _, s := range []string{"0.0.0.0", "127.0.0.1", "127.9.9.9"} {
		if !l.Contains(netip.MustParseAddr(s)) {
			t.Errorf("%s is not local", s)
		}
	}
	if ifs, err := net.InterfaceAddrs(); err == nil {
		for _, x := range ifs {
			if n, ok := x.(*net.IPNet); ok && n.IP.To4() != nil {
				if a, _ := netip.AddrFromSlice(n.IP.To4()); !l.Contains(a) {
					t.Errorf("the interface address %s is not local", a)
				}
			}
		}
	}
}
