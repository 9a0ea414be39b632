package supervisor

import (
	"time"

	"github.com/airlockhq/airlock/dnsgate"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/policy"
	"github.com/airlockhq/airlock/tproxy"
)

// The journal's entries, from each component's record type.

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func connEntry(r tproxy.Record) audit.Entry {
	return audit.Entry{Time: r.Time, Kind: audit.KindConnection, Source: r.Source, Host: r.Host, Port: r.Port,
		Verdict: policy.RecordVerdict(r.Verdict, r.Reason), Rule: r.Rule, Reason: r.Reason, BytesUp: r.Up, BytesDown: r.Down, DurationMs: ms(r.Duration),
		LLM: r.LLM, Dest: r.Dest, Upstream: r.Upstream, Close: r.Close, ConnID: r.ID}
}

func requestEntry(r tproxy.RequestRecord) audit.Entry {
	return audit.Entry{Time: r.Time, Kind: audit.KindRequest, Source: r.Source, Method: r.Method, URL: r.URL, Host: r.Host,
		Verdict: policy.RecordVerdict(r.Verdict, r.Reason), Rule: r.Rule, Reason: r.Reason, Status: r.Status, BytesUp: r.ReqBytes, BytesDown: r.ResBytes,
		TTFBMs: ms(r.TTFB), DurationMs: ms(r.Duration), Proto: r.Proto, Headers: r.Headers, LLM: r.LLM, ConnID: r.ConnID}
}

func dnsEntry(e dnsgate.Event) audit.Entry {
	kind := audit.KindDNS
	if e.Trip != nil {
		kind = audit.KindExfil
	}
	return audit.Entry{Time: e.Time, Kind: kind, Source: e.Source, Host: e.Name, DNSType: e.Type, Verdict: e.Verdict, Rule: e.Rule, Reason: e.Reason}
}

func approvalEntry(e policy.BrokerEvent) audit.Entry {
	action := "opened"
	if e.Kind == "decided" {
		action = e.Action
	}
	p := e.Pending
	en := audit.Entry{Kind: audit.KindApproval, Source: p.Source, Host: p.Host, Port: p.Port,
		Method: p.Method, URL: p.URL, ApprovalID: p.ID, Action: action,
		ApprovalKind: string(p.Kind), Request: requestText(p), Reason: p.Reason}
	if e.Rule != nil {
		en.Rule = e.Rule.Pattern.String()
	}
	return en
}

// requestText is what a member asked for through the member API, in a few
// words; "" for held traffic, which its host and URL say.
func requestText(p policy.Pending) string {
	switch {
	case !p.Requested:
		return ""
	case p.Kind == policy.AskPort:
		return p.Summary()
	}
	return string(p.Kind) + " " + p.Summary()
}
