#!/usr/bin/env bash
# Proxy part of `make bench`: runs BenchmarkProxy and BenchmarkIntercept
# (e2e/bench_test.go) once each and appends tables with the ratios of
# airlock to every other path to BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# table FILE BENCHMARK: a markdown table of BENCHMARK's sub-benchmarks,
# named TEST/PATH, one row per test and unit, one column per path.
table() {
	awk -v bench="$2" '
		index($1, "Benchmark" bench "/") == 1 {
			split($1, a, "/"); test = a[2]; path = a[3]; sub("-[0-9]+$", "", path)
			if (!(path in pseen)) { pseen[path] = 1; paths[++np] = path }
			if (!(test in tseen)) { tseen[test] = 1; tests[++nt] = test }
			for (i = 4; i < NF; i++) if ($(i+1) ~ /^(MB\/s|conns\/s|req\/s|p50-ms|p99-ms)$/) { v[test, path, $(i+1)] = $i; useen[test, $(i+1)] = 1 }
		}
		END {
			printf "| benchmark |"; for (p = 1; p <= np; p++) printf " %s |", paths[p]
			for (p = 1; p <= np; p++) if (paths[p] != "airlock") printf " airlock/%s |", paths[p]
			printf "\n|---|"; for (p = 1; p < 2 * np; p++) printf "---:|"; printf "\n"
			split("MB/s conns/s req/s p50-ms p99-ms", units, " ")
			for (k = 1; k <= nt; k++) for (u = 1; u <= 5; u++) {
				t = tests[k]; unit = units[u]
				if (!((t, unit) in useen)) continue
				printf "| %s %s |", t, unit
				for (p = 1; p <= np; p++) printf (unit ~ /ms$/ ? " %.3f |" : " %.0f |"), v[t, paths[p], unit]
				av = v[t, "airlock", unit]
				for (p = 1; p <= np; p++) if (paths[p] != "airlock") {
					ov = v[t, paths[p], unit]
					if (unit ~ /ms$/) printf " %+.3f ms |", av - ov
					else printf " %.2fx |", (ov ? av / ov : 0)
				}
				printf "\n"
			}
		}' "$1"
}

AIRLOCK_REQUIRE_PRIVILEGED=1 $GO test -run '^$' -bench '^(BenchmarkProxy|BenchmarkIntercept)$' -benchtime 1x -count 1 -timeout 10m ./e2e | tee "$out"
grep -q '^ok' "$out" || { echo "bench-proxy: a benchmark failed"; exit 1; }
{
	echo
	echo "## Transparent proxy, spliced (\`go test -bench BenchmarkProxy ./e2e\`, one run)"
	echo
	echo "Three paths crossing the same two veths to the test internet's Go HTTPS server, all fetching by name:"
	echo "**direct** (the host only forwards), **haproxy** 2.6 in transparent TCP mode (DNAT to it, upstream = original"
	echo "destination), **airlock** (a sandbox member; DNAT to airlock's proxy, which decides, dials by name and splices)."
	echo "Downloads: curl pinned to CPU 1. Connect: 2,000 sequential HTTPS requests, each on a new TLS connection (Go"
	echo "client); latency is per request, DNS lookup and TLS handshake included."
	echo "Goals: splice ≥ 0.9x direct and ≥ 1.0x haproxy; connections ≥ 0.7x direct, p99 added ≤ 0.2 ms."
	echo
	table "$out" Proxy
	echo
	echo "## TLS interception (\`go test -bench BenchmarkIntercept ./e2e\`, one run)"
	echo
	echo "HTTPS to the same server: **direct** (TLS end to end), **mitmdump** 8.1 (Debian's mitmproxy) in transparent"
	echo "mode with streaming bodies, **airlock** with \`inspect: all\` (TLS terminated with a minted leaf, each request"
	echo "decided and forwarded over a pooled upstream connection). Download: 1 GiB (64 MiB through mitmdump, whose"
	echo "rate does not depend on size once streaming), curl pinned to CPU 1. Keep-alive: small responses over 8"
	echo "connections (Go client), 20,000 requests (2,000 through mitmdump)."
	echo "Goals: ≥ 50x mitmdump requests/s, ≥ 0.5x direct bulk."
	echo
	table "$out" Intercept
	echo

} >> BENCHMARKS.md
