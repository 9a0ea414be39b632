#!/usr/bin/env bash
# Last step of `make bench`: computes each goal of the run from BENCH_DATA
# ("TEST PATH UNIT VALUE" lines, medians where a figure was measured in
# rounds) and puts the goals table in BENCH_OUT in place of its @GOALS@
# line; then appends, from scripts/bench-notes.md, what the profile shows
# for each goal the run missed, and the notes on the rest. $1: the run's
# duration in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${BENCH_OUT:-BENCHMARKS.md}
NOTES=scripts/bench-notes.md
goals=$(mktemp) missed=$(mktemp)
trap 'rm -f "$goals" "$missed"' EXIT
rounds="the median of three, the paths taking turns"
[ -n "${QUICK:-}" ] && rounds="one run each in make bench-quick"
awk -v secs="${1:-?}" -v missedfile="$missed" -v rounds="$rounds" '
	{ v[$1 " " $2 " " $3] = $4 }
	function g(t, p, u) { k = t " " p " " u; if (!(k in v)) { missing = 1; return 0 }; return v[k] }
	function verdict(ok, id) { if (ok) return "met"; print id > missedfile; return "**missed**" }
	# ratio: a/b of one unit against a floor ("≥" goals); what names the two figures.
	function ratio(name, id, t1, p1, t2, p2, u, floor, fmt,   a, b) {
		missing = 0; a = g(t1, p1, u); b = g(t2, p2, u)
		if (missing || b == 0) { printf "| %s | not measured | | ≥ %.2fx | - |\n", name, floor; print id > missedfile; return }
		printf "| %s | %.2fx | " fmt " vs " fmt " | ≥ %.2fx | %s |\n", name, a / b, a, b, floor, verdict(a / b >= floor, id)
	}
	# cheaper: a/b of a cost against a ceiling ("≤" goals).
	function cheaper(name, id, t1, p1, t2, p2, u, ceil, fmt,   a, b) {
		missing = 0; a = g(t1, p1, u); b = g(t2, p2, u)
		if (missing || b == 0) { printf "| %s | not measured | | ≤ %.2fx | - |\n", name, ceil; print id > missedfile; return }
		printf "| %s | %.2fx | " fmt " vs " fmt " | ≤ %.2fx | %s |\n", name, a / b, a, b, ceil, verdict(a / b <= ceil, id)
	}
	# context: a ratio shown for comparison, with no goal.
	function context(name, t1, p1, t2, p2, u, fmt,   a, b) {
		missing = 0; a = g(t1, p1, u); b = g(t2, p2, u)
		if (!missing && b > 0) printf "| %s | %.2fx | " fmt " vs " fmt " |\n", name, a / b, a, b
	}
	# most: a value against a ceiling.
	function most(name, t, p, u, ceil, shown,   a) {
		missing = 0; a = g(t, p, u)
		if (missing) { printf "| %s | not measured | ≤ %s %s | - |\n", name, ceil, shown; return }
		printf "| %s | %.3g %s | ≤ %s %s | %s |\n", name, a, shown, ceil, shown, (a <= ceil ? "met" : "**missed**")
	}
	# least: a ratio against a floor, for the issue 10 table.
	function least(name, t1, p1, t2, p2, u, floor,   a, b) {
		missing = 0; a = g(t1, p1, u); b = g(t2, p2, u)
		if (missing || b == 0) { printf "| %s | not measured | ≥ %.2fx | - |\n", name, floor; return }
		printf "| %s | %.2fx | ≥ %.2fx | %s |\n", name, a / b, floor, (a / b >= floor ? "met" : "**missed**")
	}
	END {
		print "## Goals (issue 21), from this run"
		print ""
		print "Each ratio is of the medians in the tables further down (" rounds "); the figures it"
		print "divides follow it. The whole run took " secs " s."
		print ""
		print "| goal | measured | figures | target | |"
		print "|---|---:|---|---:|---|"
		ratio("new TLS connections/s, airlock vs direct", "conn", "proxy/connect", "airlock", "proxy/connect", "direct", "conns/s", 0.75, "%.0f")
		missing = 0
		add = g("proxy/connect", "airlock", "p99-ms") - g("proxy/connect", "direct", "p99-ms")
		hadd = g("proxy/connect", "haproxy", "p99-ms") - g("proxy/connect", "direct", "p99-ms")
		if (missing) { print "| p99 added per connection, vs haproxy'"'"'s | not measured | | ≤ haproxy'"'"'s | - |"; print "conn" > missedfile }
		else printf "| p99 added per connection, airlock vs haproxy | %+.2f ms | %+.2f ms vs %+.2f ms (p99 %.1f ms direct) | ≤ haproxy'"'"'s | %s |\n", add, add, hadd, g("proxy/connect", "direct", "p99-ms"), verdict(add <= hadd, "conn")
		cheaper("CPU per new connection, airlockd vs haproxy", "conn", "proxy/connect", "airlock", "proxy/connect", "haproxy", "cpu-us/conn", 1.0, "%.0f µs")
		ratio("DNS fake-IP answers q/s, gate vs unbound", "dns", "dns-fake", "gate", "dns-fake", "unbound", "q/s", 1.0, "%.0f")
		ratio("DNS fake-IP answers q/s, gate vs dnsmasq", "dns", "dns-fake", "gate", "dns-fake", "dnsmasq", "q/s", 1.0, "%.0f")
		ratio("DNS denied names q/s, gate vs unbound", "dns", "dns-denied", "gate", "dns-denied", "unbound", "q/s", 1.0, "%.0f")
		ratio("DNS denied names q/s, gate vs dnsmasq", "dns", "dns-denied", "gate", "dns-denied", "dnsmasq", "q/s", 1.0, "%.0f")
		ratio("DNS fake-IP q/s at 100,000 rules vs 10", "dns-rules", "dns-fake", "rules=100000", "dns-fake", "rules=10", "q/s", 0.95, "%.0f")
		ratio("interception keep-alive HTTP/1.1 req/s, airlock vs sslsplit", "keepalive-h1", "intercept/keepalive-h1", "airlock", "intercept/keepalive-h1", "sslsplit", "req/s", 1.0, "%.0f")
		ratio("interception keep-alive HTTP/2 req/s, airlock vs sslsplit", "keepalive-h2", "intercept/keepalive-h2", "airlock", "intercept/keepalive-h2", "sslsplit", "req/s", 1.0, "%.0f")
		ratio("splice, 8 streams, MB/s, airlock vs haproxy", "splice", "proxy/download-8x64MiB", "airlock", "proxy/download-8x64MiB", "haproxy", "MB/s", 1.0, "%.0f")
		print ""
		print "CPU time per unit of work, the proxy'"'"'s own (user+system, medians; no goals but the one above): noise on this"
		print "machine moves it far less than throughput. Beside it, how often the proxy'"'"'s threads stopped running (waited or"
		print "yielded) per unit of work: each switch is a trip through the kernel'"'"'s scheduler, which this machine makes dear."
		print ""
		print "| work | airlock vs peer | figures |"
		print "|---|---:|---|"
		context("a new TLS connection, spliced: airlockd vs haproxy", "proxy/connect", "airlock", "proxy/connect", "haproxy", "cpu-us/conn", "%.0f µs")
		context("thread switches per new connection, spliced: airlockd vs haproxy", "proxy/connect", "airlock", "proxy/connect", "haproxy", "switches/conn", "%.1f")
		context("a GB spliced, 8 streams: airlockd vs haproxy", "proxy/download-8x64MiB", "airlock", "proxy/download-8x64MiB", "haproxy", "cpu-ms/GB", "%.0f ms")
		context("a DNS fake-IP answer: gate vs unbound", "dns-fake", "gate", "dns-fake", "unbound", "cpu-us/q", "%.2f µs")
		context("a DNS fake-IP answer: gate vs dnsmasq", "dns-fake", "gate", "dns-fake", "dnsmasq", "cpu-us/q", "%.2f µs")
		context("a DNS denial: gate vs unbound", "dns-denied", "gate", "dns-denied", "unbound", "cpu-us/q", "%.2f µs")
		context("a DNS denial: gate vs dnsmasq", "dns-denied", "gate", "dns-denied", "dnsmasq", "cpu-us/q", "%.2f µs")
		context("an intercepted request, HTTP/1.1 keep-alive: airlockd vs sslsplit", "intercept/keepalive-h1", "airlock", "intercept/keepalive-h1", "sslsplit", "cpu-us/req", "%.1f µs")
		context("thread switches per intercepted request, HTTP/1.1: airlockd vs sslsplit", "intercept/keepalive-h1", "airlock", "intercept/keepalive-h1", "sslsplit", "switches/req", "%.2f")
		context("an intercepted request, HTTP/1.1, one connection: airlockd vs sslsplit", "intercept/keepalive-h1-1conn", "airlock", "intercept/keepalive-h1-1conn", "sslsplit", "cpu-us/req", "%.1f µs")
		context("an intercepted request, HTTP/2 keep-alive: airlockd vs sslsplit (HTTP/1.1)", "intercept/keepalive-h2", "airlock", "intercept/keepalive-h2", "sslsplit", "cpu-us/req", "%.1f µs")
		context("a new intercepted connection, warm: airlockd vs sslsplit", "intercept/handshake-warm", "airlock", "intercept/handshake-warm", "sslsplit", "cpu-us/conn", "%.0f µs")
		print ""
		print "### Earlier goals (issue 10), still measured"
		print ""
		print "| goal | measured | target | |"
		print "|---|---:|---:|---|"
		least("splice, 1 stream, MB/s vs direct", "proxy/download-512MiB", "airlock", "proxy/download-512MiB", "direct", "MB/s", 0.9)
		least("splice, 1 stream, MB/s vs haproxy", "proxy/download-512MiB", "airlock", "proxy/download-512MiB", "haproxy", "MB/s", 1.0)
		least("interception handshakes, warm: conns/s vs sslsplit", "intercept/handshake-warm", "airlock", "intercept/handshake-warm", "sslsplit", "conns/s", 1.0)
		least("interception handshakes, cold: conns/s vs airlock warm", "intercept/handshake-cold", "airlock", "intercept/handshake-warm", "airlock", "conns/s", 0.7)
		least("interception bulk: MB/s vs direct", "intercept/https-download", "airlock", "intercept/https-download", "direct", "MB/s", 0.5)
		least("connections/s at 100,000 rules vs 10", "proxy/connect-rules=100000", "airlock", "proxy/connect-rules=10", "airlock", "conns/s", 0.95)
		least("DNS denied q/s at 100,000 rules vs 10", "dns-denied", "rules=100000", "dns-denied", "rules=10", "q/s", 0.95)
		most("idle connection, spliced: memory", "proxy/idle", "airlock", "KiB/conn", 16, "KiB")
		most("idle connection, intercepted: memory", "intercept/idle", "airlock", "KiB/conn", 64, "KiB")
		most("approval: decision POST → first byte, p99", "proxy/approval", "airlock", "p99-ms", 50, "ms")
	}' "${BENCH_DATA:?}" > "$goals"
awk -v f="$goals" '$0 == "@GOALS@" { while ((getline l < f) > 0) print l; next } { print }' "$OUT" > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"

# The notes: sections of bench-notes.md opened by "<!-- intro -->",
# "<!-- goal: ID -->" or "<!-- other -->". The intro, then the sections of
# the goals missed, then the rest.
sort -u "$missed" -o "$missed"
section() { # section SELECT: the sections whose marker SELECT accepts
	awk -v sel="$1" -v missedfile="$missed" '
		BEGIN { while ((getline id < missedfile) > 0) miss[id] = 1 }
		/^<!-- .* -->$/ {
			m = $0; sub(/^<!-- /, "", m); sub(/ -->$/, "", m)
			id = m; sub(/^goal: /, "", id)
			on = (sel == "intro" && m == "intro") || (sel == "missed" && m ~ /^goal: / && (id in miss)) ||
				(sel == "rest" && (m == "other" || m ~ /^goal: / && !(id in miss)))
			next
		}
		on { print }' "$NOTES"
}
{
	echo
	if [ -s "$missed" ]; then
		echo "## What limits airlock where it misses a goal"
		echo
		section intro
		section missed
		echo
		echo "## Notes on the other figures"
		echo
	else
		echo "## Notes on the figures"
		echo
		section intro
	fi
	section rest
} | cat -s >> "$OUT"
