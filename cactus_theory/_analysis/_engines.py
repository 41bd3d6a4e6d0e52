"""Where the analysis runs: in this process, in local worker processes, or on a Dask cluster.

Each engine maps a function over jobs and hands each result, in job order, to a callback; what
the results are is the caller's business (``_analysis`` sends trace shards and gets per-sequence
sums back).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket

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


#: Environment of Dask workers for the analysis: malloc keeps freed arrays (a nanny's
#: MALLOC_TRIM_THRESHOLD_ alone made the analysis 1.6x slower), one compiled-kernel thread per core.
DASK_WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20)}


def local_dask_cluster(workers):
    """(client, cluster): a Dask cluster of ``workers`` worker processes on this machine, one task
    thread each, started with ``DASK_WORKER_ENV`` (the nanny's pre-spawn environment)."""
    import dask
    from distributed import Client, LocalCluster

    environ = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **DASK_WORKER_ENV}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        # silence_logs: the workers' warnings, such as a task cancelled by Ctrl-C, are not news to
        # the user (errors still show)
        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        )
    return Client(cluster), cluster


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
    """``fn`` over ``jobs`` as Dask tasks on ``client``'s cluster; results in job order whatever order the
    tasks finish in. A worker that dies takes its running and held tasks with it; the scheduler
    runs them again elsewhere (per-shard results depend only on the shard, so nothing is lost or
    counted twice)."""
    from distributed import as_completed

    futures = client.map(fn, jobs, threads=_dask_threads(client), pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    results = [None] * len(jobs)
    try:
        for future in as_completed(futures):
            part = future.result()
            results[index[future.key]] = part
            on_result(part)
    finally:
        client.cancel(futures)
    return results


_ADDRESS = re.compile(r"^(?:(tcp|tls)://)?(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def connect_scheduler(address: str, timeout: float = 10.0):
    """A ``distributed.Client`` on the Dask scheduler at ``address`` (tcp://HOST:PORT, tls://...
    or HOST:PORT), after checking within ``timeout`` seconds that a Dask scheduler answers there.

    Raises a ValueError for an address of another form, and a ConnectionError naming the address
    when nothing listens (refused: at once), when the host cannot be reached, or when what
    listens is not a Dask scheduler (Dask's own client would wait forever for its handshake).
    """
    m = _ADDRESS.match(str(address).strip())
    if not m or not 0 < int(m.group(3)) < 65536:
        raise ValueError(
            f"--scheduler must be the address of a Dask scheduler, tcp://HOST:PORT (or tls://HOST:PORT); got "
            f"{address!r}"
        )
    scheme, host, port = m.group(1) or "tcp", m.group(2).strip("[]"), int(m.group(3))
    url = f"{scheme}://{m.group(2)}:{port}"
    hint = "start one with 'dask scheduler' (it prints its address), or check the address and the port"
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except (ConnectionRefusedError, socket.gaierror, TimeoutError, OSError) as exc:
        reason = "connection refused" if isinstance(exc, ConnectionRefusedError) else (exc.strerror or str(exc))
        raise ConnectionError(f"no Dask scheduler at {url} ({reason}): {hint}") from None
    try:
        reply = asyncio.run(_identity(url, timeout))
    except (TimeoutError, asyncio.TimeoutError, OSError, EOFError, ValueError, TypeError) as exc:
        reply = exc
    if not (isinstance(reply, dict) and reply.get("type") == "Scheduler"):
        raise ConnectionError(
            f"something listens at {url} but it is not a Dask scheduler (no scheduler handshake within "
            f"{timeout:g} s): {hint}"
        )
    from distributed import Client

    return Client(url, timeout=f"{timeout}s")


async def _identity(url, timeout):
    """The scheduler's reply to an ``identity`` request, or an exception after ``timeout`` s."""
    from distributed.comm import connect

    async def ask():
        comm = await connect(url, timeout=timeout)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    return await asyncio.wait_for(ask(), timeout)


def close_quietly(*things) -> None:
    """Close Dask clients and clusters without the log lines Dask prints when its tasks are cut
    short (after Ctrl-C, a worker's task was cancelled mid-run: not news to the user)."""
    loggers = [logging.getLogger(name) for name in ("distributed", "tornado", "asyncio")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        for thing in things:
            if thing is not None:
                try:
                    thing.close()
                except Exception:  # closing after a failure must not hide it
                    pass
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
