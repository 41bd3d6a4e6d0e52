"""Trace sets, split dumps and merging, and the analysis on a real Dask cluster (LocalCluster with
worker processes over the loopback; no mocks), including a worker killed mid-run."""

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

from cactus_theory import (
    SamplingSettings,
    Trace,
    TraceError,
    TraceSet,
    analyze_trace,
    load_trace,
    merge_traces,
    parse_rules,
    prompt_part,
    select_part,
    synthesize_trace,
    trace_from_arrays,
)
from cactus_theory._cli import main
from cactus_theory._data._prompts import Prompt

SAMPLING = {"sampling": SamplingSettings(temperature=1.0, top_k=8, top_p=1.0).as_dict()}
RULES = ("sps", "cactus(delta=0.5)", "cactus-exact(delta=1)", "topk(k=3)")


def _metadata(**extra):
    return {
        "verifier": {"name": "v", "files": {"v.bin": {"sha256": "a" * 64, "bytes": 1}}},
        "draft": {"name": "d", "files": {"d.bin": {"sha256": "b" * 64, "bytes": 1}}},
        "tokenizer_sha256": "c" * 64,
        "seed": 0,
        **SAMPLING,
        **extra,
    }


def _logits(rng, n, vocab=40):
    target = rng.normal(size=(n, vocab)) * 2
    draft = target + rng.normal(size=(n, vocab))
    return draft, target, rng.integers(0, vocab, size=n)


def _trace(directory, seed, ids, tasks=None, metadata=None, lengths=None, shard_positions=None):
    rng = np.random.default_rng(seed)
    lengths = lengths or [int(x) for x in rng.integers(6, 15, size=len(ids))]
    draft, target, tokens = _logits(rng, sum(lengths))
    trace = trace_from_arrays(
        directory,
        draft,
        target,
        tokens,
        sequence_lengths=lengths,
        ids=ids,
        tasks=tasks or ["math" if i % 2 else "code" for i in range(len(ids))],
        top_k=16,
        metadata=metadata or _metadata(),
    )
    return trace


def _same_rows(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            assert x[key] == y[key] or (x[key] != x[key] and y[key] != y[key]), (key, x[key], y[key])


# --- prompt parts ----------------------------------------------------------------------------


def test_parts_are_disjoint_cover_every_prompt_and_depend_only_on_the_id():
    prompts = [Prompt(id=f"p-{i}", task="t", text="x", index=i) for i in range(300)]
    parts = [select_part(prompts, i, 4) for i in range(1, 5)]
    ids = [p.id for part in parts for p in part]
    assert sorted(ids) == sorted(p.id for p in prompts)
    assert all(40 <= len(part) <= 110 for part in parts)  # about 75 each
    assert [p.id for p in select_part(prompts[::-1], 2, 4)] == [p.id for p in parts[1]][::-1]
    assert prompt_part("p-7", 1) == 1
    with pytest.raises(ValueError, match=r"part must be an integer in 1\.\.4"):
        select_part(prompts, 5, 4)


# --- trace sets ----------------------------------------------------------------------------------


def test_a_trace_set_refuses_other_models_naming_the_field(tmp_path):
    _trace(tmp_path / "a", 0, ["a0", "a1"])
    other = _metadata()
    other["draft"] = {"name": "d", "files": {"d.bin": {"sha256": "e" * 64, "bytes": 1}}}
    _trace(tmp_path / "b", 1, ["b0"], metadata=other)
    with pytest.raises(TraceError, match="draft"):
        TraceSet([tmp_path / "a", tmp_path / "b"])
    sampling = _metadata(sampling=SamplingSettings(temperature=0.5, top_k=8).as_dict())
    _trace(tmp_path / "c", 2, ["c0"], metadata=sampling)
    with pytest.raises(TraceError, match="sampling"):
        TraceSet([str(tmp_path / "a"), str(tmp_path / "c")])
    with pytest.raises(TraceError, match="no trace directory matches"):
        TraceSet(str(tmp_path / "nothing-*"))


def test_a_trace_set_from_a_glob_keeps_per_trace_rows(tmp_path):
    _trace(tmp_path / "run-1", 0, ["x0", "x1", "x2"])
    _trace(tmp_path / "run-2", 1, ["x0", "y1"], metadata=_metadata(seed=7))  # ids may repeat, seeds differ
    result = analyze_trace(str(tmp_path / "run-*"), ["sps", "cactus(delta=1)"], ms=(2,), n_boot=100)
    assert result.traces == ["run-1", "run-2"]
    assert {r["trace"] for r in result.rows} == {"all"}
    by_trace = {(r["trace"], r["rule"]): r for r in result.trace_rows}
    assert set(by_trace) == {(t, r) for t in ("run-1", "run-2") for r in ("sps", "cactus(delta=1)")}
    # the pooled acceptance is the positions-weighted mean of the traces' (a ratio of sums)
    one, two = Trace(tmp_path / "run-1"), Trace(tmp_path / "run-2")
    for rule in ("sps", "cactus(delta=1)"):
        pooled = next(r for r in result.rows if r["rule"] == rule and r["task"] == "all")
        a, b = by_trace["run-1", rule], by_trace["run-2", rule]
        want = (a["acceptance"] * one.n_positions + b["acceptance"] * two.n_positions) / (
            one.n_positions + two.n_positions
        )
        assert pooled["acceptance"] == pytest.approx(want, rel=1e-12)
        assert pooled["positions"] == one.n_positions + two.n_positions
    assert len(result.sequences) == 5
    table = result.table(trace="run-2")
    assert "sps" in table and len(table.splitlines()) == 3


# --- merging --------------------------------------------------------------------------------------


def _parts(tmp_path, n=3):
    ids = [f"q-{i}" for i in range(12)]
    dirs = []
    for k in range(1, n + 1):
        mine = [i for i in ids if prompt_part(i, n) == k]
        d = tmp_path / f"part-{k}"
        _trace(d, k, mine, metadata=_metadata(part=f"{k}/{n}", created=f"2026-01-0{k}"))
        dirs.append(str(d))
    return dirs


def test_merged_trace_analyses_like_its_parts_as_a_set(tmp_path):
    dirs = _parts(tmp_path)
    merged = merge_traces(tmp_path / "merged", dirs)
    assert len(merged) == 12 and merged.n_positions == sum(Trace(d).n_positions for d in dirs)
    assert "part" not in merged.metadata
    assert [m["part"] for m in merged.metadata["merged_from"]] == ["1/3", "2/3", "3/3"]
    a = analyze_trace(merged, RULES, ms=(2, 4), n_boot=200)
    b = analyze_trace(list(reversed(dirs)), RULES, ms=(2, 4), n_boot=200)  # any order
    _same_rows(a.rows, b.rows)
    assert [s.id for s in a.sequences] == [s.id for s in b.sequences]
    # merging again into the same directory resumes: nothing is added twice
    again = merge_traces(tmp_path / "merged", dirs)
    assert len(again) == 12


def test_merge_refuses_overlaps_mismatches_and_its_own_input(tmp_path):
    dirs = _parts(tmp_path)
    _trace(tmp_path / "dup", 9, ["q-0"], metadata=_metadata(part="1/3"))
    with pytest.raises(TraceError, match="'q-0' is in both"):
        merge_traces(tmp_path / "m1", [*dirs, str(tmp_path / "dup")])  # q-0 is in one of the parts
    _trace(tmp_path / "seed", 9, ["z-0"], metadata=_metadata(seed=5, part="1/3"))
    with pytest.raises(TraceError, match="seed"):
        merge_traces(tmp_path / "m2", [dirs[0], str(tmp_path / "seed")])
    with pytest.raises(TraceError, match="also one of the parts"):
        merge_traces(dirs[0], dirs)
    assert not os.path.exists(tmp_path / "m2" / "manifest.json")


def test_cli_merge_and_analyze_a_glob(tmp_path, capsys):
    dirs = _parts(tmp_path)
    assert main(["merge", str(tmp_path / "part-*"), "--out", str(tmp_path / "all"), "--quiet"]) == 0
    assert "merged 12 sequences" in capsys.readouterr().out
    assert main(["analyze", str(tmp_path / "part-*"), "--rules", "sps", "--m", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "3 traces" in out and "trace part-2" in out
    assert main(["merge", dirs[0], dirs[0], "--out", str(tmp_path / "bad"), "--quiet"]) == 2


def test_dump_part_metadata_is_checked_on_resume(tmp_path):
    from cactus_theory._data._trace import TraceWriter

    with TraceWriter(tmp_path / "t", 10, metadata=_metadata(part="1/2")):
        pass
    with pytest.raises(TraceError, match="part"):
        TraceWriter(tmp_path / "t", 10, metadata=_metadata(part="2/2"))
    with pytest.raises(TraceError, match="part"):
        TraceWriter(tmp_path / "t", 10, metadata=_metadata())  # a whole dump into a part


# --- the synthetic generator ----------------------------------------------------------------------


def test_synthesized_trace_copies_source_rows_exactly(tmp_path):
    source = _trace(tmp_path / "src", 3, [f"s{i}" for i in range(6)])
    big = synthesize_trace(source, tmp_path / "big", 500, block=5, seed=1, shard_positions=128)
    assert big.n_positions == 500 and big.n_shards >= 4
    assert big.metadata["synthesized"]["block"] == 5
    rows = {}
    for seq in source:
        for j in range(seq.n_positions):
            rows[seq.topk_logits["target"][j].tobytes() + seq.topk_ids["draft"][j].tobytes()] = int(seq.tokens[j])
    for seq in big:
        for j in range(seq.n_positions):
            key = seq.topk_logits["target"][j].tobytes() + seq.topk_ids["draft"][j].tobytes()
            assert rows[key] == int(seq.tokens[j])  # every row is a source row, token included
    again = synthesize_trace(source, tmp_path / "again", 500, block=5, seed=1, shard_positions=128)
    assert [s.tokens.tolist() for s in again] == [s.tokens.tolist() for s in big]


# --- Dask ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dask_client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", host="127.0.0.1")
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.mark.distributed
def test_dask_analysis_equals_the_single_process_path_bit_for_bit(dask_client, tmp_path):
    dirs = _parts(tmp_path)
    local = analyze_trace(dirs, RULES, ms=(2, 4), n_boot=300, seed=3)
    remote = analyze_trace(dirs, RULES, ms=(2, 4), n_boot=300, seed=3, client=dask_client)
    _same_rows(local.rows, remote.rows)
    _same_rows(local.trace_rows, remote.trace_rows)
    assert json.dumps([s.as_dict() for s in local.sequences], sort_keys=True) == json.dumps(
        [s.as_dict() for s in remote.sequences], sort_keys=True
    )
    with pytest.raises(ValueError, match="either client"):
        analyze_trace(dirs, RULES, client=dask_client, processes=2)


@pytest.mark.distributed
def test_a_worker_killed_mid_run_loses_and_double_counts_nothing(dask_client, tmp_path):
    trace = load_trace()
    rules = parse_rules("sps,cactus,cactus-exact,mentored", (0.5, 1.0))
    want = analyze_trace(trace, rules, ms=(4, 8), n_boot=200)
    pids = dask_client.run(os.getpid)

    def states(dask_scheduler):
        return [ts.state for key, ts in dask_scheduler.tasks.items() if "shard_statistics" in str(key)]

    killed = {}

    def killer():
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            s = dask_client.run_on_scheduler(states)
            if s.count("memory") >= 1 and s.count("processing") >= 1:
                busy = dask_client.processing()
                victim = next((w for w, keys in busy.items() if keys), None)
                if victim is not None:
                    os.kill(pids[victim], signal.SIGKILL)
                    killed.update(worker=victim, states=s)
                    return
            time.sleep(0.02)

    thread = threading.Thread(target=killer)
    thread.start()
    got = analyze_trace(trace, rules, ms=(4, 8), n_boot=200, client=dask_client)
    thread.join()
    assert killed, "the run finished before a worker could be killed mid-run"
    assert set(dask_client.run(os.getpid).values()) != set(pids.values())  # the nanny restarted it
    _same_rows(want.rows, got.rows)
    assert [s.id for s in got.sequences] == sorted(s.id for s in trace)  # each sequence once


@pytest.mark.distributed
def test_cli_workers_runs_a_local_cluster(tmp_path, capsys):
    dirs = _parts(tmp_path)
    out = tmp_path / "res"
    args = ["analyze", *dirs, "--rules", "sps,cactus", "--delta", "1", "--m", "2", "--quiet", "--no-figures"]
    assert main([*args, "--workers", "2", "--out", str(out)]) == 0
    assert main([*args, "--out", str(tmp_path / "ref")]) == 0
    assert (out / "analysis.csv").read_text() == (tmp_path / "ref" / "analysis.csv").read_text()
    assert main([*args, "--workers", "2", "--processes", "2"]) == 2
    capsys.readouterr()
