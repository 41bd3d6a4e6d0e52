"""The Dask cluster the long runs spread over: one on this machine (``local_dask_cluster``: worker processes on
the loopback), or one the user started (``connect_scheduler``, checked before Dask's own client would wait
forever), closing either without Dask's noise (``close_quietly``), and the one mapper of tasks over it
(``map_tasks``: the study runner's units and the analysis's trace shards alike). Used by the analysis (``_analysis
._engines``), the study runner and ``check_study``."""

from __future__ import annotations

import asyncio
import logging
import re
import socket

__all__ = ["DASK_WORKER_ENV", "close_quietly", "connect_scheduler", "local_dask_cluster", "map_tasks"]


#: Environment of Dask workers for the analysis: malloc keeps freed arrays (a nanny's
#: MALLOC_TRIM_THRESHOLD_ alone made the analysis 1.6x slower), one compiled-kernel thread per core.
DASK_WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20)}


def local_dask_cluster(workers):
    """(client, cluster): a Dask cluster of ``workers`` worker processes on this machine, one task
    thread each, started with ``DASK_WORKER_ENV`` (the nanny's pre-spawn environment), listening on 127.0.0.1
    only."""
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
            host="127.0.0.1",  # the scheduler, the workers and the dashboard reachable from this machine only
            dashboard_address="127.0.0.1:0",
            silence_logs=logging.ERROR,
        )
    return Client(cluster), cluster


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


def map_tasks(client, fn, jobs, on_result, **keywords) -> list:
    """``fn(*job, **keywords)`` for each job of ``jobs`` (tuples of arguments) as Dask tasks on ``client``'s
    cluster; ``on_result(index, result)`` as each completes (in the order they finish), and the results returned
    in job order. Interrupted (Ctrl-C, an error of a task or of ``on_result``), the tasks not yet done are
    cancelled. A worker that dies takes its running and held tasks with it; the scheduler runs them again
    elsewhere."""
    from distributed import as_completed

    futures = [client.submit(fn, *job, pure=False, **keywords) for job in jobs]
    index = {f.key: i for i, f in enumerate(futures)}
    results = [None] * len(futures)
    try:
        for future in as_completed(futures):
            i = index[future.key]
            results[i] = future.result()
            on_result(i, results[i])
    finally:
        client.cancel(futures)
    return results
