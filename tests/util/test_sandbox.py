"""The sandbox that runs a model's programs: what a hostile program tries is refused or stopped, counted
as failed, and leaves the user's files and the network untouched; an honest program runs."""

import os
import socket
import sys
import textwrap

from cactus_theory._util._sandbox import OUTPUT_LIMIT, run_sandboxed


def _run(source, **kw):
    return run_sandboxed(textwrap.dedent(source), **kw)


def test_an_honest_program_passes_and_a_failing_one_fails():
    ok = _run("""
        import json, math, collections, re, itertools, functools, heapq
        assert math.isqrt(49) == 7 and json.loads('[1]') == [1]
        print('fine')
    """)
    assert (ok.passed, ok.status, ok.returncode, ok.stdout) == (True, "passed", 0, "fine\n")
    bad = _run("assert 1 + 1 == 3\n")
    assert (bad.passed, bad.status) == (False, "failed") and "AssertionError" in bad.stderr


def test_it_may_write_inside_its_own_directory():
    res = _run("""
        with open('scratch.txt', 'w') as fh:
            fh.write('x')
        import os
        os.remove('scratch.txt')
    """)
    assert res.passed, res.stderr


def test_a_program_that_loops_is_killed_and_fails():
    res = _run("while True:\n    pass\n", timeout=1.5)
    assert (res.passed, res.status) == (False, "timed out")


def test_a_program_that_sleeps_past_the_limit_is_killed():
    res = _run("import time\ntime.sleep(60)\n", timeout=1.0)
    assert (res.passed, res.status) == (False, "timed out")


def test_forking_and_spawning_are_refused(tmp_path):
    marker = tmp_path / "child_ran"
    for source in (
        "import os\npid = os.fork()\nif pid == 0:\n    open({m!r}, 'w').close()\n    os._exit(0)\n",
        "import subprocess\nsubprocess.run(['touch', {m!r}])\n",
        "import os\nos.system('touch ' + {m!r})\n",
        "import multiprocessing as mp\np = mp.Process(target=print)\np.start()\np.join()\n",
        "import os\nos.posix_spawn('/usr/bin/touch', ['touch', {m!r}], {{}})\n",
    ):
        res = _run(source.format(m=str(marker)))
        assert not res.passed and res.status == "failed", source
        assert "sandbox" in res.stderr, res.stderr
    assert not marker.exists()


def test_a_fork_bomb_never_starts():
    res = _run("import os\nwhile True:\n    os.fork()\n", timeout=5)
    assert (res.passed, res.status) == (False, "failed") and "os.fork" in res.stderr


def test_writing_removing_renaming_outside_its_directory_is_refused(tmp_path):
    mine = tmp_path / "user_file.txt"
    mine.write_text("keep me")
    folder = tmp_path / "user_folder"
    folder.mkdir()
    (folder / "inside.txt").write_text("keep me too")
    attempts = [
        f"open({str(tmp_path / 'new.txt')!r}, 'w').write('x')",
        f"open({str(mine)!r}, 'a').write('x')",
        f"open({str(mine)!r}, 'r+').write('x')",
        f"import os\nos.open({str(mine)!r}, os.O_WRONLY | os.O_TRUNC)",
        f"import os\nos.remove({str(mine)!r})",
        f"import os\nos.rename({str(mine)!r}, 'stolen.txt')",
        f"import os\nos.replace('x', {str(mine)!r}) if open('x', 'w') else None",
        f"import shutil\nshutil.rmtree({str(folder)!r})",
        f"import os\nos.chmod({str(mine)!r}, 0)",
        f"import os\nos.symlink('/etc/passwd', {str(tmp_path / 'link')!r})",
        "import os\nos.chdir('/tmp')",
        f"import pathlib\npathlib.Path({str(mine)!r}).write_text('gone')",
        "open('../escape.txt', 'w').write('x')",
        "import os\nos.symlink(os.path.dirname(os.getcwd()), 'up')\nopen('up/escape.txt', 'w').write('x')",
    ]
    for source in attempts:
        res = _run(source)
        assert (res.passed, res.status) == (False, "failed"), source
    assert mine.read_text() == "keep me" and oct(mine.stat().st_mode)[-3:] != "000"
    assert (folder / "inside.txt").read_text() == "keep me too"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user_file.txt", "user_folder"]


def test_no_network_even_to_a_listener_on_this_machine():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        for source in (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')",
            f"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"s.sendto(b'hi', ('127.0.0.1', {port}))",
            f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/', timeout=2)",
            "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()",
        ):
            res = _run(source)
            assert (res.passed, res.status) == (False, "failed"), source
        # a completed connection would wait in the listener's backlog: there is none
        listener.setblocking(False)
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            conn = None
        assert conn is None, "a sandboxed program reached the listener"
    finally:
        listener.close()


def test_loading_c_libraries_and_lifting_the_guard_are_refused(tmp_path):
    target = tmp_path / "after_hook.txt"
    for source in (
        "import ctypes\nctypes.CDLL(None).system(b'true')",
        f"import sys\nsys.addaudithook(lambda *a: None)\nopen({str(target)!r}, 'w')",
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
        "import sys\nsys.modules.clear()\nimport os\nos.fork()",
    ):
        res = _run(source)
        assert (res.passed, res.status) == (False, "failed"), source
    assert not target.exists()


def test_memory_and_output_are_capped():
    res = _run("x = bytearray(4 * 2**30)\n", memory_bytes=512 * 2**20)
    assert (res.passed, res.status) == (False, "failed") and "MemoryError" in res.stderr
    flood = _run("import sys\nsys.stdout.write('y' * (4 * 2**20))\n")
    assert flood.passed and len(flood.stdout) == OUTPUT_LIMIT


def test_it_leaves_nothing_behind():
    res = _run("import os\nprint(os.getcwd())\nopen('left.txt', 'w').write('x')\n")
    assert res.passed
    assert not os.path.exists(res.stdout.strip())


def test_it_ignores_the_users_environment(monkeypatch):
    monkeypatch.setenv("PYTHONSTARTUP", "/nonexistent")
    monkeypatch.setenv("CACTUS_SECRET", "s3cret")
    res = _run("import os, sys\nprint(os.environ.get('CACTUS_SECRET'), sys.flags.isolated)\n")
    assert res.stdout.split() == ["None", "1"]
    assert sys.executable  # the interpreter it ran is this one
