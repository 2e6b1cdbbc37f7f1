# bench/private-redis.sh — sourced by the bench scripts: starts a private
# redis-server on a free loopback port (never 6379, never a Redis it did
# not start), with its data in a fresh temporary directory, and stops it
# and removes the directory on exit. Sets tmp, pid, port and cli().

tmp=$(mktemp -d)
pid=""
cleanup() {
	if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
	rm -rf "$tmp"
}
trap cleanup EXIT

# A free port: try random ones until a server of ours answers on one.
for _ in $(seq 1 20); do
	port=$((20000 + RANDOM % 20000))
	[ "$port" = 6379 ] && continue
	redis-cli -p "$port" ping >/dev/null 2>&1 && continue # someone else's
	redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
		--dir "$tmp" --daemonize no --logfile "$tmp/redis.log" &
	pid=$!
	for _ in $(seq 1 100); do
		redis-cli -p "$port" ping >/dev/null 2>&1 && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	if kill -0 "$pid" 2>/dev/null && redis-cli -p "$port" ping >/dev/null 2>&1; then break; fi
	pid=""
done
[ -n "$pid" ] || { echo "run.sh: could not start redis-server" >&2; exit 1; }
cli() { redis-cli -p "$port" "$@"; }
