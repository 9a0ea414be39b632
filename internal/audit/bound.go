package audit

import (
	"slices"
	"strconv"
	"unicode/utf8"
)

// A record keeps at most these many bytes of what a member sent: a URL, a
// header value, all headers together, any other text. Past them it says
// how much was cut. Records live in memory (Config.Memory of them) and
// are read back a line at a time, so a member's request must not make
// one as large as the request.
const (
	maxURL     = 8 << 10
	maxText    = 1 << 10
	maxHeaders = 8 << 10
)

// cutHeader is the header that says what of a record's headers was cut:
// a name no HTTP header can have (':' is not in a token), so that a
// member cannot send it.
const cutHeader = "airlock:cut"

// bound cuts e's texts to their limits.
func bound(e *Entry) {
	e.URL = cut(e.URL, maxURL)
	for _, s := range []*string{&e.Source, &e.Agent, &e.Method, &e.Host, &e.DNSType, &e.Verdict, &e.Rule, &e.Reason,
		&e.Proto, &e.Dest, &e.Upstream, &e.Close, &e.ApprovalID, &e.Action, &e.ApprovalKind, &e.Request, &e.RuleID,
		&e.List, &e.ExposureID} {
		*s = cut(*s, maxText)
	}
	e.Headers = boundHeaders(e.Headers)
}

// cut returns s, or its first max bytes (whole characters) and how long
// it was.
func cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && i > max-utf8.UTFMax && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…[cut: " + strconv.Itoa(len(s)) + " bytes]"
}

// boundHeaders returns h, or a copy within maxHeaders: names and values
// in name order, each value within maxText, and what did not fit counted
// under cutHeader. h itself is not changed (its caller may still hold it).
func boundHeaders(h map[string][]string) map[string][]string {
	size, fits := 0, true
	for k, vv := range h {
		size += len(k)
		fits = fits && len(k) <= maxText && k != cutHeader
		for _, v := range vv {
			size += len(v)
			fits = fits && len(v) <= maxText
		}
	}
	if fits && size <= maxHeaders {
		return h
	}
	out := make(map[string][]string, len(h))
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	left, dropped := maxHeaders, 0
	for _, k := range keys {
		if k == cutHeader {
			continue // said by airlock only
		}
		name := cut(k, maxText)
		for _, v := range h[k] {
			v = cut(v, maxText)
			if len(name)+len(v) > left {
				dropped++
				continue
			}
			left -= len(name) + len(v)
			out[name] = append(out[name], v)
		}
	}
	if dropped > 0 {
		out[cutHeader] = []string{strconv.Itoa(dropped) + " header values left out of " + strconv.Itoa(size) + " bytes of headers"}
	}
	return out
}
