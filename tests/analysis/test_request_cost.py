"""Whole-request cost, honest intervals, trust checks, measured profiles and like-for-like
decoding measurements (issue 24), against closed forms written here."""

import json
import math

import numpy as np
import pytest

from cactus_theory import CostModel, analyze_trace, predict_speedup
from cactus_theory._cli import main
from cactus_theory._util._machine import other_load
from cactus_theory.decode import decoding_summary
from cactus_theory.plan import cost_profiles, load_cost


def test_request_times_are_prefill_plus_steps():
    cost = CostModel(
        draft_token=0.1,
        verify_block={1: 1.0, 5: 1.4},
        step_overhead=0.05,
        judge_token=0.01,
        prefill={"verifier": {100: 2.0, 400: 5.0}, "draft": {100: 0.5}},
    )
    assert cost.prefill_time(50) == pytest.approx(1.0)  # through (0, 0)
    assert cost.prefill_time(250) == pytest.approx(3.5)
    assert cost.prefill_time(700) == pytest.approx(8.0)  # the last slope, 1 s per 100 tokens
    assert cost.prefill_time(300, "draft") == pytest.approx(1.5)  # one point: through (0, 0), then its slope
    al, m, prompt, out = 2.5, 4, 200, 70
    t = cost.request_times(prompt, out, m, al)
    step = m * 0.1 + 1.4 + 0.05 + (al + 1) * 0.01
    assert t["prefill"] == pytest.approx(3.0 + 1.0)
    assert t["decode"] == pytest.approx(out / (al + 1) * step)
    assert t["baseline_total"] == pytest.approx(3.0 + out * 1.0)
    # a context slope: the steps run at the mean context, prompt + output / 2
    sloped = CostModel(draft_token=0.1, verify_block={1: 1.0}, context=100, context_slope={"verify": 0.001})
    t = sloped.request_times(300, 200, 1, 0.0)
    assert t["baseline_decode"] == pytest.approx(200 * (1.0 + 0.001 * (400 - 100)))


def test_drafting_policy_rows_are_charged_for_what_they_draft():
    cost = CostModel(draft_token=0.2, verify_block={1: 1.0, 9: 2.0})
    full = float(cost.step_time(8, 3.0))
    early = float(cost.step_time(8, 2.0, drafted=3.0, forwards=4.0))
    assert full == pytest.approx(8 * 0.2 + 2.0)
    assert early == pytest.approx(4 * 0.2 + float(cost.verify(4.0)))


def test_the_issues_calibration_is_flagged_and_refused_unless_trusted():
    cost = CostModel(draft_token=0.5, verify_block={1: 1.0, 5: 2.98, 9: 2.29, 13: 7.23})
    (problem,) = cost.problems()
    assert "non-monotone" in problem and "9 tokens" in problem and "23%" in problem
    analysis = type(
        "A",
        (),
        {
            "rows": [
                {"rule": "sps", "m": 8, "task": "all", "al": 4.0, "al_lo": 3.5, "al_hi": 4.5, "kl_emitted_target": 0.0}
            ],
            "sequences": [],
        },
    )()
    with pytest.raises(ValueError, match=r"cannot be trusted.*--trust-cost"):
        predict_speedup(analysis, cost)
    plan = predict_speedup(analysis, cost, allow_untrusted=True)
    assert plan.warnings == [problem] and "warning: non-monotone" in plan.table()
    # noise within its own spread is not a problem; a noisy or busy calibration is
    quiet = CostModel(draft_token=0.5, verify_block={1: 1.0, 5: 2.0, 9: 1.96})
    assert quiet.problems() == []
    noisy = CostModel(draft_token=0.5, verify_block={1: 1.0}, samples={"draft_token": [0.3, 0.5, 0.9]})
    assert "noisy" in noisy.problems()[0]
    busy = CostModel(draft_token=0.5, verify_block={1: 1.0}, load={"other": 0.6, "cores": 2})
    assert "busy machine" in busy.problems()[0]


def test_intervals_combine_al_and_timing_spread():
    rows = [{"rule": "sps", "m": 4, "task": "all", "al": 2.0, "al_lo": 2.0, "al_hi": 2.0, "kl_emitted_target": 0.0}]
    analysis = type("A", (), {"rows": rows, "sequences": []})()
    exact = CostModel(draft_token=0.1, verify_block={1: 1.0, 5: 1.5})
    plan = predict_speedup(analysis, exact)
    r = plan.rows[0]
    assert r["speedup_lo"] == pytest.approx(r["speedup"]) == pytest.approx(r["speedup_hi"])  # nothing uncertain
    assert r["interval"] == "AL"
    spread = [0.8, 0.9, 1.0, 1.1, 1.2]
    timed = CostModel(
        draft_token=0.1,
        verify_block={1: 1.0, 5: 1.5},
        samples={"draft_token": [0.1 * s for s in spread], "verify_block": {1: spread, 5: [1.5 * s for s in spread]}},
    )
    r = predict_speedup(analysis, timed, allow_untrusted=True).rows[0]
    assert r["interval"] == "AL + timing" and r["speedup_lo"] < r["speedup"] < r["speedup_hi"]
    # the interval holds the speedups of the extreme repeats: the slow verifier token with the fast block, ...
    worst = 3.0 * 0.8 / (4 * 0.1 * 1.2 + 1.5 * 1.2)
    best = 3.0 * 1.2 / (4 * 0.1 * 0.8 + 1.5 * 0.8)
    assert worst <= r["speedup_lo"] and r["speedup_hi"] <= best


def test_request_speedups_use_the_traces_prompt_and_output_lengths(tmp_path):
    cost = CostModel(
        draft_token=0.1, verify_block={1: 1.0, 5: 1.3}, prefill={"verifier": {64: 3.0}, "draft": {64: 1.0}}
    )
    result = analyze_trace(
        None or __import__("cactus_theory").load_trace(), ["sps"], ms=(4,), n_boot=100, tasks=["gsm8k"]
    )
    plan = predict_speedup(result, cost)
    r = next(r for r in plan.rows if r["task"] == "all")
    seqs = result.sequences
    prompt = np.mean([s.prompt_tokens for s in seqs])
    out = np.mean([s.positions for s in seqs])
    assert r["prompt_tokens"] == pytest.approx(prompt) and r["output_tokens"] == pytest.approx(out)
    # the steps decoding takes, written out: from position t (1 to T - 4, where a whole block fits) a step drafts
    # 4, accepts A (P(A >= j) = prod of the SpS acceptance 1 - TV(p, q) over the first j) and moves to t + 1 + A;
    # a step whose drafts were all 4 accepted runs one more draft forward
    settings = __import__("cactus_theory").load_trace().sampling
    steps = accepted = drafted = forwards = 0.0
    mix = np.zeros(5)
    for seq in __import__("cactus_theory").load_trace():
        if seq.task != "gsm8k" or not seq.n_positions:
            continue
        p, q = seq.distributions(settings)
        beta = np.minimum(np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)).sum(-1)
        n = len(beta)
        memo = [np.zeros(9) for _ in range(n + 6)]  # per t: steps, accepted, drafted, forwards, mix[0..4]
        for t in range(n - 4, 0, -1):  # the steps counted: those starting where a whole block fits
            length = min(4, n - t)
            reach = np.cumprod(np.concatenate([[1.0], beta[t : t + length]]))
            law = reach - np.append(reach[1:], 0.0)  # P(A = a), a = 0..length
            here = np.zeros(9)
            here[0], here[2] = 1.0, length
            here[3] = length + (reach[-1] if length == 4 else 0.0)
            here[4 + length] = 1.0
            here[1] = law @ np.arange(length + 1)
            memo[t] = here + sum(law[a] * memo[t + 1 + a] for a in range(length + 1))
        steps, accepted, drafted, forwards = (
            x + y for x, y in zip((steps, accepted, drafted, forwards), memo[1][:4], strict=True)
        )
        mix += memo[1][4:]
    assert r["al_step"] == pytest.approx(accepted / steps, rel=1e-9)
    assert r["drafted"] == pytest.approx(drafted / steps, rel=1e-9)
    assert r["draft_forwards"] == pytest.approx(forwards / steps, rel=1e-9)
    np.testing.assert_allclose(r["verify_mix"], mix / steps, rtol=1e-9)
    blocks = sum(w * float(cost.verify(L + 1)) for L, w in enumerate(mix / steps))
    assert r["step_time"] == pytest.approx(forwards / steps * 0.1 + blocks, rel=1e-9)
    assert r["tokens_per_step"] == pytest.approx(accepted / steps + 1, rel=1e-9)
    t = cost.request_times(
        prompt, out, 4, r["al_step"], drafted=r["drafted"], forwards=r["draft_forwards"], verify_mix=r["verify_mix"]
    )
    assert r["request_speedup"] == pytest.approx(t["baseline_total"] / t["total"])
    assert r["prefill_share"] == pytest.approx(t["prefill"] / t["total"])
    assert r["request_speedup"] < r["speedup"]  # the prefill, paid by both models, dilutes the gain
    assert r["request_speedup_lo"] <= r["request_speedup"] <= r["request_speedup_hi"]
    assert plan.key == "request_speedup" and "prefill" in plan.table()


def test_the_shipped_profiles_are_the_published_numbers():
    profiles = cost_profiles()
    assert set(profiles) >= {"qwen3-32b-0.6b-gb200-vllm", "qwen3-32b-8b-gb200-vllm"}
    cost = CostModel.from_profile("qwen3-32b-0.6b-gb200-vllm")
    # graphcore-research/relaxed-spec-dec-repro profiles/paper/qwen3_32b_0p6b_b200_profile.json, costs_ms
    assert cost.draft_token == pytest.approx(3.9289920043945314e-3)
    assert cost.verify_block[1] == pytest.approx(12.44760986328125e-3)
    assert cost.verify_block[4] == pytest.approx(30.5031298828125e-3)  # d = 3 drafts: 4 tokens
    assert cost.source["repository"] == "graphcore-research/relaxed-spec-dec-repro"
    assert cost.source["hardware"] == "NVIDIA GB200" and cost.problems() == []
    assert load_cost(profiles["qwen3-32b-0.6b-gb200-vllm"]) == cost
    with pytest.raises(ValueError, match="unknown cost profile"):
        CostModel.from_profile("a100")


def _record(id_, tokens, base_tokens, prefill=1.0, step=0.5, base_step=1.0, other=0.0):
    return {
        "id": id_,
        "task": "t",
        "tokens": tokens,
        "seconds": prefill + step * tokens,
        "accepted": [1] * (tokens // 2),
        "prefill_seconds": prefill,
        "token_seconds": [step * (i + 1) for i in range(tokens)],
        "other_load": other,
        "baseline": {
            "tokens": base_tokens,
            "seconds": prefill + base_step * base_tokens,
            "prefill_seconds": prefill,
            "token_seconds": [base_step * (i + 1) for i in range(base_tokens)],
        },
    }


def test_decoding_summary_compares_like_with_like_and_flags():
    records = [_record("a", 10, 40), _record("b", 40, 40), _record("c", 40, 40, other=0.5)]
    text = decoding_summary(records).table()
    # matched: a compares 10 tokens each; decode speedup = (10 + 40 + 40) * 1.0 / ((10 + 40 + 40) * 0.5) = 2
    line = text.splitlines()[1]
    assert "2.00x" in line
    request = (3 * 1.0 + 90 * 1.0) / (3 * 1.0 + 90 * 0.5)
    assert f"{request:.2f}x" in line
    assert "a: 10 tokens speculative, 40 alone" in text
    assert "c: other processes kept 50% of the cores busy" in text
    assert "b:" not in text


def test_other_load_reads_two_samples():
    assert other_load((0.0, 10.0, 4.0), (2.0, 13.0, 5.0)) == pytest.approx(2.0 / (2.0 * __import__("os").cpu_count()))
    assert other_load(None, (1.0, 1.0, 1.0)) is None


def test_cost_files_with_the_new_fields_round_trip_and_are_checked(tmp_path):
    cost = CostModel(
        draft_token=0.1,
        verify_block={1: 1.0, 3: 1.2},
        prefill={"verifier": {32: 0.5, 128: 1.5}},
        context=256,
        context_slope={"verify": 1e-4, "draft": 2e-5},
        samples={"draft_token": [0.1, 0.11], "verify_block": {1: [1.0, 1.01]}},
        load={"other": 0.01, "cores": 2.0},
    )
    path = tmp_path / "c.json"
    cost.save(path)
    assert load_cost(path) == cost
    bad = json.loads(path.read_text())
    bad["prefill"] = {"verifier": {"x": 1}}
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"prefill\['verifier'\] keys must be prompt lengths"):
        load_cost(path)
    with pytest.raises(ValueError, match="context_slope"):
        CostModel(draft_token=0.1, verify_block={1: 1.0}, context_slope={"verifier": 1.0})
    with pytest.raises(ValueError, match="samples"):
        CostModel(draft_token=0.1, verify_block={1: 1.0}, samples={"draft_token": []})
    assert math.isfinite(float(cost.speedup(2, 1.0, context=1000)))


def test_cli_plan_refuses_an_untrusted_cost_file_and_plans_when_told(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"draft_token": 0.5, "verify_block": {"1": 1.0, "5": 2.98, "9": 2.29, "13": 7.23}}))
    args = ["plan", "--cost", str(path), "--rules", "sps", "--m", "4,8", "--bootstrap", "0", "--quiet"]
    assert main(args) == 2
    assert "non-monotone" in capsys.readouterr().err
    assert main([*args, "--trust-cost"]) == 0
    assert "warning: non-monotone" in capsys.readouterr().out


def test_decoding_flags_at_their_thresholds():
    from cactus_theory.decode import decoding_flags

    # 20% shorter is not flagged, 21% is (of the longer output); a quarter of the cores is not busy, more is
    assert decoding_flags(_record("a", 80, 100)) == {"length_mismatch": False, "busy": False}
    assert decoding_flags(_record("a", 79, 100))["length_mismatch"]
    assert decoding_flags(_record("a", 100, 79))["length_mismatch"]
    assert not decoding_flags(_record("a", 0, 0))["length_mismatch"]
    assert not decoding_flags(_record("a", 10, 10, other=0.25))["busy"]
    assert decoding_flags(_record("a", 10, 10, other=0.26))["busy"]
    no_baseline = {k: v for k, v in _record("a", 10, 40).items() if k != "baseline"}
    assert decoding_flags(no_baseline) == {"length_mismatch": False, "busy": False}
