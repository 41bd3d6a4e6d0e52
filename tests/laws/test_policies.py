"""Drafting policies (issue 24): each policy's block lengths and accepted length against a plain
loop over block starts, the fixed policy against the closed form, and the CLI."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cactus_theory import CostModel, analyze_trace, expected_accepted_length, load_trace, predict_speedup
from cactus_theory._cli import main
from cactus_theory._laws._policies import policy_blocks
from cactus_theory.laws import make_draft_policy


def _rows(seed, positions=30, vocab=6):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, rng.choice([0.2, 1.0, 5.0])), size=positions)
    beta = rng.uniform(0, 1, size=positions)
    return p, beta


def _loop(policy, p, beta, m, cost=None):
    """The policy written out for each block start: (AL, drafted, forwards)."""
    out = []
    n = len(p)
    for t in range(n):
        al, reach, confidence, drafted, forwards = 0.0, 1.0, 1.0, 0, 0
        expected, seconds = 1.0, float(cost.verify(1)) if cost is not None else None
        for j in range(m):
            if t + j >= n:
                break
            row = p[t + j]
            top1 = row.max()
            entropy = -sum(x * math.log(x) for x in row if x > 0)
            forwards += 1
            kind = policy.kind if policy is not None else "fixed"
            if kind == "p-min" and top1 < policy.threshold:
                break
            if kind == "entropy" and entropy > policy.threshold:
                break
            if kind == "accept-prob" and confidence * top1 < policy.threshold:
                break
            if kind == "cost-optimal":
                gain = confidence * top1
                extra = cost.draft_time() + float(cost.verify(j + 2)) - float(cost.verify(j + 1))
                if not gain * seconds > expected * extra:
                    break
                expected, seconds = expected + gain, seconds + extra
            reach *= beta[t + j]
            al += reach
            drafted += 1
            confidence *= top1
        else:  # all m drafted, none stopped: when all are accepted the drafter reads its last draft (one forward)
            forwards += reach
        out.append((al, drafted, forwards))
    return np.array(out)


@pytest.mark.parametrize("spec", ["fixed", "p-min(0.4)", "entropy(1)", "accept-prob(0.3)", "cost-optimal"])
@pytest.mark.parametrize("seed", range(4))
def test_policy_blocks_equal_the_policy_written_out(spec, seed):
    p, beta = _rows(seed)
    policy = make_draft_policy(spec)
    cost = CostModel(draft_token=0.05, verify_block={1: 1.0, 5: 1.2, 9: 1.9})
    for m in (1, 3, 8):
        want = _loop(policy, p, beta, m, cost)
        al, drafted, forwards = policy_blocks(policy, p, beta, m, cost)
        np.testing.assert_allclose(al, want[:, 0], atol=1e-12)
        np.testing.assert_array_equal(drafted, want[:, 1])
        np.testing.assert_allclose(forwards, want[:, 2], rtol=0, atol=1e-12)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31), m=st.integers(1, 12))
def test_the_fixed_policy_is_the_closed_form_and_stopping_never_adds(seed, m):
    p, beta = _rows(seed)
    al, drafted, fixed_forwards = policy_blocks(None, p, beta, m)
    np.testing.assert_allclose(al, expected_accepted_length(beta, m), atol=1e-12)
    # fixed blocks: m drafts (cut at the end) and, when all m are accepted, one more forward
    n = len(beta)
    full = np.array([np.prod(beta[t : t + m]) if t + m <= n else 0.0 for t in range(n)])
    np.testing.assert_allclose(fixed_forwards, drafted + full, rtol=0, atol=1e-12)
    for spec in ("p-min(0.5)", "entropy(0.8)", "accept-prob(0.4)"):
        al_p, drafted_p, forwards = policy_blocks(make_draft_policy(spec), p, beta, m)
        assert (al_p <= al + 1e-12).all() and (drafted_p <= drafted).all()
        assert (forwards <= np.minimum(drafted_p + 1, fixed_forwards) + 1e-12).all() and (forwards >= drafted_p).all()
    # thresholds that never stop are the fixed policy, to the last bit
    for spec in ("p-min(0)", "entropy(1000)", "accept-prob(0)"):
        for got, want in zip(
            policy_blocks(make_draft_policy(spec), p, beta, m), (al, drafted, fixed_forwards), strict=True
        ):
            np.testing.assert_array_equal(got, want)


def test_policy_specs_and_bad_ones():
    assert make_draft_policy("p-min(0.4)").describe() == "p-min(0.4)"
    assert make_draft_policy("entropy(threshold=1.5)").threshold == 1.5
    assert make_draft_policy("fixed") is None and make_draft_policy(None) is None
    assert make_draft_policy("cost-optimal").needs_cost
    for bad, match in (
        ("p-min", "needs a threshold"),
        ("p-min(1.5)", "probability in"),
        ("entropy(-1)", "finite number >= 0"),
        ("greedy(0.3)", "unknown policy"),
        ("cost-optimal(2)", "takes no threshold"),
        ("p-min(x)", "not a number"),
    ):
        with pytest.raises(ValueError, match=match):
            make_draft_policy(bad)
    with pytest.raises(ValueError, match="needs a cost model"):
        policy_blocks(make_draft_policy("cost-optimal"), *_rows(0), 4)


def test_analysis_rows_of_policies():
    trace = load_trace()
    result = analyze_trace(
        trace, ["sps"], ms=(4,), n_boot=0, draft_policies=["p-min(0.4)", "p-min(0)"], tasks=["gsm8k"]
    )
    rows = {r.get("draft_policy"): r for r in result.rows if r["task"] == "all"}
    assert rows["p-min(0)"]["al"] == pytest.approx(rows[None]["al"], rel=1e-12)
    for key in ("al_step", "drafted", "draft_forwards", "verify_mix"):  # never stopping: fixed blocks, bit for bit
        assert rows["p-min(0)"][key] == rows[None][key]
    # a full block's extra forward: forwards - drafted is the chance all m drafts are accepted, per step
    assert 0 < rows[None]["draft_forwards"] - rows[None]["drafted"] < rows[None]["acceptance_by_position"][0]
    assert rows["p-min(0.4)"]["al"] < rows[None]["al"] and rows["p-min(0.4)"]["drafted"] < 4
    # vLLM's per-position acceptance: decreasing in the place, the first is the acceptance where a block starts
    by_pos = rows[None]["acceptance_by_position"]
    assert len(by_pos) == 4 and all(a >= b for a, b in itertools.pairwise(by_pos))
    assert sum(by_pos) == pytest.approx(rows[None]["al"], rel=1e-12)  # AL = sum of P(draft j accepted)
    with pytest.raises(ValueError, match="judge whole blocks"):
        analyze_trace(trace, ["block"], ms=(2,), draft_policies=["p-min(0.4)"])
    with pytest.raises(ValueError, match="needs cost="):
        analyze_trace(trace, ["sps"], ms=(2,), draft_policies=["cost-optimal"])


def test_cli_plan_with_a_drafting_policy_on_the_embedded_trace(capsys):
    assert (
        main(
            [
                "plan",
                "--draft-policy",
                "p-min(0.4)",
                "--cost-ratio",
                "0.3",
                "--rules",
                "sps,cactus",
                "--delta",
                "1",
                "--m",
                "2,4,8",
                "--bootstrap",
                "100",
                "--quiet",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "p-min(0.4)" in out and "fixed" in out and "a what-if" in out
    assert (
        main(
            [
                "plan",
                "--draft-policy",
                "auto",
                "--cost-profile",
                "qwen3-32b-0.6b-gb200-vllm",
                "--rules",
                "sps",
                "--m",
                "4,8",
                "--bootstrap",
                "0",
                "--quiet",
                "--task",
                "gsm8k",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "measured profile qwen3-32b-0.6b-gb200-vllm (NVIDIA GB200, vllm 0.20.1)" in out
    assert "cost-optimal" in out and "entropy(0.5)" in out


def test_cli_plan_without_a_cost_uses_the_measured_default_profile(capsys):
    # the command, as written: no cost given -> the shipped measured GPU profile, said so
    assert (
        main(
            [
                "plan",
                "--draft-policy",
                "p-min(0.4)",
                "--rules",
                "sps",
                "--m",
                "2,4",
                "--bootstrap",
                "0",
                "--quiet",
                "--task",
                "gsm8k",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "measured profile qwen3-32b-0.6b-gb200-vllm" in out and "(the default: no calibration" in out
    assert "another pair than the trace's (qwen2.5-coder-1.5b-instruct-q4_k_m" in out
    assert "p-min(0.4)" in out
    with pytest.raises(SystemExit):
        main(["plan", "--cost-ratio", "0.3", "--cost-profile", "qwen3-32b-0.6b-gb200-vllm"])
    capsys.readouterr()
    assert main(["plan", "--cost-profile", "nope", "--quiet"]) != 0
    assert "unknown cost profile 'nope'; the profiles: qwen3-32b-0.6b-gb200-vllm" in capsys.readouterr().err


def _llama_server_blocks(draft_logits, target_probs, p_min, n_min, n_max):
    """llama-server's draft-simple and its verification written out per block start (common/speculative.cpp,
    common_sampler_sample_and_accept_n): the drafter drafts the argmax of its top-10 at temperature 1 while
    that top-10's top-1 probability is >= p_min, at most n_max; fewer than n_min drafts are dropped; the
    verifier accepts a draft when its own sample equals it. (exact AL, drafted, draft forwards) per start."""
    n = len(draft_logits)
    out = []
    for t in range(n):
        drafts, forwards = [], 0
        for j in range(n_max):
            if t + j >= n:
                break
            forwards += 1
            row = draft_logits[t + j]
            top10 = np.sort(row)[::-1][:10]
            p10 = np.exp(top10 - top10[0]) / np.exp(top10 - top10[0]).sum()
            if p10[0] < p_min:
                break
            drafts.append(int(np.argmax(row)))
        if len(drafts) < n_min:
            drafts = []
        al, reach = 0.0, 1.0
        for j, d in enumerate(drafts):
            reach *= target_probs[t + j][d]  # P(the verifier samples the draft)
            al += reach
        out.append((al, len(drafts), forwards + 1))  # + the verifier's block, which the drafter processes too
    return np.array(out)


@pytest.mark.parametrize(("p_min", "n_min", "n_max"), [(0.0, 0, 3), (0.5, 0, 4), (0.3, 2, 5), (0.9, 1, 2)])
def test_the_llama_cpp_policy_is_llama_servers_drafting_and_verification(p_min, n_min, n_max):
    from cactus_theory import SamplingSettings
    from cactus_theory.traces import trace_from_arrays

    rng = np.random.default_rng(7)
    vocab, positions = 40, 60
    draft_logits = rng.normal(0, 3, (positions, vocab))
    target_logits = draft_logits + rng.normal(0, 1.5, (positions, vocab))
    tokens = rng.integers(0, vocab, positions)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        trace = trace_from_arrays(tmp, draft_logits, target_logits, tokens, top_k=vocab)
        settings = SamplingSettings(temperature=0.7, top_k=20, top_p=1.0)
        policy = f"llama.cpp(p_min={p_min}, n_min={n_min})"
        res = analyze_trace(
            trace, rules=["strict"], ms=[n_max], settings=settings, draft_mode="greedy", draft_policies=[policy]
        )
        seq = next(iter(trace))
        _, q = seq.distributions(settings)
    # the verifier's processed distribution on the trace's support, back on token ids
    support = np.concatenate([seq.topk_ids["target"], seq.topk_ids["draft"]], axis=-1)
    target = np.zeros((positions, vocab))
    for i in range(positions):
        for j, tok in enumerate(support[i]):
            target[i, tok] = max(target[i, tok], q[i, j])
    expected = _llama_server_blocks(draft_logits, target, p_min, n_min, n_max)
    starts = positions - n_max + 1
    block = res.sequences[0].rules["strict"].block(n_max, make_draft_policy(policy).describe())
    np.testing.assert_allclose(block.al_sum, expected[:starts, 0].sum(), rtol=1e-10)
    np.testing.assert_allclose(block.drafted_sum, expected[:starts, 1].sum(), rtol=0)
    np.testing.assert_allclose(block.forwards_sum, expected[:starts, 2].sum(), rtol=1e-10)


def test_the_llama_cpp_law_agrees_with_simulating_the_server_loop():
    """Monte Carlo of the server's loop (the verifier samples, the draft is kept while they agree) at one block
    start against the exact accepted length of the policy."""
    rng = np.random.default_rng(3)
    vocab, n_max = 12, 4
    draft_logits = rng.normal(0, 2.5, (n_max, vocab))
    target = rng.dirichlet(np.full(vocab, 0.5), size=n_max)
    exact = _llama_server_blocks(draft_logits, target, 0.2, 0, n_max)[0]  # (AL, drafted, forwards)
    policy = make_draft_policy("llama.cpp(p_min=0.2)")
    top1 = np.array(
        [
            np.sort(np.exp(r - r.max()))[::-1][:10].max() / np.sort(np.exp(r - r.max()))[::-1][:10].sum()
            for r in draft_logits
        ]
    )
    greedy = np.argmax(draft_logits, axis=-1)
    beta = target[np.arange(n_max), greedy]
    al, drafted, forwards = policy_blocks(policy, np.eye(vocab)[greedy], beta, n_max, features=(top1, np.zeros(n_max)))
    assert al[0] == pytest.approx(exact[0]) and drafted[0] == exact[1] and forwards[0] == pytest.approx(exact[2])
    draws = 200_000
    accepted = np.zeros(draws)
    alive = np.ones(draws, dtype=bool)
    for j in range(int(drafted[0])):
        sampled = np.array([rng.choice(vocab, size=draws, p=target[j])])[0]
        alive &= sampled == greedy[j]
        accepted += alive
    se = accepted.std() / np.sqrt(draws)
    assert abs(accepted.mean() - al[0]) < 5 * se


def test_llama_cpp_policy_specs():
    assert make_draft_policy("llama.cpp").describe() == "llama.cpp(p_min=0)"
    assert make_draft_policy("llama.cpp(0.25, 3)") == make_draft_policy("llama.cpp(p_min=0.25, n_min=3)")
    for bad, match in [
        ("llama.cpp(p_min=2)", r"\[0, 1\]"),
        ("llama.cpp(n_min=1.5)", "whole number"),
        ("llama.cpp(q=1)", "not a parameter"),
        ("p-min(0.3, n_min=1)", "not a parameter"),
        ("llama.cpp(p_min=0.5, p_min=0.6)", "p_min is given twice"),
        ("llama.cpp(0.5, 2, 3)", r"at most 2 value\(s\) \(p_min, n_min\); got 3"),
        ("p-min(0.4, 3)", r"at most 1 value\(s\) \(threshold\)"),
        ("llama.cpp(n_min=inf)", "n_min = 'inf' must be a finite number"),
        ("llama.cpp(n_min=1e400)", "must be a finite number"),
        ("llama.cpp(n_min=nan)", "must be a finite number"),
        ("llama.cpp(n_min=1e300)", r"\[0, 4096\].*got 1e\+300$"),
    ]:
        with pytest.raises(ValueError, match=match):
            make_draft_policy(bad)


def test_renewal_steps_equal_a_monte_carlo_of_decoding_the_sequence():
    """The steps a whole sequence takes (each step drafts L_t, accepts A ~ the prefix law of beta, moves to
    t + 1 + A), simulated, against ``renewal_steps``'s dynamic programme."""
    from cactus_theory._laws._policies import renewal_steps

    rng = np.random.default_rng(11)
    n, m = 40, 4
    beta = rng.uniform(0, 1, n)
    drafted = np.minimum(rng.integers(0, m + 1, n), n - np.arange(n))
    forwards = drafted + 1.0
    steps, accepted, drafts, passes, mix = renewal_steps(beta, drafted, forwards, m)
    draws = 20_000
    got = np.zeros((draws, 4))
    seen_mix = np.zeros(m + 1)
    for d in range(draws):
        t, row = 1, np.zeros(4)
        while t < n:
            a = 0
            while a < drafted[t] and rng.random() < beta[t + a]:
                a += 1
            row += (1, a, drafted[t], forwards[t])
            seen_mix[drafted[t]] += 1
            t += 1 + a
        got[d] = row
    mean, se = got.mean(0), got.std(0) / np.sqrt(draws)
    for value, mu, s in zip((steps, accepted, drafts, passes), mean, se, strict=True):
        assert abs(value - mu) < 5 * s + 1e-12
    np.testing.assert_allclose(mix.sum(), steps)
    np.testing.assert_allclose(mix, seen_mix / draws, atol=0.05 * steps)


def test_renewal_steps_of_a_sequence_that_accepts_everything_or_nothing():
    from cactus_theory._laws._policies import renewal_steps

    n, m = 13, 3
    full = renewal_steps(np.ones(n), np.minimum(np.full(n, m), n - np.arange(n)), np.full(n, m), m)
    # positions 1..12 in steps of m + 1 = 4 tokens: 3 steps, 9 accepted
    assert full[:2] == (3.0, 9.0)
    none = renewal_steps(np.zeros(n), np.full(n, m), np.full(n, m), m)
    # one token a step at positions 1..12; the blocks at 11 and 12 are cut at the end (2 and 1 drafts)
    assert none[:4] == (12.0, 0.0, 33.0, 36.0) and list(none[4]) == [0.0, 1.0, 1.0, 10.0]


def test_a_step_charges_re_read_drafts_and_the_mix_of_block_sizes_as_written_out():
    cost = CostModel(draft_token=0.02, verify_block={1: 0.04, 2: 0.07, 3: 0.10, 4: 0.12}, draft_read_token=0.005)
    mix = [0.2, 0.3, 0.5]  # steps that draft 0, 1, 2 tokens
    step = cost.step_time(2, 1.1, drafted=1.3, forwards=2.0, reads=1.1, verify_mix=mix)
    by_hand = 2.0 * 0.02 + 1.1 * 0.005 + (0.2 * 0.04 + 0.3 * 0.07 + 0.5 * 0.10)
    assert step == pytest.approx(by_hand, rel=1e-12)
    assert cost.speedup(2, 1.1, drafted=1.3, forwards=2.0, reads=1.1, verify_mix=mix) == pytest.approx(
        2.1 * 0.04 / by_hand, rel=1e-12
    )
    # without a cost of a token read in a block the drafter's own token cost is charged (an upper bound)
    plain = CostModel(draft_token=0.02, verify_block={1: 0.04})
    assert plain.step_time(1, 0.5, reads=1.0) == pytest.approx(0.02 + 0.02 + 0.04)


@pytest.mark.parametrize("never", ["p-min(0)", "entropy(1000)"])
def test_a_policy_that_never_stops_is_planned_as_fixed_blocks_to_the_last_bit(never):
    """Issue 43, item 3: p-min(0) and entropy(1000) predicted 1.083x where fixed m = 4 predicted 1.026x (the policy
    rows were not charged the draft forward after a fully accepted block)."""
    trace = load_trace()
    cost = CostModel.from_profile("qwen3-32b-0.6b-gb200-vllm")
    result = analyze_trace(
        trace, ["sps", "cactus(delta=1)"], ms=(2, 4), n_boot=200, draft_policies=[never], tasks=["gsm8k", "humaneval"]
    )
    plan = predict_speedup(result, cost)
    fixed = {(r["rule"], r["m"], r["task"]): r for r in plan.rows if not r.get("draft_policy")}
    policy = [r for r in plan.rows if r.get("draft_policy") == never]
    assert len(policy) == len(fixed) == 12
    for r in policy:
        f = fixed[(r["rule"], r["m"], r["task"])]
        for key in ("speedup", "speedup_lo", "speedup_hi", "step_time", "tokens_per_step", "request_speedup"):
            assert r.get(key, "absent") == f.get(key, "absent"), (key, r.get(key), f.get(key))
    # and what a fixed step costs, written out from the row's own expectations: m forwards, the extra forward
    # with its chance, the verifier's block mix, all over the steps decoding takes
    r = fixed[("sps", 4, "all")]
    extra = r["draft_forwards"] - r["drafted"]
    mix = np.asarray(r["verify_mix"])
    by_hand = (r["drafted"] + extra) * cost.draft_token + sum(w * float(cost.verify(L + 1)) for L, w in enumerate(mix))
    assert r["step_time"] == pytest.approx(by_hand, rel=1e-12)
    assert r["speedup"] == pytest.approx((r["al_step"] + 1) * float(cost.verify(1)) / by_hand, rel=1e-12)
