#!/usr/bin/env bash
# Proxy part of `make bench`: runs BenchmarkProxy (e2e/bench_test.go) once
# and appends a table with ratios to direct and to haproxy to BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
AIRLOCK_REQUIRE_PRIVILEGED=1 $GO test -run '^$' -bench '^BenchmarkProxy$' -benchtime 1x -count 1 -timeout 10m ./e2e | tee "$out"
grep -q '^ok' "$out" || { echo "bench-proxy: BenchmarkProxy failed"; exit 1; }
{
	echo
	echo "## Transparent proxy (\`go test -bench BenchmarkProxy ./e2e\`, one run)"
	echo
	echo "Three paths crossing the same two veths to the test internet's Go HTTP server, all fetching by name:"
	echo "**direct** (the host only forwards), **haproxy** 2.6 in transparent TCP mode (DNAT to it, upstream = original"
	echo "destination), **airlock** (a sandbox member; DNAT to airlock's proxy, which decides, dials by name and splices)."
	echo "Downloads: curl pinned to CPU 1. Connect: 2,000 sequential HTTP requests, each on a new connection (Go client);"
	echo "latency is per request, DNS lookup included."
	echo "Goals (issue 4/10): splice ≥ 0.9x direct and ≥ 1.0x haproxy; connections ≥ 0.7x direct, p99 added ≤ 0.2 ms."
	echo
	echo "| benchmark | direct | haproxy | airlock | airlock/direct | airlock/haproxy |"
	echo "|---|---:|---:|---:|---:|---:|"
	awk '
		/^BenchmarkProxy\// {
			split($1, a, "/"); test = a[2]; path = a[3]; sub("-[0-9]+$", "", path)
			for (i = 4; i < NF; i++) if ($(i+1) ~ /^(MB\/s|conns\/s|p50-ms|p99-ms)$/) v[test, path, $(i+1)] = $i
			if (!(test in seen)) { seen[test] = 1; order[++n] = test }
		}
		END {
			for (k = 1; k <= n; k++) {
				t = order[k]
				split("MB/s conns/s p50-ms p99-ms", units, " ")
				for (u = 1; u <= 4; u++) {
					unit = units[u]
					if (!((t, "direct", unit) in v)) continue
					dv = v[t, "direct", unit]; hv = v[t, "haproxy", unit]; av = v[t, "airlock", unit]
					if (unit ~ /ms$/)
						printf "| %s %s | %.3f | %.3f | %.3f | +%.3f ms | %+.3f ms |\n", t, unit, dv, hv, av, av - dv, av - hv
					else
						printf "| %s %s | %.0f | %.0f | %.0f | %.2fx | %.2fx |\n", t, unit, dv, hv, av, av / dv, av / hv
				}
			}
		}' "$out"
} >> BENCHMARKS.md
