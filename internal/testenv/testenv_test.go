package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestCheck runs check in a child process, so that its Skip and Fatal are
// observed from outside, with and without RequireEnv.
func TestCheck(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "1" {
		check(t, false, "test reason")
		return
	}
	tests := []struct {
		name    string
		require string
		wantOut string
		wantErr bool
	}{
		{name: "skips by default", require: "", wantOut: "privileged test skipped: test reason", wantErr: false},
		{name: "fails when required", require: "1", wantOut: "privileged test cannot run: test reason", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestCheck$", "-test.v")
			cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", RequireEnv+"="+tt.require)
			out, err := cmd.CombinedOutput()
			if (err != nil) != tt.wantErr {
				t.Errorf("child exit error = %v, want error %v\n%s", err, tt.wantErr, out)
			}
			if !strings.Contains(string(out), tt.wantOut) {
				t.Errorf("child output lacks %q:\n%s", tt.wantOut, out)
			}
		})
	}
}
