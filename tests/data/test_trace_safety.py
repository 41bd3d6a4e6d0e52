"""Traces you can trust (issue 13): a writer owns its files and its directory, a dump interrupted in
any way resumes to the trace it would have written, manifests and shards are validated, and every
file honours the umask. Each test here failed on the code before the issue."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from locations import HANG_GUARD, ROOT, TESTS
from safetensors.numpy import save_file
from tiny_models import tiny_model, tiny_tokenizer

from cactus_theory import SamplingSettings
from cactus_theory._data._prompts import Prompt, prompt_seed
from cactus_theory._util._files import DirectoryLock, atomic_write, sha256_file
from cactus_theory.traces import Trace, TraceError, TraceWriter, dump_trace, trace_from_arrays

HERE, ROOT = str(TESTS), str(ROOT)


def _logits(seed, n=30, vocab=120):
    rng = np.random.default_rng(seed)
    target = rng.normal(size=(n, vocab)) * 3
    return target + rng.normal(size=(n, vocab)), target, rng.integers(vocab, size=n)


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# --- the writer owns its files ----------------------------------------------------------------


def test_writer_never_deletes_files_it_did_not_create(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "notes.tmp").write_text("x")
    (d / "tmp1234.tmp").write_text("y")  # what tempfile names look like: still not ours
    stale = d / f".cactus_theory-{_dead_pid()}-abc.tmp"  # a killed writer's temporary file
    stale.write_text("z")
    live = d / f".cactus_theory-{os.getpid()}-abc.tmp"  # a running process's: left alone
    live.write_text("w")
    TraceWriter(d, 50).close()
    assert (d / "notes.tmp").read_text() == "x" and (d / "tmp1234.tmp").read_text() == "y"
    assert not stale.exists() and live.exists()
    assert sorted(os.listdir(d)) == sorted([live.name, "manifest.json", "notes.tmp", "tmp1234.tmp"])


def test_a_second_writer_is_refused_and_a_dead_writers_lock_taken_over(tmp_path):
    d = tmp_path / "d"
    first = TraceWriter(d, 50)
    with pytest.raises(TraceError, match=r"being written by another process \(trace writer: pid \d+"):
        TraceWriter(d, 50)
    first.close()
    TraceWriter(d, 50).close()  # released
    # a lock left by a process that no longer runs (its flock died with it) is taken over
    (d / DirectoryLock.NAME).write_text(f"trace writer: pid {_dead_pid()} on elsewhere since then\n")
    TraceWriter(d, 50).close()


def test_a_writer_in_another_live_process_is_refused(tmp_path):
    d = tmp_path / "d"
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {ROOT!r})
        from cactus_theory.traces import TraceWriter
        w = TraceWriter({str(d)!r}, 50)
        print("locked", flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(TraceError, match=f"pid {child.pid}"):
            TraceWriter(d, 50)
    finally:
        child.kill()
        child.wait()
    TraceWriter(d, 50).close()  # its lock died with it


def test_files_honour_the_umask(tmp_path):
    draft, target, tokens = _logits(0)
    old = os.umask(0o022)
    try:
        trace_from_arrays(tmp_path / "t", draft, target, tokens, top_k=8)
        atomic_write(tmp_path / "a.txt", "x")
        os.umask(0o077)
        atomic_write(tmp_path / "b.txt", "x")
    finally:
        os.umask(old)
    for name in ("manifest.json", "shard-00000.safetensors"):
        assert (tmp_path / "t" / name).stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.txt").stat().st_mode & 0o777 == 0o600


# --- manifests and shards are validated ---------------------------------------------------------


@pytest.fixture
def small_trace(tmp_path):
    draft, target, tokens = _logits(1)
    trace_from_arrays(tmp_path / "t", draft, target, tokens, sequence_lengths=[10, 20], top_k=8)
    return tmp_path / "t"


def _edit_manifest(directory, change):
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("name", ["/dev/zero", "../outside.safetensors", "/etc/passwd", "sub/shard-00000.safetensors"])
def test_a_manifest_names_shards_inside_the_trace_only(small_trace, name):
    _edit_manifest(small_trace, lambda m: m["shards"][0].update(file=name))
    with pytest.raises(TraceError, match=r"basename of a shard inside the trace directory"):
        Trace(small_trace)


def test_links_and_devices_are_never_read(small_trace, tmp_path):
    shard = small_trace / "shard-00000.safetensors"
    outside = tmp_path / "outside.safetensors"
    shard.rename(outside)
    shard.symlink_to(outside)
    with pytest.raises(TraceError, match="not a regular file"):
        Trace(small_trace)
    shard.unlink()
    shard.symlink_to("/dev/zero")
    with pytest.raises(TraceError, match="not a regular file"):
        Trace(small_trace, verify=False)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("[]", "expected a JSON object"),
        ("null", "expected a JSON object"),
        ('{"format": "cactus_theory.trace", "version": 1}', "top_k must be an integer"),
        ("[" * 100000 + "]" * 100000, "nested too deeply|not valid JSON"),
        ('{"format": "cactus_theory.trace", "version": 1, "top_k": 8, "vocab_size": 120, "shards": {}}', "lists"),
    ],
)
def test_manifests_of_the_wrong_shape_raise_trace_errors(small_trace, content, match):
    (small_trace / "manifest.json").write_text(content)
    with pytest.raises(TraceError, match=match):
        Trace(small_trace)


def test_duplicate_sequence_ids_are_refused(small_trace):
    _edit_manifest(small_trace, lambda m: m["sequences"][1].update(id=m["sequences"][0]["id"]))
    with pytest.raises(TraceError, match="appears twice"):
        Trace(small_trace)


def test_token_ids_are_checked_when_written(tmp_path):
    draft, target, _tokens = _logits(2, n=5)
    writer = TraceWriter(tmp_path / "t", 120, top_k=8)
    with pytest.raises(TraceError, match=r"token id 1099511627776, outside the vocabulary \[0, 120\)"):
        writer.add("a", "x", np.array([1, 2, 2**40, 3, 4]), target, draft)
    with pytest.raises(TraceError, match=r"token id 120, outside"):
        writer.add("a", "x", np.array([1, 2, 120, 3, 4]), target, draft)
    with pytest.raises(TraceError, match="must be integer token ids"):
        writer.add("a", "x", np.array([1.5, 2, 3, 3, 4]), target, draft)
    writer.close()


def _rewrite_shard(directory, change):
    """Tamper with shard 0's arrays and fix its checksum, as a buggy writer would."""
    from safetensors.numpy import load_file

    path = directory / "shard-00000.safetensors"
    data = load_file(str(path))
    change(data)
    save_file(data, str(path))
    _edit_manifest(directory, lambda m: m["shards"][0].update(sha256=sha256_file(path), bytes=os.path.getsize(path)))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda d: d.update(offsets=np.array([0, 25, 30], dtype=np.int64)), "offsets disagree"),
        (lambda d: d.update(offsets=np.array([0, 40, 30], dtype=np.int64)), "must not decrease|disagree"),
        (lambda d: d.update(offsets=np.array([0, 10], dtype=np.int64)), "offsets must run"),
        (lambda d: d["tokens"].__setitem__(3, 500), "outside the vocabulary"),
        (lambda d: d["draft_topk_ids"].__setitem__((2, 1), -7), "outside the vocabulary"),
    ],
)
def test_shard_contents_are_checked_when_read(small_trace, change, match):
    _rewrite_shard(small_trace, change)
    trace = Trace(small_trace)
    with pytest.raises(TraceError, match=match):
        list(trace)


# --- dumps: seeds, resume checks, interruptions ------------------------------------------------

PROMPTS = [
    Prompt(id=f"p{i}", task="toy", text=" ".join(f"t{(5 * i + j) % 60 + 2}" for j in range(4)), index=i)
    for i in range(6)
]
SETTINGS = SamplingSettings(temperature=1.0, top_k=12, top_p=1.0)


def _dump(out, prompts=PROMPTS, **kw):
    args = {"settings": SETTINGS, "max_new_tokens": 8, "top_k": 16, "progress": False, "seed": 3}
    args.update(kw)
    return dump_trace(
        (tiny_model(0), tiny_tokenizer()), (tiny_model(1, layers=1), tiny_tokenizer()), prompts, out, **args
    )


def _same_sequences(a, b):
    a, b = {s.id: s for s in Trace(a)}, {s.id: s for s in Trace(b)}
    assert sorted(a) == sorted(b)
    for key, s in a.items():
        t = b[key]
        np.testing.assert_array_equal(s.tokens, t.tokens)
        for role in ("target", "draft"):
            np.testing.assert_array_equal(s.topk_logits[role], t.topk_logits[role])
            np.testing.assert_array_equal(s.topk_ids[role], t.topk_ids[role])
            np.testing.assert_array_equal(s.lse[role], t.lse[role])


@pytest.mark.models
def test_seeds_come_from_the_prompt_id_not_the_run(tmp_path):
    assert prompt_seed(3, "p1") == prompt_seed(3, "p1") != prompt_seed(3, "p2") != prompt_seed(4, "p2")
    _dump(tmp_path / "full")
    _dump(tmp_path / "parts", limit=2)  # a limited run, then the rest in another order
    _dump(tmp_path / "parts", prompts=PROMPTS[::-1], limit=1)
    _dump(tmp_path / "parts", prompts=PROMPTS[::-1])
    _same_sequences(tmp_path / "full", tmp_path / "parts")


@pytest.mark.models
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"settings": SamplingSettings(temperature=0.7, top_k=12, top_p=1.0)}, "sampling"),
        ({"seed": 4}, "seed"),
        ({"dtype": "bfloat16"}, "dtype"),
        ({"max_new_tokens": 9}, "max_new_tokens"),
        ({"top_k": 8}, "top_k"),
        ({"store_full": True}, "store_full"),
    ],
)
def test_resume_refuses_other_settings_naming_the_field(tmp_path, change, field):
    _dump(tmp_path / "t", limit=1)
    with pytest.raises(TraceError, match=f"cannot resume .*its {field} is"):
        _dump(tmp_path / "t", **change)


@pytest.mark.models
def test_resume_refuses_another_model(tmp_path):
    from tiny_models import write_tiny_gguf

    v1 = write_tiny_gguf(tiny_model(0), tmp_path / "v1.gguf")
    v2 = write_tiny_gguf(tiny_model(5), tmp_path / "v2.gguf")
    d = write_tiny_gguf(tiny_model(1, layers=1), tmp_path / "d.gguf")
    prompts = [Prompt(id="g0", task="toy", text="ab cd", index=0), Prompt(id="g1", task="toy", text="ef", index=1)]
    kw = {"settings": SETTINGS, "max_new_tokens": 4, "top_k": 16, "progress": False}
    dump_trace(str(v1), str(d), prompts, tmp_path / "t", limit=1, **kw)
    with pytest.raises(TraceError, match=r"cannot resume .*its verifier is"):
        dump_trace(str(v2), str(d), prompts, tmp_path / "t", **kw)


_DUMP_SCRIPT = """
import sys
sys.path.insert(0, {tests!r}); sys.path.insert(0, {root!r})
from tiny_models import tiny_model, tiny_tokenizer
from cactus_theory import SamplingSettings
from cactus_theory.traces import dump_trace
from cactus_theory._data._prompts import Prompt
import time, cactus_theory._models._dump as dm
if {block_after} is not None:  # prompt block_after + 1 of this run never completes: the step storing it blocks
    finish, calls = dm._finish, []
    def blocking(*a):
        if len(calls) == {block_after}:
            print("BLOCKED", file=sys.stderr, flush=True)
            while True:
                time.sleep(60)
        calls.append(1)
        return finish(*a)
    dm._finish = blocking
prompts = [Prompt(id=f"p{{i}}", task="toy", text=" ".join(f"t{{(5 * i + j) % 60 + 2}}" for j in range(4)), index=i)
           for i in range(6)]
dump_trace((tiny_model(0), tiny_tokenizer()), (tiny_model(1, layers=1), tiny_tokenizer()), prompts, {out!r},
           settings=SamplingSettings(temperature=1.0, top_k=12, top_p=1.0), max_new_tokens=8, top_k=16, seed=3,
           shard_positions={shard_positions}, progress=True, batch={batch})
"""


def _start_dump(out, shard_positions, block_after=None, batch=None):
    """A dump in a child process; with ``block_after`` = N it finishes N prompts of this run, prints
    BLOCKED and blocks as the next one completes (so a signal always lands mid-prompt, with the rest
    of the batch in flight, however busy the machine: no timing in the test)."""
    script = _DUMP_SCRIPT.format(
        tests=HERE, root=ROOT, out=str(out), shard_positions=shard_positions, block_after=block_after, batch=batch
    )
    # the child starts with Ctrl-C's default action, as a command typed in a terminal does: a test command run in
    # the background (nohup, `&` in a script) ignores SIGINT, Python then leaves it ignored in every child, and a
    # Ctrl-C sent to the dump would never arrive
    return subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, preexec_fn=_default_sigint)


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_blocked(child):
    """Read the child's stderr until it says BLOCKED; returns what it printed."""
    seen = b""
    while b"BLOCKED" not in seen:
        chunk = os.read(child.stderr.fileno(), 4096)
        assert chunk, seen.decode()[-2000:]  # the child ended without blocking
        seen += chunk
    return seen


@pytest.mark.models
@pytest.mark.parametrize("batch", [1, 3])
def test_sigkill_at_several_moments_then_resume_gives_the_uninterrupted_trace(tmp_path, batch):
    out = tmp_path / "killed"
    # killed with the blank manifest written and no prompt done, then after one more prompt, then after two more;
    # the reruns keep the trace's batch (batch=None): every step of the rest has the straight run's shape
    done = []
    for more in (0, 1, 2):
        child = _start_dump(out, shard_positions=3, block_after=more, batch=batch if more == 0 else None)
        _wait_blocked(child)
        child.send_signal(signal.SIGKILL)
        child.wait()
        done.append(len(json.loads((out / "manifest.json").read_text())["sequences"]))
    # each prompt of this toy dump fills a shard (shard_positions=3): every completed prompt is on disk
    assert done == [0, 1, 3] and done[-1] < len(PROMPTS)
    child = _start_dump(out, shard_positions=3)
    assert child.wait(timeout=HANG_GUARD) == 0, child.stderr.read().decode()[-2000:]
    _dump(tmp_path / "clean", shard_positions=3, batch=batch)
    _same_sequences(out, tmp_path / "clean")  # bit for bit
    assert not [f for f in os.listdir(out) if f.endswith(".tmp") or f.endswith(".lock")]


@pytest.mark.models
@pytest.mark.parametrize(("signum", "batch"), [(signal.SIGTERM, 1), (signal.SIGINT, 1), (signal.SIGTERM, 4)])
def test_sigterm_or_ctrl_c_keeps_every_completed_sequence(tmp_path, signum, batch):
    out = tmp_path / "t"
    child = _start_dump(out, shard_positions=100_000, block_after=3, batch=batch)  # nothing reaches a shard by size
    _wait_blocked(child)  # three prompts done, the fourth in progress
    child.send_signal(signum)
    assert child.wait(timeout=HANG_GUARD) != 0
    kept = Trace(out)
    assert len(kept) == 3  # the completed sequences held in memory were written
    assert not [f for f in os.listdir(out) if f.endswith(".tmp") or f.endswith(".lock")]
    _dump(out, shard_positions=100_000)  # and the trace resumes to the full one, at the trace's batch
    _dump(tmp_path / "clean", batch=batch)
    _same_sequences(out, tmp_path / "clean")


@pytest.mark.models
def test_a_resumed_dump_is_bit_identical_whatever_the_callers_torch_threads(tmp_path):
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        _dump(tmp_path / "parts", limit=2)
        torch.set_num_threads(3)
        _dump(tmp_path / "parts")
        torch.set_num_threads(2)
        _dump(tmp_path / "clean")
    finally:
        torch.set_num_threads(before)
    _same_sequences(tmp_path / "parts", tmp_path / "clean")
    assert torch.get_num_threads() == before  # and the caller's setting is left as it was


# --- the report ---------------------------------------------------------------------------------


def test_a_report_that_fails_midway_leaves_the_old_report_and_no_temporary_files(tmp_path):
    from cactus_theory._studies import _report
    from cactus_theory._util._files import publish_directory

    out = tmp_path / "r"
    publish_directory({"report.md": "old", "report.html": "old", "gamma_forms.png": b"old"}, out)
    (out / "mine.txt").write_text("keep")
    stale = tmp_path / f".cactus_theory-{_dead_pid()}-x.tmp"  # a killed report's staging directory
    stale.mkdir()
    (stale / "report.md").write_text("half")

    def boom(*a, **k):
        raise KeyboardInterrupt

    import multiprocessing

    from cactus_theory._studies import _zoo

    trace = str(_small_report_trace(tmp_path))
    # interrupted in this process while the second process computes its sections, then in those sections
    for module, name, inline in ((_zoo, "compare_rules", False), (_report, "worst_case_curve", True)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(module, name, boom)
            mp.setattr(_report, "SIDE_PROCESS", not inline)
            with pytest.raises(KeyboardInterrupt):
                _report.build_report(str(out), trace=trace, progress=False)
        assert not multiprocessing.active_children()  # the second process ended with the report
        assert (out / "report.md").read_text() == "old" and (out / "gamma_forms.png").read_bytes() == b"old"
        assert (out / "mine.txt").read_text() == "keep"
        leftovers = [f for f in os.listdir(tmp_path) if f.startswith(".cactus_theory-")]
        assert leftovers == [stale.name]  # this run left nothing; the dead one's is removed by the next publish
    publish_directory({"report.md": "new"}, out, last=("report.md",))
    assert not stale.exists() and (out / "report.md").read_text() == "new"


def _small_report_trace(tmp_path):
    draft, target, tokens = _logits(3, n=40)
    trace_from_arrays(
        tmp_path / "small",
        draft,
        target,
        tokens,
        sequence_lengths=[20, 20],
        top_k=32,
        metadata={"sampling": SamplingSettings().as_dict()},
    )
    return tmp_path / "small"


def _side_process_of(parent):
    """The pid of ``parent``'s spawned worker (its child running multiprocessing's spawn_main), once it exists."""
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    command = f.read()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == parent and b"spawn_main" in command:
                return int(entry)
        time.sleep(0.05)
    raise AssertionError("the report never started its second process")


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the processes through /proc (Linux)")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_report_leaves_no_second_process_behind(tmp_path, signum):
    """Killed outright (no clean-up runs in it), the report's second process ends too: it watches its parent."""
    trace = _small_report_trace(tmp_path)
    code = "import sys; from cactus_theory._cli import main; sys.exit(main(sys.argv[1:]))"
    report = subprocess.Popen(
        [sys.executable, "-c", code, "report", "--trace", str(trace), "--out", str(tmp_path / "r"), "--quiet"]
    )
    side = _side_process_of(report.pid)
    report.send_signal(signum)
    report.wait(timeout=HANG_GUARD)
    deadline = time.monotonic() + HANG_GUARD
    while _running(side) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(side), "the second process outlived the report"
    assert not (tmp_path / "r").exists()  # nothing published by a killed report


_APPENDER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from cactus_theory.traces import TraceError
    from cactus_theory.traces import TraceWriter
    directory, who = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(int(who))
    done = 0
    while done < 12:
        try:
            writer = TraceWriter(directory, 30, top_k=4, shard_positions=1)
        except TraceError as exc:
            if "another process" not in str(exc):
                raise
            continue
        with writer:
            target = rng.normal(size=(3, 30))
            writer.add(f"{who}-{done}", "t", rng.integers(0, 30, size=3), target, target + 0.1)
        done += 1
    """
)


def test_writers_that_take_turns_on_one_directory_lose_nothing(tmp_path):
    d = tmp_path / "t"
    procs = [subprocess.Popen([sys.executable, "-c", _APPENDER, str(d), str(w)]) for w in range(3)]
    assert [p.wait(timeout=HANG_GUARD) for p in procs] == [0, 0, 0]
    trace = Trace(d, verify=True)  # every shard passes its checksum
    assert sorted(s["id"] for s in trace.manifest["sequences"]) == sorted(
        f"{w}-{i}" for w in range(3) for i in range(12)
    )
