#!/usr/bin/env bash
# Proxy part of `make bench`: runs BenchmarkProxy and BenchmarkIntercept
# (e2e/bench_test.go) once each and appends tables with the ratios of
# airlock to every other path to BENCHMARKS.md (BENCH_OUT), and the figures
# as "TEST PATH UNIT VALUE" lines to BENCH_DATA. QUICK=1: less work each.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
OUT=${BENCH_OUT:-BENCHMARKS.md}
DATA=${BENCH_DATA:-/dev/null}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
ulimit -n "$(ulimit -Hn)"

units="MB/s cpu-ms/GB conns/s req/s p50-ms p99-ms KiB/conn failed"
# table FILE BENCHMARK: a markdown table of BENCHMARK's sub-benchmarks,
# named TEST/PATH, one row per test and unit, one column per path; a path
# a test does not run shows "-".
table() {
	awk -v bench="$2" -v units="$units" '
		index($1, "Benchmark" bench "/") == 1 {
			split($1, a, "/"); test = a[2]; path = a[3]; sub("-[0-9]+$", "", path)
			if (!(path in pseen)) { pseen[path] = 1; np++ }
			if (!(test in tseen)) { tseen[test] = 1; tests[++nt] = test }
			for (i = 4; i < NF; i++) if (index(" " units " ", " " $(i+1) " ")) { v[test, path, $(i+1)] = $i; useen[test, $(i+1)] = 1 }
		}
		END {
			# Columns in a fixed order: the physical limit first, airlock last.
			n = 0; split("direct haproxy mitmdump sslsplit squid airlock", order, " ")
			for (i = 1; i <= 6; i++) if (order[i] in pseen) paths[++n] = order[i]
			printf "| benchmark |"; for (p = 1; p <= np; p++) printf " %s |", paths[p]
			for (p = 1; p <= np; p++) if (paths[p] != "airlock") printf " airlock/%s |", paths[p]
			printf "\n|---|"; for (p = 1; p < 2 * np; p++) printf "---:|"; printf "\n"
			nu = split(units, us, " ")
			for (k = 1; k <= nt; k++) for (u = 1; u <= nu; u++) {
				t = tests[k]; unit = us[u]
				if (!((t, unit) in useen)) continue
				printf "| %s %s |", t, unit
				for (p = 1; p <= np; p++) {
					if (!((t, paths[p], unit) in v)) printf " - |"
					else printf (unit ~ /ms$|KiB/ ? " %.3g |" : " %.0f |"), v[t, paths[p], unit]
				}
				for (p = 1; p <= np; p++) if (paths[p] != "airlock") {
					if (!((t, "airlock", unit) in v) || !((t, paths[p], unit) in v)) { printf " - |"; continue }
					av = v[t, "airlock", unit]; ov = v[t, paths[p], unit]
					if (unit ~ /-ms$/) printf " %+.2f ms |", av - ov
					else printf " %.2fx |", (ov ? av / ov : 0)
				}
				printf "\n"
			}
		}' "$1"
}

AIRLOCK_BENCH_QUICK=$QUICK AIRLOCK_REQUIRE_PRIVILEGED=1 $GO test -run '^$' -bench '^(BenchmarkProxy|BenchmarkIntercept)$' -benchtime 1x -count 1 -timeout 9m ./e2e | tee "$out"
grep -q '^ok' "$out" || { echo "bench-proxy: a benchmark failed"; exit 1; }
awk -v units="$units" '/^Benchmark(Proxy|Intercept)\// {
	split($1, a, "/"); b = tolower(a[1]); sub("benchmark", "", b); p = a[3]; sub("-[0-9]+$", "", p)
	for (i = 4; i < NF; i++) if (index(" " units " ", " " $(i+1) " ")) print b "/" a[2], p, $(i+1), $i
}' "$out" >> "$DATA"
{
	echo
	echo "## Transparent proxy, spliced (\`go test -bench BenchmarkProxy ./e2e\`, one run)"
	echo
	echo "Three paths crossing the same two veths to the test internet's Go HTTPS server (ECDSA P-256), all fetching by name:"
	echo "**direct** (the host only forwards), **haproxy** in transparent TCP mode (DNAT to it, upstream = original"
	echo "destination), **airlock** (a sandbox member; DNAT to airlock's proxy, which decides, dials by name and splices)."
	echo "idle: TLS connections opened (one request each) and held; the proxy's resident memory growth per connection"
	echo "(held: as many as the open-file limit lets a proxy hold with two sockets each, at most 10,000)."
	echo "Downloads: curl pinned to CPU 1; cpu-ms/GB is the proxy process's user+system time per GB carried."
	echo "Connect: sequential HTTPS requests, each on a new TLS connection (\`hey -c 1 -disable-keepalive\`, pinned to CPU 1);"
	echo "latency per request, DNS lookup and TLS handshake included (hey reports it in 0.1 ms steps); three runs of a third"
	echo "each, the one with the median rate shown (the machine stalls now and then, and one stall is a run's p99). approval: a member fetches unknown names one after another; each is approved (allow_once)"
	echo "through the API as soon as it is pending; time from the POST to the response's first byte at the member."
	echo "connect-rules=N: airlock's connection rate with its policy file at 10 and at 100,000 rules (reloaded in between)."
	echo "Goals: splice ≥ 0.9x direct and ≥ 1.0x haproxy; connections ≥ 0.7x direct, p99 added ≤ 0.2 ms; idle ≤ 16 KiB;"
	echo "approval p99 ≤ 50 ms; 100,000 rules ≤ 5 % slower than 10."
	echo
	table "$out" Proxy
	echo
	echo "## TLS interception (\`go test -bench BenchmarkIntercept ./e2e\`, one run)"
	echo
	echo "HTTPS to the same server: **direct** (TLS end to end), **mitmdump** (Debian's mitmproxy) in transparent mode with"
	echo "streaming bodies, **sslsplit** splitting TLS (original destination from netfilter, upstream verified, ECDSA leaf key),"
	echo "**squid** with ssl-bump in intercept mode (peek, then bump; caching off; one worker), **airlock** with \`inspect: all\`"
	echo "(TLS terminated with a minted leaf, each request decided and forwarded over a pooled upstream connection)."
	echo "Download: 1 GiB, curl pinned to CPU 1. Keep-alive: small responses over 8 connections for $( [ -n "$QUICK" ] && echo 1 || echo 3 ) s, pinned to CPU 1:"
	echo "\`wrk -t1 -c8\` (HTTP/1.1) and \`h2load -t1 -c8 -m1\` (HTTP/2, one stream at a time per connection). Handshakes: new"
	echo "connections, 8 at a time, each one request, from a Go client (wrk, h2load and hey take one host name per run):"
	echo "warm = one name; cold = 10,000 names under \`*.bench.test\` (airlock mints a leaf for each; sslsplit and squid copy"
	echo "the upstream's wildcard certificate, so their cache covers every name). mitmdump gets a sixteenth of the download;"
	echo "sslsplit a sixteenth and squid a quarter of the handshakes (each sslsplit connection waits ~250 ms whatever the"
	echo "load: latency-bound, not CPU-bound). sslsplit and squid do not offer HTTP/2: their keepalive-h2 row is"
	echo "\`h2load --h1\`, HTTP/1.1."
	echo "failed: new connections that failed (shown when any did; more than 1% fails the run)."
	echo "Goals: keep-alive ≥ 50x mitmdump and ≥ 1.0x sslsplit; warm handshakes ≥ 1.0x sslsplit, cold ≥ 0.7x warm;"
	echo "bulk ≥ 0.5x direct; idle ≤ 64 KiB."
	echo
	table "$out" Intercept
} >> "$OUT"
