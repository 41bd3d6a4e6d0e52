"""The cost model, predicted speedups and the plan, against closed forms; calibration on tiny
random models; the CLI."""

import json
import math
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cactus_theory import CostModel, SamplingSettings, analyze_trace, predict_speedup
from cactus_theory._analysis._plan import Plan
from cactus_theory._cli import main
from cactus_theory.plan import calibrate_cost, load_cost
from cactus_theory.traces import trace_from_arrays

VOCAB = 12


def _constant_trace(directory, p, q, positions=60, sequences=3):
    """Every position has the same (p, q): SpS accepts each draft with beta = 1 - TV(p, q)."""
    draft = np.tile(np.log(p), (positions * sequences, 1))
    target = np.tile(np.log(q), (positions * sequences, 1))
    tokens = np.zeros(positions * sequences, dtype=int)
    meta = {"sampling": SamplingSettings(temperature=1.0, top_k=0, top_p=1.0).as_dict()}
    return trace_from_arrays(
        directory, draft, target, tokens, sequence_lengths=[positions] * sequences, top_k=VOCAB, metadata=meta
    )


def _steps_by_hand(beta, n, m):
    """The steps decoding a sequence of n positions at constant acceptance beta takes from position 1 while a
    whole block fits (to n - m), written out (a memo over positions): (steps, accepted drafts, draft forwards,
    steps by drafted length L = 0..m). A step at t drafts min(m, n - t), accepts A with P(A >= j) = beta^j, moves
    to t + 1 + A; a block of m drafts all accepted runs one more draft forward."""
    memo = {}
    for t in range(n - m, 0, -1):
        length = min(m, n - t)
        law = [beta**a * (1 - beta) for a in range(length)] + [beta**length]
        nxt = [memo.get(t + 1 + a, (0.0, 0.0, 0.0, [0.0] * (m + 1))) for a in range(length + 1)]
        mix = [sum(w * x[3][j] for w, x in zip(law, nxt, strict=True)) for j in range(m + 1)]
        mix[length] += 1.0
        memo[t] = (
            1.0 + sum(w * x[0] for w, x in zip(law, nxt, strict=True)),
            sum(w * (a + x[1]) for a, (w, x) in enumerate(zip(law, nxt, strict=True))),
            length + (beta**m if length == m else 0.0) + sum(w * x[2] for w, x in zip(law, nxt, strict=True)),
            mix,
        )
    return memo[1]


def _pair(seed):
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(VOCAB)), rng.dirichlet(np.ones(VOCAB))
    return p, q


def test_cost_model_checks_its_fields():
    with pytest.raises(ValueError, match="k = 1"):
        CostModel(draft_token=0.1, verify_block={2: 1.0})
    with pytest.raises(ValueError, match="draft_token"):
        CostModel(draft_token=-1, verify_block={1: 1.0})
    with pytest.raises(ValueError, match="block sizes"):
        CostModel(draft_token=0.1, verify_block={"two": 1.0})
    with pytest.raises(ValueError, match=r"verify_block\[3\]"):
        CostModel(draft_token=0.1, verify_block={1: 1.0, 3: float("nan")})


def test_verify_interpolates_and_extrapolates_linearly():
    cost = CostModel(draft_token=0.0, verify_block={1: 1.0, 3: 2.0, 5: 4.0})
    assert cost.verify(2) == 1.5 and cost.verify(4) == 3.0
    assert cost.verify(9) == pytest.approx(8.0)  # slope 1 beyond k = 5
    assert CostModel.from_ratio(0.2).verify(17) == 1.0  # flat


@given(
    ratio=st.floats(0.0, 2.0),
    m=st.integers(1, 30),
    al=st.floats(0.0, 30.0),
    overhead=st.floats(0.0, 1.0),
    judge=st.floats(0.0, 0.2),
)
@settings(max_examples=200, deadline=None)
def test_speedup_is_tokens_per_time_against_the_verifier(ratio, m, al, overhead, judge):
    al = min(al, m)
    cost = CostModel(draft_token=ratio, verify_block={1: 1.0, 31: 1.5}, step_overhead=overhead, judge_token=judge)
    time = m * ratio + (1.0 + 0.5 * m / 30) + overhead + (al + 1) * judge
    assert float(cost.speedup(m, al)) == pytest.approx((al + 1) / time, rel=1e-12)


def test_predicted_speedup_matches_the_closed_form_for_constant_acceptance(tmp_path):
    trace = _constant_trace(tmp_path / "t", *_pair(1))
    settings = SamplingSettings(**trace.metadata["sampling"])
    p, q = (x[0] for x in next(iter(trace)).distributions(settings))  # as stored (float32 logits)
    beta = 1 - 0.5 * np.abs(p - q).sum()  # SpS acceptance of every position
    ms = (1, 2, 4, 8, 16)
    result = analyze_trace(trace, ["sps"], ms=ms, n_boot=100)
    plan = predict_speedup(result, 0.25)
    speedups = {}
    for row in (r for r in plan.rows if r["task"] == "all"):
        m = row["m"]
        al = beta * (1 - beta**m) / (1 - beta)  # expected accepted drafts of a block of m (per block start)
        assert row["al"] == pytest.approx(al, rel=1e-9)
        # over the steps decoding takes (3 sequences of 60 positions): drafts, the extra forward when all m are
        # accepted, one verifier pass (flat: a ratio's block costs one verifier token)
        steps, accepted, forwards, _ = _steps_by_hand(beta, 60, m)
        speedups[m] = want = (accepted / steps + 1) / (forwards / steps * 0.25 + 1)
        assert row["al_step"] == pytest.approx(accepted / steps, rel=1e-9)
        assert row["speedup"] == pytest.approx(want, rel=1e-9)
        assert row["speedup_lo"] <= row["speedup"] <= row["speedup_hi"]
        # a long sequence tends to the closed form of the stationary chain: m drafts, beta^m extra forwards
        steps, accepted, forwards, _ = _steps_by_hand(beta, 3000, m)
        stationary = (al + 1) / ((m + beta**m) * 0.25 + 1)
        assert (accepted / steps + 1) / (forwards / steps * 0.25 + 1) == pytest.approx(stationary, rel=0.01)
    assert plan.best_m()[0]["m"] == max(speedups, key=speedups.get)


def test_fastest_within_a_drift_bound(tmp_path):
    p, q = _pair(2)
    trace = _constant_trace(tmp_path / "t", p, q)
    result = analyze_trace(trace, ["sps", "cactus(delta=0.02)", "cactus(delta=0.1)"], ms=(4,), n_boot=0)
    plan = predict_speedup(result, 0.05)
    kl = {r["rule"]: r["kl_emitted_target"] for r in plan.rows if r["task"] == "all"}
    assert kl["sps"] < 1e-12 < kl["cactus(delta=0.02)"] < kl["cactus(delta=0.1)"]
    assert plan.fastest()["rule"] == "cactus(delta=0.1)"  # no bound: the largest budget accepts most
    assert plan.fastest(max_kl=0.0)["rule"] == "sps"
    middle = 0.5 * (kl["cactus(delta=0.02)"] + kl["cactus(delta=0.1)"])
    assert plan.fastest(max_kl=middle)["rule"] == "cactus(delta=0.02)"
    assert "fastest with" in predict_speedup(result, 0.05, max_kl=middle).table()


def test_cost_files_round_trip_and_bad_files_are_named(tmp_path):
    cost = CostModel(draft_token=0.01, verify_block={1: 0.03, 11: 0.036}, step_overhead=0.001, source={"kind": "x"})
    path = tmp_path / "c.json"
    cost.save(path)
    assert load_cost(path) == cost
    (tmp_path / "bad.json").write_text(json.dumps({"draft_token": 0.1, "verify_block": {"1": 1}, "speed": 3}))
    with pytest.raises(ValueError, match="unknown field"):
        load_cost(tmp_path / "bad.json")
    (tmp_path / "short.json").write_text(json.dumps({"verify_block": {"1": 1}}))
    with pytest.raises(ValueError, match="draft_token"):
        load_cost(tmp_path / "short.json")
    with pytest.raises(ValueError, match="does not exist"):
        load_cost(tmp_path / "nothing.json")


@pytest.mark.models
def test_calibration_on_tiny_models():

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from tiny_models import tiny_model, tiny_tokenizer

    verifier = (tiny_model(0), tiny_tokenizer(), {"name": "v"})
    draft = (tiny_model(1, layers=1), tiny_tokenizer(), {"name": "d"})
    cost = calibrate_cost(verifier, draft, max_block=5, context=16, repeats=2, progress=False)
    assert sorted(cost.verify_block) == [1, 2, 3, 4, 5]
    assert all(v > 0 for v in cost.verify_block.values()) and cost.draft_token > 0
    assert cost.source["kind"] == "calibration" and cost.source["verifier"] == {"name": "v"}
    assert cost.source["dtype"] == "float32" and cost.source["context"] == 16
    assert math.isfinite(float(cost.speedup(4, 2.0)))


def test_cli_plan_with_a_ratio_and_with_a_file(tmp_path, capsys):
    args = ["plan", "--rules", "sps,cactus", "--delta", "1", "--m", "2,8", "--bootstrap", "100", "--quiet"]
    assert main([*args, "--cost-ratio", "0.05", "--max-kl", "0.05", "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "predicted speedup at every m" in out and "fastest with KL(pi || q) <= 0.05" in out
    rows = json.loads((tmp_path / "p" / "plan.json").read_text())["rows"]
    assert {r["m"] for r in rows} == {2, 8} and (tmp_path / "p" / "plan.png").stat().st_size > 1000
    cost = tmp_path / "c.json"
    cost.write_text(json.dumps({"draft_token": 0.5, "verify_block": {"1": 1.0, "9": 3.0}}))
    assert main([*args, "--cost", str(cost)]) == 0
    assert "cost file" in capsys.readouterr().out
    cost.write_text(json.dumps({"draft_token": 0.5}))
    assert main([*args, "--cost", str(cost)]) == 2
    assert "lacks ['verify_block']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--cost-ratio", "-0.5"])
    assert "--cost-ratio: must be a cost ratio >= 0 and finite; got -0.5" in capsys.readouterr().err


def test_plan_without_a_cost_uses_the_pairs_newest_calibration_and_says_which(tmp_path, monkeypatch, capsys):
    import json

    from cactus_theory import load_trace
    from cactus_theory._analysis import _calibrations
    from cactus_theory._cli import main

    monkeypatch.setenv("CACTUS_THEORY_CACHE", str(tmp_path / "cache"))
    meta = load_trace().metadata
    costs = tmp_path / "cache" / "costs"
    costs.mkdir(parents=True)

    def cost_file(name, created, verifier, draft_token):
        data = {
            "draft_token": draft_token,
            "verify_block": {"1": 1.0, "4": 1.2, "9": 1.5},
            "source": {
                "kind": "calibration",
                "created": created,
                "verifier": verifier,
                "draft": meta["draft"],
                "device": "cpu",
                "dtype": "bfloat16",
            },
        }
        (costs / name).write_text(json.dumps(data))

    other = dict(meta["verifier"], files={"x.gguf": {"sha256": "0" * 64, "bytes": 1}})
    cost_file("old.json", "2026-01-01T00:00:00Z", meta["verifier"], 0.30)
    cost_file("new.json", "2026-06-01T00:00:00Z", meta["verifier"], 0.20)
    cost_file("newest_other_pair.json", "2026-09-01T00:00:00Z", other, 0.10)
    (costs / "junk.json").write_text("not a cost file")
    assert _calibrations.find_calibration_path(load_trace()) == str(costs / "new.json")
    assert main(["plan", "--rules", "sps", "--m", "2,4", "--bootstrap", "0", "--quiet", "--task", "gsm8k"]) == 0
    out = capsys.readouterr().out
    assert f"the newest calibration of the trace's model pair in the cache, {costs / 'new.json'}" in out
    assert "calibrated on this machine" in out and "draft / verifier token cost 0.200" in out
    assert "22 sequences, 2816 positions analysed (of the trace's 66 sequences, 7577 positions)" in out
    # the table prints every m asked, the best marked, the notes once
    assert "speedup per step at m =" in out and "*" in out


# --- batches (issue 35) ------------------------------------------------------------------------


def _batched_cost():
    """Batch 1 as a cheap-draft GPU; at batch 4 drafting costs almost a verifier step and blocks
    grow with their size (a compute-bound regime): speculation pays at 1 and not at 4."""
    return CostModel(
        draft_token=0.1,
        verify_block={1: 1.0, 9: 1.2},
        prefill={"verifier": {100: 2.0}, "draft": {100: 0.5}},
        batch={
            4: {"draft_token": 0.8, "verify_block": {1: 2.0, 9: 9.0}},
            2: {"draft_token": 0.3, "verify_block": {1: 1.2, 9: 2.5}},
        },
    )


def test_a_cost_model_at_a_batch_size_uses_that_batchs_parts_and_round_trips(tmp_path):
    cost = _batched_cost()
    assert cost.batch_sizes == (1, 2, 4) and cost.at_batch(1) is cost
    four = cost.at_batch(4)
    assert four.draft_token == 0.8 and four.verify(1) == 2.0 and four.verify(5) == pytest.approx(2.0 + 4 * 7 / 8)
    assert four.prefill_time(100) == pytest.approx(4 * 2.0) and four.source["batch"] == 4  # four prompts in turn
    assert four.step_time(2, 1.0) == pytest.approx(2 * 0.8 + four.verify(3))
    with pytest.raises(ValueError, match=r"--batch 1,2,3,4"):
        cost.at_batch(3)
    cost.save(tmp_path / "c.json")
    again = load_cost(tmp_path / "c.json")
    assert again.batch == cost.batch and again.at_batch(2).verify(9) == 2.5
    for bad, match in (
        ({1: {"draft_token": 1, "verify_block": {1: 1}}}, ">= 2"),
        ({2: {"draft_token": -1, "verify_block": {1: 1}}}, r"batch\[2\]"),
        ({2: {"draft_token": 1, "verify_block": {2: 1}}}, "k = 1"),
        ({2: {"draft": 1}}, r"batch\[2\] must be"),
    ):
        with pytest.raises(ValueError, match=match):
            CostModel(draft_token=0.1, verify_block={1: 1.0}, batch=bad)


def test_batch_plans_give_the_throughput_closed_form_and_the_break_even_batch(tmp_path):
    from cactus_theory._analysis._plan import batch_plan, break_even

    trace = _constant_trace(tmp_path / "t", *_pair(1))
    settings = SamplingSettings(**trace.metadata["sampling"])
    p, q = (x[0] for x in next(iter(trace)).distributions(settings))
    beta = 1 - 0.5 * np.abs(p - q).sum()
    result = analyze_trace(trace, ["sps"], ms=(1, 2, 4), n_boot=100)
    cost = _batched_cost()
    plans = batch_plan(result, cost, [1, 2, 4])
    for size, plan in plans.items():
        c = cost.at_batch(size)
        for row in (r for r in plan.rows if r["task"] == "all"):
            m = row["m"]
            steps, accepted, forwards, mix = _steps_by_hand(beta, 60, m)
            verify = (
                sum(
                    w * float(np.interp(L + 1, [1, 9], [c.verify_block[1], c.verify_block[9]]))
                    for L, w in enumerate(mix)
                )
                / steps
            )
            want = (accepted / steps + 1) * c.verify_block[1] / (forwards / steps * c.draft_token + verify)  # per step
            assert row["speedup"] == pytest.approx(want, rel=1e-9)
    rows = break_even(batch_plan(result, cost, [1, 2, 4], prompt_tokens=100, output_tokens=60))
    (sps,) = rows
    plans = batch_plan(result, cost, [1, 2, 4], prompt_tokens=100, output_tokens=60)
    best = {b: max(r["request_speedup"] for r in plan.rows if r["task"] == "all") for b, plan in plans.items()}
    assert {b: r["request_speedup"] for b, r in sps["per_batch"].items()} == best
    assert best[1] > 1 > best[4] and sps["break_even"] == min(b for b in best if best[b] < 1)
    assert break_even(batch_plan(result, cost, [1]))[0]["break_even"] is None  # pays at every size given
    assert break_even(batch_plan(result, cost, [4]))[0]["break_even"] == 4  # pays at none


def test_cli_plan_prints_the_break_even_batch_and_refuses_an_untimed_size(tmp_path, capsys):
    _constant_trace(tmp_path / "t", *_pair(2))
    _batched_cost().save(tmp_path / "cost.json")
    argv = [
        "plan",
        str(tmp_path / "t"),
        "--cost",
        str(tmp_path / "cost.json"),
        "--rules",
        "sps",
        "--m",
        "1,2,4",
        "--bootstrap",
        "100",
        "--quiet",
        "--prompt-tokens",
        "100",
        "--output-tokens",
        "60",
    ]
    assert main([*argv, "--batch", "1,2,4"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("sps ") and "m=" in x)
    assert line.split()[-1] == "4"  # the break-even batch (the closed form above)
    assert main([*argv, "--batch", "1,8"]) == 2
    assert "--batch 1,2,4,8" in capsys.readouterr().err


def _two_sizes_cost(path):
    """A hand-made cost file where speculation loses at batch 1 (drafts cost as much as a verifier token) and pays
    at batch 2 (drafts nearly free, a flat verifier block)."""
    cost = CostModel(
        draft_token=1.0,
        verify_block={1: 1.0, 3: 3.0},
        batch={2: {"draft_token": 0.01, "verify_block": {1: 1.0, 3: 1.0}, "samples": {}}},
    )
    cost.save(path)
    return cost


def test_break_even_says_where_a_rule_pays_when_it_pays_only_at_larger_batches(tmp_path, capsys):
    """Issue 43, item 4: with a hand-made cost file ``plan --batch 1,2`` printed "< 1" (pays at no size) while the
    rule paid 1.89x at B = 2."""
    from cactus_theory._analysis._plan import batch_plan, break_even

    trace = _constant_trace(tmp_path / "t", *_pair(1))
    cost = _two_sizes_cost(tmp_path / "cost.json")
    result = analyze_trace(trace, ["sps"], ms=(2,), n_boot=0)
    (row,) = break_even(batch_plan(result, cost, [1, 2]))
    speedups = {b: r["speedup"] for b, r in row["per_batch"].items()}
    assert speedups[1] < 1 < speedups[2]
    assert row["pays_at"] == [2] and row["break_even"] is None and row["verdict"] == "2 only"
    # a rule that pays up to a size, at none, at every size, or only at some: each verdict
    cases = {
        (1.2, 1.1, 0.9): ("4", 4),
        (0.9, 0.8, 0.7): ("< 1", 1),
        (1.5, 1.4, 1.3): ("> 4", None),
        (0.9, 1.2, 0.8): ("2 only", 4),
        (0.9, 1.2, 1.3): ("2,4 only", None),
    }
    for speeds, want in cases.items():
        plans = {}
        for size, value in zip((1, 2, 4), speeds, strict=True):
            row = {"rule": "r", "m": 1, "task": "all", "speedup": value, "speedup_lo": value, "speedup_hi": value}
            plans[size] = Plan(rows=[row], cost=cost, max_kl=None, warnings=[])
        (found,) = break_even(plans)
        assert (found["verdict"], found["break_even"]) == want
    with pytest.raises(ValueError, match="plans must be"):
        break_even({})
    argv = [
        "plan",
        str(tmp_path / "t"),
        "--cost",
        str(tmp_path / "cost.json"),
        "--rules",
        "sps",
        "--m",
        "2",
        "--batch",
        "1,2",
        "--bootstrap",
        "0",
        "--quiet",
    ]
    assert main(argv) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("sps ") and "m=2" in x)
    assert line.split()[-2:] == ["2", "only"]


def test_batch_sizes_are_whole_numbers_up_to_the_maximum(tmp_path, capsys):
    """Issue 43, items 6, 11, 12, 18: --batch 100000 ran past 60 s or asked for 74.5 GiB; at_batch(0), (-3) returned
    working models and (inf) raised OverflowError; batch_plan took 2.7 as 2 and '12' as [1, 2]; a roofline profile
    refused --batch 5 although it models any size up to 1024."""
    from cactus_theory._analysis._batch import MAX_BATCH
    from cactus_theory._analysis._plan import batch_plan

    cost = _two_sizes_cost(tmp_path / "cost.json")
    for bad in (0, -3, float("inf"), float("nan"), 2.7, "3", True, MAX_BATCH + 1, 10**9):
        with pytest.raises(ValueError, match="whole number of requests in flight, 1 to 1024"):
            cost.at_batch(bad)
    result = analyze_trace(_constant_trace(tmp_path / "t", *_pair(1)), ["sps"], ms=(2,), n_boot=0)
    for bad, match in (([2.7], "whole number"), ("12", "a list of batch sizes"), ([], "is empty"), (5, "a list")):
        with pytest.raises(ValueError, match=match):
            batch_plan(result, cost, bad)
    for size in (100000, 1000000000):
        assert main(["plan", "--batch", f"1,{size}", "--rules", "sps", "--m", "2,4", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "--batch: a batch size must be a whole number of requests in flight, 1 to 1024" in err
    # a roofline models any batch size in range: at 5, between the listed 4 and 6
    roof = CostModel.from_profile("roofline:qwen3-32b:qwen3-0.6b:h100")
    assert 5 not in roof.batch
    times = [roof.at_batch(b).verify(5) for b in (4, 5, 6)]
    assert times[0] < times[1] < times[2]
    assert (
        main(
            [
                "plan",
                "--cost-profile",
                "roofline:qwen3-32b:qwen3-0.6b:h100",
                "--batch",
                "5",
                "--rules",
                "sps",
                "--m",
                "2",
                "--bootstrap",
                "0",
                "--quiet",
            ]
        )
        == 0
    )
    assert "B=5" in capsys.readouterr().out


def test_a_noisy_calibration_in_the_cache_is_named_after_the_arguments_are_checked(tmp_path, monkeypatch, capsys):
    """Issue 43, item 20: a noisy calibration in the cache made every plan refuse with "cannot be trusted", even
    one with a bad --draft-policy or --gate; the refusal named no file, no way to re-measure, no --trust-cost."""
    from cactus_theory import load_trace

    monkeypatch.setenv("CACTUS_THEORY_CACHE", str(tmp_path / "cache"))
    from cactus_theory._analysis._calibrations import cost_directory

    meta = load_trace().metadata
    noisy = CostModel(
        draft_token=0.1,
        verify_block={1: 1.0, 5: 1.5},
        samples={"draft_token": [0.1, 0.2, 0.05, 0.3], "verify_block": {1: [1.0, 1.0], 5: [1.5, 1.5]}},
        source={
            "kind": "calibration",
            "verifier": meta.get("verifier"),
            "draft": meta.get("draft"),
            "created": "2026-01-01",
        },
    )
    assert noisy.problems()
    os.makedirs(cost_directory(), exist_ok=True)
    path = os.path.join(cost_directory(), "noisy.json")
    noisy.save(path)
    for bad, said in (
        (["--draft-policy", "p-min(7)"], "probability in [0, 1]"),
        (["--gate", "7"], "--gate"),
        (["--batch", "5000"], "--batch"),
    ):
        assert main(["plan", "--rules", "sps", "--m", "2", "--quiet", *bad]) == 2
        err = capsys.readouterr().err
        assert said in err and "cannot be trusted" not in err
    assert main(["plan", "--rules", "sps", "--m", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "cannot be trusted" in err and path in err and "cactus-theory calibrate" in err and "--trust-cost" in err
    assert main(["plan", "--rules", "sps", "--m", "2", "--quiet", "--bootstrap", "0", "--trust-cost"]) == 0


@pytest.mark.parametrize("option", [["--cost-ratio", "inf"], ["--cost-ratio", "0.1", "--max-kl", "inf"]])
def test_infinite_plan_options_are_refused_before_the_analysis(option, capsys, monkeypatch):
    from cactus_theory._analysis import _analyze

    monkeypatch.setattr(_analyze, "run_local", lambda *a, **k: pytest.fail("the analysis started"))
    with pytest.raises(SystemExit) as exc:
        main(["plan", *option, "--quiet"])
    assert exc.value.code == 2 and "finite" in capsys.readouterr().err
