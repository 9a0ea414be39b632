package ui

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/audit"
)

// Client talks to airlockd's API, as the `airlock` command does.
type Client struct {
	base  string // http://host:port
	token string
	http  *http.Client
}

// NewClient returns a client for api ("http://127.0.0.1:7433" or
// "unix:/path") with the token.
func NewClient(api, token string) (*Client, error) {
	c := &Client{token: token, http: &http.Client{Timeout: 30 * time.Second}}
	if path, ok := strings.CutPrefix(api, "unix:"); ok {
		c.base = "http://airlockd"
		c.http.Transport = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}
		return c, nil
	}
	u, err := url.Parse(api)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("API address %q: want http://HOST:PORT or unix:/PATH", api)
	}
	c.base = strings.TrimRight(api, "/")
	return c, nil
}

// APIError is an error the API answered with.
type APIError struct {
	Status  int
	Message string `json:"error"`
	Hint    string `json:"hint"`
}

func (e *APIError) Error() string {
	if e.Hint != "" {
		return e.Message + " (" + e.Hint + ")"
	}
	return e.Message
}

// Do sends a request to path (under /api/v1) with an optional JSON body
// and decodes the JSON answer into out (when not nil).
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+"/api/v1"+path, r)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach airlockd at %s: %w (is it running? see --api and --config)", c.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		ae := &APIError{Status: resp.StatusCode}
		if json.Unmarshal(b, ae) != nil || ae.Message == "" {
			ae.Message = fmt.Sprintf("airlockd answered %s", resp.Status)
		}
		return ae
	}
	if out == nil {
		return nil
	}
	if raw, ok := out.(*[]byte); ok {
		*raw = b
		return nil
	}
	return json.Unmarshal(b, out)
}

// Events opens a sandbox's event stream, calls ready (when not nil) once
// the stream holds every entry added from then on, then f for each entry
// until ctx ends or the stream does. An error from ready closes the stream
// and is returned.
func (c *Client) Events(ctx context.Context, sandbox string, ready func() error, f func(audit.Entry)) error {
	req, err := http.NewRequestWithContext(ctx, "GET", c.base+"/api/v1/sandboxes/"+url.PathEscape(sandbox)+"/events", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	hc := *c.http
	hc.Timeout = 0
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach airlockd at %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		ae := &APIError{Status: resp.StatusCode}
		json.Unmarshal(b, ae)
		return ae
	}
	// airlockd subscribes before it answers: entries from here on are on
	// the stream.
	if ready != nil {
		if err := ready(); err != nil {
			return err
		}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var e audit.Entry
			if json.Unmarshal([]byte(data), &e) == nil {
				f(e)
			}
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return sc.Err()
}

// Open sends a GET for path (under /api/v1) and returns the response, for
// answers read as they come: an archive, an event stream. It has no time
// limit of its own; ctx ends it. The caller closes the body. A status of
// 300 or more is an *APIError.
func (c *Client) Open(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", c.base+"/api/v1"+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	hc := *c.http
	hc.Timeout = 0
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach airlockd at %s: %w (is it running? see --api and --config)", c.base, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		ae := &APIError{Status: resp.StatusCode}
		if json.Unmarshal(b, ae) != nil || ae.Message == "" {
			ae.Message = fmt.Sprintf("airlockd answered %s", resp.Status)
		}
		return nil, ae
	}
	return resp, nil
}

// Logs reads a Docker member's output (GET …/containers/ID/logs) and calls
// f for each line, until the output ends (with q.Follow: until the member
// ends) or ctx does.
func (c *Client) Logs(ctx context.Context, sandbox, id string, q LogQuery, f func(LogLine)) error {
	v := url.Values{}
	if q.Follow {
		v.Set("follow", "1")
	}
	if q.Tail == 0 {
		v.Set("tail", "all")
	} else {
		v.Set("tail", fmt.Sprint(q.Tail))
	}
	resp, err := c.Open(ctx, "/sandboxes/"+url.PathEscape(sandbox)+"/containers/"+url.PathEscape(id)+"/logs?"+v.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 8*MaxLogLine+4096) // a line of \u escapes
	event := ""
	for sc.Scan() {
		line := sc.Text()
		if e, ok := strings.CutPrefix(line, "event: "); ok {
			event = e
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if event == "end" {
			var end struct {
				Error string `json:"error"`
			}
			json.Unmarshal([]byte(data), &end)
			if end.Error != "" {
				return errors.New(end.Error)
			}
			return nil
		}
		var l LogLine
		if json.Unmarshal([]byte(data), &l) == nil {
			f(l)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("the log stream broke off before its end")
}
