#!/usr/bin/env bash
# Runs every Go fuzz target of the module for FUZZTIME each (default 10000x: an
# execution count; a duration such as 10m works too).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10000x}
n=0
for pkg in $($GO list ./...); do
	for target in $($GO test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
		echo "fuzz: $pkg $target ($FUZZTIME)"
		$GO test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$pkg" >/tmp/airlock-fuzz.$$ 2>&1 || {
			cat /tmp/airlock-fuzz.$$; rm -f /tmp/airlock-fuzz.$$; exit 1; }
		n=$((n + 1))
	done
done
rm -f /tmp/airlock-fuzz.$$
echo "fuzz: $n targets, $FUZZTIME each, no failure"
