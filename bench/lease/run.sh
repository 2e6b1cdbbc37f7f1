#!/usr/bin/env bash
# make bench-lease: one hot key through redisstore at RATE decisions/s
# (10,000) by 64 goroutines, with lease: LEASE (100) and without, on a
# private redis-server; Redis time per decision is the scripts' usec in
# INFO commandstats (FCALL, EVALSHA, EVAL) over the decisions made, and
# Redis's whole CPU time (INFO cpu, user + system) over them.
# Two limits: LIMIT_UNDER (12,000/s, every decision admitted) and
# LIMIT_OVER (5,000/s, half refused). Prints a markdown table.
# Never touches a Redis it did not start.
#
#   bench/lease/run.sh
#   RATE=20000 SECONDS_PER_RUN=20 LEASE=50 bench/lease/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

RATE=${RATE:-10000}
LEASE=${LEASE:-100}
SECS=${SECONDS_PER_RUN:-10}
LIMIT_UNDER=${LIMIT_UNDER:-12000}
LIMIT_OVER=${LIMIT_OVER:-5000}
for tool in redis-server redis-cli go; do
	command -v "$tool" >/dev/null || { echo "run.sh: $tool not found" >&2; exit 1; }
done

# shellcheck source=bench/private-redis.sh
. bench/private-redis.sh

# The load runs as a test binary, built once.
go test -c -o "$tmp/lease.test" ./store/lease/ >/dev/null

# scripts_usec: the usec of every script call since the last CONFIG RESETSTAT.
scripts_usec() {
	cli INFO commandstats | tr -d '\r' | awk -F'[:,=]' '
		/^cmdstat_(fcall|fcall_ro|evalsha|eval):/ { for (i = 2; i <= NF; i++) if ($i == "usec") s += $(i+1) }
		END { print s + 0 }'
}
scripts_calls() {
	cli INFO commandstats | tr -d '\r' | awk -F'[:,=]' '
		/^cmdstat_(fcall|fcall_ro|evalsha|eval):/ { for (i = 2; i <= NF; i++) if ($i == "calls") s += $(i+1) }
		END { print s + 0 }'
}

# cpu_usec: Redis's CPU time (user + system) so far, in µs.
cpu_usec() {
	cli INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { printf "%.0f\n", s * 1e6 }'
}

# run <limit> <lease>: prints "decisions/s|admitted|refused|usec/decision|calls|decisions/call"
run() {
	cli FLUSHALL >/dev/null
	cli CONFIG RESETSTAT >/dev/null
	cpu0=$(cpu_usec)
	out=$(WEIR_BENCH_LEASE_ADDR=127.0.0.1:$port WEIR_BENCH_LEASE_RATE=$RATE WEIR_BENCH_LEASE_SIZE=$2 \
		WEIR_BENCH_LEASE_LIMIT=$1 WEIR_BENCH_LEASE_SECONDS=$SECS WEIR_BENCH_LEASE_PREFIX=bench$RANDOM \
		"$tmp/lease.test" -test.run '^TestHotKeyLoad$' -test.count=1 -test.v | grep '^hot-key ')
	usec=$(scripts_usec)
	calls=$(scripts_calls)
	cpu=$(($(cpu_usec) - cpu0))
	read -r _ _ dec _ adm _ errs _ pers _ _ _ _ _ _ <<<"$out"
	[ "$errs" = 0 ] || echo "run.sh: $errs store errors" >&2
	awk -v d="$dec" -v a="$adm" -v u="$usec" -v c="$calls" -v p="$pers" -v k="$cpu" \
		'BEGIN { printf "%.0f|%d|%d|%.3f|%d|%.1f|%.3f\n", p, a, d - a, u / d, c, d / (c ? c : 1), k / d }'
}

echo "Machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $(go version | cut -d' ' -f3); one key, $RATE decisions/s offered by 64 goroutines for ${SECS}s per run, fixed_window"
echo
echo "| limit | lease | decisions/s | admitted | refused | Redis µs per decision (scripts) | script calls | decisions per call | Redis CPU µs per decision | scripts' time, no lease / lease | Redis CPU, no lease / lease |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for limit in "$LIMIT_UNDER" "$LIMIT_OVER"; do
	IFS='|' read -r p0 a0 f0 u0 c0 r0 k0 <<<"$(run "$limit" 0)"
	IFS='|' read -r p1 a1 f1 u1 c1 r1 k1 <<<"$(run "$limit" "$LEASE")"
	ratio=$(awk -v x="$u0" -v y="$u1" 'BEGIN { if (y > 0) printf "%.0f×", x / y; else print "∞" }')
	cratio=$(awk -v x="$k0" -v y="$k1" 'BEGIN { if (y > 0) printf "%.0f×", x / y; else print "∞" }')
	echo "| $limit/s | none | $p0 | $a0 | $f0 | $u0 | $c0 | $r0 | $k0 | | |"
	echo "| $limit/s | $LEASE | $p1 | $a1 | $f1 | $u1 | $c1 | $r1 | $k1 | $ratio | $cratio |"
done
