#!/usr/bin/env bash
# bench/resp/run.sh — weir serve's Redis-protocol listener side by side
# with redis-server (docs/benchmarks.md, "RESP listener"). On free loopback
# ports it starts weir serve (memory store, --resp) and a private
# redis-server, each pinned to the same core (SERVER_CPU), the load
# generators on another (LOAD_CPU), and:
#
#  1. redis-benchmark -P 16 -c 50 -n N -r KEYS: CL.THROTTLE on weir against
#     INCR on redis-server, interleaved ROUNDS times; requests/s and each
#     server's CPU per request (from /proc/<pid>/stat, utime + stime);
#  2. weir serve's CPU per decision for the same rule over RESP
#     (WEIR.CHECK, redis-benchmark, pipelined and not) and over HTTP
#     (POST /v1/check, weir bench --target check, 50 callers).
#
# With STORE=redis, weir serve decides on the private redis-server, and a
# third table gives CL.THROTTLE's requests/s through weir with the Redis
# CPU it cost per decision, to set beside `make bench-redis`'s batched
# figure for gcra.
#
# With BASE=<commit>, it builds that commit's weir serve as well and, on
# the same redis-server and core, alternates the two binaries ROUNDS times
# under the same CL.THROTTLE load (A = BASE, B = this tree), printing
# requests/s, weir µs CPU and Redis µs CPU per request of each run, then
# the tables above for this tree.
#
#   bench/resp/run.sh                  # N=1000000 ROUNDS=3
#   N=200000 ROUNDS=1 bench/resp/run.sh
#   STORE=redis bench/resp/run.sh
#   BASE=main STORE=redis N=300000 ROUNDS=5 bench/resp/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${N:-1000000}
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-100000}
DURATION=${DURATION:-10s}
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
	SERVER_CPU=${SERVER_CPU:-1}
	LOAD_CPU=${LOAD_CPU:-0}
fi
# Command prefixes that pin to a core (taskset execs: $! stays the server).
srv=()
load=()
[ -n "${SERVER_CPU:-}" ] && srv=(taskset -c "$SERVER_CPU")
[ -n "${LOAD_CPU:-}" ] && load=(taskset -c "$LOAD_CPU")

pids=()
work=$(mktemp -d)
stop() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	[ -n "${BASE:-}" ] && git worktree remove --force "$work/a-src" 2>/dev/null || true
	rm -rf "$work"
}
trap stop EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
# CPU seconds (user + system) a process has used.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }

go build -o "$work/weir" ./cmd/weir
if [ -n "${BASE:-}" ]; then
	git worktree add --detach "$work/a-src" "$BASE" >/dev/null 2>&1
	(cd "$work/a-src" && go build -o "$work/weir-a" ./cmd/weir)
fi

rport=$(free_port)
"${srv[@]}" redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no \
	--dir "$work" --logfile "$work/redis.log" &
rpid=$!
pids+=("$rpid")

STORE=${STORE:-memory}
if [ "$STORE" = redis ]; then
	printf 'store: {type: redis, timeout: 2s, redis: {addrs: ["127.0.0.1:%s"]}}\n' "$rport" >"$work/weir.yaml"
else
	echo 'store: {type: memory}' >"$work/weir.yaml"
fi
echo 'rules: [{name: bench, match: {path: /}, identity: [ip], limit: 1000000/s}]' >>"$work/weir.yaml"
hport=$(free_port)
wport=$(free_port)
"${srv[@]}" "$work/weir" serve --config "$work/weir.yaml" --http "127.0.0.1:$hport" --grpc off \
	--resp "127.0.0.1:$wport" >"$work/serve.log" 2>&1 &
wpid=$!
pids+=("$wpid")
if [ -n "${BASE:-}" ]; then
	aport=$(free_port)
	"${srv[@]}" "$work/weir-a" serve --config "$work/weir.yaml" --http "127.0.0.1:$(free_port)" --grpc off \
		--resp "127.0.0.1:$aport" >"$work/serve-a.log" 2>&1 &
	apid=$!
	pids+=("$apid")
fi
for _ in $(seq 1 100); do
	redis-cli -p "$rport" ping >/dev/null 2>&1 && redis-cli -p "$wport" ping >/dev/null 2>&1 &&
		{ [ -z "${BASE:-}" ] || redis-cli -p "$aport" ping >/dev/null 2>&1; } && break
	sleep 0.1
done

# bench PID PORT ARGS...: redis-benchmark on LOAD_CPU against PORT; prints
# "requests/s µs-CPU-per-request" of process PID.
bench() {
	local pid=$1 port=$2
	shift 2
	local c0 c1 rps
	c0=$(cpu "$pid")
	rps=$("${load[@]}" redis-benchmark -p "$port" -n "$N" -r "$KEYS" --csv "$@" 2>/dev/null |
		awk -F'","' 'NR == 2 { print $2 }')
	c1=$(cpu "$pid")
	awk -v rps="$rps" -v c="$(awk -v a="$c0" -v b="$c1" 'BEGIN { print b - a }')" -v n="$N" \
		'BEGIN { printf "%.0f %.2f\n", rps, c / n * 1e6 }'
}

echo "Store: $STORE. Machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); servers on CPU ${SERVER_CPU:-any}, load on ${LOAD_CPU:-any}; N=$N, $KEYS keys"
echo
if [ -n "${BASE:-}" ]; then
	echo "A = $BASE ($(git rev-parse --short "$BASE")), B = this tree; CL.THROTTLE -P 16 -c 50, alternating"
	echo
	echo "| round | binary | req/s | weir µs CPU/req | Redis µs CPU/req |"
	echo "|---|---|---:|---:|---:|"
	for round in $(seq 1 "$ROUNDS"); do
		for ab in A B; do
			pid=$wpid port=$wport
			[ "$ab" = A ] && pid=$apid port=$aport
			redis-cli -p "$rport" flushall >/dev/null
			r0=$(cpu "$rpid")
			read -r wr wc < <(bench "$pid" "$port" -P 16 -c 50 CL.THROTTLE "k:__rand_int__" 1000000 1000000 1)
			r1=$(cpu "$rpid")
			awk -v r="$round" -v ab="$ab" -v wr="$wr" -v wc="$wc" -v c="$(awk -v a="$r0" -v b="$r1" 'BEGIN { print b - a }')" -v n="$N" \
				'BEGIN { printf "| %d | %s | %d | %.2f | %.2f |\n", r, ab, wr, wc, c / n * 1e6 }'
		done
	done
	echo
fi
echo "| round | weir CL.THROTTLE req/s | weir µs CPU/req | redis-server INCR req/s | redis µs CPU/req | req/s weir ÷ redis |"
echo "|---|---:|---:|---:|---:|---:|"
for round in $(seq 1 "$ROUNDS"); do
	read -r wr wc < <(bench "$wpid" "$wport" -P 16 -c 50 CL.THROTTLE "k:__rand_int__" 1000000 1000000 1)
	read -r rr rc < <(bench "$rpid" "$rport" -P 16 -c 50 INCR "k:__rand_int__")
	awk -v r="$round" -v wr="$wr" -v wc="$wc" -v rr="$rr" -v rc="$rc" \
		'BEGIN { printf "| %d | %d | %.2f | %d | %.2f | %.2f |\n", r, wr, wc, rr, rc, wr / rr }'
done

echo
echo "| weir serve, rule bench | decisions/s | µs CPU/decision |"
echo "|---|---:|---:|"
read -r a b < <(bench "$wpid" "$wport" -P 16 -c 50 WEIR.CHECK bench "__rand_int__")
echo "| RESP WEIR.CHECK, redis-benchmark -P 16 -c 50 | $a | $b |"
read -r a b < <(bench "$wpid" "$wport" -P 1 -c 50 WEIR.CHECK bench "__rand_int__")
echo "| RESP WEIR.CHECK, redis-benchmark -P 1 -c 50 | $a | $b |"
c0=$(cpu "$wpid")
"${load[@]}" "$work/weir" bench --target check --addr "http://127.0.0.1:$hport" --rule bench \
	--concurrency 50 --keys "$KEYS" --dist uniform --duration "$DURATION" --quiet --json >"$work/out.json"
c1=$(cpu "$wpid")
python3 - "$work/out.json" "$c0" "$c1" <<'PY'
import json, sys
o = json.load(open(sys.argv[1]))
n = o["total"] - o["errors"]
us = (float(sys.argv[3]) - float(sys.argv[2])) / n * 1e6
print(f"| HTTP POST /v1/check, weir bench -concurrency 50 | {o['decisions_per_second']:.0f} | {us:.2f} |")
if o["errors"]:
    print(f"{o['errors']} errors: {o.get('first_error')}", file=sys.stderr)
PY

if [ "$STORE" = redis ]; then
	echo
	echo "| weir serve on Redis, CL.THROTTLE -P 16 -c 50 | requests/s | weir µs CPU/req | Redis µs CPU/req |"
	echo "|---|---:|---:|---:|"
	for round in $(seq 1 "$ROUNDS"); do
		r0=$(cpu "$rpid")
		read -r wr wc < <(bench "$wpid" "$wport" -P 16 -c 50 CL.THROTTLE "k:__rand_int__" 1000000 1000000 1)
		r1=$(cpu "$rpid")
		awk -v r="$round" -v wr="$wr" -v wc="$wc" -v c="$(awk -v a="$r0" -v b="$r1" 'BEGIN { print b - a }')" -v n="$N" \
			'BEGIN { printf "| %d | %d | %.2f | %.2f |\n", r, wr, wc, c / n * 1e6 }'
	done
fi
