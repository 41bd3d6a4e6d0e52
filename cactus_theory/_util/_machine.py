"""Probes of the machine: how busy its cores were while a timing ran (Linux /proc; None elsewhere)."""

from __future__ import annotations

import os
import time

__all__ = ["machine_sample", "other_load"]


def machine_sample():
    """(wall seconds, CPU seconds busy on the whole machine, CPU seconds of this process) now,
    from /proc (Linux); None elsewhere. Two samples give ``other_load``."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            cpu = [int(x) for x in fh.readline().split()[1:]]
        with open("/proc/self/stat", encoding="ascii") as fh:
            fields_ = fh.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    idle = cpu[3] + (cpu[4] if len(cpu) > 4 else 0)  # idle + iowait
    busy = sum(cpu[:8]) - idle
    own = int(fields_[11]) + int(fields_[12])  # utime + stime of every thread of this process
    return time.perf_counter(), busy / tick, own / tick


def other_load(start, end):
    """The share of the machine's cores that other processes kept busy between two
    ``machine_sample``s (0: this process alone; 1: every core busy with something else)."""
    if start is None or end is None or end[0] <= start[0]:
        return None
    other = (end[1] - start[1]) - (end[2] - start[2])
    return float(max(other, 0.0) / ((end[0] - start[0]) * (os.cpu_count() or 1)))
