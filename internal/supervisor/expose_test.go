package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/metrics"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/netns"
	"github.com/airlockhq/airlock/ui"
)

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// exposeWorld is a daemon with one sandbox "sb" on 10.88.0.0/24 and
// nothing running: members are leases in its lease directory.
func exposeWorld(t *testing.T) (*Daemon, *sandbox) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	d := &Daemon{ctx: ctx, log: slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		cfg:  &config.Config{RunDir: t.TempDir(), ExposeListen: netip.MustParseAddr("127.0.0.1")},
		mets: metrics.New(prometheus.NewRegistry())}
	n, err := netns.NewNetwork("sb", netip.MustParsePrefix("10.88.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	s := &sandbox{cfg: config.Sandbox{Name: "sb", Subnet: n.Subnet}, net: n}
	if s.journal, err = audit.Open(audit.Config{Dir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.journal.Close() })
	d.byName.Store("sb", s)
	return d, s
}

// member takes a lease in the sandbox for source until the test ends, or
// until the returned func releases it.
func member(t *testing.T, d *Daemon, s *sandbox, source string) (netip.Addr, func()) {
	t.Helper()
	l, err := netns.AcquireLease(d.cfg.LeaseDir("sb"), s.net, source)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Release)
	return l.Addr, l.Release
}

func managerErr(t *testing.T, err error) *ui.ManagerError {
	t.Helper()
	var me *ui.ManagerError
	if !errors.As(err, &me) {
		t.Fatalf("error %v is no *ui.ManagerError", err)
	}
	return me
}

// TestFindMember: a member is found by its source name, or by its
// address when names clash; stale leases, the gateway and unknown names
// are nobody.
func TestFindMember(t *testing.T) {
	d, s := exposeWorld(t)
	web1, _ := member(t, d, s, "web")
	web2, _ := member(t, d, s, "web")
	db, _ := member(t, d, s, "db")
	os.WriteFile(filepath.Join(d.cfg.LeaseDir("sb"), "10.88.0.99"), []byte(`{"source":"gone","pid":1}`), 0o644) // nobody holds it
	for _, tc := range []struct {
		name, want, err string
	}{
		{"db", db.String(), ""},
		{web2.String(), web2.String(), ""},
		{"web", "", fmt.Sprintf(`2 members of sandbox sb are named "web" ([%s %s])`, web1, web2)},
		{"gone", "", `no live member "gone" in sandbox sb`},
		{"10.88.0.99", "", "no live member"},
		{"10.88.0.1", "", "no live member"}, // the gateway is the host
		{"host", "", "no live member"},
		{"WEB", "", "no live member"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := d.findMember(s, tc.name)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("findMember(%q) = %+v, %v; want an error with %q", tc.name, m, err, tc.err)
				}
				return
			}
			if err != nil || m.addr.String() != tc.want || m.lease.Addr != m.addr {
				t.Errorf("findMember(%q) = %+v, %v; want the member at %s", tc.name, m, err, tc.want)
			}
		})
	}
	got := d.Members("sb")
	want := []ui.MemberView{{Name: "db", Addr: db.String(), Kind: "run"}, {Name: "web", Addr: web1.String(), Kind: "run"}, {Name: "web", Addr: web2.String(), Kind: "run"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Members = %v, want %v", got, want)
	}
}

// TestExposeRefuses: bad requests get a clear error and open nothing.
func TestExposeRefuses(t *testing.T) {
	d, s := exposeWorld(t)
	member(t, d, s, "web")
	for _, tc := range []struct {
		name       string
		sandbox    string
		req        ui.ExposeRequest
		want       string
		notFound   bool
		conflicted bool
	}{
		{"port 0", "sb", ui.ExposeRequest{Member: "web"}, "port must be 1 to 65535", false, false},
		{"port too big", "sb", ui.ExposeRequest{Member: "web", Port: 65536}, "port must be 1 to 65535", false, false},
		{"host port too big", "sb", ui.ExposeRequest{Member: "web", Port: 80, HostPort: 70000}, "host_port must be", false, false},
		{"no member", "sb", ui.ExposeRequest{Port: 80}, "member is required", false, false},
		{"long member", "sb", ui.ExposeRequest{Member: strings.Repeat("a", 129), Port: 80}, "too long", false, false},
		{"no sandbox", "other", ui.ExposeRequest{Member: "web", Port: 80}, `no sandbox "other"`, true, false},
		{"unknown member", "sb", ui.ExposeRequest{Member: "db", Port: 80}, `no live member "db"`, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.ExposePort(tc.sandbox, tc.req)
			me := managerErr(t, err)
			if !strings.Contains(me.Msg, tc.want) || me.NotFound != tc.notFound || me.Conflict != tc.conflicted {
				t.Errorf("error %+v, want %q (not found %v, conflict %v)", me, tc.want, tc.notFound, tc.conflicted)
			}
		})
	}
	// An expose_listen inside a sandbox's subnet (one made through the API
	// after the config was read) is refused.
	d.cfg.ExposeListen = netip.MustParseAddr("10.88.0.1")
	if _, err := d.Expose("sb", "web", 80); err == nil || !managerErr(t, err).Conflict || !strings.Contains(err.Error(), "in sandbox sb's subnet") {
		t.Errorf("expose_listen on the gateway: %v", err)
	}
	if n := len(d.Exposures("sb")); n != 0 {
		t.Errorf("%d exposures after refusals", n)
	}
}

// echoServer stands in for a member's port: "member N" then the client's
// own bytes back, until the client closes.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for n := 1; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			go func() {
				fmt.Fprintf(c, "member %d\n", n)
				io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

// openTo exposes m of s with connections going to addr instead of the
// member's address (a unit test has no sandbox bridge).
func openTo(t *testing.T, d *Daemon, s *sandbox, source, addr string) ui.Exposure {
	t.Helper()
	m, err := d.findMember(s, source)
	if err != nil {
		t.Fatal(err)
	}
	x, err := d.openExposure(s, m, netip.MustParseAddrPort("127.0.0.1:0"), 8080, func(ctx context.Context) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "tcp4", addr)
	})
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func readLine(t *testing.T, c net.Conn) (string, error) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	return bufio.NewReader(c).ReadString('\n')
}

func journal(s *sandbox) map[string]string {
	out := map[string]string{}
	for _, e := range s.journal.Query(audit.Filter{Kinds: []string{audit.KindExposure}}) {
		out[e.ExposureID+" "+e.Action] = e.Reason
	}
	return out
}

// TestExposureForwards: connections to the host address reach the
// member's port and back, at most maxExposureConns at once; closing the
// exposure cuts the ones open and the port answers no more.
func TestExposureForwards(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	d, s := exposeWorld(t)
	addr, _ := member(t, d, s, "web")
	x := openTo(t, d, s, "web", echoServer(t))
	if x.Member != "web" || x.Addr != addr.String() || x.Port != 8080 || x.Sandbox != "sb" || !strings.HasPrefix(x.HostAddr, "127.0.0.1:") || x.URL != "http://"+x.HostAddr+"/" {
		t.Errorf("exposure %+v", x)
	}
	if got := d.Exposures("sb"); len(got) != 1 || got[0] != x {
		t.Errorf("Exposures = %+v, want [%+v]", got, x)
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range maxExposureConns {
		c, err := net.Dial("tcp4", x.HostAddr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		if line, err := readLine(t, c); line != fmt.Sprintf("member %d\n", i+1) {
			t.Fatalf("connection %d greeted %q %v", i, line, err)
		}
	}
	// One too many is closed at accept, before anything is dialled.
	over, err := net.Dial("tcp4", x.HostAddr)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := readLine(t, over); err == nil || line != "" {
		t.Errorf("connection over the limit got %q %v", line, err)
	}
	over.Close()
	fmt.Fprintf(held[0], "ping\n")
	if line, err := readLine(t, held[0]); line != "ping\n" {
		t.Errorf("echo through the exposure: %q %v", line, err)
	}
	// A connection that ends frees its place.
	held[1].Close()
	held = held[2:]
	testenv.WaitFor(t, 5*time.Second, "a free place", func() bool {
		c, err := net.Dial("tcp4", x.HostAddr)
		if err != nil {
			return false
		}
		line, _ := readLine(t, c)
		c.Close()
		return strings.HasPrefix(line, "member ")
	})

	if err := d.CloseExposure("sb", x.ID); err != nil {
		t.Fatal(err)
	}
	for _, c := range held[:3] {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
			t.Errorf("a connection outlived its exposure: %d %v", n, err)
		}
	}
	if c, err := net.Dial("tcp4", x.HostAddr); err == nil {
		c.Close()
		t.Error("the host port answers after the close")
	}
	if me := managerErr(t, d.CloseExposure("sb", x.ID)); !me.NotFound {
		t.Errorf("closing twice: %+v", me)
	}
	if got := journal(s); got[x.ID+" opened"] == "" || got[x.ID+" closed"] != "closed" {
		t.Errorf("journal %v", got)
	}
}

// TestExposureEndsWithItsMember: a member that ends (its lease released)
// takes its exposure with it (netns.TestLeases: a later member on the
// address is another holder).
func TestExposureEndsWithItsMember(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	d, s := exposeWorld(t)
	_, release := member(t, d, s, "web")
	x := openTo(t, d, s, "web", echoServer(t))
	c, err := net.Dial("tcp4", x.HostAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if line, err := readLine(t, c); line != "member 1\n" {
		t.Fatalf("greeted %q %v", line, err)
	}
	release()
	testenv.WaitFor(t, 5*time.Second, "the exposure to end", func() bool { return len(d.Exposures("sb")) == 0 })
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("a connection outlived its member's exposure: %d", n)
	}
	if got := journal(s); got[x.ID+" closed"] != "member ended" {
		t.Errorf("journal %v", got)
	}
}

// TestSandboxStopEndsExposures: a stopping sandbox ends its exposures and
// opens no more.
func TestSandboxStopEndsExposures(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	d, s := exposeWorld(t)
	member(t, d, s, "web")
	x := openTo(t, d, s, "web", echoServer(t))
	d.closeExposures(s)
	if got := journal(s); got[x.ID+" closed"] != "sandbox stopped" {
		t.Errorf("journal %v", got)
	}
	m, _ := d.findMember(s, "web")
	_, err := d.openExposure(s, m, netip.MustParseAddrPort("127.0.0.1:0"), 80, nil)
	if me := managerErr(t, err); !me.Conflict || !strings.Contains(me.Msg, "stopping") {
		t.Errorf("expose while stopping: %+v", me)
	}
}

// TestPortRequestForTheMemberThatAsked: an approved port request of a run
// member exposes that member, found by its lease, even while another
// shares its name, and nobody once it has ended, though another member
// has its name by then.
func TestPortRequestForTheMemberThatAsked(t *testing.T) {
	d, s := exposeWorld(t)
	a := attribution{d: d, sandbox: "sb", gateway: s.net.Gateway, leases: d.cfg.LeaseDir("sb"), dockers: s.net.DockerRange()}
	first, release := member(t, d, s, "web")
	asked := a.identify(first)
	if asked.Name != "web" || asked.Lease == "" || asked.ID != "" {
		t.Fatalf("identify(%s) = %+v, want web by its lease", first, asked)
	}
	if got := a.identify(s.net.Gateway); got.Lease != "" {
		t.Errorf("identify(gateway) = %+v", got)
	}
	release()
	member(t, d, s, "web") // the name again, another member
	if _, err := d.exposer()("sb", "web", asked.Lease, 8080); err == nil || !strings.Contains(err.Error(), "has ended") {
		t.Errorf("exposer for the member that ended = %v, want an error that it has ended", err)
	}
	if x := d.Exposures("sb"); len(x) != 0 {
		t.Errorf("exposures open: %+v", x)
	}

	third, _ := member(t, d, s, "web")
	asked = a.identify(third)
	host, err := d.exposer()("sb", "web", asked.Lease, 8080)
	if err != nil {
		t.Fatalf("exposer for a live member sharing its name: %v", err)
	}
	x := d.Exposures("sb")
	if len(x) != 1 || x[0].Addr != third.String() || x[0].HostAddr != host || x[0].Port != 8080 {
		t.Errorf("exposures %+v, want one of %s:8080 at %s", x, third, host)
	}
	for _, e := range x {
		d.CloseExposure("sb", e.ID)
	}
}
