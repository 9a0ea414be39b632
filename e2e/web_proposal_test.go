package e2e

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestWebLearnProposalAndPresets: while a sandbox learns, the page shows a
// banner with the time left; the Proposal tab lists the patterns covering
// what a member reached, a person unticks one, edits another and saves the
// ticked ones in one click; the settings' preset checkboxes turn python on;
// the preset's rules are read-only in the allowlist manager.
func TestWebLearnProposalAndPresets(t *testing.T) {
	w, cfg, pol, token := presetSetup(t, "sandbox:\n  unknown_action: ask\n  approval_timeout: 3\n")
	if code, body := call(t, w, token, "PATCH", "/sandboxes/default/settings", `{"unknown_action": "learn"}`); code != 200 {
		t.Fatalf("learn: %d %s", code, body)
	}
	for _, u := range []string{"http://a.cdn.test/assets/x", "http://b.cdn.test/assets/y", "http://c.cdn.test/assets/z", "http://pkgs.test/simple/requests/", "http://allowed.test/"} {
		if r := w.Run(cfg, "default", "agent", 30*time.Second, "curl", "-sS", "-m", "10", u); r.Stdout != "internet" {
			t.Fatalf("%s: %q %q", u, r.Stdout, r.Stderr)
		}
	}
	ctx, _ := browserFor(t, w, token)

	var banner string
	if err := chromedp.Run(ctx, onScreen("#learn-banner"), chromedp.Text("#learn-banner", &banner, chromedp.ByID)); err != nil {
		t.Fatalf("no learn banner: %v", err)
	}
	if !strings.Contains(banner, "recorded as learned until") || !strings.Contains(banner, "min left") {
		t.Errorf("banner: %q", squash(banner))
	}

	// The proposal, reviewed: allowed.test, reached only at /, is flagged
	// (it would allow every path and method) and left unticked; pkgs.test's
	// pattern is widened to the whole index, and the rest saved in one click.
	var rows []string
	if err := chromedp.Run(ctx,
		click("#learn-review"),
		chromedp.Poll(`document.querySelectorAll("#proposal-rows textarea.mono").length === 3`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Evaluate(`[...document.querySelectorAll("#proposal-rows tr")].map((r) => r.querySelector("textarea.mono").value + " | " + r.querySelector('input[type="checkbox"]').checked + " | " + r.innerText.replace(/\s+/g, " ").trim())`, &rows),
	); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"*.cdn.test/assets/* | true | agent 3 http://a.cdn.test/assets/x GET http://b.cdn.test/assets/y GET http://c.cdn.test/assets/z",
		"allowed.test | false | agent 1 GET http://allowed.test/",
		"pkgs.test/simple/requests/* | true | agent 1 GET http://pkgs.test/simple/requests/",
	}
	if len(rows) != len(want) {
		t.Fatalf("proposal rows: %q", rows)
	}
	for i := range want {
		// Examples start with the method; the first one's "GET " follows
		// the hit count.
		if got := strings.Replace(rows[i], "| agent 3 GET ", "| agent 3 ", 1); !strings.HasPrefix(got, want[i]) {
			t.Errorf("row %d: %q, want %q", i, rows[i], want[i])
		}
	}
	checkAccessible(t, ctx, "proposal")
	shot(t, ctx, w, "proposal.png")
	var saveText, status string
	if err := chromedp.Run(ctx,
		setValue(`#proposal-rows textarea[aria-label="pattern for pkgs.test"]`, "pkgs.test/simple/*"),
		chromedp.Text("#proposal-save", &saveText, chromedp.ByID),
		click("#proposal-save"),
		chromedp.Poll(`document.querySelector("#proposal-status").textContent.startsWith("Saved")`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Text("#proposal-status", &status, chromedp.ByID),
	); err != nil {
		t.Fatal(err)
	}
	if saveText != "Save 2 ticked patterns" || status != "Saved 2 patterns to the policy file." {
		t.Errorf("save button %q, status %q", saveText, status)
	}
	text, _ := os.ReadFile(pol)
	for _, s := range []string{`pattern: "*.cdn.test/assets/*"`, `pattern: "pkgs.test/simple/*"`, `source: "learned `} {
		if !strings.Contains(string(text), s) {
			t.Errorf("policy file lacks %s:\n%s", s, text)
		}
	}
	if strings.Contains(string(text), "allowed.test") || strings.Contains(string(text), `"pkgs.test/simple/requests/*"`) {
		t.Errorf("policy file holds what was unticked or edited away:\n%s", text)
	}

	// Presets in the settings: the python checkbox shows its hosts, saving
	// writes presets: [python], and its rules are read-only.
	var hosts string
	if err := chromedp.Run(ctx,
		click(`.tabs button[data-tab="settings"]`),
		onScreen(`input[name="preset"][value="python"]`),
		chromedp.Evaluate(`document.querySelector('input[name="preset"][value="python"]').closest("label").innerText`, &hosts),
		onScreen(`input[name="unknown_action"][value="learn"]:checked`),
		click(`input[name="preset"][value="python"]`),
		click("#settings-save"),
		chromedp.Poll(`document.querySelector("#settings-status").textContent.includes("presets python")`, nil, chromedp.WithPollingTimeout(10*time.Second)),
	); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(hosts, "pypi.org, files.pythonhosted.org") {
		t.Errorf("python preset label: %q", squash(hosts))
	}
	if text, _ := os.ReadFile(pol); !strings.Contains(string(text), "  presets: [python]\n") {
		t.Errorf("policy file after ticking python:\n%s", text)
	}
	checkAccessible(t, ctx, "settings with presets")
	var presetRow string
	if err := chromedp.Run(ctx,
		click(`.tabs button[data-tab="rules"]`),
		chromedp.Poll(`[...document.querySelectorAll("#allow-rows tr")].some((r) => r.innerText.includes("GET pypi.org"))`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Evaluate(`[...document.querySelectorAll("#allow-rows tr")].find((r) => r.innerText.includes("GET pypi.org")).innerText`, &presetRow),
	); err != nil {
		t.Fatal(err)
	}
	if r := squash(presetRow); !strings.Contains(r, "method preset preset:python") || !strings.Contains(r, "from preset:python") || strings.Contains(r, "delete") {
		t.Errorf("preset rule row: %q", r)
	}
}
