"""Block verification, strict verification, TensorRT-LLM's relaxed acceptance and greedy drafting
(issue 22), against independent computations: the algorithm enumerated over every drafted
block, the paper's toy example, the engines' loops written out, and closed forms."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cactus_theory import analyze_trace, load_trace, make_rule, step_metrics
from cactus_theory._cli import main
from cactus_theory.laws import block_accepted_length, greedy_draft
from cactus_theory.traces import trace_from_arrays


def _rows(seed, positions, vocab, zeros=0.2):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, 0.7), size=positions)
    q = rng.dirichlet(np.full(vocab, 0.7), size=positions)
    p[rng.random(p.shape) < zeros] = 0.0
    q[rng.random(q.shape) < zeros] = 0.0
    p[:, 0] += (p.sum(-1) == 0) * 1.0
    q[:, 0] += (q.sum(-1) == 0) * 1.0
    return p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)


def _algorithm_2(p, q, drafts, coins):
    """Sun et al.'s Algorithm 2 written out for one block: (tau, the rows the token after it is drawn
    from as an unnormalised weight vector). p: (m, V) draft rows, q: (m + 1, V) verifier rows."""
    m = len(drafts)
    w, tau, weights = 1.0, 0, [1.0]
    for i in range(1, m + 1):
        x = drafts[i - 1]
        ratio = q[i - 1, x] / p[i - 1, x] if p[i - 1, x] > 0 else (1.0 if q[i - 1, x] > 0 else 0.0)
        w = min(w * ratio, 1.0)
        weights.append(w)
        if i < m:
            z = np.maximum(w * q[i] - p[i], 0).sum()
            h = z / (z + 1 - w) if z + 1 - w > 0 else 1.0
        else:
            h = w
        if coins[i - 1] <= h:
            tau = i
    residual = q[m] if tau == m else np.maximum(weights[tau] * q[tau] - p[tau], 0)
    return tau, residual


@pytest.mark.parametrize("seed", range(4))
def test_block_law_is_algorithm_2_over_every_block_and_coin(seed):
    m, vocab = 3, 3
    p, q = _rows(seed, m + 1, vocab)
    rule = make_rule("block")
    grid = np.linspace(0.0005, 0.9995, 400)  # coins on a fine grid: P(coin <= h) to 1/400
    for drafts in itertools.product(range(vocab), repeat=m):
        law = rule.block_law(p[:m], q, np.array(drafts))
        np.testing.assert_allclose(law.accepted.sum(), 1.0, rtol=1e-12)
        np.testing.assert_allclose(law.emitted.sum(-1), 1.0, rtol=1e-12)
        # tau's law: the places pass independently, tau is the last that does
        counts = np.zeros(m + 1)
        for c1, c2, c3 in itertools.product(grid[::20], grid[::20], grid[::20]):
            counts[_algorithm_2(p[:m], q, drafts, (c1, c2, c3))[0]] += 1
        np.testing.assert_allclose(law.accepted, counts / counts.sum(), atol=0.09)
        for tau in range(m + 1):
            want = _algorithm_2(p[:m], q, drafts, [1.0 if j >= tau else 0.0 for j in range(m)])[1] if tau < m else q[m]
            if law.accepted[tau] > 0 and np.sum(want) > 0:
                np.testing.assert_allclose(law.emitted[tau], want / np.sum(want), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("seed", range(6))
def test_expected_tau_is_the_sum_of_expected_weights(seed):
    # E[tau] over drafted blocks x ~ p and the coins, by enumerating the algorithm's law: the
    # identity E[tau] = sum_i E[w_i] that block_accepted_length uses
    m, vocab = 3, 4
    p, q = _rows(seed, 7, vocab)  # a 7th row: the bonus position of the last block
    rule = make_rule("block")
    exact = block_accepted_length(rule, p[:6], q[:6], m, method="exact")
    for t in range(len(exact)):
        total = 0.0
        for drafts in itertools.product(range(vocab), repeat=m):
            weight = np.prod([p[t + j, x] for j, x in enumerate(drafts)])
            if weight > 0:
                law = rule.block_law(p[t : t + m], q[t : t + m + 1], np.array(drafts))
                total += weight * law.expected_accepted
        np.testing.assert_allclose(exact[t], total, rtol=1e-12)


def test_sun_et_al_toy_example():
    # M_b = (1/3, 2/3) verifier, M_s = (2/3, 1/3) drafter, gamma = 2: token-wise 10/9, block 11/9
    q, p = np.array([[1 / 3, 2 / 3]] * 3), np.array([[2 / 3, 1 / 3]] * 3)
    assert block_accepted_length("sps", p, q, 2)[0] == pytest.approx(10 / 9, rel=1e-14)
    assert block_accepted_length("block", p, q, 2)[0] == pytest.approx(11 / 9, rel=1e-14)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), m=st.integers(1, 4))
def test_block_is_never_below_token_wise_sps(seed, m):
    p, q = _rows(seed, 7, 3)
    assert np.all(block_accepted_length("block", p, q, m) >= block_accepted_length("sps", p, q, m) - 1e-12)


def test_monte_carlo_block_length_is_unbiased_and_its_error_calibrated():
    p, q = _rows(11, 300, 6, zeros=0.1)
    exact = block_accepted_length("block", p, q, 3, method="exact")
    z = []
    for seed in range(4):
        mc = block_accepted_length("block", p, q, 3, method="monte-carlo", n_paths=1024, seed=seed, full_output=True)
        assert mc.method == "monte-carlo" and mc.n_paths == 1024
        z.append((mc.accepted_length - exact) / mc.standard_error)
    z = np.concatenate(z)
    assert abs(z.mean()) < 0.1 and 0.85 < z.std() < 1.15
    with pytest.raises(ValueError, match="use method='monte-carlo'"):
        block_accepted_length("block", p, q, 3, method="exact", max_support=10)


def test_strict_accepts_with_q_and_is_lossless():
    p, q = _rows(3, 5, 6)
    rule = make_rule("strict")
    m = step_metrics(rule, p, q)
    np.testing.assert_allclose(m.acceptance, np.sum(p * q, axis=-1), rtol=1e-12)
    np.testing.assert_allclose(m.emitted, q, atol=1e-15)
    sps = step_metrics(make_rule("sps"), p, q)
    assert np.all(m.acceptance <= sps.acceptance + 1e-15)
    one_hot = greedy_draft(p)  # with a greedy draft strict is SpS
    np.testing.assert_allclose(
        step_metrics(rule, one_hot, q).acceptance, step_metrics(make_rule("sps"), one_hot, q).acceptance
    )


def _trtllm_relaxed(probs, draft, top_n, delta):
    """mtpRelaxedAcceptanceKernel's test for one position, as the kernel loops (probabilities)."""
    order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))[:top_n]
    threshold = probs[order[0]] - delta
    for jj, idx in enumerate(order):
        if jj > 0 and threshold > probs[idx]:
            break
        if draft == idx:
            return True
    return False


@pytest.mark.parametrize("top_n, delta", [(1, 0.0), (3, 0.05), (10, 0.6), (4, 1.0)])
def test_relaxed_topk_is_tensorrt_llms_test(top_n, delta):
    rng = np.random.default_rng(top_n)
    logits = rng.normal(size=(6, 12)) * 2
    q = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)  # softmax at temperature 1, no truncation
    p = rng.dirichlet(np.ones(12), size=6)
    rule = make_rule(f"relaxed-topk(top_n={top_n}, delta={delta}, probs=processed)")
    accept = rule.acceptance_all(p, q)
    for t in range(6):
        want = [_trtllm_relaxed(q[t], n, top_n, delta) for n in range(12)]
        np.testing.assert_array_equal(accept[t], np.array(want, dtype=float))
        np.testing.assert_array_equal(rule.correction(p[t], q[t], 0), np.eye(12)[np.argmax(q[t])])
    ratio = make_rule(f"relaxed-topk(top_n={top_n}, delta=none, ratio=0.5, probs=processed)")
    want = (q >= 0.5 * q.max(-1, keepdims=True)) & (np.argsort(np.argsort(-q, axis=-1), axis=-1) < top_n)
    np.testing.assert_array_equal(ratio.acceptance_all(p, q), want.astype(float))


def test_relaxed_topk_on_raw_logits_ignores_the_sampling_processing():
    from cactus_theory import SamplingSettings, processed_probs
    from cactus_theory.rules import RuleLogits

    rng = np.random.default_rng(0)
    zq, zp = rng.normal(size=(4, 20)) * 2, rng.normal(size=(4, 20))
    s = SamplingSettings(temperature=0.3, top_k=3, top_p=1.0)
    p, q = processed_probs(zp, s), processed_probs(zq, s)
    raw = np.exp(zq) / np.exp(zq).sum(-1, keepdims=True)
    rule = make_rule("relaxed-topk(top_n=5, delta=0.2)")
    got = rule.acceptance_all(p, q, logits=RuleLogits(target=zq, draft=zp, temperature=0.3))
    for t in range(4):
        want = [_trtllm_relaxed(raw[t], n, 5, 0.2) and q[t, n] > 0 for n in range(20)]
        np.testing.assert_array_equal(got[t], np.array(want, dtype=float))
    with pytest.raises(ValueError, match="exactly one of delta"):
        make_rule("relaxed-topk(delta=0.1, ratio=0.5)")


def test_greedy_drafting_makes_block_strict_and_sps_one(tmp_path):
    rng = np.random.default_rng(1)
    target = rng.normal(size=(60, 30)) * 2
    trace = trace_from_arrays(
        tmp_path / "t",
        target + rng.normal(size=target.shape),
        target,
        rng.integers(0, 30, size=60),
        sequence_lengths=[20, 20, 20],
        top_k=30,
        metadata={"sampling": {"temperature": 1.0, "top_k": 30, "top_p": 1.0}},
    )
    greedy = analyze_trace(trace, ["sps", "strict", "block"], ms=(2, 5), n_boot=0, draft_mode="greedy")
    sampled = analyze_trace(trace, ["sps", "strict", "block"], ms=(2, 5), n_boot=0)
    for m in (2, 5):
        al = {r["rule"]: r["al"] for r in greedy.rows if r["m"] == m and r["task"] == "all"}
        assert al["sps"] == pytest.approx(al["strict"], rel=1e-12) == pytest.approx(al["block"], rel=1e-9)
        al = {r["rule"]: r["al"] for r in sampled.rows if r["m"] == m and r["task"] == "all"}
        assert al["strict"] < al["sps"] <= al["block"] + 1e-9
    assert {r["draft_mode"] for r in greedy.rows} == {"greedy"}
    with pytest.raises(ValueError, match="judge whole blocks"):
        analyze_trace(trace, ["block"], ms=(2,), bonus_policy="relaxed")


def test_cli_analyze_block_strict_sps_with_greedy_drafts_on_the_embedded_trace(capsys):
    assert (
        main(
            [
                "analyze",
                "--rules",
                "block,strict,sps",
                "--draft-mode",
                "greedy",
                "--m",
                "4",
                "--bootstrap",
                "0",
                "--quiet",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "greedy drafting" in out and "block " in out and "strict " in out
    assert load_trace().n_positions > 6000


def test_block_verification_is_planned_over_the_steps_decoding_takes(tmp_path):
    """A block rule's steps follow its own law per block start (P(tau >= j) from every drafted block and coin,
    Algorithm 2 written out above), through the chain decoding walks (a step at t moves to t + 1 + tau), counted
    from position 1 to the last start where a whole block fits: the analysis's al_step, drafted and forwards
    against that walk written out. (The per-start average, ``al``, overstates the tokens a step gives when
    acceptance varies along a sequence.)"""
    rng = np.random.default_rng(7)
    vocab, n, m = 3, 9, 2
    target = rng.normal(size=(n, vocab)) * 1.5
    draft = target + rng.normal(size=target.shape)
    settings = {"sampling": {"temperature": 1.0, "top_k": 0, "top_p": 1.0}}
    trace = trace_from_arrays(
        tmp_path / "t",
        draft,
        target,
        rng.integers(0, vocab, size=n),
        sequence_lengths=[n],
        top_k=vocab,
        metadata=settings,
    )
    p, q = (np.asarray(x, dtype=np.float64) for x in next(iter(trace)).distributions(trace.sampling))
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    survival = np.zeros((n - m + 1, m))
    for t in range(n - m + 1):
        for drafts in itertools.product(range(vocab), repeat=m):
            weight = np.prod([p[t + j, drafts[j]] for j in range(m)])
            # tau is the last i whose coin passes; over the coins: P(tau >= i) = 1 - P(every coin from i on fails)
            for coins in itertools.product((0.0, 1.0), repeat=m):  # enumerate pass / fail of each coin exactly
                chance, hs = 1.0, []
                w = 1.0
                for i in range(1, m + 1):
                    x = drafts[i - 1]
                    ratio = q[t + i - 1, x] / p[t + i - 1, x] if p[t + i - 1, x] > 0 else float(q[t + i - 1, x] > 0)
                    w = min(w * ratio, 1.0)
                    if i < m:
                        z = np.maximum(w * q[t + i] - p[t + i], 0).sum()
                        hs.append(z / (z + 1 - w) if z + 1 - w > 0 else 1.0)
                    else:
                        hs.append(w)
                for h, c in zip(hs, coins, strict=True):
                    chance *= h if c else 1.0 - h
                passed = [i + 1 for i, c in enumerate(coins) if c]
                tau = max(passed) if passed else 0
                for j in range(1, tau + 1):
                    survival[t, j - 1] += weight * chance
    steps, accepted, forwards = {}, {}, {}
    for t in range(n - m, 0, -1):
        law = np.concatenate([[1.0], survival[t]]) - np.concatenate([survival[t], [0.0]])
        steps[t] = 1 + sum(law[a] * steps.get(t + 1 + a, 0.0) for a in range(m + 1))
        accepted[t] = sum(law[a] * (a + accepted.get(t + 1 + a, 0.0)) for a in range(m + 1))
        forwards[t] = m + survival[t, m - 1] + sum(law[a] * forwards.get(t + 1 + a, 0.0) for a in range(m + 1))
    (row,) = [r for r in analyze_trace(trace, ["block"], ms=(m,), n_boot=0).rows if r["task"] == "all"]
    # (the trace stores float32 logits: the rows here and the analysis's agree to ~1e-8)
    assert row["al"] == pytest.approx(survival.sum() / (n - m + 1), rel=1e-6)
    assert row["al_step"] == pytest.approx(accepted[1] / steps[1], rel=1e-6)
    assert row["drafted"] == pytest.approx(m, rel=1e-12)
    assert row["draft_forwards"] == pytest.approx(forwards[1] / steps[1], rel=1e-6)
