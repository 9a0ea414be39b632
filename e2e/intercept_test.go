package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testworld"
)

// runC runs argv in sandbox sbc, whose members get the sandbox CA through
// the environment `airlock run` sets.
func runC(t *testing.T, w *testworld.World, cfg string, argv ...string) testworld.Result {
	t.Helper()
	return w.Run(cfg, sbC, "agent", 30*time.Second, argv...)
}

func TestInterceptPathAndMethodRules(t *testing.T) {
	w, cfg, d := setup(t)
	// Trusting only what airlock run put in the environment.
	if r := runC(t, w, cfg, "curl", "-sS", "https://api.allowed.test/v1/x"); r.Code != 0 || r.Stdout != "internet" {
		t.Errorf("/v1/x: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	r := runC(t, w, cfg, "curl", "-sS", "-w", "\n%{http_code}", "https://api.allowed.test/v2/x")
	if !strings.HasSuffix(r.Stdout, "\n403") || !strings.Contains(r.Stdout, "request: GET https://api.allowed.test/v2/x") || !strings.Contains(r.Stdout, "unknown_action") {
		t.Errorf("/v2/x: want a 403 that names the request and why:\n%s", r.Stdout)
	}
	// GET allowed, POST to the same path denied.
	if r := runC(t, w, cfg, "curl", "-sS", "https://api.allowed.test/repos/a/b"); r.Stdout != "internet" {
		t.Errorf("GET /repos/a/b: %q %q", r.Stdout, r.Stderr)
	}
	if r := runC(t, w, cfg, "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-d", "x", "https://api.allowed.test/repos/a/b"); r.Stdout != "403" {
		t.Errorf("POST /repos/a/b: %q %q", r.Stdout, r.Stderr)
	}
	// The internet saw exactly the allowed requests.
	got := strings.Join(reachedMatching(w, "https 203.0.113.10:443"), "\n")
	if !strings.Contains(got, "GET /v1/x host api.allowed.test") || !strings.Contains(got, "GET /repos/a/b") || strings.Contains(got, "/v2/") || strings.Contains(got, "POST") {
		t.Errorf("requests at the server:\n%s", got)
	}
	// Request records: method, URL, status, rule.
	log := d.WaitLog(`method=POST url=https://api.allowed.test/repos/a/b status=403`, 1)
	for _, want := range []string{
		`msg=request component=tproxy sandbox=sbc source=agent host=api.allowed.test method=GET url=https://api.allowed.test/v1/x status=200 verdict=allow rule=api.allowed.test/v1/*`,
		`method=GET url=https://api.allowed.test/v2/x status=403 verdict=deny`,
		`method=POST url=https://api.allowed.test/repos/a/b status=403 verdict=deny`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q", want)
		}
	}
}

func TestInterceptHTTP2HTTP1AndPython(t *testing.T) {
	w, cfg, _ := setup(t)
	for _, v := range []string{"--http2", "--http1.1"} {
		r := runC(t, w, cfg, "curl", "-sS", v, "-w", " %{http_version}", "https://api.allowed.test/v1/x")
		want := map[string]string{"--http2": "internet 2", "--http1.1": "internet 1.1"}[v]
		if r.Stdout != want {
			t.Errorf("curl %s: %q %q, want %q", v, r.Stdout, r.Stderr, want)
		}
	}
	// HTTP/2 to the client, and to the upstream too when it offers it.
	if got := strings.Join(reachedMatching(w, "https 203.0.113.10:443"), "\n"); !strings.Contains(got, "GET /v1/x") {
		t.Errorf("server log: %s", got)
	}
	script := `import urllib.request; print(urllib.request.urlopen("https://api.allowed.test/v1/py").read().decode())`
	if r := runC(t, w, cfg, "/usr/bin/python3", "-c", script); strings.TrimSpace(r.Stdout) != "internet" {
		t.Errorf("python urllib: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
}

func TestInterceptRefusesFronting(t *testing.T) {
	w, cfg, _ := setup(t)
	r := runC(t, w, cfg, "curl", "-sS", "-H", "Host: other.test", "-w", "\n%{http_code}", "https://api.allowed.test/v1/x")
	if !strings.HasSuffix(r.Stdout, "\n403") || !strings.Contains(r.Stdout, "domain fronting") {
		t.Errorf("SNI api.allowed.test with Host other.test: %q", r.Stdout)
	}
	if got := reachedMatching(w, "host other.test"); len(got) != 0 {
		t.Errorf("the fronted request reached the server: %v", got)
	}
}

func TestInterceptUpstreamCertificateErrors(t *testing.T) {
	w, cfg, _ := setup(t)
	r := runC(t, w, cfg, "curl", "-sS", "-w", "\n%{http_code}", "https://badcert.test/x/y")
	if !strings.HasSuffix(r.Stdout, "\n502") || !strings.Contains(r.Stdout, "not valid for this host name") {
		t.Errorf("wrong-name upstream certificate: %q", r.Stdout)
	}
	if got := reachedMatching(w, "/x/y"); len(got) != 0 {
		t.Errorf("a request went out over an unverified connection: %v", got)
	}
}

func TestInterceptNeedsTheSandboxCA(t *testing.T) {
	w, cfg, _ := setup(t)
	// A client that trusts only the internet's CA, not the sandbox CA:
	// intercepted hosts fail its handshake, spliced hosts still work.
	if r := runC(t, w, cfg, "curl", "-sS", "--cacert", w.CAFile, "https://api.allowed.test/v1/x"); r.Code == 0 {
		t.Errorf("intercepted host without the sandbox CA: %q", r.Stdout)
	}
	if r := runC(t, w, cfg, "curl", "-sS", "--cacert", w.CAFile, "https://allowed.test/"); r.Stdout != "internet" {
		t.Errorf("spliced host: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	// The CA's key stays 0600 in the state directory; members get the
	// certificate only.
	key := filepath.Join(w.Dir, "state", "ca", sbC, "ca.key")
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("CA key %s: %v %v", key, fi, err)
	}
	r := runC(t, w, cfg, "sh", "-c", `echo "$SSL_CERT_FILE $REQUESTS_CA_BUNDLE $NODE_EXTRA_CA_CERTS $CURL_CA_BUNDLE $GIT_SSL_CAINFO $PIP_CERT"`)
	bundle := filepath.Join(w.Dir, "state", "ca", sbC, "bundle.pem")
	if strings.Count(r.Stdout, bundle) != 6 {
		t.Errorf("CA environment: %q, want %s six times", r.Stdout, bundle)
	}
}
