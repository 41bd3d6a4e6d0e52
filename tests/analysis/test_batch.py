"""Serving concurrency (issue 35): the static batch whose requests end at their own times against a
Monte Carlo of the synchronous steps written out here, the verify budget against its brute force,
the roofline's counts against the models' published sizes and a hand computation, its fit to the
shipped profiles, and plan --batch on the default profile."""

import json
import subprocess
import sys

import numpy as np
import pytest
from locations import HANG_GUARD

from cactus_theory import CostModel
from cactus_theory.plan import (
    DEFAULT_COST_PROFILE,
    DEVICES,
    ModelShape,
    Roofline,
    fit_to_profiles,
    roofline_cost,
    simulate_batch,
    steps_law,
    verify_budget,
)


def _toy_cost():
    return CostModel(
        draft_token=0.1,
        verify_block={1: 1.0, 3: 1.3, 4: 1.5},
        batch={
            2: {"draft_token": 0.15, "verify_block": {1: 1.2, 3: 1.8, 4: 2.2}, "samples": {}},
            3: {"draft_token": 0.2, "verify_block": {1: 1.4, 3: 2.3, 4: 2.9}, "samples": {}},
        },
    )


def test_static_batch_is_the_synchronous_steps_written_out():
    rng = np.random.default_rng(0)
    cost = _toy_cost()
    accepts = [rng.uniform(0.3, 1.0, size=n) for n in (7, 12, 9)]
    m = 3
    exact = simulate_batch(accepts, m, cost)
    n = 20_000
    times, latencies = np.zeros(n), np.zeros((n, 3))
    for run in range(n):
        pos, t = [0, 0, 0], 0.0
        while any(p < len(a) for p, a in zip(pos, accepts, strict=True)):
            alive = [i for i in range(3) if pos[i] < len(accepts[i])]
            at = cost.at_batch(len(alive))
            t += m * at.draft_time() + at.verify(m + 1)
            ended, whole = [], False
            for i in alive:
                a, k = accepts[i], 0
                while k < m and pos[i] + k < len(a) and rng.random() < a[pos[i] + k]:
                    k += 1
                whole = whole or k == m
                pos[i] += k + 1
                if pos[i] >= len(a):
                    ended.append(i)
            if whole:  # a drafter reads its last draft: one more draft forward of the batch
                t += at.draft_time()
            for i in ended:
                latencies[run, i] = t
        times[run] = t
    assert abs(times.mean() - exact.time) < 4.5 * times.std() / np.sqrt(n)
    for i in range(3):
        col = latencies[:, i]
        assert abs(col.mean() - exact.latency[i]) < 4.5 * col.std() / np.sqrt(n) + 1e-9
    # the verifier alone: one token per request per step, the batch shrinking as requests end
    want = sum(cost.at_batch(sum(len(a) > s for a in accepts)).verify(1) for s in range(12))
    assert abs(exact.time_alone - want) < 1e-12
    assert exact.tokens == 28


def test_steps_law_against_a_hand_chain():
    # two positions, m = 1: from position 0 a step accepts the draft with a_0 (two tokens: done) or
    # emits one token (then one more step)
    a = np.array([0.3, 0.8])
    running = steps_law(a, 1)
    np.testing.assert_allclose(running, [1.0, 0.7], atol=1e-15)


def test_verify_budget_by_brute_force():
    rng = np.random.default_rng(3)
    accepts = [rng.uniform(0.2, 1.0, size=10) for _ in range(4)]
    tops = [rng.uniform(0.2, 1.0, size=10) for _ in range(4)]
    cost = CostModel(
        draft_token=0.05,
        verify_block={1: 1.0, 2: 1.1, 3: 1.3, 4: 1.6},
        batch={2: {"draft_token": 0.06, "verify_block": {1: 1.1, 2: 1.3, 3: 1.6, 4: 2.0}, "samples": {}}},
    )
    m, size = 3, 2
    budget, fixed, _, _, verified = verify_budget(accepts, tops, m, cost, size, steps=300, seed=5)
    # the same seeded batch states, decided by brute force over every split of the drafts
    at = cost.at_batch(size)
    survival, reach = [], []
    for a, c in zip(accepts, tops, strict=True):
        for t in range(10):
            idx = [t + j for j in range(m)]
            survival.append([np.prod([c[i] if i < 10 else 0.0 for i in idx[: j + 1]]) for j in range(m)])
            reach.append([np.prod([a[i] if i < 10 else 0.0 for i in idx[: j + 1]]) for j in range(m)])
    survival, reach = np.array(survival), np.array(reach)
    picks = np.random.default_rng(5).integers(0, survival.shape[0], size=(300, size))
    tokens_b, seconds_b, tokens_f, seconds_f, lengths = [], [], [], [], []
    for state in picks:
        best, best_value = None, -np.inf
        for split in np.ndindex(*(m + 1,) * size):
            total = sum(split)
            value = (size + sum(survival[state[b], : split[b]].sum() for b in range(size))) / (
                m * at.draft_time() + at.verify(1 + total / size)
            )
            if value > best_value + 1e-12:
                best, best_value = split, value
        tokens_b.append(size + sum(reach[state[b], : best[b]].sum() for b in range(size)))
        # and one more draft forward when a request that verified all m drafts accepted them all
        whole_b = 1 - np.prod([1 - (reach[state[b], m - 1] if best[b] == m else 0.0) for b in range(size)])
        seconds_b.append(m * at.draft_time() + at.verify(1 + sum(best) / size) + whole_b * at.draft_time())
        tokens_f.append(size + reach[state].sum())
        whole_f = 1 - np.prod([1 - reach[state[b], m - 1] for b in range(size)])
        seconds_f.append(m * at.draft_time() + at.verify(m + 1) + whole_f * at.draft_time())
        lengths.append(np.mean(best))
    baseline = size / at.verify(1)
    # throughputs: the expected tokens of a step over its expected seconds
    assert np.sum(tokens_b) / np.sum(seconds_b) / baseline > 1  # drafting pays here: the budget drafts
    np.testing.assert_allclose(budget, np.sum(tokens_b) / np.sum(seconds_b) / baseline, rtol=1e-9)
    np.testing.assert_allclose(fixed, np.sum(tokens_f) / np.sum(seconds_f) / baseline, rtol=1e-12)
    np.testing.assert_allclose(verified, np.mean(lengths), rtol=1e-12)


def test_a_verify_budget_that_cannot_pay_drafts_nothing():
    """Issue 43, item 5: at low acceptance with drafts costing 0.2 of a verify the budget gave 0.391x, below the
    verifier alone, because it always paid the m drafts; it may draft nothing (1.0x, 0 verified)."""
    rng = np.random.default_rng(4)
    accepts = [rng.uniform(0.0, 0.1, size=30) for _ in range(6)]
    tops = [rng.uniform(0.0, 0.1, size=30) for _ in range(6)]
    cost = CostModel(draft_token=0.2, verify_block={1: 1.0, 5: 1.05})
    budget, fixed, budget_se, _, verified = verify_budget(accepts, tops, 4, cost, 1, steps=500, seed=0)
    # every draft verified: 1 + sum of the reach over the drafts, over 4 drafts and a block of 5
    assert fixed < 0.6
    assert (budget, budget_se, verified) == (1.0, 0.0, 0.0)
    # and where drafting pays, the budget still drafts
    good = [np.full(30, 0.95) for _ in range(6)]
    budget, fixed, _, _, verified = verify_budget(good, good, 4, cost, 1, steps=500, seed=0)
    assert budget >= fixed > 1 and verified > 0


def test_model_shapes_match_the_published_sizes_and_a_hand_forward():
    sizes = {"qwen3-0.6b": 0.596e9, "qwen3-8b": 8.19e9, "qwen3-32b": 32.76e9}  # Qwen3 model cards (total)
    for name, want in sizes.items():
        assert abs(ModelShape.from_config(name).parameters / want - 1) < 0.005
    shape = ModelShape.from_config(
        {
            "hidden_size": 8,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "intermediate_size": 16,
            "vocab_size": 10,
        }
    )
    head_dim = 4
    attention = 8 * head_dim * (2 * 2 + 2 * 1)
    matmul = 2 * (attention + 3 * 8 * 16) + 10 * 8
    assert shape.matmul_parameters == matmul and shape.parameters == matmul + 80
    moved, flops = shape.forward(batch=3, tokens=2, context=5)
    kv = 2 * 2 * 1 * head_dim * 2
    assert moved == (matmul + 80) * 2 + 3 * 7 * kv
    assert flops == 2 * matmul * 3 * 2 + 4 * 3 * 2 * 7 * 2 * 2 * head_dim
    t = Roofline(DEVICES["h100"], 0.5, 0.001, 0.002).time(shape, 3, 2, 5)
    assert t == pytest.approx(max(moved / 3.35e12, flops / 989e12) / 0.5 + 0.003, rel=1e-15)
    zero_layers = {
        "hidden_size": 8,
        "num_hidden_layers": 0,
        "num_attention_heads": 1,
        "intermediate_size": 1,
        "vocab_size": 1,
    }
    for bad in ({"hidden_size": 8}, "no-such-model", zero_layers):
        with pytest.raises(ValueError):
            ModelShape.from_config(bad)


def test_roofline_fit_and_profiles():
    roofline, rows = fit_to_profiles()
    assert 0.05 <= roofline.efficiency <= 1 and roofline.overhead >= 0 and roofline.verify_overhead >= 0
    assert len(rows) == 12 and sum(abs(r["error"]) <= 0.10 for r in rows) >= 10
    for r in rows:  # every row is the roofline's value at that point
        assert r["modelled"] == pytest.approx(r["measured"] * (1 + r["error"]), rel=1e-12)
    cost = CostModel.from_profile("roofline:qwen3-32b:qwen3-0.6b:h100")
    assert cost.source["kind"] == "roofline" and cost.source["modelled"] is True
    assert cost.at_batch(128).verify(9) > cost.verify(9)
    direct = roofline_cost("qwen3-32b", "qwen3-0.6b", "h100", batches=(1, 64))
    assert direct.at_batch(64).verify_block[4] == pytest.approx(cost.at_batch(64).verify_block[4], rel=1e-12)
    profile = CostModel.from_profile(DEFAULT_COST_PROFILE)
    assert profile.at_batch(1) is profile
    scaled = profile.at_batch(64)
    assert "modelled" in scaled.source["batch_model"] and scaled.verify_block[1] >= profile.verify_block[1]
    pair = "roofline:qwen3-32b:qwen3-0.6b"
    for bad in (pair, "roofline:qwen3-99b:qwen3-0.6b:h100", f"{pair}:tpu", f"{pair}:h100:lots"):
        with pytest.raises(ValueError, match="roofline"):
            CostModel.from_profile(bad)


def test_plan_batch_prints_the_break_even_batch_with_the_default_profile(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cactus_theory",
            "plan",
            "--batch",
            "1,32,512",
            "--rules",
            "sps",
            "--m",
            "2,8",
            "--bootstrap",
            "0",
            "--quiet",
            "--out",
            str(tmp_path / "plan"),
        ],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert out.returncode == 0, out.stderr
    assert "break-even B" in out.stdout and "static batches" in out.stdout
    assert "modelled from it by a roofline" in out.stdout or DEFAULT_COST_PROFILE in out.stdout
    line = next(x for x in out.stdout.splitlines() if x.startswith("sps ") and "m=" in x)
    assert line.split()[-1] in ("512", "> 512", "32", "< 1")
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())


def _expected_steps(beta, m, whole=False):
    """E[steps] of one request decoding all its len(beta) positions from position 0 with blocks of m drafts, written
    out: from t a step accepts A drafts (P(A >= j) = beta_t ... beta_{t+j-1}, positions past the end rejected) and
    moves to t + 1 + A. ``whole``: E[steps that accept all m drafts] (each costs one more draft forward)."""
    n = len(beta)
    steps = [0.0] * (n + m + 2)
    for t in range(n - 1, -1, -1):
        reach, total = 1.0, 0.0
        for a in range(m + 1):
            stop = 1.0 - (beta[t + a] if a < m and t + a < n else 0.0)
            total += reach * stop * (steps[t + 1 + a] + (1.0 if whole and a == m else 0.0))
            reach *= 1.0 - stop
        steps[t] = (0.0 if whole else 1.0) + total
    return steps[0]


@pytest.mark.parametrize("case", ["task", "greedy", "gate"])
def test_the_static_batch_table_answers_for_the_tasks_draft_mode_and_gate_asked(case, capsys):
    """Issue 43, items 1-2: ``plan --task ... --batch`` and ``--gate`` / ``--draft-mode greedy`` printed static rows
    of the plain run (all tasks, sampled drafts, no gate) under tables that followed the options. At B = 1 the
    static batch of every request of the tasks asked, each decoded alone, recomputed by hand from the trace's
    distributions."""
    from cactus_theory import load_trace, make_rule, open_traces, step_metrics
    from cactus_theory._cli import main
    from cactus_theory.laws import RegionGate
    from cactus_theory.plan import batch_requests

    trace = load_trace()
    rule, tasks, mode, gate = "sps", ["humaneval"], "sampled", None
    if case == "greedy":
        tasks, mode = ["mt_bench"], "greedy"
    if case == "gate":
        rule, tasks, gate = "cactus(delta=1.0)", ["gsm8k"], RegionGate(open_ids=(279,), close_ids=(13,))
    m, cost = 2, CostModel.from_ratio(0.2)
    alone = spec = 0.0
    for seq in trace:
        if seq.task not in tasks or not seq.n_positions:
            continue
        p, q = (np.asarray(x, dtype=np.float64) for x in seq.distributions(trace.sampling))
        if mode == "greedy":
            beta = q[np.arange(len(q)), p.argmax(-1)]  # the drafted token is argmax p, judged as p one-hot
        else:
            beta = np.minimum(p, q).sum(-1)  # SpS: 1 - TV(p, q)
        if gate is not None:  # the rule where the gate is open (after the sequence's own tokens), SpS elsewhere
            relaxed = step_metrics(make_rule(rule), p, q).acceptance
            beta = np.where(gate.mask(seq.tokens), relaxed, beta)
        alone += len(beta) * 1.0  # the verifier alone: one verify(1) = 1 per token
        spec += _expected_steps(beta, m) * (m * 0.2 + 1.0)  # a step: m drafts and a flat verifier block
        spec += _expected_steps(beta, m, whole=True) * 0.2  # and a draft forward after a fully accepted block
    (row,) = batch_requests(
        open_traces(trace), {(rule, 1): m}, cost, [1], tasks=tasks, draft_mode=mode, gate=None if gate is None else gate
    )
    assert row["throughput_speedup"] == pytest.approx(alone / spec, rel=1e-9)
    # the plain run differs: a test of the options that the plain run could not pass
    (plain,) = batch_requests(open_traces(trace), {(rule, 1): m}, cost, [1])
    assert abs(plain["throughput_speedup"] - row["throughput_speedup"]) > 1e-3
    # and the CLI prints these rows for the same options
    argv = [
        "plan",
        "--rules",
        rule,
        "--m",
        str(m),
        "--batch",
        "1",
        "--cost-ratio",
        "0.2",
        "--bootstrap",
        "0",
        "--quiet",
        "--task",
        tasks[0],
        "--draft-mode",
        mode,
    ]
    if gate is not None:
        argv += ["--gate", "279:13"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith(row["rule"] + " ") and " 1   2 " in x)
    assert f"{row['throughput_speedup']:6.2f}x" in line


def test_the_batch_functions_refuse_what_is_not_a_batch():
    """Issue 43, items 10 and 13: simulate_batch took m = -1 (1.46x), an acceptance of -0.5 or NaN, width 0;
    verify_budget gave NaNs at size 0 or NaN, IndexError on mismatched lengths, a numpy error with no requests."""
    cost = _toy_cost()
    good = [np.full(5, 0.5), np.full(7, 0.8)]
    for kwargs, match in (
        ({"m": -1}, "m must be an integer >= 1"),
        ({"m": 2.5}, "m must be an integer >= 1"),
        ({"width": 0}, "width must be an integer >= 1"),
        ({"accepts": [np.array([0.5, -0.5])]}, r"accepts\[0\] must hold probabilities in \[0, 1\]"),
        ({"accepts": [np.array([0.5, np.nan])]}, r"probabilities in \[0, 1\]; got nan"),
        ({"accepts": []}, "accepts is empty"),
        ({"accepts": [np.array([])]}, "non-empty 1-D"),
        ({"accepts": [np.full(3, 0.5)] * 1025}, "1 to 1024"),
    ):
        args = {"accepts": good, "m": 2, "cost": cost} | kwargs
        width = args.pop("width", 1)
        with pytest.raises(ValueError, match=match):
            simulate_batch(args["accepts"], args["m"], args["cost"], width=width)
    for size in (0, float("nan"), -1, 2.5):
        with pytest.raises(ValueError, match="size must be a whole number of requests in flight"):
            verify_budget(good, good, 2, cost, size)
    with pytest.raises(ValueError, match="one array per request of accepts"):
        verify_budget(good, [np.full(5, 0.5), np.full(6, 0.5)], 2, cost, 2)
    with pytest.raises(ValueError, match="accepts is empty"):
        verify_budget([], [], 2, cost, 2)
    with pytest.raises(ValueError, match="steps must be an integer >= 2"):
        verify_budget(good, good, 2, cost, 2, steps=0)


def test_the_roofline_refuses_configs_and_contexts_it_cannot_model(tmp_path):
    """Issue 43, items 9 and 16: from_config('/dev/zero') read until MemoryError; a hidden_size of Infinity or 1e300
    raised OverflowError; a context of 99999999999999999999999 tokens was accepted and printed."""
    from cactus_theory._analysis._roofline import MAX_CONTEXT

    with pytest.raises(ValueError, match="not a regular file"):
        ModelShape.from_config("/dev/zero")
    big = tmp_path / "config.json"
    big.write_text(json.dumps({"padding": "x" * (2 << 20)}))
    with pytest.raises(ValueError, match=r"a config\.json is a few kB"):
        ModelShape.from_config(str(big))
    fields = {
        "hidden_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "intermediate_size": 2048,
        "vocab_size": 1000,
    }
    assert ModelShape.from_config(fields).hidden == 1024
    for value in (float("inf"), 1e300, -5, 2.5, "wide", True):
        with pytest.raises(ValueError, match="hidden_size"):
            ModelShape.from_config({**fields, "hidden_size": value})
    for context in (MAX_CONTEXT + 1, 99999999999999999999999, -1):
        with pytest.raises(ValueError, match="context must be a number of tokens"):
            roofline_cost("qwen3-8b", "qwen3-0.6b", "h100", context=context)
    with pytest.raises(ValueError, match="context must be a number of tokens"):
        CostModel.from_profile("roofline:qwen3-8b:qwen3-0.6b:h100:99999999999999999999999")


def test_at_one_request_the_batch_module_costs_a_step_as_the_planner_does():
    """Issue 52, item 15: SpS, m = 4, the default GPU profile: the planner gave 0.9665x and the full batch
    verifying every draft 1.0146x +- 0.0077, because the batch module charged no draft forward after a fully
    accepted block (the drafter reading its last draft) where the planner charged one. Both cost a step alike."""
    from cactus_theory import analyze_trace, load_trace, open_traces, predict_speedup
    from cactus_theory.plan import DEFAULT_COST_PROFILE, batch_requests

    trace = load_trace()
    cost = CostModel.from_profile(DEFAULT_COST_PROFILE)
    (planned,) = [
        r
        for r in predict_speedup(analyze_trace(trace, ["sps"], ms=(4,), n_boot=0, progress=False), cost).rows
        if r["task"] == "all"
    ]
    (row,) = batch_requests(open_traces(trace), {("sps", 1): 4}, cost, [1])
    assert abs(row["fixed_speedup"] - planned["speedup"]) < 3 * row["fixed_speedup_se"]
    assert abs(row["fixed_speedup"] - planned["speedup"]) < 0.01
