"""worst_case_drift (Gamma(delta) search) and plot_step."""

import matplotlib
import numpy as np
import pytest
from scipy import special

from cactus_theory import Cactus, SpS
from cactus_theory._rules._reference import emitted_bruteforce
from cactus_theory.compare import plot_step
from cactus_theory.laws import worst_case_drift
from cactus_theory.rules import TopK

matplotlib.use("Agg")


def test_lossless_rule_has_no_drift():
    w = worst_case_drift(SpS(), 5, n_random=200, n_starts=1, maxiter=5)
    assert w.worst_divergence < 1e-12
    assert np.isnan(w.worst_ratio)  # SpS has no budget


def test_reported_pair_attains_the_reported_drift():
    rule = Cactus(0.1)
    w = worst_case_drift(rule, 6, n_random=400, n_starts=1, maxiter=10, seed=3)
    pi = emitted_bruteforce(rule, w.draft_probs, w.target_probs)  # independent O(V^2) path
    kl = float(np.sum(special.rel_entr(pi, w.target_probs)))
    assert kl == pytest.approx(w.worst_divergence, rel=1e-9)
    assert w.worst_ratio == pytest.approx(kl / 0.1, rel=1e-9)
    assert w.worst_ratio >= w.worst_random  # the polish never loses the best start
    assert w.evaluations > 400


def test_two_tokens_exact_cactus_never_exceeds_delta():
    # With V = 2, pi is a two-point distribution between q and the exact target: KL(pi || q) <= delta.
    for delta in (0.01, 0.5):
        w = worst_case_drift(Cactus(delta, bonus="exact"), 2, n_random=400, n_starts=1, maxiter=10)
        assert w.worst_ratio <= 1 + 1e-9


def test_small_budget_drifts_more_than_delta_with_a_vocabulary():
    # Theorem 3's point: the per-token budget does not bound what is emitted (found at V = 8).
    w = worst_case_drift(Cactus(0.01, bonus="exact"), 8, n_random=2000, n_starts=1, maxiter=15)
    assert w.worst_ratio > 2.0


def test_deterministic_for_a_seed():
    a = worst_case_drift(TopK(2), 4, n_random=100, n_starts=1, maxiter=3, seed=7)
    b = worst_case_drift(TopK(2), 4, n_random=100, n_starts=1, maxiter=3, seed=7)
    assert a.worst_divergence == b.worst_divergence


@pytest.mark.parametrize(("kwargs", "match"), [({"vocab": 1}, "vocab"), ({"vocab": 4, "n_random": 2}, "n_random")])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        worst_case_drift(SpS(), **kwargs)


def test_plot_step_draws_p_q_and_the_emitted_distribution():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(7)), rng.dirichlet(np.ones(7))
    rule = Cactus(0.5)
    ax = plot_step(rule, p, q)
    order = np.argsort(-q)
    heights = [np.array([bar.get_height() for bar in c]) for c in ax.containers]
    np.testing.assert_allclose(heights[0], p[order])
    np.testing.assert_allclose(heights[1], q[order])
    np.testing.assert_allclose(heights[2], emitted_bruteforce(rule, p, q)[order], atol=1e-12)
    with pytest.raises(ValueError, match="draft_probs and target_probs"):
        plot_step(rule, p, q[:5])
