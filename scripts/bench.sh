#!/usr/bin/env bash
# make bench: runs the benchmarks and writes BENCHMARKS.md from that one run,
# with ratios computed from its own figures. QUICK=1 (make bench-quick) runs
# the same code paths with less work and writes bin/BENCHMARKS-quick.md.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
export QUICK=${QUICK:-}
if [ -n "$QUICK" ]; then
	export BENCH_OUT=${BENCH_OUT:-bin/BENCHMARKS-quick.md}
	mkdir -p "$(dirname "$BENCH_OUT")"
else
	export BENCH_OUT=${BENCH_OUT:-BENCHMARKS.md}
fi
# Every script appends "name unit value" lines here; the goals table at the
# end is computed from them.
export BENCH_DATA
BENCH_DATA=$(mktemp)
out=$(mktemp)
trap 'rm -f "$out" "$BENCH_DATA"' EXIT
t0=$(date +%s)
# Held connections need two sockets each in a proxy.
ulimit -n "$(ulimit -Hn)"

# Peers and load tools from Debian, installed without starting their
# services (which would take port 53, 80 or 3128 on this host).
peers="haproxy mitmproxy sslsplit squid-openssl unbound dnsmasq-base wrk nghttp2-client hey dnsperf curl"
need=()
for b in dnsperf:dnsperf unbound:unbound dnsmasq:dnsmasq-base haproxy:haproxy mitmdump:mitmproxy sslsplit:sslsplit \
	squid:squid-openssl wrk:wrk h2load:nghttp2-client hey:hey taskset:util-linux curl:curl dig:dnsutils openssl:openssl; do
	command -v "${b%%:*}" >/dev/null || need+=("${b##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
	echo "bench: installing ${need[*]}"
	printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	rm -f /usr/sbin/policy-rc.d
fi
versions=$(for p in $peers; do printf '%s %s, ' "$p" "$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || echo '?')"; done)

benchtime=1s leaftime=2000x bumptime=20000x
[ -n "$QUICK" ] && benchtime=200ms leaftime=500x bumptime=2000x
echo "bench: policy decisions"
$GO test -run '^$' -bench 'BenchmarkDecide' -benchmem -count 1 -benchtime $benchtime ./policy | tee "$out"
echo "bench: leaf certificates"
$GO test -run '^$' -bench 'BenchmarkLeaf' -benchmem -count 1 -benchtime $leaftime ./tproxy | tee -a "$out"
echo "bench: intercepted requests in one process"
$GO test -run '^$' -bench 'BenchmarkBumpKeepAlive' -benchmem -count 3 -benchtime $bumptime ./tproxy | tee -a "$out"
echo "bench: the runtime's monitor thread"
$GO test -run '^$' -bench 'BenchmarkSyscallAfterIdle' -benchtime 1x -count 1 ./internal/sysmon | tee -a "$out"

cpu=$(grep -m1 '^cpu:' "$out" | cut -d' ' -f2- || true)
{
	echo "# airlock benchmarks"
	echo
	echo "Written by \`make bench\` from one run on one machine; ratios compare figures of that run only. The machine is"
	echo "small and shared, and stalls now and then whatever runs: speed figures are medians of several runs with their"
	echo "spread (min–max), and beside them is the CPU time each program spent per unit of work, which noise moves far less."
	[ -n "$QUICK" ] && echo "**make bench-quick: smaller sizes and counts, for development; not the published figures.**"
	echo
	echo "- machine: ${cpu:-unknown cpu}, $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -sr)"
	echo "- $($GO version | cut -d' ' -f3-), $(date -u +%Y-%m-%d)"
	echo "- peers and load tools (Debian packages): ${versions%, }"
	echo
	echo "@GOALS@"
	echo
	echo "## Policy decisions (\`go test -bench BenchmarkDecide ./policy\`)"
	echo
	echo "Host: a connection-level question (DNS name, TLS SNI); a quarter of the queries are for unknown hosts."
	echo "Request: a method and path against the same rules. Rule mix: 80% exact hosts, 10% \`*.\` wildcards,"
	echo "10% host+path globs. Target: at 100,000 rules within 2x of 10 rules; no allocation for host questions."
	echo
	echo "| benchmark | rules | ns/op | allocs/op | ratio to 10 rules |"
	echo "|---|---:|---:|---:|---:|"
	awk '
		/^BenchmarkDecide/ {
			split($1, a, "/"); kind = a[1]; sub("BenchmarkDecide", "", kind)
			n = a[2]; sub("rules=", "", n); sub("-[0-9]+$", "", n)
			ns = $3; allocs = $7
			if (n == 10) base[kind] = ns
			r = (base[kind] > 0) ? sprintf("%.2fx", ns / base[kind]) : "-"
			printf "| %s | %s | %.1f | %s | %s |\n", kind, n, ns, allocs, r
		}' "$out"
	echo
	echo "## Leaf certificates (\`go test -bench BenchmarkLeaf ./tproxy\`)"
	echo
	echo "miss: a name not in the cache (an ECDSA P-256 signature and a parse); hit: a cached name; hit-parallel: the"
	echo "same from all cores. Target: a hit does no verification and no allocation."
	echo
	echo "| case | ns/op | allocs/op | ratio to hit |"
	echo "|---|---:|---:|---:|"
	awk '
		/^BenchmarkLeaf\// {
			split($1, a, "/"); c = a[2]; sub("-[0-9]+$", "", c)
			ns[c] = $3; al[c] = $7; order[++n] = c
		}
		END { for (i = 1; i <= n; i++) printf "| %s | %.1f | %s | %.0fx |\n", order[i], ns[order[i]], al[order[i]], ns[order[i]] / ns["hit"] }' "$out"
	echo
	echo "## Intercepted requests in one process (\`go test -bench BenchmarkBumpKeepAlive ./tproxy\`)"
	echo
	echo "The proxy, a client and an upstream in one process: 8 kept-alive client connections, one request at a time on each"
	echo "(as wrk and h2load below), each request's TLS terminated, decided, recorded and forwarded over a pooled HTTP/1.1"
	echo "upstream connection. The client and the upstream allocate next to nothing per request, so allocs/op are the proxy's"
	echo "(and the TLS reads'); CPU is the whole process's, client and upstream included. Median of three runs."
	echo
	echo "| client protocol | CPU µs/request | allocs/request | bytes/request |"
	echo "|---|---:|---:|---:|"
	awk '
		/^BenchmarkBumpKeepAlive\// {
			split($1, a, "/"); c = a[2]; sub("-[0-9]+$", "", c)
			for (i = 3; i < NF; i++) {
				if ($(i+1) == "cpu-ns/op") cpu[c, ++n1[c]] = $i / 1000
				if ($(i+1) == "allocs/op") al[c, ++n2[c]] = $i
				if ($(i+1) == "B/op") by[c, ++n3[c]] = $i
			}
			if (!(c in seen)) { seen[c] = 1; order[++n] = c }
		}
		function med(arr, c, k,   i, j, t, x) {
			for (i = 1; i <= k; i++) x[i] = arr[c, i]
			for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
			return x[int((k + 1) / 2)]
		}
		END { for (i = 1; i <= n; i++) { c = order[i]; printf "| %s | %.1f | %d | %d |\n", (c == "h1" ? "HTTP/1.1" : "HTTP/2"), med(cpu, c, n1[c]), med(al, c, n2[c]), med(by, c, n3[c]) } }' "$out"
	echo
	echo "## The runtime's monitor thread (\`go test -bench BenchmarkSyscallAfterIdle ./internal/sysmon\`)"
	echo
	echo "What airlockd does thousands of times a second under load, alone: every processor idles, waiting on the network,"
	echo "until a datagram comes (every 200 µs), and the goroutine reads it with an ordinary system call. The process's"
	echo "thread switches per datagram (median of three runs of 2,000), with the Go runtime's default and with the setting"
	echo "airlockd starts itself with (package \`sysmon\`), which keeps the monitor thread from sleeping deeply and being"
	echo "woken by that call into naps of 20 µs."
	echo
	echo "| runtime | thread switches per idle-then-read |"
	echo "|---|---:|"
	awk '
		/^BenchmarkSyscallAfterIdle\// {
			split($1, a, "/"); c = a[2]; sub("-[0-9]+$", "", c)
			for (i = 3; i < NF; i++) if ($(i+1) == "switches/round") printf "| %s | %.2f |\n", (c == "default" ? "default" : "GODEBUG=schedtrace (airlockd)"), $i
		}' "$out"
} > "$BENCH_OUT"
GO=$GO scripts/bench-dns.sh
GO=$GO scripts/bench-proxy.sh
GO=$GO scripts/bench-sessions.sh
scripts/bench-goals.sh "$(($(date +%s) - t0))"
echo "bench: wrote $BENCH_OUT in $(($(date +%s) - t0)) s"
