package tproxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/visible"
	"github.com/airlockhq/airlock/policy"
)

// deny refuses a connection: a plain HTTP request gets a 403 that says
// what was blocked and how to approve it; anything else is reset.
func (p *Proxy) deny(c *conn, reason string, d policy.Decision) {
	c.rec.Verdict, c.rec.Reason = policy.Deny, reason
	if d.Rule != nil {
		c.rec.Rule = d.Rule.Pattern.String()
	}
	if c.head == nil {
		p.reset(c, reason)
		return
	}
	body := denial{sandbox: p.cfg.Sandbox, source: c.rec.Source, host: fmt.Sprintf("%s:%d", c.rec.Host, c.rec.Port),
		request: c.head.Method + " " + c.head.Target, reason: reason, rule: c.rec.Rule, suggest: c.rec.Host, approvalURL: p.cfg.ApprovalURL}.page()
	fmt.Fprintf(c.client, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Airlock-Verdict: deny\r\n\r\n%s", len(body), body)
	c.rec.Close = "403 sent"
	c.client.CloseWrite()
	// Let the 403 reach the client before the socket goes.
	c.client.SetReadDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, io.LimitReader(c.client, 1<<20))
}

// denial is what a 403 page says: what was blocked, why, by which rule,
// and how to allow it. The page is rendered here only, for plain HTTP
// refused before it is served and for requests refused one by one.
type denial struct {
	sandbox, source string
	host            string // host:port, when the request line does not say it
	request         string // METHOD and target or URL
	reason, rule    string
	suggest         string // a pattern that would allow it
	approvalURL     string
}

// page renders the 403's body. What the member sent is shown escaped
// (visible.String): the page often ends up in an operator's terminal.
func (d denial) page() string {
	rule := d.rule
	if rule == "" {
		rule = "none"
	}
	hint := ""
	if d.approvalURL != "" {
		hint = " (" + d.approvalURL + ")"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "airlock blocked this request.\n\nsandbox: %s\nsource:  %s\n", d.sandbox, visible.String(d.source))
	if d.host != "" {
		fmt.Fprintf(&b, "host:    %s\n", visible.String(d.host))
	}
	fmt.Fprintf(&b, "request: %s\nreason:  %s\nrule:    %s\n\nTo allow it, approve it on airlock's page%s\nor add a rule to the sandbox's policy file, such as:\n  - pattern: %q\n",
		visible.String(d.request), visible.String(d.reason), rule, hint, visible.String(d.suggest))
	return b.String()
}

// write answers 403 with the page: a refused intercepted request.
func (d denial) write(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Airlock-Verdict", "deny")
	w.WriteHeader(http.StatusForbidden)
	io.WriteString(w, d.page())
}

// reset closes with RST, so the client sees a refusal, not a clean end.
func (p *Proxy) reset(c *conn, reason string) {
	if c.rec.Reason == "" {
		c.rec.Reason = reason
	}
	c.rec.Verdict = policy.Deny
	if c.rec.Close == "" {
		c.rec.Close = "reset"
	}
	c.client.SetLinger(0)
}
