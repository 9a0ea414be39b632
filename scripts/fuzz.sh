#!/usr/bin/env bash
# Runs every Go fuzz target of the module for FUZZTIME (default 5s) each.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-5s}
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
