"""The conformance suite every rule passes, then rule-specific laws.

A new rule is one module in cactus_theory/_rules plus one entry in RULES below.
"""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy import optimize, special, stats

from cactus_theory import (
    TAS,
    Cactus,
    ExactCactus,
    Interpolation,
    Lenience,
    Mentored,
    SpS,
    TopK,
    emitted_distribution,
    expected_accepted_length,
    mentored_target,
    simulate,
    step_metrics,
    synthetic_pairs,
)
from cactus_theory._rules._base import emitted_bruteforce

RULES = [
    SpS(),
    TAS(),
    TAS(epsilon=0.5, alpha=0.7),
    Cactus(0.5),
    Cactus(1.0, "hellinger"),
    ExactCactus(0.5),
    ExactCactus(0.3, "reverse_kl"),
    TopK(3),
    Interpolation(0.4),
    Lenience(0.6),
    Mentored(0.2),
]
IDS = [f"{r.describe()}-{getattr(r, 'divergence', '')}-{i}" for i, r in enumerate(RULES)]


def random_pair(seed, vocab, batch=()):
    rng = np.random.default_rng(seed)
    alpha = rng.choice([0.1, 0.5, 2.0])
    p = rng.dirichlet(np.full(vocab, alpha), size=batch or None)
    q = rng.dirichlet(np.full(vocab, alpha), size=batch or None)
    if rng.random() < 0.3:  # exact zeros in either distribution
        q[..., 0] = 0.0
        q = q / q.sum(axis=-1, keepdims=True)
    if rng.random() < 0.3:
        p[..., -1] = 0.0
        p = p / p.sum(axis=-1, keepdims=True)
    return p, q


# --- conformance: every rule ------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES, ids=IDS)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 9))
def test_probabilities_and_distributions(rule, seed, vocab):
    p, q = random_pair(seed, vocab, batch=(3,))
    n = np.random.default_rng(seed).integers(vocab, size=3)
    a = np.asarray(rule.acceptance(p, q, n))
    assert a.shape == (3,) and np.all((a >= 0) & (a <= 1))
    if rule.deterministic:
        assert set(np.unique(a)) <= {0.0, 1.0}
    r = np.asarray(rule.correction(p, q, n))
    assert r.shape == (3, vocab) and np.all(r >= 0)
    np.testing.assert_allclose(r.sum(-1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(rule.bonus(q), q)
    all_a = rule.acceptance_all(p, q)
    np.testing.assert_allclose(np.take_along_axis(all_a, n[:, None], -1)[:, 0], a, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("rule", RULES, ids=IDS)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 12))
def test_emitted_distribution_matches_brute_force(rule, seed, vocab):
    p, q = random_pair(seed, vocab, batch=(2,))
    fast = emitted_distribution(rule, p, q)
    np.testing.assert_allclose(fast, emitted_bruteforce(rule, p, q), rtol=1e-10, atol=1e-13)
    assert np.all(fast >= 0)
    np.testing.assert_allclose(fast.sum(-1), 1.0, rtol=1e-12)


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
    p, q = synthetic_pairs("noised", n_positions=8, vocab_size=6, seed=3, scale=1.5, noise=1.0)
    m = 3
    sim = simulate(rule, p, q, m=m, n_runs=6000, seed=11)
    # the emitted token at a rule position follows pi exactly
    pi = emitted_distribution(rule, p, q)
    assert _chi_square_p_value(sim.emitted_counts, pi) > 1e-4
    # the accepted length of a block started at t has mean AL_t
    al = expected_accepted_length(step_metrics(rule, p, q).acceptance, m)
    diff = sim.accepted - al[sim.block_start]
    assert abs(diff.mean()) < 4.5 * diff.std() / np.sqrt(diff.size) + 1e-12
    # per-position acceptance is binomial around the exact expected acceptance
    beta = step_metrics(rule, p, q).acceptance
    seen = sim.drafts > 200
    se = np.sqrt(beta[seen] * (1 - beta[seen]) / sim.drafts[seen]) + 1e-12
    assert np.all(np.abs(sim.acceptance_rate[seen] - beta[seen]) < 5 * se + 1e-12)
    # bonus tokens come from q
    assert _chi_square_p_value(sim.bonus_counts, q) > 1e-4


@pytest.mark.parametrize("rule", RULES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_numpy_and_torch_agree(rule, dtype):
    p, q = random_pair(5, 10, batch=(4,))
    n = np.array([0, 3, 7, 9])
    p_t, q_t = torch.as_tensor(p, dtype=dtype), torch.as_tensor(q, dtype=dtype)
    p_t, q_t = p_t / p_t.sum(-1, keepdim=True), q_t / q_t.sum(-1, keepdim=True)
    a_t = rule.acceptance(p_t, q_t, torch.as_tensor(n))
    r_t = rule.correction(p_t, q_t, torch.as_tensor(n))
    assert a_t.dtype == dtype and r_t.dtype == dtype and isinstance(a_t, torch.Tensor)
    p_64, q_64 = p_t.double().numpy(), q_t.double().numpy()
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    np.testing.assert_allclose(a_t.double().numpy(), rule.acceptance(p_64, q_64, n), rtol=tol, atol=tol)
    np.testing.assert_allclose(r_t.double().numpy(), rule.correction(p_64, q_64, n), rtol=tol, atol=tol)
    pi_t = emitted_distribution(rule, p_t, q_t)
    assert isinstance(pi_t, torch.Tensor) and pi_t.dtype == torch.float64


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_drafter_without_probabilities_is_one_hot(rule):
    _, q = random_pair(9, 6)
    one_hot = np.eye(6)[2]
    np.testing.assert_allclose(rule.acceptance(None, q, 2), rule.acceptance(one_hot, q, 2), rtol=1e-15)
    np.testing.assert_allclose(rule.correction(None, q, 2), rule.correction(one_hot, q, 2), rtol=1e-15)


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_bad_input_is_named(rule):
    p, q = random_pair(1, 4)
    with pytest.raises(ValueError, match="draft_probs must sum to 1"):
        rule.acceptance(p * 1.1, q, 0)
    with pytest.raises(ValueError, match="target_probs must be non-negative"):
        rule.acceptance(p, q - 0.5, 0)
    with pytest.raises(ValueError, match="target_probs must be finite"):
        rule.acceptance(p, np.full(4, np.nan), 0)
    with pytest.raises(ValueError, match="share one vocabulary"):
        rule.acceptance(np.full(5, 0.2), q, 0)
    with pytest.raises(ValueError, match=r"drafted_token must lie in \[0, 4\)"):
        rule.acceptance(p, q, 4)
    with pytest.raises(ValueError, match="draft_probs is None"):
        rule.acceptance(None, q, None)


# --- rule-specific laws ---------------------------------------------------------------------


@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 40))
def test_sps_emits_the_verifier(seed, vocab):
    p, q = random_pair(seed, vocab, batch=(2,))
    np.testing.assert_allclose(emitted_distribution(SpS(), p, q), q, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls", [Cactus, ExactCactus])
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 12))
def test_cactus_with_zero_budget_is_sps(cls, seed, vocab):
    p, q = random_pair(seed, vocab, batch=(2,))
    n = np.array([0, vocab - 1])
    rule = cls(0.0)
    assert rule.lossless
    np.testing.assert_array_equal(rule.acceptance(p, q, n), SpS().acceptance(p, q, n))
    np.testing.assert_allclose(rule.correction(p, q, n), SpS().correction(p, q, n), rtol=1e-15, atol=1e-300)
    np.testing.assert_allclose(emitted_distribution(rule, p, q), q, atol=1e-12)


@pytest.mark.parametrize("rule", [Cactus(0.01), Cactus(0.5), Cactus(2.0), ExactCactus(0.01), ExactCactus(1.0)])
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 30))
def test_theorem_3_emitted_kl_at_most_draft_kl(rule, seed, vocab):
    p, q = random_pair(seed, vocab)
    pi = emitted_distribution(rule, p, q)
    kl_pi = np.sum(special.rel_entr(pi, q))
    kl_p = np.sum(special.rel_entr(p, q))
    assert kl_pi <= kl_p * (1 + 1e-9) + 1e-12


@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 30), delta=st.floats(1e-4, 3.0))
def test_mentored_emits_its_target_within_budget(seed, vocab, delta):
    p, q = random_pair(seed, vocab)
    h = mentored_target(p, q, delta)
    pi = emitted_distribution(Mentored(delta), p, q)
    np.testing.assert_allclose(pi, h, atol=1e-12)
    kl_h = np.sum(special.rel_entr(h, q))
    kl_p = np.sum(special.rel_entr(p, q))
    assert kl_h <= delta * (1 + 1e-9)
    if kl_p > delta and np.isfinite(kl_p):
        np.testing.assert_allclose(kl_h, delta, rtol=1e-6)
    elif kl_p <= delta:
        np.testing.assert_allclose(h, p, atol=1e-15)


@pytest.mark.parametrize("seed", range(6))
def test_mentored_is_optimal_against_a_generic_solver(seed):
    """max sum min(p, h) s.t. KL(h || q) <= delta, solved by SLSQP on (h, t) with t <= p, t <= h."""
    rng = np.random.default_rng(seed)
    vocab, delta = 5, 0.05
    p, q = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab))
    x0 = np.concatenate([q, np.minimum(p, q)])
    constraints = [
        {"type": "eq", "fun": lambda x: x[:vocab].sum() - 1},
        {"type": "ineq", "fun": lambda x: delta - np.sum(special.rel_entr(np.maximum(x[:vocab], 1e-300), q))},
        {"type": "ineq", "fun": lambda x: p - x[vocab:]},
        {"type": "ineq", "fun": lambda x: x[:vocab] - x[vocab:]},
    ]
    res = optimize.minimize(
        lambda x: -x[vocab:].sum(),
        x0,
        method="SLSQP",
        bounds=[(1e-12, 1)] * (2 * vocab),
        constraints=constraints,
        options={"ftol": 1e-12, "maxiter": 500},
    )
    h = mentored_target(p, q, delta)
    assert np.minimum(p, h).sum() >= -res.fun - 1e-6


def test_tas_threshold_and_correction():
    q = np.array([0.5, 0.3, 0.15, 0.05])
    entropy = -np.sum(q * np.log(q + 1e-5))
    threshold = min(0.09, 0.3 * np.exp(-entropy))
    rule = TAS()
    for n in range(4):
        assert rule.acceptance(np.full(4, 0.25), q, n) == float(q[n] > threshold)
    np.testing.assert_array_equal(rule.correction(np.full(4, 0.25), q, 3), [1.0, 0.0, 0.0, 0.0])


def test_interpolation_emits_its_mixture_and_lenience_one_is_sps():
    p, q = random_pair(2, 8)
    np.testing.assert_allclose(emitted_distribution(Interpolation(0.3), p, q), 0.3 * p + 0.7 * q, atol=1e-14)
    n = np.arange(8)
    pb, qb = np.tile(p, (8, 1)), np.tile(q, (8, 1))
    np.testing.assert_array_equal(Lenience(1.0).acceptance(pb, qb, n), SpS().acceptance(pb, qb, n))


def test_topk_accepts_exactly_the_k_largest():
    q = np.array([0.05, 0.4, 0.1, 0.3, 0.15])
    p = np.full(5, 0.2)
    got = [TopK(2).acceptance(p, q, n) for n in range(5)]
    assert got == [0.0, 1.0, 0.0, 1.0, 0.0]


def test_edge_target_probabilities_zero_and_one():
    p = np.array([0.5, 0.5, 0.0])
    for rule in (Cactus(1.0), ExactCactus(1.0)):
        assert rule.acceptance(p, np.array([0.0, 1.0, 0.0]), 0) == 0.0  # q(n) = 0: gamma = 0
        assert rule.acceptance(p, np.array([0.0, 1.0, 0.0]), 1) == 1.0  # q(n) = 1: gamma = 1
        pi = emitted_distribution(rule, p, np.array([0.0, 1.0, 0.0]))
        np.testing.assert_allclose(pi, [0.0, 1.0, 0.0], atol=1e-15)


def test_large_vocabulary_emitted_distribution():
    rng = np.random.default_rng(0)
    vocab = 151_936
    p, q = rng.dirichlet(np.full(vocab, 0.05)), rng.dirichlet(np.full(vocab, 0.05))
    pi = emitted_distribution(Cactus(1.0), p, q)
    np.testing.assert_allclose(pi.sum(), 1.0, rtol=1e-12)
    assert np.all(pi >= 0)


def test_rule_parameters_are_checked():
    with pytest.raises(ValueError, match="delta must be a number >= 0"):
        Cactus(-1.0)
    with pytest.raises(ValueError, match="divergence must be one of"):
        ExactCactus(0.5, "kullback")
    with pytest.raises(ValueError, match=r"alpha must lie in \[0, 1\]"):
        Interpolation(1.5)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        TopK(0)
    with pytest.raises(ValueError, match=r"epsilon must lie in \(0, 1\]"):
        TAS(epsilon=0.0)
    with pytest.raises(ValueError, match=r"leniency must lie in \(0, 1\]"):
        Lenience(0.0)
    with pytest.raises(ValueError, match="delta must be a number >= 0"):
        Mentored(-0.1)
    assert Cactus(0.5) == Cactus(0.5) and hash(Cactus(0.5)) == hash(Cactus(0.5))


# --- block statistics and generators ---------------------------------------------------------


@given(beta=st.floats(0, 1), m=st.integers(1, 25))
def test_accepted_length_closed_form(beta, m):
    al = expected_accepted_length(np.full(m + 5, beta), m)
    expected = float(m) if beta == 1 else beta * (1 - beta**m) / (1 - beta)
    np.testing.assert_allclose(al[0], expected, rtol=1e-12, atol=1e-300)


def test_synthetic_pairs_are_seeded_distributions():
    for kind in ("dirichlet", "zipf", "temperature", "noised", "mixture"):
        p, q = synthetic_pairs(kind, n_positions=5, vocab_size=11, seed=4)
        assert p.shape == q.shape == (5, 11)
        np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-14)
        np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-14)
        p2, q2 = synthetic_pairs(kind, n_positions=5, vocab_size=11, seed=4)
        np.testing.assert_array_equal(p, p2)
        np.testing.assert_array_equal(q, q2)
    with pytest.raises(ValueError, match="kind must be one of"):
        synthetic_pairs("uniform")


def test_gamma_worst_case_experiment_runs(tmp_path):
    """The Gamma(delta) script (quick budgets) writes its CSV, table and figure; V = 2 exact is 1."""
    import csv
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "experiments" / "gamma_worst_case.py"
    spec = importlib.util.spec_from_file_location("gamma_worst_case", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.run(deltas=(0.1,), vocabs=(2, 4), n_random=200, n_starts=1, maxiter=5, processes=1, progress=False)
    exact_v2 = next(r for r in rows if r["rule"] == "cactus-exact" and r["vocab"] == 2)
    np.testing.assert_allclose(exact_v2["worst_ratio"], 1.0, rtol=1e-6)
    assert all(r["worst_ratio"] >= r["worst_ratio_random"] for r in rows)
    module.main(["--quick", "--out-dir", str(tmp_path)])
    with open(tmp_path / "gamma_worst_case.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 8
    assert (tmp_path / "gamma_worst_case.png").stat().st_size > 1000


@given(
    beta=st.lists(st.floats(0, 1), min_size=1, max_size=30).map(np.array),
    m=st.integers(1, 40),
)
def test_accepted_length_matches_the_definition(beta, m):
    # AL_t = sum_{k=1}^{m} prod_{j<k} beta_{t+j}, windows truncated at the end (brute force).
    expected = [
        sum(np.prod(beta[t : t + k]) if t + k <= beta.size else 0.0 for k in range(1, m + 1)) for t in range(beta.size)
    ]
    np.testing.assert_allclose(expected_accepted_length(beta, m), expected, rtol=1e-12, atol=1e-300)
    batched = expected_accepted_length(np.stack([beta, beta[::-1]]), m)
    np.testing.assert_allclose(batched[1], expected_accepted_length(beta[::-1], m), rtol=1e-15)
