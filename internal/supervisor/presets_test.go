package supervisor

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/internal/config"
)

func TestSeedPolicy(t *testing.T) {
	dir := t.TempDir()
	fresh := filepath.Join(dir, "fresh.yaml")
	if err := seedPolicy(config.Sandbox{Name: "default", Policy: fresh, Presets: "package-managers"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(fresh); string(b) != "sandbox:\n  presets: [package-managers]\n" {
		t.Errorf("new policy file:\n%s", b)
	}
	kept := filepath.Join(dir, "kept.yaml")
	os.WriteFile(kept, []byte("sandbox:\n  unknown_action: deny\n"), 0o644)
	if err := seedPolicy(config.Sandbox{Name: "x", Policy: kept, Presets: "python"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(kept); string(b) != "sandbox:\n  unknown_action: deny\n" {
		t.Errorf("an existing policy file changed:\n%s", b)
	}
	none := filepath.Join(dir, "none.yaml")
	if err := seedPolicy(config.Sandbox{Name: "y", Policy: none}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(none); !os.IsNotExist(err) {
		t.Errorf("a sandbox without presets got a policy file: %v", err)
	}
}
