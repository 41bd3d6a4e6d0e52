"""The extended-precision pieces of the compiled exact-gamma kernel, against mpmath at 50 digits.

``kl_binary_dd`` (double-double, bound 1e-26 of the terms) and ``kl_binary_fast`` (2^-60 of
the value) must hold their stated bounds on every regime the kernel sends them: g next to q,
g next to 1, q down to 1e-280, both branches of h (series below 1/8, table logarithm above).
The kernel itself must return the largest float within delta, checked float by float.
"""

import math

import mpmath as mp
import mpref
import numpy as np
import pytest

from cactus_theory._math._dd import (
    DD_BOUND,
    FAST_BOUND,
    dd_exp,
    dd_log,
    dd_log1p,
    estrin4,
    estrin_chains,
    kl_binary_dd,
    kl_binary_fast,
    log_fast,
)
from cactus_theory._math._gamma_kernels import exact_kl_gamma

pytestmark = pytest.mark.fast  # compiled with numba (the functions also run as plain Python)


def _pairs(seed, n):
    """(g, q) with q < g < 1 over every regime: g - q from 1e-15 of q to most of 1 - q, and tiny g."""
    rng = np.random.default_rng(seed)
    q = np.concatenate([rng.uniform(1e-6, 1 - 1e-6, n), 10.0 ** rng.uniform(-280, 0, n // 4)])
    scale = 10.0 ** rng.uniform(-15, 0, q.size)
    g = q + (1 - q) * scale * rng.uniform(0, 1, q.size)
    # g itself tiny: g / q from 1 + 1e-15 to 1e200 (the ratio log far from 1 while g log(g/q) is small)
    q_tiny = 10.0 ** rng.uniform(-280, -30, n // 4)
    g_tiny = q_tiny * (1 + 10.0 ** rng.uniform(-15, 200, q_tiny.size))
    q, g = np.concatenate([q, q_tiny]), np.concatenate([g, g_tiny])
    g = np.minimum(g, np.nextafter(1.0, 0.0))
    keep = (g > q) & (1 - g >= 1e-280)
    return g[keep], q[keep]


def _exact(value):
    hi, lo = value[0], value[1]
    return mp.mpf(hi) + mp.mpf(lo)


def test_kl_binary_fast_holds_its_relative_bound():
    g, q = _pairs(0, 600)
    worst = 0.0
    with mp.workdps(60):
        for gi, qi in zip(g, q, strict=True):
            hi, lo, bound = kl_binary_fast(gi, qi)
            ref = mpref.binary("kl", gi, qi)
            assert bound == pytest.approx(FAST_BOUND * hi)
            err = abs(_exact((hi, lo)) - ref)
            assert err <= mp.mpf(bound), (gi, qi, float(err / ref))
            worst = max(worst, float(err / ref))
    assert worst < FAST_BOUND / 4  # the bound keeps a margin over what is measured


def test_kl_binary_dd_holds_its_bound():
    g, q = _pairs(1, 200)
    with mp.workdps(80):
        for gi, qi in zip(g, q, strict=True):
            hi, lo, bound = kl_binary_dd(gi, qi)
            ref = mpref.binary("kl", gi, qi)
            terms = abs(gi * mp.log(mp.mpf(gi) / qi)) + abs(
                (1 - mp.mpf(gi)) * mp.log((1 - mp.mpf(gi)) / (1 - mp.mpf(qi)))
            )
            assert bound == pytest.approx(DD_BOUND * float(terms), rel=1e-6)
            assert abs(_exact((hi, lo)) - ref) <= mp.mpf(bound), (gi, qi)


@pytest.mark.parametrize(
    "x", [1e-300, 1e-280, 1e-20, 0.3, 0.5, 0.9999999, 1.0, 1.0000001, 1 + 2**-40, 1.5, 1.999, 7.0, 1e10, 1e280, 1e300]
)
def test_logarithms_against_mpmath(x):
    with mp.workdps(60):
        ref = mp.log(mp.mpf(x))
        # the table logarithm: 2^-76 absolute and 2^-102 of the value, for any positive float
        assert abs(_exact(log_fast(x, 0.0)) - ref) <= mp.mpf(2) ** -76 + abs(ref) * mp.mpf(2) ** -102
        # the double-double logarithm (one Newton step on exp): 2^-98 of |log x| on the range
        # kl_binary_dd uses (1 + w within [1.125, 1e280] or [1e-280, 0.875]), and an absolute
        # 2^-103 where |log x| <= 1: near x = 1 it is not relative, hence dd_log1p
        if 1e-280 <= x <= 1e280:
            err = abs(_exact(dd_log(x, 0.0)) - ref)
            assert err <= mp.mpf(2) ** -98 * max(1, abs(ref))
            if abs(ref) <= 1:
                assert err <= mp.mpf(2) ** -103
            ref_exp = mp.exp(mp.mpf(math.log(x)))
            assert abs(_exact(dd_exp(math.log(x))) - ref_exp) <= ref_exp * mp.mpf(2) ** -98


@pytest.mark.parametrize(
    "w", [-0.999, -0.5, -0.125, -0.1249, -1e-3, -1e-12, -1e-30, 1e-30, 1e-12, 3e-5, 0.1249, 0.125, 2.0, 1e200]
)
def test_dd_log1p_is_relative_everywhere(w):
    # kl_binary_dd's logarithms: relative to 2^-100 of log1p(w) even as w -> 0, where log(1 + w)
    # through dd_log would only hold 2^-103 absolutely
    with mp.workdps(80):
        ref = mp.log1p(mp.mpf(w))
        assert abs(_exact(dd_log1p(w, 0.0)) - ref) <= abs(ref) * mp.mpf(2) ** -100


def test_estrin_is_the_polynomial():
    rng = np.random.default_rng(2)
    coeffs = rng.normal(size=23)
    chains = estrin_chains(list(coeffs))
    for w in (-0.3, -0.01, 0.0, 0.07, 0.2):
        exact = sum(mp.mpf(float(c)) * mp.mpf(w) ** j for j, c in enumerate(coeffs))
        got = estrin4(w, *chains)
        assert abs(got - exact) <= 8 * np.finfo(float).eps * float(
            sum(abs(c) * abs(w) ** j for j, c in enumerate(coeffs))
        )


def test_kernel_returns_the_largest_feasible_float_where_b_meets_delta_almost_exactly():
    # delta = B(g0) rounded: B(g0) lies within an ulp of delta, so many of these pairs fall in
    # the 2^-60 band where the expansion cannot decide and double-double must
    rng = np.random.default_rng(5)
    q = rng.uniform(1e-4, 1 - 1e-4, 300)
    g0 = q + (1 - q) * 10.0 ** rng.uniform(-8, -0.05, q.size)
    with mp.workdps(60):
        delta = np.array([float(mpref.binary("kl", gi, qi)) for gi, qi in zip(g0, q, strict=True)])
    gamma, status, _, _ = exact_kl_gamma(q, delta)
    assert (status == 0).all()  # decided inside the kernel
    ties = 0
    for gi, qi, di in zip(gamma, q, delta, strict=True):
        assert mpref.binary("kl", float(gi), qi) <= di
        up = float(np.nextafter(gi, 2.0))
        b_up = mpref.binary("kl", up, qi)
        if b_up <= di:  # a tie closer than double-double resolves: gamma is one ulp low, no more
            ties += 1
            assert di - b_up <= kl_binary_dd(up, qi)[2]
            assert mpref.binary("kl", float(np.nextafter(up, 2.0)), qi) > di
    assert ties <= 3


def test_kernel_on_a_wide_sweep_is_the_largest_feasible_float():
    rng = np.random.default_rng(6)
    q = np.concatenate(
        [rng.uniform(1e-6, 1 - 1e-6, 150), 10.0 ** rng.uniform(-250, 0, 50), 1 - 10.0 ** rng.uniform(-15, -1, 50)]
    )
    delta = 10.0 ** rng.uniform(-30, 2, q.size)
    gamma, status, _, _ = exact_kl_gamma(q, delta)
    for gi, qi, di, si in zip(gamma, q, delta, status, strict=True):
        if si == 1:
            continue  # left to the long-double certification (tested with exact_gamma)
        assert mpref.binary("kl", float(gi), qi) <= di
        if gi < 1.0:
            assert mpref.binary("kl", float(np.nextafter(gi, 2.0)), qi) > di
