"""The rules engines shipped in 2026, each against its authors' code or description written out step by step
here (plain loops over a small vocabulary, every drafted token enumerated): MARS (5SSjw/MARS's
``evaluate_posterior``, sampling branch), vLLM's relaxed thinking (#45229), sampler-match verification (the
engines' "verify by agreement"), and TensorRT-LLM's MTP relaxed acceptance (``relaxed_topk`` /
``relaxed_delta``), which is the registered ``relaxed-topk``: one rule."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cactus_theory import SamplingSettings, make_rule, processed_probs
from cactus_theory._math._logits import RuleLogits


def _pair(seed, vocab=9, temperature=0.7, top_k=6, top_p=0.95, offset=0.0):
    """(raw target logits, draft p, processed q) on a small vocabulary; ``offset`` shifts every logit."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 2, size=vocab) + offset
    q = processed_probs(z, SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p))
    p = rng.dirichlet(np.full(vocab, 0.7))
    return z, p, q


def _mars_reference(z, p, q, temperature, theta, residual="authors"):
    """The authors' evaluate_posterior for one chain position, written out: the processed logits (z / T, -inf
    where the sampler excludes), their first two, the ratio second / (first + 1e-10); over theta: the draft
    accepted iff among those two, a rejection drawn from q; else accepted with min(1, q(n) / p(n)) and a
    rejection drawn from q with gtp[n] = max(0, q(n) - p(n)) renormalised (the code's), or norm((q - p)+).
    The law of the emitted token, every draft enumerated."""
    vocab = len(q)
    zp = [z[i] / temperature if q[i] > 0 else -math.inf for i in range(vocab)]
    order = sorted(range(vocab), key=lambda i: (-zp[i], i))
    first, second = zp[order[0]], zp[order[1]]
    ratio = second / (first + 1e-10) if first + 1e-10 != 0 else math.inf
    relaxed = ratio > theta
    law = np.zeros(vocab)
    for n in range(vocab):
        if p[n] == 0:
            continue
        if relaxed:
            accept = 1.0 if n in order[:2] else 0.0
            correction = np.array(q)
        else:
            accept = min(1.0, q[n] / p[n])
            if residual == "authors":
                gtp = np.array(q)
                gtp[n] = max(0.0, q[n] - p[n])
            else:
                gtp = np.maximum(np.array(q) - p, 0.0)
            correction = gtp / gtp.sum() if gtp.sum() > 0 else np.array(q)
        law[n] += p[n] * accept
        law += p[n] * (1 - accept) * correction
    return law, relaxed


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    theta=st.sampled_from([0.5, 0.8, 0.9, 0.97]),
    offset=st.sampled_from([0.0, 10.0, -3.0]),
    residual=st.sampled_from(["authors", "sps"]),
)
def test_mars_is_its_authors_code(seed, theta, offset, residual):
    z, p, q = _pair(seed, offset=offset)
    rule = make_rule(f"mars(theta={theta}, residual={residual})")
    logits = RuleLogits(target=z, temperature=0.7)
    want, _ = _mars_reference(z, p, q, 0.7, theta, residual)
    np.testing.assert_allclose(rule.emitted(p, q, logits=logits), want, atol=1e-13)
    # the per-token interface gives the same law
    by_token = sum(
        p[n] * (float(rule.acceptance(p, q, n, logits=logits)) * np.eye(len(q))[n])
        + p[n] * (1 - float(rule.acceptance(p, q, n, logits=logits))) * rule.correction(p, q, n, logits=logits)
        for n in range(len(q))
        if p[n] > 0
    )
    np.testing.assert_allclose(by_token, want, atol=1e-13)


def test_mars_sees_the_raw_logits_ratio_so_a_constant_added_changes_its_law():
    """The same processed q, logits shifted by a constant: the softmax is unchanged, the ratio of the first two
    logits is not, so MARS relaxes at one offset and not at the other (documented: what the rule sees)."""
    z = np.array([2.0, 1.9, 0.0, -1.0, -2.0])
    p = np.array([0.1, 0.2, 0.5, 0.1, 0.1])
    rule = make_rule("mars(theta=0.9)")
    settings_ = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0)
    low, high = z, z + 20.0
    q_low, q_high = processed_probs(low, settings_), processed_probs(high, settings_)
    np.testing.assert_allclose(q_low, q_high, rtol=1e-12)
    # ratio 1.9 / 2 = 0.95 > 0.9: relaxed (the top two accepted); 21.9 / 22 = 0.995: relaxed too; shift down
    # by 2: -0.1 / 0 -> a huge negative ratio: not relaxed
    assert float(rule.acceptance(p, q_low, 1, logits=RuleLogits(target=low, temperature=1.0))) == 1.0
    shifted = z - 2.0
    a = float(rule.acceptance(p, q_low, 1, logits=RuleLogits(target=shifted, temperature=1.0)))
    assert a == pytest.approx(min(1.0, q_low[1] / p[1]))
    assert not _mars_reference(shifted, p, q_low, 1.0, 0.9)[1] and _mars_reference(low, p, q_low, 1.0, 0.9)[1]


def test_mars_under_greedy_decoding_is_strict_verification():
    z, p, _ = _pair(3)
    q = processed_probs(z, SamplingSettings(temperature=0.0))
    rule = make_rule("mars")
    np.testing.assert_allclose(rule.emitted(p, q, logits=RuleLogits(target=z, temperature=0.0)), q)


def _relaxed_thinking_reference(z, p, q, top_n, ratio):
    """vLLM #45229 written out: accept iff the draft is among the top_n raw logits and z(n) >= z_max +
    log(ratio); otherwise the verifier's own (argmax) token."""
    order = sorted(range(len(z)), key=lambda i: (-z[i], i))[:top_n]
    argmax = int(np.argmax(q))
    law = np.zeros(len(z))
    for n in range(len(z)):
        accepted = n in order and z[n] >= z[order[0]] + math.log(ratio)
        law[n if accepted else argmax] += p[n]
    return law


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), ratio=st.sampled_from([0.1, 0.5, 0.9]), top_n=st.sampled_from([2, 3, 5]))
def test_vllm_relaxed_thinking_is_its_description(seed, ratio, top_n):
    z, p, q = _pair(seed, top_k=6)
    rule = make_rule(f"relaxed-thinking(top_n={top_n}, ratio={ratio})")
    logits = RuleLogits(target=z, temperature=0.7)
    np.testing.assert_allclose(rule.emitted(p, q, logits=logits), _relaxed_thinking_reference(z, p, q, top_n, ratio))
    # where q keeps the top_n raw logits, it is relaxed-topk's ratio form over the raw logits
    if np.all(q[np.argsort(-z, kind="stable")[:top_n]] > 0):
        twin = make_rule(f"relaxed-topk(top_n={top_n}, delta=none, ratio={ratio}, probs=logits)")
        np.testing.assert_allclose(rule.emitted(p, q, logits=logits), twin.emitted(p, q, logits=logits))


def test_vllm_relaxed_thinking_accepts_a_draft_the_sampler_excludes():
    z = np.array([3.0, 2.8, 2.7, -5.0])
    q = processed_probs(z, SamplingSettings(temperature=1.0, top_k=1, top_p=1.0))  # only the argmax kept
    p = np.array([0.0, 0.0, 1.0, 0.0])
    logits = RuleLogits(target=z, temperature=1.0)
    assert float(make_rule("relaxed-thinking").acceptance(p, q, 2, logits=logits)) == 1.0  # logit 2.7 >= 3 - 0.69
    assert float(make_rule("relaxed-topk(top_n=3, delta=none, ratio=0.5)").acceptance(p, q, 2, logits=logits)) == 0.0


def test_sampler_match_is_strict_verification():
    """Draw y ~ q with the sampler, accept the draft iff it equals y, emit y: acceptance q(n), the law q;
    a Monte Carlo of that procedure agrees."""
    rng = np.random.default_rng(0)
    _, p, q = _pair(11)
    rule, strict = make_rule("sampler-match"), make_rule("strict")
    np.testing.assert_allclose(rule.acceptance_all(p, q), q)
    np.testing.assert_allclose(rule.emitted(p, q), strict.emitted(p, q))
    draws = 200_000
    n = rng.choice(len(p), size=draws, p=p)
    y = rng.choice(len(q), size=draws, p=q)
    assert abs(np.mean(n == y) - float(p @ q)) < 4 * math.sqrt(float(p @ q) / draws)
    assert rule.lossless


def _trtllm_relaxed(z, p, q, relaxed_topk, relaxed_delta):
    """TensorRT-LLM's MTP relaxed acceptance, as its kernel describes it: the softmax of the raw logits at
    temperature 1, its top ``relaxed_topk`` candidates, threshold = the top-1's probability - relaxed_delta; the
    draft accepted when it is a candidate at or above the threshold (the top-1 always), else the top-1 token."""
    s = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    candidates = sorted(range(len(z)), key=lambda i: (-s[i], i))[:relaxed_topk]
    threshold = s[candidates[0]] - relaxed_delta
    golden = int(np.argmax(q))
    law = np.zeros(len(z))
    for n in range(len(z)):
        accepted = (n in candidates and s[n] >= threshold and q[n] > 0) or n == candidates[0]
        law[n if accepted else golden] += p[n]
    return law


@pytest.mark.parametrize(("relaxed_topk", "relaxed_delta"), [(1, 0.0), (3, 0.1), (10, 0.6)])
def test_tensorrt_llms_relaxed_acceptance_is_relaxed_topk(relaxed_topk, relaxed_delta):
    rule = make_rule(f"relaxed-topk(top_n={relaxed_topk}, delta={relaxed_delta})")
    for seed in range(40):
        z, p, q = _pair(seed, top_k=0, top_p=1.0, temperature=1.0)  # the kernel's softmax at temperature 1
        np.testing.assert_allclose(
            rule.emitted(p, q, logits=RuleLogits(target=z, temperature=1.0)),
            _trtllm_relaxed(z, p, q, relaxed_topk, relaxed_delta),
            atol=1e-13,
        )


def test_the_2026_rules_declare_their_frontier_grids():
    for spec in ("mars", "relaxed-thinking", "relaxed-topk"):
        grid = type(make_rule(spec)).frontier
        assert len(grid) >= 5 and all(isinstance(g, dict) for g in grid)
        [make_rule(spec).__class__(**{**g}) for g in grid]  # each setting builds
