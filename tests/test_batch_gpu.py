"""Serving concurrency (issue 35): the static batch whose requests end at their own times against a
Monte Carlo of the synchronous steps written out here, the verify budget against its brute force,
the roofline's counts against the models' published sizes and a hand computation, its fit to the
shipped profiles, and plan --batch on the default profile."""

import json
import subprocess
import sys

import numpy as np
import pytest

from cactus_theory import (
    DEFAULT_COST_PROFILE,
    DEVICES,
    CostModel,
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
            for i in alive:
                a, k = accepts[i], 0
                while k < m and pos[i] + k < len(a) and rng.random() < a[pos[i] + k]:
                    k += 1
                pos[i] += k + 1
                if pos[i] >= len(a):
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
    cost = CostModel(draft_token=0.05, verify_block={1: 1.0, 2: 1.1, 3: 1.3, 4: 1.6},
                     batch={2: {"draft_token": 0.06, "verify_block": {1: 1.1, 2: 1.3, 3: 1.6, 4: 2.0},
                                "samples": {}}})  # fmt: skip
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
    rates, fixed_rates, lengths = [], [], []
    for state in picks:
        best, best_value = None, -np.inf
        for split in np.ndindex(*(m + 1,) * size):
            total = sum(split)
            value = (size + sum(survival[state[b], : split[b]].sum() for b in range(size))) / (
                m * at.draft_time() + at.verify(1 + total / size)
            )
            if value > best_value + 1e-12:
                best, best_value = split, value
        tokens = size + sum(reach[state[b], : best[b]].sum() for b in range(size))
        rates.append(tokens / (m * at.draft_time() + at.verify(1 + sum(best) / size)))
        fixed_rates.append((size + reach[state].sum()) / (m * at.draft_time() + at.verify(m + 1)))
        lengths.append(np.mean(best))
    baseline = size / at.verify(1)
    np.testing.assert_allclose(budget, np.mean(rates) / baseline, rtol=1e-9)
    np.testing.assert_allclose(fixed, np.mean(fixed_rates) / baseline, rtol=1e-12)
    np.testing.assert_allclose(verified, np.mean(lengths), rtol=1e-12)


def test_model_shapes_match_the_published_sizes_and_a_hand_forward():
    sizes = {"qwen3-0.6b": 0.596e9, "qwen3-8b": 8.19e9, "qwen3-32b": 32.76e9}  # Qwen3 model cards (total)
    for name, want in sizes.items():
        assert abs(ModelShape.from_config(name).parameters / want - 1) < 0.005
    shape = ModelShape.from_config({"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
                                    "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 10})  # fmt: skip
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
    zero_layers = {"hidden_size": 8, "num_hidden_layers": 0, "num_attention_heads": 1, "intermediate_size": 1,
                   "vocab_size": 1}  # fmt: skip
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
        [sys.executable, "-m", "cactus_theory", "plan", "--batch", "1,32,512", "--rules", "sps", "--m", "2,8",
         "--bootstrap", "0", "--quiet", "--out", str(tmp_path / "plan")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "break-even B" in out.stdout and "static batches" in out.stdout
    assert "modelled from it by a roofline" in out.stdout or DEFAULT_COST_PROFILE in out.stdout
    line = next(x for x in out.stdout.splitlines() if x.startswith("sps ") and "m=" in x)
    assert line.split()[-1] in ("512", "> 512", "32", "< 1")
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())
