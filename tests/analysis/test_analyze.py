"""The analysis's edge cases: empty sequences change no number, one sequence gives no interval, a handful
of resamples is refused, an m longer than every sequence is analysed as that length and said, and bad
arguments are named."""

import json

import numpy as np
import pytest
from trace_builders import random_trace, trace_metadata

from cactus_theory import analyze_trace
from cactus_theory._cli import main
from cactus_theory._data._trace_writer import TraceWriter
from cactus_theory.compare import compare_multi_draft
from cactus_theory.traces import Trace


def _with_empty(directory, n_real, n_empty, seed=0):
    rng = np.random.default_rng(seed)
    with TraceWriter(directory, 40, top_k=16, metadata=trace_metadata()) as writer:
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


def test_a_handful_of_resamples_is_refused_not_printed_as_an_interval(tmp_path, capsys):
    random_trace(tmp_path / "t", 0, ["a", "b", "c", "d"])
    for value in ("1", "99", "100000000000"):
        with pytest.raises(SystemExit) as info:
            main(["analyze", str(tmp_path / "t"), "--bootstrap", value, "--quiet"])
        err = capsys.readouterr().err
        assert info.value.code == 2 and len(err.strip().splitlines()) == 1
        assert "--bootstrap" in err and "resamples" in err and "Traceback" not in err
    with pytest.raises(ValueError, match=r"n_boot must be 0 \(no intervals\) or between 100"):
        analyze_trace(tmp_path / "t", ["sps"], ms=(2,), n_boot=1)
    rows = analyze_trace(tmp_path / "t", ["sps"], ms=(2,), n_boot=100).rows
    assert all(r["al_lo"] <= r["al"] <= r["al_hi"] for r in rows)


def test_an_m_longer_than_every_sequence_is_analysed_as_that_length_and_said(tmp_path, capsys):
    random_trace(tmp_path / "t", 0, ["a", "b", "c"], lengths=[30, 50, 80])
    big = analyze_trace(tmp_path / "t", ["sps", "cactus"], ms=(4, 1_000_000), n_boot=0)
    exact = analyze_trace(tmp_path / "t", ["sps", "cactus"], ms=(4, 80), n_boot=0)
    assert big.ms == (4, 80) and any("m = 1000000 is longer than the longest sequence (80" in n for n in big.notes)
    for a, b in zip(big.rows, exact.rows, strict=True):
        assert a["m"] == b["m"] and a["al"] == b["al"] and a["kl_per_token"] == b["kl_per_token"]
    assert (
        main(["analyze", str(tmp_path / "t"), "--m", "1000000", "--rules", "sps", "--bootstrap", "0", "--quiet"]) == 0
    )
    assert "analysed as m = 80" in capsys.readouterr().out


def test_function_arguments_are_named_when_wrong(tmp_path):
    random_trace(tmp_path / "t", 0, ["a", "b"])
    with pytest.raises(ValueError, match="ms is empty"):
        analyze_trace(tmp_path / "t", ["sps"], ms=())
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        analyze_trace(tmp_path / "t", ["sps"], ms=(2,), seed=-1)
    for kwargs, match in (
        ({"k_bins": 0}, "k_bins"),
        ({"methods": ["nope"]}, "methods must be"),
        ({"methods": [("x", "sps", "c")]}, "must be a multi-draft rule"),
        ({"n_boot": -1}, "n_boot"),
        ({"ks": ()}, "ks must be a non-empty"),
    ):
        with pytest.raises(ValueError, match=match):
            compare_multi_draft(tmp_path / "t", ms=(2,), **kwargs)
    from cactus_theory._data._prompts import prompt_seed

    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        prompt_seed(-1, "a")


def test_llama_servers_policy_needs_the_drafters_top_10_stored(tmp_path):
    """llama.cpp's stop reads the drafter's top-10: a trace of K = 5 is refused, naming the K it needs."""
    from cactus_theory import SamplingSettings, analyze_trace
    from cactus_theory._data._trace_import import trace_from_arrays

    rng = np.random.default_rng(0)
    target = rng.normal(size=(40, 30))
    for k in (5, 12):
        trace_from_arrays(
            tmp_path / f"k{k}",
            target + rng.normal(size=target.shape),
            target,
            rng.integers(0, 30, 40),
            sequence_lengths=[20, 20],
            top_k=k,
            metadata={"sampling": SamplingSettings(1.0, 5, 1.0).as_dict()},
        )
    with pytest.raises(ValueError, match=r"reads the drafter's top-10, .* stores K = 5 .* --top-logits 10 or more"):
        analyze_trace(tmp_path / "k5", ["sps"], ms=(2,), draft_policies=["llama.cpp(0.5)"], n_boot=0, progress=False)
    result = analyze_trace(
        tmp_path / "k12", ["sps"], ms=(2,), draft_policies=["llama.cpp(0.5)"], n_boot=0, progress=False
    )
    assert any(r.get("draft_policy") for r in result.rows)
