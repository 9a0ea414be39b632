// Package airlock_test checks properties of the whole module: the direction of
// its package dependencies and that every package says what it is for.
package airlock_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/airlockhq/airlock"

// TestDependencyArrows keeps dependencies flowing one way (docs/design.md §2):
// cmd → ui, netns, tproxy, dnsgate → policy. policy touches neither the
// network nor the kernel.
func TestDependencyArrows(t *testing.T) {
	forbidden := map[string][]string{
		"policy": {"github.com/vishvananda/netlink", "github.com/google/nftables",
			"github.com/labstack/echo/v4", "github.com/miekg/dns", "github.com/docker/docker/client",
			module + "/dnsgate", module + "/tproxy", module + "/netns", module + "/ui"},
		"dnsgate": {"github.com/labstack/echo/v4", module + "/tproxy", module + "/netns", module + "/ui"},
		"tproxy":  {"github.com/labstack/echo/v4", "github.com/docker/docker/client", module + "/netns", module + "/ui"},
		"netns":   {"github.com/labstack/echo/v4", module + "/tproxy", module + "/dnsgate", module + "/ui"},
		"ui":      {"github.com/vishvananda/netlink", "github.com/google/nftables"},
		// The member API only asks the approvals broker: it reaches nothing
		// else (design §5.10).
		"memberapi": {"github.com/labstack/echo/v4", "github.com/docker/docker/client", "github.com/vishvananda/netlink",
			"github.com/google/nftables", module + "/dnsgate", module + "/tproxy", module + "/netns", module + "/ui"},
	}
	// policy may not use the network itself. golang.org/x/net/publicsuffix
	// brings in net/http/cookiejar, so check direct imports for these.
	out, err := exec.Command("go", "list", "-f", "{{join .Imports \"\\n\"}}", "./policy").Output()
	if err != nil {
		t.Fatalf("go list ./policy: %v", err)
	}
	for _, imp := range strings.Fields(string(out)) {
		if imp == "net" || strings.HasPrefix(imp, "net/http") || imp == "os/exec" {
			t.Errorf("policy imports %s; it must not touch the network or run programs", imp)
		}
	}
	for pkg, bad := range forbidden {
		out, err := exec.Command("go", "list", "-deps", "./"+pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps ./%s: %v", pkg, err)
		}
		deps := map[string]bool{}
		for _, d := range strings.Fields(string(out)) {
			deps[d] = true
		}
		for _, b := range bad {
			if deps[b] {
				t.Errorf("%s imports %s (directly or not); docs/design.md §2 forbids it", pkg, b)
			}
		}
	}
}

// TestPackagesHaveDocs fails for a package without a "// Package x" comment.
func TestPackagesHaveDocs(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}\t{{.Doc}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, doc, _ := strings.Cut(line, "\t")
		if strings.TrimSpace(doc) == "" {
			t.Errorf("package %s has no package doc comment", path)
		}
	}
}
