"""Progress bars for the long jobs (dump, decode, analyze, report): tqdm on stderr with rate and
time left. ``enabled`` is True (always), False (never) or None (only when stderr is a terminal)."""

from __future__ import annotations

import sys

__all__ = ["progress_bar", "say"]


def progress_bar(iterable=None, *, total=None, desc="", unit="it", enabled=None):
    """A tqdm bar over ``iterable`` (or a manual one with ``total``); a silent stand-in when disabled."""
    from tqdm import tqdm

    return tqdm(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        disable=None if enabled is None else not enabled,
        file=sys.stderr,
        dynamic_ncols=True,
        leave=True,
    )


def say(message: str, enabled=None) -> None:
    """One status line on stderr, under the same rule as the bars."""
    if enabled or (enabled is None and sys.stderr.isatty()):
        print(message, file=sys.stderr, flush=True)
