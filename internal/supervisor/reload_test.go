package supervisor

import (
	"net/netip"
	"testing"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/policy"
)

// TestWidenedBy: a reload that points a sandbox at another policy file says
// what that widens, as an edit of the file would.
func TestWidenedBy(t *testing.T) {
	spec := func(yaml string) *policy.Spec {
		t.Helper()
		s, err := policy.ParseSpec("p.yaml", []byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	run := config.Sandbox{Name: "myapp", Policy: "/srv/myapp/app.yaml", Subnet: netip.MustParsePrefix("10.88.0.0/24")}
	moved := run
	moved.Policy = "/tmp/evil.yaml"
	strict := spec("sandbox:\n  unknown_action: deny\n  network_denylist:\n    - pattern: pastebin.com\n")
	for _, tc := range []struct {
		name  string
		next  config.Sandbox
		after *policy.Spec
		want  string
	}{
		{"same file, nothing wider", run, strict, ""},
		{"another file, nothing wider", moved, spec("sandbox:\n  unknown_action: deny\n  network_denylist:\n    - pattern: pastebin.com\n    - pattern: x.test\n"), ""},
		{"another file, wider", moved, spec("sandbox:\n  unknown_action: allow\n  network_allowlist:\n    user:\n      - pattern: evil.test\n"),
			"myapp: policy file /srv/myapp/app.yaml → /tmp/evil.yaml: unknown_action: deny → allow; allow rule added: evil.test; deny rule removed: pastebin.com"},
		{"same file, wider", run, spec("sandbox:\n  unknown_action: ask\n  network_denylist:\n    - pattern: pastebin.com\n"), "myapp: unknown_action: deny → ask"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := widenedBy(run, tc.next, strict, tc.after); got != tc.want {
				t.Errorf("widenedBy = %q\nwant        %q", got, tc.want)
			}
		})
	}
}
