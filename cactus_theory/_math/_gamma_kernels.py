"""Compiled kernels of the exact Cactus bonus (numba): the largest gamma whose binary divergence
stays within delta, certified to the last float for the KL divergence (``exact_kl_gamma``) and from the
closed form for chi-squared and squared Hellinger (``exact_closed_gamma``), and double-double residuals
(``dd_residuals``). Their NumPy / mpmath twins live in ``_gamma``, which calls them; the tests compare
the two."""

from __future__ import annotations

import math

import numpy as np

from ._dd import (
    dd_add,
    dd_div,
    dd_mul,
    estrin4,
    estrin_chains,
    kl_binary_dd,
    kl_binary_fast,
    quick_two_sum,
    two_prod,
    two_sum,
)
from ._jit import HAVE_NUMBA, _jit_split, numba

__all__ = ["dd_residuals", "exact_closed_gamma", "exact_kl_gamma"]

# --- exact KL bonus ----------------------------------------------------------------------------

_EPS = float(np.finfo(np.float64).eps)
#: h(u) / u^2 = sum_j (-1)^j u^j / ((j + 2)(j + 1)) for |u| < 0.1 (20 terms), as Estrin chains.
_H = estrin_chains([(-1.0) ** j / ((j + 2) * (j + 1)) for j in range(20)])


def _kl_h(u):
    """(h(u), a bound on its absolute rounding error, log1p(u)): h(u) = (1 + u) log1p(u) - u >= 0
    for u >= -1 (log1p(u) is returned for the Newton slope; -inf at u = -1).

    Series (|u| < 0.1, alternating, terms decreasing; Estrin's four chains): 4 eps of the value. Otherwise the
    rounding of 1 + u (eps/2), of log1p (1 ulp) and of the product (eps/2) moves (1 + u) log1p(u)
    by 2.1 eps of itself, and the subtraction rounds by eps/2 of the value (bound: eps). Measured
    against long double on 600,000 pairs, the error stays below half of this bound."""
    if u == -1.0:
        return 1.0, 0.0, -math.inf
    log = math.log1p(u)
    if abs(u) < 0.1:
        poly = estrin4(u, _H[0], _H[1], _H[2], _H[3])
        value = u * u * poly
        return value, 4.0 * _EPS * value, log
    value = (1.0 + u) * log - u
    # + eps |u log1p(u)|: the relative rounding of u itself (h'(u) = log1p(u)), which can exceed
    # a few eps of the value near u = -1
    return value, 2.1 * _EPS * (1.0 + u) * abs(log) + _EPS * value + _EPS * abs(u * log), log


def _kl_binary(q, d):
    """B_KL(q + d; q) for 0 < q < 1, 0 <= d <= 1 - q, with a bound on its absolute rounding error:
    the terms' own bounds, plus 6 eps of the value for the rounding of 1 - q, d / q, d / (1 - q),
    the products and the sum (u h'(u) <= 2 h(u), so each relative rounding of u moves a term by
    at most twice that)."""
    b, err, _ = _kl_binary_slope(q, d)
    return b, err


def _kl_binary_slope(q, d):
    """``_kl_binary`` and dB/dd = log1p(d / q) - log1p(-d / (1 - q)), from the same logarithms."""
    r = 1.0 - q
    h1, e1, l1 = _kl_h(d / q)
    h2, e2, l2 = _kl_h(-d / r)
    value = q * h1 + r * h2
    return value, q * e1 + r * e2 + 6.0 * _EPS * value, l1 - l2


if HAVE_NUMBA:  # the kernel below calls these by their global names: compile them too
    _kl_h = numba.njit(cache=True, nogil=True)(_kl_h)
    _kl_binary_slope = numba.njit(cache=True, nogil=True)(_kl_binary_slope)
    _kl_binary = numba.njit(cache=True, nogil=True)(_kl_binary)


def _dd_feasible(g, q, delta):
    """B_KL(g; q) <= delta, decided in double-double with its error bound (``kl_binary_dd``)."""
    bh, bl, bound = kl_binary_dd(g, q)
    s, e = two_sum(bh, -delta)
    return s + (e + bl + bound) <= 0.0


def _dd_largest_feasible(g, q, delta):
    """From g (certified feasible), the largest float x with B_KL(x; q) <= delta, from one
    double-double evaluation at g and the expansion B(x) = B(g) + B'(g)(x - g) + R, 0 <= R <=
    (x - g)^2 / 2 (1/g + 1/(1 - x)) (B is convex; B'' = 1/x + 1/(1 - x)), every float above g
    decided with the bounds of both; (x, True), or (g, False) when one is not decided."""
    bh, bl, bound = kl_binary_dd(g, q)
    s, e = two_sum(delta, -bh)
    r = s + (e - bl)  # delta - B(g), to about 1e-32 of itself
    r_lo = r - bound - _EPS * abs(r) - 1e-300
    r_hi = r + bound + _EPS * abs(r) + 1e-300
    l1 = math.log(g / q)
    l2 = math.log((1.0 - g) / (1.0 - q))
    slope = l1 - l2
    slope_err = 4.0 * _EPS * (2.0 + abs(l1) + abs(l2))
    x = g
    for _ in range(256):
        up = np.nextafter(x, 2.0)
        if up >= 1.0:
            return g, False
        step = up - g  # exact: the floats are close
        lin = slope * step
        lin_err = step * slope_err + _EPS * abs(lin)
        quad = 0.5 * step * step * (1.0 / g + 1.0 / (1.0 - up)) * (1.0 + 8.0 * _EPS)
        if lin + lin_err + quad <= r_lo:  # B(up) <= delta, certified
            x = up
        elif lin - lin_err > r_hi:  # B(up) > delta, certified: x is the largest feasible float
            return x, True
        else:
            return g, False
    return g, False


def _fast_largest_feasible(g, q, delta, d0, slope0):
    """From g near the root (Newton's), the largest float x with B_KL(x; q) <= delta, from one
    evaluation of B at g to 2^-60 of itself (``kl_binary_fast``) and the expansion B(x) = B(g) +
    B'(g)(x - g) + R, 0 <= R <= (x - g)^2 / 2 max B'' (B'' = 1/x + 1/(1 - x)), every float
    decided with the bounds of both (or, within them, by ``kl_binary_dd``): a jump to g + (delta -
    B(g)) / B'(g), then a few floats either way; (x, True), or (g, False) when one is not decided.
    B'(g) comes from ``slope0``, B' at q + d0 as ``_kl_binary_slope`` computed it (Newton's last
    evaluation), moved to g with B'' bounded between the two: B' = log1p(d / q) - log1p(-d /
    (1 - q)) (the terms add: l1 >= 0 >= l2), each logarithm to an ulp and d / q, d / (1 - q) to
    2 eps."""
    bh, bl, bound = kl_binary_fast(g, q)
    s, e = two_sum(delta, -bh)
    r = s + (e - bl)  # delta - B(g)
    slack = bound + _EPS * abs(r) + 1e-300
    r_lo, r_hi = r - slack, r + slack
    d = g - q  # within eps d of the true difference
    g0 = q + d0
    if not (0.0 < d0 and g0 < 1.0):
        return g, False
    # B'' = 1/x + 1/(1 - x) lies between 1/hi + 1/(1 - lo) and 1/lo + 1/(1 - hi) on [lo, hi]
    margin = 4.0 * _EPS * max(g, g0)
    lo = min(g0, g) - margin
    hi = max(g0, g) + margin
    if not (0.0 < lo and hi < 1.0):
        return g, False
    curv_max = (1.0 - hi + lo) / (lo * (1.0 - hi)) * (1.0 + 8.0 * _EPS)
    curv_min = (1.0 - lo + hi) / (hi * (1.0 - lo)) * (1.0 - 8.0 * _EPS)
    step = d - d0
    slope = slope0 + step * 0.5 * (curv_max + curv_min)
    slope_err = (
        4.0 * _EPS * slope0
        + 3.0 * _EPS * d0 / (g0 * (1.0 - g0)) * (1.0 + 8.0 * _EPS)
        + abs(step) * (0.5 * (curv_max - curv_min) + 2.0 * _EPS * curv_max)
        + 2.0 * _EPS * (d * curv_max + abs(slope))
    )
    if not slope > 2.0 * slope_err:
        return g, False
    x = g + r / slope
    # the floats tried lie in [lo, hi] (x and g, 32 eps either way): one bound on B'' there
    lo = min(g, x) * (1.0 - 32.0 * _EPS)
    hi = max(g, x) * (1.0 + 32.0 * _EPS)
    if not (q < lo and hi < 1.0):
        return g, False
    half_curv = 0.5 * (1.0 - hi + lo) / (lo * (1.0 - hi)) * (1.0 + 8.0 * _EPS)
    here = _side(x, g, q, delta, slope, slope_err, half_curv, r_lo, r_hi, lo, hi)
    for _ in range(8):  # x, then its neighbours towards the root
        if here == 0:
            return g, False
        y = np.nextafter(x, 2.0 if here == 1 else 0.0)
        there = _side(y, g, q, delta, slope, slope_err, half_curv, r_lo, r_hi, lo, hi)
        if here == 1 and there == -1:
            return x, True  # x feasible, the next float not: the largest feasible float
        if here == -1 and there == 1:
            return y, True
        x, here = y, there
    return g, False


def _side(y, g, q, delta, slope, slope_err, half_curv, r_lo, r_hi, lo, hi):
    """1 when B(y) <= delta is certified, -1 when B(y) > delta is, 0 when undecided, from the
    expansion around g (``_fast_largest_feasible``) and, within its bounds, double-double."""
    if not lo <= y <= hi or not y < 1.0:
        return 0
    step = y - g  # exact: the floats are close
    lin = slope * step
    lin_err = abs(step) * slope_err + _EPS * abs(lin)
    if lin + lin_err + step * step * half_curv <= r_lo:
        return 1
    if lin - lin_err > r_hi:
        return -1
    # B(y) within 2^-60 of delta (about 1 pair in 2,500): double-double decides
    bh, bl, bound = kl_binary_dd(y, q)
    s, e = two_sum(bh, -delta)
    excess = s + (e + bl)
    if excess + bound <= 0.0:
        return 1
    if excess - bound > 0.0:
        return -1
    return 0


if HAVE_NUMBA:
    _dd_feasible = numba.njit(cache=True, nogil=True)(_dd_feasible)
    _dd_largest_feasible = numba.njit(cache=True, nogil=True)(_dd_largest_feasible)
    _side = numba.njit(cache=True, nogil=True)(_side)
    _fast_largest_feasible = numba.njit(cache=True, nogil=True)(_fast_largest_feasible)
#: Below this, q or 1 - gamma leave double-double's safe range: the long-double path decides.
_DD_SMALLEST = 1e-280
#: Newton's steps are Halley's (B'' costs no logarithm) once B is within this factor of delta ...
_HALLEY_WITHIN = 1.0
#: ... and the search stops when the next step's error (about step^3 (B'' / B')^2) is below this
#: much of the increment: the certification's one evaluation jumps the rest of the way.
_STOP_BELOW = 1e-12


def _kl_gamma(q_arr, delta_arr, tight, maxiter, gamma_out, status_out, iterations_out, converged_out):
    """Exact KL gamma per pair. The start: the reversed series of B(q + d) = delta to sixth order
    where it converges fast, else the Taylor increment; Newton in log-log coordinates while B is
    far from delta, Halley's steps near it (1.4 evaluations of B per pair on the benchmark's
    pairs). Then one evaluation of B to 2^-60 (``_fast_largest_feasible``) decides the largest
    feasible float for nearly every pair; where it does not, the float64 certification with
    the error bound of ``_kl_binary`` and, when ``tight``, double-double. status 0: certified
    (the largest feasible float, or with ``tight`` False one certified feasible within the
    float64 band below it); 1: undecided (gamma is the Newton estimate, for the long-double
    certification); 2: an edge case decided exactly."""
    for i in numba.prange(q_arr.shape[0]):  # pairs are independent: all cores
        q, delta = q_arr[i], delta_arr[i]
        iterations_out[i] = 0
        converged_out[i] = True
        if delta == 0.0:
            gamma_out[i], status_out[i] = q, 2
            continue
        if q == 0.0:  # nothing above 0 has a finite KL, for any delta (inf included)
            gamma_out[i], status_out[i] = 0.0, 2
            continue
        if math.isinf(delta) or q == 1.0:
            gamma_out[i], status_out[i] = 1.0, 2
            continue
        top = 1.0 - q
        # B(1; q) = -log(q) >= 1 - q: below that, delta cannot cover gamma = 1
        if delta >= top * (1.0 - 8.0 * _EPS) and -math.log(q) * (1.0 + 8.0 * _EPS) <= delta:
            gamma_out[i], status_out[i] = 1.0, 0
            continue
        # Newton in log-log coordinates from the Taylor increment, kept inside the bracket
        lo, hi = 0.0, top
        t = math.sqrt(2.0 * delta * q * top)  # the Taylor increment
        if t < 0.25 * min(q, top):
            # the reversed series of B(q + d) = delta to t^6 (terms shrink like (t / min(q, 1 - q))^k):
            # B / b2 = d^2 (1 + b3 d + b4 d^2 + ...), b_k = 2 q (1 - q) ((-1)^k q^(1-k) + (1 - q)^(1-k)) / (k (k - 1))
            iq, ir = 1.0 / q, 1.0 / top
            iq2, ir2 = iq * iq, ir * ir
            b3 = (q - top) * iq * ir * (1.0 / 3.0)
            b4 = (top * iq2 + q * ir2) * (1.0 / 6.0)
            b5 = (q * ir2 * ir - top * iq2 * iq) * 0.1
            b6 = (top * iq2 * iq2 + q * ir2 * ir2) * (1.0 / 15.0)
            b3_2 = b3 * b3
            c2 = -0.5 * b3
            c3 = (5.0 * b3_2 - 4.0 * b4) / 8.0
            c4 = -(2.0 * b3_2 * b3 - 3.0 * b3 * b4 + b5) / 2.0
            c5 = (231.0 * b3_2 * b3_2 - 504.0 * b3_2 * b4 + 224.0 * b3 * b5 + 112.0 * b4 * b4 - 64.0 * b6) / 128.0
            c6 = (
                -(
                    7.0 * b3_2 * b3_2 * b3
                    - 20.0 * b3_2 * b3 * b4
                    + 10.0 * b3_2 * b5
                    + 10.0 * b3 * b4 * b4
                    - 4.0 * b3 * b6
                    - 4.0 * b4 * b5
                )
                / 2.0
            )
            d = t * (1.0 + t * (c2 + t * (c3 + t * (c4 + t * (c5 + t * c6)))))
        else:
            d = min(t, 0.5 * top)
        if not 0.0 < d < top:
            d = 0.5 * top
        converged_out[i] = False
        log_delta = math.nan  # computed when a step needs it
        d_ev, slope_ev = d, 0.0
        for it in range(maxiter):
            b, err, slope = _kl_binary_slope(q, d)
            d_ev, slope_ev = d, slope
            if b > delta:
                hi = d
            else:
                lo = d
            iterations_out[i] = it + 1
            if abs(b - delta) <= err + 4.0 * _EPS * delta:
                converged_out[i] = True
                break  # B is resolved to its rounding: the certification takes it from here
            close = b > 0.0 and abs(b - delta) < _HALLEY_WITHIN * delta and slope > 0.0
            if close:  # Halley (B'' = 1 / (g (1 - g)) costs no logarithm), cubic convergence
                f = b - delta
                gc = q + d
                curv = 1.0 / (gc * (1.0 - gc))
                new = d - 2.0 * f * slope / (2.0 * slope * slope - f * curv)
            else:
                if math.isnan(log_delta):
                    log_delta = math.log(delta)
                elasticity = d * slope / b if b > 0.0 else 2.0
                step = (math.log(b) - log_delta) / elasticity if b > 0.0 else -1.0
                new = d * math.exp(-step)
            if not (lo < new < hi):
                new = math.sqrt(lo * hi) if lo > 0.0 and hi > 4.0 * lo else 0.5 * (lo + hi)
            if abs(new - d) <= 4.0 * _EPS * d or new == d:
                d = new
                converged_out[i] = True
                break
            if close and lo < new < hi:
                # Newton's error after this step is at most step^2 max B'' / (2 B'): when that is
                # below 1e-12 d, the certification's one evaluation at q + new (which jumps to the
                # root itself) replaces the evaluation that would confirm it
                step = new - d
                near = q + max(new, d) + abs(step)
                far = q + min(new, d) - abs(step)
                c = (1.0 - near + far) / (far * (1.0 - near))
                if near < 1.0 and far > 0.0 and abs(step) * step * step * c * c <= _STOP_BELOW * new * slope * slope:
                    d = new
                    converged_out[i] = True
                    break
            d = new
        g = min(q + d, 1.0)
        if q >= _DD_SMALLEST and q < g and 1.0 - g >= _DD_SMALLEST:
            # one evaluation of B to 2^-60 decides the floats around Newton's root (most pairs)
            x, decided = _fast_largest_feasible(g, q, delta, d_ev, slope_ev)
            if decided:
                gamma_out[i], status_out[i] = x, 0
                continue
        # Certification on the float grid (feasible: B + bound <= delta; infeasible: B - bound >
        # delta): walk to the largest float g certified feasible (at most 64 steps), then
        # status 0 when the next float is certified infeasible (g is the largest feasible float)
        # or when ``tight`` is False (g is feasible, the largest one lies in the bound's band
        # above it); status 1 otherwise: the long-double certification decides, from g.
        b, err = _kl_binary(q, g - q)
        steps = 0
        if b + err <= delta:
            while g < 1.0 and steps < 64:
                up = np.nextafter(g, 2.0)
                bu, eu = _kl_binary(q, up - q)
                if bu + eu > delta:
                    break
                g = up
                steps += 1
        else:
            while g > q and steps < 64 and not b + err <= delta:
                g = max(np.nextafter(g, 0.0), q)
                steps += 1
                b, err = _kl_binary(q, g - q)
        status = 1
        if steps < 64 and (g <= q or b + err <= delta):
            if not tight:
                status = 0
            else:
                up = np.nextafter(g, 2.0)
                if up > 1.0:
                    status = 0
                else:
                    bu, eu = _kl_binary(q, up - q)
                    if bu - eu > delta:
                        status = 0
                    elif q >= _DD_SMALLEST and g > q and 1.0 - up >= _DD_SMALLEST:
                        # undecided in float64: one double-double evaluation at g and the
                        # expansion around it decide the floats above g ...
                        x, decided = _dd_largest_feasible(g, q, delta)
                        if decided:
                            g, status = x, 0
                    if status == 1 and q >= _DD_SMALLEST and g > q:
                        # ... or, where they do not, bisection in double-double: the largest
                        # feasible float lies in (g, top), top the first float float64 certifies
                        # infeasible
                        top_g, n_up = up, 0
                        while top_g < 1.0 and n_up < 64 and not bu - eu > delta:
                            top_g = np.nextafter(top_g, 2.0)
                            bu, eu = _kl_binary(q, top_g - q)
                            n_up += 1
                        if (bu - eu > delta or top_g >= 1.0) and 1.0 - top_g >= _DD_SMALLEST:
                            lo_g, hi_g = g, top_g
                            while True:
                                mid = lo_g + 0.5 * (hi_g - lo_g)
                                if mid <= lo_g or mid >= hi_g:
                                    mid = np.nextafter(lo_g, 2.0)
                                    if mid >= hi_g:
                                        break
                                if _dd_feasible(mid, q, delta):
                                    lo_g = mid
                                else:
                                    hi_g = mid
                            g, status = lo_g, 0
        gamma_out[i], status_out[i] = g, status


_kl_gamma_jit = _jit_split(_kl_gamma)


def _flat64(*arrays):
    """Each array as a contiguous flat float64 array (the kernels' layout; no copy when it is one)."""
    return [np.ascontiguousarray(a, dtype=np.float64).ravel() for a in arrays]


def exact_kl_gamma(q, delta, tight=True, maxiter=100):
    """(gamma, status, iterations, converged) of ``_kl_gamma`` on float64 arrays, or None."""
    if _kl_gamma_jit is None:
        return None
    q, delta = _flat64(q, delta)
    gamma = np.empty_like(q)
    status = np.empty(q.shape, dtype=np.int8)
    iterations = np.empty(q.shape, dtype=np.int64)
    converged = np.empty(q.shape, dtype=np.bool_)
    _kl_gamma_jit(q.size, q, delta, bool(tight), int(maxiter), gamma, status, iterations, converged)
    return gamma, status, iterations, converged


# --- exact chi2 and squared-Hellinger bonus: the closed form, then the last ulp -----------------

CHI2, HELLINGER, KL = 0, 1, 2
#: Relative bound of the double-double excess B(g) - delta below (products and sums to 2^-104
#: each, a square root to 2^-104 after its Newton step; 2^-98 keeps a margin of 64).
_CLOSED_BOUND = 2.0**-98


def _dd_sqrt(xh, xl):
    """sqrt of a positive double-double: the float root and one Newton step (about 2^-104)."""
    s = math.sqrt(xh)
    p, e = two_prod(s, s)
    corr = ((xh - p) - e + xl) / (2.0 * s)
    return quick_two_sum(s, corr)


def _closed_side(which, g, q, delta):
    """1 when B(g; q) <= delta is certified, -1 when B(g; q) > delta is, 0 when undecided (for
    the long-double certification). chi2: B = d^2 / (q (1 - q)), decided as d^2 against
    delta q (1 - q); squared Hellinger: B = d^2 (1 / (sqrt g + sqrt q)^2 + 1 / (sqrt(1 - g) +
    sqrt(1 - q))^2), the two differences of square roots without cancellation; d = g - q
    exactly, everything in double-double."""
    if g <= q:
        return 1
    dh = g - q  # fl(g - q): within an ulp of d
    if dh < 1e-140 or delta < 1e-280:
        return 0  # squares would leave the normal range: the long-double path decides
    # float64 first, no cancellation anywhere (d = dh + dl exactly, dl <= ulp(dh) / 2): chi2's
    # B within 3 eps of itself (d^2, 1 - q, the product, the division, dl), Hellinger's within
    # 5.5 eps (four roots of arguments rounded at most once, two sums, squares, reciprocals, the
    # sum and the product); bounds of 4 and 8 eps, decided unless B lies that close to delta
    if which == CHI2:
        if q < 1e-280:
            return 0
        b64 = dh * dh / (q * (1.0 - q))
        tol = 4.0 * _EPS
    else:
        u1 = math.sqrt(g) + math.sqrt(q)
        u2 = math.sqrt(1.0 - g) + math.sqrt(1.0 - q)
        b64 = dh * dh * (1.0 / (u1 * u1) + 1.0 / (u2 * u2))
        tol = 8.0 * _EPS
    if b64 * (1.0 + tol) <= delta:
        return 1
    if b64 * (1.0 - tol) > delta:
        return -1
    bh, bl, bound = _closed_b_dd(which, g, q)
    xh, xl = dd_add(bh, bl, -delta, 0.0)
    excess = xh + xl
    if excess + bound <= 0.0:
        return 1
    if excess - bound > 0.0:
        return -1
    return 0


def _closed_b_dd(which, g, q):
    """(hi, lo, bound) of chi2's or squared Hellinger's B(g; q) for q < g <= 1 in double-double
    (d = g - q exactly; no cancellation: chi2 d^2 / (q (1 - q)), Hellinger d^2 (1 / (sqrt g +
    sqrt q)^2 + 1 / (sqrt(1 - g) + sqrt(1 - q))^2)), bound ``_CLOSED_BOUND`` of the value; the
    caller keeps d^2, q and delta in the normal range."""
    dh, dl = two_sum(g, -q)
    ah, al = two_prod(dh, dh)
    al += 2.0 * dh * dl
    rh, rl = two_sum(1.0, -q)
    if which == CHI2:
        ph, pl = dd_mul(q, 0.0, rh, rl)
        bh, bl = dd_div(ah, al, ph, pl)
    else:
        s1h, s1l = _dd_sqrt(g, 0.0)
        if q > 0.0:
            t1h, t1l = _dd_sqrt(q, 0.0)
            s1h, s1l = dd_add(s1h, s1l, t1h, t1l)
        s2h, s2l = _dd_sqrt(rh, rl)
        oh, ol = two_sum(1.0, -g)
        if oh > 0.0:
            t2h, t2l = _dd_sqrt(oh, ol)
            s2h, s2l = dd_add(s2h, s2l, t2h, t2l)
        c1h, c1l = dd_mul(s1h, s1l, s1h, s1l)
        c2h, c2l = dd_mul(s2h, s2l, s2h, s2l)
        i1h, i1l = dd_div(1.0, 0.0, c1h, c1l)
        i2h, i2l = dd_div(1.0, 0.0, c2h, c2l)
        th, tl = dd_add(i1h, i1l, i2h, i2l)
        bh, bl = dd_mul(ah, al, th, tl)
    return bh, bl, _CLOSED_BOUND * bh


def _residuals(which, q_arr, delta_arr, gamma_arr, out):
    """B(gamma; q) - delta per pair from the double-double evaluations (KL: ``kl_binary_dd``),
    rounded once to float64; NaN where they do not apply (q or 1 - gamma below 1e-280 for KL,
    squares below the normal range), for the long-double evaluation."""
    for i in numba.prange(q_arr.shape[0]):
        g, q, delta = gamma_arr[i], q_arr[i], delta_arr[i]
        if math.isinf(delta):
            out[i] = -math.inf
            continue
        if g <= q:
            out[i] = -delta
            continue
        if which == KL:
            if q < 1e-280 or 1.0 - g < 1e-280:
                out[i] = math.nan
                continue
            bh, bl, _ = kl_binary_dd(g, q)
        else:
            if g - q < 1e-140 or (which == CHI2 and q < 1e-280):
                out[i] = math.nan
                continue
            bh, bl, _ = _closed_b_dd(which, g, q)
        s, e = two_sum(bh, -delta)
        out[i] = s + (e + bl)


if HAVE_NUMBA:
    _dd_sqrt = numba.njit(cache=True, nogil=True)(_dd_sqrt)
    _closed_b_dd = numba.njit(cache=True, nogil=True)(_closed_b_dd)
    _closed_side = numba.njit(cache=True, nogil=True)(_closed_side)
_residuals_jit = _jit_split(_residuals)


def dd_residuals(divergence, q, delta, gamma):
    """B(gamma; q) - delta for "kl", "chi2" or "hellinger" from double-double evaluations (NaN
    where they do not apply), or None without numba."""
    if _residuals_jit is None:
        return None
    which = {"kl": KL, "chi2": CHI2, "hellinger": HELLINGER}[divergence]
    arrays = _flat64(q, delta, gamma)
    out = np.empty_like(arrays[0])
    _residuals_jit(out.size, which, *arrays, out)
    return out


def _closed_gamma(which, q_arr, delta_arr, gamma_out, status_out, evals_out):
    """Exact chi2 / squared-Hellinger gamma per pair: the closed-form inverse (as
    ``_chi2_inverse`` / ``_hellinger_inverse`` in NumPy), then the floats next to it certified
    by ``_closed_side`` until one is feasible and the next is not. status 0: the largest
    feasible float; 1: undecided (gamma is the closed form, for the long-double
    certification); 2: an edge case decided exactly (as ``_exact_edges``)."""
    for i in numba.prange(q_arr.shape[0]):
        q, delta = q_arr[i], delta_arr[i]
        evals_out[i] = 0
        status_out[i] = 2
        if delta == 0.0:
            gamma_out[i] = q
            continue
        if q == 0.0 and which == CHI2:  # f(t)/t -> inf: nothing above 0 is finite
            gamma_out[i] = 0.0
            continue
        if math.isinf(delta) or q == 1.0:
            gamma_out[i] = 1.0
            continue
        top = 1.0 - q
        if which == CHI2:
            inc = math.sqrt(delta) * math.sqrt(q) * math.sqrt(top)
        else:
            b = math.atan2(math.sqrt(q), math.sqrt(top))
            phi = math.asin(min(0.5 * math.sqrt(delta), 1.0))
            inc = math.inf if b + 2.0 * phi >= 0.5 * math.pi else math.sin(2.0 * phi) * math.sin(2.0 * (b + phi))
        x = 1.0 if inc >= top else q + max(inc, 0.0)
        status_out[i] = 1
        gamma_out[i] = x
        here = _closed_side(which, x, q, delta)
        n = 1
        for _ in range(16):
            if here == 0:
                break
            if here == 1 and x >= 1.0:
                status_out[i] = 0  # gamma = 1 within delta
                break
            y = np.nextafter(x, 2.0 if here == 1 else 0.0)
            there = _closed_side(which, y, q, delta)
            n += 1
            if here == 1 and there == -1:
                gamma_out[i], status_out[i] = x, 0
                break
            if here == -1 and there == 1:
                gamma_out[i], status_out[i] = y, 0
                break
            x, here = y, there
        evals_out[i] = n


_closed_gamma_jit = _jit_split(_closed_gamma)


def exact_closed_gamma(divergence, q, delta):
    """(gamma, status, evaluations) of ``_closed_gamma`` for "chi2" or "hellinger" on float64
    arrays, or None without numba."""
    if _closed_gamma_jit is None:
        return None
    which = {"chi2": CHI2, "hellinger": HELLINGER}[divergence]
    q, delta = _flat64(q, delta)
    gamma = np.empty_like(q)
    status = np.empty(q.shape, dtype=np.int8)
    evals = np.empty(q.shape, dtype=np.int64)
    _closed_gamma_jit(q.size, which, q, delta, gamma, status, evals)
    return gamma, status, evals
