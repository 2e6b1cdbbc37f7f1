#!/usr/bin/env bash
# bench/flood/run.sh — weir under a flood, on a private redis-server on a
# free loopback port (never a Redis it did not start). Every figure is
# printed beside the same run without the deny cache.
#
# Parts (PARTS, default "abusive serve"); each is a function part_<name>
# below, so a new part is one more function and one more word in PARTS:
#   abusive  through redisstore (bench/flood): GOROUTINES (256) deciders,
#            ABUSIVE (0.9) of the decisions from ABUSIVE_KEYS (10) keys over
#            a limit of RATE (100)/s, the rest on KEYS (100k) keys;
#            decisions/s and Redis time per decision (the scripts' usec in
#            INFO commandstats over the decisions made).
#   serve    weir serve over gRPC (Envoy ShouldRateLimit) driven by
#            weir bench --abusive 0.9 --abusive-keys 10, CONNS (64) callers,
#            KEYS keys: decisions/s and Redis time per decision.
#
#   bench/flood/run.sh                       # DURATION=10s
#   PARTS=abusive DURATION=5s bench/flood/run.sh
#
# serve only: WEIR=path runs that weir binary instead of building ./cmd/weir
# (an A/B against another commit's build), CACHES ("false true") the
# deny_cache settings in turn, REDIS_OPTS more of store.redis (YAML flow
# entries, e.g. "max_in_flight: 1"). Its second table splits the decisions that
# reached Redis (the cache's misses) by class: the ordinary keys' (every
# one), the abusive keys' admissions, and the abusive keys' denials that
# Redis made (the herd at a cached denial's lapse and the requests in flight
# when a window turns), with the mean decisions per script call.
set -euo pipefail
cd "$(dirname "$0")/../.."

PARTS=${PARTS:-abusive serve}
DURATION=${DURATION:-10s}
GOROUTINES=${GOROUTINES:-256}
ABUSIVE=${ABUSIVE:-0.9}
ABUSIVE_KEYS=${ABUSIVE_KEYS:-10}
KEYS=${KEYS:-100000}
RATE=${RATE:-100}
CONNS=${CONNS:-64}
CACHES=${CACHES:-false true}
WEIR=${WEIR:-}
REDIS_OPTS=${REDIS_OPTS:-}
for tool in redis-server redis-cli go python3 curl; do
	command -v "$tool" >/dev/null || { echo "run.sh: $tool not found" >&2; exit 1; }
done

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" --logfile "$tmp/redis.log" &
pids+=($!)
for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -p "$rport" ping >/dev/null || { echo "run.sh: redis-server did not start" >&2; exit 1; }
cli() { redis-cli -p "$rport" "$@"; }

# script_usec_calls prints the usec and calls of the scripts (FCALL,
# EVALSHA, EVAL) in INFO commandstats.
script_usec_calls() {
	cli INFO commandstats | tr -d '\r' | awk -F'[:,=]' '
		$1 ~ /^cmdstat_(fcall|fcall_ro|evalsha|eval)$/ { for (i = 2; i < NF; i += 2) { if ($i == "usec") u += $(i+1); if ($i == "calls") c += $(i+1) } }
		END { printf "%d %d\n", u, c }'
}

# redis_cpu_usec prints redis-server's CPU time so far (user + system, µs):
# what the server spent, without the time a script's usec also counts while
# the server waits for a core the other processes hold.
redis_cpu_usec() {
	cli INFO cpu | tr -d '\r' | awk -F: '$1 == "used_cpu_user" || $1 == "used_cpu_sys" { s += $2 } END { printf "%d\n", s * 1e6 }'
}

echo "Machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $(go version | cut -d' ' -f3), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo

part_abusive() {
	(cd bench && go build -o "$tmp/flood" ./flood)
	echo "### abusive keys through redisstore: $GOROUTINES goroutines, $ABUSIVE of decisions from $ABUSIVE_KEYS keys over $RATE/s, the rest on $KEYS keys, $DURATION"
	echo
	echo "| deny cache | decisions/s | Redis µs per decision | script calls | answered from memory | admitted | errors | herd answers |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|"
	for cache in false true; do
		cli FLUSHALL >/dev/null
		"$tmp/flood" -addr "127.0.0.1:$rport" -cache="$cache" -goroutines "$GOROUTINES" -abusive "$ABUSIVE" \
			-abusive-keys "$ABUSIVE_KEYS" -keys "$KEYS" -rate "$RATE" -duration "$DURATION" -json >"$tmp/flood.json"
		python3 - "$tmp/flood.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
mem = r["cache_hits"] / r["decisions"] if r["decisions"] else 0
print(f'| {"on" if r["cache"] else "off"} | {r["decisions_per_second"]:,.0f} | {r["redis_usec_per_decision"]:.3f} | {r["script_calls"]:,} | {100*mem:.1f}% | {r["admitted"]:,} | {r["errors"]} | {r.get("herd_answers", 0):,} |')
PY
	done
	echo
}

part_serve() {
	local weir=$WEIR
	if [ -z "$weir" ]; then
		go build -tags bench -o "$tmp/weir" ./cmd/weir  # with the lean gRPC client
		weir=$tmp/weir
	fi
	mkdir -p "$tmp/envoy"
	cat >"$tmp/envoy/bench.yaml" <<YAML
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: $RATE}
YAML
	echo "### weir serve over gRPC: weir bench --abusive $ABUSIVE --abusive-keys $ABUSIVE_KEYS, $CONNS callers, $KEYS keys, $DURATION"
	echo
	echo "| deny cache | decisions/s | Redis µs per decision | Redis CPU µs per decision | script calls | p50 ms | p99 ms | store errors |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|"
	: >"$tmp/classes"
	for cache in $CACHES; do
		cli FLUSHALL >/dev/null
		cat >"$tmp/weir.yaml" <<YAML
store: {type: redis, deny_cache: $cache, redis: {addrs: [127.0.0.1:$rport]${REDIS_OPTS:+, $REDIS_OPTS}}}
rules: [{name: demo-ip, match: {path: /}, identity: [ip], limit: 100/s}]
YAML
		hport=$(free_port)
		gport=$(free_port)
		"$weir" serve --config "$tmp/weir.yaml" --envoy-config "$tmp/envoy" \
			--http "127.0.0.1:$hport" --grpc "127.0.0.1:$gport" >"$tmp/serve.log" 2>&1 &
		spid=$!
		for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$hport/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
		if [ "$cache" = true ]; then
			for _ in $(seq 1 100); do
				curl -fs "http://127.0.0.1:$hport/metrics" | grep -q '^weir_deny_cache_live 1' && break
				sleep 0.1
			done
		fi
		curl -fs "http://127.0.0.1:$hport/metrics" >"$tmp/metrics0" || true
		read -r u0 c0 < <(script_usec_calls)
		cpu0=$(redis_cpu_usec)
		"$weir" bench --target grpc --addr "127.0.0.1:$gport" --concurrency "$CONNS" --keys "$KEYS" \
			--abusive "$ABUSIVE" --abusive-keys "$ABUSIVE_KEYS" --duration "$DURATION" --json --quiet >"$tmp/bench.json"
		read -r u1 c1 < <(script_usec_calls)
		cpu1=$(redis_cpu_usec)
		curl -fs "http://127.0.0.1:$hport/metrics" >"$tmp/metrics1" || true
		errors=$(awk '$1 == "weir_store_errors_total" { print $2 }' "$tmp/metrics1")
		kill "$spid" 2>/dev/null || true
		wait "$spid" 2>/dev/null || true
		python3 - "$tmp/bench.json" "$cache" "$((u1 - u0))" "$((c1 - c0))" "${errors:-?}" "$tmp/metrics0" "$tmp/metrics1" "$ABUSIVE" "$tmp/classes" "$((cpu1 - cpu0))" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
usec, calls = int(sys.argv[3]), int(sys.argv[4])
n = r.get("requests") or r.get("total") or 0
rps = r.get("decisions_per_second") or 0
lat = r.get("latency_ms") or {}
fmt = lambda v: f'{v:.2f}' if isinstance(v, (int, float)) else '?'
cache = "on" if sys.argv[2] == "true" else "off"
cpu = int(sys.argv[10])
print(f'| {cache} | {rps:,.0f} | {usec / n if n else 0:.3f} | {cpu / n if n else 0:.3f} | {calls:,} | {fmt(lat.get("p50"))} | {fmt(lat.get("p99"))} | {sys.argv[5]} |')
def metrics(path):
    out = {}
    try:
        for line in open(path):
            if line.startswith("weir_deny_cache_"):
                name, _, v = line.rpartition(" ")
                out[name] = float(v)
    except OSError:
        pass
    return out
m0, m1 = metrics(sys.argv[6]), metrics(sys.argv[7])
d = lambda k: m1.get(k, 0) - m0.get(k, 0)
secs = r.get("seconds") or 1
# With the cache, the decisions that reached Redis are its misses; without
# it, every decision. The ordinary keys' share is the bench's (all of them
# admitted: 100k keys far under their limit).
redis = d("weir_deny_cache_misses_total") if cache == "on" else n
ordinary = (1 - float(sys.argv[8])) * n
admitted = r.get("allowed") or 0
abusive_adm = max(0, admitted - ordinary)
abusive_den = max(0, redis - ordinary - abusive_adm)
herd = d("weir_deny_cache_herd_total")
with open(sys.argv[9], "a") as f:
    f.write(f'| {cache} | {redis/secs:,.0f} | {ordinary/secs:,.0f} | {abusive_adm/secs:,.0f} | {abusive_den/secs:,.0f} | {herd/secs:,.0f} | {redis/calls if calls else 0:.1f} | {usec/calls if calls else 0:.1f} |\n')
PY
	done
	echo
	echo "Decisions per second by class (Redis decisions: the cache's misses, or every decision without it):"
	echo
	echo "| deny cache | Redis decisions/s | ordinary keys/s | abusive admitted/s | abusive denied by Redis/s | herd answers/s | decisions per script call | µs per script call |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|"
	cat "$tmp/classes"
	echo
}

for p in $PARTS; do
	"part_$p"
done
