#!/usr/bin/env bash
# Profiles where a redis-server's instructions per decision go: runs one
# private standalone redis-server under callgrind, loads this tree's
# function library, sends CALLS calls of BATCH decisions of ALGO (the
# library's batch function, new keys, as instructions.sh does) and keeps
# the callgrind output of the measured calls (after a warm-up) in OUT,
# with `callgrind_annotate --inclusive=yes` of it next to it.
#
#   ALGO=fixed_window BATCH=5 CALLS=1000 OUT=<dir> bench/redis/profile.sh
#
# Needs valgrind, redis-server, redis-cli, redis-benchmark and go. Never
# touches a Redis it did not start.
set -euo pipefail
cd "$(dirname "$0")/../.."
CALLS=${CALLS:-1000}
BATCH=${BATCH:-5}
ALGO=${ALGO:-fixed_window}
OUT=${OUT:-/tmp/weir-profile}
mkdir -p "$OUT"
tmp=$(mktemp -d)
pid=
cleanup() {
	[ -n "$pid" ] && { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
	rm -rf "$tmp"
}
trap cleanup EXIT
port=
for _ in $(seq 1 50); do
	p=$((20000 + RANDOM % 20000))
	redis-cli -p "$p" ping >/dev/null 2>&1 && continue
	port=$p
	break
done
valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.%p" --dump-instr=no \
	redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" \
	>"$tmp/valgrind.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
	redis-cli -p "$port" ping >/dev/null 2>&1 && break
	sleep 0.1
done
(WEIR_BENCH_DUMP=$tmp go test -count=1 -run '^TestDumpScripts$' ./store/redisstore/ >/dev/null)
redis-cli -p "$port" -x FUNCTION LOAD REPLACE <"$tmp/library.lua" >/dev/null
lib=$(sed 's/_take$//' "$tmp/take.fn")
mapfile -t args <"$tmp/$ALGO.args"
keys=() per=()
for i in $(seq 1 "$BATCH"); do
	keys+=("weir:{b${i}x__rand_int__}:$ALGO" "weir:{b${i}x__rand_int__}:block")
	per+=(1 1 0 "m${i}__rand_int__")
done
cmd=(FCALL "${lib}_batch" $((2 * BATCH)) "${keys[@]}" "" 1 "${args[@]}" "${per[@]}")
redis-benchmark -p "$port" -n $((CALLS / 4)) -c 4 -r 100000 "${cmd[@]}" >/dev/null
callgrind_control -z "$pid" >/dev/null 2>&1
redis-benchmark -p "$port" -n "$CALLS" -c 4 -r 100000 "${cmd[@]}" >/dev/null
callgrind_control -d "$pid" >/dev/null 2>&1
f=$(ls -t "$tmp"/cg.* | head -1)
cp "$f" "$OUT/callgrind.$ALGO.$BATCH"
n=$(grep -E '^(summary|totals):' "$f" | head -1 | awk '{print $2}')
callgrind_annotate --inclusive=yes "$f" >"$OUT/annotate.$ALGO.$BATCH.txt" 2>/dev/null || true
echo "$ALGO BATCH=$BATCH: $((n / (CALLS * BATCH))) Ir per decision; $OUT/callgrind.$ALGO.$BATCH, $OUT/annotate.$ALGO.$BATCH.txt"
