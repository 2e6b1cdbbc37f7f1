#!/usr/bin/env bash
# Counts the instructions a redis-server executes per decision, standalone
# against a Redis Cluster node, under valgrind's callgrind: a count that,
# unlike CPU time, does not move with what else the machine runs (on a
# shared machine CPU time per decision swings by ±30% between runs).
#
# Starts two private redis-servers under callgrind on free loopback ports:
# a standalone one and a one-node Cluster that owns every slot. Loads the
# function library of the tree it runs in (and, with OTHER=<dir>, that of
# another checkout too, to compare two versions on the same servers), and
# for every algorithm sends calls of 64 decisions with redis-benchmark
# (decision i's key drawn from its own 100k, so nearly every key is new) (the bench limit, 1000/s): the library's batch
# function to the standalone server, nbatch (the per-node batch, its keys
# undeclared) to the Cluster node. It prints instructions per decision
# (callgrind's Ir, counted between two dumps around the measured calls,
# after a warm-up of a quarter as many) and their ratio.
#
# The count includes what the server does by the second rather than by
# the decision (its cron, a Cluster node's bus), which under valgrind,
# some 50 times slower, weighs more than it would natively (a few percent
# at most; the same for both versions).
#
#   bench/redis/instructions.sh                  # CALLS=200 calls of 64 per cell
#   BATCH=3 CALLS=1000 bench/redis/instructions.sh   # calls of 3, as weir serve's
#   OTHER=/path/to/other/checkout bench/redis/instructions.sh
#   ALGOS="gcra sliding_log" bench/redis/instructions.sh
#
# Needs valgrind (callgrind_control), redis-server, redis-benchmark and go.
# Never touches a Redis it did not start.
set -euo pipefail
cd "$(dirname "$0")/../.."
CALLS=${CALLS:-200}
BATCH=${BATCH:-64}
for tool in valgrind callgrind_control redis-server redis-cli redis-benchmark go; do
	command -v "$tool" >/dev/null || { echo "instructions.sh: $tool not found" >&2; exit 1; }
done

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT

freeport() {
	local p
	for _ in $(seq 1 50); do
		p=$((20000 + RANDOM % 20000))
		[ "$p" = 6379 ] && continue
		redis-cli -p "$p" ping >/dev/null 2>&1 && continue # someone else's
		redis-cli -p $((p + 10000)) ping >/dev/null 2>&1 && continue
		echo "$p"
		return
	done
	echo "instructions.sh: no free port" >&2
	exit 1
}

# start <name> <port> [args...]: a redis-server under callgrind.
start() {
	local name=$1 port=$2
	shift 2
	mkdir -p "$tmp/$name"
	valgrind --tool=callgrind --callgrind-out-file="$tmp/$name/cg.%p" --dump-instr=no \
		redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp/$name" "$@" \
		>"$tmp/$name/valgrind.log" 2>&1 &
	pids+=($!)
	echo $! >"$tmp/$name/pid"
	for _ in $(seq 1 600); do
		redis-cli -p "$port" ping >/dev/null 2>&1 && return
		sleep 0.1
	done
	echo "instructions.sh: $name did not start" >&2
	exit 1
}

sport=$(freeport)
start standalone "$sport"
cport=$(freeport)
start cluster "$cport" --cluster-enabled yes --cluster-config-file "$tmp/cluster/nodes.conf"
redis-cli -p "$cport" CLUSTER ADDSLOTSRANGE 0 16383 >/dev/null
for _ in $(seq 1 300); do
	redis-cli -p "$cport" CLUSTER INFO | grep -q '^cluster_state:ok' && break
	sleep 0.1
done

# The libraries, and the bench limit's arguments, from the Go package.
dump() { # dump <checkout> <dir>
	mkdir -p "$2"
	(cd "$1" && WEIR_BENCH_DUMP=$2 go test -count=1 -run '^TestDumpScripts$' ./store/redisstore/ >/dev/null)
	for p in "$sport" "$cport"; do redis-cli -p "$p" -x FUNCTION LOAD REPLACE <"$2/library.lua" >/dev/null; done
}
versions=(this)
dump . "$tmp/this"
if [ -n "${OTHER:-}" ]; then
	versions+=(other)
	dump "$OTHER" "$tmp/other"
fi

# ir <server name>: the instructions counted since the last zeroing (dumps).
ir() {
	local pid f
	pid=$(cat "$tmp/$1/pid")
	callgrind_control -d "$pid" >/dev/null 2>&1
	f=$(ls -t "$tmp/$1"/cg.* | head -1)
	grep -E '^(summary|totals):' "$f" | head -1 | awk '{print $2}'
}

# measure <port> <server name> <version> <algo> <batch|nbatch>: Ir per decision.
measure() {
	local port=$1 name=$2 v=$3 algo=$4 kind=$5
	local lib pid keys=() per=() cmd args n
	lib=$(sed 's/_take$//' "$tmp/$v/take.fn")
	pid=$(cat "$tmp/$name/pid")
	mapfile -t args <"$tmp/$v/$algo.args" # one value a line; the last is often empty
	for i in $(seq 1 $BATCH); do
		keys+=("weir:{b${i}x__rand_int__}:$algo" "weir:{b${i}x__rand_int__}:block")
		per+=(1 1 0 "m${i}__rand_int__")
	done
	if [ "$kind" = batch ]; then
		cmd=(FCALL "${lib}_batch" $((2 * BATCH)) "${keys[@]}" "" 1 "${args[@]}" "${per[@]}")
	else
		cmd=(FCALL "${lib}_nbatch" 0 $((2 * BATCH)) "${keys[@]}" "" 1 "${args[@]}" "${per[@]}")
	fi
	redis-cli -p "$port" FLUSHALL >/dev/null
	redis-benchmark -p "$port" -n $((CALLS / 4)) -c 4 -r 100000 "${cmd[@]}" >/dev/null
	redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
	callgrind_control -z "$pid" >/dev/null 2>&1
	redis-benchmark -p "$port" -n "$CALLS" -c 4 -r 100000 "${cmd[@]}" >/dev/null
	n=$(ir "$name")
	if redis-cli -p "$port" INFO errorstats | grep -q errorstat_; then
		echo "instructions.sh: $algo $kind ($v): errors: $(redis-cli -p "$port" INFO errorstats | tr '\r\n' '  ')" >&2
		exit 1
	fi
	echo $((n / (CALLS * BATCH)))
}

echo "Instructions per decision (callgrind Ir), calls of $BATCH decisions, $CALLS calls per cell, $(redis-server --version | cut -d' ' -f3)"
echo
head="| algorithm |"
rule="|---|"
for v in "${versions[@]}"; do
	head+=" $v: standalone | $v: Cluster node | $v: standalone / node |"
	rule+="---:|---:|---:|"
done
echo "$head"
echo "$rule"
for algo in ${ALGOS:-fixed_window sliding_log sliding_window token_bucket leaky_bucket gcra concurrency}; do
	row="| $algo |"
	for v in "${versions[@]}"; do
		s=$(measure "$sport" standalone "$v" "$algo" batch)
		c=$(measure "$cport" cluster "$v" "$algo" nbatch)
		row+=" $s | $c | $(awk -v a="$s" -v b="$c" 'BEGIN { printf "%.3f", a / b }') |"
	done
	echo "$row"
done
