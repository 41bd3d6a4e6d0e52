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
import errno
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
import threading
import time

__all__ = [
    "DirectoryLock",
    "LockError",
    "atomic_path",
    "atomic_write",
    "check_output",
    "csv_text",
    "json_lines",
    "machine_description",
    "pid_alive",
    "publish_directory",
    "read_text",
    "refuse_overlap",
    "remove_stale_temporaries",
    "sha256_file",
    "termination_as_exception",
    "utc_timestamp",
    "write_records",
    "write_results",
]

TEMP_PREFIX = ".cactus_theory-"
#: Open flag that refuses a symbolic link at the path (0 where the platform has none).
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
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


def check_output(path, *, directory: bool = True, what: str = "--out") -> str:
    """Check, before any work, that ``path`` can be written: a directory (``directory=True``) or a
    file. An existing path must be of that kind; otherwise its nearest existing parent must be a
    directory in which this process can create entries (tried for real: a temporary directory of
    this package's naming is made and removed, so root on a read-only or virtual file system is
    refused too). Raises a ValueError naming ``what`` and saying what to change; returns the
    absolute path. Nothing is left behind."""
    path = os.path.abspath(os.fspath(path))
    kind = "directory" if directory else "file"
    if os.path.islink(path) and not os.path.exists(path):
        raise ValueError(
            f"{what} {path!r} is a symbolic link to {os.readlink(path)!r}, which does not exist: remove the link or "
            f"give another {kind}"
        )
    if os.path.exists(path):
        if directory and not os.path.isdir(path):
            raise ValueError(f"{what} {path!r} is a file, not a directory: give a directory")
        if not directory and os.path.isdir(path):
            raise ValueError(f"{what} {path!r} is a directory: give a file name (e.g. {os.path.join(path, 'x.json')})")
        if not directory and not os.path.isfile(path):
            raise ValueError(f"{what} {path!r} is not a regular file: give a file name")
        target = path if directory else os.path.dirname(path)
    else:
        target = os.path.dirname(path)
        while not os.path.exists(target):
            target = os.path.dirname(target)
        if not os.path.isdir(target):
            raise ValueError(f"{what} {path!r}: {target!r} is a file, so no {kind} can be made below it")
    try:
        probe = tempfile.mkdtemp(dir=target, prefix=f"{TEMP_PREFIX}{os.getpid()}-", suffix=".tmp")
        os.rmdir(probe)
    except OSError as exc:
        raise ValueError(
            f"{what} {path!r} cannot be written ({exc.strerror or exc} in {target!r}): choose a {kind} you can write to"
        ) from None
    return path


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def refuse_overlap(out, inputs, *, what: str = "--out") -> None:
    """Refuse an output that is one of its inputs or lies inside one (an input directory, or the
    input file itself), compared by real path (symbolic links resolved, a path that does not exist
    yet by its nearest existing parent): a ValueError naming both. ``inputs``: paths of files or
    directories the job reads (None entries and in-memory objects are skipped). An output is
    never one of its inputs: writing there would change what is being read."""
    if out is None:
        return
    target = os.path.realpath(os.fspath(out))
    for item in inputs:
        if not isinstance(item, (str, os.PathLike)):
            continue
        source = os.path.realpath(os.fspath(item))
        if _inside(target, source):
            relation = "is" if target == source else "lies inside"
            raise ValueError(
                f"{what} {os.fspath(out)!r} {relation} the input {os.fspath(item)!r}: an output is never one of its "
                "inputs; write to another location"
            )


def csv_text(rows) -> str:
    """CSV text of a list of dicts: a header of every key (in the order they first appear), then one
    line per row (a key a row lacks is an empty cell)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def read_text(path) -> str:
    """The text of a UTF-8 file (gzip-compressed if its name ends in .gz; a byte-order mark is
    dropped), read once, so a pipe (``<(...)``) or a FIFO works too. A directory, bytes that are
    not UTF-8 (naming the line and the byte) and a truncated or corrupt gzip file raise a
    ValueError naming the file."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{path!r} is a directory: give a file")
    if not os.path.exists(path):
        raise ValueError(f"{path!r} does not exist")
    with open(path, "rb") as fh:
        data = fh.read()
    if str(path).endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except EOFError:
            raise ValueError(f"{path}: the gzip file is truncated (it ends before its end marker)") from None
        except (OSError, gzip.BadGzipFile) as exc:
            raise ValueError(f"{path}: not a valid gzip file ({exc})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ValueError(
            f"{path}, line {line}, column {column}: byte 0x{data[exc.start]:02x} is not UTF-8: save the file as "
            "UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None


def json_lines(path, expected: str = "one record per line"):
    """(line number, record) of each non-blank line of a JSON Lines file (``read_text``: gzip if
    it ends in .gz, UTF-8); a line that is not JSON raises a ValueError naming the file, the line
    and ``expected``."""
    path = os.fspath(path)
    for n, line in enumerate(read_text(path).split("\n"), 1):  # not splitlines: U+2028 may sit in a string
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

    ``.cactus_theory.lock`` in the directory holds the owner's pid, host and start time. It is
    opened without following a symbolic link (``O_NOFOLLOW``), and only a regular file is used:
    a link or a FIFO at that path is refused, never written through. Where
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
            fd = os.open(self.path, os.O_RDONLY | _NOFOLLOW)
        except OSError:
            return "unknown"
        try:
            return os.read(fd, 4096).decode("utf-8", "replace").strip() or "unknown"
        except OSError:
            return "unknown"
        finally:
            os.close(fd)

    def _open(self, flags):
        """The lock file's descriptor, opened without following a symbolic link at its path; a
        link, or anything but a regular file there, raises a LockError (nothing is written)."""
        try:
            fd = os.open(self.path, flags | _NOFOLLOW, 0o666 & ~_umask())
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK) or os.path.islink(self.path):
                raise LockError(
                    f"{self.path!r} is a symbolic link, not this package's lock file: refusing to follow it "
                    "(remove the link, or write to another directory)"
                ) from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise LockError(
                f"{self.path!r} is not a regular file (a FIFO, device or directory): refusing to use it as a lock "
                "(remove it, or write to another directory)"
            )
        return fd

    def acquire(self) -> DirectoryLock:
        os.makedirs(self.directory, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            fcntl = None
        if fcntl is not None:
            while True:
                fd = self._open(os.O_RDWR | os.O_CREAT | os.O_NONBLOCK)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    raise LockError(
                        f"{self.directory!r} is being written by another process ({self._holder()}): wait for it "
                        "to finish, or write to another directory"
                    ) from None
                # The holder removes the file when it releases (while still holding the flock). A file
                # opened before that removal can be locked after it, while another process creates and
                # locks a fresh one: the lock counts only if the file locked is the one at the path now.
                try:
                    current = os.stat(self.path)
                except FileNotFoundError:
                    current = None
                mine = os.fstat(fd)
                if current is not None and (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
                    break
                os.close(fd)
        else:  # pragma: no cover - not POSIX
            while True:
                try:
                    fd = self._open(os.O_RDWR | os.O_CREAT | os.O_EXCL)
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
        """Remove the lock file while still holding the lock, then unlock (``acquire`` checks that
        the file it locked is still the one at the path, so the order is safe)."""
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
def _on_termination(handler):
    """Within the block, ``handler`` answers SIGTERM and SIGHUP (the previous handlers restored after). Only in the
    main thread, where Python delivers signals; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    names = [s for s in ("SIGTERM", "SIGHUP") if hasattr(signal, s)]
    previous = {name: signal.signal(getattr(signal, name), handler) for name in names}
    try:
        yield
    finally:
        for name, old in previous.items():
            signal.signal(getattr(signal, name), old)


@contextlib.contextmanager
def termination_as_exception():
    """Within the block, SIGTERM and SIGHUP raise ``Terminated`` (SIGINT already raises
    KeyboardInterrupt): ``with``-managed writers then flush and release their locks. Only in the
    main thread; elsewhere a no-op."""

    def handler(signum, frame):
        raise Terminated(128 + signum)

    with _on_termination(handler):
        yield


@contextlib.contextmanager
def termination_deferred():
    """Within the block, SIGTERM and SIGHUP are held, not acted on: each is recorded in the list the block gets,
    for the caller to act on once what the block starts (a Dask cluster's worker processes) is in hand to stop
    cleanly. Only in the main thread; elsewhere the list stays empty."""
    held = []
    with _on_termination(lambda signum, frame: held.append(signum)):
        yield held


def machine_description() -> str:
    """ "N cores, ARCH": the machine a results page was measured on, as the pages say it."""
    import platform

    return f"{os.cpu_count()} cores, {platform.machine()}"


def write_results(directory, stem, *, markdown, data=None, png=None) -> list:
    """A results page's files, each written atomically into ``directory`` (made if missing):
    ``stem.md`` (``markdown``), ``stem.json`` (``data``: indented, keys sorted, values JSON cannot
    hold written as text, a final newline) and ``stem.png`` (``png``: the figure's bytes). Returns
    the paths written. The one writer of the scripts in ``experiments/``."""
    os.makedirs(directory, exist_ok=True)
    written = [atomic_write(os.path.join(directory, f"{stem}.md"), markdown)]
    if data is not None:
        text = json.dumps(data, indent=1, sort_keys=True, default=str) + "\n"
        written.append(atomic_write(os.path.join(directory, f"{stem}.json"), text))
    if png is not None:
        written.append(atomic_write(os.path.join(directory, f"{stem}.png"), png))
    return written


def write_records(records, path, *, drop=()) -> str:
    """``records`` (dicts) as a JSON Lines file: one compact line each, keys sorted, without the fields ``drop``
    names, byte for byte the same for the same records, written atomically; gzip-compressed where ``path`` ends in
    ``.gz`` (no time stamp in the gzip header: a file a repository can hold), plain text otherwise. ``json_lines``
    reads either back. Returns the path."""
    text = "".join(
        json.dumps({k: v for k, v in r.items() if k not in drop}, sort_keys=True, separators=(",", ":")) + "\n"
        for r in records
    ).encode("utf-8")
    if os.fspath(path).endswith(".gz"):
        text = gzip.compress(text, compresslevel=9, mtime=0)
    return atomic_write(path, text)
