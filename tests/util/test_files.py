"""The files wing: a directory lock admits one holder and never follows a symbolic link or opens a FIFO,
and ``check_output`` refuses what cannot be written before any work, leaving nothing behind."""

import os
import subprocess
import sys
import textwrap

import pytest
from locations import HANG_GUARD
from trace_builders import split_parts

from cactus_theory._cli import main
from cactus_theory._data._trace_writer import TraceWriter
from cactus_theory._util._files import DirectoryLock, LockError, check_output
from cactus_theory.traces import TraceError

_CONTENDER = textwrap.dedent(
    """
    import os, sys, time
    from cactus_theory._util._files import DirectoryLock, LockError
    directory, rounds = sys.argv[1], int(sys.argv[2])
    inside = os.path.join(directory, "inside")
    got = overlaps = 0
    while got < rounds:
        try:
            lock = DirectoryLock(directory).acquire()
        except LockError:
            continue
        try:  # the critical section: a marker only the lock holder may create
            fd = os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
        except FileExistsError:
            overlaps += 1
        else:
            time.sleep(0.0002)
            os.remove(inside)
        lock.release()
        got += 1
    print(overlaps)
    """
)


def test_the_directory_lock_admits_one_holder_at_a_time(tmp_path):
    # Four processes acquiring and releasing in a loop: the lock used to remove its file before
    # unlocking, so a process that had opened the old file locked it while another locked a new one.
    procs = [
        subprocess.Popen([sys.executable, "-c", _CONTENDER, str(tmp_path), "300"], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    overlaps = [int(p.communicate(timeout=HANG_GUARD)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert overlaps == [0, 0, 0, 0]


def test_check_output_refuses_what_cannot_be_written_and_leaves_nothing(tmp_path):
    assert check_output(tmp_path / "new" / "deeper") == str(tmp_path / "new" / "deeper")
    assert os.listdir(tmp_path) == []  # the probe is gone, nothing was created
    with pytest.raises(ValueError, match="is a directory"):
        check_output(tmp_path, directory=False)
    if os.path.isdir("/proc/self"):
        with pytest.raises(ValueError, match="cannot be written"):
            check_output("/proc/cannot/write")


def test_a_symbolic_link_at_the_lock_path_is_refused_and_its_target_untouched(tmp_path, capsys):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    parts = split_parts(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / DirectoryLock.NAME).symlink_to(precious)
    assert main(["merge", "--out", str(out), *parts, "--quiet"]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert precious.read_text() == "keep me"
    with pytest.raises(LockError, match="symbolic link"):
        DirectoryLock(out).acquire()
    with pytest.raises(TraceError, match="symbolic link"):
        TraceWriter(out, 50)
    assert precious.read_text() == "keep me"


def test_a_fifo_at_the_lock_path_is_refused(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    os.mkfifo(d / DirectoryLock.NAME)
    with pytest.raises(LockError, match="not a regular file"):
        DirectoryLock(d).acquire()
