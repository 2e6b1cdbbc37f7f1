#!/usr/bin/env bash
# Runs envoyproxy/ratelimit's own cases (TestPeerCases and
# TestPeerCasesRefusedConfig in cmd/weir) against weir serve and, side by
# side, against the peer itself, built from PEER_SRC (a git URL or a
# clone; PEER_REV, default HEAD) in a temporary directory, with the peer's
# own config files. Every answer must agree field for field. Needs
# redis-server on PATH.
#
#   PEER_SRC=https://github.com/envoyproxy/ratelimit scripts/test-peer.sh
#   PEER_SRC=/path/to/a/clone SHORT=1 scripts/test-peer.sh   # without the minute-long cases
set -euo pipefail
cd "$(dirname "$0")/.."
PEER_SRC=${PEER_SRC:?set PEER_SRC to envoyproxy/ratelimit: a git URL or a local clone}
PEER_REV=${PEER_REV:-HEAD}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone -q "$PEER_SRC" "$tmp/peer-src"
(cd "$tmp/peer-src" && git checkout -q "$PEER_REV" && echo "peer: envoyproxy/ratelimit $(git log -1 --format='%h %cs')" &&
	go build -o "$tmp/peer" ./src/service_cmd)
short=()
[ -n "${SHORT:-}" ] && short=(-short)
PEER_RATELIMIT="$tmp/peer" PEER_SRC="$tmp/peer-src" \
	go test -count=1 "${short[@]}" -v -run '^(TestPeerCases|TestPeerCasesRefusedConfig)$' ./cmd/weir |
	grep -E '^(--- |ok|FAIL|PASS)|cases, |peercases_test' || true
test "${PIPESTATUS[0]}" -eq 0
