package e2e

import (
	"os"
	"testing"

	"github.com/airlockhq/airlock/internal/testworld"
)

// TestMain removes the airlockd and airlock binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	testworld.RemoveBinaries()
	os.Exit(code)
}
