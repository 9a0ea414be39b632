package ui

import "testing"

// TestCarriesUploads: the larger body limit is for the sessions routes
// and /mcp only, not for any path that merely holds "/sessions".
func TestCarriesUploads(t *testing.T) {
	for path, want := range map[string]bool{
		"/mcp":                           true,
		"/mcp/dev":                       true,
		"/api/v1/sandboxes/dev/sessions": true,
		"/api/v1/sandboxes/dev/sessions/abc/files": true,
		"/mcpx":                                     false,
		"/mcp/dev/x":                                false,
		"/api/v1/sandboxes/dev/rules":               false,
		"/api/v1/sandboxes/sessions/rules":          false,
		"/api/v1/sandboxes/dev/rules/sessions":      false,
		"/api/v1/sandboxes/dev/sessionsx":           false,
		"/api/v1/sandboxes/dev/allowlist?/sessions": false,
	} {
		if got := carriesUploads(path); got != want {
			t.Errorf("carriesUploads(%q) = %v, want %v", path, got, want)
		}
	}
}
