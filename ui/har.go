package ui

import (
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/policy"
)

// HAR 1.2 (http://www.softwareishard.com/blog/har-12-spec/), the parts
// airlock fills. Custom fields start with "_".
type harLog struct {
	Log harBody `json:"log"`
}

type harBody struct {
	Version string     `json:"version"`
	Creator harCreator `json:"creator"`
	Entries []harEntry `json:"entries"`
}

type harCreator struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

type harEntry struct {
	StartedDateTime string      `json:"startedDateTime"`
	Time            float64     `json:"time"`
	Request         harRequest  `json:"request"`
	Response        harResponse `json:"response"`
	Cache           struct{}    `json:"cache"`
	Timings         harTimings  `json:"timings"`
	ServerIPAddress string      `json:"serverIPAddress,omitempty"`
	Connection      string      `json:"connection,omitempty"`
	Source          string      `json:"_source"`
	Verdict         string      `json:"_verdict"`
	Rule            string      `json:"_rule,omitempty"`
	Reason          string      `json:"_reason,omitempty"`
	Sandbox         string      `json:"_sandbox"`
	LLM             bool        `json:"_llm"`
}

type harNV struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type harRequest struct {
	Method      string  `json:"method"`
	URL         string  `json:"url"`
	HTTPVersion string  `json:"httpVersion"`
	Cookies     []harNV `json:"cookies"`
	Headers     []harNV `json:"headers"`
	QueryString []harNV `json:"queryString"`
	HeadersSize int     `json:"headersSize"`
	BodySize    int64   `json:"bodySize"`
}

type harResponse struct {
	Status      int        `json:"status"`
	StatusText  string     `json:"statusText"`
	HTTPVersion string     `json:"httpVersion"`
	Cookies     []harNV    `json:"cookies"`
	Headers     []harNV    `json:"headers"`
	Content     harContent `json:"content"`
	RedirectURL string     `json:"redirectURL"`
	HeadersSize int        `json:"headersSize"`
	BodySize    int64      `json:"bodySize"`
}

type harContent struct {
	Size     int64  `json:"size"`
	MimeType string `json:"mimeType"`
}

type harTimings struct {
	Send    float64 `json:"send"`
	Wait    float64 `json:"wait"`
	Receive float64 `json:"receive"`
}

// har exports traffic as HAR 1.2: intercepted requests as full entries,
// spliced or refused connections as CONNECT entries.
func (s *Server) har(c echo.Context) error {
	f, err := filterFrom(c, trafficKinds)
	if err != nil {
		return err
	}
	sb := sandboxOf(c)
	out := harLog{Log: harBody{Version: "1.2", Creator: harCreator{Name: "airlock", Version: "0"}, Entries: []harEntry{}}}
	for _, e := range sb.Journal().Query(f) {
		out.Log.Entries = append(out.Log.Entries, harFrom(e))
	}
	c.Response().Header().Set("Content-Disposition", `attachment; filename="`+sb.Name()+`.har"`)
	return c.JSON(http.StatusOK, out)
}

func harFrom(e audit.Entry) harEntry {
	h := harEntry{
		StartedDateTime: e.Time.UTC().Format(time.RFC3339Nano),
		Time:            e.DurationMs,
		Source:          e.Source, Verdict: e.Verdict, Rule: e.Rule, Reason: e.Reason, Sandbox: e.Sandbox, LLM: e.LLM,
		Connection: strconv.FormatUint(e.ConnID, 10),
	}
	empty := []harNV{}
	if e.Kind == audit.KindRequest {
		version := "HTTP/1.1"
		if e.Proto != "" {
			version = e.Proto
		}
		var headers []harNV
		for k, vs := range e.Headers {
			for _, v := range vs {
				headers = append(headers, harNV{k, v})
			}
		}
		sort.Slice(headers, func(i, j int) bool { return headers[i].Name < headers[j].Name })
		if headers == nil {
			headers = empty
		}
		h.Request = harRequest{Method: e.Method, URL: e.URL, HTTPVersion: version, Cookies: empty, Headers: headers,
			QueryString: empty, HeadersSize: -1, BodySize: e.BytesUp}
		h.Response = harResponse{Status: e.Status, StatusText: http.StatusText(e.Status), HTTPVersion: version,
			Cookies: empty, Headers: empty, Content: harContent{Size: e.BytesDown, MimeType: ""}, HeadersSize: -1, BodySize: e.BytesDown}
		h.Timings = harTimings{Send: 0, Wait: e.TTFBMs, Receive: max(0, e.DurationMs-e.TTFBMs)}
		return h
	}
	status := 200
	if e.Verdict != "allow" && e.Verdict != policy.LearnedVerdict {
		status = 403
	}
	h.ServerIPAddress = hostOnly(e.Upstream)
	h.Request = harRequest{Method: "CONNECT", URL: e.Host + ":" + strconv.Itoa(int(e.Port)), HTTPVersion: "HTTP/1.1",
		Cookies: empty, Headers: empty, QueryString: empty, HeadersSize: -1, BodySize: e.BytesUp}
	h.Response = harResponse{Status: status, StatusText: http.StatusText(status), HTTPVersion: "HTTP/1.1",
		Cookies: empty, Headers: empty, Content: harContent{Size: e.BytesDown, MimeType: "application/octet-stream"},
		HeadersSize: -1, BodySize: e.BytesDown}
	h.Timings = harTimings{Send: 0, Wait: 0, Receive: e.DurationMs}
	return h
}

func hostOnly(hostport string) string {
	for i := len(hostport) - 1; i >= 0; i-- {
		if hostport[i] == ':' {
			return hostport[:i]
		}
	}
	return hostport
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
