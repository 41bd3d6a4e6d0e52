"""Where the analysis runs: in this process, in local worker processes, or on a Dask cluster.

Each engine maps a function over jobs and hands each result, in job order, to a callback; what
the results are is the caller's business (``_analysis`` sends trace shards and gets per-sequence
sums back).
"""

from __future__ import annotations

import os

from .._util._cluster import DASK_WORKER_ENV, close_quietly, connect_scheduler, local_dask_cluster, map_tasks

__all__ = [
    "DASK_WORKER_ENV",
    "close_quietly",
    "connect_scheduler",
    "local_dask_cluster",
    "prepare_worker",
    "run_dask",
    "run_local",
]


def prepare_worker(threads):
    """Set up a worker process this package starts (a pool worker, or a worker of a local Dask
    cluster): ``threads`` threads for the compiled kernels and torch, so that workers x threads
    stays within the cores, and malloc settings that keep freed arrays for reuse
    (``_jit.keep_freed_memory``). Not applied to the workers of a cluster you pass as
    ``client=``: start those with ``DASK_WORKER_ENV`` in their environment (docs: "Analysing
    traces on a cluster"); ``local_dask_cluster`` does."""
    from .._math import _jit

    _jit.set_threads(threads)
    _jit.keep_freed_memory()


def run_local(fn, jobs, processes, on_result):
    """``fn`` over ``jobs`` in this process or in ``processes`` spawned workers; results in job order."""
    pool = None
    if processes > 1 and len(jobs) > 1:
        from multiprocessing import get_context

        threads = max(1, (os.cpu_count() or 1) // processes)
        pool = get_context("spawn").Pool(processes, initializer=prepare_worker, initargs=(threads,))
    try:
        results = []
        for part in pool.imap(fn, jobs) if pool else map(fn, jobs):
            results.append(part)
            on_result(part)
        return results
    finally:
        if pool:
            pool.close()
            pool.join()


def _dask_threads(client):
    """{worker address: threads for the compiled kernels}: each host's cores shared by the task
    threads of all its workers (without it, every worker's kernels start one thread per core)."""
    try:
        workers = client.scheduler_info(n_workers=-1)["workers"]  # every worker (newer Dask lists 5 by default)
    except TypeError:  # older Dask: always every worker
        workers = client.scheduler_info()["workers"]
    cores = client.run(os.cpu_count)
    per_host = {}
    for info in workers.values():
        per_host[info["host"]] = per_host.get(info["host"], 0) + info["nthreads"]
    return {
        address: max(1, (cores.get(address) or 1) // max(per_host[info["host"]], 1))
        for address, info in workers.items()
    }


def run_dask(fn, jobs, client, on_result):
    """``fn`` over ``jobs`` as Dask tasks on ``client``'s cluster (``map_tasks``, the one mapper, each worker's
    kernels given their share of its host's cores); results in job order whatever order the tasks finish in. A
    worker that dies takes its running and held tasks with it; the scheduler runs them again elsewhere
    (per-shard results depend only on the shard, so nothing is lost or counted twice)."""
    return map_tasks(
        client, fn, [(job,) for job in jobs], lambda _, part: on_result(part), threads=_dask_threads(client)
    )
