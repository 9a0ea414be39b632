#!/usr/bin/env bash
# DNS part of `make bench`: airlock's gate against unbound (2 threads) and
# dnsmasq, on loopback, the same three query sets each, servers pinned to
# CPU 0 and dnsperf to CPU 1. Appends a section to BENCHMARKS.md.
#   fake    A queries for 10,000 names: the gate answers from its fake-IP
#           pool; the peers answer from a local zone (redirect / address=).
#   denied  A queries for a denied name: NXDOMAIN from each.
#   txt     TXT queries for 1,000,000 distinct allowed names, forwarded to
#           the same fake upstream by each (no name repeats, so no cache helps).
# Rule scale: the fake and denied sets against a second gate whose policy
# holds 100,000 rules.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
SECS=${DNS_BENCH_SECS:-3}
P99SECS=3
ROUNDS=3
[ -n "${QUICK:-}" ] && SECS=${DNS_BENCH_SECS:-1} P99SECS=1 ROUNDS=1
OUT=${BENCH_OUT:-BENCHMARKS.md}
DATA=${BENCH_DATA:-/dev/null}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

$GO build -o "$work/gatebench" ./internal/benchtools/gatebench
UP=127.0.0.1:5300 GATE=5301 UNB=5302 DMQ=5303 BIG=5304

for i in $(seq 0 9999); do echo "h$i.bench.test A"; done > "$work/fake.txt"
echo "denied.test A" > "$work/denied.txt"
# Unique names, never repeated within a run, so no cache can answer.
seq 0 999999 | sed 's/.*/t&.fwd.test TXT/' > "$work/txt.txt"

taskset -c 0 "$work/gatebench" -listen 127.0.0.1:$GATE -upstream $UP > "$work/gate.log" 2>&1 &
pids+=($!)
cat > "$work/unbound.conf" <<CONF
server:
  interface: 127.0.0.1
  port: $UNB
  num-threads: 2
  so-reuseport: yes
  do-ip6: no
  access-control: 127.0.0.0/8 allow
  username: ""
  chroot: ""
  directory: "$work"
  pidfile: ""
  use-syslog: no
  logfile: ""
  verbosity: 0
  do-daemonize: no
  module-config: "iterator"
  do-not-query-localhost: no
  cache-max-ttl: 0
  cache-max-negative-ttl: 0
  prefetch: no
  # .test is one of unbound's built-in special-use zones (NXDOMAIN without
  # forwarding); switch that off so it forwards like the others.
  local-zone: "test." nodefault
  local-zone: "bench.test." redirect
  local-data: "bench.test. 5 IN A 198.18.0.1"
  local-zone: "denied.test." always_nxdomain
forward-zone:
  name: "fwd.test."
  forward-addr: 127.0.0.1@5300
CONF
taskset -c 0 unbound -d -c "$work/unbound.conf" > "$work/unbound.log" 2>&1 &
pids+=($!)
taskset -c 0 dnsmasq -k --no-resolv --no-hosts --port=$DMQ --listen-address=127.0.0.1 --bind-interfaces \
	--address=/bench.test/198.18.0.1 --address=/denied.test/ --server=/fwd.test/127.0.0.1#5300 \
	--cache-size=0 --user=root --pid-file= > "$work/dnsmasq.log" 2>&1 &
pids+=($!)
sleep 1.5
# The 100,000-rule gate starts once the first holds the fake upstream's port.
taskset -c 0 "$work/gatebench" -listen 127.0.0.1:$BIG -upstream 127.0.0.1:5399 -rules 100000 > "$work/big.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do grep -q ready "$work/big.log" && break; sleep 0.2; done
# Every server must give the same answers before its speed means anything.
for p in $GATE $UNB $DMQ $BIG; do
	a=$(dig +tries=3 +time=1 -p $p @127.0.0.1 A h1.bench.test)
	n=$(dig +tries=3 +time=1 -p $p @127.0.0.1 A denied.test)
	x=$(dig +tries=3 +time=1 -p $p @127.0.0.1 TXT t5.fwd.test)
	[ $p = $BIG ] && x='"v=bench"' # its upstream is a stub; only its policy matters
	if ! grep -q 'IN	A	198.18.' <<<"$a" || ! grep -q 'status: NXDOMAIN' <<<"$n" || ! grep -q '"v=bench"' <<<"$x"; then
		echo "bench-dns: server on port $p answers wrongly:"; echo "$a" "$n" "$x" | grep -E 'status|IN'; cat "$work"/*.log; exit 1
	fi
done

# qps SERVERPORT FILE: queries per second over SECS seconds.
qps() { taskset -c 1 dnsperf -s 127.0.0.1 -p "$1" -d "$2" -l "$SECS" -q 100 2>&1 | awk '/Queries per second/ {printf "%d", $4}'; }
# p99 SERVERPORT FILE: 99th percentile latency in ms, from dnsperf -v.
p99() {
	taskset -c 1 dnsperf -s 127.0.0.1 -p "$1" -d "$2" -l $P99SECS -q 100 -v 2>/dev/null |
		awk '/^> / {print $NF}' | sort -g | awk '{a[NR]=$1} END {if (NR) printf "%.2f", a[int(NR*0.99)]*1000; else print "-"}'
}

# med A...: the median of the figures given (an odd number of them).
med() { printf '%s\n' "$@" | sort -n | sed -n "$((($# + 1) / 2))p"; }

# Three rounds per query set (one for QUICK), the servers in turn within
# each, and the median of each server's figures: the machine stalls now and then, and one
# stall would otherwise decide a single run.
rows=()
for set in fake denied txt; do
	echo "bench-dns: $set"
	gs=() us=() ds=()
	for _ in $(seq $ROUNDS); do
		gs+=("$(qps $GATE "$work/$set.txt")"); us+=("$(qps $UNB "$work/$set.txt")"); ds+=("$(qps $DMQ "$work/$set.txt")")
	done
	g=$(med "${gs[@]}"); u=$(med "${us[@]}"); d=$(med "${ds[@]}")
	gp=$(p99 $GATE "$work/$set.txt"); up=$(p99 $UNB "$work/$set.txt"); dp=$(p99 $DMQ "$work/$set.txt")
	printf 'dns-%s gate q/s %s\ndns-%s unbound q/s %s\ndns-%s dnsmasq q/s %s\n' "$set" "$g" "$set" "$u" "$set" "$d" >> "$DATA"
	rows+=("$(awk -v s="$set" -v g="$g" -v u="$u" -v d="$d" -v gp="$gp" -v up="$up" -v dp="$dp" 'BEGIN {
		printf "| %s | %d | %d | %d | %.2fx | %.2fx | %s / %s / %s |", s, g, u, d, (u ? g/u : 0), (d ? g/d : 0), gp, up, dp }')")
done

srows=()
# The big gate has not seen the fake names yet: let it hand out their
# addresses first, as the small one did during the runs above.
qps $BIG "$work/fake.txt" >/dev/null
for set in fake denied; do
	echo "bench-dns: $set at 100,000 rules"
	ss=() bs=()
	for _ in $(seq $ROUNDS); do
		ss+=("$(qps $GATE "$work/$set.txt")"); bs+=("$(qps $BIG "$work/$set.txt")")
	done
	small=$(med "${ss[@]}"); big=$(med "${bs[@]}")
	printf 'dns-%s rules=10 q/s %s\ndns-%s rules=100000 q/s %s\n' "$set" "$small" "$set" "$big" >> "$DATA"
	srows+=("$(awk -v s="$set" -v a="$small" -v b="$big" 'BEGIN { printf "| %s | %d | %d | %.2fx |", s, a, b, (a ? b/a : 0) }')")
done

{
	echo
	echo "## DNS gate (\`scripts/bench-dns.sh\`, dnsperf, 100 queries outstanding)"
	echo
	echo "Servers on CPU 0 (unbound with 2 threads still shares that core), dnsperf on CPU 1, all on loopback."
	echo "fake: A for 10,000 names (gate: fake-IP pool; peers: a local zone). denied: NXDOMAIN for a denied name."
	echo "txt: TXT for 1,000,000 distinct allowed names, forwarded by each to one fake upstream (a Go server, which bounds this row)."
	echo "q/s: the median of ${ROUNDS} run(s) of ${SECS} s per server, the servers taking turns; p99: one ${P99SECS} s run each."
	echo "Goal: ≥ 1.0x unbound and dnsmasq."
	echo
	echo "| query set | gate q/s | unbound q/s | dnsmasq q/s | gate/unbound | gate/dnsmasq | p99 ms gate / unbound / dnsmasq |"
	echo "|---|---:|---:|---:|---:|---:|---|"
	printf '%s\n' "${rows[@]}"
	echo
	echo "### DNS gate at 100,000 rules"
	echo
	echo "The same gate with its policy padded to 100,000 rules (80% exact hosts, 20% wildcards, none matching), and the"
	echo "10-rule gate, taking turns: the median of ${ROUNDS} run(s) of ${SECS} s each. Goal: ≤ 5 % slower."
	echo
	echo "| query set | 10 rules q/s | 100,000 rules q/s | ratio |"
	echo "|---|---:|---:|---:|"
	printf '%s\n' "${srows[@]}"
} >> "$OUT"
printf '%s\n' "${rows[@]}"
