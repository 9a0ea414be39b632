package e2e

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/airlockhq/airlock/internal/testenv"
)

// TestWebExposures: the Previews view lists a sandbox's live members (their
// names escaped); "expose port" on a member's row opens an exposure whose
// "open" link reaches the host address that serves the member's page, by
// another host name than the page's; "close" ends it.
func TestWebExposures(t *testing.T) {
	w, cfg, _, token := apiSetup(t)
	ctx, _ := browserFor(t, w, token)
	const name = "web\u202egpj" // a member names itself
	w.Start(cfg, "default", name, 90*time.Second, os.Args[0], "-test.run=^TestMemberHelper$", "--", "listen", ":8080", "45")
	var addr string
	testenv.WaitFor(t, 10*time.Second, "the member", func() bool {
		addr = members(t, w, token, "default")[name].Addr
		return addr != ""
	})
	// It serves before it is exposed (a member of its sandbox reaches it).
	if r := w.Run(cfg, "default", "client", 30*time.Second, "curl", "-sS", "-m", "15", "--retry", "50", "--retry-connrefused", "--retry-delay", "0", "--retry-max-time", "15", "http://"+addr+":8080/"); !strings.Contains(r.Stdout, "member") {
		t.Fatalf("member to member: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	row := `#preview-member-rows tr[data-member="` + addr + `"]`
	var text string
	if err := chromedp.Run(ctx,
		click(`.tabs button[data-tab="previews"]`),
		onScreen(row),
		chromedp.Evaluate(`document.querySelector(`+jsString(row)+`).innerText.replace(/\s+/g, " ")`, &text),
	); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, `web\u{202e}gpj `+addr+" run") || strings.Contains(text, "\u202e") {
		t.Errorf("the member's row reads %q", text)
	}
	var href string
	if err := chromedp.Run(ctx,
		setValue(row+` input[type="number"]`, "8080"),
		click(row+` button`),
		onScreen(`#exposure-rows tr[data-exposure] a`),
		chromedp.Evaluate(`document.querySelector("#exposure-rows tr[data-exposure] a").href`, &href),
		chromedp.Evaluate(`document.querySelector("#exposure-rows tr[data-exposure]").innerText.replace(/\s+/g, " ")`, &text),
	); err != nil {
		t.Fatal(err)
	}
	// The link names the host otherwise than the page does (the page is on
	// 127.0.0.1), so the browser sends the page's cookie to no exposure.
	xs := exposures(t, w, token, "default")
	if len(xs) != 1 || !strings.HasPrefix(xs[0].URL, "http://127.0.0.1:") || href != strings.Replace(xs[0].URL, "127.0.0.1", "localhost", 1) ||
		!strings.Contains(text, `web\u{202e}gpj 8080 `+xs[0].HostAddr) {
		t.Fatalf("the exposure's row reads %q with link %q; the API lists %+v", text, href, xs)
	}
	resp, err := w.HostClient().Get(xs[0].URL)
	if err != nil {
		t.Fatalf("GET %s: %v", xs[0].URL, err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(page) != "member" {
		t.Errorf("the open link serves %q, want the member's page", page)
	}
	checkAccessible(t, ctx, "previews view")
	shot(t, ctx, w, "previews.png")
	if err := chromedp.Run(ctx,
		click(`#exposure-rows tr[data-exposure] button`),
		offScreen(`#exposure-rows tr[data-exposure]`),
	); err != nil {
		t.Fatal(err)
	}
	if xs := exposures(t, w, token, "default"); len(xs) != 0 {
		t.Errorf("after close the API lists %+v", xs)
	}
	if _, err := w.HostClient().Get(xs[0].URL); err == nil {
		t.Error("the closed exposure still serves")
	}
}
