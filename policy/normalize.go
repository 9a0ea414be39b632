package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/net/idna"
)

// maxHostLen is the longest DNS name in presentation form, without the
// trailing dot.
const maxHostLen = 253

// idnaProfile maps Unicode names to punycode the way a resolver would
// (UTS #46 lookup mapping, bidi rule) but lets underscores through, which
// real names such as _dmarc.example.com carry.
var idnaProfile = idna.New(
	idna.MapForLookup(),
	idna.BidiRule(),
	idna.StrictDomainName(false),
	idna.Transitional(false),
)

// ErrNotAName is wrapped by NormalizeHost's errors for input that is neither
// a DNS name nor an IPv4 address.
var ErrNotAName = errors.New("not a host name")

// NormalizeHost returns host as patterns see it: lower case, without a
// trailing dot, IDNA names as punycode, IPv4 literals in dotted form, IPv6
// literals without brackets. Names that are already normal are returned as
// they are, without allocating, so normalising on every decision is cheap.
//
// A name whose last label is numeric (such as "3405803783" or "0x7f.1") is
// refused: resolvers and URL parsers read such names as IP addresses, so they
// would slip past host rules.
func NormalizeHost(host string) (string, error) {
	if isNormalName(host) {
		return host, nil
	}
	return normalizeSlow(host)
}

func normalizeSlow(host string) (string, error) {
	h := host
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Is4() && len(h) == len(host) {
			// netip reads IPv4 only as a canonical dotted quad (no
			// leading zeros, four parts), so the input is already normal.
			return host, nil
		}
		return a.Unmap().WithZone("").String(), nil
	}
	h = strings.TrimSuffix(h, ".")
	if h == "" {
		return "", fmt.Errorf("%w: empty", ErrNotAName)
	}
	ascii := true
	for i := 0; i < len(h); i++ {
		if h[i] >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		h = strings.ToLower(h)
	} else {
		a, err := idnaProfile.ToASCII(h)
		if err != nil {
			return "", fmt.Errorf("%w: %q is not a valid internationalised name: %v", ErrNotAName, truncate(host, 80), err)
		}
		h = strings.ToLower(a)
	}
	if !isNormalName(h) {
		return "", fmt.Errorf("%w: %q", ErrNotAName, truncate(host, 80))
	}
	return h, nil
}

// IsNormalName reports whether s is a DNS name NormalizeHost returns as it
// is (see isNormalName); IP literals, which it also returns as they are,
// are not names. The DNS gate checks names it reads from the wire with it,
// without allocating.
func IsNormalName(s string) bool { return isNormalName(s) }

// isNormalName reports whether s is a lower-case ASCII DNS name without a
// trailing dot, with labels of 1 to 63 letters, digits, hyphens (not at
// either end) and underscores, and a last label that is not numeric.
func isNormalName(s string) bool {
	if len(s) == 0 || len(s) > maxHostLen {
		return false
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			c := s[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
			continue
		}
		n := i - start
		if n == 0 || n > 63 || s[start] == '-' || s[i-1] == '-' {
			return false
		}
		start = i + 1
	}
	return !numericLabel(s[lastLabel(s):])
}

func lastLabel(s string) int {
	return strings.LastIndexByte(s, '.') + 1
}

// numericLabel reports whether a last label would make a URL parser read the
// name as an IPv4 address: all digits, or a 0x hex number.
func numericLabel(l string) bool {
	if strings.HasPrefix(l, "0x") {
		return true
	}
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return true
}

// normalizePatternHost normalises the host of a pattern and refuses IP
// literals, which belong in cidr: patterns.
func normalizePatternHost(host string) (string, error) {
	if host == "" {
		return "", errors.New("no host")
	}
	h, err := NormalizeHost(host)
	if err != nil {
		return "", err
	}
	if _, err := netip.ParseAddr(h); err == nil {
		bits := 32
		if strings.Contains(h, ":") {
			return "", fmt.Errorf("%q is an IPv6 address; sandboxes are IPv4-only", host)
		}
		return "", fmt.Errorf("%q is an IP address; write cidr:%s/%d to allow a raw IP", host, h, bits)
	}
	return h, nil
}
