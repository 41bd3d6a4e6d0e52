"""A run's own time, and runs that take turns: ``OwnClock`` (seconds a run spent running, none while another
had the machine), ``paused`` (a generator's point where another may run), ``drain`` (a generator of steps run
to its end), ``interleave`` (several runs alternating in short chunks, each timed by its own clock). Every
decoder (``_decoding``) and the sampling loop (``_hf.generate_steps``) are generators of steps timed so."""

from __future__ import annotations

import os
import time

__all__ = ["INTERLEAVE_SECONDS", "OwnClock", "drain", "interleave", "paused"]


class OwnClock:
    """Seconds a run spent running: wall time while running, none while paused (several runs
    that alternate each count only their own chunks). Starts running."""

    def __init__(self):
        self._total, self._since = 0.0, time.perf_counter()

    def pause(self):
        if self._since is not None:
            self._total += time.perf_counter() - self._since
            self._since = None

    def resume(self):
        if self._since is None:
            self._since = time.perf_counter()

    def elapsed(self) -> float:
        return self._total + (time.perf_counter() - self._since if self._since is not None else 0.0)


def paused(clock):
    """Yield once with ``clock`` stopped: a run's point where another may take the machine."""
    clock.pause()
    yield
    clock.resume()


def drain(steps):
    """Run a generator of steps (a decoder's ``steps``, ``generate_steps``) to its end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


#: Seconds of its own compute each run gets before the next takes the machine (``interleave``).
INTERLEAVE_SECONDS = 0.25


def interleave(runs, chunk_seconds=None):
    """Run generators of steps (``speculative_steps``, ``autoregressive_steps``) in alternating
    chunks of about ``chunk_seconds`` of wall time each (at least one step), round robin, until
    all end: a swing in
    the machine's load then falls on every run alike instead of on whichever ran during it.
    Returns (their values, in order; per run the share of the cores other processes kept busy
    during its own chunks, None where /proc cannot tell, and its number of chunks)."""
    from .._util._machine import machine_sample

    runs = list(runs)
    chunk_seconds = INTERLEAVE_SECONDS if chunk_seconds is None else chunk_seconds
    values, alive = [None] * len(runs), set(range(len(runs)))
    other, wall, chunks = [0.0] * len(runs), [0.0] * len(runs), [0] * len(runs)
    known = [True] * len(runs)
    while alive:
        for i in sorted(alive):
            before = machine_sample()
            start = time.perf_counter()
            while True:  # at least one step a chunk
                try:
                    next(runs[i])
                except StopIteration as stop:
                    values[i] = stop.value
                    alive.discard(i)
                    break
                if time.perf_counter() - start >= chunk_seconds:
                    break
            after = machine_sample()
            chunks[i] += 1
            if before is None or after is None:
                known[i] = False
            else:
                other[i] += max((after[1] - before[1]) - (after[2] - before[2]), 0.0)
                wall[i] += after[0] - before[0]
    cores = os.cpu_count() or 1
    # /proc counts in clock ticks (10 ms): over chunks that short the share is clipped to [0, 1]
    loads = [
        float(min(o / (w * cores), 1.0)) if k and w > 0 else None for o, w, k in zip(other, wall, known, strict=True)
    ]
    return values, loads, chunks
