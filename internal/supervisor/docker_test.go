package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/config"
)

func TestCheckWorkspace(t *testing.T) {
	root := t.TempDir()
	state, project := filepath.Join(root, "state"), filepath.Join(root, "work", "project")
	for _, dir := range []string{state, project} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(root, "innocent")
	if err := os.Symlink(state, link); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{cfg: &config.Config{StateDir: state, RunDir: filepath.Join(root, "run")}}
	if got, err := d.checkWorkspace(project); err != nil || got != project {
		t.Errorf("a project directory: %q, %v", got, err)
	}
	for _, bad := range []string{"/", "/etc", "/var", "/run/docker", state, filepath.Join(state, "ca"), root, link, "relative/dir", filepath.Join(root, "missing")} {
		if _, err := d.checkWorkspace(bad); err == nil {
			t.Errorf("workspace %s accepted", bad)
		} else if strings.Contains(err.Error(), "panic") {
			t.Error(err)
		}
	}
}
