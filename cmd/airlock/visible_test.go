package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/visible"
)

// hostile is what a member can make an approval's or a record's URL say:
// terminal escapes (clear screen, OSC 52 clipboard write, a C1 CSI), a
// forged line, line separators as padding and a right-to-left override.
const hostile = "http://unknown.test/\x1b[2J\x1b]52;c;ZXZpbA==\a\u009b31m\nDENIED nothing\u2028\u2028\u2029\u202eexe.gpj\u200b"

// TestCLIEscapesMemberText runs `airlock pending` and `airlock log`, as
// tables and as --json, against an API that answers with hostile member
// text: no byte of it that a terminal acts on comes out raw.
func TestCLIEscapesMemberText(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/approvals"):
			json.NewEncoder(w).Encode([]map[string]any{{"id": "abc123", "source": "agent" + hostile, "url": hostile, "host": "unknown.test",
				"seconds_left": 20, "suggestions": []map[string]string{{"pattern": "unknown.test\u202e"}}}})
		case strings.HasSuffix(r.URL.Path, "/requests"):
			json.NewEncoder(w).Encode([]map[string]any{{"kind": "request", "time": "2026-11-24T00:00:00Z", "sandbox": "default",
				"source": "agent\u2028", "method": "GET", "url": hostile, "verdict": "deny", "rule": "x\x1b[31m"}})
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("t"), 0o600)
	for _, args := range [][]string{
		{"pending", "default"},
		{"pending", "default", "--json"},
		{"log", "default"},
		{"log", "default", "--json"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var out bytes.Buffer
			stdout, stderr, jsonOut = terminalWriter{&out}, terminalWriter{&out}, &out
			defer func() { stdout, stderr, jsonOut = terminalWriter{os.Stdout}, terminalWriter{os.Stderr}, os.Stdout }()
			code := run(append(args, "--api", srv.URL, "--token-file", token))
			got := out.String()
			if code != 0 {
				t.Fatalf("exit %d: %s", code, got)
			}
			for i, r := range got {
				if r != '\n' && r != '\t' && visible.Unsafe(r) || r == utf8.RuneError {
					t.Fatalf("raw %U at %d in:\n%q", r, i, got)
				}
			}
			if strings.Contains(got, "\nDENIED") {
				t.Errorf("a member forged a line:\n%s", got)
			}
			if strings.Contains(strings.Join(args, " "), "json") {
				for _, line := range strings.Split(strings.TrimSpace(got), "\n") {
					if strings.HasPrefix(args[0], "log") && !json.Valid([]byte(line)) {
						t.Errorf("not JSON: %q", line)
					}
				}
				if args[0] == "pending" && !json.Valid(out.Bytes()) {
					t.Errorf("not JSON: %q", got)
				}
				if !strings.Contains(got, `\u202e`) {
					t.Errorf("the JSON lacks the escaped override: %s", got)
				}
				return
			}
			if !strings.Contains(got, `\x1b[2J`) || !strings.Contains(got, `\u{2028}`) || !strings.Contains(got, `\u{202e}`) {
				t.Errorf("the escapes are not shown:\n%s", got)
			}
		})
	}
}

// TestJSONIsTheAPIs: --json prints the API's own JSON, keys and all, not
// the CLI's Go field names.
func TestJSONIsTheAPIs(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/approvals"):
			io.WriteString(w, `[{"id":"abc","sandbox":"default","source":"agent","sources":["agent"],"host":"x.test","port":443,"url":"x.test:443","created":"2026-11-24T00:00:00Z","seconds_left":20,"waiting":1,"suggestions":[{"pattern":"x.test","label":"only x.test"}],"llm":false}]`)
		case strings.HasSuffix(r.URL.Path, "/sandboxes"):
			io.WriteString(w, `[{"name":"default","subnet":"10.88.0.0/24","policy":"/p.yaml","enabled":true,"unknown_action":"ask","approval_timeout":30,"inspect":"needed","rules":1,"pending":1,"mcp_servers":[]}]`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("t"), 0o600)
	for _, tc := range []struct {
		args []string
		keys []string
	}{
		{[]string{"pending", "default", "--json"}, []string{"id", "sandbox", "source", "url", "seconds_left", "suggestions", "waiting"}},
		{[]string{"ls", "--json"}, []string{"name", "subnet", "policy", "unknown_action", "rules", "pending"}},
	} {
		var out bytes.Buffer
		stdout, jsonOut = terminalWriter{&out}, &out
		code := run(append(tc.args, "--api", srv.URL, "--token-file", token))
		stdout, jsonOut = terminalWriter{os.Stdout}, os.Stdout
		var got []map[string]any
		if err := json.Unmarshal(out.Bytes(), &got); code != 0 || err != nil || len(got) != 1 {
			t.Fatalf("%v: exit %d, %v: %s", tc.args, code, err, out.String())
		}
		for _, k := range tc.keys {
			if _, ok := got[0][k]; !ok {
				t.Errorf("%v: no %q in %s", tc.args, k, out.String())
			}
		}
		for k := range got[0] {
			if strings.ToLower(k) != k {
				t.Errorf("%v: key %q is not the API's", tc.args, k)
			}
		}
	}
}
