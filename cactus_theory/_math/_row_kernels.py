"""Compiled kernels over distribution rows (numba): mentored decoding's target per row
(``mentored_rows``) and Cactus's emitted distribution per row (``emitted_rows``, O(V log V)). Each has a
NumPy twin in the rule module that calls it; the tests compare the two."""

from __future__ import annotations

import math

import numpy as np

from ._jit import HAVE_NUMBA, _jit, _jit_split, numba

__all__ = ["emitted_rows", "mentored_rows"]

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


# one long row runs faster without the parallel machinery (measured: 4.9 ms against 10.5 ms at
# V = 151,936): rows are only spread over threads when there are several per thread
_emitted_rows_jit = _jit_split(_emitted_rows)


def emitted_rows(p, q, s, accept, rho, order, order_s):
    """``_emitted_rows`` on C-contiguous float64 / int64 2-D arrays, or None without numba."""
    if _emitted_rows_jit is None:
        return None
    args = [np.ascontiguousarray(a) for a in (p, q, s, accept, rho, order, order_s)]
    out = np.empty(p.shape)
    _emitted_rows_jit.run(p.shape[0] >= 4 * numba.get_num_threads(), *args, out)
    return out
