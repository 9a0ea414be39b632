package supervisor

import (
	"net/netip"
	"reflect"
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

// TestPlan: what a reload does to each sandbox of the config, decided from
// the two configs alone.
func TestPlan(t *testing.T) {
	sb := func(name, subnet, pol string) config.Sandbox {
		return config.Sandbox{Name: name, Subnet: netip.MustParsePrefix(subnet), Policy: pol}
	}
	a, b, c := sb("a", "10.88.0.0/24", "/a.yaml"), sb("b", "10.88.1.0/24", "/b.yaml"), sb("c", "10.88.2.0/24", "/c.yaml")
	for _, tc := range []struct {
		name          string
		running, next []config.Sandbox
		want          reloadPlan
	}{
		{"nothing changed", []config.Sandbox{a, b}, []config.Sandbox{a, b}, reloadPlan{Keep: []string{"a", "b"}}},
		{"one removed, one added", []config.Sandbox{a, b}, []config.Sandbox{a, c}, reloadPlan{Keep: []string{"a"}, Remove: []string{"b"}, Add: []config.Sandbox{c}}},
		{"another policy file, same subnet", []config.Sandbox{a}, []config.Sandbox{sb("a", "10.88.0.0/24", "/evil.yaml")},
			reloadPlan{Restart: []config.Sandbox{sb("a", "10.88.0.0/24", "/evil.yaml")}}},
		{"another subnet", []config.Sandbox{a}, []config.Sandbox{sb("a", "10.88.9.0/24", "/a.yaml")},
			reloadPlan{Replace: []config.Sandbox{sb("a", "10.88.9.0/24", "/a.yaml")}}},
		{"a subnet freed and taken", []config.Sandbox{a, b}, []config.Sandbox{sb("c", "10.88.1.0/24", "/c.yaml"), a},
			reloadPlan{Keep: []string{"a"}, Remove: []string{"b"}, Add: []config.Sandbox{sb("c", "10.88.1.0/24", "/c.yaml")}}},
		{"first start of a config", nil, []config.Sandbox{a, b}, reloadPlan{Add: []config.Sandbox{a, b}}},
		{"all gone", []config.Sandbox{a}, nil, reloadPlan{Remove: []string{"a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := plan(tc.running, tc.next); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("plan = %+v\nwant   %+v", got, tc.want)
			}
		})
	}
}
