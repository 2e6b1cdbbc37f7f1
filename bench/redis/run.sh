#!/usr/bin/env bash
# Benchmarks store/redisstore against the ceiling of its own scripts.
#
# Starts a private redis-server on a free loopback port, loads weir's
# function library and each algorithm's EVAL script, and for every
# algorithm measures:
#   - the ceiling: redis-benchmark -c 64 -P 1 calling the library's take
#     function with FCALL, as the store does (random keys out of 100k, the Go
#     benchmark's key space and limit), and the same with -P 16, what Redis
#     does when the client pipelines; and for comparison the EVALSHA script
#     with -P 16, the form the store falls back to without Functions;
#   - decisions/s of the library's batch function, 16 decisions a call on
#     random keys, -P 1: the ceiling once the store coalesces;
#   - decisions/s through redisstore (BenchmarkTake) at 1, 16, 64 and 256
#     goroutines, against the same server in the same run, and the mean
#     batch it coalesced them into at 64 and 256;
#   - MEMORY USAGE of one key's state after 1 and after 100 decisions
#     (limit 100/minute).
# Prints a markdown table. Never touches a Redis it did not start.
#
# Then, per Redis Cluster node against standalone, the redis-server CPU
# time per decision (BenchmarkClusterNodes; the second table).
#
#   bench/redis/run.sh                 # N=200000 requests, BENCHTIME=3s
#   N=500000 BENCHTIME=5s bench/redis/run.sh
#   CLUSTER_ONLY=1 COUNT=5 bench/redis/run.sh   # only the second table, median of 5 runs (3 by default)
#   ALGOS=gcra COUNT=1 bench/redis/run.sh       # only these algorithms
set -euo pipefail
cd "$(dirname "$0")/../.."

N=${N:-200000}
BENCHTIME=${BENCHTIME:-3s}
for tool in redis-server redis-cli redis-benchmark go; do
	command -v "$tool" >/dev/null || { echo "run.sh: $tool not found" >&2; exit 1; }
done

# shellcheck source=bench/private-redis.sh
. bench/private-redis.sh

# The assembled scripts, their SHA-1s and ARGV, from the Go package itself.
WEIR_BENCH_DUMP=$tmp go test -count=1 -run '^TestDumpScripts$' ./store/redisstore/ >/dev/null

fn=$(cat "$tmp/take.fn")
loaded=$(cli -x FUNCTION LOAD <"$tmp/library.lua")
[ "$fn" = "${loaded}_take" ] || { echo "run.sh: FUNCTION LOAD gave $loaded, want the library of $fn" >&2; exit 1; }

algos=${ALGOS:-"fixed_window sliding_log sliding_window token_bucket leaky_bucket gcra concurrency"}
echo "Machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $(go version | cut -d' ' -f3), redis-benchmark -n $N -c 64 -P 1, go bench -benchtime $BENCHTIME"
echo
if [ -z "${CLUSTER_ONLY:-}" ]; then
echo "| algorithm | FCALL -P 1 (ceiling) | FCALL -P 16 | EVALSHA -P 16 | batches of 16, -P 1 | g=1 | g=16 | g=64 | g=256 | batch at g=64, g=256 | g=64 / ceiling | g=256 / ceiling | bytes/key, 1 event | bytes/key, 100 events |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for algo in $algos; do
	sha=$(cat "$tmp/$algo.sha")
	loaded=$(cli -x SCRIPT LOAD <"$tmp/$algo.lua")
	[ "$loaded" = "$sha" ] || { echo "run.sh: $algo: SCRIPT LOAD gave $loaded, want $sha" >&2; exit 1; }
	mapfile -t args <"$tmp/$algo.args" # one value a line; the last is often empty
	mapfile -t args100 <"$tmp/$algo.args100"
	args100q=()
	for a in "${args100[@]}"; do args100q+=("${a:-\"\"}"); done # for redis-cli's own quoting

	# Ceiling: the same function, keys and limit, straight from redis-benchmark.
	rb() { # rb <pipeline> <command and args...>: calls/s
		cli FLUSHALL >/dev/null
		local p=$1
		shift
		local v
		v=$(redis-benchmark -p "$port" -n "$N" -c 64 -P "$p" -r 100000 --csv "$@" "weir:{b__rand_int__}:$algo" \
			"weir:{b__rand_int__}:block" "" 1 0 "m__rand_int__" "${args[@]}" | tail -1 | awk -F'"' '{print $4}')
		echo "${v%.*}"
	}
	ceiling=$(rb 1 FCALL "$fn" 2)
	pipelined=$(rb 16 FCALL "$fn" 2)
	evalsha=$(rb 16 EVALSHA "$sha" 2)

	# The batch function, 16 decisions a call on 16 random keys, as the
	# store sends them when it coalesces: decisions/s.
	bkeys=()
	bper=()
	for i in $(seq 1 16); do
		bkeys+=("weir:{b${i}x__rand_int__}:$algo" "weir:{b${i}x__rand_int__}:block")
		bper+=(1 1 0 "m${i}x__rand_int__")
	done
	cli FLUSHALL >/dev/null
	v=$(redis-benchmark -p "$port" -n $((N / 16)) -c 64 -P 1 -r 100000 --csv FCALL "${fn%_take}_batch" 32 "${bkeys[@]}" \
		"" 1 "${args[@]}" "${bper[@]}" | tail -1 | awk -F'"' '{print $4}')
	batched=$(awk -v v="$v" 'BEGIN { printf "%d", v * 16 }')

	# redisstore at 1, 16, 64 and 256 goroutines on the same server.
	cli FLUSHALL >/dev/null
	declare -A rate=() per=()
	while read -r name value batch; do
		g=${name##*g=}
		g=${g%%-*}
		rate[$g]=$value
		per[$g]=$batch
	done < <(WEIR_BENCH_REDIS=127.0.0.1:$port go test -count=1 -run '^$' -bench "^BenchmarkTake/$algo/" \
		-benchtime "$BENCHTIME" ./store/redisstore/ | awk '/decisions\/s/ {
			v = ""; b = "1"
			for (i = 2; i <= NF; i++) {
				if ($i == "decisions/s") v = $(i - 1)
				if ($i == "decisions/call") b = $(i - 1)
			}
			print $1, v, b
		}')

	# Memory per key: one decision, then 100 (unique member ids for the ZSETs).
	cli FLUSHALL >/dev/null
	key="weir:{mem}:$algo"
	cli EVALSHA "$sha" 2 "$key" "weir:{mem}:block" "" 1 0 "m0" "${args100[@]}" >/dev/null
	mem1=$(cli MEMORY USAGE "$key")
	for i in $(seq 1 99); do
		printf 'EVALSHA %s 2 %s weir:{mem}:block "" 1 0 m%d %s\n' "$sha" "$key" "$i" "${args100q[*]}"
	done | cli >/dev/null
	mem100=$(cli MEMORY USAGE "$key")

	ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
	printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s, %s | %s | %s | %s | %s |\n' "$algo" "$ceiling" "$pipelined" "$evalsha" "$batched" \
		"${rate[1]%.*}" "${rate[16]%.*}" "${rate[64]%.*}" "${rate[256]%.*}" "${per[64]}" "${per[256]}" \
		"$(ratio "${rate[64]}" "$ceiling")" "$(ratio "${rate[256]}" "$ceiling")" "$mem1" "$mem100"
	unset rate per
done
fi

# Redis Cluster against standalone, per node (BenchmarkClusterNodes starts
# its own standalone Redis and three-node Cluster): the redis-server CPU
# time per decision at the same load per node (256 goroutines and keys
# drawn from 100k per busy Redis), with the store's coalescing (per node on
# the Cluster) and without it (MaxBatch 1, what a Cluster store did before
# it coalesced per node).
# "one node" draws only keys of the first node's slots, so one redis-server
# works as in the standalone run; "3 nodes" spreads keys over all three
# (on a 2-core machine the three servers and the client then share cores).
COUNT=${COUNT:-3}
echo
echo "Redis Cluster per node: redis-server CPU µs per decision (and mean batch), median of $COUNT runs, go bench -benchtime $BENCHTIME"
echo
echo "| algorithm | standalone | standalone, unbatched | Cluster, one node | one node, unbatched | Cluster, 3 nodes | 3 nodes, unbatched | one node / standalone (decisions/s per node) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for algo in $algos; do
	declare -A cpu=() per=()
	# Each deployment's median CPU time over the runs, and that run's batch.
	while read -r name value batch; do
		d=${name#*/}
		d=${d#*/}
		d=${d%-*}
		cpu[$d]=$value
		per[$d]=$batch
	done < <(go test -count="$COUNT" -run '^$' -bench "^BenchmarkClusterNodes/$algo/" -benchtime "$BENCHTIME" ./store/redisstore/ | awk '/cpu-µs\/decision/ {
			v = ""; b = "1"
			for (i = 2; i <= NF; i++) {
				if ($i == "cpu-µs/decision") v = $(i - 1)
				if ($i == "decisions/call") b = $(i - 1)
			}
			print $1, v, b
		}' | sort -k1,1 -k2,2g | awk '{ name[NR] = $1; line[NR] = $0; n[$1]++ }
		END {
			for (i = 1; i <= NR; i++) {
				if (name[i] != prev) { seen = 0; prev = name[i] }
				seen++
				if (seen == int((n[name[i]] + 1) / 2)) print line[i]
			}
		}')
	cell() { printf '%s (%s)' "${cpu[$1]}" "${per[$1]}"; }
	printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$algo" "$(cell standalone)" "$(cell standalone-unbatched)" \
		"$(cell cluster-one-node)" "$(cell cluster-one-node-unbatched)" "$(cell cluster)" "$(cell cluster-unbatched)" \
		"$(awk -v a="${cpu[standalone]}" -v b="${cpu[cluster-one-node]}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')"
	unset cpu per
done
