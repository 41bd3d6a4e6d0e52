#!/usr/bin/env bash
# The worked example of docs/cluster.md: a Dask scheduler and two workers started from the shell,
# a synthetic trace of 100,000 positions, and the CLI pointed at the scheduler. Prints what the
# page shows; everything runs on this machine (loopback), in a temporary directory.
# Usage: bash experiments/cluster_example.sh   (with .venv holding the distributed extra)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

$BIN/python -c "
from cactus_theory import load_trace, synthesize_trace
t = synthesize_trace(load_trace(), '$WORK/big', 100_000, seed=0)
print(f'synthetic trace: {t.n_positions:,} positions, {t.n_shards} shards')"

$BIN/dask scheduler --host 127.0.0.1 --port 8786 --no-dashboard >"$WORK/scheduler.log" 2>&1 &
sleep 3
MALLOC_MMAP_THRESHOLD_=67108864 $BIN/dask worker tcp://127.0.0.1:8786 --nworkers 2 --nthreads 1 \
    --no-dashboard >"$WORK/workers.log" 2>&1 &
sleep 8

start=$(date +%s.%N)
$BIN/cactus-theory analyze "$WORK/big" --scheduler tcp://127.0.0.1:8786 --rules sps,cactus,cactus-exact,mentored \
    --delta 0.5,1 --m 8 --quiet --no-figures --out "$WORK/result"
end=$(date +%s.%N)
echo "analysis on the cluster: $(echo "$end - $start" | bc) s (wall, including connecting)"
