#!/usr/bin/env bash
# bench/redis/ab.sh — Redis time per decision of this tree against another
# commit's, round by round on one private redis-server: bench/redis/usec
# (the uniform load through redisstore: GOROUTINES deciders, KEYS keys, one
# limit of RATE/s per key, a store that keeps overrides as weir serve's
# does) built from each tree, the two alternating for ROUNDS rounds of
# DURATION, the data flushed before each run. Prints min / median / max
# of the scripts' usec per decision (INFO commandstats, reset before each
# run), of redis-server's CPU per decision, and of the decisions per call.
#
#   bench/redis/ab.sh main                   # ROUNDS=5 DURATION=5s ALGOS=fixed_window
#   ROUNDS=7 ALGOS="fixed_window gcra" bench/redis/ab.sh <commit>
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=${1:?usage: bench/redis/ab.sh <commit to compare against>}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5s}
ALGOS=${ALGOS:-fixed_window}
GOROUTINES=${GOROUTINES:-64}
KEYS=${KEYS:-100000}
RATE=${RATE:-100}
for tool in redis-server redis-cli go git python3; do
	command -v "$tool" >/dev/null || { echo "ab.sh: $tool not found" >&2; exit 1; }
done
# shellcheck source=bench/private-redis.sh
. bench/private-redis.sh

# The base tree with this tree's measuring command in it (it may predate it).
mkdir "$tmp/base"
git archive "$BASE" | tar -x -C "$tmp/base"
mkdir -p "$tmp/base/bench/redis/usec"
cp bench/redis/usec/main.go "$tmp/base/bench/redis/usec/"
(cd "$tmp/base/bench" && go build -o "$tmp/usec-base" ./redis/usec)
(cd bench && go build -o "$tmp/usec-head" ./redis/usec)

echo "Machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), load $(cut -d' ' -f1-3 /proc/loadavg); base $(git rev-parse --short "$BASE"), head $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (+ uncommitted)')"
: >"$tmp/rows"
for round in $(seq 1 "$ROUNDS"); do
	for algo in $ALGOS; do
		for side in base head; do
			cli FLUSHALL >/dev/null
			"$tmp/usec-$side" -addr "127.0.0.1:$port" -algorithm "$algo" -goroutines "$GOROUTINES" -keys "$KEYS" \
				-rate "$RATE" -duration "$DURATION" -json | python3 -c '
import json, sys
r = json.load(sys.stdin)
print(sys.argv[1], sys.argv[2], r["redis_usec_per_decision"], r["redis_cpu_usec_per_decision"], r["decisions_per_call"], r["decisions_per_second"], r["errors"])
' "$algo" "$side" >>"$tmp/rows"
		done
	done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp/rows" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    algo, side, *v = line.split()
    rows.setdefault((algo, side), []).append([float(x) for x in v])
f = lambda xs, d: f"{min(xs):.{d}f} / {statistics.median(xs):.{d}f} / {max(xs):.{d}f}"
print("| algorithm | tree | script µs/decision (min / median / max) | redis-server CPU µs/decision | decisions/call | decisions/s | errors |")
print("|---|---|---:|---:|---:|---:|---:|")
for (algo, side), rs in sorted(rows.items()):
    c = list(zip(*rs))
    print(f"| {algo} | {side} | {f(c[0], 2)} | {f(c[1], 2)} | {statistics.median(c[2]):.1f} | {statistics.median(c[3]):,.0f} | {int(sum(c[4]))} |")
PY
