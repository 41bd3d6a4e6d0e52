"""One resumable log of records: a JSON Lines file that a long job appends to as it goes, that a rerun reads
back to skip what is done, and that nothing else is ever mistaken for.

- Every record starts with ``{"record": KIND, ...}`` (``KIND`` names the job: "cactus-theory evaluate") and
  carries the run's ``setting`` (everything that decides its answers besides the record's own key: models,
  sampling, lengths, seeds...). A file is this log's only if every line is a record of its kind; a file
  holding anything else (a trace's manifest, a user's JSON Lines) is refused before a byte of it changes.
- A rerun with another setting is refused in one line naming what differs, never resumed into one summary.
- The file itself is locked (``flock`` on its descriptor, opened without following a symbolic link) while a
  run appends: two runs writing different files in one directory do not refuse each other.
- A run killed while appending leaves at most one torn line, the last, which starts as this log's records
  do: it is cut off on the next open (that record is made again); any other unfinished line is refused.
- Each append is flushed and ``fsync``-ed: what a run reported done survives a crash of the machine.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys

from ._files import _NOFOLLOW, LockError, Terminated, _umask, termination_as_exception

__all__ = ["RECORD_FIELD", "RecordLog", "open_records", "resumable_run", "setting_difference"]

#: The first field of every record: the kind of log it belongs to.
RECORD_FIELD = "record"


def setting_difference(found: dict, wanted: dict) -> str:
    """The keys whose values differ between two settings, as "key: found -> wanted" (nested dicts by
    dotted key), for a one-line refusal."""
    out = []

    def walk(a, b, prefix):
        if isinstance(a, dict) and isinstance(b, dict):
            for key in dict.fromkeys([*a, *b]):
                walk(a.get(key), b.get(key), f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix[:-1]}: {json.dumps(a)[:60]} -> {json.dumps(b)[:60]}")

    walk(found, wanted, "")
    return "; ".join(out) or "none"


class RecordLog:
    """The records of ``kind`` at ``path`` for one ``setting`` (see the module docstring). ``open()`` locks
    the file, checks every line and returns the records it holds (in order); ``append(records)`` writes
    them (each gets ``record`` and ``setting``); ``close()`` unlocks. ``what`` names the option that gave
    ``path`` in messages."""

    def __init__(self, path, kind: str, setting: dict, *, what: str = "--out"):
        self.path = os.path.abspath(os.fspath(path))
        self.kind = kind
        self.setting = json.loads(json.dumps(setting))  # as it reads back (tuples are lists)
        self.what = what
        self._fd = None
        self._prefix = json.dumps({RECORD_FIELD: kind})[:-1].encode()  # '{"record": "KIND"'

    def _refuse(self, why: str):
        raise ValueError(f"{self.what} {self.path!r} {why}")

    def open(self) -> list:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o666 & ~_umask())
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK) or os.path.islink(self.path):
                self._refuse("is a symbolic link: refusing to write through it; give the file itself")
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self._refuse("is not a regular file: give a file name")
            import fcntl

            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise LockError(
                    f"{self.what} {self.path!r} is being written by another run: wait for it to finish, or write "
                    "to another file"
                ) from None
            records = self._check(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return records

    def _check(self, fd) -> list:
        """The records the file holds, every line checked before anything is changed; a torn last line of
        this log's is cut off."""
        size = os.fstat(fd).st_size
        data = os.pread(fd, size, 0) if size else b""
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        records = []
        for n, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                self._refuse(f"is not a records file of {self.kind} (line {n} is not JSON): write to another file")
            if not isinstance(rec, dict) or rec.get(RECORD_FIELD) != self.kind:
                self._refuse(f"is not a records file of {self.kind} (line {n}): write to another file")
            if rec.get("setting") != self.setting:
                differs = setting_difference(rec.get("setting"), self.setting)
                self._refuse(
                    f"holds records of another setting (line {n}: {differs}): write to another file, or rerun with "
                    "the setting it holds"
                )
            records.append(rec)
        if tail:
            if not tail.startswith(self._prefix):
                self._refuse(f"is not a records file of {self.kind} (its last line): write to another file")
            os.ftruncate(fd, size - len(tail))  # a record torn by a killed run: made again
            os.fsync(fd)
        return records

    def append(self, records) -> None:
        """Append ``records`` (dicts), each as one line starting ``{"record": KIND, ...}`` and holding the
        setting, then flush them to the disk."""
        if self._fd is None:
            raise RuntimeError("RecordLog.append before open()")
        data = "".join(json.dumps(self.stamped(r)) + "\n" for r in records).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)

    def stamped(self, record: dict) -> dict:
        """``record`` as this log writes it: ``record`` first, ``setting`` included."""
        body = {k: v for k, v in record.items() if k not in (RECORD_FIELD, "setting")}
        return {RECORD_FIELD: self.kind, **body, "setting": self.setting}

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the flock goes with the descriptor
            self._fd = None

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()


def open_records(path, kind: str, setting: dict):
    """(the ``RecordLog`` of ``path``, the records it holds), or (None, []) where there is no path; a file
    another process holds is a ValueError naming it."""
    if path is None:
        return None, []
    log = RecordLog(path, kind, setting)
    try:
        return log, log.open()
    except LockError as exc:
        raise ValueError(str(exc)) from None


class _Run:
    """What a resumable run's interruption line needs: its bar (closed first) and what it has kept."""

    def __init__(self, kept):
        self.bar, self.kept = None, kept


@contextlib.contextmanager
def resumable_run(out, kept):
    """A long run that appends to the records file ``out``: within the block SIGTERM and SIGHUP raise
    ``Terminated`` (``termination_as_exception``); on an interruption (those, or Ctrl-C) the run's bar
    (``run.bar``, set by the caller) is closed and one line on stderr says what is kept (``kept()``, a
    phrase such as "12 record(s) of this run kept") and how to resume; the interruption then goes on."""
    run = _Run(kept)
    try:
        with termination_as_exception():
            yield run
    except (KeyboardInterrupt, Terminated):
        if run.bar is not None:
            run.bar.close()
        where = f" in {out}: rerun the same command to resume" if out else ""
        print(f"stopped: {run.kept()}{where}", file=sys.stderr, flush=True)
        raise
