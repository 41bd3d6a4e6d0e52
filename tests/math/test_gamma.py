"""exact_gamma / approx_gamma against mpmath (50 digits), closed forms and laws."""

import math

import mpmath as mp
import mpref
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import budgets, interior_probabilities, probabilities

from cactus_theory import (
    APPROX_METHODS,
    FDivergence,
    approx_gamma,
    available_divergences,
    exact_gamma,
)
from cactus_theory._math._gamma import GammaConvergenceWarning

EPS = np.finfo(np.float64).eps
METHODS = ("auto", "newton", "brentq", "toms748")


def _up(x, steps):
    for _ in range(steps):
        x = float(np.nextafter(x, 2.0))
    return x


def assert_gamma_contract(name, q, delta, gamma):
    """The documented contract, checked at 50 digits: gamma never spends more than delta, and it is
    the largest such float to within 2 ulp (gamma + 3 ulp overspends, or passes 1)."""
    assert q <= gamma <= 1, (name, q, delta, gamma)
    assert mpref.binary(name, gamma, q) <= delta, (name, q, delta, gamma)  # never over, no tolerance
    if q == 0 and math.isinf(delta) and mpref.binary(name, 5e-324, q) == math.inf:
        # the documented limit delta -> inf: where every gamma > 0 has an infinite divergence from q = 0 (KL,
        # chi2) no finite budget admits one, so gamma stays 0 (a token the verifier excludes stays rejected)
        assert gamma == 0, (name, q, delta, gamma)
        return
    above = _up(gamma, 3)
    if gamma < 1 and above <= 1:
        assert mpref.binary(name, above, q) > delta, (name, q, delta, gamma, "not the largest within 2 ulp")
    if gamma == 1:
        assert mpref.binary(name, 1.0, q) <= delta


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", mpref.NAMES)
@given(q=probabilities, delta=budgets)
def test_exact_gamma_matches_mpmath(name, method, q, delta):
    gamma = exact_gamma(q, delta, name, method=method)
    assert isinstance(gamma, np.floating)
    assert_gamma_contract(name, q, delta, float(gamma))


@pytest.mark.parametrize("name", mpref.NAMES)
def test_vectorised_path_matches_mpmath_on_an_array(name):
    rng = np.random.default_rng(7)
    q = np.concatenate([rng.random(40), 10.0 ** rng.uniform(-12, 0, 20), 1 - 10.0 ** rng.uniform(-12, -1, 10)])
    delta = np.concatenate([10.0 ** rng.uniform(-10, 1, 60), rng.uniform(0, 3, 10)])
    gamma, result = exact_gamma(q, delta, name, full_output=True)
    assert result.all_converged and result.flag == "converged"
    assert gamma.shape == q.shape and result.iterations.shape == q.shape
    for qi, di, gi in zip(q, delta, gamma, strict=False):
        assert_gamma_contract(name, qi, di, gi)
    np.testing.assert_allclose(gamma, exact_gamma(q, delta, name, method="brentq"), rtol=16 * EPS, atol=0)


@pytest.mark.parametrize("name", mpref.NAMES)
def test_edges_are_exact(name):
    q = np.array([0.0, 0.2, 1.0, 0.7, 0.3])
    delta = np.array([0.0, 0.0, 0.5, math.inf, 1e-300])
    gamma = exact_gamma(q, delta, name)
    assert gamma[1] == 0.2 and gamma[2] == 1.0 and gamma[3] == 1.0
    assert gamma[0] == 0.0
    assert 0.3 <= gamma[4] <= 0.3 + 1e-140


def test_zero_target_prob_is_never_raised_when_f_grows_superlinearly():
    # KL and chi2: 0 f(gamma/0) = inf for gamma > 0, so gamma* = 0 whatever delta (< inf).
    assert exact_gamma(0.0, 50.0, "kl") == 0.0
    assert exact_gamma(0.0, 50.0, "chi2") == 0.0
    # reverse KL: B(gamma; 0) = -log(1 - gamma), so gamma* = 1 - exp(-delta).
    np.testing.assert_allclose(exact_gamma(0.0, 0.5, "reverse_kl"), -math.expm1(-0.5), rtol=4 * EPS)


@given(q=interior_probabilities, delta=st.floats(1e-8, 5.0))
def test_chi2_hellinger_and_tv_closed_forms(q, delta):
    # chi2: B = (gamma - q)^2 / (q (1 - q))
    expected = min(q + math.sqrt(delta * q * (1 - q)), 1.0)
    np.testing.assert_allclose(exact_gamma(q, delta, "chi2"), expected, rtol=1e-14)
    # squared Hellinger: with q = cos^2(theta), gamma = cos^2(phi): B = 2 - 2 cos(theta - phi)
    theta = math.atan2(math.sqrt(1 - q), math.sqrt(q))
    width = 2 * math.asin(min(math.sqrt(delta) / 2, 1.0))
    expected = 1.0 if width >= theta else math.cos(theta - width) ** 2
    np.testing.assert_allclose(exact_gamma(q, delta, "hellinger"), expected, rtol=1e-12)
    # TV: B = gamma - q
    np.testing.assert_allclose(exact_gamma(q, delta, "tv"), min(q + delta, 1.0), rtol=4 * EPS)


@pytest.mark.parametrize("name", mpref.NAMES)
@given(
    q=st.lists(interior_probabilities, min_size=2, max_size=20),
    delta=st.lists(st.floats(1e-9, 10.0), min_size=2, max_size=20),
)
def test_monotone_in_delta_and_q(name, q, delta):
    q, delta = np.sort(q), np.sort(delta)
    g = exact_gamma(0.3, delta, name)
    assert np.all(g[1:] >= g[:-1])  # exactly: the certified largest feasible float
    slack = 1 - 8 * EPS  # in q, gamma* is nondecreasing; the float grid of B_f may differ by a few ulp
    g = exact_gamma(q, 0.3, name)
    assert np.all(g[1:] >= g[:-1] * slack)


@pytest.mark.parametrize("name", mpref.NAMES)
@given(q=st.floats(0.9, 1 - 1e-12), delta=st.floats(1e-3, 200.0))
def test_monotone_in_delta_near_one(name, q, delta):
    # reverse KL near q = 0.997 used to step down as delta grew (issue 13)
    deltas = delta * np.array([1.0, 1.0 + 1e-12, 1.001, 1.1, 2.0])
    g = exact_gamma(q, deltas, name)
    assert np.all(np.diff(g) >= 0)
    for di, gi in zip(deltas, g, strict=True):
        assert mpref.binary(name, float(gi), q) <= di


@pytest.mark.parametrize(
    ("name", "q", "delta"),
    [("kl", 0.9, 1e-30), ("chi2", 0.5, 1e-30), ("tv", 0.5, 1e-16), ("reverse_kl", 0.99, 100.0), ("js", 0.3, 1e-25)],
)
def test_overspending_cases_of_issue_13(name, q, delta):
    gamma = float(exact_gamma(q, delta, name))
    assert_gamma_contract(name, q, delta, gamma)
    if name == "reverse_kl":
        assert gamma < 1  # B(1; q) = inf for reverse KL


@pytest.mark.parametrize("name", mpref.NAMES)
def test_six_hundred_random_pairs_never_overspend(name):
    rng = np.random.default_rng(13)
    q = np.concatenate([rng.random(60), 10.0 ** rng.uniform(-15, 0, 20), 1 - 10.0 ** rng.uniform(-15, -1, 20)])
    delta = 10.0 ** rng.uniform(-30, 2, 100)
    for method in METHODS:
        gamma = exact_gamma(q, delta, name, method=method)
        for qi, di, gi in zip(q, delta, gamma, strict=True):
            assert_gamma_contract(name, qi, di, float(gi))


@given(q=probabilities)
def test_delta_zero_is_lossless(q):
    for name in mpref.NAMES:
        assert exact_gamma(q, 0.0, name) == q
        assert approx_gamma(q, 0.0, name) == q


def test_broadcasting_like_a_ufunc():
    q = np.linspace(0.05, 0.95, 6).reshape(3, 2)
    delta = np.array([0.1, 1.0])
    g = exact_gamma(q, delta)
    assert g.shape == (3, 2)
    assert g[1, 1] == exact_gamma(q[1, 1], 1.0)
    assert exact_gamma([], 1.0).shape == (0,)


# --- approximations ---------------------------------------------------------------------


def test_taylor_is_the_papers_corollary_5():
    q, delta = np.array([0.1, 0.3, 0.6]), 0.2
    np.testing.assert_allclose(approx_gamma(q, delta), q + np.sqrt(2 * delta * q * (1 - q)), rtol=4 * EPS)
    # any f: the increment scales as 1 / sqrt(f''(1)): chi2 has f''(1) = 2, JS 1/4
    np.testing.assert_allclose(approx_gamma(q, delta, "chi2") - q, np.sqrt(delta * q * (1 - q)), rtol=1e-14)
    np.testing.assert_allclose(approx_gamma(q, 0.05, "js") - q, np.sqrt(8 * 0.05 * q * (1 - q)), rtol=1e-14)
    assert approx_gamma(0.35, 1.0) == 1.0  # clipped


@given(q=interior_probabilities, delta=st.one_of(st.floats(1e-12, 3.0), st.floats(-12, 0.5).map(lambda e: 10**e)))
def test_corollary_6_taylor_at_most_one_half_respects_kl(q, delta):
    gamma = float(approx_gamma(q, delta))
    if gamma <= 0.5:
        b = mpref.binary("kl", gamma, q)
        rounding = abs(mpref.binary("kl", gamma + 4 * np.spacing(gamma), q) - b)
        assert b <= delta + rounding


def test_corollary_6_fails_outside_its_region():
    # Hao & Mou's Corollary 5 outside Corollary 6's region:
    # q = 0.9, delta = 0.01 gives KL ~ 0.0116 > 0.01; q = 0.35, delta = 1 clips to 1, KL = -log 0.35.
    gamma = float(approx_gamma(0.9, 0.01))
    np.testing.assert_allclose(float(mpref.binary("kl", gamma, 0.9)), 0.0116, atol=5e-5)
    assert mpref.binary("kl", gamma, 0.9) > 0.01
    assert approx_gamma(0.35, 1.0) == 1.0
    np.testing.assert_allclose(float(mpref.binary("kl", 1.0, 0.35)), -math.log(0.35), rtol=1e-15)


@pytest.mark.parametrize("name", mpref.NAMES)
@given(q=probabilities, delta=budgets)
def test_safe_never_exceeds_delta(name, q, delta):
    gamma = float(approx_gamma(q, delta, name, method="safe"))
    assert q <= gamma <= 1
    assert mpref.binary(name, gamma, q) <= delta  # exact comparison at 50 digits, no tolerance


@pytest.mark.parametrize("name", ["kl", "reverse_kl", "hellinger", "js"])
def test_higher_order_forms_beat_taylor_for_small_delta(name):
    q = np.linspace(0.05, 0.95, 37)[:, None]
    delta = np.logspace(-8, -4, 9)[None, :]
    exact = exact_gamma(q, delta, name)
    err = {m: np.max(np.abs(approx_gamma(q, delta, name, method=m) - exact)) for m in ("taylor", "taylor3", "newton")}
    assert err["taylor3"] < err["taylor"] / 50
    assert err["newton"] < err["taylor"] / 50


@pytest.mark.parametrize("method", ["taylor", "taylor3", "newton"])
def test_total_variation_closed_forms_are_exact(method):
    q = np.array([0.0, 0.2, 0.95])
    np.testing.assert_allclose(approx_gamma(q, 0.1, "tv", method=method), [0.1, 0.3, 1.0], rtol=4 * EPS)


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize("func", [exact_gamma, approx_gamma])
def test_bad_input_names_the_argument(func):
    with pytest.raises(ValueError, match=r"target_prob must be a probability in \[0, 1\]; got 1.5"):
        func(1.5, 0.1)
    with pytest.raises(ValueError, match=r"target_prob .* NaN"):
        func([0.2, np.nan], 0.1)
    with pytest.raises(ValueError, match=r"delta must be a divergence budget >= 0.*got -0.1"):
        func(0.2, -0.1)
    with pytest.raises(ValueError, match=r"delta .* NaN"):
        func(0.2, np.nan)
    with pytest.raises(ValueError, match="divergence must be one of"):
        func(0.2, 0.1, "kullback")
    with pytest.raises(ValueError, match=r"target_prob with shape \(3,\), delta with shape \(2,\)"):
        func([0.1, 0.2, 0.3], [0.1, 0.2])


def test_bad_solver_options():
    with pytest.raises(ValueError, match="method must be"):
        exact_gamma(0.2, 0.1, method="bisect")
    with pytest.raises(ValueError, match="rtol"):
        exact_gamma(0.2, 0.1, rtol=-1)
    with pytest.raises(ValueError, match="maxiter"):
        exact_gamma(0.2, 0.1, maxiter=0)
    with pytest.raises(ValueError, match="method must be one of"):
        approx_gamma(0.2, 0.1, method="pade")


def test_full_output_reports_non_convergence():
    with pytest.warns(GammaConvergenceWarning, match="did not converge in maxiter=1 iterations"):
        _gamma, result = exact_gamma([0.1, 0.2], [0.3, 2.5], maxiter=1, full_output=True)
    assert not result.all_converged
    assert "did not converge in 1 iterations" in result.flag
    assert np.all(result.residual <= 0)  # still feasible


@pytest.mark.parametrize("method", METHODS)
def test_full_output_reports_method_residual_and_calls(method):
    gamma, result = exact_gamma([0.3, 0.5, 0.7], [1.0, 1e-8, 0.0], "chi2", method=method, full_output=True)
    used = {"auto": "closed-form inverse"}.get(method, method)
    assert result.method == used
    for qi, di, gi, ri in zip([0.3, 0.5, 0.7], [1.0, 1e-8, 0.0], gamma, result.residual, strict=True):
        truth = mpref.binary("chi2", float(gi), qi) - mp.mpf(di)
        # B_f is evaluated in long double (error <= 256 of its ulps relative to B_f ~ delta)
        assert float(ri) == pytest.approx(float(truth), rel=1e-9, abs=256 * float(np.finfo(np.longdouble).eps) * di)
        assert ri <= 0
    assert result.function_calls[2] == 0 and np.all(result.function_calls[:2] >= 2)


def test_user_divergence_is_certified_too():
    import sympy

    t = sympy.symbols("t", positive=True)
    kl = FDivergence.from_sympy("kl-as-written", t * sympy.log(t))
    q = np.array([0.9, 0.5, 0.01, 0.3])
    delta = np.array([1e-30, 1e-8, 0.5, 1.0])
    for qi, di, gi in zip(q, delta, exact_gamma(q, delta, kl), strict=True):
        assert mpref.binary("kl", float(gi), qi) <= di
    # away from cancellation it is within a few ulp of the built-in
    np.testing.assert_allclose(exact_gamma(0.3, 1.0, kl), exact_gamma(0.3, 1.0), rtol=1e-12)


@pytest.mark.parametrize(
    ("f", "match"),
    [
        (lambda t: np.sin(t) - np.sin(1.0), "f must be convex"),
        (lambda t: np.where(t > 2, np.nan, (t - 1) ** 2), "f must be finite"),
        (lambda t: (t - 1) ** 2 + 1, r"f\(1\) must be 0"),
    ],
)
def test_generators_are_checked_when_built(f, match):
    with pytest.raises(ValueError, match=match):
        FDivergence.from_callable("bad", f, 2.0)


def test_every_gamma_form_is_non_decreasing_in_delta_on_a_dense_grid():
    deltas = np.concatenate([[0.0], np.logspace(-10, 5, 1500), [np.inf]])
    qs = np.concatenate([[0.0, 1e-300, 1e-12], np.linspace(0, 1, 201)[1:-1], [1 - 1e-12, 1.0]])
    checked = 0
    for div in available_divergences():
        for method in APPROX_METHODS:
            try:
                g = approx_gamma(qs[:, None], deltas[None, :], div, method=method)
            except ValueError:  # a method this divergence does not define (e.g. no f''')
                continue
            steps = np.diff(g, axis=1)
            where = np.argwhere(steps < 0)
            assert where.size == 0, (div, method, qs[where[0][0]], deltas[where[0][1]])
            checked += 1
    assert checked >= 15
    # the case of the issue: q = 0.9 under KL
    g = approx_gamma(0.9, np.array([0.01, 0.1, 1.0, 10.0]), method="taylor3")
    assert np.all(np.diff(g) >= 0) and g[-1] == 1.0
