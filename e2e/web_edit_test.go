package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/accessibility"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/dom"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/airlockhq/airlock/internal/testworld"
)

// controlRoles are the roles a person operates; each needs a name.
var controlRoles = map[string]bool{"button": true, "checkbox": true, "radio": true, "textbox": true, "searchbox": true,
	"combobox": true, "listbox": true, "link": true, "tab": true, "spinbutton": true, "slider": true, "switch": true,
	"menuitem": true, "dialog": true}

// checkAccessible fails the test for every control on screen that the
// browser's accessibility tree leaves without a name, and for table headers
// without a scope.
func checkAccessible(t *testing.T, ctx context.Context, view string) {
	t.Helper()
	var unnamed []string
	var seen int
	// The raw protocol answer: cdproto's typed nodes refuse property names
	// newer chromium versions send ("uninteresting").
	var tree struct {
		Nodes []struct {
			Ignored bool `json:"ignored"`
			Role    *struct {
				Value any `json:"value"`
			} `json:"role"`
			Name *struct {
				Value any `json:"value"`
			} `json:"name"`
			BackendDOMNodeID cdp.BackendNodeID `json:"backendDOMNodeId"`
		} `json:"nodes"`
	}
	err := chromedp.Run(ctx, accessibility.Enable(), chromedp.ActionFunc(func(ctx context.Context) error {
		if err := cdp.Execute(ctx, accessibility.CommandGetFullAXTree, nil, &tree); err != nil {
			return err
		}
		for _, n := range tree.Nodes {
			if n.Ignored || n.Role == nil {
				continue
			}
			role, _ := n.Role.Value.(string)
			name := ""
			if n.Name != nil {
				name, _ = n.Name.Value.(string)
			}
			if !controlRoles[role] {
				continue
			}
			seen++
			if strings.TrimSpace(name) == "" {
				html, _ := dom.GetOuterHTML().WithBackendNodeID(n.BackendDOMNodeID).Do(ctx)
				unnamed = append(unnamed, role+": "+html[:min(len(html), 160)])
			}
		}
		return nil
	}))
	if err != nil {
		t.Errorf("%s: accessibility tree: %v", view, err)
		return
	}
	if seen < 5 {
		t.Errorf("%s: only %d controls in the accessibility tree; the check looked at nothing", view, seen)
	}
	for _, u := range unnamed {
		t.Errorf("%s: control without an accessible name: %s", view, u)
	}
	var noScope []string
	chromedp.Run(ctx, chromedp.Evaluate(`[...document.querySelectorAll("th")].filter((th) => th.getAttribute("scope") !== "col").map((th) => th.outerHTML)`, &noScope))
	for _, th := range noScope {
		t.Errorf("%s: table header without scope: %s", view, th)
	}
}

// The page re-renders lists while it loads them. chromedp's node-based
// waits lost their DevTools session in 3 of 7 runs while the allowlist
// rendered; these wait and click through the page's own DOM instead.

// onScreen waits until an element matching the CSS selector is displayed.
func onScreen(sel string) chromedp.Action {
	q, _ := json.Marshal(sel)
	return chromedp.Poll(fmt.Sprintf(`(() => { const e = document.querySelector(%s); return !!e && e.checkVisibility() })()`, q), nil, chromedp.WithPollingTimeout(10*time.Second))
}

// offScreen waits until no element matching the selector is displayed.
func offScreen(sel string) chromedp.Action {
	q, _ := json.Marshal(sel)
	return chromedp.Poll(fmt.Sprintf(`(() => { const e = document.querySelector(%s); return !e || !e.checkVisibility() })()`, q), nil, chromedp.WithPollingTimeout(10*time.Second))
}

// click waits for the element, then clicks it.
func click(sel string) chromedp.Action {
	q, _ := json.Marshal(sel)
	return chromedp.Tasks{onScreen(sel), chromedp.Evaluate(fmt.Sprintf(`document.querySelector(%s).click()`, q), nil)}
}

// setValue sets an input's value as typing would (an input event follows).
func setValue(sel, v string) chromedp.Action {
	q, _ := json.Marshal(sel)
	val, _ := json.Marshal(v)
	return chromedp.Tasks{onScreen(sel), chromedp.Evaluate(fmt.Sprintf(`(() => { const e = document.querySelector(%s); e.value = %s; e.dispatchEvent(new Event("input", {bubbles: true})) })()`, q, val), nil)}
}

// visibleRows returns the monitor's rows a person sees, as text.
func visibleRows(t *testing.T, ctx context.Context) string {
	t.Helper()
	var rows []string
	if err := chromedp.Run(ctx, chromedp.Evaluate(`[...document.querySelectorAll("#rows tr")].filter((r) => !r.hidden).map((r) => r.innerText.replace(/\s+/g, " "))`, &rows)); err != nil {
		t.Fatal(err)
	}
	return strings.Join(rows, "\n")
}

const webEditPolicy = `# the web test's project
name: webtest   # other keys stay
sandbox:
  unknown_action: ask   # changed from the page
  approval_timeout: 30
  mcp_servers:
    - name: github
      transport: stdio
    - name: fetch
      transport: stdio
  network_allowlist:
    auto:
      - generativelanguage.googleapis.com
    user:
      - pattern: allowed.test
      - pattern: "api.allowed.test/v1/*"
      - pattern: edit-me.test
        source: manually added
      - pattern: last.test
  network_denylist:
    - pattern: pastebin.com
`

// TestWebMonitorSettingsAndEdit drives the monitor (intercepted HTTPS
// rows, the LLM filter), the settings form (unknown_action to deny, in
// force for the next request) and editing a pattern in place, and checks
// that every control has an accessible name.
func TestWebMonitorSettingsAndEdit(t *testing.T) {
	w := testworld.New(t)
	pol := filepath.Join(w.Dir, "default.yaml")
	write(t, pol, webEditPolicy)
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	write(t, cfg, fmt.Sprintf("state_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nupstream_ca_file: %[3]s\nsandboxes:\n  - name: default\n    subnet: 10.88.0.0/24\n    policy: %[4]s\n",
		w.Dir, testworld.DNSAddr, w.CAFile, pol))
	w.StartDaemon(cfg)
	token, _ := os.ReadFile(filepath.Join(w.Dir, "state", "token"))
	ctx, _ := browserFor(t, w, strings.TrimSpace(string(token)))

	// Traffic: two intercepted HTTPS requests (a path rule makes airlock
	// intercept api.allowed.test) and an LLM API call.
	for _, c := range []struct{ source, url string }{
		{"agent", "https://api.allowed.test/v1/models"},
		{"mcp:github", "https://api.allowed.test/v1/blob/3000"},
		{"agent", "http://generativelanguage.googleapis.com/v1beta/models"},
	} {
		if r := w.Run(cfg, "default", c.source, 30*time.Second, "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", c.url); r.Stdout != "200" {
			t.Errorf("%s: %q %q", c.url, r.Stdout, r.Stderr)
		}
	}

	// (b) The monitor shows each intercepted request with source, method,
	// full URL, status and size, and the rule that let it through on hover.
	if err := chromedp.Run(ctx, chromedp.Poll(`(() => { const t = document.querySelector("#rows").innerText;
		return t.includes("/v1/models") && t.includes("/v1/blob/3000") && t.includes("generativelanguage") })()`, nil, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("the monitor never listed the traffic: %v\n%s", err, visibleRows(t, ctx))
	}
	rows := visibleRows(t, ctx)
	// Each row: source, method, URL, status, the time it took, size.
	took := ` [0-9.]+ (µs|ms|s) `
	for _, want := range []string{
		`agent GET https://api\.allowed\.test/v1/models 200` + took + `8 B`,
		`mcp:github GET https://api\.allowed\.test/v1/blob/3000 200` + took + `2\.9 kB`,
		`agent GET http://generativelanguage\.googleapis\.com/v1beta/models 200` + took + `8 B`,
	} {
		if !regexp.MustCompile(want).MatchString(rows) {
			t.Errorf("monitor lacks %q:\n%s", want, rows)
		}
	}
	var title string
	chromedp.Run(ctx, chromedp.Evaluate(`[...document.querySelectorAll("#rows tr")].find((r) => r.innerText.includes("/v1/models")).title`, &title))
	if !strings.Contains(title, "rule: api.allowed.test/v1/*") {
		t.Errorf("the row's hover text %q does not name the rule", title)
	}
	checkAccessible(t, ctx, "monitor")
	var live string
	chromedp.Run(ctx, chromedp.Evaluate(`document.querySelector(".counters").getAttribute("aria-live") + " " + document.querySelector(".counters").innerText.replace(/\s+/g, " ")`, &live))
	if live != "polite 3 Requests 3 Allowed 0 Denied 0 Pending" {
		t.Errorf("counters: %q; want a polite live region counting 3 requests, all allowed", live)
	}

	// (a) Hiding LLM calls hides the Gemini row and nothing else; showing
	// them brings it back.
	if err := chromedp.Run(ctx, click("#hide-llm")); err != nil {
		t.Fatal(err)
	}
	if rows := visibleRows(t, ctx); strings.Contains(rows, "generativelanguage") || !strings.Contains(rows, "/v1/models") || !strings.Contains(rows, "/v1/blob/3000") {
		t.Errorf("with LLM calls hidden the monitor shows:\n%s", rows)
	}
	if err := chromedp.Run(ctx, click("#hide-llm")); err != nil {
		t.Fatal(err)
	}
	if rows := visibleRows(t, ctx); !strings.Contains(rows, "generativelanguage") {
		t.Errorf("with LLM calls shown again the monitor shows:\n%s", rows)
	}

	// (c) Settings: allow needs a confirmation and shows the warning; a bad
	// timeout is refused; deny is saved and in force for the next request.
	var allowWarning string
	var saveDisabled bool
	if err := chromedp.Run(ctx,
		click(`.tabs button[data-tab="settings"]`),
		onScreen(`input[name="unknown_action"][value="ask"]:checked`),
		click(`input[name="unknown_action"][value="allow"]`),
		onScreen("#allow-warning"),
		chromedp.Text("#allow-warning", &allowWarning, chromedp.ByID),
		chromedp.Evaluate(`document.querySelector("#settings-save").disabled`, &saveDisabled),
	); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(allowWarning, "defeats the sandbox") || !saveDisabled {
		t.Errorf("choosing allow: warning %q, save disabled %v; want the warning and Save off until confirmed", allowWarning, saveDisabled)
	}
	var mcp string
	if err := chromedp.Run(ctx, chromedp.Poll(`document.querySelector("#mcp-rows").innerText.includes("fetch")`, nil, chromedp.WithPollingTimeout(5*time.Second)),
		chromedp.Text("#mcp-rows", &mcp, chromedp.ByID)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(squash(mcp), "fetch stdio any-url high — reaches any URL") || !strings.Contains(squash(mcp), "github stdio domains api.github.com, github.com medium") {
		t.Errorf("MCP servers in settings: %q", squash(mcp))
	}
	checkAccessible(t, ctx, "settings")
	shot(t, ctx, w, "settings.png")
	var settingsErr string
	if err := chromedp.Run(ctx,
		click(`input[name="unknown_action"][value="deny"]`),
		offScreen("#allow-warning"),
		setValue("#timeout-input", "0"),
		click("#settings-save"),
		chromedp.Poll(`document.querySelector("#settings-error").textContent !== ""`, nil, chromedp.WithPollingTimeout(5*time.Second)),
		chromedp.Text("#settings-error", &settingsErr, chromedp.ByID),
	); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(settingsErr, "1 to 600") {
		t.Errorf("timeout 0: error %q", settingsErr)
	}
	if b, _ := os.ReadFile(pol); string(b) != webEditPolicy {
		t.Errorf("a refused timeout changed the file:\n%s", b)
	}
	var status string
	if err := chromedp.Run(ctx,
		setValue("#timeout-input", "30"),
		click("#settings-save"),
		chromedp.Poll(`document.querySelector("#settings-status").textContent.startsWith("Saved")`, nil, chromedp.WithPollingTimeout(5*time.Second)),
		chromedp.Text("#settings-status", &status, chromedp.ByID),
	); err != nil {
		t.Fatalf("saving deny: %v", err)
	}
	if want := strings.Replace(webEditPolicy, "unknown_action: ask   #", "unknown_action: deny   #", 1); readPolicy(t, pol) != want {
		t.Errorf("policy file after saving deny:\n%s\nwant:\n%s", readPolicy(t, pol), want)
	}
	start := time.Now()
	r := w.Run(cfg, "default", "agent", 30*time.Second, "curl", "-sS", "-w", "\n%{http_code}", "http://api.unknown.test/x")
	if took := time.Since(start); took > 5*time.Second || !strings.HasSuffix(r.Stdout, "\n403") || !strings.Contains(r.Stdout, "unknown_action") {
		t.Errorf("unknown host after deny was saved (%v): %q %q; want an immediate 403 naming unknown_action", took, r.Stdout, r.Stderr)
	}
	if r := w.Run(cfg, "default", "agent", 30*time.Second, "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "https://api.allowed.test/v2/x"); r.Stdout != "403" {
		t.Errorf("intercepted request no rule allows, after deny: %q %q", r.Stdout, r.Stderr)
	}
	if code, body := call(t, w, strings.TrimSpace(string(token)), "GET", "/sandboxes/default/approvals", ""); code != 200 || strings.TrimSpace(body) != "[]" {
		t.Errorf("approvals after deny: %d %s; want none held", code, body)
	}
	if err := chromedp.Run(ctx,
		click(`.tabs button[data-tab="monitor"]`),
		chromedp.Poll(`(() => { const t = document.querySelector("#rows").innerText.replace(/\s+/g, " ");
			return t.includes("agent TCP api.unknown.test:80 denied") && t.includes("GET https://api.allowed.test/v2/x denied 403") })()`, nil, chromedp.WithPollingTimeout(10*time.Second)),
	); err != nil {
		t.Errorf("the monitor does not show the denials: %v\n%s", err, visibleRows(t, ctx))
	}
	shot(t, ctx, w, "monitor.png")

	// (d) Editing a pattern in place: a bad pattern changes nothing and
	// says why; a good one replaces the rule where it stood.
	before := readPolicy(t, pol)
	var rowErr string
	if err := chromedp.Run(ctx,
		click(`.tabs button[data-tab="rules"]`),
		onScreen(`button[aria-label="edit edit-me.test"]`),
		click(`button[aria-label="edit edit-me.test"]`),
		onScreen(`textarea[aria-label="new pattern for edit-me.test"]`),
	); err != nil {
		t.Fatal(err)
	}
	// Auto rules say why they are there.
	var auto string
	chromedp.Run(ctx, chromedp.Evaluate(`[...document.querySelectorAll("#allow-rows tr")].filter((r) => r.innerText.includes("managed")).map((r) => r.innerText.replace(/\s+/g, " ")).join("\n")`, &auto))
	if !strings.Contains(auto, "generativelanguage.googleapis.com exact auto LLM API") || !strings.Contains(auto, "api.github.com exact auto mcp:github") {
		t.Errorf("auto rules in the manager:\n%s", auto)
	}
	// The other list still renders while a row is being edited.
	if err := chromedp.Run(ctx, chromedp.Poll(`document.querySelector("#deny-rows").innerText.includes("pastebin.com")`, nil, chromedp.WithPollingTimeout(5*time.Second))); err != nil {
		t.Errorf("the denylist is not shown while an allowlist row is edited: %v", err)
	}
	checkAccessible(t, ctx, "allowlist manager")
	shot(t, ctx, w, "manager.png")
	if err := chromedp.Run(ctx,
		setValue(`textarea[aria-label="new pattern for edit-me.test"]`, "api.*.example.com"),
		click(`button[aria-label="save pattern edit-me.test"]`),
		chromedp.Poll(`document.querySelector("#allow-rows .row-error").textContent !== ""`, nil, chromedp.WithPollingTimeout(5*time.Second)),
		chromedp.Text("#allow-rows .row-error", &rowErr, chromedp.ByQuery),
	); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rowErr, "api.*.example.com") {
		t.Errorf("bad pattern: the row says %q", rowErr)
	}
	if got := readPolicy(t, pol); got != before {
		t.Errorf("a refused edit changed the file:\n%s", got)
	}
	// A broad pattern asks first; declining saves nothing.
	asked := make(chan string, 1)
	chromedp.ListenTarget(ctx, func(ev any) {
		if e, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			asked <- e.Message
			go chromedp.Run(ctx, page.HandleJavaScriptDialog(false))
		}
	})
	if err := chromedp.Run(ctx, setValue(`textarea[aria-label="new pattern for edit-me.test"]`, "*.test"), click(`button[aria-label="save pattern edit-me.test"]`)); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-asked:
		if !strings.Contains(msg, "defeats the sandbox") {
			t.Errorf("the broad pattern's question: %q", msg)
		}
	case <-time.After(5 * time.Second):
		t.Error("saving the broad pattern *.test asked nothing")
	}
	if err := chromedp.Run(ctx, chromedp.Poll(`document.querySelector("#allow-rows .row-error").textContent.includes("too broad")`, nil, chromedp.WithPollingTimeout(5*time.Second))); err != nil {
		t.Errorf("declined broad pattern: the row does not say it is too broad: %v", err)
	}
	if got := readPolicy(t, pol); got != before {
		t.Errorf("a declined broad pattern changed the file:\n%s", got)
	}
	if err := chromedp.Run(ctx,
		setValue(`textarea[aria-label="new pattern for edit-me.test"]`, "*.edited.test/api/*"),
		click(`button[aria-label="save pattern edit-me.test"]`),
		onScreen(`button[aria-label="edit *.edited.test/api/*"]`),
		offScreen(`button[aria-label="edit edit-me.test"]`),
	); err != nil {
		t.Fatal(err)
	}
	got := readPolicy(t, pol)
	i, j, k := strings.Index(got, `"api.allowed.test/v1/*"`), strings.Index(got, `- pattern: "*.edited.test/api/*"`), strings.Index(got, "- pattern: last.test")
	if strings.Contains(got, "edit-me.test") || i < 0 || j < i || k < j || !strings.Contains(got, `source: "manually added"`) || !strings.Contains(got, "name: webtest   # other keys stay") {
		t.Errorf("policy file after the edit (want *.edited.test/api/* where edit-me.test stood, its source kept):\n%s", got)
	}
}

func readPolicy(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
