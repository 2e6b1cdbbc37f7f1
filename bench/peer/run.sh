#!/usr/bin/env bash
# bench/peer/run.sh — weir serve against envoyproxy/ratelimit, side by side
# in one run. The peer is built from its source in scratch space (a temporary
# directory, removed at exit); nothing of it enters this tree. Both servers
# get the same Envoy config (domain bench, key client, 100/s), a private
# redis-server on a free port (flushed before each run), and the same load:
# `weir bench` over gRPC, 64 callers on 64 connections, 100k keys. Servers
# alternate round by round, so both see the same machine.
#
#   PEER_SRC=https://github.com/envoyproxy/ratelimit bench/peer/run.sh
#   PEER_SRC=/path/to/a/clone ROUNDS=3 DURATION=15s LOAD="uniform flood" bench/peer/run.sh
#
# Loads: uniform (every key in turn) and flood (90% of calls from 10 keys
# over their limit: `weir bench --abusive 0.9`). Variants: weir serve at its
# defaults; the peer at its defaults, pipelined (REDIS_PIPELINE_WINDOW=150us
# REDIS_PIPELINE_LIMIT=8) and, under the flood, with its local cache of
# over-limit keys (LOCAL_CACHE_SIZE_IN_BYTES=1MiB). Prints one line per run
# and a table of medians (ranges): calls/s, p99, server and Redis CPU µs
# per call. Calls/s are bounded by the two cores everyone shares; CPU per
# call is each server's own.
set -euo pipefail
cd "$(dirname "$0")/../.."
PEER_SRC=${PEER_SRC:?set PEER_SRC to envoyproxy/ratelimit: a git URL or a local clone}
PEER_REV=${PEER_REV:-HEAD}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-15s}
LOAD=${LOAD:-uniform flood}

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap "exit 1" INT TERM
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{ printf "%.3f", ($14 + $15) / t }' "/proc/$1/stat"; }
redis_cpu_s() { redis-cli -p "$rport" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { printf "%.3f", s }'; }

git clone -q "$PEER_SRC" "$tmp/peer-src"
(cd "$tmp/peer-src" && git checkout -q "$PEER_REV" && echo "peer: envoyproxy/ratelimit $(git log -1 --format='%h %cs')" &&
	go build -o "$tmp/peer" ./src/service_cmd)
go build -tags bench -o "$tmp/weir" ./cmd/weir

mkdir -p "$tmp/envoy" "$tmp/runtime/ratelimit/config"
cat >"$tmp/envoy/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 100}
YAML
cp "$tmp/envoy/bench.yaml" "$tmp/runtime/ratelimit/config/bench.yaml"

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" --logfile "$tmp/redis.log" &
pids+=($!)
for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done

# start VARIANT: starts a server, prints "pid grpc-port".
start() {
	local gport hport dport
	gport=$(free_port) hport=$(free_port) dport=$(free_port)
	case $1 in
	weir)
		printf 'store: {type: redis, redis: {addrs: [127.0.0.1:%s]}}\n' "$rport" >"$tmp/weir.yaml"
		"$tmp/weir" serve --config "$tmp/weir.yaml" --envoy-config "$tmp/envoy" \
			--http "127.0.0.1:$hport" --grpc "127.0.0.1:$gport" >"$tmp/server.log" 2>&1 &
		;;
	peer*)
		local extra=()
		[ "$1" = peer-pipelined ] && extra=(REDIS_PIPELINE_WINDOW=150us REDIS_PIPELINE_LIMIT=8)
		[ "$1" = peer-cache ] && extra=(LOCAL_CACHE_SIZE_IN_BYTES=1048576)
		env REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$rport" RUNTIME_ROOT="$tmp/runtime" \
			RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false USE_STATSD=false LOG_LEVEL=error \
			HOST=127.0.0.1 PORT="$hport" GRPC_HOST=127.0.0.1 GRPC_PORT="$gport" \
			DEBUG_HOST=127.0.0.1 DEBUG_PORT="$dport" "${extra[@]}" "$tmp/peer" >"$tmp/server.log" 2>&1 &
		;;
	esac
	local pid=$!
	for _ in $(seq 1 200); do
		curl -fs "http://127.0.0.1:$hport/healthcheck" >/dev/null 2>&1 && break
		curl -fs "http://127.0.0.1:$hport/readyz" >/dev/null 2>&1 && break
		sleep 0.05
	done
	echo "$pid $gport"
}

# run VARIANT LOAD: one measured run; appends "variant load calls/s p99 cpu redis" to $tmp/rows.
run() {
	local variant=$1 load=$2 pid gport flags=()
	redis-cli -p "$rport" flushall >/dev/null
	read -r pid gport < <(start "$variant")
	[ "$load" = flood ] && flags=(--abusive 0.9 --abusive-keys 10)
	local c0 r0
	c0=$(cpu_s "$pid") r0=$(redis_cpu_s)
	"$tmp/weir" bench --target grpc --addr "127.0.0.1:$gport" --concurrency 64 --connections 64 \
		--keys 100000 --dist uniform --duration "$DURATION" --json --quiet "${flags[@]}" >"$tmp/out.json" || true
	local c1 r1
	c1=$(cpu_s "$pid") r1=$(redis_cpu_s)
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	python3 - "$variant" "$load" "$c0" "$c1" "$r0" "$r1" "$tmp/out.json" <<'PY' | tee -a "$tmp/rows"
import json, sys
v, load, c0, c1, r0, r1, path = sys.argv[1:]
o = json.load(open(path))
n = max(o.get("decisions", 0), 1)
if o.get("errors"):
    print(f"# {v} {load}: {o['errors']} errors: {o.get('first_error', '')}", file=sys.stderr)
print(v, load, round(o["decisions_per_second"]), o["latency_ms"].get("p99", 0),
      round((float(c1) - float(c0)) * 1e6 / n, 1), round((float(r1) - float(r0)) * 1e6 / n, 1))
PY
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
	for load in $LOAD; do
		variants="weir peer peer-pipelined"
		[ "$load" = flood ] && variants="weir peer-cache"
		for v in $variants; do run "$v" "$load"; done
	done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp/rows" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    v, load, *nums = line.split()
    rows.setdefault((load, v), []).append([float(x) for x in nums])
def f(xs):
    return f"{statistics.median(xs):,.1f} ({min(xs):,.1f}–{max(xs):,.1f})"
print("| load | server | calls/s | p99 ms | server CPU µs/call | Redis CPU µs/call |")
print("|---|---|---:|---:|---:|---:|")
for (load, v), rs in sorted(rows.items()):
    cols = list(zip(*rs))
    print(f"| {load} | {v} | " + " | ".join(f(c) for c in cols) + " |")
PY
