#!/usr/bin/env bash
# Runs every Go fuzz target of the module, one after the other, each for
# FUZZTIME, and prints the executions per target and a summary.
#
#   scripts/fuzz.sh [FUZZTIME]          FUZZTIME as for go test -fuzztime (default 20s)
#
# Targets are discovered (every `func FuzzXxx(f *testing.F)` in a _test.go
# file), so new ones are included without editing this script. The total
# time is bounded: targets × (FUZZTIME + build), and each run is killed if
# it overstays by more than FUZZ_GRACE seconds (default 300).
#
# Environment:
#   FUZZ_MATCH     only targets whose "dir/FuzzName" matches this extended regexp
#   FUZZ_PARALLEL  fuzz workers per target (default: GOMAXPROCS)
#   FUZZ_MINIMIZETIME  -fuzzminimizetime (default 10x: ten tries). Go minimizes
#                  every new interesting input, not only failures, and those
#                  executions are not counted; with go's 60s default a target
#                  with a rich input language (specs) spends a short FUZZTIME
#                  minimizing (measured: 5x fewer executions, 9x fewer new
#                  inputs). Re-minimize a saved failure with plain go test -fuzz.
#   FUZZ_REPORT    also write the results as a Markdown table to this file
#
# A failing input is saved under the package's testdata/fuzz/FuzzName/ by
# go test; commit it and it becomes a regression seed of `make test`.
set -euo pipefail

fuzztime=${1:-20s}
grace=${FUZZ_GRACE:-300}
cd "$(dirname "$0")/.."

case "$fuzztime" in
*h) secs=$((${fuzztime%h} * 3600)) ;;
*m) secs=$((${fuzztime%m} * 60)) ;;
*s) secs=${fuzztime%s} ;;
*x) secs=600 ;; # a count of executions: bounded by the grace only
*) echo "fuzz.sh: FUZZTIME must look like 20s, 5m, 1h or 1000x, got $fuzztime" >&2; exit 2 ;;
esac
if ! [[ $secs =~ ^[0-9]+$ ]]; then
	echo "fuzz.sh: FUZZTIME must be whole seconds, minutes or hours, got $fuzztime" >&2
	exit 2
fi

targets=()
while IFS= read -r file; do
	dir=$(dirname "$file")
	while IFS= read -r name; do
		t="${dir#./}/$name"
		if [[ -z ${FUZZ_MATCH:-} || $t =~ $FUZZ_MATCH ]]; then
			targets+=("$t")
		fi
	done < <(sed -nE 's/^func (Fuzz[A-Za-z0-9_]*)\([A-Za-z_][A-Za-z0-9_]* \*testing\.F\).*/\1/p' "$file")
done < <(grep -rlE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\([A-Za-z_][A-Za-z0-9_]* \*testing\.F\)' . | grep -v -e '/vendor/' -e '/testdata/' | sort)

if [[ ${#targets[@]} -eq 0 ]]; then
	echo "fuzz.sh: no fuzz targets found" >&2
	exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets × $fuzztime (at most ~$(((secs + 30) * ${#targets[@]} / 60 + 1)) min)"

extra=(-fuzzminimizetime "${FUZZ_MINIMIZETIME:-10x}")
[[ -n ${FUZZ_PARALLEL:-} ]] && extra+=(-parallel "$FUZZ_PARALLEL")
logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT

rows=()
failed=0
total_execs=0
fmt='%-26s %-24s %12s %9s %8s  %s\n'
printf "$fmt" PACKAGE TARGET EXECS "EXECS/S" CORPUS RESULT
for t in "${targets[@]}"; do
	dir=${t%/*} name=${t##*/}
	log="$logdir/${dir//\//_}_$name.log"
	result=ok
	if ! timeout --kill-after=10s $((secs + grace)) \
		go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "${extra[@]}" "./$dir" >"$log" 2>&1; then
		result=FAIL
		failed=$((failed + 1))
	fi
	# The last progress line: "fuzz: elapsed: 20s, execs: 12345 (617/sec), new interesting: 3 (total: 40)"
	last=$(grep -E '^fuzz: elapsed: [0-9]+s, execs: [0-9]+' "$log" | tail -n 1 || true)
	execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
	elapsed=$(sed -nE 's/^fuzz: elapsed: ([0-9]+)s.*/\1/p' <<<"$last")
	corpus=$(sed -nE 's/.*\(total: ([0-9]+)\).*/\1/p' <<<"$last")
	execs=${execs:-0} corpus=${corpus:--}
	rate=-
	[[ -n $elapsed && $elapsed -gt 0 ]] && rate=$((execs / elapsed))
	total_execs=$((total_execs + execs))
	printf "$fmt" "$dir" "$name" "$execs" "$rate" "$corpus" "$result"
	rows+=("| \`$dir\` | \`$name\` | $execs | $rate | $corpus | $result |")
	if [[ $result == FAIL ]]; then
		grep -vE '^fuzz: elapsed' "$log" | tail -n 40 | sed 's/^/    /'
	fi
done

echo "fuzz.sh: ${#targets[@]} targets, $total_execs executions, $failed failed (FUZZTIME $fuzztime)"
if [[ -n ${FUZZ_REPORT:-} ]]; then
	{
		echo "| Package | Target | Executions | Execs/s | Corpus | Result |"
		echo "|---|---|---:|---:|---:|---|"
		printf '%s\n' "${rows[@]}"
		echo
		echo "${#targets[@]} targets, $total_execs executions in total, $failed failed; FUZZTIME $fuzztime, -fuzzminimizetime ${FUZZ_MINIMIZETIME:-10x}, $(nproc) CPUs, $(go env GOVERSION)."
	} >"$FUZZ_REPORT"
fi
[[ $failed -eq 0 ]]
