"""Compiled kernels (numba), used when numba is installed (``pip install cactus_theory[fast]``).

Each kernel has a NumPy twin in the module that calls it, and the tests compare the two. numba
compiles a kernel the first time it runs and caches the machine code on disk (``cache=True``,
beside this file), so later processes load it without compiling. This module holds the kernels over
a trace's positions and blocks (accepted-length windows, block passes, block weights, recursive
rejection sampling's rows) and ``warm_up``; the exact bonus in ``_gamma_kernels``, the kernels over
distribution rows in ``_row_kernels``, numba itself and the process settings in ``_jit``.
"""

from __future__ import annotations

import math

import numpy as np

from ._gamma_kernels import dd_residuals, exact_closed_gamma, exact_kl_gamma
from ._jit import HAVE_NUMBA, _jit, numba
from ._row_kernels import emitted_rows, mentored_rows

__all__ = ["HAVE_NUMBA", "windowed_accepted_length", "windowed_accepted_length_of_ratio"]

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
    _block_weights_jit(
        np.ascontiguousarray(p, dtype=np.float64),
        np.ascontiguousarray(q, dtype=np.float64),
        int(top),
        int(max_support),
        out,
        lengths,
    )
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
    _rrs_rows_jit(
        np.ascontiguousarray(p, dtype=np.float64),
        np.ascontiguousarray(q, dtype=np.float64),
        int(k),
        int(max_cells),
        out,
    )
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


def _renewal(beta, survival, use_survival, drafted, forwards, offsets, m, out):
    """Per sequence of stacked rows, the sums over the steps decoding takes (``renewal_steps_many``'s
    answer: steps, accepted drafts, drafted tokens, draft forwards, steps by drafted length): the expected
    steps starting at each position, forwards from the sequence's first counted position, each step moving
    t -> t + 1 + A (P(A >= a) the prefix products of ``beta`` (slots, N), or ``survival`` (N, m))."""
    count = offsets.shape[0] - 1
    width = 4 + m + 1
    for i in range(count):
        o = offsets[i]
        n = offsets[i + 1] - o
        for k in range(width):
            out[i, k] = 0.0
        if n == 0:
            continue
        first = 1 if n - m >= 1 else 0
        last = max(n - m, first)
        v = np.zeros(n + m + 2)
        v[first] = 1.0
        for t in range(first, last + 1):
            w = v[t]
            length = min(drafted[o + t], n - t)
            reach = 1.0
            accepted = 0.0
            for a in range(length + 1):
                if a < length:
                    if use_survival:
                        nxt = survival[o + t, a] if a < survival.shape[1] else 0.0
                    else:
                        nxt = reach * beta[min(a, beta.shape[0] - 1), o + t + a]
                else:
                    nxt = 0.0
                law = reach - nxt
                accepted += a * law
                v[t + 1 + a] += w * law
                reach = nxt
            out[i, 0] += w
            out[i, 1] += w * accepted
            out[i, 2] += w * length
            out[i, 3] += w * forwards[o + t]
            out[i, 4 + min(length, m)] += w


_renewal_jit = _jit(_renewal)


def renewal_rows(beta, survival, drafted, forwards, offsets, m):
    """``_renewal`` (compiled) on the stacked rows of a batch: (S, 4 + m + 1), or None without numba.
    ``beta`` (N,) or (slots, N); ``survival`` (N, m) or None."""
    if _renewal_jit is None:
        return None
    use = survival is not None
    b = np.zeros((1, 1)) if use else np.ascontiguousarray(np.atleast_2d(beta), dtype=np.float64)
    sv = np.ascontiguousarray(survival, dtype=np.float64) if use else np.zeros((1, 1))
    out = np.empty((len(offsets) - 1, 4 + int(m) + 1))
    _renewal_jit(
        b,
        sv,
        use,
        np.ascontiguousarray(drafted, dtype=np.int64),
        np.ascontiguousarray(forwards, dtype=np.float64),
        np.ascontiguousarray(offsets, dtype=np.int64),
        int(m),
        out,
    )
    return out


def warm_up_analysis():
    """Load (or compile) the kernels a trace's analysis runs (``warm_up`` less the exact bonus's)."""
    p = np.array([[0.25, 0.75], [0.5, 0.5]])
    q = np.array([[0.5, 0.5], [0.25, 0.75]])
    windowed_accepted_length_of_ratio(p[:, 0], q[:, 0], 2)
    windowed_accepted_length_of_ratio(p[:, 0], q[:, 0], 2, delta=0.1)
    windowed_accepted_length(p[:, 0], 2)
    block_pass(p[:, 0], np.stack([p[:, 0], p[:, 0]]), None, [2])
    block_pass(p[:, 0], np.stack([p[:, 0], p[:, 0]]), np.stack([p[:, 0], p[:, 0]]), [2])
    renewal_rows(p[:, 0], None, np.array([1, 1]), np.array([1.0, 1.0]), np.array([0, 2]), 1)
    renewal_rows(None, p[:, :1], np.array([1, 1]), np.array([1.0, 1.0]), np.array([0, 2]), 1)
    position_metrics(p, q, p, p[:, 0])
    block_weights_exact(np.tile(p, (2, 1)), np.tile(q, (2, 1)), 2, 2, 1000)
    rrs_without_replacement_rows(p, q, 2, 1000)
    mentored_rows(p, q, 0.1, 30)
    order = np.argsort(p / q, axis=-1)
    for rows in (1, 4 * numba.get_num_threads()):
        e = np.ones((rows, 2))
        emitted_rows(e, e, e, e, e, np.tile(order[:1], (rows, 1)), np.tile(order[:1], (rows, 1)))


def warm_up():
    """Load (or compile) every kernel once on tiny inputs: what a fresh process pays before its
    first real call. Returns the seconds it took; 0 without numba."""
    if not HAVE_NUMBA:
        return 0.0
    import time

    start = time.perf_counter()
    q = np.array([0.5, 0.25])
    exact_kl_gamma(q, np.array([0.1, 0.2]))
    exact_kl_gamma(q, np.array([0.1, 0.2]), tight=False)
    for name in ("chi2", "hellinger"):
        exact_closed_gamma(name, q, np.array([0.1, 0.2]))
    dd_residuals("kl", q, np.array([0.1, 0.2]), np.array([0.6, 0.5]))
    warm_up_analysis()
    return time.perf_counter() - start
