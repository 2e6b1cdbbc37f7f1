#!/usr/bin/env bash
# scripts/fuzz.sh — make fuzz: run each fuzz target for FUZZTIME in turn
# (FUZZ=<name> for one), and fail on a finding only.
#
# A finding is an input that fails: go test writes it under the package's
# testdata/fuzz/<name>/ and reports it. Go's fuzzing coordinator can also
# end a run with a bare "context deadline exceeded" when -fuzztime runs out
# while a worker is still in a call (a race in the coordinator that a busy
# machine makes likelier; no input is written and none reproduces). Such a
# run is retried once, with the corpus replayed first, and reported as a
# flake if the retry passes. A name that matches no target in its package
# fails (go test would pass it, fuzzing nothing). Every target runs even
# after one fails; the script exits non-zero if any failed.
#
#   scripts/fuzz.sh 'pkg:Name pkg:Name ...'     # FUZZTIME (60s), FUZZ, GO
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
FUZZTIME=${FUZZTIME:-60s}
FUZZ=${FUZZ:-}
targets=${1:?usage: scripts/fuzz.sh "pkg:Name ..."}

corpus() { # the files of a target's corpus in testdata: its seeds and the failing inputs go test wrote
	ls "$1/testdata/fuzz/$2" 2>/dev/null | sort
}

# run_one pkg name: 0 passed, 1 found something, 2 ended on the deadline race
run_one() {
	local pkg=$1 name=$2 out before after
	before=$(corpus "$pkg" "$name")
	out=$(mktemp)
	if $GO test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg" >"$out" 2>&1; then
		grep -v '^fuzz: elapsed' "$out"
		if grep -q 'no fuzz tests to fuzz' "$out"; then
			# go test passes when the name matches no target in pkg.
			echo "fuzz.sh: $pkg has no fuzz target $name" >&2
			rm -f "$out"
			return 1
		fi
		rm -f "$out"
		return 0
	fi
	grep -v '^fuzz: elapsed' "$out"
	after=$(corpus "$pkg" "$name")
	# The deadline race: the only failure printed, and no new input kept.
	if [ "$before" = "$after" ] &&
		grep -q '^    context deadline exceeded$' "$out" &&
		[ "$(grep -c -e '^--- FAIL' -e '^panic:' -e 'Failing input written' "$out")" = 1 ]; then
		rm -f "$out"
		return 2
	fi
	rm -f "$out"
	return 1
}

failed=() flaked=() ran=0
for t in $targets; do
	pkg=${t%%:*} name=${t##*:}
	if [ -n "$FUZZ" ] && [ "$FUZZ" != "$name" ]; then
		continue
	fi
	ran=$((ran + 1))
	echo "== $name ($pkg, $FUZZTIME)"
	run_one "$pkg" "$name"
	rc=$?
	if [ $rc = 2 ]; then
		echo "== $name: ended with Go's fuzzing deadline race and no input written; replaying the corpus and running again"
		if $GO test -count=1 -run "^${name}\$" "$pkg" >/dev/null && run_one "$pkg" "$name"; then
			flaked+=("$name")
			continue
		fi
		rc=1
	fi
	if [ $rc != 0 ]; then
		failed+=("$name")
	fi
done

if [ $ran = 0 ]; then
	echo "fuzz.sh: no target named ${FUZZ}" >&2
	exit 2
fi
echo "== $ran targets, ${#failed[@]} failed${failed:+: ${failed[*]}}, ${#flaked[@]} passed when retried after the deadline race${flaked:+: ${flaked[*]}}"
[ ${#failed[@]} = 0 ]
