#!/usr/bin/env bash
# bench/serve/ab.sh — weir serve's CPU per call, this tree against another
# commit, in one run: for each round, each case and each binary in turn, a
# fresh weir serve is driven by `weir bench` for a fixed number of calls and
# its CPU time (user + system, from /proc) is divided by the calls. CPU
# time per call survives a busy machine far better than calls/s; the
# interleaving puts A and B under the same load. Prints one row per case:
# min, median and max µs per call of each binary over the rounds, and B/A.
#
#   bench/serve/ab.sh REV                 # REV (e.g. HEAD~3) against the work tree
#   CASES="memory:grpc:1 redis:grpc:5" ROUNDS=5 CALLS=200000 bench/serve/ab.sh REV
#
# A case is store:target:descriptors, store memory or redis, target grpc
# (Envoy ShouldRateLimit, 64 callers on 64 connections), check (POST
# /v1/check over HTTP/1.1) or auth (GET /v1/auth); descriptors counts for
# grpc only. Keys are uniform over 100k, as make bench-serve sends them.
set -euo pipefail
cd "$(dirname "$0")/../.."
REV=${1:?usage: bench/serve/ab.sh REV}
CASES=${CASES:-memory:grpc:1 memory:grpc:5 redis:grpc:1 redis:grpc:5 memory:check:1 redis:check:1 memory:auth:1}
ROUNDS=${ROUNDS:-3}
CALLS=${CALLS:-100000}

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	git worktree remove --force "$tmp/a-src" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap "exit 1" INT TERM
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{ printf "%.3f", ($14 + $15) / t }' "/proc/$1/stat"; }

git worktree add --detach "$tmp/a-src" "$REV" >/dev/null 2>&1
(cd "$tmp/a-src" && go build -tags bench -o "$tmp/weir-a" ./cmd/weir)
go build -tags bench -o "$tmp/weir-b" ./cmd/weir

mkdir -p "$tmp/envoy"
{
	echo "domain: bench"
	echo "descriptors:"
	for k in client client2 client3 client4 client5; do
		echo "  - key: $k"
		echo "    rate_limit: {unit: second, requests_per_unit: 100}"
	done
} >"$tmp/envoy/bench.yaml"

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" --logfile "$tmp/redis.log" &
pids+=($!)
for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done

# run BIN STORE TARGET DESCRIPTORS: prints weir serve's µs of CPU per call.
run() {
	local bin=$1 store=$2 target=$3 descs=$4 store_yaml="store: {type: memory}"
	if [ "$store" = redis ]; then
		redis-cli -p "$rport" flushall >/dev/null
		store_yaml="store: {type: redis, redis: {addrs: [127.0.0.1:$rport]}}"
	fi
	printf '%s\nrules: [{name: demo-ip, match: {path: /}, identity: [ip], limit: 100/s}]\n' "$store_yaml" >"$tmp/weir.yaml"
	local hport gport spid
	hport=$(free_port)
	gport=$(free_port)
	"$bin" serve --config "$tmp/weir.yaml" --envoy-config "$tmp/envoy" \
		--http "127.0.0.1:$hport" --grpc "127.0.0.1:$gport" >"$tmp/serve.log" 2>&1 &
	spid=$!
	for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$hport/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
	local args=(--target "$target" --addr "http://127.0.0.1:$hport")
	[ "$target" = grpc ] && args=(--target grpc --addr "127.0.0.1:$gport" --connections 64 --descriptors "$descs")
	local c0 c1
	c0=$(cpu_s "$spid")
	"$tmp/weir-b" bench "${args[@]}" --concurrency 64 --keys 100000 --dist uniform \
		--requests "$CALLS" --quiet --json >"$tmp/out.json"
	c1=$(cpu_s "$spid")
	kill "$spid"
	wait "$spid" 2>/dev/null || true
	python3 - "$tmp/out.json" "$c0" "$c1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
if s["errors"]:
    sys.exit("weir bench: %d errors (%s)" % (s["errors"], s.get("first_error", "")))
print("%.1f" % ((float(sys.argv[3]) - float(sys.argv[2])) * 1e6 / s["total"]))
PY
}

echo "Machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); A = $REV ($(git rev-parse --short "$REV")), B = work tree; $CALLS calls a run, $ROUNDS rounds"
declare -A res
for r in $(seq 1 "$ROUNDS"); do
	for c in $CASES; do
		IFS=: read -r store target descs <<<"$c"
		res[$c:a]+="$(run "$tmp/weir-a" "$store" "$target" "$descs") "
		res[$c:b]+="$(run "$tmp/weir-b" "$store" "$target" "$descs") "
		echo "round $r, $c: A ${res[$c:a]}, B ${res[$c:b]} (load $(cut -d' ' -f1 /proc/loadavg))" >&2
	done
done
echo "| store | call | A µs CPU/call, min–median–max | B µs CPU/call, min–median–max | B/A (medians) |"
echo "|---|---|---:|---:|---:|"
for c in $CASES; do
	IFS=: read -r store target descs <<<"$c"
	call=$target
	[ "$target" = grpc ] && call="ShouldRateLimit, $descs descriptor(s)"
	[ "$target" = check ] && call="POST /v1/check, HTTP/1.1"
	[ "$target" = auth ] && call="GET /v1/auth"
	python3 - "$store" "$call" "${res[$c:a]}" "${res[$c:b]}" <<'PY'
import statistics, sys
a = [float(x) for x in sys.argv[3].split()]
b = [float(x) for x in sys.argv[4].split()]
ma, mb = statistics.median(a), statistics.median(b)
print("| %s | %s | %.1f–%.1f–%.1f | %.1f–%.1f–%.1f | %.2f |" % (sys.argv[1], sys.argv[2], min(a), ma, max(a), min(b), mb, max(b), mb / ma))
PY
done
