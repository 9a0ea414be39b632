package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
)

// A key held down from the approval before (or repeating) decides nothing:
// here "a" (allow once) went down before this dialog opened, and only its
// auto-repeats and its release reach the dialog, past its moment of arming.
// A key pressed afresh once the dialog is armed decides it.
func TestWebHeldKeyDecidesNothing(t *testing.T) {
	w, cfg, _, token := apiSetup(t)
	ctx, _ := browserFor(t, w, token)
	member := w.Start(cfg, "default", "agent", 60*time.Second, "curl", "-sS", "-m", "50", "http://api.unknown.test/v1/data")
	waitPendingAPI(t, w, token)
	if err := chromedp.Run(ctx, chromedp.WaitVisible("#ask", chromedp.ByID)); err != nil {
		t.Fatal(err)
	}
	// The key has been down since before the dialog opened: only repeats.
	repeat := chromedp.ActionFunc(func(ctx context.Context) error {
		for i := 0; i < 30; i++ {
			if err := input.DispatchKeyEvent(input.KeyDown).WithKey("a").WithCode("KeyA").WithText("a").
				WithWindowsVirtualKeyCode(65).WithAutoRepeat(true).Do(ctx); err != nil {
				return err
			}
			time.Sleep(50 * time.Millisecond)
		}
		return input.DispatchKeyEvent(input.KeyUp).WithKey("a").WithCode("KeyA").WithWindowsVirtualKeyCode(65).Do(ctx)
	})
	if err := chromedp.Run(ctx, repeat, chromedp.Sleep(500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, body := call(t, w, token, "GET", "/sandboxes/default/approvals", "")
	var p []struct{ ID string }
	json.Unmarshal([]byte(body), &p)
	if len(p) == 0 {
		r := member()
		t.Fatalf("auto-repeats of a key pressed before the dialog opened decided the approval (the member got %q)", r.Stdout)
	}
	// Pressed afresh: A allows once.
	if err := chromedp.Run(ctx, chromedp.WaitVisible(`#ask[data-armed="1"]`, chromedp.ByQuery), chromedp.KeyEvent("a"), chromedp.WaitNotVisible("#ask", chromedp.ByID)); err != nil {
		t.Fatal(err)
	}
	if r := member(); r.Stdout != "internet" {
		t.Errorf("A pressed afresh: the member got %+v", r)
	}
}
