"""Divergences: binary and full forms against mpmath; registry; user-defined generators."""

import math

import mpmath as mp
import mpref
import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from strategies import probabilities

from cactus_theory import (
    FDivergence,
    binary_divergence,
    cactus_surrogate,
    divergence,
    exact_gamma,
    generator_facts,
    get_divergence,
    register_divergence,
)

EPS = np.finfo(np.float64).eps


@pytest.mark.parametrize("name", mpref.NAMES)
@given(gamma=probabilities, q=probabilities)
def test_binary_divergence_matches_mpmath(name, gamma, q):
    got = float(binary_divergence(gamma, q, name))
    want = mpref.binary(name, gamma, q)
    if want > np.finfo(np.float64).max:  # infinite, or overflows a float
        assert got == math.inf
    else:
        # a few ulp of the value itself (or of the smallest subnormal)
        assert abs(mp.mpf(got) - want) <= 64 * EPS * want + 4 * np.spacing(float(want)), (got, want)


@pytest.mark.parametrize("name", mpref.NAMES)
def test_binary_divergence_edges(name):
    q = np.array([0.0, 0.0, 1.0, 0.3, 0.3, 1.0])
    g = np.array([0.0, 1.0, 1.0, 0.3, 1.0, 0.0])
    got = binary_divergence(g, q, name)
    want = [float(mpref.binary(name, gi, qi)) for gi, qi in zip(g, q, strict=False)]
    np.testing.assert_allclose(got, want, rtol=1e-15)
    assert got[0] == 0 and got[2] == 0 and got[3] == 0


@pytest.mark.parametrize("name", mpref.NAMES)
@given(data=st.data(), size=st.sampled_from([2, 3, 7, 50]))
def test_full_divergence_matches_mpmath(name, data, size):
    raw = data.draw(hnp.arrays(np.float64, (2, size), elements=st.floats(0, 1)))
    raw[:, 0] += 1e-3  # never an all-zero row
    dist, target = raw / raw.sum(axis=1, keepdims=True)
    got = float(divergence(dist, target, name))
    want = mpref.divergence(name, dist, target)
    if want == mp.inf:
        assert got == math.inf
    else:
        np.testing.assert_allclose(got, float(want), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", mpref.NAMES)
@given(seed=st.integers(0, 2**32 - 1), size=st.sampled_from([2, 5, 50, 1000]), delta=st.floats(1e-6, 3.0))
def test_cactus_surrogate_spends_exactly_delta(name, seed, size, delta):
    """D_f(cactus_surrogate(q, n, gamma*) || q) = delta, or gamma* = 1 within budget."""
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.full(size, 0.5))
    q = q / q.sum()
    n = int(rng.integers(size))
    gamma = float(exact_gamma(q[n], delta, name))
    h = cactus_surrogate(q, n, gamma)
    assert h[n] == gamma
    d = float(divergence(h, q, name))
    if gamma > 1 - 1e-12:  # gamma* = 1, or a root closer to 1 than floats resolve (reverse KL)
        assert d <= delta * (1 + 1e-12)
    else:
        # delta lies between the divergences spent at gamma (1 -+ 4 eps): the solver's tolerance
        lo = float(divergence(cactus_surrogate(q, n, gamma * (1 - 4 * EPS)), q, name))
        hi = float(divergence(cactus_surrogate(q, n, min(gamma * (1 + 4 * EPS), 1.0)), q, name))
        assert lo * (1 - 1e-9) <= delta <= hi * (1 + 1e-9), (lo, d, hi, delta)


def test_builtin_constants_match_a_symbolic_derivation():
    for name in ("kl", "reverse_kl", "chi2", "hellinger", "js"):
        div, facts = get_divergence(name), generator_facts(name)
        assert div.f_second_at_one == pytest.approx(facts.f_second_at_one, rel=1e-15)
        assert div.f_third_at_one == pytest.approx(facts.f_third_at_one, rel=1e-15)
        assert div.slope_at_infinity == pytest.approx(facts.slope_at_infinity, rel=1e-15)
        t = np.linspace(0.05, 5, 23)
        np.testing.assert_allclose(div.f(t), facts.f(t), rtol=1e-13, atol=1e-15)


def test_names_aliases_and_objects():
    assert get_divergence("KL") is get_divergence("kullback_leibler")
    div = get_divergence("chi2")
    assert get_divergence(div) is div
    with pytest.raises(ValueError, match=r"divergence must be one of \[.*'kl'.*\]"):
        get_divergence("kld")
    with pytest.raises(ValueError, match="divergence must be a name or an FDivergence"):
        get_divergence(3)


def test_user_divergence_from_a_callable_agrees_with_the_builtin():
    user = FDivergence.from_callable(
        "my_kl", lambda t: t * np.log(t), 1.0, f_prime=lambda t: np.log(t) + 1.0, f_third_at_one=-1.0
    )
    q = np.linspace(0.02, 0.98, 25)
    for delta in (1e-3, 0.1, 1.0):
        # the user's f is evaluated as written: a few digits are lost to cancellation
        np.testing.assert_allclose(exact_gamma(q, delta, user), exact_gamma(q, delta, "kl"), rtol=1e-8)
    # without a derivative the solver falls back to secant steps
    no_derivative = FDivergence.from_callable("my_kl_noderiv", lambda t: t * np.log(t), 1.0)
    np.testing.assert_allclose(exact_gamma(q, 0.1, no_derivative), exact_gamma(q, 0.1, "kl"), rtol=1e-8)


def test_user_divergence_from_sympy_and_registration(monkeypatch):
    from cactus_theory._math import _divergences

    # the registration is this test's own: later tests in this process see only the built-ins
    monkeypatch.setattr(_divergences, "_REGISTRY", dict(_divergences._REGISTRY))
    # Neyman chi-squared: f(t) = (t - 1)^2 / t, so B = (gamma - q)^2 / (gamma (1 - gamma)) in closed form
    t = sp.Symbol("t", positive=True)
    neyman = FDivergence.from_sympy("neyman_chi2", (t - 1) ** 2 / t)
    assert neyman.f_second_at_one == 2.0
    register_divergence(neyman, overwrite=True)
    q, delta = 0.3, 0.2
    gamma = float(exact_gamma(q, delta, "neyman_chi2"))
    np.testing.assert_allclose((gamma - q) ** 2 / (gamma * (1 - gamma)), delta, rtol=1e-10)
    with pytest.raises(ValueError, match="already registered"):
        register_divergence(FDivergence.from_sympy("neyman_chi2", (t - 1) ** 2 / t))


def test_user_divergence_is_checked_when_built():
    with pytest.raises(ValueError, match="f_second_at_one must be a finite number > 0"):
        FDivergence.from_callable("flat", lambda t: 0 * t, 0.0)
    with pytest.raises(TypeError, match="div must be an FDivergence"):
        register_divergence("kl")


def test_full_divergence_bad_input():
    with pytest.raises(ValueError, match="dist must sum to 1"):
        divergence([0.5, 0.6], [0.5, 0.5])
    with pytest.raises(ValueError, match="target_probs must be non-negative"):
        divergence([0.5, 0.5], [1.5, -0.5])
    with pytest.raises(ValueError, match="share one vocabulary"):
        divergence([0.5, 0.5], [0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="must be finite"):
        divergence([np.nan, 1.0], [0.5, 0.5])
    with pytest.raises(ValueError, match="gamma must be a probability"):
        binary_divergence(1.2, 0.5)
