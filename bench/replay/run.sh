#!/usr/bin/env bash
# bench/replay/run.sh — `weir replay` over a generated nginx combined log
# (bench/replay/gen) with the three rules of bench/replay/weir.yaml
# (store.max_keys: 100000), as docs/benchmarks.md records it: lines/s and
# the process's peak memory.
#
#   bench/replay/run.sh                 # LINES=10000000
#   LINES=1000000 bench/replay/run.sh   # memory stays the same on a tenth
#
# The log is kept in $LOG (default /tmp/weir-bench-replay-$LINES.log) for
# later runs; delete it to generate it again.
set -euo pipefail
cd "$(dirname "$0")/../.."
LINES=${LINES:-10000000}
LOG=${LOG:-/tmp/weir-bench-replay-$LINES.log}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

go build -o "$tmp/weir" ./cmd/weir
if [ ! -s "$LOG" ]; then
	echo "generating $LINES lines into $LOG"
	(cd bench && go run ./replay/gen -lines "$LINES") > "$LOG.part"
	mv "$LOG.part" "$LOG"
fi
size=$(stat -c %s "$LOG")
/usr/bin/time -f '%e %M %U %S' -o "$tmp/time" "$tmp/weir" replay --config bench/replay/weir.yaml --json "$LOG" > "$tmp/report.json"
read -r secs rss usr sys < "$tmp/time"
python3 - "$tmp/report.json" "$secs" "$rss" "$size" "$usr" "$sys" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
secs, rss, size = float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cpu = float(sys.argv[5]) + float(sys.argv[6])
print(f"weir replay: {rep['lines']:,} lines ({size/2**20:,.0f} MB, {rep['format']}), 3 rules, {secs:.2f} s")
print(f"  {rep['lines']/secs:,.0f} lines/s   {size/2**20/secs:,.0f} MB/s   peak RSS {rss/1024:,.0f} MB   CPU {cpu:.2f} s ({rep['lines']/cpu:,.0f} lines per CPU-second)")
for r in rep["rules"]:
    print(f"  {r['name']:8} matched {r['matched']:>11,}  limited {r['limited']:>9,}  identities {r['identities']:>9,}{' (estimate)' if r.get('approximate') else ''}")
PY
