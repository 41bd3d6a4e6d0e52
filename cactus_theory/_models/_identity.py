"""What identifies a model file in a manifest (name, source, sha256 and size of each file) and
the CPU threads a forward uses by default: shared by both engines (``_hf``, ``_llamacpp``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile

from .._util._files import TEMP_PREFIX, _umask, remove_stale_temporaries, sha256_file

__all__ = ["default_threads", "file_entry", "file_sha256", "model_identity", "source_of_gguf", "write_cache_entry"]


def default_threads() -> int:
    """The threads a model forward uses by default: the cores this process may run on (affinity),
    whatever torch's current setting is (another library may have changed it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def file_sha256(path: str) -> str:
    """sha256 of a model file, from its ``.sha256`` sidecar (experiments/fetch_models.py writes one
    after checking the pinned sum) when it is newer than the file, else computed."""
    sidecar = path + ".sha256"
    if os.path.exists(sidecar) and os.path.getmtime(sidecar) >= os.path.getmtime(path):
        with open(sidecar) as fh:
            value = fh.read().split()
        if value and len(value[0]) == 64:
            return value[0]
    return sha256_file(path)


def model_identity(name: str, source: str, files: dict) -> dict:
    """What a manifest and a report record of a model: a name, where it came from, and each
    file's sha256 and size. Never a path on the machine that dumped it."""
    return {"name": name, "source": source, "files": files}


def file_entry(path):
    return {"sha256": file_sha256(path), "bytes": os.path.getsize(path)}


def source_of_gguf(path):
    sidecar = path + ".source.json"
    if os.path.exists(sidecar):
        with contextlib.suppress(OSError, ValueError), open(sidecar) as fh:
            return str(json.load(fh).get("source", "local GGUF file"))
    return "local GGUF file"


def write_cache_entry(root, key, fill, complete: str):
    """Publish the cache entry ``root/key`` whole or not at all: ``fill(directory)`` writes it into
    a temporary directory beside it, a ``COMPLETE`` file with ``complete`` marks it finished, and
    a rename puts it in place (another process that cached it first wins; the temporary copy is
    removed, as on any error). Stale temporaries of dead writers in ``root`` are cleared first."""
    os.makedirs(root, exist_ok=True)
    remove_stale_temporaries(root)
    staging = tempfile.mkdtemp(dir=root, prefix=f"{TEMP_PREFIX}{os.getpid()}-", suffix=".tmp")
    try:
        fill(staging)
        with open(os.path.join(staging, "COMPLETE"), "w") as fh:
            fh.write(complete)
        os.chmod(staging, 0o777 & ~_umask())
        try:
            os.replace(staging, os.path.join(root, key))
        except OSError:  # another process cached it first
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
