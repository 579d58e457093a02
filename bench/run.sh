#!/usr/bin/env bash
# bench/run.sh — every fleetd benchmark, then one summary of their figures.
#
#   make bench              # builds bin/fleetd first, then runs this
#   BENCH_OUT=dir bench/run.sh   # keep logs and JSON figures in dir
#   BENCH_ONLY=scale|recovery|ha|ckpt|elastic|agent bench/run.sh
#   BENCH_ELASTIC_SIZES=100 bench/run.sh   # elastic: model sizes in MiB (default 100,1024)
#   BENCH_STRICT=0 bench/run.sh  # report misses but exit 0 (default 1: exit 1 on any miss)
#   BENCH_FORCE_MISS=REGEXP bench/run.sh  # give the figures whose names match an
#                           # impossible target: proves a miss fails the run
#
# Each program prints `FIGURE <name> = <value> <unit> (target ...) PASS|FAIL`
# lines and a summary; this script repeats every summary line at the end,
# with the machine it ran on (bench/summary.sh). A miss is a figure that
# failed its target, a figure that could not be measured (a scenario that
# never recovered), or a program that failed or printed no summary; any miss
# makes the script exit 1.
set -uo pipefail
cd "$(dirname "$0")/.."

FLEETD_BIN=${FLEETD_BIN:-bin/fleetd}
PYTHON=${PYTHON:-/usr/bin/python3}
ONLY=${BENCH_ONLY:-all}
OUT=${BENCH_OUT:-}
tmp=$(mktemp -d -t fleetd-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if [[ -z "$OUT" ]]; then OUT="$tmp/out"; fi
mkdir -p "$OUT"

start=$(date +%s)
echo "== machine"
{
  echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpus:    $(nproc) × $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "memory:  $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "kernel:  $(uname -sr)"
  echo "go:      $(go env GOVERSION)"
  echo "python:  $("$PYTHON" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>/dev/null || echo "$PYTHON without torch")"
  echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) at start"
} | tee "$OUT/machine.txt"

echo "== build"
go build -o "$tmp/scale" ./bench/scale || exit 1
go build -o "$tmp/recovery" ./bench/recovery || exit 1
go build -o "$tmp/ha" ./bench/ha || exit 1
go build -o "$tmp/ckpt" ./bench/ckpt || exit 1
go build -o "$tmp/elastic" ./bench/elastic || exit 1
go build -o "$tmp/agentboot" ./bench/agentboot || exit 1
if [[ ! -x "$FLEETD_BIN" ]]; then
  echo "$FLEETD_BIN not found: run make build (make bench does)" >&2
  exit 1
fi

if [[ "$ONLY" == all || "$ONLY" == scale ]]; then
  echo "== scale: $tmp/scale -json $OUT/scale.json all"
  "$tmp/scale" -json "$OUT/scale.json" all 2>&1 | tee "$OUT/scale.log"
  echo "${PIPESTATUS[0]}" >"$OUT/scale.status"
fi
if [[ "$ONLY" == all || "$ONLY" == recovery ]]; then
  echo "== recovery: $tmp/recovery -fleetd $FLEETD_BIN -python $PYTHON -json $OUT/recovery.json"
  "$tmp/recovery" -fleetd "$FLEETD_BIN" -python "$PYTHON" -json "$OUT/recovery.json" 2>&1 | tee "$OUT/recovery.log"
  echo "${PIPESTATUS[0]}" >"$OUT/recovery.status"
fi

if [[ "$ONLY" == all || "$ONLY" == ha ]]; then
  echo "== ha: $tmp/ha -fleetd $FLEETD_BIN -json $OUT/ha.json"
  # embedded etcd logs JSON lines at error level on shutdown; keep them out of the summary
  "$tmp/ha" -fleetd "$FLEETD_BIN" -json "$OUT/ha.json" 2>&1 | grep -v '^{"level"' | tee "$OUT/ha.log"
  echo "${PIPESTATUS[0]}" >"$OUT/ha.status"
fi

if [[ "$ONLY" == all || "$ONLY" == ckpt ]]; then
  echo "== ckpt: $tmp/ckpt -json $OUT/ckpt.json (2 GiB upload and restore: file driver, S3 on moto)"
  "$tmp/ckpt" -json "$OUT/ckpt.json" 2>&1 | tee "$OUT/ckpt.log"
  echo "${PIPESTATUS[0]}" >"$OUT/ckpt.status"
fi

if [[ "$ONLY" == all || "$ONLY" == elastic ]]; then
  sizes=${BENCH_ELASTIC_SIZES:-100,1024}
  echo "== elastic: $tmp/elastic -fleetd $FLEETD_BIN -python $PYTHON -sizes $sizes -json $OUT/elastic.json"
  echo "memory: $(awk '/MemAvailable/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo) available (the 1 GiB model needs about 8 GiB: up to four workers, checkpoint loads)"
  "$tmp/elastic" -fleetd "$FLEETD_BIN" -python "$PYTHON" -sizes "$sizes" -json "$OUT/elastic.json" 2>&1 | tee "$OUT/elastic.log"
  echo "${PIPESTATUS[0]}" >"$OUT/elastic.status"
fi

if [[ "$ONLY" == all || "$ONLY" == agent ]]; then
  # The slim agents as `make release` builds them (stripped, trimmed, static).
  mkdir -p "$tmp/agents"
  for arch in amd64 arm64; do
    CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -ldflags "-s -w" -o "$tmp/agents/fleetd-agent-linux-$arch" ./cmd/fleetd-agent || exit 1
  done
  echo "== agent: $tmp/agentboot -mode all -agent-dir $tmp/agents (sizes; boot on loopback and at 100 Mbit/s; 200 concurrent downloads)"
  "$tmp/agentboot" -mode all -agent-dir "$tmp/agents" 2>&1 | tee "$OUT/agent.log"
  echo "${PIPESTATUS[0]}" >"$OUT/agent.status"
fi

echo
echo "================ fleetd benchmarks: summary ================"
cat "$OUT/machine.txt"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) at end"
echo "elapsed: $(( $(date +%s) - start )) s"
if [[ -n "${BENCH_OUT:-}" ]]; then echo "logs and figures: $OUT"; fi
bench/summary.sh "$OUT"
