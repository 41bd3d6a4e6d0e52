"""Benchmark of the analysis's scaling: positions per second with 1 and 2 local processes and with Dask
workers on a synthetic trace, and the memory it takes (``bench.py --scaling-only`` prints the same rows).

Usage:
    python experiments/bench_scaling.py [--positions 100000]

The synthetic trace is a block bootstrap of the embedded trace's positions (``synthesize_trace``, blocks
of 32, seed 0); the Dask cluster (worker processes, one thread each) is started before the clock starts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc

from cactus_theory import analyze_trace, load_trace
from cactus_theory.traces import TraceSequence, parse_rules, synthesize_trace


def once(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _rss_mib():
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def bench_scaling(positions=100_000):
    """Throughput on a synthetic trace (``synthesize_trace``: a block bootstrap of the embedded
    trace's positions, blocks of 32, seed 0) with local processes and with Dask workers; the Dask
    cluster (worker processes, one thread each) is started before the clock starts, its workers
    cold (they import the package and load the kernels on their first task, as pool workers do)."""
    from cactus_theory.engines import ShardJob, local_dask_cluster, shard_statistics

    rules = parse_rules("sps,tas,cactus,cactus-exact,mentored", (0.5, 1.0))
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        big = synthesize_trace(load_trace(), os.path.join(tmp, "synthetic"), positions, shard_positions=4096)
        t_make = time.perf_counter() - start

        def analysis(**kw):
            return analyze_trace(big, rules, ms=(4, 8, 20), n_boot=1000, progress=False, **kw)

        times = {f"{n} process{'es' if n > 1 else ''}": once(lambda n=n: analysis(processes=n)) for n in (1, 2)}
        # the whole analysis in a fresh process: its peak resident memory (the shards read one at a time, the kept
        # distributions capped at TraceSequence.KEPT_DISTRIBUTIONS_BYTES, the per-sequence sums growing with the trace)
        code = (
            "import sys, resource; from cactus_theory.traces import analyze_trace, parse_rules; "
            "analyze_trace(sys.argv[1], parse_rules('sps,tas,cactus,cactus-exact,mentored', (0.5, 1.0)), "
            "ms=(4, 8, 20), n_boot=1000, progress=False); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
        )
        peak_rss = (
            int(
                subprocess.run(
                    [sys.executable, "-c", code, big.directory], check=True, capture_output=True, text=True
                ).stdout.split()[-1]
            )
            / 1024
        )
        for n in (1, 2):
            client, cluster = local_dask_cluster(n)
            times[f"Dask, {n} worker{'s' if n > 1 else ''}"] = once(lambda client=client: analysis(client=client))
            rss = max(client.run(_rss_mib).values())
            client.close()
            cluster.close()
        shard = big.shard_positions(0)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        # fixed blocks, no policy; what stays allocated while the records are held is what the analysis keeps
        # per sequence (for the sequence bootstrap and AnalysisResult.sequences), whatever the trace's size
        records = shard_statistics(ShardJob(big.directory, 0, tuple(rules), (4, 8, 20), big.sampling))
        TraceSequence.forget_distributions()
        kept, peak = tracemalloc.get_traced_memory()
        kept -= before
        tracemalloc.stop()
        per_sequence = kept / len(records)
        per_position = kept / sum(r.positions for r in records)
        del records
    n = big.n_positions
    rows = [
        (
            f"analyze_trace, synthetic trace ({n:,} positions, {big.n_shards} shards of <= 4,096; made in "
            f"{t_make:.0f} s), 5 rule families x 2 deltas, m = 4, 8, 20",
            ", ".join(f"{k}: {n / v:,.0f} positions/s" for k, v in times.items()),
            f"Dask overhead against processes: {times['Dask, 1 worker'] / times['1 process'] - 1:+.0%} (1 worker), "
            f"{times['Dask, 2 workers'] / times['2 processes'] - 1:+.0%} (2 workers)",
            f"2 vs 1: processes {times['1 process'] / times['2 processes']:.2f}x, Dask "
            f"{times['Dask, 1 worker'] / times['Dask, 2 workers']:.2f}x",
        ),
        (
            f"memory of one shard's analysis ({shard:,} positions, K = {big.top_k}, the rules above)",
            f"peak {peak / 2**20:,.0f} MiB of NumPy allocations",
            f"{peak / shard / 1024:,.1f} KiB per position",
            f"tracemalloc; a Dask worker's resident memory after the run: {rss:,.0f} MiB (interpreter, "
            "libraries, kernels)",
        ),
        (
            f"peak resident memory of the whole analysis of {n:,} positions in one process",
            f"{peak_rss:,.0f} MiB",
            f"{peak_rss * 1024 / n:,.2f} KiB per position of the trace",
            "ru_maxrss of a fresh process running analyze_trace on the trace above (1 process)",
        ),
        (
            "what grows with the trace: the per-sequence sums the analysis keeps (sequence bootstrap, "
            "AnalysisResult.sequences)",
            f"{per_sequence / 1024:,.1f} KiB per sequence",
            f"{per_position / 1024:,.2f} KiB per position",
            f"tracemalloc, the records of shard 0 held; besides them the kept distributions (at most "
            f"{TraceSequence.KEPT_DISTRIBUTIONS_BYTES / 2**20:,.0f} MiB) and one shard's arrays are bounded",
        ),
    ]
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--positions", type=int, default=100_000, help="positions of the synthetic trace")
    args = parser.parse_args(argv)
    print("| what | ratio | ratio | note |")
    print("|---|---|---|---|")
    for r in bench_scaling(args.positions):
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
