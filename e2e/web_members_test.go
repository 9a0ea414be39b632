package e2e

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"

	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/testworld"
)

// TestWebDockerMembers: the Members view lists a Docker member; its logs
// stream into the page as text, a terminal escape shown, not acted on; a
// download of /workspace/dist saves the member's files as a .tar.gz; a
// path outside /workspace is refused in the row, by the page and, for a
// link out of it, by airlockd. Every control of the view has a name.
func TestWebDockerMembers(t *testing.T) {
	w := rootWorld(t)
	probeImage(t)
	const api = "127.0.0.1:7534"
	pol := filepath.Join(w.Dir, "default.yaml")
	write(t, pol, "sandbox:\n  unknown_action: deny\n")
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	write(t, cfg, fmt.Sprintf("api_listen: %[4]s\nstate_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nsandboxes:\n  - name: default\n    subnet: 10.89.74.0/24\n    policy: %[3]s\n",
		w.Dir, testworld.DNSAddr, pol, api))
	var d *testworld.Daemon
	t.Cleanup(func() {
		exec.Command("docker", "rm", "-f", "e2e-web-artifacts").Run()
		exec.Command("docker", "network", "rm", "airlock-default").Run()
		if d != nil {
			if out, err := d.Teardown(); err != nil {
				t.Errorf("teardown: %v\n%s", err, out)
			}
		}
	})
	d = w.StartRootDaemon(cfg)
	tok, err := os.ReadFile(filepath.Join(w.Dir, "state", "token"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := docker(t, "run", "-d", "--network", "airlock-default", "--name", "e2e-web-artifacts", dkImage, "workspace"); err != nil {
		t.Fatal(out)
	}
	testenv.WaitFor(t, 20*time.Second, "the member's workspace", func() bool {
		out, _ := docker(t, "logs", "e2e-web-artifacts")
		return strings.Contains(out, "ready")
	})

	chrome, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not installed (apt-get install chromium)")
	}
	ctx, stop, err := startBrowser(t, chrome, "http://"+api, strings.TrimSpace(string(tok)))
	t.Cleanup(stop)
	if err != nil {
		t.Fatalf("sign in: %v", err)
	}
	downloads := t.TempDir()
	row := `#member-rows tr[data-id]`
	err = chromedp.Run(ctx,
		browser.SetDownloadBehavior(browser.SetDownloadBehaviorBehaviorAllowAndName).WithDownloadPath(downloads),
		click(`.tabs button[data-tab="members"]`),
		chromedp.Poll(`[...document.querySelectorAll("#member-rows td")].some((td) => td.textContent === "e2e-web-artifacts")`, nil, chromedp.WithPollingTimeout(15*time.Second)),
		click(row+` button[aria-label="logs of e2e-web-artifacts"]`),
		chromedp.Poll(`/tick [0-9]+/.test(document.querySelector("#logs").textContent) && document.querySelector("#logs .stderr") !== null`, nil, chromedp.WithPollingTimeout(15*time.Second)),
	)
	if err != nil {
		t.Fatalf("logs in the page: %v", err)
	}
	var warn string
	var raw bool
	chromedp.Run(ctx,
		chromedp.Evaluate(`document.querySelector("#logs .stderr").textContent`, &warn),
		chromedp.Evaluate(`document.querySelector("#logs").textContent.includes("\x1b")`, &raw))
	if !strings.Contains(warn, `\x1b[31mred`) || raw {
		t.Errorf("stderr line in the page: %q (a raw escape: %v); want the escape shown as \\x1b", warn, raw)
	}
	// The member's 40,000-byte stdout line came in pieces with a stderr
	// line between them: it is one line of stdout, and the stderr line is
	// a line of its own.
	var long int
	var stderrs []string
	chromedp.Run(ctx,
		chromedp.Evaluate(`[...document.querySelectorAll("#logs .stdout")].filter((d) => /^L+$/.test(d.textContent)).map((d) => d.textContent.length).join(",") === "40000" ? 1 : 0`, &long),
		chromedp.Evaluate(`[...document.querySelectorAll("#logs .stderr")].map((d) => d.textContent)`, &stderrs))
	if long != 1 {
		t.Error("the member's long stdout line is not one line of the page")
	}
	for _, l := range stderrs {
		if strings.Contains(l, "L") {
			t.Errorf("a stderr line of the page holds a piece of stdout: %.60q…", l)
		}
	}
	checkAccessible(t, ctx, "members")
	// The logs follow: a later tick arrives.
	var first string
	chromedp.Run(ctx, chromedp.Evaluate(`document.querySelector("#logs").lastChild.textContent`, &first))
	if err := chromedp.Run(ctx, chromedp.Poll(fmt.Sprintf(`document.querySelector("#logs").lastChild.textContent !== %q`, first), nil, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Errorf("the logs did not follow past %q: %v", first, err)
	}

	// Refusals show in the row.
	for path, want := range map[string]string{"/workspace/../etc": ".. segments", "/etc": "under /workspace", "/workspace/out": "symbolic link"} {
		var msg string
		err := chromedp.Run(ctx,
			setValue(row+" input", path),
			click(row+` button[aria-label="download from e2e-web-artifacts"]`),
			chromedp.Poll(fmt.Sprintf(`document.querySelector(%q).textContent.includes(%q)`, row+" .row-error", want), nil, chromedp.WithPollingTimeout(10*time.Second)),
			chromedp.Text(row+" .row-error", &msg))
		if err != nil {
			chromedp.Run(ctx, chromedp.Text(row+" .row-error", &msg))
			t.Errorf("download of %s: the row says %q, want %q", path, msg, want)
		}
	}

	// A download saves the member's files.
	if err := chromedp.Run(ctx,
		setValue(row+" input", "/workspace/dist"),
		click(row+` button[aria-label="download from e2e-web-artifacts"]`),
		chromedp.Poll(`document.querySelector("#members-status").textContent.includes("dist.tar.gz")`, nil, chromedp.WithPollingTimeout(15*time.Second)),
	); err != nil {
		t.Fatalf("download: %v", err)
	}
	var names []string
	testenv.WaitFor(t, 15*time.Second, "the downloaded archive", func() bool {
		names = nil
		entries, _ := os.ReadDir(downloads)
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".crdownload") {
				return false
			}
			f, err := os.Open(filepath.Join(downloads, e.Name()))
			if err != nil {
				return false
			}
			names, err = tarNames(f)
			f.Close()
			if err != nil {
				return false
			}
		}
		return len(names) > 0
	})
	if got := strings.Join(names, " "); got != "dist/ dist/app.txt dist/latest dist/run.sh dist/sub/ dist/sub/data.bin dist/sub/empty" {
		t.Errorf("downloaded archive holds %s", got)
	}
}

// tarNames lists the entries of a tar.gz, sorted as the archive has them.
func tarNames(r io.Reader) ([]string, error) {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	var out []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			_, err = io.Copy(io.Discard, gz)
			return out, err
		}
		if err != nil {
			return nil, err
		}
		out = append(out, h.Name)
	}
}
