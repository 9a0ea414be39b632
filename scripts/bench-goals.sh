#!/usr/bin/env bash
# Last step of `make bench`: computes each goal of the run from BENCH_DATA
# ("TEST PATH UNIT VALUE" lines) and puts the table in BENCH_OUT in place of
# its @GOALS@ line. $1: the run's duration in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${BENCH_OUT:-BENCHMARKS.md}
goals=$(mktemp)
trap 'rm -f "$goals"' EXIT
awk -v secs="${1:-?}" '
	{ v[$1 " " $2 " " $3] = $4 }
	function g(t, p, u) { k = t " " p " " u; if (!(k in v)) { missing = 1; return 0 }; return v[k] }
	# ratio: a/b against a floor; "≥" goals.
	function ratio(name, what, t1, p1, t2, p2, u, floor,   a, b) {
		missing = 0; a = g(t1, p1, u); b = g(t2, p2, u)
		if (missing || b == 0) { printf "| %s | %s | not measured | ≥ %.2fx | - |\n", name, what, floor; return }
		printf "| %s | %s | %.2fx | ≥ %.2fx | %s |\n", name, what, a / b, floor, (a / b >= floor ? "met" : "**missed**")
	}
	# context: a ratio shown for comparison, with no goal.
	function context(name, what, t1, p1, t2, p2, u, note,   a, b) {
		missing = 0; a = g(t1, p1, u); b = g(t2, p2, u)
		if (!missing && b > 0) printf "| %s | %s | %.2fx | — | %s |\n", name, what, a / b, note
	}
	# most: a value against a ceiling; "≤" goals.
	function most(name, what, t, p, u, ceil, shown,   a) {
		missing = 0; a = g(t, p, u)
		if (missing) { printf "| %s | %s | not measured | ≤ %s | - |\n", name, what, ceil; return }
		printf "| %s | %s | %.3g %s | ≤ %s %s | %s |\n", name, what, a, shown, ceil, shown, (a <= ceil ? "met" : "**missed**")
	}
	END {
		print "## Goals (issue 10), from this run"
		print ""
		print "Each figure below is airlock against the path named, from the tables further down. The whole run took " secs " s."
		print ""
		print "| benchmark | figure | measured | goal | |"
		print "|---|---|---:|---:|---|"
		ratio("splice bulk, 1 stream", "MB/s vs direct", "proxy/download-1GiB", "airlock", "proxy/download-1GiB", "direct", "MB/s", 0.9)
		ratio("splice bulk, 1 stream", "MB/s vs haproxy", "proxy/download-1GiB", "airlock", "proxy/download-1GiB", "haproxy", "MB/s", 1.0)
		ratio("splice bulk, 8 streams", "MB/s vs direct", "proxy/download-8x128MiB", "airlock", "proxy/download-8x128MiB", "direct", "MB/s", 0.9)
		ratio("splice bulk, 8 streams", "MB/s vs haproxy", "proxy/download-8x128MiB", "airlock", "proxy/download-8x128MiB", "haproxy", "MB/s", 1.0)
		ratio("connection rate", "conns/s vs direct", "proxy/connect", "airlock", "proxy/connect", "direct", "conns/s", 0.7)
		missing = 0; add = g("proxy/connect", "airlock", "p99-ms") - g("proxy/connect", "direct", "p99-ms")
		if (!missing) printf "| connection rate | p99 added to direct | %.3f ms | ≤ 0.2 ms | %s |\n", add, (add <= 0.2 ? "met" : "**missed**")
		missing = 0; add = g("proxy/connect", "haproxy", "p99-ms") - g("proxy/connect", "direct", "p99-ms")
		if (!missing) printf "| (for comparison) haproxy connections | p99 added to direct | %.3f ms | — | a user-space hop costs this much here |\n", add
		ratio("interception keep-alive, HTTP/1.1", "req/s vs mitmdump", "intercept/keepalive-h1", "airlock", "intercept/keepalive-h1", "mitmdump", "req/s", 50)
		context("(the ceiling here) direct keep-alive, HTTP/1.1", "req/s vs mitmdump", "intercept/keepalive-h1", "direct", "intercept/keepalive-h1", "mitmdump", "req/s", "no proxy can beat it")
		ratio("interception keep-alive, HTTP/1.1", "req/s vs sslsplit", "intercept/keepalive-h1", "airlock", "intercept/keepalive-h1", "sslsplit", "req/s", 1.0)
		ratio("interception keep-alive, HTTP/2", "req/s vs mitmdump", "intercept/keepalive-h2", "airlock", "intercept/keepalive-h2", "mitmdump", "req/s", 50)
		ratio("interception keep-alive, HTTP/2", "req/s vs sslsplit", "intercept/keepalive-h2", "airlock", "intercept/keepalive-h2", "sslsplit", "req/s", 1.0)
		ratio("interception handshakes, warm", "conns/s vs sslsplit", "intercept/handshake-warm", "airlock", "intercept/handshake-warm", "sslsplit", "conns/s", 1.0)
		ratio("interception handshakes, cold", "conns/s vs airlock warm", "intercept/handshake-cold", "airlock", "intercept/handshake-warm", "airlock", "conns/s", 0.7)
		context("(for comparison) direct handshakes, cold", "conns/s vs direct warm", "intercept/handshake-cold", "direct", "intercept/handshake-warm", "direct", "conns/s", "new names cost DNS lookups without any proxy")
		ratio("interception bulk", "MB/s vs direct", "intercept/https-download", "airlock", "intercept/https-download", "direct", "MB/s", 0.5)
		ratio("DNS, fake-IP answers", "q/s vs unbound", "dns-fake", "gate", "dns-fake", "unbound", "q/s", 1.0)
		ratio("DNS, fake-IP answers", "q/s vs dnsmasq", "dns-fake", "gate", "dns-fake", "dnsmasq", "q/s", 1.0)
		ratio("DNS, denied names", "q/s vs unbound", "dns-denied", "gate", "dns-denied", "unbound", "q/s", 1.0)
		ratio("DNS, denied names", "q/s vs dnsmasq", "dns-denied", "gate", "dns-denied", "dnsmasq", "q/s", 1.0)
		ratio("DNS, forwarded TXT", "q/s vs unbound", "dns-txt", "gate", "dns-txt", "unbound", "q/s", 1.0)
		ratio("DNS, forwarded TXT", "q/s vs dnsmasq", "dns-txt", "gate", "dns-txt", "dnsmasq", "q/s", 1.0)
		most("idle connections, spliced", "memory per held connection", "proxy/idle", "airlock", "KiB/conn", 16, "KiB")
		most("idle connections, intercepted", "memory per held connection", "intercept/idle", "airlock", "KiB/conn", 64, "KiB")
		ratio("rule scale", "conns/s at 100,000 rules vs 10", "proxy/connect-rules=100000", "airlock", "proxy/connect-rules=10", "airlock", "conns/s", 0.95)
		ratio("rule scale", "DNS fake-IP q/s at 100,000 rules vs 10", "dns-fake", "rules=100000", "dns-fake", "rules=10", "q/s", 0.95)
		ratio("rule scale", "DNS denied q/s at 100,000 rules vs 10", "dns-denied", "rules=100000", "dns-denied", "rules=10", "q/s", 0.95)
		most("approval latency", "decision POST → first byte, p99", "proxy/approval", "airlock", "p99-ms", 50, "ms")
	}' "${BENCH_DATA:?}" > "$goals"
awk -v f="$goals" '$0 == "@GOALS@" { while ((getline l < f) > 0) print l; next } { print }' "$OUT" > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
