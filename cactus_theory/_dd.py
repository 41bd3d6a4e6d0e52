"""Double-double arithmetic (about 106 bits) for the compiled certification of exact gamma.

A double-double number is an unevaluated sum hi + lo of two float64 with |lo| <= ulp(hi) / 2.
The error-free transformations (Knuth's two-sum, Dekker's two-product with Veltkamp's split)
and the algorithms below follow Hida, Li and Bailey's QD library ("Algorithms for quad-double
precision floating point arithmetic", ARITH 2001): addition, multiplication and division to
about 2^-104 relative, exp by argument reduction (k ln 2 and a factor 2^-9), a degree-10 Taylor
polynomial and nine squarings (about 2^-100), log by one Newton step on exp (about 2^-100).

``kl_binary_dd(g, q)`` is B_KL(g; q) = g log(g / q) + (1 - g) log((1 - g) / (1 - q)) with an
error bound of 1e-26 of |g log(g/q)| + |(1 - g) log((1 - g)/(1 - q))| (the terms before their
cancellation; tested against mpmath at 50 digits), for q and 1 - g at least 1e-280 (the caller
leaves smaller ones to the long-double path). Every function is compiled with numba when it is
installed, and plain Python otherwise (the tests run both).
"""

from __future__ import annotations

import math

try:  # pragma: no cover - depends on the environment
    import numba

    def _njit(fn):
        return numba.njit(cache=True, nogil=True, fastmath=False)(fn)

except ImportError:  # pragma: no cover

    def _njit(fn):
        return fn


__all__ = ["dd_exp", "dd_log", "kl_binary_dd"]

_SPLITTER = 134217729.0  # 2^27 + 1
_LN2_HI = 6.93147180559945286227e-01
_LN2_LO = 2.31904681384629955842e-17
#: 1 / k! for k = 3..11, as double-doubles (hi, lo), for the Taylor polynomial of exp.
_INV_FACT = (
    (1.66666666666666657e-01, 9.25185853854297066e-18),
    (4.16666666666666644e-02, 2.31296463463574266e-18),
    (8.33333333333333322e-03, 1.15648231731787138e-19),
    (1.38888888888888894e-03, -5.30054395437357706e-20),
    (1.98412698412698413e-04, 1.72095582934207053e-22),
    (2.48015873015873016e-05, 2.15119478667758816e-23),
    (2.75573192239858925e-06, -1.85839327404647208e-22),
    (2.75573192239858883e-07, 2.37677146222502973e-23),
    (2.50521083854417202e-08, -1.44881407093591197e-24),
)
#: The certification's bound, relative to the sum of the magnitudes of B's two terms.
DD_BOUND = 1e-26


@_njit
def two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@_njit
def quick_two_sum(a, b):
    s = a + b
    return s, b - (s - a)


@_njit
def _split(a):
    t = _SPLITTER * a
    hi = t - (t - a)
    return hi, a - hi


@_njit
def two_prod(a, b):
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


@_njit
def dd_add(ah, al, bh, bl):
    s, e = two_sum(ah, bh)
    t, f = two_sum(al, bl)
    e += t
    s, e = quick_two_sum(s, e)
    e += f
    return quick_two_sum(s, e)


@_njit
def dd_mul(ah, al, bh, bl):
    p, e = two_prod(ah, bh)
    e += ah * bl + al * bh
    return quick_two_sum(p, e)


@_njit
def dd_div(ah, al, bh, bl):
    q1 = ah / bh
    ph, pl = dd_mul(bh, bl, q1, 0.0)
    rh, rl = dd_add(ah, al, -ph, -pl)
    q2 = rh / bh
    ph, pl = dd_mul(bh, bl, q2, 0.0)
    rh, rl = dd_add(rh, rl, -ph, -pl)
    q3 = rh / bh
    s, e = quick_two_sum(q1, q2)
    return dd_add(s, e, q3, 0.0)


@_njit
def dd_exp(a):
    """exp(a) of a float64 ``a`` (|a| < 700) as a double-double."""
    k = math.floor(a / _LN2_HI + 0.5)
    ph, pl = two_prod(k, _LN2_HI)
    rh, rl = dd_add(a, 0.0, -ph, -pl)
    rh, rl = dd_add(rh, rl, -k * _LN2_LO, 0.0)
    rh, rl = rh / 512.0, rl / 512.0  # exact scaling
    # expm1(r) = r + r^2/2 + sum_{k=3}^{11} r^k / k!
    sh, sl = dd_mul(rh, rl, rh, rl)
    sh, sl = sh * 0.5, sl * 0.5
    sh, sl = dd_add(rh, rl, sh, sl)
    ph, pl = dd_mul(rh, rl, rh, rl)
    for i in range(9):
        ph, pl = dd_mul(ph, pl, rh, rl)
        th, tl = dd_mul(ph, pl, _INV_FACT[i][0], _INV_FACT[i][1])
        sh, sl = dd_add(sh, sl, th, tl)
    for _ in range(9):  # expm1(2x) = expm1(x) (expm1(x) + 2)
        th, tl = dd_add(sh, sl, 2.0, 0.0)
        sh, sl = dd_mul(sh, sl, th, tl)
    sh, sl = dd_add(sh, sl, 1.0, 0.0)
    scale = math.ldexp(1.0, int(k))
    return sh * scale, sl * scale


@_njit
def dd_log(xh, xl):
    """log(x) of a positive double-double x: one Newton step on exp from log(xh)."""
    y = math.log(xh)
    eh, el = dd_exp(-y)
    th, tl = dd_mul(xh, xl, eh, el)
    th, tl = dd_add(th, tl, -1.0, 0.0)
    return dd_add(y, 0.0, th, tl)


@_njit
def kl_binary_dd(g, q):
    """(hi, lo, bound) of B_KL(g; q) for q < g < 1 (float64 inputs), as a double-double with an
    absolute error bound; see the module docstring for the range it holds on."""
    # g / q and (1 - g) / (1 - q), with 1 - g and 1 - q exact as double-doubles
    rh, rl = dd_div(g, 0.0, q, 0.0)
    l1h, l1l = dd_log(rh, rl)
    agh, agl = two_sum(1.0, -g)
    aqh, aql = two_sum(1.0, -q)
    sh, sl = dd_div(agh, agl, aqh, aql)
    l2h, l2l = dd_log(sh, sl)
    t1h, t1l = dd_mul(g, 0.0, l1h, l1l)
    t2h, t2l = dd_mul(agh, agl, l2h, l2l)
    bh, bl = dd_add(t1h, t1l, t2h, t2l)
    return bh, bl, DD_BOUND * (abs(t1h) + abs(t2h))
