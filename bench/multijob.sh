#!/usr/bin/env bash
# bench/multijob.sh — the multi-job tables of docs/sim.md: fleetd sim
# -workload on Pollux's workloads 1–4 (configs/pollux), 16x4 GPUs, every
# policy, each next to Pollux's published average JCT; then the cloud
# setting (-setting cloud: 1-GPU nodes on spot through the bundled V100
# trace, with per-fleet). Prints figures; no targets. A few seconds per
# workload. SETTINGS=pool or SETTINGS=cloud runs one of them.
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
for setting in ${SETTINGS:-pool cloud}; do
  for n in 1 2 3 4; do
    echo "== fleetd sim -workload configs/pollux/workloads/workload-$n.csv -pool 16x4 -setting $setting ${policies[*]}"
    "$FLEETD_BIN" sim -workload "configs/pollux/workloads/workload-$n.csv" -pool 16x4 -setting "$setting" "${policies[@]}" || rc=1
    echo
  done
done
exit $rc
