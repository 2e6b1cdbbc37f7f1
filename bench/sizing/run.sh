#!/usr/bin/env bash
# bench/sizing/run.sh — decisions/s per core of `weir serve`, for sizing a
# fleet (docs/operations.md, "Sizing"). Starts weir serve (and, for
# STORE=redis, a private redis-server) on free loopback ports, drives it
# with `weir bench` over gRPC (Envoy ShouldRateLimit) and over HTTP
# (POST /v1/check), and reads each process's CPU time from /proc before
# and after: decisions/s per core is decisions / CPU seconds of that
# process, whatever share of the machine the load generator took.
#
#   bench/sizing/run.sh                  # STORE=redis DURATION=10s, both targets
#   STORE=memory bench/sizing/run.sh     # memstore
#   TARGETS=grpc bench/sizing/run.sh     # one target
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-10s}
STORE=${STORE:-redis}
TARGETS=${TARGETS:-grpc check}

pids=()
work=$(mktemp -d)
stop() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap stop EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
# CPU seconds (user + system) a process has used.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }

go build -o "$work/weir" ./cmd/weir

mkdir -p "$work/envoy"
cat >"$work/envoy/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 100}
YAML

store_yaml="store: {type: memory}"
rpid=""
if [ "$STORE" = redis ]; then
	rport=$(free_port)
	redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --logfile "$work/redis.log" &
	rpid=$!
	pids+=("$rpid")
	for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
	store_yaml="store: {type: redis, redis: {addrs: [127.0.0.1:$rport]}}"
fi
cat >"$work/weir.yaml" <<YAML
$store_yaml
rules: [{name: demo-ip, match: {path: /}, identity: [ip], limit: 100/s}]
YAML

hport=$(free_port)
gport=$(free_port)
"$work/weir" serve --config "$work/weir.yaml" --envoy-config "$work/envoy" \
	--http "127.0.0.1:$hport" --grpc "127.0.0.1:$gport" >"$work/serve.log" 2>&1 &
wpid=$!
pids+=("$wpid")
for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$hport/readyz" >/dev/null 2>&1 && break; sleep 0.1; done

echo "Machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), store $STORE, $DURATION per target"
echo "| target | decisions/s | weir serve µs CPU/decision | weir serve decisions/s per core | Redis µs CPU/decision | Redis decisions/s per core |"
echo "|---|---:|---:|---:|---:|---:|"
for target in $TARGETS; do
	case $target in
	grpc) args=(--target grpc --addr "127.0.0.1:$gport" --connections 64) ;;
	check) args=(--target check --addr "http://127.0.0.1:$hport" --rule demo-ip) ;;
	*) echo "run.sh: unknown target $target" >&2; exit 1 ;;
	esac
	w0=$(cpu "$wpid")
	r0=0
	[ -n "$rpid" ] && r0=$(cpu "$rpid")
	"$work/weir" bench "${args[@]}" --concurrency 64 --keys 100000 --dist uniform \
		--duration "$DURATION" --quiet --json >"$work/out.json"
	w1=$(cpu "$wpid")
	r1=0
	[ -n "$rpid" ] && r1=$(cpu "$rpid")
	python3 - "$work/out.json" "$target" "$w0" "$w1" "$r0" "$r1" <<'PY'
import json, sys
o = json.load(open(sys.argv[1]))
target = sys.argv[2]
w = float(sys.argv[4]) - float(sys.argv[3])
r = float(sys.argv[6]) - float(sys.argv[5])
n = o["total"] - o["errors"]
if o["errors"]:
    print(f"{target}: {o['errors']} errors: {o.get('first_error')}", file=sys.stderr)
wus = w / n * 1e6
row = [target, f"{o['decisions_per_second']:,.0f}", f"{wus:.1f}", f"{1e6 / wus:,.0f}"]
if r > 0:
    rus = r / n * 1e6
    row += [f"{rus:.1f}", f"{1e6 / rus:,.0f}"]
else:
    row += ["", ""]
print("| " + " | ".join(row) + " |")
PY
done
errors=$(curl -fs "http://127.0.0.1:$hport/metrics" | awk '$1 == "weir_store_errors_total" { print $2 }')
echo "store errors during the runs: ${errors:-0}"
