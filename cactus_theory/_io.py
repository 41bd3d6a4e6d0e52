"""File helpers shared by traces, analysis and reports: atomic writes, checksums, locks.

Rules every writer of the package follows:

- A file is written to a temporary name that only this package makes,
  ``.cactus_theory-<pid>-<random>.tmp`` beside its target, then renamed into place; a failure
  removes the temporary file. Temporary files of a process that no longer runs are stale and
  may be removed by the next writer; nothing else in a directory is ever deleted.
- Files get the permissions the umask gives a new file (0666 & ~umask), not mkstemp's 0600.
- A directory written by a long job is locked (``DirectoryLock``): a second writer is refused
  with a clear error; the lock of a dead process is taken over.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time

__all__ = [
    "DirectoryLock",
    "LockError",
    "atomic_path",
    "atomic_write",
    "csv_text",
    "json_lines",
    "pid_alive",
    "publish_directory",
    "remove_stale_temporaries",
    "sha256_file",
    "termination_as_exception",
    "utc_timestamp",
]

TEMP_PREFIX = ".cactus_theory-"
_TEMP_RE = re.compile(r"^\.cactus_theory-(\d+)-.*\.tmp$")


def utc_timestamp() -> str:
    """The current UTC time as the manifests, cost files and locks record it: 2026-11-30T02:00:00Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class LockError(RuntimeError):
    """A directory is locked by another live process."""


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _publish(tmp: str, path: str) -> None:
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path``; on success it is renamed to ``path`` (mode from the
    umask), on any exception it is removed. The parent directory is created if needed."""
    path = str(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f"{TEMP_PREFIX}{os.getpid()}-", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        _publish(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def atomic_write(path, data) -> str:
    """Write ``data`` (bytes or str, UTF-8) to a temporary name beside ``path``, then rename.

    A reader never sees a half-written file; the parent directory is created if needed; the
    file's mode follows the umask.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    return str(path)


def csv_text(rows) -> str:
    """CSV text of a list of dicts: a header from the first row's keys, then one line per row."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def json_lines(path, expected: str = "one record per line"):
    """(line number, record) of each non-blank line of a JSON Lines file (gzip if it ends in .gz);
    a line that is not JSON raises a ValueError naming the file, the line and ``expected``."""
    path = str(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}, line {n}: not valid JSON ({exc.msg}): {expected}") from None


def sha256_file(path) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def remove_stale_temporaries(directory) -> list[str]:
    """Remove this package's temporary files and staging directories in ``directory`` whose
    writing process has ended; every other entry is left alone. Returns the names removed."""
    removed = []
    for name in os.listdir(directory):
        m = _TEMP_RE.match(name)
        if m and not pid_alive(int(m.group(1))):
            path = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)
                removed.append(name)
    return removed


def publish_directory(files: dict, out_dir, last=()) -> list[str]:
    """Write ``files`` ({name: bytes or str}) into ``out_dir`` so that a reader never sees a mix of
    old and new: everything is written into a staging directory beside ``out_dir`` first (named
    like the package's temporary files, removed on failure, and by the next writer if this
    process is killed), then renamed: the whole directory when ``out_dir`` does not exist, else
    file by file with the names in ``last`` (the index) renamed last. Other files in ``out_dir``
    are left alone. Modes follow the umask. Returns the paths written."""
    out_dir = os.path.abspath(str(out_dir))
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    remove_stale_temporaries(parent)
    staging = tempfile.mkdtemp(dir=parent, prefix=f"{TEMP_PREFIX}{os.getpid()}-", suffix=".tmp")
    try:
        mode = 0o666 & ~_umask()
        for name, data in files.items():
            path = os.path.join(staging, name)
            with open(path, "wb") as fh:
                fh.write(data.encode("utf-8") if isinstance(data, str) else data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(path, mode)
        if not os.path.exists(out_dir):
            os.chmod(staging, 0o777 & ~_umask())
            os.replace(staging, out_dir)
        else:
            order = [n for n in files if n not in last] + [n for n in last if n in files]
            for name in order:
                os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
            os.rmdir(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [os.path.join(out_dir, name) for name in files]


class DirectoryLock:
    """An exclusive lock on a directory for one writer, held until ``release``.

    ``.cactus_theory.lock`` in the directory holds the owner's pid, host and start time. Where
    ``fcntl`` exists the lock is an ``flock`` on that file, released by the kernel when the
    process dies, so a stale lock is simply taken over; elsewhere the file is created
    exclusively and a lock of a dead local process is taken over. A second writer gets a
    ``LockError`` naming the holder.
    """

    NAME = ".cactus_theory.lock"

    def __init__(self, directory, purpose: str = "writer"):
        self.directory = str(directory)
        self.path = os.path.join(self.directory, self.NAME)
        self.purpose = purpose
        self._fd = None

    def _holder(self) -> str:
        try:
            with open(self.path) as fh:
                return fh.read().strip() or "unknown"
        except OSError:
            return "unknown"

    def acquire(self) -> DirectoryLock:
        os.makedirs(self.directory, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            fcntl = None
        if fcntl is not None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise LockError(
                    f"{self.directory!r} is being written by another process ({self._holder()}): wait for it to "
                    "finish, or write to another directory"
                ) from None
        else:  # pragma: no cover - not POSIX
            while True:
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666 & ~_umask())
                    break
                except FileExistsError:
                    holder = self._holder()
                    m = re.search(r"pid (\d+)", holder)
                    if m and not pid_alive(int(m.group(1))):
                        with contextlib.suppress(OSError):
                            os.remove(self.path)
                        continue
                    raise LockError(
                        f"{self.directory!r} is being written by another process ({holder}): wait for it to "
                        "finish, or write to another directory"
                    ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{self.purpose}: pid {os.getpid()} on {socket.gethostname()} since {utc_timestamp()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.remove(self.path)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


class Terminated(SystemExit):
    """SIGTERM (or SIGHUP) turned into an exception, so that writers flush what they hold."""


@contextlib.contextmanager
def termination_as_exception():
    """Within the block, SIGTERM and SIGHUP raise ``Terminated`` (SIGINT already raises
    KeyboardInterrupt): ``with``-managed writers then flush and release their locks. Only in the
    main thread; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(128 + signum)

    names = [s for s in ("SIGTERM", "SIGHUP") if hasattr(signal, s)]
    previous = {name: signal.signal(getattr(signal, name), handler) for name in names}
    try:
        yield
    finally:
        for name, old in previous.items():
            signal.signal(getattr(signal, name), old)
