package e2e

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestWebMemberRequests drives the approval dialog for what members ask
// through airlock.internal: a network request (no "allow once": it holds no
// traffic; allowing a pattern answers the member) and a port request (only
// Allow and Deny; no patterns).
func TestWebMemberRequests(t *testing.T) {
	w, cfg, _, token := apiSetup(t)
	ctx, _ := browserFor(t, w, token)
	type dialog struct {
		Title, Label, Host, Source, URL, Reason string
		Patterns, Once, Pattern, Allow, Save    bool // visible
	}
	read := func() dialog {
		t.Helper()
		var d dialog
		if err := chromedp.Run(ctx,
			chromedp.WaitVisible("#ask", chromedp.ByID),
			chromedp.Evaluate(`(() => { const $ = (id) => document.getElementById(id), shown = (id) => !$(id).hidden && $(id).getClientRects().length > 0;
				return {title: $("ask-title").textContent, label: $("ask-host-label").textContent, host: $("ask-host").textContent, source: $("ask-source").textContent,
					url: $("ask-url").textContent, reason: shown("ask-reason-box") ? $("ask-reason").textContent : "",
					patterns: shown("ask-patterns"), once: shown("b-once"), pattern: shown("b-pattern"), allow: shown("b-allow"), save: shown("ask-save-box")}; })()`, &d),
		); err != nil {
			t.Fatal(err)
		}
		return d
	}

	// A network request, ahead of the member's traffic.
	member := w.Start(cfg, "default", "agent", 60*time.Second, ask("", `{"kind":"network","url":"http://api.unknown.test/v1/","reason":"fetch the \\data \u0007"}`)...)
	waitPendingAPI(t, w, token)
	got := read()
	want := dialog{Title: "Allow this destination?", Label: "Host", Host: "api.unknown.test", Source: "agent", URL: "http://api.unknown.test/v1/",
		Reason: `fetch the \\data`, Patterns: true, Pattern: true, Save: true}
	if got != want {
		t.Errorf("network request dialog:\n got %+v\nwant %+v", got, want)
	}
	checkAccessible(t, ctx, "network request dialog")
	if err := chromedp.Run(ctx, decideBy("#b-pattern"), chromedp.WaitNotVisible("#ask", chromedp.ByID)); err != nil {
		t.Fatal(err)
	}
	if a, status := answer(t, member()); status != 200 || a["status"] != "approved" || a["rule"] != "api.unknown.test" {
		t.Errorf("the member's answer: %d %v", status, a)
	}

	// A port request, from a member that serves its app on 8080: Allow or
	// Deny, nothing else.
	serve := strings.Join([]string{os.Args[0], "-test.run=^TestMemberHelper$", "--", "listen", ":8080", "60"}, " ")
	member = w.Start(cfg, "default", "agent", 60*time.Second, "sh", "-c", serve+" >/dev/null & P=$!; "+shellQuote(ask("", `{"kind":"port","port":8080,"reason":"preview the app"}`))+"; sleep 10; kill $P") // the member lives on while the preview is opened
	id := waitPendingAPI(t, w, token)
	got = read()
	want = dialog{Title: "Open a port for a preview?", Label: "Port", Host: "8080", Source: "agent", URL: "port 8080 (airlockd listens on 127.0.0.1 and forwards to it: this host only)",
		Reason: "preview the app", Allow: true}
	if got != want {
		t.Errorf("port request dialog:\n got %+v\nwant %+v", got, want)
	}
	// Allowed, the row says so, the member learns where the host reaches
	// it, and the Previews view's link opens the member's page.
	var row string
	if err := chromedp.Run(ctx,
		decideBy("#b-allow"),
		chromedp.WaitNotVisible("#ask", chromedp.ByID),
		chromedp.Poll(`(() => { const r = [...document.querySelectorAll("#rows tr")].find((r) => r.dataset.approval === `+"`"+id+"`"+`);
			return r && r.textContent.includes("allowed") && r.textContent; })()`, &row, chromedp.WithPollingTimeout(10*time.Second)),
	); err != nil {
		t.Fatalf("the port request's row: %v", err)
	}
	if !strings.Contains(row, "port 8080 (preview from the host)") || strings.Contains(row, "failed") {
		t.Errorf("row %q", row)
	}
	var href, page string
	if err := chromedp.Run(ctx,
		click(`.tabs button[data-tab="previews"]`),
		onScreen(`#exposure-rows tr[data-exposure] a`),
		chromedp.Evaluate(`document.querySelector("#exposure-rows tr[data-exposure] a").href`, &href),
	); err != nil {
		t.Fatal(err)
	}
	xs := exposures(t, w, token, "default")
	if len(xs) != 1 || xs[0].Member != "agent" || xs[0].Port != 8080 {
		t.Fatalf("exposures after the approval: %+v", xs)
	}
	if want := strings.Replace(xs[0].URL, "127.0.0.1", "localhost", 1); href != want {
		t.Errorf("the open link is %q, want %q", href, want)
	}
	// airlockd runs in the test world's host namespace, the browser
	// outside it: the link's port is carried there, under the same name.
	_, port, _ := net.SplitHostPort(w.ForwardHost(xs[0].HostAddr))
	preview := "http://localhost:" + port + "/"
	if err := chromedp.Run(ctx,
		chromedp.Navigate(preview),
		chromedp.Poll(`document.body && document.body.innerText.trim() === "member" && document.body.innerText.trim()`, &page, chromedp.WithPollingTimeout(10*time.Second)),
	); err != nil {
		t.Fatalf("opening the preview %s (%s): %v (page %q)", href, preview, err, page)
	}
	if a, status := answer(t, member()); status != 200 || a["status"] != "approved" || !strings.Contains(a["detail"].(string), xs[0].HostAddr) {
		t.Errorf("the member's answer: %d %v", status, a)
	}
}

// shellQuote quotes args for sh -c.
func shellQuote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
