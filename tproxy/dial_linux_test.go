package tproxy

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/airlockhq/airlock/internal/testenv"
)

// portShareChild marks the copy of the test binary that
// TestUpstreamDialLeavesThePortToConnect runs in a network namespace of
// its own.
const portShareChild = "AIRLOCK_TPROXY_PORT_SHARE_CHILD"

// TestUpstreamDialLeavesThePortToConnect: the proxy's upstream connections
// take their local port from connect(2), which gives a port to several
// connections as long as their destinations differ. A dial that binds
// first (Go's Dialer.DialTCP with a zero local address does,
// golang/go#81620) holds a port of its own for every connection and for
// the minute each lingers in TIME_WAIT after the proxy closed it, so that
// a busy sandbox runs out of ports ("address already in use") where
// connect would have gone on. Here the range has two ports, both taken by
// the members' two connections to the proxy: the upstream dials must
// share them.
func TestUpstreamDialLeavesThePortToConnect(t *testing.T) {
	if os.Getenv(portShareChild) == "1" {
		portShareScenario(t)
		return
	}
	testenv.Privileged(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestUpstreamDialLeavesThePortToConnect$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), portShareChild+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestUpstreamDialLeavesThePortToConnect") {
		t.Fatalf("in a network namespace of its own: %v\n%s", err, out)
	}
}

// portShareScenario runs in a fresh network namespace.
func portShareScenario(t *testing.T) {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	// Every listener first, on ports of the default range.
	up := startUpstream(t)
	h := newHarness(t, up, netip.AddrPortFrom(fake("allowed.test"), up.httpsPort), rules(up.httpsPort, fmt.Sprintf("allowed.test:%d", up.httpsPort)), nil)
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("61000 61001"), 0o644); err != nil {
		t.Fatal(err)
	}
	roots := up.roots(t)
	for i := range 2 {
		// A finished handshake is one through the proxy: the upstream
		// connection is up and held while the client is.
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp4", h.proxy.Addr().String(),
			&tls.Config{ServerName: "allowed.test", RootCAs: roots})
		if err != nil {
			t.Fatalf("connection %d through the proxy: %v; records %+v", i+1, err, h.Records())
		}
		defer c.Close()
	}
}
