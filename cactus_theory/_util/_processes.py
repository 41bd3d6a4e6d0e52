"""Processes a run starts and must stop, however the run ends (``managed_process``): a server or a worker, each in
its own process group, stopped with its group on a normal end, an error, Ctrl-C, SIGTERM or SIGHUP (SIGTERM
first, SIGKILL after a grace period), the stop said on stderr; and, on Linux, told by the kernel to die with the
process that started it (``PR_SET_PDEATHSIG``), so that even a SIGKILL of the run, which runs no clean-up, leaves
nothing behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from ._files import termination_as_exception

__all__ = ["managed_process"]


def _die_with_parent():  # pragma: no cover - runs in the child, between fork and exec
    """Ask the kernel for SIGKILL when the parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``); elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _stop(process, grace) -> None:
    """SIGTERM to the process's group, then SIGKILL after ``grace`` seconds; waits for it."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def managed_process(argv, *, log, what, ready=None, start_timeout=600.0, grace=30.0, quiet=False):
    """Run ``argv`` (its output appended to the file ``log``) for the block, and stop it and its process group
    when the block ends, however it ends (see the module docstring); yields the ``subprocess.Popen``.
    ``ready(process)``: called until it returns True (the process up: a health check), at most ``start_timeout``
    seconds; the process exiting first is a RuntimeError naming ``log``. ``what`` names it in what is said."""
    with open(log, "ab") as fh:
        process = subprocess.Popen(
            [str(a) for a in argv],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped whole
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    try:
        with termination_as_exception():
            if ready is not None:
                deadline = time.monotonic() + start_timeout
                while not ready(process):
                    if process.poll() is not None:
                        raise RuntimeError(f"{what} exited with {process.returncode} before it was ready; see {log}")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{what} was not ready within {start_timeout:g} s; see {log}")
                    time.sleep(0.1)
            yield process
    finally:
        running = process.poll() is None
        _stop(process, grace)
        if running and not quiet:
            print(f"stopped {what} (pid {process.pid})", file=sys.stderr, flush=True)
