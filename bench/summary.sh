#!/usr/bin/env bash
# bench/summary.sh OUT — the verdict of a bench/run.sh run: every figure of
# the benchmark programs that ran (their logs OUT/<name>.log, exit statuses
# OUT/<name>.status), then one line of passes and misses. Exits 1 on any
# miss unless BENCH_STRICT=0:
#   - a FIGURE line that says FAIL (missed its target, or MISSING: never measured),
#   - a program that exited non-zero or printed no summary (it crashed).
set -uo pipefail
OUT=${1:?usage: bench/summary.sh OUT}

misses=0
passes=0
ran=0
for name in scale recovery ha ckpt elastic agent; do
  log="$OUT/$name.log"
  [[ -f "$log" ]] || continue # not run (BENCH_ONLY)
  ran=$((ran + 1))
  # Each program repeats its figures after a "==== <name>: summary ====" line.
  figs=$(awk '/^==== .*: summary ====$/ {on = 1; next} on && /^FIGURE / {print}' "$log")
  status=$(cat "$OUT/$name.status" 2>/dev/null || echo "unknown")
  if [[ -n "$figs" ]]; then echo "$figs"; fi
  n=$(grep -c ' FAIL' <<<"$figs" || true)
  misses=$((misses + n))
  passes=$((passes + $(grep -c ' PASS$' <<<"$figs" || true)))
  if [[ -z "$figs" ]]; then
    echo "MISS $name: no summary (exit status $status): see $log"
    misses=$((misses + 1))
  elif [[ "$status" != 0 && "$n" == 0 ]]; then
    # a program that fails without a FAIL figure failed outside them
    echo "MISS $name: exit status $status with no failed figure: see $log"
    misses=$((misses + 1))
  fi
done
if [[ "$ran" == 0 ]]; then
  echo "MISS: no benchmark ran (BENCH_ONLY=${BENCH_ONLY:-}?)"
  misses=$((misses + 1))
fi
echo "targets: $passes passed, $misses missed"
if [[ "$misses" -gt 0 && "${BENCH_STRICT:-1}" != 0 ]]; then
  echo "bench: FAIL ($misses missed; BENCH_STRICT=0 reports without failing)"
  exit 1
fi
exit 0
