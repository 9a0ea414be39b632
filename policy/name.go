package policy

import (
	"fmt"
	"regexp"
)

// nameRE is what a sandbox name may be (docs/design.md §6).
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,30}$`)

// ValidName reports whether name is a valid sandbox name: 1 to 31 lower-case
// letters, digits and hyphens, not starting with a hyphen.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("sandbox name %q: want 1 to 31 of a-z, 0-9 and -, starting with a letter or digit", name)
	}
	return nil
}
