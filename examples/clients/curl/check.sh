#!/bin/sh
# Asks weir whether a request may proceed, with curl:
#   check.sh RULE KEY [HITS]
# WEIR_URL (default http://localhost:8080), WEIR_TIMEOUT in seconds
# (default 0.25) and WEIR_FAIL_OPEN (1, the default: allow when weir is
# unavailable; 0: refuse) configure it.
#
# weir answers 200 with the decision when it allows and 429 with the same
# decision (allowed false) when it refuses. Prints "allowed ..." (exit 0),
# "limited ..." (exit 1), "refused (weir unavailable, failing closed)"
# (exit 1) or an error (exit 2).
set -u
rule=${1:?usage: check.sh RULE KEY [HITS]}
key=${2:?usage: check.sh RULE KEY [HITS]}
hits=${3:-1}
url=${WEIR_URL:-http://localhost:8080}
fail_open=${WEIR_FAIL_OPEN:-1}

# JSON-escape the key and rule (backslash and double quote).
esc() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
body=$(printf '{"rule":"%s","key":"%s","hits":%d}' "$(esc "$rule")" "$(esc "$key")" "$hits")

out=$(curl -sS --max-time "${WEIR_TIMEOUT:-0.25}" -w '\n%{http_code}' \
  -H 'Content-Type: application/json' --data "$body" "$url/v1/check" 2>&1)
rc=$?
status=$(printf '%s\n' "$out" | tail -n 1)
resp=$(printf '%s\n' "$out" | sed '$d')

# field NAME: a number or boolean field of the JSON answer.
field() { printf '%s' "$resp" | sed -n "s/.*\"$1\":\([a-z0-9]*\).*/\1/p"; }

case "$rc:$status" in
  0:200|0:429)
    if [ "$(field allowed)" = true ]; then
      echo "allowed remaining=$(field remaining)"; exit 0
    fi
    echo "limited retry_after_ms=$(field retry_after_ms)"; exit 1 ;;
  0:4*)
    echo "weir: HTTP $status: $resp" >&2; exit 2 ;;
esac
# Timeout (curl exit 28), no connection, or a 5xx: weir is unavailable.
reason="curl exit $rc"; [ "$rc" -eq 0 ] && reason="HTTP $status"
if [ "$fail_open" = 1 ]; then
  echo "weir: unavailable ($reason); failing open" >&2
  echo "allowed (weir unavailable, failing open)"; exit 0
fi
echo "weir: unavailable ($reason); failing closed" >&2
echo "refused (weir unavailable, failing closed)"; exit 1
