"""Gated relaxation (issue 33, item 3): a relaxed rule only where a gate is open, the lossless
rule elsewhere, in the analysis, the simulator, the planner's analysis and real decoding; each
against the rule and SpS computed separately and mixed position by position here."""

import numpy as np
import pytest

from cactus_theory import analyze_trace, expected_accepted_length, make_rule, simulate, step_metrics
from cactus_theory._cli import main
from cactus_theory._laws._gate import FunctionGate, RegionGate, make_gate
from cactus_theory.traces import trace_from_arrays


def _loop_mask(tokens, opens, closes, start=False):
    state, out = start, []
    for t in tokens:
        out.append(state)
        if t in opens:
            state = True
        elif t in closes:
            state = False
    return np.array(out, dtype=bool)


def test_region_gate_mask_is_the_state_before_each_token():
    rng = np.random.default_rng(0)
    for _ in range(50):
        tokens = rng.integers(0, 6, size=int(rng.integers(0, 40)))
        for start in (False, True):
            gate = RegionGate(open_ids=(1, 2), close_ids=(3,), start_inside=start)
            np.testing.assert_array_equal(gate.mask(tokens), _loop_mask(tokens, {1, 2}, {3}, start))
            for cut in range(len(tokens) + 1):  # decoding asks the state after each prefix
                want = _loop_mask([*tokens[:cut], 0], {1, 2}, {3}, start)[-1]
                assert gate.inside_after(tokens[:cut]) == want


def test_make_gate_reads_specs_and_refuses_bad_ones():
    assert make_gate("7:8") == RegionGate((7,), (8,))
    assert make_gate("7;9:8:inside") == RegionGate((7, 9), (8,), start_inside=True)
    assert make_gate(None) is None
    assert isinstance(make_gate(lambda prev: True), FunctionGate)
    for bad, word in (
        ("7", "OPEN:CLOSE"),
        ("7:x", "token ids"),
        ("7:7", "both open and close"),
        ("7:8:maybe", "OPEN:CLOSE"),
        (3.5, "gate must be"),
    ):
        with pytest.raises(ValueError, match=word):
            make_gate(bad)
    with pytest.raises(ValueError, match="fallback"):
        RegionGate((1,), (2,), fallback="cactus")


def _trace(tmp_path, marks=True):
    rng = np.random.default_rng(3)
    vocab, lengths = 24, [40, 40, 40]
    target = rng.normal(size=(sum(lengths), vocab)) * 2
    tokens = rng.integers(0, vocab, size=sum(lengths))
    if marks:  # regions opened by 20, closed by 21
        tokens[[3, 50, 90]] = 20
        tokens[[15, 70]] = 21
    trace = trace_from_arrays(
        tmp_path / "t",
        target + rng.normal(size=target.shape),
        target,
        tokens,
        sequence_lengths=lengths,
        top_k=vocab,
        metadata={"sampling": {"temperature": 1.0, "top_k": vocab, "top_p": 1.0}},
    )
    return trace, tokens, lengths


def test_the_analysis_mixes_the_rule_and_sps_position_by_position(tmp_path):
    trace, tokens, lengths = _trace(tmp_path)
    gate = RegionGate((20,), (21,))
    result = analyze_trace(trace, ["sps", "cactus(delta=1)", "block"], ms=(4,), n_boot=100, gate=gate)
    plain = analyze_trace(trace, ["cactus(delta=1)"], ms=(4,), n_boot=100)
    row = {r["rule"]: r for r in result.rows if r["task"] == "all"}
    # by hand: each sequence's rows, the mask from its own tokens, the two rules' per-position laws
    from cactus_theory import SamplingSettings

    acc, kl, al, starts, held = [], [], 0.0, 0, 0
    bounds = np.cumsum([0, *lengths])
    for seq, a, b in zip(trace, bounds[:-1], bounds[1:], strict=True):
        p, q = seq.distributions(SamplingSettings(temperature=1.0, top_k=24, top_p=1.0))
        mask = _loop_mask(tokens[a:b], {20}, {21})
        held += int(mask.sum())
        relaxed, base = step_metrics("cactus(delta=1)", p, q), step_metrics("sps", p, q)
        beta = np.where(mask, relaxed.acceptance, base.acceptance)
        acc.append(beta)
        kl.append(np.where(mask, relaxed.kl_emitted_target, base.kl_emitted_target))
        lengths_here = expected_accepted_length(beta, 4)[: len(beta) - 3]
        al += lengths_here.sum()
        starts += lengths_here.size
    assert 0 < held < sum(lengths)
    assert row["cactus(delta=1)"]["acceptance"] == pytest.approx(np.concatenate(acc).mean(), abs=1e-12)
    assert row["cactus(delta=1)"]["kl_emitted_target"] == pytest.approx(np.concatenate(kl).mean(), abs=1e-12)
    assert row["cactus(delta=1)"]["al"] == pytest.approx(al / starts, abs=1e-12)
    plain_row = next(r for r in plain.rows if r["task"] == "all")
    assert row["sps"]["al"] < row["cactus(delta=1)"]["al"] < plain_row["al"]  # the gate costs AL, saves drift
    assert row["block"]["al"] == pytest.approx(
        next(r for r in analyze_trace(trace, ["block"], ms=(4,), n_boot=100).rows if r["task"] == "all")["al"]
    )  # lossless rules are not gated
    assert any(f"{held} of {sum(lengths)} positions" in note for note in result.notes)


def test_an_open_or_closed_gate_is_the_rule_or_sps(tmp_path):
    trace, _, _ = _trace(tmp_path)
    rule = "cactus(delta=1)"
    ungated = analyze_trace(trace, [rule, "sps"], ms=(4, 8), n_boot=100)
    always = analyze_trace(trace, [rule], ms=(4, 8), n_boot=100, gate=FunctionGate(lambda prev: True, "open"))
    never = analyze_trace(trace, [rule], ms=(4, 8), n_boot=100, gate=FunctionGate(lambda prev: False, "shut"))
    pick = {(r["rule"], r["m"], r["task"]): r for r in ungated.rows}
    for r in always.rows:
        assert r["al"] == pick[r["rule"], r["m"], r["task"]]["al"]
        assert r["kl_per_token"] == pick[r["rule"], r["m"], r["task"]]["kl_per_token"]
    for r in never.rows:
        assert r["al"] == pytest.approx(pick["sps", r["m"], r["task"]]["al"], abs=1e-12)
        assert r["kl_emitted_target"] == pick["sps", r["m"], r["task"]]["kl_emitted_target"]


def test_a_gate_refuses_block_multi_draft_and_slot_rules(tmp_path):
    trace, _, _ = _trace(tmp_path)
    for spec in ("magic-mtp", "fly", "synthetic"):
        with pytest.raises(ValueError, match="a gate switches rules position by position"):
            analyze_trace(trace, [spec], ms=(4,), n_boot=100, gate="20:21")


def test_the_simulator_under_a_region_agrees_with_the_exact_mix():
    rng = np.random.default_rng(5)
    p, q = rng.dirichlet(np.ones(6), size=30), rng.dirichlet(np.ones(6) * 0.5, size=30)
    region = rng.random(30) < 0.5
    rule = make_rule("lossy(alpha=0.7)")
    sim = simulate(rule, p, q, m=3, n_runs=20_000, seed=1, region=region)
    beta = np.where(region, step_metrics(rule, p, q).acceptance, step_metrics("sps", p, q).acceptance)
    exact = expected_accepted_length(beta, 3)
    diff = sim.accepted - exact[sim.block_start]
    assert abs(diff.mean()) < 4.5 * diff.std() / np.sqrt(diff.size)
    # the emitted law at a closed position is q (SpS): its frequencies within 5 standard errors
    for closed in np.flatnonzero(~region[:20])[:3]:
        counts = sim.emitted_counts[closed]
        se = np.sqrt(q[closed] * (1 - q[closed]) / counts.sum())
        assert np.all(np.abs(counts / counts.sum() - q[closed]) < 5 * se + 1e-3)
    with pytest.raises(ValueError, match="one bool per position"):
        simulate(rule, p, q, m=3, n_runs=10, region=region[:5])


def test_cli_gate_option(capsys):
    assert main(["analyze", "--rules", "cactus(delta=1)", "--gate", "20:21", "--bootstrap", "100"]) == 0
    assert "gated by region(open=20, close=21)" in capsys.readouterr().out
    assert main(["analyze", "--rules", "cactus(delta=1)", "--gate", "20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--gate" in err[0]


def test_gate_ids_outside_the_traces_vocabulary_are_refused(capsys):
    """Issue 43, item 19: --gate 999999999:999999998 on a 151,936-token trace silently made the gated rule SpS."""
    from cactus_theory import load_trace

    with pytest.raises(ValueError, match=r"999999998, 999999999 are outside the trace's vocabulary \(0 to 151935\)"):
        analyze_trace(load_trace(), ["cactus"], ms=(2,), n_boot=0, gate="999999999:999999998")
    assert main(["analyze", "--gate", "151936:13", "--rules", "cactus", "--m", "2", "--quiet"]) == 2
    assert "token id(s) 151936 are outside" in capsys.readouterr().err
    analyze_trace(load_trace(), ["cactus"], ms=(2,), n_boot=0, gate="151935:13", tasks=["gsm8k"])  # the last id: fine


def test_a_negative_seed_is_refused_naming_the_seed():
    """Issue 43, item 22: simulate with a negative seed said "expected non-negative integer" without naming it."""
    from cactus_theory import SpS
    from cactus_theory.laws import synthetic_pairs, worst_case_drift

    p = np.array([[0.5, 0.5]] * 3)
    calls = (
        lambda seed: simulate(SpS(), p, p, 1, seed=seed),
        lambda seed: synthetic_pairs(n_positions=4, vocab_size=4, seed=seed),
        lambda seed: worst_case_drift(SpS(), 3, n_random=4, seed=seed),
    )
    for call in calls:
        for bad in (-1, 1.5, "7", True):
            with pytest.raises(ValueError, match=r"seed must be an integer >= 0 \(or a numpy Generator\); got"):
                call(bad)
    # a Generator is used as it is: the same stream gives the same runs
    a = simulate(SpS(), p, p, 1, seed=np.random.default_rng(3))
    b = simulate(SpS(), p, p, 1, seed=3)
    assert a.accepted_length == b.accepted_length
