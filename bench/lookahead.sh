#!/usr/bin/env bash
# bench/lookahead.sh — how much foresight the optimum's lead rests on
# (docs/sim.md, "Lookahead"): bench/sim.sh's three settings on the bundled
# V100 trace, 300 windows, with the lookahead planner that knows every zone's
# capacity and price exactly for the next 15 min … 16 h and values the rest as
# a policy would now. About 5 min per setting and seed on two cores; not part
# of make test.
#
#   bench/lookahead.sh                  # seed 1
#   SEEDS="1 2" bench/lookahead.sh
#   FLEETD_BIN=/tmp/fleetd bench/lookahead.sh
set -uo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-1} \
  POLICIES=optimum,fleetd,fleetd-foresight,lookahead-15m,lookahead-30m,lookahead-1h,lookahead-2h,lookahead-4h,lookahead-8h,lookahead-16h \
  exec bench/sim.sh
