#!/usr/bin/env bash
# bench/serve/run.sh — `weir serve` on Redis driven by `weir bench` over
# Envoy's ShouldRateLimit, as docs/benchmarks.md records it: 64 connections,
# 100k uniform keys, 15 s. Everything runs on this machine's loopback: a
# private redis-server on a free port, weir serve, and the load generator.
#
#   bench/serve/run.sh              # DURATION=15s CONNS=64 KEYS=100000 STORE=redis
#   STORE=memory bench/serve/run.sh # the same without Redis: the gRPC ceiling
#   TARGET=check bench/serve/run.sh # POST /v1/check over HTTP/1.1 instead of gRPC
#   KEEP_LOG=serve.log bench/serve/run.sh # keep weir serve's log in that file
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-15s}
CONNS=${CONNS:-64}
KEYS=${KEYS:-100000}
STORE=${STORE:-redis}
TARGET=${TARGET:-grpc}

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	[ -n "${KEEP_LOG:-}" ] && cp "$tmp/serve.log" "$KEEP_LOG"
	rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }

go build -tags bench -o "$tmp/weir" ./cmd/weir  # with the lean gRPC client

mkdir -p "$tmp/envoy"
cat >"$tmp/envoy/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 100}
YAML

store_yaml="store: {type: memory}"
if [ "$STORE" = redis ]; then
	rport=$(free_port)
	redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" --logfile "$tmp/redis.log" &
	pids+=($!)
	for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
	# The default store settings (timeout 50ms, 2 calls in flight, batches
	# of up to 64). If a call timed out, the breaker could move decisions to
	# the local fallback; the run reports store errors below, and they must
	# be 0 for the figure to be Redis's.
	store_yaml="store: {type: redis, redis: {addrs: [127.0.0.1:$rport]}}"
fi
cat >"$tmp/weir.yaml" <<YAML
$store_yaml
rules: [{name: demo-ip, match: {path: /}, identity: [ip], limit: 100/s}]
YAML

hport=$(free_port)
gport=$(free_port)
"$tmp/weir" serve --config "$tmp/weir.yaml" --envoy-config "$tmp/envoy" \
	--http "127.0.0.1:$hport" --grpc "127.0.0.1:$gport" >"$tmp/serve.log" 2>&1 &
pids+=($!)
serve_pid=$!
for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$hport/readyz" >/dev/null 2>&1 && break; sleep 0.1; done

# CPU seconds (user + system) of a process, from /proc.
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$1/stat"; }
redis_cpu_s() { [ "$STORE" = redis ] && redis-cli -p "$rport" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { printf "%.2f", s }'; }
serve_cpu0=$(cpu_s "$serve_pid")
redis_cpu0=$(redis_cpu_s || true)
if [ "$TARGET" = grpc ]; then
	"$tmp/weir" bench --target grpc --addr "127.0.0.1:$gport" --concurrency 64 --connections "$CONNS" \
		--keys "$KEYS" --dist uniform --duration "$DURATION"
else
	"$tmp/weir" bench --target "$TARGET" --addr "http://127.0.0.1:$hport" --concurrency 64 \
		--keys "$KEYS" --dist uniform --duration "$DURATION"
fi
errors=$(curl -fs "http://127.0.0.1:$hport/metrics" | awk '$1 == "weir_store_errors_total" { print $2 }')
echo "store errors during the run: ${errors:-unknown}"
# Divide by the decisions above for the CPU per decision, hence decisions/s per core.
echo "CPU seconds during the run: weir serve $(awk -v a="$serve_cpu0" -v b="$(cpu_s "$serve_pid")" 'BEGIN { printf "%.2f", b - a }')${redis_cpu0:+, redis-server $(awk -v a="$redis_cpu0" -v b="$(redis_cpu_s)" 'BEGIN { printf "%.2f", b - a }')}"
if grep -q "breaker opened" "$tmp/serve.log"; then
	echo "note: the store's circuit breaker opened during the run; some decisions used the local fallback" >&2
fi
