#!/usr/bin/env bash
# Proxy part of `make bench`: runs BenchmarkProxy and BenchmarkIntercept
# (e2e/bench_test.go) once each (each speed figure in it the median of
# three rounds, the paths taking turns) and appends tables with the ratios
# of airlock to every other path to BENCHMARKS.md (BENCH_OUT), and the
# figures as "TEST PATH UNIT VALUE" lines to BENCH_DATA. QUICK=1: one
# round, less work each.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
OUT=${BENCH_OUT:-BENCHMARKS.md}
DATA=${BENCH_DATA:-/dev/null}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
ulimit -n "$(ulimit -Hn)"

units="MB/s cpu-ms/GB conns/s cpu-us/conn switches/conn req/s cpu-us/req switches/req p50-ms p99-ms KiB/conn failed"
# table FILE BENCHMARK: a markdown table of BENCHMARK's sub-benchmarks,
# named TEST/PATH, one row per test and unit, one column per path; a path
# a test does not run shows "-". A figure measured in several rounds is
# their median, with their spread (UNIT-min, UNIT-max) after it; ratios
# are of medians.
table() {
	awk -v bench="$2" -v units="$units" '
		index($1, "Benchmark" bench "/") == 1 {
			split($1, a, "/"); test = a[2]; path = a[3]; sub("-[0-9]+$", "", path)
			if (!(path in pseen)) { pseen[path] = 1; np++ }
			if (!(test in tseen)) { tseen[test] = 1; tests[++nt] = test }
			for (i = 4; i < NF; i++) {
				u = $(i+1)
				if (index(" " units " ", " " u " ")) { v[test, path, u] = $i; useen[test, u] = 1 }
				else if (u ~ /-min$/) { lo[test, path, substr(u, 1, length(u) - 4)] = $i }
				else if (u ~ /-max$/) { hi[test, path, substr(u, 1, length(u) - 4)] = $i }
			}
		}
		function num(unit, x) { return sprintf(unit ~ /ms$|KiB|cpu-us|switches/ && x < 1000 ? "%.3g" : "%.0f", x) }
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
					key = t SUBSEP paths[p] SUBSEP unit
					if (!(key in v)) { printf " - |"; continue }
					printf " %s", num(unit, v[key])
					if ((key in lo) && (key in hi)) printf " (%s–%s)", num(unit, lo[key]), num(unit, hi[key])
					printf " |"
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

AIRLOCK_BENCH_QUICK=${QUICK:-} AIRLOCK_REQUIRE_PRIVILEGED=1 $GO test -run '^$' -bench '^(BenchmarkProxy|BenchmarkIntercept)$' -benchtime 1x -count 1 -timeout 9m ./e2e | tee "$out"
grep -q '^ok' "$out" || { echo "bench-proxy: a benchmark failed"; exit 1; }
if [ -n "${QUICK:-}" ]; then
	rounds_text="Each figure is one run (make bench-quick)."
	size_text="64 MiB" isize_text="128 MiB" ka_secs=1 conn_text="600 connections"
else
	rounds_text="Each speed and CPU figure is the median of three rounds, the paths taking turns within each round, with the spread of the three (min–max) after it; ratios are of medians."
	size_text="512 MiB (one stream, or 8 of 64 MiB)" isize_text="512 MiB" ka_secs=2 conn_text="1,000 connections"
fi
awk -v units="$units" '/^Benchmark(Proxy|Intercept)\// {
	split($1, a, "/"); b = tolower(a[1]); sub("benchmark", "", b); p = a[3]; sub("-[0-9]+$", "", p)
	for (i = 4; i < NF; i++) if (index(" " units " ", " " $(i+1) " ")) print b "/" a[2], p, $(i+1), $i
}' "$out" >> "$DATA"
{
	echo
	echo "## Transparent proxy, spliced (\`go test -bench BenchmarkProxy ./e2e\`)"
	echo
	echo "Three paths crossing the same two veths to the test internet's Go HTTPS server (ECDSA P-256), all fetching by name:"
	echo "**direct** (the host only forwards), **haproxy** in transparent TCP mode (DNAT to it, upstream = original"
	echo "destination), **airlock** (a sandbox member; DNAT to airlock's proxy, which decides, dials by name and splices)."
	echo "$rounds_text"
	echo "cpu-*: the proxy process's user+system time (\`/proc/PID/stat\`) while the load ran, per GB carried, per connection"
	echo "or per request; switches/*: how many times one of its threads stopped running (it waited, or was made to yield:"
	echo "\`/proc/PID/task/*/status\`), per connection or per request."
	echo "idle: TLS connections opened (one request each) and held; the proxy's resident memory growth per connection"
	echo "(held: as many as the open-file limit lets a proxy hold with two sockets each, at most 10,000; one run)."
	echo "Downloads: curl pinned to CPU 1, $size_text a round."
	echo "Connect: sequential HTTPS requests, each on a new TLS connection (\`hey -c 1 -disable-keepalive\`, pinned to CPU 1),"
	echo "$conn_text a round; latency per request, DNS lookup and TLS handshake included (hey reports it in 0.1 ms steps)."
	echo "approval (one run): a member fetches unknown names one after another; each is approved (allow_once)"
	echo "through the API as soon as it is pending; time from the POST to the response's first byte at the member."
	echo "connect-rules=N: airlock's connection rate with its policy file at 10 and at 100,000 rules (reloaded in between)."
	echo
	table "$out" Proxy
	echo
	echo "## TLS interception (\`go test -bench BenchmarkIntercept ./e2e\`)"
	echo
	echo "HTTPS to the same server: **direct** (TLS end to end), **mitmdump** (Debian's mitmproxy) in transparent mode with"
	echo "streaming bodies, **sslsplit** splitting TLS (original destination from netfilter, upstream verified, ECDSA leaf key),"
	echo "**squid** with ssl-bump in intercept mode (peek, then bump; caching off; one worker), **airlock** with \`inspect: all\`"
	echo "(TLS terminated with a minted leaf, each request decided, recorded and forwarded over a pooled upstream connection)."
	echo "$rounds_text"
	echo "Download: curl pinned to CPU 1, $isize_text a round. Keep-alive: small responses over 8 connections for $ka_secs s a round,"
	echo "pinned to CPU 1: \`wrk -t1 -c8\` (HTTP/1.1) and \`h2load -t1 -c8 -m1\` (HTTP/2, one stream at a time per connection);"
	echo "keepalive-h1-1conn: \`wrk -t1 -c1\`, one request at a time over one connection, as one agent sends them."
	echo "Handshakes: new connections, 8 at a time, each one request, from a Go client (wrk, h2load and hey take one host name"
	echo "per run): warm = one name; cold = names under \`*.bench.test\` none of the paths has seen, new ones each round"
	echo "(airlock mints a leaf for each; sslsplit and squid copy the upstream's wildcard certificate, so their cache covers"
	echo "every name). mitmdump gets a sixteenth of the download; sslsplit a sixteenth and squid a quarter of the handshakes"
	echo "(each sslsplit connection waits ~250 ms whatever the load: latency-bound, not CPU-bound). sslsplit and squid do not"
	echo "offer HTTP/2: their keepalive-h2 row is \`h2load --h1\`, HTTP/1.1."
	echo "failed: new connections that failed, over all rounds (shown when any did; more than 1% of a round fails the run)."
	echo
	table "$out" Intercept
} >> "$OUT"
