"""What identifies a model file in a manifest (name, source, sha256 and size of each file) and
the CPU threads a forward uses by default: shared by both engines (``_hf``, ``_llamacpp``)."""

from __future__ import annotations

import contextlib
import json
import os

from .._util._files import sha256_file

__all__ = ["default_threads", "file_entry", "file_sha256", "model_identity", "source_of_gguf"]


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
