"""Where the analysis runs, for scripts that drive it themselves: local worker processes, a
Dask cluster on this machine or one reached at an address, and the per-shard statistics that
travel to them (``shard_statistics`` of a ``ShardJob``: the work of one task, giving a
``SequenceStats`` per sequence)."""

from ._analysis._engines import (
    DASK_WORKER_ENV,
    connect_scheduler,
    local_dask_cluster,
    prepare_worker,
    run_dask,
    run_local,
)
from ._analysis._shards import SequenceStats, ShardJob, shard_statistics

__all__ = [
    "DASK_WORKER_ENV",
    "SequenceStats",
    "ShardJob",
    "connect_scheduler",
    "local_dask_cluster",
    "prepare_worker",
    "run_dask",
    "run_local",
    "shard_statistics",
]
