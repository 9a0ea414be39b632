package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
	"github.com/airlockhq/airlock/ui"
)

// The Docker tests run airlockd in the machine's own network namespace,
// beside the Docker Engine, with sandboxes of their own names, subnets and
// API port.
const (
	dkAPI   = "http://127.0.0.1:7533/api/v1"
	dkImage = "airlock-e2e-probe:test"
	dk1     = "e2e-dk1"
	dk2     = "e2e-dk2"
	sidecar = "airlock-e2e-dk1-mcp-github"
)

// probeImage builds the test image FROM scratch with the static probe.
func probeImage(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "probe"), "./testdata/probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v\n%s", err, out)
	}
	write(t, filepath.Join(dir, "Dockerfile"), "FROM scratch\nCOPY probe /probe\nENTRYPOINT [\"/probe\"]\n")
	if out, err := exec.Command("docker", "build", "-q", "-t", dkImage, dir).CombinedOutput(); err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("docker", "image", "rm", "-f", dkImage).Run() })
}

func docker(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	return string(out), err
}

// dkCall sends an API request to the root namespace's airlockd.
func dkCall(t *testing.T, token, method, path, body string) (int, string) {
	t.Helper()
	return callAt(t, http.DefaultClient, dkAPI, token, method, path, body)
}

// dkRecords returns the sandbox's journal entries of the given kinds from
// source.
func dkRecords(t *testing.T, token, sandbox, kinds, source string) []audit.Entry {
	t.Helper()
	status, body := dkCall(t, token, "GET", "/sandboxes/"+sandbox+"/requests?kind="+kinds+"&source="+source, "")
	if status != 200 {
		t.Fatalf("records: %d %s", status, body)
	}
	var out []audit.Entry
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func waitRecord(t *testing.T, token, sandbox, kinds, source string, ok func(audit.Entry) bool) audit.Entry {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for _, e := range dkRecords(t, token, sandbox, kinds, source) {
			if ok(e) {
				return e
			}
		}
	}
	t.Fatalf("no %s record from %s in %s matched; have %+v", kinds, source, sandbox, dkRecords(t, token, sandbox, kinds, source))
	return audit.Entry{}
}

// rootWorld is the test world of a test that runs airlockd beside the
// Docker Engine. The engine's containers live in the machine's own
// namespace, so the test's airlockd does too, and its rule set is the
// host's: the test needs that namespace to itself.
func rootWorld(t *testing.T) *testworld.World {
	t.Helper()
	testenv.Privileged(t)
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		if os.Getenv(testenv.RequireEnv) != "" {
			t.Fatalf("no Docker Engine: %v %s", err, out)
		}
		t.Skipf("no Docker Engine: %v", err)
	}
	if out, err := exec.Command("nft", "list", "table", "inet", "airlock").CombinedOutput(); err == nil {
		t.Fatalf("an nftables table inet airlock exists in the host's namespace: is airlockd running on this machine? %s needs that namespace to itself (airlockd --teardown removes a stale table)\n%.300s", t.Name(), out)
	}
	w := testworld.New(t)
	w.RouteRoot()
	return w
}

func TestDocker(t *testing.T) {
	w := rootWorld(t)
	probeImage(t)

	pol1, pol2 := filepath.Join(w.Dir, "dk1.yaml"), filepath.Join(w.Dir, "dk2.yaml")
	write(t, pol1, `sandbox:
  approval_timeout: 30
  network_allowlist:
    user:
      - pattern: allowed.test
      - pattern: "api.allowed.test/v1/*"
  mcp_servers:
    - name: github
      transport: sse
      image: `+dkImage+`
      command: ["serve", ":8080", "http://allowed.test/from-sidecar"]
    - name: flaky
      transport: sse
      image: `+dkImage+`
      command: ["get", "::crash"]
  resources:
    agent: {memory_mb: 256, cpus: 0.5, pids: 32}
    run_timeout: 8
`)
	write(t, pol2, "sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n")
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	write(t, cfg, fmt.Sprintf("api_listen: 127.0.0.1:7533\nstate_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nupstream_ca_file: %[3]s\nsandboxes:\n  - name: %[4]s\n    subnet: 10.89.71.0/24\n    policy: %[5]s\n",
		w.Dir, testworld.DNSAddr, w.CAFile, dk1, pol1))

	var d *testworld.Daemon
	t.Cleanup(func() {
		// After the daemon's own cleanup kills it (cleanups run last first).
		exec.Command("sh", "-c", "docker rm -f $(docker ps -aq --filter label=airlock.sandbox="+dk1+" --filter label=airlock.sandbox="+dk2+") e2e-plain e2e-untrusted e2e-unknown e2e-fetch e2e-keeper e2e-outsider e2e-sleeper e2e-dns1 e2e-dns2 e2e-web e2e-artifacts e2e-stranger 2>/dev/null").Run()
		exec.Command("sh", "-c", "docker ps -aq --filter network=airlock-"+dk1+" | xargs -r docker rm -f; docker network rm airlock-"+dk1+" airlock-"+dk2+" airlock-e2e-stale").Run()
		if d != nil {
			if out, err := d.Teardown(); err != nil {
				t.Errorf("teardown: %v\n%s", err, out)
			}
		}
	})
	// A network of that name left wrong (another subnet, masquerading):
	// airlockd must replace it.
	docker(t, "network", "rm", "airlock-"+dk1)
	if out, err := docker(t, "network", "create", "--subnet", "10.89.99.0/24", "airlock-"+dk1); err != nil {
		t.Fatal(out)
	}
	d = w.StartRootDaemon(cfg)
	tok, err := os.ReadFile(filepath.Join(w.Dir, "state", "token"))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tok))
	run := func(name string, args ...string) (string, error) {
		base := []string{"run", "--rm", "--network", "airlock-" + dk1}
		if name != "" {
			base = append(base, "--name", name)
		}
		return docker(t, append(base, args...)...)
	}

	t.Run("network on the sandbox bridge", func(t *testing.T) {
		out, err := docker(t, "network", "inspect", "airlock-"+dk1, "--format", "{{json .Options}} {{json .IPAM.Config}}")
		if err != nil {
			t.Fatal(out)
		}
		for _, want := range []string{`"com.docker.network.bridge.name":"al-e2e-dk1"`, `"com.docker.network.bridge.enable_ip_masquerade":"false"`, `"Subnet":"10.89.71.0/24"`, `"Gateway":"10.89.71.1"`} {
			if !strings.Contains(out, want) {
				t.Errorf("network airlock-%s lacks %s: %s", dk1, want, out)
			}
		}
	})

	t.Run("docker run reaches an allowed host and is named", func(t *testing.T) {
		out, err := run("e2e-plain", "-v", w.CAFile+":/ca.pem:ro", "-e", "SSL_CERT_FILE=/ca.pem", dkImage, "get", "https://allowed.test/plain")
		if err != nil || !strings.Contains(out, "status 200 internet") {
			t.Fatalf("allowed HTTPS from a container: %v %s", err, out)
		}
		e := waitRecord(t, token, dk1, "connection", "e2e-plain", func(e audit.Entry) bool { return e.Host == "allowed.test" })
		if e.Verdict != "allow" {
			t.Errorf("record %+v, want allow", e)
		}
		// A user_added container gets only rules that name it.
		out, _ = run("e2e-untrusted", "--label", "airlock.trust=user_added", dkImage, "get", "http://allowed.test/untrusted")
		if !strings.Contains(out, "no such host") {
			t.Errorf("a user_added container resolved an allowed host: %s", out)
		}
		e = waitRecord(t, token, dk1, "dns", "e2e-untrusted", func(e audit.Entry) bool { return e.Host == "allowed.test" })
		if !strings.Contains(e.Reason, "user_added") {
			t.Errorf("denial of a user_added container says %q", e.Reason)
		}
	})

	t.Run("an unknown host is held, then denied", func(t *testing.T) {
		done := make(chan string, 1)
		go func() {
			out, _ := run("e2e-unknown", "--label", "airlock.agent=claude", dkImage, "get", "http://unknown.example/held")
			done <- out
		}()
		var id string
		for deadline := time.Now().Add(20 * time.Second); id == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			_, body := dkCall(t, token, "GET", "/sandboxes/"+dk1+"/approvals", "")
			var p []struct{ ID, Source, Host, Agent string }
			json.Unmarshal([]byte(body), &p)
			for _, a := range p {
				if a.Source == "e2e-unknown" && a.Host == "unknown.example" {
					id = a.ID
					if a.Agent != "claude" {
						t.Errorf("approval names agent %q, want claude (the container's airlock.agent)", a.Agent)
					}
				}
			}
		}
		if id == "" {
			t.Fatal("no approval from e2e-unknown for unknown.example")
		}
		if status, body := dkCall(t, token, "POST", "/sandboxes/"+dk1+"/approvals/"+id, `{"action":"deny"}`); status != 200 {
			t.Fatalf("deny: %d %s", status, body)
		}
		select {
		case out := <-done:
			if !strings.Contains(out, "status 403") {
				t.Errorf("denied container got %q, want a 403", out)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the container was not released after the denial")
		}
		if strings.Contains(strings.Join(w.Reached(), "\n"), "/held") {
			t.Error("the held request reached the internet")
		}
	})

	t.Run("a high-risk MCP server is asked about each URL", func(t *testing.T) {
		done := make(chan string, 1)
		go func() {
			out, _ := run("e2e-fetch", "--label", "airlock.source=mcp:fetch", dkImage, "get", "http://allowed.test/fetched")
			done <- out
		}()
		var id, url string
		for deadline := time.Now().Add(20 * time.Second); id == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			_, body := dkCall(t, token, "GET", "/sandboxes/"+dk1+"/approvals", "")
			var p []struct{ ID, Source, URL string }
			json.Unmarshal([]byte(body), &p)
			for _, a := range p {
				if a.Source == "mcp:fetch" {
					id, url = a.ID, a.URL
				}
			}
		}
		if id == "" {
			t.Fatal("mcp:fetch reached allowed.test without being asked")
		}
		if url != "http://allowed.test/fetched" {
			t.Errorf("approval for %q, want the full URL", url)
		}
		dkCall(t, token, "POST", "/sandboxes/"+dk1+"/approvals/"+id, `{"action":"deny"}`)
		if out := <-done; !strings.Contains(out, "status 403") {
			t.Errorf("denied fetch got %q", out)
		}
	})

	t.Run("DNS through Docker's embedded resolver ends at the gate", func(t *testing.T) {
		for i, extra := range [][]string{nil, {"--dns", testworld.DNSAddr}} {
			name := fmt.Sprintf("leak%d-%d.unknown.test", i, time.Now().UnixNano())
			args := append(append([]string{"--name", fmt.Sprintf("e2e-dns%d", i+1)}, extra...), dkImage, "resolve", name)
			out, _ := run("", args...)
			if w.DNS.Saw(name) {
				t.Errorf("the upstream DNS server saw %s (docker run %v): %s", name, extra, out)
			}
			waitRecord(t, token, dk1, "dns", fmt.Sprintf("e2e-dns%d", i+1), func(e audit.Entry) bool { return e.Host == name })
		}
	})

	t.Run("MCP sidecar is named and reachable only inside its sandbox", func(t *testing.T) {
		waitRecord(t, token, dk1, "request", "mcp:github", func(e audit.Entry) bool { return strings.Contains(e.URL, "/from-sidecar") })
		out, err := run("", dkImage, "get", "http://"+sidecar+":8080/")
		if err != nil || !strings.Contains(out, "status 200 sidecar") {
			t.Fatalf("agent to sidecar by name: %v %s", err, out)
		}
		ip, err := docker(t, "inspect", sidecar, "--format", "{{(index .NetworkSettings.Networks \"airlock-"+dk1+"\").IPAddress}}")
		if err != nil {
			t.Fatal(ip)
		}
		ip = strings.TrimSpace(ip)
		if status, body := dkCall(t, token, "POST", "/sandboxes", fmt.Sprintf(`{"name":%q,"subnet":"10.89.72.0/24","policy":%q}`, dk2, pol2)); status != 201 {
			t.Fatalf("create %s: %d %s", dk2, status, body)
		}
		for _, url := range []string{"http://" + sidecar + ":8080/", "http://" + ip + ":8080/"} {
			out, _ := docker(t, "run", "--rm", "--network", "airlock-"+dk2, dkImage, "get", url)
			if strings.Contains(out, "status 200") || !strings.Contains(out, "status 403 airlock blocked") && !strings.Contains(out, "error:") {
				t.Errorf("a container of %s got to %s: %s", dk2, url, out)
			}
		}
	})

	t.Run("a crashing MCP sidecar is reported and restarted", func(t *testing.T) {
		waitRecord(t, token, dk1, "member", "mcp:flaky", func(e audit.Entry) bool { return strings.Contains(e.Reason, "crashed with exit code 1") })
		var restarts int
		for deadline := time.Now().Add(20 * time.Second); restarts < 1 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			out, _ := docker(t, "inspect", "airlock-e2e-dk1-mcp-flaky", "--format", "{{.RestartCount}}")
			restarts, _ = strconv.Atoi(strings.TrimSpace(out))
		}
		if restarts < 1 {
			t.Error("Docker did not restart the crashed sidecar")
		}
	})

	t.Run("airlock docker run starts a hardened member", func(t *testing.T) {
		bin := testworld.Binaries(t)
		airlock := func(args ...string) (string, int) {
			cmd := exec.Command(filepath.Join(bin, "airlock"), append([]string{"docker", "run", "--api", strings.TrimSuffix(dkAPI, "/api/v1"), "--token-file", filepath.Join(w.Dir, "state", "token")}, args...)...)
			out, _ := cmd.CombinedOutput()
			return string(out), cmd.ProcessState.ExitCode()
		}
		out, code := airlock(dk1, dkImage, "status")
		if code != 0 {
			t.Fatalf("airlock docker run status: exit %d: %s", code, out)
		}
		for _, want := range []string{"CapEff: 0000000000000000", "NoNewPrivs: 1", "uid 65534", "rootfs write: read-only file system", "tmp write: ok"} {
			if !strings.Contains(out, want) {
				t.Errorf("member status lacks %q:\n%s", want, out)
			}
		}
		m := regexp.MustCompile(`forks (\d+) then EAGAIN`).FindStringSubmatch(out)
		if m == nil {
			t.Errorf("the fork bomb was not stopped by the pids limit:\n%s", out)
		} else if n, _ := strconv.Atoi(m[1]); n >= 32 {
			t.Errorf("started %d processes under a pids limit of 32", n)
		}
		out, code = airlock("--name", "e2e-intercepted", dk1, dkImage, "get", "https://api.allowed.test/v1/ca-check")
		if code != 0 || !strings.Contains(out, "status 200 internet") {
			t.Errorf("intercepted HTTPS from a launched member (sandbox CA trusted?): exit %d %s", code, out)
		}
		waitRecord(t, token, dk1, "request", "e2e-intercepted", func(e audit.Entry) bool { return strings.HasSuffix(e.URL, "/v1/ca-check") && e.Status == 200 })
		if out, code = airlock(dk1, dkImage, "get", "::not-a-url"); code != 1 {
			t.Errorf("a failing member's exit code came back as %d, want 1: %s", code, out)
		}
		start := time.Now()
		if out, code = airlock(dk1, dkImage, "sleep", "60"); code != 137 || !strings.Contains(out, "run timeout") || time.Since(start) > 30*time.Second {
			t.Errorf("a member past run_timeout (8 s): exit %d after %v: %s", code, time.Since(start), out)
		}
		// The limits as the engine holds them.
		for _, bad := range []string{"/", "/var", filepath.Join(w.Dir, "state")} {
			if out, code := airlock("--workspace", bad, dk1, dkImage, "status"); code != 1 || !strings.Contains(out, "members must not see") {
				t.Errorf("workspace %s: exit %d %s, want refused", bad, code, out)
			}
		}
		project := filepath.Join(w.Dir, "project")
		os.Mkdir(project, 0o755)
		out, code = airlock("-d", "--workspace", project, "--name", "e2e-limits", dk1, dkImage, "sleep", "5")
		if code != 0 {
			t.Fatalf("airlock docker run -d: %d %s", code, out)
		}
		hc, err := docker(t, "inspect", "e2e-limits", "--format", "{{json .HostConfig}}")
		if err != nil {
			t.Fatal(hc)
		}
		for _, want := range []string{`"Memory":268435456`, `"NanoCpus":500000000`, `"PidsLimit":32`, `"ReadonlyRootfs":true`, `"CapDrop":["ALL"]`, `"no-new-privileges:true"`, `"Target":"/workspace","ReadOnly":true`} {
			if !strings.Contains(hc, want) {
				t.Errorf("launched member's host config lacks %s: %s", want, hc)
			}
		}
	})

	t.Run("a container asks for a port at airlock.internal and a person's allow exposes it", func(t *testing.T) {
		if out, err := docker(t, "run", "-d", "--network", "airlock-"+dk1, "--name", "e2e-asker", "--label", "airlock.source=asker", dkImage, "serve", ":8080"); err != nil {
			t.Fatal(out)
		}
		defer docker(t, "rm", "-f", "e2e-asker")
		ip, err := docker(t, "inspect", "e2e-asker", "--format", "{{(index .NetworkSettings.Networks \"airlock-"+dk1+"\").IPAddress}}")
		if err != nil {
			t.Fatal(ip)
		}
		ip = strings.TrimSpace(ip)
		direct := &http.Client{Timeout: 3 * time.Second}
		unreachable := func(when string) {
			t.Helper()
			if resp, err := direct.Get("http://" + ip + ":8080/"); err == nil {
				resp.Body.Close()
				t.Fatalf("%s: the host reached the container's port directly", when)
			}
		}
		unreachable("before the request")
		// The member asks, and waits for the answer.
		asked := make(chan string, 1)
		go func() {
			out, _ := docker(t, "exec", "-e", "PROBE_TIMEOUT=60", "e2e-asker", "/probe", "post", "http://airlock.internal/v1/requests", `{"kind":"port","port":8080,"reason":"preview the app"}`)
			asked <- out
		}()
		var id string
		testenv.WaitFor(t, 20*time.Second, "the port request in the approvals list", func() bool {
			_, body := dkCall(t, token, "GET", "/sandboxes/"+dk1+"/approvals", "")
			var as []ui.ApprovalView
			if json.Unmarshal([]byte(body), &as) != nil {
				return false
			}
			for _, a := range as {
				if a.Kind == "port" && a.Port == 8080 && a.Source == "asker" && a.Reason == "preview the app" {
					id = a.ID
				}
			}
			return id != ""
		})
		unreachable("while the request waits")
		if _, body := dkCall(t, token, "GET", "/sandboxes/"+dk1+"/exposures", ""); body != "[]\n" {
			t.Fatalf("exposures before the approval: %s", body)
		}
		if status, body := dkCall(t, token, "POST", "/sandboxes/"+dk1+"/approvals/"+id, `{"action": "allow"}`); status != 200 {
			t.Fatalf("allow: %d %s", status, body)
		}
		var out string
		select {
		case out = <-asked:
		case <-time.After(70 * time.Second):
			t.Fatal("the member got no answer")
		}
		var xs []ui.Exposure
		_, body := dkCall(t, token, "GET", "/sandboxes/"+dk1+"/exposures", "")
		if json.Unmarshal([]byte(body), &xs) != nil || len(xs) != 1 || xs[0].Member != "asker" || xs[0].Port != 8080 || xs[0].Addr != ip {
			t.Fatalf("exposures after the approval: %s", body)
		}
		if !strings.Contains(out, "status 200") || !strings.Contains(out, `"approved"`) || !strings.Contains(out, xs[0].HostAddr) {
			t.Errorf("the member's answer: %s", out)
		}
		resp, err := direct.Get(xs[0].URL)
		if err != nil {
			t.Fatalf("GET %s: %v", xs[0].URL, err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(page) != "sidecar" {
			t.Errorf("GET %s = %q, want the container's page", xs[0].URL, page)
		}
		// Another sandbox still reaches neither the container nor the
		// host port (a member's 127.0.0.1 is its own).
		for _, u := range []string{"http://" + ip + ":8080/", "http://" + xs[0].HostAddr + "/"} {
			if out, _ := docker(t, "run", "--rm", "--network", "airlock-"+dk2, dkImage, "get", u); strings.Contains(out, "status 200") {
				t.Errorf("a member of another sandbox reached %s: %s", u, out)
			}
		}
		unreachable("with the exposure open")
		if status, body := dkCall(t, token, "DELETE", "/sandboxes/"+dk1+"/exposures/"+xs[0].ID, ""); status/100 != 2 {
			t.Fatalf("close: %d %s", status, body)
		}
		if resp, err := direct.Get(xs[0].URL); err == nil {
			resp.Body.Close()
			t.Error("the closed exposure still serves")
		}
	})

	t.Run("an exposure reaches a container's port from the host until the container goes", func(t *testing.T) {
		if out, err := docker(t, "run", "-d", "--network", "airlock-"+dk1, "--name", "e2e-web", "--label", "airlock.source=web", dkImage, "serve", ":8080"); err != nil {
			t.Fatal(out)
		}
		ip, err := docker(t, "inspect", "e2e-web", "--format", "{{(index .NetworkSettings.Networks \"airlock-"+dk1+"\").IPAddress}}")
		if err != nil {
			t.Fatal(ip)
		}
		ip = strings.TrimSpace(ip)
		// It serves inside its sandbox, and the host does not reach it.
		if out, err := run("", dkImage, "get", "http://"+ip+":8080/"); err != nil || !strings.Contains(out, "status 200 sidecar") {
			t.Fatalf("container to container: %v %s", err, out)
		}
		direct := &http.Client{Timeout: 3 * time.Second}
		if resp, err := direct.Get("http://" + ip + ":8080/"); err == nil {
			resp.Body.Close()
			t.Fatal("the host reached a container's port with no exposure")
		}
		var x ui.Exposure
		testenv.WaitFor(t, 10*time.Second, "the container as a member", func() bool {
			status, body := dkCall(t, token, "POST", "/sandboxes/"+dk1+"/exposures", `{"member": "web", "port": 8080}`)
			return status == 201 && json.Unmarshal([]byte(body), &x) == nil
		})
		if x.Addr != ip {
			t.Errorf("exposure %+v, want the container at %s", x, ip)
		}
		resp, err := direct.Get(x.URL)
		if err != nil {
			t.Fatalf("GET %s: %v", x.URL, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "sidecar" {
			t.Errorf("GET %s = %q, want the container's page", x.URL, body)
		}
		docker(t, "rm", "-f", "e2e-web")
		testenv.WaitFor(t, 10*time.Second, "the exposure to end with its container", func() bool {
			_, body := dkCall(t, token, "GET", "/sandboxes/"+dk1+"/exposures", "")
			return body == "[]\n"
		})
		if resp, err := direct.Get(x.URL); err == nil {
			resp.Body.Close()
			t.Error("the exposure of a removed container still answers")
		}
		waitRecord(t, token, dk1, "exposure", "web", func(e audit.Entry) bool { return e.Action == "closed" && e.Reason == "member ended" })
	})

	t.Run("a member's workspace as an archive and its output as a log", func(t *testing.T) {
		testMemberOutput(t, w, token)
	})

	t.Run("a restarted airlockd re-adopts running members", func(t *testing.T) {
		if out, err := docker(t, "run", "-d", "--network", "airlock-"+dk1, "--name", "e2e-keeper", "--label", "airlock.agent=claude", dkImage, "loop", "http://allowed.test/keeper"); err != nil {
			t.Fatal(out)
		}
		if out, err := docker(t, "run", "-d", "--network", "airlock-"+dk1, "--name", "e2e-outsider", "--label", "airlock.trust=user_added", dkImage, "loop", "http://allowed.test/outsider"); err != nil {
			t.Fatal(out)
		}
		waitRecord(t, token, dk1, "request", "e2e-keeper", func(e audit.Entry) bool { return true })
		waitRecord(t, token, dk1, "dns", "e2e-outsider", func(e audit.Entry) bool { return e.Verdict == "denied" })
		d = d.Restart()
		restarted := time.Now()
		e := waitRecord(t, token, dk1, "request", "e2e-keeper", func(e audit.Entry) bool { return e.Time.After(restarted) })
		if e.Agent != "claude" || !strings.HasSuffix(e.URL, "/keeper") {
			t.Errorf("record after restart %+v: want source e2e-keeper, agent claude", e)
		}
		// Its trust label holds across the restart, from the first packet on.
		for _, e := range dkRecords(t, token, dk1, "dns,connection,request", "e2e-outsider") {
			if e.Time.After(restarted) && e.Verdict != "denied" && e.Verdict != "deny" {
				t.Errorf("user_added container after restart: %+v", e)
			}
		}
		waitRecord(t, token, dk1, "dns", "e2e-outsider", func(e audit.Entry) bool { return e.Time.After(restarted) && e.Verdict == "denied" })
		if strings.Contains(strings.Join(w.Reached(), "\n"), "/outsider") {
			t.Error("the user_added container reached the internet")
		}
		if strings.Contains(d.Log.String(), "MCP sidecar started") {
			t.Error("the restarted airlockd started the running sidecar again instead of adopting it")
		}
	})

	t.Run("a bridge named like a sandbox's that no sandbox owns is closed", func(t *testing.T) {
		// What Docker does with the network of a sandbox that is gone when
		// a container joins it: it brings the bridge back, masquerading.
		if out, err := docker(t, "network", "create", "-o", "com.docker.network.bridge.name=al-e2e-stale", "--subnet", "10.89.73.0/24", "airlock-e2e-stale"); err != nil {
			t.Fatal(out)
		}
		defer docker(t, "network", "rm", "airlock-e2e-stale")
		out, _ := docker(t, "run", "--rm", "--network", "airlock-e2e-stale", "--dns", testworld.DNSAddr, "-e", "PROBE_TIMEOUT=3", dkImage, "get", "http://"+testworld.WebAddr+"/stale")
		if strings.Contains(out, "status") {
			t.Errorf("a container on an unowned al- bridge reached the internet: %s", out)
		}
		if strings.Contains(strings.Join(w.Reached(), "\n"), "/stale") {
			t.Error("the internet saw a request from an unowned al- bridge")
		}
	})

	t.Run("deleting a sandbox removes its containers and network", func(t *testing.T) {
		if out, err := docker(t, "run", "-d", "--network", "airlock-"+dk2, "--name", "e2e-sleeper", dkImage, "sleep", "300"); err != nil {
			t.Fatal(out)
		}
		if status, body := dkCall(t, token, "DELETE", "/sandboxes/"+dk2, ""); status != 200 {
			t.Fatalf("delete %s: %d %s", dk2, status, body)
		}
		if out, err := docker(t, "network", "inspect", "airlock-"+dk2); err == nil {
			t.Errorf("network airlock-%s outlived its sandbox: %s", dk2, out)
		}
		if out, err := docker(t, "inspect", "e2e-sleeper"); err == nil {
			t.Errorf("container e2e-sleeper outlived its sandbox: %.200s", out)
		}
	})

	t.Run("teardown removes the Docker networks and their containers", func(t *testing.T) {
		d.Stop()
		if out, err := d.Teardown(); err != nil {
			t.Fatalf("teardown: %v\n%s", err, out)
		}
		if out, err := docker(t, "network", "inspect", "airlock-"+dk1); err == nil {
			t.Errorf("network airlock-%s outlived the teardown: %.200s", dk1, out)
		}
		if out, err := docker(t, "inspect", sidecar); err == nil {
			t.Errorf("sidecar %s outlived the teardown: %.200s", sidecar, out)
		}
	})
}

// An airlockd that cannot use the Docker Engine (here: the engine runs in
// another network namespace than the test's airlockd) says so once, and
// everything else works.
func TestNoDockerEngine(t *testing.T) {
	w, cfg, d, token := apiSetup(t)
	if r := w.Run(cfg, "default", "agent", 30*time.Second, "curl", "-sS", "-m", "10", "http://allowed.test/"); r.Code != 0 || r.Stdout != "internet" {
		t.Errorf("netns member without Docker: %+v", r)
	}
	if n := strings.Count(d.Log.String(), "no Docker Engine"); n != 1 {
		t.Errorf("airlockd said %d times that there is no Docker Engine, want once:\n%s", n, d.Log.String())
	}
	status, body := call(t, w, token, "GET", "/sandboxes/default/containers", "")
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "no Docker Engine") {
		t.Errorf("containers without Docker: %d %s, want 503 naming the missing engine", status, body)
	}
}
