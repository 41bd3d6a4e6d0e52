"""Integrity, second round (issue 20): the directory lock under contention, merge semantics,
trace sets that would count data twice, the planner's arithmetic on any cost file, schedulers
that do not answer, output locations checked before the work, messages for bad prompt files, and
numbers that must not mislead (empty sequences, one sequence, delta = inf)."""

import gzip
import itertools
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cluster import _metadata, _parts, _trace

from cactus_theory import (
    CostModel,
    Trace,
    TraceError,
    TraceSet,
    analyze_trace,
    exact_gamma,
    load_cost,
    load_prompts,
    make_rule,
    merge_traces,
    step_metrics,
)
from cactus_theory._analysis._engines import connect_scheduler
from cactus_theory._cli import main
from cactus_theory._data._trace import TraceWriter
from cactus_theory._util._files import check_output

# --- 1. the directory lock ------------------------------------------------------------------------

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
    overlaps = [int(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert overlaps == [0, 0, 0, 0]


_APPENDER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from cactus_theory import TraceError
    from cactus_theory._data._trace import TraceWriter
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
    assert [p.wait(timeout=180) for p in procs] == [0, 0, 0]
    trace = Trace(d, verify=True)  # every shard passes its checksum
    assert sorted(s["id"] for s in trace.manifest["sequences"]) == sorted(
        f"{w}-{i}" for w in range(3) for i in range(12)
    )


# --- 2. merge ---------------------------------------------------------------------------------------


def test_merge_needs_an_explicit_output(tmp_path, capsys):
    a = _trace(tmp_path / "wa", 1, ["a-0"], metadata=_metadata(part="1/2"))
    b = _trace(tmp_path / "wb", 2, ["b-0"], metadata=_metadata(part="2/2"))
    with pytest.raises(SystemExit) as exc:
        main(["merge", a.directory, b.directory, "--quiet"])  # used to merge wb into wa
    assert exc.value.code == 2 and "--out" in capsys.readouterr().err
    assert len(Trace(a.directory)) == 1


def test_merge_refuses_an_existing_trace_that_no_merge_wrote(tmp_path):
    dirs = _parts(tmp_path)
    other = _trace(tmp_path / "other", 7, ["o-0"])
    with pytest.raises(TraceError, match="no merge wrote"):
        merge_traces(other.directory, dirs)
    assert len(Trace(other.directory)) == 1


def test_a_merge_rerun_resumes_only_the_same_parts(tmp_path):
    dirs = _parts(tmp_path)
    merge_traces(tmp_path / "m", dirs)
    assert len(merge_traces(tmp_path / "m", dirs)) == 12  # the same parts: resumes, adds nothing
    extra = _trace(tmp_path / "x", 5, ["x-0"], metadata=_metadata(part="1/3"))
    with pytest.raises(TraceError, match=r"other parts .*not given now: part 1/3.*new or changed since: part 1/3"):
        merge_traces(tmp_path / "m", [extra.directory, dirs[1], dirs[2]])
    with pytest.raises(TraceError, match="not given now: part 3/3"):
        merge_traces(tmp_path / "m", dirs[:2], allow_partial=True)
    assert len(Trace(tmp_path / "m")) == 12


def test_merge_refuses_incomplete_or_mixed_splits_unless_allowed(tmp_path):
    dirs = _parts(tmp_path)  # parts 1/3, 2/3, 3/3
    with pytest.raises(TraceError, match=r"part\(s\) 2/3 are missing"):
        merge_traces(tmp_path / "m1", [dirs[0], dirs[2]])
    other = _trace(tmp_path / "n50", 11, ["w-0"], metadata=_metadata(part="1/50"))
    with pytest.raises(TraceError, match="splits into 3 and 50 parts"):
        merge_traces(tmp_path / "m2", [*dirs, other.directory])
    whole = _trace(tmp_path / "whole", 12, ["v-0"])
    with pytest.raises(TraceError, match="is a whole dump"):
        merge_traces(tmp_path / "m3", [*dirs, whole.directory])
    twice = _trace(tmp_path / "twice", 13, ["u-0"], metadata=_metadata(part="2/3"))
    with pytest.raises(TraceError, match="are both part 2/3"):
        merge_traces(tmp_path / "m4", [*dirs, twice.directory])
    merged = merge_traces(tmp_path / "m5", [dirs[0], dirs[2]], allow_partial=True)
    assert merged.metadata["partial"]["missing"] == ["2/3"]
    assert not os.path.exists(tmp_path / "m1")


def test_cli_merge_partial_and_bad_parts(tmp_path, capsys):
    dirs = _parts(tmp_path)
    assert main(["merge", dirs[0], "--out", str(tmp_path / "m"), "--quiet"]) == 2
    assert "part(s) 2/3, 3/3 are missing" in capsys.readouterr().err
    assert main(["merge", dirs[0], "--out", str(tmp_path / "m"), "--allow-partial", "--quiet"]) == 0
    assert "partial" in capsys.readouterr().out
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["merge", str(afile), "--out", str(tmp_path / "m2"), "--quiet"]) == 2
    assert "is not a trace directory (it is a file)" in capsys.readouterr().err


# --- 3. trace sets ------------------------------------------------------------------------------------


def test_a_trace_set_counts_a_directory_once_however_it_is_spelled(tmp_path, monkeypatch):
    dirs = _parts(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TraceError, match="given twice"):
        TraceSet(["part-1", os.path.realpath("part-1")])
    os.symlink(tmp_path / "part-1", tmp_path / "part-9")  # a link inside the glob
    with pytest.raises(TraceError, match="given twice"):
        TraceSet([str(tmp_path / "part-*")])
    os.remove(tmp_path / "part-9")
    assert len(TraceSet([str(tmp_path / "part-*")]).traces) == 3
    assert dirs


def test_a_trace_set_refuses_a_merge_beside_its_parts_and_copies(tmp_path):
    import shutil

    dirs = _parts(tmp_path)
    merge_traces(tmp_path / "part-merged", dirs)
    with pytest.raises(TraceError, match=r"merged from .* count its sequences twice"):
        analyze_trace(str(tmp_path / "part-*"), ["sps"], ms=(2,), n_boot=0)
    shutil.copytree(dirs[0], tmp_path / "copy")
    with pytest.raises(TraceError, match="hold the same sequences"):
        TraceSet([dirs[0], str(tmp_path / "copy")])


# --- 4. the planner -------------------------------------------------------------------------------------

_times = st.floats(min_value=0.0, max_value=1e3, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    first=st.floats(min_value=1e-6, max_value=1e3),
    others=st.dictionaries(st.integers(2, 64), _times, max_size=8),
    draft=_times,
    overhead=_times,
    judge=_times,
    m=st.integers(1, 100),
    share=st.floats(0.0, 1.0),
)
def test_a_predicted_speedup_is_finite_positive_and_at_most_al_plus_one(
    first, others, draft, overhead, judge, m, share
):
    # any valid cost file: verify times may fall with the block size (noisy or flat GPU profiles)
    cost = CostModel(draft_token=draft, verify_block={1: first, **others}, step_overhead=overhead, judge_token=judge)
    al = share * m
    speedup = float(cost.speedup(m, al))
    assert np.isfinite(speedup) and speedup > 0
    assert speedup <= (al + 1) * (1 + 1e-12)
    fit = list(cost.verify_fit.values())
    assert all(a <= b for a, b in itertools.pairwise(fit))  # the fit never falls


def test_falling_verify_times_no_longer_give_infinite_or_negative_speedups():
    # the case: 2.06, inf, -2.06, -1.03 from an extrapolation with a negative slope
    cost = CostModel(draft_token=0.01, verify_block={1: 1.0, 9: 0.5})
    assert cost.non_monotone == [9]
    assert cost.verify_fit == {1: 0.75, 9: 0.75}  # the isotonic fit pools the two
    speedups = [float(cost.speedup(m, m * 0.8)) for m in (2, 9, 20, 40)]
    assert all(np.isfinite(s) and 0 < s for s in speedups)


def _cost_file(tmp_path, text):
    path = tmp_path / "cost.json"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"draft_token": 0.1, "verify_block": {"1": 1}, "source": "x"}', "source must be an object"),
        ('{"draft_token": ' + "9" * 400 + ', "verify_block": {"1": 1}}', "draft_token must be finite.*400 digits"),
        ('{"draft_token": 0.1, "verify_block": {"1": 1, " 1": 2}}', r"block sizes .*got ' 1'"),
        ('{"draft_token": 0.1, "verify_block": {"1": 1, "1": 2}}', "the key '1' appears twice"),
        ('{"draft_token": 1e999, "verify_block": {"1": 1}}', "draft_token must be finite"),
    ],
)
def test_bad_cost_files_are_refused_naming_the_file(tmp_path, text, match):
    path = _cost_file(tmp_path, text)
    with pytest.raises(ValueError, match=match) as exc:
        load_cost(path)
    assert path in str(exc.value)


def test_a_huge_cost_file_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "cost.json"
    with open(path, "wb") as fh:
        fh.truncate(100 << 20)  # sparse: 100 MB that take no disk
    with pytest.raises(ValueError, match="a cost file is a few kB") as exc:
        load_cost(str(path))
    assert len(str(exc.value)) < 300


@pytest.mark.parametrize("option", [["--cost-ratio", "inf"], ["--cost-ratio", "0.1", "--max-kl", "inf"]])
def test_infinite_plan_options_are_refused_before_the_analysis(option, capsys):
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exc:
        main(["plan", *option, "--quiet"])
    assert exc.value.code == 2 and "finite" in capsys.readouterr().err
    assert time.perf_counter() - start < 5


# --- 5. hangs and late failures ----------------------------------------------------------------------


@pytest.mark.distributed
def test_a_listener_that_is_not_a_scheduler_fails_within_the_timeout():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held = []
    threading.Thread(target=lambda: held.extend(server.accept() for _ in range(4)), daemon=True).start()
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match="not a Dask scheduler"):
        connect_scheduler(f"tcp://127.0.0.1:{server.getsockname()[1]}", timeout=2)
    assert time.perf_counter() - start < 10
    server.close()


@pytest.mark.distributed
def test_a_refused_or_malformed_scheduler_address_fails_at_once(capsys):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    start = time.perf_counter()
    assert main(["analyze", "--scheduler", f"tcp://127.0.0.1:{port}", "--rules", "sps", "--quiet"]) == 1
    assert "connection refused" in capsys.readouterr().err
    assert time.perf_counter() - start < 10
    assert main(["analyze", "--scheduler", "inproc://x", "--rules", "sps", "--quiet"]) == 2
    assert "tcp://HOST:PORT" in capsys.readouterr().err


def _cannot_write(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    return str(blocker / "out")  # below a file: no one can make it, root included


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "--out", "{bad}"],
        ["analyze", "--out", "{bad}", "--rules", "sps"],
        ["plan", "--cost-ratio", "0.1", "--out", "{bad}"],
        ["merge", "{part}", "--out", "{bad}"],
        ["dump", "--verifier", "nowhere", "--draft", "nowhere", "--prompts", "{prompts}", "--out", "{bad}"],
        ["calibrate", "--verifier", "nowhere", "--draft", "nowhere", "--out", "{dir}"],
        ["decode", "--verifier", "nowhere", "--draft", "nowhere", "--prompt", "hi", "--out", "{dir}"],
    ],
)
def test_every_command_checks_its_output_location_before_the_work(tmp_path, argv, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    values = {"bad": _cannot_write(tmp_path), "dir": str(tmp_path), "part": str(tmp_path), "prompts": str(prompts)}
    start = time.perf_counter()
    assert main([a.format(**values) for a in argv] + ["--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and ("is a file" in err or "is a directory" in err)
    assert time.perf_counter() - start < 5  # nothing was computed (the report takes a minute)


def test_check_output_refuses_what_cannot_be_written_and_leaves_nothing(tmp_path):
    assert check_output(tmp_path / "new" / "deeper") == str(tmp_path / "new" / "deeper")
    assert os.listdir(tmp_path) == []  # the probe is gone, nothing was created
    with pytest.raises(ValueError, match="is a directory"):
        check_output(tmp_path, directory=False)
    if os.path.isdir("/proc/self"):
        with pytest.raises(ValueError, match="cannot be written"):
            check_output("/proc/cannot/write")


# --- 6. messages --------------------------------------------------------------------------------------


def test_prompt_files_with_bad_bytes_name_the_file_and_line(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes("first\nsecond caf\xe9 line\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"p.txt, line 2, column 11: byte 0xe9 is not UTF-8"):
        load_prompts(path)


def test_a_truncated_gzip_prompt_file_says_so(tmp_path):
    data = gzip.compress(b'{"prompt": "a"}\n' * 50)
    path = tmp_path / "p.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"p\.jsonl\.gz: the gzip file is truncated"):
        load_prompts(path)


def test_a_byte_order_mark_is_not_part_of_a_header_or_a_prompt(tmp_path):
    csv_path = tmp_path / "p.csv"
    csv_path.write_bytes("\ufeffprompt,other\nhello,1\n".encode())
    assert [p.text for p in load_prompts(csv_path)] == ["hello"]
    txt_path = tmp_path / "q.txt"
    txt_path.write_bytes("\ufeffhello\r\nworld\r\n".encode())
    assert [p.text for p in load_prompts(txt_path)] == ["hello", "world"]


def test_pipes_are_read_and_directories_named(tmp_path):
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("one\ntwo\n"))
    writer.start()
    assert [p.text for p in load_prompts(fifo)] == ["one", "two"]
    writer.join()
    with pytest.raises(ValueError, match="is a directory"):
        load_prompts(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        load_prompts(tmp_path / "missing.txt")


def test_a_lone_surrogate_is_refused_where_it_is_read(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": "bad \\ud800 text"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl, line 2: .*unpaired surrogate"):
        load_prompts(path)


def test_a_checksum_failure_names_the_trace_directory(tmp_path):
    trace = _trace(tmp_path / "t", 1, ["a", "b"])
    shard = os.path.join(trace.directory, trace.manifest["shards"][0]["file"])
    with open(shard, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 1]))
    with pytest.raises(TraceError, match=r"shard-00000.safetensors of '.*/t' fails its sha256"):
        Trace(trace.directory)


# --- 7. numbers that mislead -------------------------------------------------------------------------


def _with_empty(directory, n_real, n_empty, seed=0):
    rng = np.random.default_rng(seed)
    with TraceWriter(directory, 40, top_k=16, metadata=_metadata()) as writer:
        for i in range(n_empty):
            writer.add(f"e-{i}", "t", np.zeros(0, dtype=int), np.zeros((0, 40)), np.zeros((0, 40)))
        for i in range(n_real):
            target = rng.normal(size=(9, 40)) * 2
            writer.add(f"r-{i}", "t", rng.integers(0, 40, size=9), target, target + rng.normal(size=(9, 40)))
    return Trace(directory)


def test_empty_sequences_do_not_change_the_numbers(tmp_path):
    with_empty = analyze_trace(_with_empty(tmp_path / "a", 3, 3), ["sps"], ms=(4,), n_boot=100)
    without = analyze_trace(_with_empty(tmp_path / "b", 3, 0), ["sps"], ms=(4,), n_boot=100)
    for key in ("al", "al_lo", "al_hi", "acceptance", "positions", "sequences"):
        assert with_empty.rows[0][key] == without.rows[0][key], key
    assert with_empty.empty_sequences == 3
    with pytest.raises(ValueError, match="all empty: nothing to analyse"):
        analyze_trace(_with_empty(tmp_path / "c", 0, 3), ["sps"], ms=(4,))


def test_one_sequence_gives_no_interval_rather_than_a_zero_width_one(tmp_path, capsys):
    trace = _with_empty(tmp_path / "one", 1, 0)
    row = analyze_trace(trace, ["sps"], ms=(4,), n_boot=100).rows[0]
    assert np.isnan(row["al_lo"]) and np.isnan(row["al_hi"]) and np.isfinite(row["al"])
    assert main(["analyze", trace.directory, "--rules", "sps", "--m", "4", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "n/a (1 seq)" in out and "needs at least two sequences" in out
    assert (
        main(["analyze", trace.directory, "--rules", "sps", "--m", "4", "--quiet", "--out", str(tmp_path / "o")]) == 0
    )
    rows = json.loads((tmp_path / "o" / "analysis.json").read_text())["rows"]  # strict JSON: null, not NaN
    assert rows[0]["al_lo"] is None


@pytest.mark.parametrize("spec", ["cactus(delta=inf)", "cactus-exact(delta=inf)", "cactus(delta=inf, bonus=safe)"])
def test_cactus_with_an_infinite_budget_still_rejects_what_the_verifier_excludes(spec):
    draft = np.array([0.5, 0.3, 0.2, 0.0])
    target = np.array([0.0, 0.5, 0.0, 0.5])
    metrics = step_metrics(make_rule(spec), draft, target)
    assert metrics.acceptance_outside_support == 0.0
    assert metrics.acceptance == pytest.approx(0.3)  # every token with q > 0 is accepted
    assert metrics.kl_emitted_target < np.inf
    assert float(exact_gamma(0.0, np.inf)) == 0.0 and float(exact_gamma(1e-300, np.inf)) == 1.0
    assert float(exact_gamma(0.0, np.inf, "tv")) == 1.0  # TV: B(gamma; 0) = gamma is finite, the limit is 1
