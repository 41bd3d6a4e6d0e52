"""Paths of the user cache (models, cost files, benchmark data)."""

from __future__ import annotations

import os

__all__ = ["cache_root"]


def cache_root() -> str:
    """The user cache: ``$CACTUS_THEORY_CACHE``, else ``~/.cache/cactus_theory``."""
    return os.environ.get("CACTUS_THEORY_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "cactus_theory")
