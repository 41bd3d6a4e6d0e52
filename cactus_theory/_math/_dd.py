"""Double-double arithmetic (about 106 bits) for the compiled certification of exact gamma.

A double-double number is an unevaluated sum hi + lo of two float64 with |lo| <= ulp(hi) / 2.
The error-free transformations (Knuth's two-sum, Dekker's two-product with Veltkamp's split)
and the algorithms below follow Hida, Li and Bailey's QD library ("Algorithms for quad-double
precision floating point arithmetic", ARITH 2001): addition, multiplication and division to
about 2^-104 relative, exp by argument reduction (k ln 2 and a factor 2^-9), a degree-10 Taylor
polynomial and nine squarings (about 2^-100), log by one Newton step on exp (about 2^-100).

``kl_binary_dd(g, q)`` is B_KL(g; q) = g log(g / q) + (1 - g) log((1 - g) / (1 - q)) with an
error bound of 1e-26 of |g log(g/q)| + |(1 - g) log((1 - g)/(1 - q))| (the terms before their
cancellation), from log1p of (g - q) / q and -(g - q) / (1 - q), for q and 1 - g at least
1e-280 (the caller leaves smaller ones to the long-double path); tests/math/test_dd.py checks it
against mpmath at 60 digits. ``kl_binary_fast(g, q)`` is the same B to 2^-60 of itself at
about a sixth of the cost (below). Every function is compiled with numba when it is installed,
and plain Python otherwise.
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


__all__ = ["dd_exp", "dd_log", "dd_log1p", "estrin4", "estrin_chains", "kl_binary_dd", "kl_binary_fast", "log_fast"]

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
#: The certification's bound, relative to the sum of the magnitudes of B's two terms (each term
#: holds about 2^-98 of itself: dd_log's 2^-98 |log x|, dd_log1p's 2^-100; tests/math/test_dd.py).
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
def dd_add_sloppy(ah, al, bh, bl):
    """a + b with one two-sum: error about 2^-106 (|a| + |b|) (Hida, Li and Bailey's 'sloppy'
    addition), enough where the sum does not cancel by more than a few bits."""
    s, e = two_sum(ah, bh)
    e += al + bl
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


def _odd_reciprocals():
    """1 / (2k + 1) for k = 1..13 as double-doubles (hi, lo), from the standard library's decimal."""
    import decimal

    ctx = decimal.Context(prec=40)
    out = []
    for k in range(1, 14):
        value = ctx.divide(decimal.Decimal(1), decimal.Decimal(2 * k + 1))
        hi = float(value)
        out.append((hi, float(ctx.subtract(value, decimal.Decimal(hi)))))
    return tuple(out[::-1])  # Horner order


_ODD_RECIPROCALS = _odd_reciprocals()


@_njit
def dd_log1p(wh, wl):
    """log(1 + w) of a double-double w > -1 to about 2^-100 of itself: for |w| < 1/8,
    2 atanh(z) = 2 z (1 + z^2/3 + ... + z^26/27), z = w / (2 + w) (|z| < 1/15, so the terms left
    out are below 2^-104); otherwise ``dd_log`` of 1 + w, whose value is then at least 0.117 in
    magnitude, so its absolute floor near 1 does not arise."""
    if abs(wh) < 0.125:
        th, tl = dd_add(2.0, 0.0, wh, wl)
        zh, zl = dd_div(wh, wl, th, tl)
        z2h, z2l = dd_mul(zh, zl, zh, zl)
        sh, sl = 0.0, 0.0
        for ch, cl in _ODD_RECIPROCALS:
            sh, sl = dd_mul(sh, sl, z2h, z2l)
            sh, sl = dd_add(sh, sl, ch, cl)
        sh, sl = dd_mul(sh, sl, z2h, z2l)
        sh, sl = dd_add(sh, sl, 1.0, 0.0)
        sh, sl = dd_mul(sh, sl, zh, zl)
        return 2.0 * sh, 2.0 * sl
    oh, ol = two_sum(1.0, wh)
    ol += wl
    oh, ol = quick_two_sum(oh, ol)
    return dd_log(oh, ol)


@_njit
def kl_binary_dd(g, q):
    """(hi, lo, bound) of B_KL(g; q) for q < g < 1 (float64 inputs), as a double-double with an
    absolute error bound; see the module docstring for the range it holds on. The logarithms are
    log1p(u) and log1p(-v), u = (g - q) / q, v = (g - q) / (1 - q), each to about 2^-100 of
    itself however close the ratios g / q and (1 - g) / (1 - q) come to 1."""
    dh, dl = two_sum(g, -q)
    aqh, aql = two_sum(1.0, -q)
    uh, ul = dd_div(dh, dl, q, 0.0)
    vh, vl = dd_div(dh, dl, aqh, aql)
    l1h, l1l = dd_log1p(uh, ul)
    l2h, l2l = dd_log1p(-vh, -vl)
    agh, agl = two_sum(1.0, -g)
    t1h, t1l = dd_mul(g, 0.0, l1h, l1l)
    t2h, t2l = dd_mul(agh, agl, l2h, l2l)
    bh, bl = dd_add(t1h, t1l, t2h, t2l)
    return bh, bl, DD_BOUND * (abs(t1h) + abs(t2h))


def estrin_chains(ascending):
    """The four coefficient chains of ``estrin4`` (each in Horner order) for the polynomial
    sum_j ascending[j] w^j."""
    return tuple(tuple(float(c) for c in ascending[k::4][::-1]) for k in range(4))


@_njit
def horner(coeffs, x):
    """sum_j coeffs[j] x^(n-1-j): the coefficients in Horner order (highest power first)."""
    acc = 0.0
    for c in coeffs:
        acc = acc * x + c
    return acc


@_njit
def estrin4(w, c0, c1, c2, c3):
    """sum_j c_j w^j by Estrin's scheme in four chains (``estrin_chains``): four independent
    Horner recurrences in w^4, so the processor overlaps them (Horner's single chain waits on
    every multiply-add)."""
    w2 = w * w
    w4 = w2 * w2
    return (horner(c0, w4) + w * horner(c1, w4)) + w2 * (horner(c2, w4) + w * horner(c3, w4))


# --- a cheaper evaluation of B_KL to about 2^-60 of itself -----------------------------------------
#
# Deciding the largest float within delta needs B far less accurately than double-double: near
# the root two neighbouring floats differ in B by at least about eps B (d g / (g - q) eps B), so a
# relative error of 2^-60 decides all but a few pairs. B = q h(u) + (1 - q) h(-v), u = (g - q) / q,
# v = (g - q) / (1 - q), h(w) = (1 + w) log1p(w) - w >= 0: two positive terms, no cancellation
# between them. h is a power series in w (two terms in double-double, the rest in float64) for
# |w| < 1/8, and (1 + w) L - w with L = log(1 + w) from a 128-entry table (log(x) = k log 2 -
# log(r_i) + log1p(x 2^-k r_i - 1), the last by its series on |t| < 2^-7.9) elsewhere.

_TABLE_BITS = 7
_TABLE_SIZE = 1 << _TABLE_BITS


def _log_table():
    """r_i (a float near 1 / m for m in the i-th 128th of [1, 2)) and -log(r_i) as (hi, lo),
    computed with the standard library's decimal at 40 digits."""
    import decimal

    import numpy as np

    ctx = decimal.Context(prec=40)
    r = np.empty(_TABLE_SIZE)
    hi = np.empty(_TABLE_SIZE)
    lo = np.empty(_TABLE_SIZE)
    for i in range(_TABLE_SIZE):
        r[i] = 1.0 / (1.0 + (i + 0.5) / _TABLE_SIZE)
        value = ctx.minus(ctx.ln(decimal.Decimal(r[i])))
        hi[i] = float(value)
        lo[i] = float(ctx.subtract(value, decimal.Decimal(hi[i])))
    return r, hi, lo


_LOG_R, _LOG_T_HI, _LOG_T_LO = _log_table()
#: log 2 split so that k * _LN2_A is exact for |k| < 2^11 (42 bits), then the rest.
_LN2_A = 0.6931471805598903  # float(ln 2) with its last 11 bits cleared
_LN2_B = 5.497923018708371e-14  # ln 2 - _LN2_A, to double precision
#: log1p(t) = t - t^2/2 + t^3 P(t), P's Estrin chains, to t^9 / 9 (|t| < 2^-7.9).
_LOG1P_TAIL = estrin_chains([1.0 / 3.0, -1.0 / 4.0, 1.0 / 5.0, -1.0 / 6.0, 1.0 / 7.0, -1.0 / 8.0, 1.0 / 9.0])
#: h(w) / w^2 = 1/2 - w/6 + w^2/12 + w^3 S(w), S = sum_j (-1)^j w^(j-3) / ((j + 2)(j + 1)) for
#: j = 3..24 on |w| < 1/8 (the first left out is below 2^-72 of h), as Estrin chains.
_H_TAIL = estrin_chains([(-1.0) ** j / ((j + 2) * (j + 1)) for j in range(3, 25)])
_SIXTH_LO = 9.25185853854297e-18  # 1/6 - fl(1/6)
_TWELFTH_LO = 4.625929269271485e-18  # 1/12 - fl(1/12)
#: The relative error bound of ``kl_binary_fast`` (about 16x what it measures against mpmath).
FAST_BOUND = 2.0**-60


@_njit
def log_fast(xh, xl):
    """log(xh + xl) for a positive normal xh (|xl| <= ulp(xh)), as (hi, lo), to about 2^-76 in
    absolute value plus 2^-102 of the result."""
    m, k = math.frexp(xh)  # xh = m 2^k, m in [0.5, 1)
    m *= 2.0
    k -= 1
    i = int((m - 1.0) * _TABLE_SIZE)
    if i >= _TABLE_SIZE:
        i = _TABLE_SIZE - 1
    p, e = two_prod(m, _LOG_R[i])
    th = p - 1.0  # exact: p is within 2^-7 of 1
    tl = e + xl / xh * p  # the product's rounding, and the low part of x (relative)
    a, b = two_prod(th, th)
    poly = estrin4(th, _LOG1P_TAIL[0], _LOG1P_TAIL[1], _LOG1P_TAIL[2], _LOG1P_TAIL[3])
    s, err = two_sum(th, -0.5 * a)
    rest = err - 0.5 * b + th * a * poly + tl * (1.0 - th + a)  # tl / (1 + th) to tl th^3
    lh, ll = quick_two_sum(s, rest)
    kh, kl = k * _LN2_A, k * _LN2_B
    sh, sl = dd_add_sloppy(kh, kl, _LOG_T_HI[i], _LOG_T_LO[i])
    return dd_add_sloppy(sh, sl, lh, ll)


@_njit
def _h_fast(wh, wl):
    """h(w) = (1 + w) log1p(w) - w for w = wh + wl > -1, as (hi, lo), to about 2^-66 of itself."""
    if abs(wh) < 0.125:
        w2h, w2l = two_prod(wh, wh)
        w2l += 2.0 * wh * wl
        poly = estrin4(wh, _H_TAIL[0], _H_TAIL[1], _H_TAIL[2], _H_TAIL[3])
        # 1/2 - w/6 + w^2/12 in double-double, then + w^3 S(w) in float64
        sh, sl = two_prod(wh, 1.0 / 6.0)
        sl += wh * _SIXTH_LO + wl * (1.0 / 6.0)  # w / 6 with 1/6 = fl(1/6) + _SIXTH_LO
        ch, cl = dd_add_sloppy(0.5, 0.0, -sh, -sl)
        th, tl = two_prod(w2h, 1.0 / 12.0)
        tl += w2h * _TWELFTH_LO + w2l * (1.0 / 12.0)
        ch, cl = dd_add_sloppy(ch, cl, th, tl)
        ch, cl = dd_add_sloppy(ch, cl, w2h * wh * poly, 0.0)
        return dd_mul(w2h, w2l, ch, cl)
    oh, ol = two_sum(1.0, wh)
    ol += wl
    oh, ol = quick_two_sum(oh, ol)
    lh, ll = log_fast(oh, ol)
    ph, pl = dd_mul(oh, ol, lh, ll)
    return dd_add_sloppy(ph, pl, -wh, -wl)


@_njit
def kl_binary_fast(g, q):
    """(hi, lo, bound) of B_KL(g; q) = q h(u) + (1 - q) h(-v) for 0 < q < g < 1 (float64), q and
    1 - g at least 1e-280; bound is ``FAST_BOUND`` of the value (tested against mpmath)."""
    dh, dl = two_sum(g, -q)
    rh, rl = two_sum(1.0, -q)
    # u and v as double-doubles: a product by the reciprocal (within an ulp or two), then its
    # remainder, exact by two_prod, scaled back (the low part only needs a few bits)
    iq, ir = 1.0 / q, 1.0 / rh
    uh = dh * iq
    p, e = two_prod(uh, q)
    ul = ((dh - p) - e + dl) * iq
    vh = dh * ir
    p, e = two_prod(vh, rh)
    vl = ((dh - p) - e + dl - vh * rl) * ir
    h1h, h1l = _h_fast(uh, ul)
    h2h, h2l = _h_fast(-vh, -vl)
    t1h, t1l = dd_mul(q, 0.0, h1h, h1l)
    t2h, t2l = dd_mul(rh, rl, h2h, h2l)
    bh, bl = dd_add_sloppy(t1h, t1l, t2h, t2l)
    return bh, bl, FAST_BOUND * bh
