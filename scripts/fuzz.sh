#!/bin/bash
# fuzz.sh runs every Go fuzz target of the module (every `func FuzzX(f
# *testing.F)` in a _test.go file of a package `go list ./...` names) for a
# bounded time each, one after another, and stops at the first failure with
# the commands that reproduce it. `make test` runs it through `make fuzz`.
#
# Environment:
#   FUZZTIME      how long each target runs (go test -fuzztime: 5s, 10m or
#                 an execution count such as 10000x); default 5s
#   FUZZ_TIMEOUT  go test -timeout of each run; default FUZZTIME plus 10
#                 minutes (a hung input fails the run rather than CI)
#   FUZZ          only targets whose name matches this bash regex
#   FUZZMINIMIZETIME  how long each new interesting input is minimized
#                 (go test -fuzzminimizetime; default 1s, so that short runs
#                 fuzz rather than minimize)
#
# Seed corpora are committed in each package's testdata/fuzz/FuzzX/; what a
# run discovers stays in Go's cache ($(go env GOCACHE)/fuzz). A failing input
# is written to testdata/fuzz/FuzzX/ by go test: commit it with the fix, and
# it runs in every `go test` from then on.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

FUZZTIME=${FUZZTIME:-5s}
FUZZ=${FUZZ:-}
if [ -z "${FUZZ_TIMEOUT:-}" ]; then
	FUZZ_TIMEOUT=1h # an execution count, or a duration such as 1m30s
	if [[ $FUZZTIME =~ ^([0-9]+)s$ ]]; then
		FUZZ_TIMEOUT=$((10#${BASH_REMATCH[1]} + 600))s
	elif [[ $FUZZTIME =~ ^([0-9]+)m$ ]]; then
		FUZZ_TIMEOUT=$((10#${BASH_REMATCH[1]} + 10))m
	elif [[ $FUZZTIME =~ ^([0-9]+)h$ ]]; then
		FUZZ_TIMEOUT=$((10#${BASH_REMATCH[1]} * 60 + 10))m
	fi
fi

# Every package directory of the module, then every fuzz target in it.
dirs=$(go list -f '{{.Dir}}' ./...)
root=$PWD
targets=()
re='^func (Fuzz[A-Za-z0-9_]*)\([A-Za-z_][A-Za-z0-9_]* \*testing\.F\)'
for dir in $dirs; do
	for f in "$dir"/*_test.go; do
		[ -f "$f" ] || continue
		while IFS= read -r line; do
			if [[ $line =~ $re ]]; then
				name=${BASH_REMATCH[1]}
				[ -z "$FUZZ" ] || [[ $name =~ $FUZZ ]] || continue
				targets+=("./${dir#"$root"/} $name")
			fi
		done <"$f"
	done
done
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no fuzz targets${FUZZ:+ matching $FUZZ}" >&2
	exit 1
fi

# Each run gets its own TMPDIR, removed after it: the fuzzing engine stops
# a worker that does not exit within a second of being told to with SIGINT,
# then SIGKILL, so a worker's cleanups (temporary directories, a test
# PostgreSQL's files) may never run. Mode 1777 as /tmp: test servers such
# as PostgreSQL run as other users.
run_tmp=
remove_run_tmp() {
	[ -z "$run_tmp" ] || rm -rf "$run_tmp" || rm -rf "$run_tmp" || echo "fuzz: cannot remove $run_tmp" >&2
	run_tmp=
}
trap remove_run_tmp EXIT

echo "==> fuzzing ${#targets[@]} targets, $FUZZTIME each"
start=$SECONDS
for t in "${targets[@]}"; do
	pkg=${t% *} name=${t#* }
	remove_run_tmp
	run_tmp=$(mktemp -d "${TMPDIR:-/tmp}/fuzz-$name.XXXXXX")
	chmod 1777 "$run_tmp"
	corpus=$pkg/testdata/fuzz/$name
	seeds=0
	[ ! -d "$corpus" ] || seeds=$(find "$corpus" -maxdepth 1 -type f -printf . | wc -c)
	echo "==> $name in $pkg ($seeds committed inputs)"
	before=$(ls "$corpus" 2>/dev/null || true)
	log=$run_tmp/go-test.log
	fuzz_one() {
		TMPDIR=$run_tmp go test -run='^$' -fuzz="^$name\$" -fuzztime="$FUZZTIME" -fuzzminimizetime="${FUZZMINIMIZETIME:-1s}" -timeout="$FUZZ_TIMEOUT" "$pkg" 2>&1 | tee "$log"
		return "${PIPESTATUS[0]}"
	}
	# Go's fuzzing coordinator before Go 1.27 can report the end of
	# -fuzztime itself as a failure ("context deadline exceeded", no
	# failing input written: golang.org/issue/75804). Such a run is run
	# again once; a failure that writes an input, or the same twice, fails.
	ok=1
	if ! fuzz_one; then
		after=$(ls "$corpus" 2>/dev/null || true)
		if [ -z "$(comm -13 <(printf '%s\n' "$before") <(printf '%s\n' "$after"))" ] && grep -q '^    context deadline exceeded$' "$log"; then
			echo "fuzz: $name stopped with Go's fuzztime race (golang.org/issue/75804), no input written: running it again" >&2
			fuzz_one || ok=0
		else
			ok=0
		fi
	fi
	if [ "$ok" = 0 ]; then
		after=$(ls "$corpus" 2>/dev/null || true)
		new=$(comm -13 <(printf '%s\n' "$before") <(printf '%s\n' "$after"))
		{
			echo
			echo "fuzz: $name in $pkg failed."
			if [ -n "$new" ]; then
				for f in $new; do
					echo "  failing input: $corpus/$f"
					echo "  reproduce:     go test -run='^$name\$/^$f\$' -v $pkg"
				done
				echo "  Fix the bug and commit the input: it then runs in every go test."
			fi
			echo "  fuzz again:    go test -run='^\$' -fuzz='^$name\$' -fuzztime=$FUZZTIME $pkg"
		} >&2
		exit 1
	fi
done
echo "==> fuzzing done: ${#targets[@]} targets in $((SECONDS - start))s"
