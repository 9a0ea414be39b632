package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/airlockhq/airlock/internal/testworld"
	"github.com/airlockhq/airlock/internal/visible"
)

// browserFor starts headless chromium against airlockd's page (through a
// forwarder into the host namespace) and signs in with the token.
//
// chromedp v0.14 (the last release with the API used here) sometimes loses
// its session with Debian's chromium 156: chromium closes the DevTools
// websocket (EOF) and every call then fails with "context canceled". A start
// that fails so is retried here, up to three times, and said so in the log;
// a later loss fails the test with that signature, and scripts/webtest.sh
// runs such a test again.
func browserFor(t *testing.T, w *testworld.World, token string) (context.Context, string) {
	t.Helper()
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not installed (apt-get install chromium)")
	}
	base := "http://" + w.ForwardHost("127.0.0.1:7433")
	for attempt := 1; ; attempt++ {
		ctx, stop, err := startBrowser(t, chrome, base, token)
		if err == nil {
			t.Cleanup(stop)
			return ctx, base
		}
		stop()
		if attempt == 3 || !errors.Is(err, context.Canceled) {
			t.Fatalf("sign in: %v", err)
		}
		t.Logf("browser start %d lost its session (%v); starting it again", attempt, err)
	}
}

func startBrowser(t *testing.T, chrome, base, token string) (context.Context, func(), error) {
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1280, 800), chromedp.Flag("disable-dev-shm-usage", true))
	var chromeOut testworld.SyncBuffer
	opts = append(opts, chromedp.CombinedOutput(&chromeOut))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel2 := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf), chromedp.WithErrorf(t.Logf))
	ctx, cancel3 := context.WithTimeout(ctx, 2*time.Minute)
	stop := func() {
		cancel3()
		cancel2()
		cancel()
		if t.Failed() {
			t.Logf("chromium output:\n%s", chromeOut.String())
		}
	}
	// The page's console and exceptions go to the test log.
	chromedp.ListenTarget(ctx, func(ev any) {
		switch e := ev.(type) {
		case *cdpruntime.EventConsoleAPICalled:
			var args []string
			for _, a := range e.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			t.Logf("page console.%s: %s", e.Type, strings.Join(args, " "))
		case *cdpruntime.EventExceptionThrown:
			t.Logf("page exception: %s %s", e.ExceptionDetails.Text, e.ExceptionDetails.Exception.Description)
		}
	})
	err := chromedp.Run(ctx,
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible("#token", chromedp.ByID),
		chromedp.SendKeys("#token", token, chromedp.ByID),
		chromedp.Click(`#login-form button[type="submit"]`),
		chromedp.WaitNotVisible("#login", chromedp.ByID),
		chromedp.Poll(`document.querySelector("#sandbox").value === "default"`, nil, chromedp.WithPollingTimeout(15*time.Second)),
	)
	if err != nil && !errors.Is(err, context.Canceled) {
		var state string
		chromedp.Run(ctx, chromedp.Evaluate(`JSON.stringify({sandbox: document.querySelector("#sandbox").outerHTML, csrf: sessionStorage.getItem("airlock.csrf"), login: document.querySelector("#login").open, err: document.querySelector("#login-error").textContent})`, &state))
		err = fmt.Errorf("%w; page: %s", err, state)
	}
	return ctx, stop, err
}

// squash folds the whitespace of an element's text, as a person reads it.
func squash(s string) string { return strings.Join(strings.Fields(s), " ") }

// shot saves a screenshot: under docs/ when AIRLOCK_UPDATE_DOCS=1 (to
// refresh the README's pictures), otherwise in the test's scratch dir.
func shot(t *testing.T, ctx context.Context, w *testworld.World, name string) {
	var png []byte
	if err := chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)); err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	dir := w.Dir
	if os.Getenv("AIRLOCK_UPDATE_DOCS") == "1" {
		dir = "../docs"
		os.MkdirAll(dir, 0o755)
	}
	os.WriteFile(filepath.Join(dir, name), png, 0o644)
}

func TestWebApprovePatternAndSave(t *testing.T) {
	w, cfg, _, token := apiSetup(t)
	ctx, _ := browserFor(t, w, token)
	// Some traffic for the monitor and the live tester's samples.
	w.Run(cfg, "default", "agent", 20*time.Second, "curl", "-sS", "http://allowed.test/")

	member := w.Start(cfg, "default", "mcp:github", 60*time.Second, "curl", "-sS", "-m", "50", "http://api.unknown.test/v1/data")
	waitPendingAPI(t, w, token)
	pendingSeen := time.Now()
	if err := chromedp.Run(ctx, chromedp.WaitVisible("#ask", chromedp.ByID)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(pendingSeen); d > time.Second {
		t.Errorf("the dialog opened %v after the approval was pending, want within 1 s", d)
	}
	var who, url string
	chromedp.Run(ctx, chromedp.Text("#ask-source", &who, chromedp.ByID), chromedp.Text("#ask-url", &url, chromedp.ByID))
	if who != "mcp:github" || url != "GET http://api.unknown.test/v1/data" {
		t.Errorf("dialog shows %q asking for %q", who, url)
	}
	// The dialog is modal, takes the focus, and Escape does not dismiss
	// the held request: it says what to do instead.
	var dialog struct {
		Modal, Role, Focus string
		Open               bool
		Error              string
	}
	if err := chromedp.Run(ctx,
		chromedp.Evaluate(`(() => { const d = document.querySelector("#ask"); return {modal: d.getAttribute("aria-modal"), role: d.getAttribute("role"), focus: d.contains(document.activeElement) ? document.activeElement.outerHTML : "outside: " + document.activeElement.outerHTML} })()`, &dialog),
		chromedp.KeyEvent("\x1b"),
		chromedp.Sleep(200*time.Millisecond),
		chromedp.Evaluate(`({open: document.querySelector("#ask").open, error: document.querySelector("#ask-error").textContent})`, &dialog),
	); err != nil {
		t.Fatal(err)
	}
	if dialog.Modal != "true" || dialog.Role != "dialog" || strings.HasPrefix(dialog.Focus, "outside") || !strings.Contains(dialog.Focus, `name="pattern"`) {
		t.Errorf("dialog: aria-modal %q, role %q, focus %s; want a modal dialog with the focus on the first pattern", dialog.Modal, dialog.Role, dialog.Focus)
	}
	if !dialog.Open || !strings.Contains(dialog.Error, "waits for your decision") {
		t.Errorf("after Escape: open %v, message %q; want the dialog open and a hint", dialog.Open, dialog.Error)
	}
	checkAccessible(t, ctx, "approval dialog")
	// A dialog that has just opened or turned to another approval decides
	// nothing for a moment: a key or click meant for the one before does
	// not decide this one. (The moment is stretched here, so that a slow
	// run cannot outlast it.)
	var still struct {
		Open  bool
		Armed string
	}
	if err := chromedp.Run(ctx,
		chromedp.Evaluate(`armAsk(); state.armedAt = Date.now() + 60000`, nil),
		chromedp.KeyEvent("d"),
		chromedp.Click("#b-deny", chromedp.ByID),
		chromedp.Sleep(300*time.Millisecond), // not a wait: room for a decision to be sent
		chromedp.Evaluate(`({open: document.querySelector("#ask").open, armed: document.querySelector("#ask").dataset.armed || ""})`, &still),
	); err != nil {
		t.Fatal(err)
	}
	if !still.Open {
		t.Errorf("a key and a click in the moment after the dialog turned decided it")
	}
	waitPendingAPI(t, w, token)
	if err := chromedp.Run(ctx, chromedp.Evaluate(`armAsk()`, nil)); err != nil {
		t.Fatal(err)
	}
	// Custom pattern, live-tested against the request, then saved.
	var results string
	if err := chromedp.Run(ctx,
		chromedp.Click(`input[name="pattern"][value="__custom"]`),
		chromedp.Evaluate(`document.querySelector("#custom-pattern").value = ""`, nil),
		chromedp.SendKeys("#custom-pattern", "*.unknown.test", chromedp.ByID),
		// Each keystroke asks the server; wait for the answer to the whole
		// pattern (a wrong page times out here).
		chromedp.Poll(`(() => { const t = document.querySelector("#custom-results").innerText.replace(/\s+/g, " ");
			return /MATCHES (GET )?http:\/\/api.unknown.test\/v1\/data/.test(t) && t.includes("NO MATCH GET http://allowed.test/") })()`, nil),
		chromedp.Text("#custom-results", &results, chromedp.ByID),
	); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`MATCHES (GET )?http://api\.unknown\.test/v1/data`).MatchString(squash(results)) {
		t.Errorf("live results: %q", results)
	}
	if err := chromedp.Run(ctx, chromedp.WaitVisible(`#ask[data-armed="1"]`, chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	shot(t, ctx, w, "dialog.png")
	if err := chromedp.Run(ctx, decideBy("#b-pattern"), chromedp.WaitNotVisible("#ask", chromedp.ByID)); err != nil {
		t.Fatal(err)
	}
	if r := member(); r.Stdout != "internet" {
		t.Errorf("the held curl after Allow pattern: %q %q", r.Stdout, r.Stderr)
	}
	if pol, _ := os.ReadFile(filepath.Join(w.Dir, "default.yaml")); !strings.Contains(string(pol), `pattern: "*.unknown.test"`) {
		t.Errorf("the pattern is not in the sandbox file:\n%s", pol)
	}
	// The monitor lists the traffic with source, method, URL, status and
	// size; the pending row became allowed.
	var monitor string
	err := chromedp.Run(ctx, chromedp.Poll(`document.querySelector("#rows").textContent.includes("allowed (allow pattern)")`, nil, chromedp.WithPollingTimeout(10*time.Second)))
	chromedp.Run(ctx, chromedp.Text("#rows", &monitor, chromedp.ByID))
	if err != nil {
		t.Errorf("the approval's row never said allowed (allow pattern): %v", err)
	}
	// Each request shows how long it took, between its status and size.
	for _, want := range []string{`agent GET http://allowed\.test/ 200 [0-9.]+ (µs|ms|s) 8 B`, `mcp:github (GET )?http://api\.unknown\.test/v1/data allowed \(allow pattern\)`, `mcp:github GET http://api\.unknown\.test/v1/data 200 [0-9.]+ (µs|ms|s) 8 B`} {
		if !regexp.MustCompile(want).MatchString(squash(monitor)) {
			t.Errorf("monitor lacks %q: %q", want, monitor)
		}
	}

	// The manager lists the saved pattern; deleting it removes it from the file.
	if err := chromedp.Run(ctx,
		chromedp.Click(`.tabs button[data-tab="rules"]`),
		chromedp.WaitVisible(`button[aria-label="delete *.unknown.test"]`),
	); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Run(ctx,
		chromedp.Click(`button[aria-label="delete *.unknown.test"]`),
		chromedp.WaitNotPresent(`button[aria-label="delete *.unknown.test"]`),
	); err != nil {
		t.Fatal(err)
	}
	if pol, _ := os.ReadFile(filepath.Join(w.Dir, "default.yaml")); strings.Contains(string(pol), "unknown.test") {
		t.Errorf("deleted pattern still in the file:\n%s", pol)
	}
}

func TestWebCountdownDeniesAndLiveMatcher(t *testing.T) {
	w := testworld.New(t)
	pol := filepath.Join(w.Dir, "default.yaml")
	write(t, pol, "sandbox:\n  approval_timeout: 4\n")
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	write(t, cfg, fmt.Sprintf("state_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nsandboxes:\n  - name: default\n    subnet: 10.88.0.0/24\n    policy: %[3]s\n", w.Dir, testworld.DNSAddr, pol))
	w.StartDaemon(cfg)
	token, _ := os.ReadFile(filepath.Join(w.Dir, "state", "token"))
	ctx, _ := browserFor(t, w, strings.TrimSpace(string(token)))

	member := w.Start(cfg, "default", "agent", 60*time.Second, "curl", "-sS", "http://api.unknown.test/")
	if err := chromedp.Run(ctx, chromedp.WaitVisible("#ask", chromedp.ByID)); err != nil {
		t.Fatal(err)
	}
	// The seed example in the custom editor, with the user's own samples:
	// the page shows what the server's matcher decides.
	var results string
	if err := chromedp.Run(ctx,
		chromedp.Click(`input[name="pattern"][value="__custom"]`),
		chromedp.Evaluate(`document.querySelector("#custom-pattern").value = ""`, nil),
		chromedp.SendKeys("#custom-samples", "https://api.unknown.com/api/v1/data\nhttps://cdn.unknown.com/api/v2/files\nhttps://api.unknown.com/other/path", chromedp.ByID),
		chromedp.SendKeys("#custom-pattern", "*.unknown.com/api/v*", chromedp.ByID),
		chromedp.Poll(`(() => { const t = document.querySelector("#custom-results").innerText.replace(/\s+/g, " ");
			return t.includes("MATCHES https://api.unknown.com/api/v1/data") && t.includes("MATCHES https://cdn.unknown.com/api/v2/files") && t.includes("NO MATCH https://api.unknown.com/other/path") })()`, nil),
		chromedp.Text("#custom-results", &results, chromedp.ByID),
	); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"MATCHES https://api.unknown.com/api/v1/data", "MATCHES https://cdn.unknown.com/api/v2/files", "NO MATCH https://api.unknown.com/other/path"} {
		if !strings.Contains(squash(results), want) {
			t.Errorf("live results lack %q: %q", want, results)
		}
	}
	// Nobody decides: at 0 the dialog closes, the row says denied, and
	// the client got its denial.
	var countdown, status string
	if err := chromedp.Run(ctx,
		chromedp.Text("#countdown", &countdown, chromedp.ByID),
		chromedp.WaitNotVisible("#ask", chromedp.ByID),
		chromedp.Poll(`document.querySelector("#rows").textContent.includes("denied (no decision)")`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Text("#rows", &status, chromedp.ByID),
	); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(countdown, " s") {
		t.Errorf("countdown = %q", countdown)
	}
	if r := member(); !strings.Contains(r.Stdout, "no decision within 4s") {
		t.Errorf("the client's denial: %q %q", r.Stdout, r.Stderr)
	}

	// HAR export downloads a file.
	dl := t.TempDir()
	done := make(chan string, 1)
	chromedp.ListenTarget(ctx, func(ev any) {
		if e, ok := ev.(*browser.EventDownloadProgress); ok && e.State == browser.DownloadProgressStateCompleted {
			done <- e.GUID
		}
	})
	if err := chromedp.Run(ctx,
		browser.SetDownloadBehavior(browser.SetDownloadBehaviorBehaviorAllowAndName).WithDownloadPath(dl).WithEventsEnabled(true),
		chromedp.Click("#har", chromedp.ByID),
	); err != nil {
		t.Fatal(err)
	}
	select {
	case guid := <-done:
		b, err := os.ReadFile(filepath.Join(dl, guid))
		if err != nil || !strings.Contains(string(b), `"version":"1.2"`) {
			t.Errorf("downloaded HAR: %v %.200s", err, b)
		}
	case <-time.After(10 * time.Second):
		t.Error("no HAR download")
	}
}

// TestWebDialogShowsTheRealHost: a member pads what the dialog shows with
// line separators and a decoy, and the person still reads the host being
// decided, in its fixed place at the top of the dialog; every separator
// shows as a visible escape. The page's escaping is the same as the Go
// function's that the CLI and the logs use.
func TestWebDialogShowsTheRealHost(t *testing.T) {
	w, cfg, _, token := apiSetup(t)
	ctx, _ := browserFor(t, w, token)
	pad := strings.Repeat("\u2028", 150)
	member := w.Start(cfg, "default", "agent", 60*time.Second, "curl", "-sS", "-m", "50",
		"-H", "X-Note: "+pad+"Host: allowed.test \u202egpj.exe", "http://unknown.test/x?q=allowed.test")
	id := waitPendingAPI(t, w, token)
	var got struct {
		Host, URL, Headers, Text string
		HostVisible              bool
	}
	if err := chromedp.Run(ctx,
		chromedp.WaitVisible("#ask", chromedp.ByID),
		chromedp.Evaluate(`(() => {
			const d = document.querySelector("#ask"), h = document.querySelector("#ask-host");
			const dr = d.getBoundingClientRect(), hr = h.getBoundingClientRect();
			return {host: h.textContent, url: document.querySelector("#ask-url").textContent,
				headers: document.querySelector("#ask-headers").textContent, text: d.textContent,
				hostVisible: hr.width > 0 && hr.height > 0 && hr.top >= dr.top && hr.bottom <= dr.top + d.clientHeight && hr.height < 3 * parseFloat(getComputedStyle(h).fontSize)};
		})()`, &got),
	); err != nil {
		t.Fatal(err)
	}
	if got.Host != "unknown.test" || !got.HostVisible {
		t.Errorf("the dialog's host reads %q (visible in one line at its top: %v), want unknown.test", got.Host, got.HostVisible)
	}
	if strings.ContainsAny(got.Text, "\u2028\u2029\u202e") {
		t.Errorf("raw separators or bidi controls in the dialog: %q", got.Text)
	}
	if !strings.Contains(got.Headers, `\u{2028}`) || !strings.Contains(got.Headers, `\u{202e}`) {
		t.Errorf("the headers do not show the separators as escapes: %q", got.Headers)
	}
	if !strings.Contains(got.URL, "http://unknown.test/x?q=") || strings.Contains(got.URL, "\u2028") {
		t.Errorf("the URL: %q", got.URL)
	}
	if code, body := call(t, w, token, "POST", "/sandboxes/default/approvals/"+id, `{"action": "deny"}`); code != 200 {
		t.Fatalf("deny: %d %s", code, body)
	}
	member()

	// The page's visibleText and the Go function agree.
	inputs := []string{"plain/ü/日本", "\x1b[2J", "\x1b]52;c;ZXZpbA==\a", "\u009b31m", "a\u2028b\u2029c", "evil\u202egpj", "\u2066x\u2069",
		"a\u200db\u200bc", "\ufeffx", "ex\u00adample", "a\u00a0b\u3000c", "a\u3164b", "a\ufe0fb", "a\U000e0041b", "a\ue000b", `back\slash`, "tab\there\nnl"}
	in, _ := json.Marshal(inputs)
	var js []string
	lit, _ := json.Marshal(string(in)) // a JSON string is a JavaScript string literal
	if err := chromedp.Run(ctx, chromedp.Evaluate(`JSON.parse(`+string(lit)+`).map(visibleText)`, &js)); err != nil {
		t.Fatal(err)
	}
	for i, s := range inputs {
		if i >= len(js) || js[i] != visible.String(s) {
			t.Errorf("visibleText(%q) = %q, visible.String = %q", s, js[min(i, len(js)-1)], visible.String(s))
		}
	}
}

// wholeJS checks, in the page, that the elements matching a selector show
// all their text: none is cut off (scrolled, hidden or ellipsized) by the
// element or by a box it sits in, none runs out of the window, and one of
// them holds the whole of want (its text, or a field's value).
const wholeJS = `((sel, want) => {
	const els = [...document.querySelectorAll(sel)].filter((e) => e.checkVisibility());
	if (!els.length) return "nothing visible matches " + sel;
	const text = (e) => e.value !== undefined && e.tagName !== "LI" && e.tagName !== "BUTTON" ? e.value : e.textContent;
	if (!els.some((e) => text(e).includes(want))) return "no " + sel + " holds it: " + els.map((e) => JSON.stringify(text(e))).join(", ");
	for (const e of els) {
		if (e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1 && getComputedStyle(e).overflowY !== "visible")
			return sel + " " + JSON.stringify(text(e).slice(0, 80)) + " is cut off: " + e.scrollWidth + "x" + e.scrollHeight + " px in " + e.clientWidth + "x" + e.clientHeight;
		const r = e.getBoundingClientRect();
		if (r.right > innerWidth + 1) return sel + " runs out of the window: right " + r.right + " of " + innerWidth;
		for (let a = e.parentElement; a && a !== document.documentElement; a = a.parentElement) {
			const s = getComputedStyle(a);
			if (s.overflowX !== "visible" && a.scrollWidth > a.clientWidth + 1)
				return sel + " is cut off by " + a.tagName + (a.id ? "#" + a.id : "") + "." + a.className + ": " + a.scrollWidth + " px in " + a.clientWidth;
		}
	}
	return "";
})`

// shownWhole fails the test unless sel shows want whole in the page.
// decideBy clicks a decision button of the approval dialog once the
// dialog takes decisions (armAsk in app.js).
func decideBy(sel string) chromedp.Tasks {
	return chromedp.Tasks{chromedp.WaitVisible(`#ask[data-armed="1"]`, chromedp.ByQuery), chromedp.Click(sel, chromedp.ByID)}
}

func shownWhole(t *testing.T, ctx context.Context, where, sel, want string) {
	t.Helper()
	var problem string
	if err := chromedp.Run(ctx, chromedp.Evaluate(wholeJS+"("+jsString(sel)+", "+jsString(want)+")", &problem)); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if problem != "" {
		t.Errorf("%s: %s", where, problem)
	}
}

// TestWebLongNamesShownWhole: a member with a long name asks for a long
// host that starts like one the person trusts (api.github.com.aaa…) and
// ends in another domain. Wherever the page shows it (the dialog's fixed
// place, the pattern choices, the monitor, the allowlist and its editor,
// the proposal, the previews), the person reads all of it: it wraps, and
// nothing of it is clipped, scrolled away or cut off with an ellipsis.
func TestWebLongNamesShownWhole(t *testing.T) {
	w, cfg, _, token := apiSetup(t)
	ctx, _ := browserFor(t, w, token)
	longHost := func(c string) string { // labels the exfiltration guard lets through
		l := strings.Repeat(c, 50)
		return "api.github.com." + l + "." + l + "." + l + "." + l + ".bench.test"
	}
	host := longHost("a")
	name := "agent" + strings.Repeat("b", 59) // the longest --source takes
	reason := "pip install " + strings.Repeat("c", 200) + " from " + host

	// Asked through the member API, with a reason.
	member := w.Start(cfg, "default", name, 60*time.Second, ask("", `{"kind":"network","url":"http://`+host+`/","reason":"`+reason+`"}`)...)
	id := waitPendingAPI(t, w, token)
	if err := chromedp.Run(ctx, chromedp.WaitVisible("#ask", chromedp.ByID)); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]string{{"#ask-host", host}, {"#ask-source", name}, {"#ask-url", "http://" + host + "/"}, {"#ask-reason", reason}, {"#choices label", host}, {"#choices code", host}} {
		shownWhole(t, ctx, "the dialog", c[0], c[1])
	}
	var hostTop bool
	chromedp.Run(ctx, chromedp.Evaluate(`document.querySelector(".ask-host").getBoundingClientRect().bottom <= document.querySelector("#ask-desc").getBoundingClientRect().top`, &hostTop))
	if !hostTop {
		t.Error("the host is not above what the member asks for")
	}
	if err := chromedp.Run(ctx, chromedp.Click(`input[name="pattern"][value="__custom"]`), setValue("#custom-pattern", host)); err != nil {
		t.Fatal(err)
	}
	shownWhole(t, ctx, "the custom pattern", "#custom-pattern", host)
	shownWhole(t, ctx, "the monitor's pending row", "#rows tr[data-approval] td", host)
	shownWhole(t, ctx, "the monitor's pending row", "#rows tr[data-approval] td", name)
	call(t, w, token, "POST", "/sandboxes/default/approvals/"+id, `{"action": "deny"}`)
	member()

	// Traffic to another such host (a denied host is not asked for again
	// at once), allowed by the pattern the dialog offers first.
	host = longHost("d")
	member = w.Start(cfg, "default", name, 60*time.Second, "curl", "-sS", "-m", "50", "http://"+host+"/x")
	if code, body := call(t, w, token, "GET", "/sandboxes/default/approvals", ""); code != 200 || body == "[]" {
		r := member()
		t.Fatalf("no approval: %d %s; the member: %q %q", code, body, r.Stdout, r.Stderr)
	}
	waitPendingAPI(t, w, token)
	if err := chromedp.Run(ctx,
		chromedp.WaitVisible("#ask", chromedp.ByID),
		chromedp.Poll(`document.querySelector("#ask-host").textContent === `+jsString(host), nil, chromedp.WithPollingTimeout(10*time.Second)),
	); err != nil {
		t.Fatal(err)
	}
	shownWhole(t, ctx, "the dialog for traffic", "#ask-host", host)
	shownWhole(t, ctx, "the dialog for traffic", "#ask-url", "GET http://"+host+"/x")
	if err := chromedp.Run(ctx, decideBy("#b-pattern"), chromedp.WaitNotVisible("#ask", chromedp.ByID)); err != nil {
		t.Fatal(err)
	}
	if r := member(); r.Stdout != "internet" {
		t.Fatalf("the held curl after Allow pattern: %q %q", r.Stdout, r.Stderr)
	}
	if err := chromedp.Run(ctx, chromedp.Poll(`document.querySelector("#rows").textContent.includes("allowed (allow pattern)")`, nil, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatal(err)
	}
	shownWhole(t, ctx, "the monitor", "#rows td", "http://"+host+"/x")
	shownWhole(t, ctx, "the monitor", "#rows td", name)
	shownWhole(t, ctx, "the monitor", "#rows td", "allowed (allow pattern)")
	shownWhole(t, ctx, "the monitor's sources", "#per-source", name)

	// The allowlist, and its editor.
	if err := chromedp.Run(ctx, click(`.tabs button[data-tab="rules"]`), onScreen(`button[aria-label="edit `+host+`"]`)); err != nil {
		t.Fatal(err)
	}
	shownWhole(t, ctx, "the allowlist", "#allow-rows td", host)
	if err := chromedp.Run(ctx, click(`button[aria-label="edit `+host+`"]`), onScreen(`textarea[aria-label="new pattern for `+host+`"]`)); err != nil {
		t.Fatal(err)
	}
	shownWhole(t, ctx, "the allowlist's editor", "#allow-rows textarea", host)
	if err := chromedp.Run(ctx, click(`button[aria-label="cancel editing `+host+`"]`), offScreen("#allow-rows textarea")); err != nil {
		t.Fatal(err)
	}

	// The proposal from that traffic.
	if err := chromedp.Run(ctx, click(`.tabs button[data-tab="proposal"]`), click("#proposal-load"),
		onScreen(`#proposal-rows textarea[aria-label="pattern for `+host+`"]`)); err != nil {
		t.Fatal(err)
	}
	shownWhole(t, ctx, "the proposal", "#proposal-rows textarea", host)
	shownWhole(t, ctx, "the proposal", "#proposal-rows td", "http://"+host+"/x")
	shownWhole(t, ctx, "the proposal", "#proposal-rows td", name)

	// The previews list the member while it lives.
	sleeper := w.Start(cfg, "default", name, 60*time.Second, "sleep", "15")
	if err := chromedp.Run(ctx, click(`.tabs button[data-tab="previews"]`),
		chromedp.Poll(`document.querySelector("#preview-member-rows").textContent.includes(`+jsString(name)+`)`, nil, chromedp.WithPollingTimeout(15*time.Second))); err != nil {
		t.Fatal(err)
	}
	shownWhole(t, ctx, "the previews", "#preview-member-rows td", name)
	var label string
	chromedp.Run(ctx, chromedp.Evaluate(`document.querySelector("#preview-member-rows button").getAttribute("aria-label")`, &label))
	if label != "expose a port of "+name {
		t.Errorf("the expose button's label: %q", label)
	}
	sleeper()
}
