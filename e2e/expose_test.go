package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
	"github.com/airlockhq/airlock/ui"
)

// hostTrap listens on addr in the host namespace and fails the test for
// every connection it takes: a host service no member may reach.
func hostTrap(t *testing.T, w *testworld.World, addr string) {
	t.Helper()
	w.InNetns(w.Host, func() {
		ln, err := net.Listen("tcp4", addr)
		if err != nil {
			t.Fatalf("host listener %s: %v", addr, err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				t.Errorf("host service %s reached from %s", addr, c.RemoteAddr())
				c.Close()
			}
		}()
	})
}

// members returns a sandbox's live members by name, as the API lists them.
func members(t *testing.T, w *testworld.World, token, sb string) map[string]ui.MemberView {
	t.Helper()
	code, body := call(t, w, token, "GET", "/sandboxes/"+sb+"/members", "")
	var list []ui.MemberView
	if code != 200 || json.Unmarshal([]byte(body), &list) != nil {
		t.Fatalf("members: %d %s", code, body)
	}
	out := map[string]ui.MemberView{}
	for _, m := range list {
		out[m.Name] = m
	}
	return out
}

func exposures(t *testing.T, w *testworld.World, token, sb string) []ui.Exposure {
	t.Helper()
	code, body := call(t, w, token, "GET", "/sandboxes/"+sb+"/exposures", "")
	var list []ui.Exposure
	if code != 200 || json.Unmarshal([]byte(body), &list) != nil {
		t.Fatalf("exposures: %d %s", code, body)
	}
	return list
}

// hostDial connects from the host namespace with an ordinary socket.
func hostDial(w *testworld.World, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return w.DialHost(ctx, "tcp4", addr)
}

// greeting reads the echo helper's first line through c.
func greeting(c net.Conn) (string, error) {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	return bufio.NewReader(c).ReadString('\n')
}

// TestExposure: a member's port is reachable from the host only through an
// exposure, at 127.0.0.1:HOSTPORT; nothing else of the sandbox opens, no
// member (of that sandbox or another) reaches the exposure or anything of
// the host, and the exposure ends with a close (cutting what it carries)
// or with its member.
func TestExposure(t *testing.T) {
	w, cfg, _ := setup(t)
	tok, err := os.ReadFile(filepath.Join(w.Dir, "state", "token"))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tok))
	hostTrap(t, w, "0.0.0.0:9998")
	helper := func(args ...string) []string {
		return append([]string{os.Args[0], "-test.run=^TestMemberHelper$", "--"}, args...)
	}
	w.Start(cfg, sbA, "web", 90*time.Second, helper("listen", ":8080", "45")...)
	w.Start(cfg, sbA, "echo", 90*time.Second, helper("echo", ":8081", "45")...)
	var ms map[string]ui.MemberView
	testenv.WaitFor(t, 10*time.Second, "two members", func() bool {
		ms = members(t, w, token, sbA)
		return len(ms) == 2
	})
	web, echo := ms["web"].Addr, ms["echo"].Addr
	if ms["web"].Kind != "run" || web == "" || echo == "" {
		t.Fatalf("members: %+v", ms)
	}
	run := func(sb string, argv ...string) testworld.Result {
		return w.Run(cfg, sb, "client", 30*time.Second, argv...)
	}
	// The member serves (its own sandbox reaches it), and the host does
	// not reach it: its replies are diverted to the proxy, which resets
	// them.
	if r := run(sbA, "curl", "-sS", "-m", "15", "--retry", "50", "--retry-connrefused", "--retry-delay", "0", "--retry-max-time", "15", "http://"+web+":8080/"); !strings.Contains(r.Stdout, "member") {
		t.Fatalf("member to member: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if c, err := hostDial(w, web+":8080"); err == nil {
		c.Close()
		t.Fatal("the host reached a member's port before any exposure")
	}

	// Exposed with the CLI: the host gets the member's page at the URL.
	out, err := cli(t, w, cfg, "expose", sbA, "web", "8080")
	u := regexp.MustCompile(`http://127\.0\.0\.1:(\d+)/`).FindStringSubmatch(out)
	if err != nil || u == nil {
		t.Fatalf("airlock expose: %v %s", err, out)
	}
	webURL, webPort := u[0], u[1]
	resp, err := w.HostClient().Get(webURL)
	if err != nil {
		t.Fatalf("GET %s: %v", webURL, err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(page) != "member" {
		t.Errorf("GET %s = %q, want the member's page", webURL, page)
	}
	// Only that port: the member's other ports and the other members stay
	// out of the host's reach.
	for _, a := range []string{web + ":8081", echo + ":8081", echo + ":8080"} {
		if c, err := hostDial(w, a); err == nil {
			c.Close()
			t.Errorf("the host reached %s with only %s:8080 exposed", a, web)
		}
	}

	// Exposed through the API, with bad requests refused first.
	for _, bad := range []struct {
		body string
		code int
		want string
	}{
		{`{"member": "echo", "port": 0}`, 400, "port must be 1 to 65535"},
		{`{"member": "echo", "port": 70000}`, 400, "port must be 1 to 65535"},
		{`{"member": "", "port": 8081}`, 400, "member is required"},
		{`{"member": "nobody", "port": 8081}`, 404, `no live member \"nobody\"`},
		{`{"member": "client", "port": 8081, "extra": 1}`, 400, "unknown field"},
		{`{"member": "echo", "port": 8081, "host_port": ` + webPort + `}`, 409, "is taken"},
	} {
		if code, body := call(t, w, token, "POST", "/sandboxes/"+sbA+"/exposures", bad.body); code != bad.code || !strings.Contains(body, bad.want) {
			t.Errorf("POST %s = %d %s, want %d %q", bad.body, code, body, bad.code, bad.want)
		}
	}
	if n := len(exposures(t, w, token, sbA)); n != 1 {
		t.Errorf("bad requests changed the exposures: %d open", n)
	}
	code, body := call(t, w, token, "POST", "/sandboxes/"+sbA+"/exposures", `{"member": "`+echo+`", "port": 8081}`)
	var ex ui.Exposure
	if code != 201 || json.Unmarshal([]byte(body), &ex) != nil || ex.Member != "echo" || !strings.HasPrefix(ex.HostAddr, "127.0.0.1:") || ex.URL != "http://"+ex.HostAddr+"/" {
		t.Fatalf("expose echo by address: %d %s", code, body)
	}
	_, hostPort, _ := net.SplitHostPort(ex.HostAddr)
	held, err := hostDial(w, ex.HostAddr)
	if err != nil {
		t.Fatalf("dial the echo exposure: %v", err)
	}
	defer held.Close()
	if line, err := greeting(held); line != "member 1\n" {
		t.Fatalf("echo exposure greeted %q %v", line, err)
	}
	fmt.Fprintf(held, "ping\n")
	if line, err := greeting(held); line != "ping\n" {
		t.Fatalf("echo exposure answered %q %v", line, err)
	}

	// airlockd's end of the open connection: the gateway and a port whose
	// packets from the member the datapath hands to airlockd's socket.
	ss, err := w.HostExec("ss", "-Htn", "state", "established", "dst", echo+":8081")
	dial := regexp.MustCompile(`10\.88\.0\.1:(\d+)`).FindStringSubmatch(ss)
	if err != nil || dial == nil {
		t.Fatalf("airlockd's connection to the echo member: %v %q", err, ss)
	}

	// No member reaches an exposure or the host: not another sandbox's
	// (neither the member's port nor the host port), not the exposed
	// sandbox's own, not through the port airlockd dialled from; the
	// host's services stay out of reach too.
	for _, c := range []struct{ sb, url string }{
		{sbA, "http://10.88.0.1:" + dial[1] + "/"},
		{sbB, "http://10.88.1.1:" + dial[1] + "/"},
		{sbB, "http://" + web + ":8080/"},
		{sbB, "http://127.0.0.1:" + webPort + "/"},
		{sbB, "http://10.88.1.1:" + webPort + "/"},
		{sbB, "http://" + testworld.HostUplink + ":" + webPort + "/"},
		{sbA, "http://127.0.0.1:" + hostPort + "/"},
		{sbA, "http://10.88.0.1:" + webPort + "/"},
		{sbA, "http://10.88.0.1:9998/"},
		{sbA, "http://" + testworld.HostUplink + ":9998/"},
		{sbA, "http://127.0.0.1:7433/"},
	} {
		if r := run(c.sb, "curl", "-sSf", "-m", "5", c.url); r.Code == 0 {
			t.Errorf("%s reached %s: %q", c.sb, c.url, r.Stdout)
		}
	}
	if out, err := cli(t, w, cfg, "expose", "--list", sbA); err != nil || !strings.Contains(out, ex.ID) || !strings.Contains(out, webURL) {
		t.Errorf("airlock expose --list: %v\n%s", err, out)
	}

	// Closing ends access and cuts the open connection.
	if code, body := call(t, w, token, "DELETE", "/sandboxes/"+sbA+"/exposures/"+ex.ID, ""); code != 200 {
		t.Fatalf("close: %d %s", code, body)
	}
	held.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := held.Read(make([]byte, 16)); err == nil || os.IsTimeout(err) {
		t.Errorf("the open connection outlived its exposure: %d %v", n, err)
	}
	if c, err := hostDial(w, ex.HostAddr); err == nil {
		c.Close()
		t.Error("the host port still answers after the close")
	}
	if code, body := call(t, w, token, "DELETE", "/sandboxes/"+sbA+"/exposures/"+ex.ID, ""); code != 404 {
		t.Errorf("close twice: %d %s", code, body)
	}
	if out, err := cli(t, w, cfg, "expose", "--close", sbA, regexp.MustCompile(`id ([0-9a-f]+);`).FindStringSubmatch(out)[1]); err != nil {
		t.Errorf("airlock expose --close: %v %s", err, out)
	}
	if _, err := w.HostClient().Get(webURL); err == nil {
		t.Error("the CLI's close left the web exposure open")
	}

	// A member that ends takes its exposure with it.
	waitBrief := w.Start(cfg, sbA, "brief", 90*time.Second, helper("echo", ":8082", "6")...)
	testenv.WaitFor(t, 10*time.Second, "the brief member", func() bool { _, ok := members(t, w, token, sbA)["brief"]; return ok })
	code, body = call(t, w, token, "POST", "/sandboxes/"+sbA+"/exposures", `{"member": "brief", "port": 8082}`)
	var bx ui.Exposure
	if code != 201 || json.Unmarshal([]byte(body), &bx) != nil {
		t.Fatalf("expose brief: %d %s", code, body)
	}
	// The member may not listen yet: a refused dial is cut at once.
	testenv.WaitFor(t, 5*time.Second, "the brief member's greeting through its exposure", func() bool {
		c, err := hostDial(w, bx.HostAddr)
		if err != nil {
			return false
		}
		defer c.Close()
		line, _ := greeting(c)
		return line == "member 1\n"
	})
	waitBrief()
	testenv.WaitFor(t, 10*time.Second, "the ended member's exposure to go", func() bool { return len(exposures(t, w, token, sbA)) == 0 })
	if c, err := hostDial(w, bx.HostAddr); err == nil {
		c.Close()
		t.Error("an ended member's host port still answers")
	}
	code, body = call(t, w, token, "GET", "/sandboxes/"+sbA+"/requests?kind=exposure", "")
	var es []audit.Entry
	json.Unmarshal([]byte(body), &es)
	got := map[string]string{}
	for _, e := range es {
		got[e.ExposureID+" "+e.Action] = e.Reason
	}
	if got[ex.ID+" opened"] == "" || got[ex.ID+" closed"] != "closed" || got[bx.ID+" closed"] != "member ended" {
		t.Errorf("journal: %d %v", code, got)
	}
	for _, l := range w.Reached() {
		t.Errorf("reached the internet: %s", l)
	}
}
