#!/usr/bin/env bash
# Sessions part of `make bench`: runs BenchmarkSessions (e2e/bench_sessions_test.go)
# once, appends its table to BENCHMARKS.md (BENCH_OUT) and its figures as
# "TEST PATH UNIT VALUE" lines to BENCH_DATA. QUICK=1: 20 sessions, not 100.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
OUT=${BENCH_OUT:-BENCHMARKS.md}
DATA=${BENCH_DATA:-/dev/null}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
t0=$(date +%s)
AIRLOCK_BENCH_QUICK=${QUICK:-} AIRLOCK_REQUIRE_PRIVILEGED=1 $GO test -run '^$' -bench '^BenchmarkSessions$' -benchtime 1x -count 1 -timeout 5m ./e2e | tee "$out"
grep -q '^ok' "$out" || { echo "bench-sessions: the benchmark failed"; exit 1; }
# value unit pairs after the iteration count and ns/op.
line=$(grep -m1 '^BenchmarkSessions' "$out")
awk '{ for (i = 5; i < NF; i += 2) print "sessions mcp-local", $(i+1), $i }' <<<"$line" >> "$DATA"
get() { awk -v u="$1" '{ for (i = 5; i < NF; i += 2) if ($(i+1) == u) print $i }' <<<"$line"; }
{
	echo
	echo "## Sessions over MCP (\`go test -bench BenchmarkSessions ./e2e\`, one run, $(($(date +%s) - t0)) s with the build)"
	echo
	echo "$(printf %.0f "$(get sessions)") clients of the official Go SDK, each with an MCP session of its own over streamable HTTP,"
	echo "call \`execute_task\` at once, each for a new session whose task writes a file and fetches an allowed host through"
	echo "the proxy. The benchmark runs in the test world, whose airlockd cannot use the machine's Docker Engine, so every"
	echo "task runs on the runner without Docker, as an \`airlock run\` member (network, mount and PID namespaces, a veth on"
	echo "the bridge, a root of its own); the same run with Docker members, which would need airlockd in the machine's own"
	echo "namespace, is not measured. Time to first result: from a call to its answer. Memory: airlockd's own resident"
	echo "set (not its members'), its growth over the baseline with every client connected, per session."
	echo
	echo "| sessions | first result | median | p99 | all back | airlockd KiB per session, peak | idle after | airlockd before |"
	echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
	printf "| %.0f | %.0f ms | %.0f ms | %.0f ms | %.1f s | %.0f | %.0f | %.1f MiB |\n" "$(get sessions)" "$(get first-ms)" "$(get p50-ms)" \
		"$(get p99-ms)" "$(get all-s)" "$(get KiB/session-peak)" "$(get KiB/session-idle)" "$(get MiB-before)"
} >> "$OUT"
