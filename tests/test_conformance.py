"""The conformance suite: every registered rule passes it without a line written for it.

The rules under test are generated from the registry (``available_rules``): each spec name at
its defaults, plus every parameter setting its class lists in ``examples``. A rule class that
registers itself is therefore tested here the moment it exists. Inputs are raw logits processed
with random sampling settings (temperature, top-k, top-p), so q and p have exact zeros, one-hot
rows and ties, and the rules that need raw logits get them.
"""

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from cactus_theory import (
    RuleLogits,
    SamplingSettings,
    available_rules,
    emitted_distribution,
    expected_accepted_length,
    make_rule,
    processed_probs,
    simulate,
    step_metrics,
)
from cactus_theory._emitted import block_sums
from cactus_theory._rules._base import _REGISTRY, emitted_bruteforce


def _registered_rules():
    rules = {}
    for info in available_rules().values():
        settings = [{}] + [
            {k: v for k, v in ex.items() if k not in info.fixed}
            for ex in info.rule_class.examples
            if all(ex.get(k, v) == v for k, v in info.fixed.items())
        ]
        for params in settings:
            rule = info.rule_class(**{**info.fixed, **params})
            rules.setdefault(rule.describe(), rule)
    return list(rules.values())


RULES = _registered_rules()
IDS = [r.describe() for r in RULES]


def test_every_registered_name_is_under_test():
    assert {r.family for r in RULES} == set(_REGISTRY)


def make_case(seed, vocab, batch=()):
    """(p, q, RuleLogits): Gaussian raw logits processed with random settings."""
    rng = np.random.default_rng(seed)
    shape = (*batch, vocab)
    scale = rng.choice([0.5, 2.0, 6.0])
    zq = rng.normal(size=shape) * scale
    zp = zq * rng.uniform(0, 1) + rng.normal(size=shape) * scale
    if rng.random() < 0.2:  # a tie at the verifier's maximum
        zq[..., 1] = zq.max(axis=-1)
    settings = SamplingSettings(
        temperature=float(rng.choice([0.6, 1.0, 1.7])),
        top_k=int(rng.choice([0, 1, max(1, vocab // 2), vocab])),
        top_p=float(rng.choice([1.0, 0.9, 0.6])),
    )
    p, q = processed_probs(zp, settings), processed_probs(zq, settings)
    return p, q, RuleLogits(target=zq, draft=zp, temperature=settings.temperature)


def given_logits(rule, lg):
    return lg if rule.needs_logits else None


# --- the suite --------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES, ids=IDS)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 9))
def test_probabilities_and_distributions(rule, seed, vocab):
    p, q, lg = make_case(seed, vocab, batch=(3,))
    n = np.random.default_rng(seed).integers(vocab, size=3)
    a = np.asarray(rule.acceptance(p, q, n, logits=lg))
    assert a.shape == (3,) and np.all((a >= 0) & (a <= 1))
    if rule.deterministic:
        assert set(np.unique(a)) <= {0.0, 1.0}
    r = np.asarray(rule.correction(p, q, n, logits=lg))
    assert r.shape == (3, vocab) and np.all(r >= 0)
    np.testing.assert_allclose(r.sum(-1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(rule.bonus_distribution(p, q), q)
    np.testing.assert_allclose(
        rule.bonus_distribution(p, q, policy="relaxed", logits=lg), emitted_distribution(rule, p, q, logits=lg)
    )
    all_a = rule.acceptance_all(p, q, logits=lg)
    np.testing.assert_allclose(np.take_along_axis(all_a, n[:, None], -1)[:, 0], a, rtol=1e-13, atol=1e-15)
    # no rule accepts a token that both models exclude
    assert np.all(all_a[(p == 0) & (q == 0)] == 0)


@pytest.mark.parametrize("rule", RULES, ids=IDS)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 12))
def test_emitted_distribution_matches_brute_force(rule, seed, vocab):
    p, q, lg = make_case(seed, vocab, batch=(2,))
    fast = emitted_distribution(rule, p, q, logits=lg)
    np.testing.assert_allclose(fast, emitted_bruteforce(rule, p, q, logits=lg), rtol=1e-10, atol=1e-13)
    assert np.all(fast >= 0)
    np.testing.assert_allclose(fast.sum(-1), 1.0, rtol=1e-12)
    if rule.lossless:
        np.testing.assert_allclose(fast, q, atol=1e-12)


def _chi_square_p_value(counts, probs, min_expected=5.0):
    """Pooled chi-square goodness of fit over positions (small cells lumped together)."""
    stat, dof = 0.0, 0
    for obs, pr in zip(counts, probs, strict=True):
        total = obs.sum()
        if total < 100:
            continue
        expected = total * pr
        big = expected >= min_expected
        o = np.append(obs[big], obs[~big].sum())
        e = np.append(expected[big], expected[~big].sum())
        keep = e > 0
        assert np.all(o[~keep] == 0), "a token with zero exact probability was emitted"
        o, e = o[keep], e[keep]
        stat += np.sum((o - e) ** 2 / e)
        dof += len(o) - 1
    return stats.chi2.sf(stat, max(dof, 1))


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_monte_carlo_agrees_with_exact(rule):
    p, q, lg = make_case(3, 6, batch=(8,))
    p2, q2, lg2 = make_case(4, 6, batch=(8,))
    # mix in positions without truncation so that every rule has rejections to sample
    p, q = np.where(np.arange(8)[:, None] % 2, p, p2), np.where(np.arange(8)[:, None] % 2, q, q2)
    lg = RuleLogits(
        target=np.where(np.arange(8)[:, None] % 2, lg.target, lg2.target),
        draft=np.where(np.arange(8)[:, None] % 2, lg.draft, lg2.draft),
        temperature=lg.temperature,
    )
    logits = given_logits(rule, lg)
    m = 1 if rule.slot_dependent else 3  # a slot-dependent rule: one slot per block, ``at_slot(0)``
    rule = rule.at_slot(0)
    sim = simulate(rule, p, q, m=m, n_runs=6000, seed=11, logits=logits, bonus_policy="relaxed")
    pi = emitted_distribution(rule, p, q, logits=logits)
    assert _chi_square_p_value(sim.emitted_counts, pi) > 1e-4
    # the relaxed bonus follows the rule's emitted law at the bonus slot
    pi_bonus = emitted_distribution(rule.at_slot(m), p, q, logits=logits)
    assert _chi_square_p_value(sim.bonus_counts, pi_bonus) > 1e-4
    # the accepted length of a block started at t has mean AL_t
    beta = step_metrics(rule, p, q, logits=logits).acceptance
    al = expected_accepted_length(beta, m)
    diff = sim.accepted - al[sim.block_start]
    assert abs(diff.mean()) < 4.5 * diff.std() / np.sqrt(diff.size) + 1e-12
    # per-position acceptance is binomial around the exact expected acceptance
    seen = sim.drafts > 200
    se = np.sqrt(beta[seen] * (1 - beta[seen]) / sim.drafts[seen]) + 1e-12
    assert np.all(np.abs(sim.acceptance_rate[seen] - beta[seen]) < 5 * se + 1e-12)
    # and under the verifier policy the bonus tokens come from q
    sim_v = simulate(rule, p, q, m=m, n_runs=3000, seed=12, logits=logits)
    assert _chi_square_p_value(sim_v.bonus_counts, q) > 1e-4


@pytest.mark.parametrize("rule", RULES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_numpy_and_torch_agree(rule, dtype):
    p, q, lg = make_case(5, 10, batch=(4,))
    n = np.array([0, 3, 7, 9])
    p_t, q_t = torch.as_tensor(p, dtype=dtype), torch.as_tensor(q, dtype=dtype)
    p_t, q_t = p_t / p_t.sum(-1, keepdim=True), q_t / q_t.sum(-1, keepdim=True)
    lg_t = RuleLogits(
        target=torch.as_tensor(lg.target, dtype=dtype),
        draft=torch.as_tensor(lg.draft, dtype=dtype),
        temperature=lg.temperature,
    )
    a_t = rule.acceptance(p_t, q_t, torch.as_tensor(n), logits=lg_t)
    r_t = rule.correction(p_t, q_t, torch.as_tensor(n), logits=lg_t)
    assert a_t.dtype == dtype and r_t.dtype == dtype and isinstance(a_t, torch.Tensor)
    p_64, q_64 = p_t.double().numpy(), q_t.double().numpy()
    lg_64 = RuleLogits(
        target=lg_t.target.double().numpy(), draft=lg_t.draft.double().numpy(), temperature=lg.temperature
    )
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    np.testing.assert_allclose(a_t.double().numpy(), rule.acceptance(p_64, q_64, n, logits=lg_64), rtol=tol, atol=tol)
    np.testing.assert_allclose(r_t.double().numpy(), rule.correction(p_64, q_64, n, logits=lg_64), rtol=tol, atol=tol)
    pi_t = emitted_distribution(rule, p_t, q_t, logits=lg_t)
    assert isinstance(pi_t, torch.Tensor) and pi_t.dtype == torch.float64


@pytest.mark.parametrize("rule", RULES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_are_accepted(rule, dtype):
    p, q, lg = make_case(6, 8, batch=(3,))
    p_t, q_t = torch.as_tensor(p).to(dtype), torch.as_tensor(q).to(dtype)
    lg_t = RuleLogits(
        target=torch.as_tensor(lg.target).to(dtype), draft=torch.as_tensor(lg.draft).to(dtype), temperature=0.6
    )
    n = torch.tensor([0, 4, 7])
    a = rule.acceptance(p_t, q_t, n, logits=lg_t)
    r = rule.correction(p_t, q_t, n, logits=lg_t)
    assert a.dtype == dtype and r.dtype == dtype
    assert torch.all((a >= 0) & (a <= 1)) and torch.all(r >= 0)
    pi = emitted_distribution(rule, p_t, q_t, logits=lg_t)
    np.testing.assert_allclose(pi.sum(-1).numpy(), 1.0, rtol=1e-9)


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_drafter_without_probabilities_is_one_hot(rule):
    _, q, lg = make_case(9, 6)
    one_hot = np.eye(6)[2]
    logits = given_logits(rule, lg)
    np.testing.assert_allclose(
        rule.acceptance(None, q, 2, logits=logits), rule.acceptance(one_hot, q, 2, logits=logits), rtol=1e-15
    )
    np.testing.assert_allclose(
        rule.correction(None, q, 2, logits=logits), rule.correction(one_hot, q, 2, logits=logits), rtol=1e-15
    )


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_bad_input_is_named(rule):
    p, q, lg = make_case(1, 4)
    p, q = np.full(4, 0.25), np.array([0.1, 0.2, 0.3, 0.4])
    logits = given_logits(rule, lg)
    with pytest.raises(ValueError, match="draft_probs must sum to 1"):
        rule.acceptance(p * 1.1, q, 0, logits=logits)
    with pytest.raises(ValueError, match="target_probs must be non-negative"):
        rule.acceptance(p, q - 0.5, 0, logits=logits)
    with pytest.raises(ValueError, match="target_probs must be finite"):
        rule.acceptance(p, np.full(4, np.nan), 0, logits=logits)
    with pytest.raises(ValueError, match="share one vocabulary"):
        rule.acceptance(np.full(5, 0.2), q, 0, logits=logits)
    with pytest.raises(ValueError, match=r"drafted_token must lie in \[0, 4\)"):
        rule.acceptance(p, q, 4, logits=logits)
    with pytest.raises(ValueError, match="draft_probs is None"):
        rule.acceptance(None, q, None, logits=logits)
    with pytest.raises(ValueError, match=r"logits must be a RuleLogits"):
        rule.acceptance(p, q, 0, logits=lg.target)
    with pytest.raises(ValueError, match=r"logits\.target contains NaN"):
        rule.acceptance(p, q, 0, logits=dataclasses.replace(lg, target=np.full(4, np.nan)))
    with pytest.raises(ValueError, match=r"logits.target with shape \(3,\)"):
        rule.acceptance(p, q, 0, logits=dataclasses.replace(lg, target=np.zeros(3)))
    if rule.needs_logits:
        with pytest.raises(ValueError, match=r"needs the .* logits from before temperature"):
            rule.acceptance(p, q, 0)


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_spec_string_round_trips(rule):
    assert make_rule(rule.describe()) == rule
    assert hash(make_rule(rule.describe())) == hash(rule)


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_block_drift_matches_its_definition(rule):
    # block_sums against the plain double loop over slots (per-slot rates for slot-dependent rules)
    p, q, lg = make_case(2, 7, batch=(9,))
    logits = given_logits(rule, lg)
    m = 3
    slots = [step_metrics(rule.at_slot(j), p, q, logits=logits) for j in range(m + 1)]
    beta = np.stack([s.acceptance for s in slots])
    kl = np.stack([s.kl_emitted_target for s in slots])
    got = block_sums(beta[:m], kl[:m], m, kl[m], per_slot=True)
    for t in range(9):
        reach, want = 1.0, 0.0
        for k in range(m + 1):
            if t + k >= 9:
                break
            want += reach * kl[k][t + k] if reach > 0 else 0.0
            if k < m:
                reach *= beta[k][t + k]
        np.testing.assert_allclose(got[t], want, rtol=1e-12, atol=1e-300)
