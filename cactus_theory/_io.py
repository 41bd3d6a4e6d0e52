"""File helpers shared by traces, analysis and reports: atomic writes and checksums."""

from __future__ import annotations

import hashlib
import os
import tempfile

__all__ = ["atomic_write", "sha256_file"]


def atomic_write(path, data) -> str:
    """Write ``data`` (bytes or str, UTF-8) to a temporary name beside ``path``, then rename.

    A reader never sees a half-written file; the parent directory is created if needed.
    """
    path = str(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with tempfile.NamedTemporaryFile(dir=directory, delete=False, suffix=".tmp") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(fh.name, path)
    return path


def sha256_file(path) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()
