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
# holds 100,000 rules. Each gate records every query in an audit journal,
# as airlockd does; unbound and dnsmasq log nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
SECS=${DNS_BENCH_SECS:-3}
P99SECS=2
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

declare -A pidof # server port → its process
taskset -c 0 "$work/gatebench" -listen 127.0.0.1:$GATE -upstream $UP -journal "$work/journal" > "$work/gate.log" 2>&1 &
pids+=($!) pidof[$GATE]=$!
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
pids+=($!) pidof[$UNB]=$!
taskset -c 0 dnsmasq -k --no-resolv --no-hosts --port=$DMQ --listen-address=127.0.0.1 --bind-interfaces \
	--address=/bench.test/198.18.0.1 --address=/denied.test/ --server=/fwd.test/127.0.0.1#5300 \
	--cache-size=0 --user=root --pid-file= > "$work/dnsmasq.log" 2>&1 &
pids+=($!) pidof[$DMQ]=$!
sleep 1.5
# The 100,000-rule gate starts once the first holds the fake upstream's port.
taskset -c 0 "$work/gatebench" -listen 127.0.0.1:$BIG -upstream 127.0.0.1:5399 -rules 100000 -journal "$work/journal-big" > "$work/big.log" 2>&1 &
pids+=($!) pidof[$BIG]=$!
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

# ticks PID: the user+system CPU time PID has used, in clock ticks (1/100 s).
ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }
# qps SERVERPORT FILE: "Q/S CPU-US/Q" over SECS seconds: queries per second
# and the server's CPU time per query answered, in microseconds.
qps() {
	local t0 out
	t0=$(ticks "${pidof[$1]}")
	out=$(taskset -c 1 dnsperf -s 127.0.0.1 -p "$1" -d "$2" -l "$SECS" -q 100 2>&1)
	awk -v t="$(($(ticks "${pidof[$1]}") - t0))" '/Queries completed:/ { n = $3 } /Queries per second/ { q = $4 }
		END { printf "%d %.2f", q, (n ? t * 10000 / n : 0) }' <<<"$out"
}
# p99 SERVERPORT FILE: 99th percentile latency in ms, from dnsperf -v.
p99() {
	taskset -c 1 dnsperf -s 127.0.0.1 -p "$1" -d "$2" -l $P99SECS -q 100 -v 2>/dev/null |
		awk '/^> / {print $NF}' | sort -g | awk '{a[NR]=$1} END {if (NR) printf "%.2f", a[int(NR*0.99)]*1000; else print "-"}'
}

# stats FIELD RUN...: the median, min and max of field FIELD (1: q/s, 2:
# CPU) of the runs given (an odd number of them).
stats() { local f=$1; shift; printf '%s\n' "$@" | awk -v f="$f" '{print $f}' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)], a[1], a[NR]}'; }
# cell MEDIAN MIN MAX: "median (min–max)", or the median alone for one run.
cell() { if [ "$ROUNDS" -gt 1 ]; then echo "$1 ($2–$3)"; else echo "$1"; fi; }

# Three rounds per query set (one for QUICK), the servers in turn within
# each, and the median of each server's figures: the machine stalls now and
# then, and one stall would otherwise decide a single run. The gate's CPU
# time per query is not shown for txt: its process also runs the fake
# upstream all three forward to.
rows=()
for set in fake denied txt; do
	echo "bench-dns: $set"
	gs=() us=() ds=()
	for _ in $(seq $ROUNDS); do
		gs+=("$(qps $GATE "$work/$set.txt")"); us+=("$(qps $UNB "$work/$set.txt")"); ds+=("$(qps $DMQ "$work/$set.txt")")
	done
	read -r g gmin gmax <<<"$(stats 1 "${gs[@]}")"; read -r gc _ _ <<<"$(stats 2 "${gs[@]}")"
	read -r u umin umax <<<"$(stats 1 "${us[@]}")"; read -r uc _ _ <<<"$(stats 2 "${us[@]}")"
	read -r d dmin dmax <<<"$(stats 1 "${ds[@]}")"; read -r dc _ _ <<<"$(stats 2 "${ds[@]}")"
	[ $set = txt ] && gc=-
	gp=$(p99 $GATE "$work/$set.txt"); up=$(p99 $UNB "$work/$set.txt"); dp=$(p99 $DMQ "$work/$set.txt")
	for x in "gate q/s $g" "gate q/s-min $gmin" "gate q/s-max $gmax" "unbound q/s $u" "unbound q/s-min $umin" "unbound q/s-max $umax" \
		"dnsmasq q/s $d" "dnsmasq q/s-min $dmin" "dnsmasq q/s-max $dmax" "gate cpu-us/q $gc" "unbound cpu-us/q $uc" "dnsmasq cpu-us/q $dc"; do
		[[ $x == *" -" ]] || echo "dns-$set $x"
	done >> "$DATA"
	rows+=("$(awk -v s="$set" -v g="$(cell "$g" "$gmin" "$gmax")" -v u="$(cell "$u" "$umin" "$umax")" -v d="$(cell "$d" "$dmin" "$dmax")" \
		-v gn="$g" -v un="$u" -v dn="$d" -v gc="$gc" -v uc="$uc" -v dc="$dc" -v gp="$gp" -v up="$up" -v dp="$dp" 'BEGIN {
		printf "| %s | %s | %s | %s | %.2fx | %.2fx | %s / %s / %s | %s / %s / %s |", s, g, u, d, (un ? gn/un : 0), (dn ? gn/dn : 0), gc, uc, dc, gp, up, dp }')")
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
	read -r small smin smax <<<"$(stats 1 "${ss[@]}")"; read -r sc _ _ <<<"$(stats 2 "${ss[@]}")"
	read -r big bmin bmax <<<"$(stats 1 "${bs[@]}")"; read -r bc _ _ <<<"$(stats 2 "${bs[@]}")"
	printf 'dns-%s rules=10 q/s %s\ndns-%s rules=100000 q/s %s\ndns-%s rules=10 cpu-us/q %s\ndns-%s rules=100000 cpu-us/q %s\n' \
		"$set" "$small" "$set" "$big" "$set" "$sc" "$set" "$bc" >> "$DATA"
	srows+=("$(awk -v s="$set" -v a="$(cell "$small" "$smin" "$smax")" -v b="$(cell "$big" "$bmin" "$bmax")" -v an="$small" -v bn="$big" -v sc="$sc" -v bc="$bc" \
		'BEGIN { printf "| %s | %s | %s | %.2fx | %s / %s |", s, a, b, (an ? bn/an : 0), sc, bc }')")
done

{
	echo
	echo "## DNS gate (\`scripts/bench-dns.sh\`, dnsperf, 100 queries outstanding)"
	echo
	echo "Servers on CPU 0 (unbound with 2 threads still shares that core), dnsperf on CPU 1, all on loopback."
	echo "fake: A for 10,000 names (gate: fake-IP pool; peers: a local zone). denied: NXDOMAIN for a denied name."
	echo "txt: TXT for 1,000,000 distinct allowed names, forwarded by each to one fake upstream (a Go server, which bounds this row)."
	if [ "$ROUNDS" -gt 1 ]; then
		echo "q/s: the median of ${ROUNDS} runs of ${SECS} s per server, the servers taking turns, with their spread (min–max)."
	else
		echo "q/s: one run of ${SECS} s per server."
	fi
	echo "CPU µs/q: the server process's user+system time per query answered (median of the same runs; the gate's not"
	echo "for txt, as its process also runs the fake upstream). p99: one ${P99SECS} s run each."
	echo
	echo "| query set | gate q/s | unbound q/s | dnsmasq q/s | gate/unbound | gate/dnsmasq | CPU µs/q gate / unbound / dnsmasq | p99 ms gate / unbound / dnsmasq |"
	echo "|---|---:|---:|---:|---:|---:|---|---|"
	printf '%s\n' "${rows[@]}"
	echo
	echo "### DNS gate at 100,000 rules"
	echo
	echo "The same gate with its policy padded to 100,000 rules (80% exact hosts, 20% wildcards, none matching), and the"
	if [ "$ROUNDS" -gt 1 ]; then
		echo "10-rule gate, taking turns: the median of ${ROUNDS} runs of ${SECS} s each, with their spread."
	else
		echo "10-rule gate: one run of ${SECS} s each."
	fi
	echo
	echo "| query set | 10 rules q/s | 100,000 rules q/s | ratio | CPU µs/q 10 / 100,000 rules |"
	echo "|---|---:|---:|---:|---|"
	printf '%s\n' "${srows[@]}"
} >> "$OUT"
printf '%s\n' "${rows[@]}"
