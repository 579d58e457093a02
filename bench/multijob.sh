#!/usr/bin/env bash
# bench/multijob.sh — the multi-job tables of docs/sim.md: fleetd sim
# -workload on Pollux's workloads 1–4 (configs/pollux), 16x4 GPUs, every
# policy, each next to Pollux's published average JCT. Prints figures; no
# targets. A few seconds per workload.
#
#   bench/multijob.sh
#   POLICIES=fifo,fleetd bench/multijob.sh
#   FLEETD_BIN=/tmp/fleetd bench/multijob.sh
set -uo pipefail
cd "$(dirname "$0")/.."

FLEETD_BIN=${FLEETD_BIN:-bin/fleetd}
if [[ ! -x "$FLEETD_BIN" ]]; then
  echo "$FLEETD_BIN not found: run make build" >&2
  exit 1
fi
policies=()
[[ -n "${POLICIES:-}" ]] && policies=(-policies "$POLICIES")
rc=0
for n in 1 2 3 4; do
  echo "== fleetd sim -workload configs/pollux/workloads/workload-$n.csv -pool 16x4 ${policies[*]}"
  "$FLEETD_BIN" sim -workload "configs/pollux/workloads/workload-$n.csv" -pool 16x4 "${policies[@]}" || rc=1
  echo
done
exit $rc
