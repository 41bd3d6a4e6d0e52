"""Compiled kernels (numba), used when numba is installed (``pip install cactus_theory[fast]``).

Each kernel has a NumPy twin in the module that calls it, and the tests compare the two. numba
compiles a kernel the first time it runs and caches the machine code on disk (``cache=True``,
beside this file), so later processes load it without compiling.
"""

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

try:  # pragma: no cover - depends on the environment
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover
    numba = None
    HAVE_NUMBA = False

__all__ = ["HAVE_NUMBA", "windowed_accepted_length", "windowed_accepted_length_of_ratio"]


def _jit(fn):
    if not HAVE_NUMBA:
        return None
    return numba.njit(cache=True, nogil=True, fastmath=False)(fn)


_BLOCK = 512


def _windows(beta, m, out):
    """out[..., t] = sum_{k=1}^{m} prod_{j<k} beta[..., t+j] (beta = 0 past the end), rows of a 2-D array.

    Horner from the last slot of each window, done for a block of starts at once (slot by slot,
    the starts of a block are independent: SIMD lanes, data in cache): m multiply-adds per
    position, one pass over memory.
    """
    rows, n = beta.shape
    acc = np.empty(_BLOCK)
    for r in range(rows):
        row = beta[r]
        for start in range(0, n, _BLOCK):
            width = min(_BLOCK, n - start)
            acc[:width] = 0.0
            if start + width + m - 1 <= n:  # the whole block's windows lie inside: no bounds test
                for k in range(m - 1, -1, -1):
                    window = row[start + k : start + k + width]
                    for i in range(width):
                        acc[i] = window[i] * (1.0 + acc[i])
            else:
                for k in range(m - 1, -1, -1):
                    for i in range(width):
                        t = start + i + k
                        acc[i] = (row[t] if t < n else 0.0) * (1.0 + acc[i])
            out[r, start : start + width] = acc[:width]
    return out


def _windows_of_ratio(num, den, delta, m, out_beta, out_al):
    """Acceptance min(1, g / p) with g = num (delta < 0) or the Taylor Cactus bonus of num
    (delta >= 0: g = min(num + sqrt(2 delta num (1 - num)), 1)), and its windowed accepted
    lengths (blocked as in ``_windows``); p = 0 counts as acceptance 1{g > 0}."""
    n = num.shape[0]
    for t in range(n):
        q = num[t]
        g = q
        if delta >= 0.0:
            g = min(q + math.sqrt(2.0 * delta * q * (1.0 - q)), 1.0)
        p = den[t]
        if p > 0.0:
            out_beta[t] = min(g / p, 1.0)
        else:
            out_beta[t] = 1.0 if g > 0.0 else 0.0
    _windows(out_beta.reshape(1, n), m, out_al.reshape(1, n))
    return out_beta, out_al


_windows_jit = _jit(_windows)
if HAVE_NUMBA:  # called by _windows_of_ratio by its global name
    _windows = _windows_jit
_windows_of_ratio_jit = _jit(_windows_of_ratio)


def windowed_accepted_length(beta, m):
    """AL_t for every start t of a (..., T) float64 array (compiled), or None without numba."""
    if _windows_jit is None:
        return None
    flat = np.ascontiguousarray(beta, dtype=np.float64).reshape(-1, beta.shape[-1])
    out = np.empty_like(flat)
    _windows_jit(flat, int(m), out)
    return out.reshape(beta.shape)


def _block_pass(beta, values, bonus, has_bonus, ms, al_out, val_out, pos_out):
    """One pass over a sequence's block starts for every block size in ``ms`` (ascending) at once:
    al_out[i] = sum_t AL_t(m_i), val_out[i, k] = sum_t S_t(m_i) of value row k (the expected sum of
    values[k] over the tokens a block emits, the bonus slot's ``bonus[k]`` included when
    ``has_bonus``), pos_out[i, j] = sum_t P(the first j + 1 drafts accepted), over the starts
    t < max(T - m_i + 1, 1). R_j(t) = prod_{i<j} beta[t + i] (beta = 0 past the end) is built
    forwards along each window; an unreachable slot adds nothing (0 * inf = 0)."""
    n = beta.shape[0]
    rows = values.shape[0]
    count = ms.shape[0]
    top = ms[count - 1]
    acc = np.zeros(rows)
    for t in range(n):
        reach = 1.0
        al = 0.0
        for k in range(rows):
            acc[k] = 0.0
        nxt = 0
        for j in range(top):
            pos = t + j
            if pos < n:
                if reach > 0.0:
                    for k in range(rows):
                        acc[k] += reach * values[k, pos]
                reach *= beta[pos]
            else:
                reach = 0.0
            al += reach
            for i in range(nxt, count):  # the sizes m > j count slot j + 1 of start t
                if t < max(n - ms[i] + 1, 1):
                    pos_out[i, j] += reach
            while nxt < count and ms[nxt] == j + 1:
                if t < max(n - ms[nxt] + 1, 1):
                    al_out[nxt] += al
                    for k in range(rows):
                        extra = 0.0
                        if has_bonus and pos + 1 < n and reach > 0.0:
                            extra = reach * bonus[k, pos + 1]
                        val_out[nxt, k] += acc[k] + extra
                nxt += 1


_block_pass_jit = _jit(_block_pass)


def block_pass(beta, values, bonus, ms):
    """(al (M,), value sums (M, K), acceptance by position (M, max m)) of one sequence, summed over
    the block starts of each m in ``ms`` (``_block_pass``), compiled; None without numba. ``beta``
    (T,), ``values`` (K, T), ``bonus`` (K, T) or None, ``ms`` ascending block sizes."""
    if _block_pass_jit is None:
        return None
    beta = np.ascontiguousarray(beta, dtype=np.float64)
    values = np.ascontiguousarray(values, dtype=np.float64)
    sizes = np.ascontiguousarray(ms, dtype=np.int64)
    bonus_rows = values if bonus is None else np.ascontiguousarray(bonus, dtype=np.float64)
    al = np.zeros(sizes.shape[0])
    vals = np.zeros((sizes.shape[0], values.shape[0]))
    pos = np.zeros((sizes.shape[0], int(sizes[-1])))
    _block_pass_jit(beta, values, bonus_rows, bonus is not None, sizes, al, vals, pos)
    return al, vals, pos


def _position_metrics(p, q, pi, accept, out):
    """Per row of (R, V) arrays: out[r] = (sum_x p a, sum_{q(x) = 0} p a, KL(pi || q), KL(q || pi),
    TV(pi, q), H(pi), H(q)), one pass (``step_metrics``'s sums; rel_entr's conventions: 0 log 0 = 0,
    x > 0 = y gives inf)."""
    rows, vocab = q.shape
    for r in range(rows):
        acc = 0.0
        outside = 0.0
        kl = 0.0
        kl_rev = 0.0
        tv = 0.0
        h_pi = 0.0
        h_q = 0.0
        for x in range(vocab):
            px, qx, ex = p[r, x], q[r, x], pi[r, x]
            w = px * accept[r, x]
            acc += w
            if qx <= 0.0:
                outside += w
            if ex > 0.0:
                kl += ex * math.log(ex / qx) if qx > 0.0 else math.inf
                h_pi -= ex * math.log(ex)
            if qx > 0.0:
                kl_rev += qx * math.log(qx / ex) if ex > 0.0 else math.inf
                h_q -= qx * math.log(qx)
            tv += abs(ex - qx)
        out[r, 0] = acc
        out[r, 1] = outside
        out[r, 2] = kl
        out[r, 3] = kl_rev
        out[r, 4] = 0.5 * tv
        out[r, 5] = h_pi
        out[r, 6] = h_q


_position_metrics_jit = numba.njit(cache=True, nogil=True)(_position_metrics) if HAVE_NUMBA else None


def position_metrics(p, q, pi, accept):
    """(R, 7) per-row sums of ``_position_metrics`` of float64 arrays (..., V) (compiled), or None
    without numba."""
    if _position_metrics_jit is None:
        return None
    flat = [np.ascontiguousarray(x, dtype=np.float64).reshape(-1, q.shape[-1]) for x in (p, q, pi, accept)]
    out = np.empty((flat[1].shape[0], 7))
    _position_metrics_jit(*flat, out)
    return out.reshape(*q.shape[:-1], 7)


def _block_weights(p, q, top, max_support, out, lengths):
    """Block verification's E[w_1..w_j] for every block start t of (T, V) rows: the weights' law
    enumerated (w_i = min(w_{i-1} q(x) / p(x), 1) over the drafts x ~ p at t + i - 1, equal weights
    merged after a sort), out[t, i - 1] = E w_i, lengths[t] = j: ``top`` steps, fewer where the law
    would hold more than ``max_support`` values or the sequence ends (the compiled twin of
    ``_rules.block._exact_expected_weights``)."""
    n, vocab = p.shape
    starts = out.shape[0]
    values = np.empty(max_support)
    probs = np.empty(max_support)
    new_values = np.empty(max_support)
    new_probs = np.empty(max_support)
    support = np.empty(vocab, dtype=np.int64)
    for t in range(starts):
        size = 1
        values[0] = 1.0
        probs[0] = 1.0
        done = 0
        for i in range(min(top, n - t)):
            row = t + i
            count = 0
            for x in range(vocab):
                if p[row, x] > 0.0:
                    support[count] = x
                    count += 1
            if size * count > max_support:
                break
            k = 0
            for a in range(size):
                for c in range(count):
                    x = support[c]
                    r = q[row, x] / p[row, x]
                    v = values[a] * r
                    new_values[k] = v if v < 1.0 else 1.0
                    new_probs[k] = probs[a] * p[row, x]
                    k += 1
            order = np.argsort(new_values[:k])
            size = 0
            expected = 0.0
            for j in range(k):
                v = new_values[order[j]]
                if size > 0 and values[size - 1] == v:
                    probs[size - 1] += new_probs[order[j]]
                else:
                    values[size] = v
                    probs[size] = new_probs[order[j]]
                    size += 1
            for j in range(size):
                expected += values[j] * probs[j]
            out[t, i] = expected
            done = i + 1
        lengths[t] = done


_block_weights_jit = _jit(_block_weights)


def block_weights_exact(p, q, starts, top, max_support):
    """(E[w_i] per start and step (starts, top), the steps enumerated per start (starts,)) of
    ``_block_weights``, compiled; None without numba."""
    if _block_weights_jit is None:
        return None
    out = np.zeros((int(starts), int(top)))
    lengths = np.zeros(int(starts), dtype=np.int64)
    _block_weights_jit(np.ascontiguousarray(p, dtype=np.float64), np.ascontiguousarray(q, dtype=np.float64), int(top),
                       int(max_support), out, lengths)  # fmt: skip
    return out, lengths


def _rrs_rows(p, q, k, max_cells, out):
    """P(some draft accepted) of recursive rejection sampling of k drafts drawn without replacement,
    per row of (R, V) arrays, exactly: the drafted prefixes that can still be rejected enumerated
    level by level, as ``_rules.multidraft._rrs_without_replacement`` does (a draft x is rejected
    with probability prop(x) - min(prop(x), target(x)); the residual after a rejection is
    norm((target - prop)+), the same for every rejected x). NaN for a row whose prefixes times its
    tokens pass ``max_cells`` (the caller estimates it by Monte Carlo)."""
    rows, vocab = p.shape
    for r in range(rows):
        used = np.empty(vocab, dtype=np.int64)
        count = 0
        for x in range(vocab):
            if p[r, x] > 0.0 or q[r, x] > 0.0:
                used[count] = x
                count += 1
        states = max(1, max_cells // max(count, 1))
        target = np.empty((states, count))
        left = np.empty((states, count))
        reach = np.empty(states)
        new_target = np.empty((states, count))
        new_left = np.empty((states, count))
        new_reach = np.empty(states)
        prop = np.empty(count)
        rest = np.empty(count)
        for c in range(count):
            target[0, c] = q[r, used[c]]
            left[0, c] = p[r, used[c]]
        reach[0] = 1.0
        size = 1
        acc = 0.0
        failed = False
        for level in range(k):
            nxt = 0
            for st in range(size):
                z = 0.0
                for c in range(count):
                    z += left[st, c]
                kept_sum = 0.0
                for c in range(count):
                    prop[c] = left[st, c] / z if z > 0.0 else 0.0
                    kept_sum += min(prop[c], target[st, c])
                acc += reach[st] * kept_sum
                if level == k - 1:
                    continue
                # the residual of this state (shared by its rejected children)
                zr = 0.0
                for c in range(count):
                    d = target[st, c] - prop[c]
                    rest[c] = d if d > 0.0 else 0.0
                    zr += rest[c]
                if zr > 0.0:
                    for c in range(count):
                        rest[c] /= zr
                else:
                    zt = 0.0
                    for c in range(count):
                        zt += target[st, c]
                    for c in range(count):
                        rest[c] = target[st, c] / zt if zt > 0.0 else 0.0
                for c in range(count):
                    rejected = reach[st] * (prop[c] - min(prop[c], target[st, c]))
                    if rejected > 0.0:
                        if nxt >= states:
                            failed = True
                            break
                        new_reach[nxt] = rejected
                        for d in range(count):
                            new_target[nxt, d] = rest[d]
                            new_left[nxt, d] = left[st, d]
                        new_left[nxt, c] = 0.0
                        nxt += 1
                if failed:
                    break
            if failed or level == k - 1 or nxt == 0:
                break
            size = nxt
            target, new_target = new_target, target
            left, new_left = new_left, left
            reach, new_reach = new_reach, reach
        out[r] = math.nan if failed else min(max(acc, 0.0), 1.0)


_rrs_rows_jit = _jit(_rrs_rows)


def rrs_without_replacement_rows(p, q, k, max_cells):
    """``_rrs_rows`` of float64 rows (R, V), compiled; None without numba."""
    if _rrs_rows_jit is None:
        return None
    out = np.empty(p.shape[0])
    _rrs_rows_jit(np.ascontiguousarray(p, dtype=np.float64), np.ascontiguousarray(q, dtype=np.float64), int(k),
                  int(max_cells), out)  # fmt: skip
    return out


def windowed_accepted_length_of_ratio(target_prob, draft_prob, m, delta=None):
    """(acceptance, AL per start) for the drafted tokens' q(n), p(n) along one sequence, fused:
    SpS (``delta`` None) or Cactus with the Taylor bonus. None without numba."""
    if _windows_of_ratio_jit is None:
        return None
    num = np.ascontiguousarray(target_prob, dtype=np.float64)
    den = np.ascontiguousarray(draft_prob, dtype=np.float64)
    beta, al = np.empty_like(num), np.empty_like(num)
    _windows_of_ratio_jit(num, den, -1.0 if delta is None else float(delta), int(m), beta, al)
    return beta, al


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
            c6 = -(7.0 * b3_2 * b3_2 * b3 - 20.0 * b3_2 * b3 * b4 + 10.0 * b3_2 * b5 + 10.0 * b3 * b4 * b4
                   - 4.0 * b3 * b6 - 4.0 * b4 * b5) / 2.0  # fmt: skip
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


_kl_gamma_jit = numba.njit(cache=True, nogil=True, parallel=True)(_kl_gamma) if HAVE_NUMBA else None


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
    _kl_gamma_jit(q, delta, bool(tight), int(maxiter), gamma, status, iterations, converged)
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
    _residuals_jit = numba.njit(cache=True, nogil=True, parallel=True)(_residuals)
else:
    _residuals_jit = None


def dd_residuals(divergence, q, delta, gamma):
    """B(gamma; q) - delta for "kl", "chi2" or "hellinger" from double-double evaluations (NaN
    where they do not apply), or None without numba."""
    if _residuals_jit is None:
        return None
    which = {"kl": KL, "chi2": CHI2, "hellinger": HELLINGER}[divergence]
    arrays = _flat64(q, delta, gamma)
    out = np.empty_like(arrays[0])
    _residuals_jit(which, *arrays, out)
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


_closed_gamma_jit = numba.njit(cache=True, nogil=True, parallel=True)(_closed_gamma) if HAVE_NUMBA else None


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
    _closed_gamma_jit(which, q, delta, gamma, status, evals)
    return gamma, status, evals


# --- mentored decoding's target ------------------------------------------------------------------


def _xlogx(x):
    return x * math.log(x) if x > 0.0 else 0.0


def _mentored_solve_a(b, rho_s, cq, cp, q_above, total_p, iterations):
    """a(b) with sum clip(p, a q, b q) = 1, segment by segment (see ``_mentored_row``); (a, lo, hi)."""
    v = rho_s.shape[0]
    hi = np.searchsorted(rho_s, b, side="right")
    fixed = cp[hi] + b * q_above[hi]
    for k in range(1, hi + 1):
        a = (total_p - fixed + cp[k]) / cq[k] if cq[k] != 0.0 else math.inf
        upper = rho_s[min(k, v - 1)] if k < hi else b
        if math.isfinite(a) and a >= rho_s[k - 1] and a <= upper:
            return a, k, hi
    a_lo, a_hi = 0.0, b  # rounding left no segment consistent: bisect the monotone mass
    for _ in range(iterations):
        mid = 0.5 * (a_lo + a_hi)
        lo = np.searchsorted(rho_s, mid, side="left")
        mass = mid * cq[lo] + (cp[hi] - cp[min(lo, hi)]) + b * q_above[hi] if lo <= hi else math.inf
        if mass < total_p:
            a_lo = mid
        else:
            a_hi = mid
        if a_hi - a_lo <= 1e-16 * a_hi:
            break
    a = 0.5 * (a_lo + a_hi)
    return a, min(np.searchsorted(rho_s, a, side="left"), hi), hi


def _mentored_rows(p, q, delta, iterations, out):
    """Mentored decoding's target for every row of p, q (2-D): the compiled twin of
    ``_rules.mentored._mentored_row``, the same steps in the same order."""
    rows, v = p.shape
    for r in range(rows):
        pr, qr = p[r], q[r]
        kl_pq = 0.0
        for x in range(v):
            if pr[x] > 0.0:
                kl_pq += pr[x] * math.log(pr[x] / qr[x]) if qr[x] > 0.0 else math.inf
            elif qr[x] >= 0.0:
                kl_pq += 0.0
        if kl_pq <= delta:
            out[r] = pr
            continue
        rho = np.empty(v)
        for x in range(v):
            rho[x] = pr[x] / qr[x] if qr[x] > 0.0 else math.inf
        order = np.argsort(rho, kind="mergesort")
        rho_s, p_s, q_s = rho[order], pr[order], qr[order]
        cq = np.zeros(v + 1)
        cp = np.zeros(v + 1)
        cpl = np.zeros(v + 1)
        for x in range(v):
            cq[x + 1] = cq[x] + q_s[x]
            cp[x + 1] = cp[x] + p_s[x]
            term = p_s[x] * math.log(rho_s[x]) if p_s[x] > 0.0 else 0.0
            cpl[x + 1] = cpl[x] + (term if math.isfinite(term) else 0.0)
        q_above = np.zeros(v + 1)
        for x in range(v - 1, -1, -1):
            q_above[x] = q_above[x + 1] + q_s[x]
        total_p = cp[v]
        top = 0.0
        for x in range(v):
            if math.isfinite(rho_s[x]) and rho_s[x] > 0.0:
                top = rho_s[x]
        log_lo, log_hi = 0.0, max(math.log(top) if top > 0.0 else 0.0, 0.0)
        for _ in range(iterations):
            mid = 0.5 * (log_lo + log_hi)
            b = math.exp(mid)
            a, lo, hi = _mentored_solve_a(b, rho_s, cq, cp, q_above, total_p, iterations)
            value = _xlogx(a) * cq[lo] + (cpl[hi] - cpl[lo]) + _xlogx(b) * q_above[hi]
            if value > delta:
                log_hi = mid
            else:
                log_lo = mid
            if log_hi - log_lo <= 4e-16 * max(1.0, log_hi):
                break
        b = math.exp(log_lo)
        a, lo, hi = _mentored_solve_a(b, rho_s, cq, cp, q_above, total_p, iterations)
        total = 0.0
        for x in range(v):
            h = min(max(pr[x], a * qr[x]), b * qr[x])
            out[r, x] = h
            total += h
        for x in range(v):
            out[r, x] /= total
    return out


if HAVE_NUMBA:
    _xlogx = numba.njit(cache=True, nogil=True)(_xlogx)
    _mentored_solve_a = numba.njit(cache=True, nogil=True)(_mentored_solve_a)
_mentored_rows_jit = _jit(_mentored_rows)


def mentored_rows(p, q, delta, iterations):
    """Mentored decoding's surrogate row by row (compiled), or None without numba."""
    if _mentored_rows_jit is None:
        return None
    p = np.ascontiguousarray(p, dtype=np.float64)
    q = np.ascontiguousarray(q, dtype=np.float64)
    out = np.empty_like(p)
    _mentored_rows_jit(p, q, float(delta), int(iterations), out)
    return out


def warm_up():
    """Load (or compile) every kernel once on tiny inputs: what a fresh process pays before its
    first real call. Returns the seconds it took; 0 without numba."""
    if not HAVE_NUMBA:
        return 0.0
    import time

    start = time.perf_counter()
    p = np.array([[0.25, 0.75], [0.5, 0.5]])
    q = np.array([[0.5, 0.5], [0.25, 0.75]])
    windowed_accepted_length_of_ratio(p[:, 0], q[:, 0], 2)
    windowed_accepted_length_of_ratio(p[:, 0], q[:, 0], 2, delta=0.1)
    windowed_accepted_length(p[:, 0], 2)
    exact_kl_gamma(q[:, 0], np.array([0.1, 0.2]))
    exact_kl_gamma(q[:, 0], np.array([0.1, 0.2]), tight=False)
    for name in ("chi2", "hellinger"):
        exact_closed_gamma(name, q[:, 0], np.array([0.1, 0.2]))
    dd_residuals("kl", q[:, 0], np.array([0.1, 0.2]), np.array([0.6, 0.5]))
    mentored_rows(p, q, 0.1, 30)
    order = np.argsort(p / q, axis=-1)
    for rows in (1, 4 * numba.get_num_threads()):
        e = np.ones((rows, 2))
        emitted_rows(e, e, e, e, e, np.tile(order[:1], (rows, 1)), np.tile(order[:1], (rows, 1)))
    return time.perf_counter() - start


def keep_freed_memory():
    """Ask glibc's malloc to serve arrays below 64 MiB from its heap and keep up to 128 MiB of
    freed memory (``mallopt``). A Dask nanny starts its workers with MALLOC_TRIM_THRESHOLD_ =
    65536, which pins the mmap threshold at 128 KiB: every array above it is mapped fresh and
    page-faulted, and the analysis ran 1.6x slower in such a worker (a shard: 0.45 s against
    0.29 s after this call). Only for worker processes this package starts; returns whether it
    applied (False off glibc)."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 64 << 20)) and bool(mallopt(m_trim_threshold, 128 << 20))


def set_threads(threads):
    """Threads of the parallel kernels (numba) and of torch in this process."""
    if HAVE_NUMBA:
        numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
    import sys

    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(max(1, int(threads)))


# --- Cactus's emitted distribution ---------------------------------------------------------------


def _emitted_rows(p, q, s, accept, rho, order, order_s, out):
    """Emitted distribution of a drafted-bonus rule for every row (2-D arrays; s, accept and
    rho = p/q as computed by NumPy, ``order`` / ``order_s`` from np.argsort of rho and s): the
    compiled twin of the sorted part of ``_rules.cactus.emitted_drafted_bonus``, the same sums
    in the same order, with both searches as linear merges of the sorted runs."""
    rows, v = p.shape
    for r in numba.prange(rows):
        o, os_ = order[r], order_s[r]
        # one record per token (p, q, s, accept, rho, c): the gathers in sorted order below touch
        # one cache line per token instead of one per array (3x faster at V = 151,936)
        rec = np.empty((v, 8))
        for x in range(v):
            rec[x, 0] = p[r, x]
            rec[x, 1] = q[r, x]
            rec[x, 2] = s[r, x]
            rec[x, 3] = accept[r, x]
            rec[x, 4] = rho[r, x]
        rho_sorted = np.empty(v)
        cq = np.empty(v + 1)
        cp = np.empty(v + 1)
        cq[0] = 0.0
        cp[0] = 0.0
        for i in range(v):
            x = o[i]
            rho_sorted[i] = rec[x, 4]
            cq[i + 1] = cq[i] + rec[x, 1]
            cp[i + 1] = cp[i] + rec[x, 0]
        c_sorted = np.empty(v)
        cs_sorted = np.empty(v)
        s_sorted = np.empty(v)
        k = 0
        for i in range(v):
            n = os_[i]
            pn, qn, sn, an = rec[n, 0], rec[n, 1], rec[n, 2], rec[n, 3]
            s_sorted[i] = sn
            while k < v and rho_sorted[k] < sn:  # searchsorted(rho_sorted, s_n, "left")
                k += 1
            own = max(sn * qn - pn, 0.0)
            z = sn * cq[k] - cp[k]
            z -= own
            w = pn * (1.0 - an)
            cn = w / z if (w > 0.0 and z > 0.0) else 0.0
            c_sorted[i] = cn
            cs_sorted[i] = cn * sn
            rec[n, 5] = cn
        suffix1 = np.empty(v + 1)
        suffix2 = np.empty(v + 1)
        suffix1[v] = 0.0
        suffix2[v] = 0.0
        a1 = 0.0
        a2 = 0.0
        for i in range(v - 1, -1, -1):
            a1 += cs_sorted[i]
            a2 += c_sorted[i]
            suffix1[i] = a1
            suffix2[i] = a2
        j = 0
        for i in range(v):
            x = o[i]
            rx = rho_sorted[i]
            while j < v and s_sorted[j] <= rx:  # searchsorted(s_sorted, rho(x), "right")
                j += 1
            px, qx, sx = rec[x, 0], rec[x, 1], rec[x, 2]
            own = max(sx * qx - px, 0.0)
            self_term = rec[x, 5] * own if sx > rx else 0.0
            pi = px * rec[x, 3] + qx * suffix1[j] - px * suffix2[j] - self_term
            rec[x, 6] = max(pi, 0.0) if math.isfinite(pi) else 0.0
        for x in range(v):
            out[r, x] = rec[x, 6]


_emitted_rows_jit = numba.njit(cache=True, nogil=True, parallel=True)(_emitted_rows) if HAVE_NUMBA else None
# one long row runs faster without the parallel machinery (measured: 4.9 ms against 10.5 ms at
# V = 151,936): rows are only spread over threads when there are several per thread
_emitted_rows_serial = numba.njit(cache=True, nogil=True)(_emitted_rows) if HAVE_NUMBA else None


def emitted_rows(p, q, s, accept, rho, order, order_s):
    """``_emitted_rows`` on C-contiguous float64 / int64 2-D arrays, or None without numba."""
    if _emitted_rows_jit is None:
        return None
    args = [np.ascontiguousarray(a) for a in (p, q, s, accept, rho, order, order_s)]
    out = np.empty(p.shape)
    kernel = _emitted_rows_jit if p.shape[0] >= 4 * numba.get_num_threads() else _emitted_rows_serial
    kernel(*args, out)
    return out
