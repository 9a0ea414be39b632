package dnsgatetest

import "testing"

func TestLookupAWildcard(t *testing.T) {
	s := &Server{A: map[string]string{"a.test": "203.0.113.1", "*.b.test": "203.0.113.2", "x.b.test": "203.0.113.3"}}
	for _, tc := range []struct {
		name, want string
		ok         bool
	}{
		{name: "a.test", want: "203.0.113.1", ok: true},
		{name: "h1.b.test", want: "203.0.113.2", ok: true},
		{name: "deep.h1.b.test", want: "203.0.113.2", ok: true},
		{name: "x.b.test", want: "203.0.113.3", ok: true},
		{name: "b.test"},
		{name: "h1.a.test"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := s.lookupA(tc.name)
			if got != tc.want || ok != tc.ok {
				t.Errorf("lookupA(%q) = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
			}
		})
	}
}
