package supervisor

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/policy"
)

// seedPolicy writes the presets a sandbox's config names into its policy
// file when the file does not exist yet: the built-in config's sandbox
// starts with package-managers that way. A file that exists says what it
// says.
func seedPolicy(sb config.Sandbox) error {
	if sb.Presets == "" {
		return nil
	}
	if _, err := os.Stat(sb.Policy); !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	names := strings.Split(sb.Presets, ",")
	if err := policy.SetSettings(sb.Policy, policy.Settings{Presets: &names}); err != nil {
		return fmt.Errorf("sandbox %s: start its policy file with presets %s: %w", sb.Name, sb.Presets, err)
	}
	return nil
}
