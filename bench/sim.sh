#!/usr/bin/env bash
# bench/sim.sh — the cost-policy tables of docs/benchmarks.md: fleetd sim on
# the bundled V100 trace, 300 windows per seed, fleetd against Uniform
# Progress, greedy, the optimum and the foresight bound (fleetd told each
# zone's remaining up-run: docs/sim.md). Several minutes on two cores; not part
# of make test.
#
#   bench/sim.sh                 # seeds 1–5, the three settings below
#   SEEDS="1 2" bench/sim.sh     # fewer seeds
#   SIM_FLAGS=-warm bench/sim.sh # start each window from the trace's history
#   POLICIES=optimum,fleetd bench/sim.sh  # other policies (bench/lookahead.sh)
#   FLEETD_BIN=/tmp/fleetd bench/sim.sh
set -uo pipefail
cd "$(dirname "$0")/.."

FLEETD_BIN=${FLEETD_BIN:-bin/fleetd}
SEEDS=${SEEDS:-1 2 3 4 5}
SPEC=configs/examples/sim-v100.hcl
THREE=us-east-1c,us-east-2b,us-west-2a
POLICIES=${POLICIES:-optimum,fleetd,up,greedy,fleetd-foresight}
if [[ ! -x "$FLEETD_BIN" ]]; then
  echo "$FLEETD_BIN not found: run make build" >&2
  exit 1
fi

# setting name, deadline, zones flag
settings=("9 zones, 60 h|60h|" "9 zones, 52 h|52h|" "3 zones, 52 h|52h|-zones $THREE")
for setting in "${settings[@]}"; do
  IFS='|' read -r name deadline zones <<<"$setting"
  echo "== $name: fleetd sim -spec $SPEC -windows 300 -seed S -deadline $deadline $zones -policies $POLICIES ${SIM_FLAGS:-}"
  first=1
  for s in $SEEDS; do
    # shellcheck disable=SC2086 # zones and SIM_FLAGS are flag lists
    "$FLEETD_BIN" sim -spec "$SPEC" -windows 300 -seed "$s" -deadline "$deadline" $zones \
      -policies "$POLICIES" ${SIM_FLAGS:-} |
      awk -v s="$s" -v first="$first" 'NR == 4 && first {print "seed  " $0} NR > 4 && NF > 0 {print "   " s "  " $0}'
    first=0
  done
done
