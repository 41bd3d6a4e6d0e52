#!/usr/bin/env bash
# The worked example of docs/howto/cluster.md: a Dask scheduler and two workers started from the shell,
# a synthetic trace of 100,000 positions, and the CLI pointed at the scheduler. Prints what the
# page shows; everything runs on this machine (loopback), in a temporary directory.
# Usage: bash experiments/cluster_example.sh   (with .venv holding the distributed extra)
# Knobs (for the smoke test): BIN (default .venv/bin), POSITIONS (100000), PORT (8786).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
POSITIONS=${POSITIONS:-100000}
PORT=${PORT:-8786}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

$BIN/python -c "
from cactus_theory.traces import load_trace, synthesize_trace
t = synthesize_trace(load_trace(), '$WORK/big', $POSITIONS, seed=0, progress=False)
print(f'synthetic trace: {t.n_positions:,} positions, {t.n_shards} shards')"

$BIN/dask scheduler --host 127.0.0.1 --port $PORT --no-dashboard >"$WORK/scheduler.log" 2>&1 &
sleep 3
MALLOC_MMAP_THRESHOLD_=67108864 $BIN/dask worker tcp://127.0.0.1:$PORT --nworkers 2 --nthreads 1 \
    --no-dashboard >"$WORK/workers.log" 2>&1 &
sleep 8

start=$($BIN/python -c "import time; print(time.time())")
$BIN/cactus-theory analyze "$WORK/big" --scheduler tcp://127.0.0.1:$PORT --rules sps,cactus,cactus-exact,mentored \
    --delta 0.5,1 --m 8 --quiet --no-figures --out "$WORK/result"
$BIN/python -c "import time; print(f'analysis on the cluster: {time.time() - $start:.1f} s (wall, including connecting)')"
