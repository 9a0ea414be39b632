package supervisor

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/internal/config"
)

// TestSeedPolicyFollowsNoMemberDirLink: at airlockd's start the policy
// file is missing and its directory is a link of another user (a member)
// to elsewhere: seeding the file writes nothing where the link points.
func TestSeedPolicyFollowsNoMemberDirLink(t *testing.T) {
	base := t.TempDir()
	proj := filepath.Join(base, "proj")
	outside := filepath.Join(base, "outside")
	os.MkdirAll(proj, 0o755)
	os.MkdirAll(outside, 0o755)
	link := filepath.Join(proj, "conf")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 65534, 65534); err != nil {
		t.Skip(err)
	}
	err := seedPolicy(config.Sandbox{Name: "default", Policy: filepath.Join(link, "app.yaml"), Presets: "package-managers"})
	t.Logf("seedPolicy: %v", err)
	if _, err := os.Lstat(filepath.Join(outside, "app.yaml")); err == nil {
		t.Errorf("seedPolicy wrote %s through a member's link", filepath.Join(outside, "app.yaml"))
	}
}
