"""The largest acceptance any lossless verification of k drafts reaches, per drafting scheme (k
i.i.d. drafts, k without replacement, the top-k of p), by max-flow min-cut over token sets: the
yardstick every multi-draft rule is measured against (``optimal_multi_draft_acceptance``)."""

from __future__ import annotations

import hashlib

import numpy as np

from .._math._validation import host_probabilities
from ._multidraft_protocol import _check_drafting, _check_k, _cut_order, _top

#: The most subsets (of at most k of a row's drafted tokens) the exact optimum without replacement
#: enumerates per row; a row past it is estimated by Monte Carlo (``WITHOUT_REPLACEMENT_PATHS``).
__all__ = ["optimal_acceptances", "optimal_multi_draft_acceptance", "optimal_multi_draft_exactness"]

WITHOUT_REPLACEMENT_STATES = 2_000_000


WITHOUT_REPLACEMENT_PATHS = 20_000


def _subset_laws(pr, k):
    """For one row's drafted tokens (probabilities ``pr``, s of them), the law of the *set* of the
    first j draws without replacement, j = 1..min(k, s): [(masks, probabilities)] per j, masks as
    bit sets over the s tokens; None when the sets pass ``WITHOUT_REPLACEMENT_STATES``. Exact: the
    set J is reached from each J - {x} with probability p(x) / (1 - p(J - {x}))."""
    s = pr.size
    if s > 62:
        return None
    bits = np.left_shift(np.int64(1), np.arange(s, dtype=np.int64))
    masks, probs = np.zeros(1, dtype=np.int64), np.ones(1)
    out = []
    for _ in range(min(k, s)):
        free = (masks[:, None] & bits[None, :]) == 0
        if free.size > WITHOUT_REPLACEMENT_STATES:
            return None
        row, token = np.nonzero(free)
        left = (free @ pr)[row]  # the mass not yet drawn, summed (no cancellation)
        step = probs[row] * pr[token] / np.where(left > 0, left, 1.0)
        new = masks[row] | bits[token]
        masks, inverse = np.unique(new, return_inverse=True)
        probs = np.bincount(inverse, weights=step, minlength=masks.size)
        out.append((masks, probs))
    return out


def _without_replacement_gains(p, q, ks, seed=0):
    """max_C [P(the k drafts without replacement all lie in C) - q(C)] per row of (p, q) (R, V),
    for each k in ``ks``: {k: (gains (R,), exact (R,) bool)}. The maximum is over the prefixes of
    ``_cut_order``; P(drafts in C) by the exact law of the drafted set (``_subset_laws``), or for
    a row whose sets are too many, from ``WITHOUT_REPLACEMENT_PATHS`` seeded drafted tuples."""
    rows = p.shape[0]
    top = max(ks)
    gains = {k: np.zeros(rows) for k in ks}
    exact = np.ones(rows, dtype=bool)
    order = _cut_order(p, q)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(p.shape[-1])[None, :].repeat(rows, 0), -1)
    cq = np.cumsum(np.take_along_axis(q, order, -1), -1)
    rng = np.random.default_rng(seed)
    single = (p > 0).sum(-1) == 1  # one drafted token: every draft is it, P(drafts in C) = p(C)
    cp = np.minimum(np.cumsum(np.take_along_axis(p, order, -1), -1), 1.0)
    for k in ks:
        gains[k][single] = np.maximum(np.max(cp[single] - cq[single], axis=-1), 0.0)
    for r in np.flatnonzero(~single):
        support = np.flatnonzero(p[r] > 0)
        ranks = rank[r, support]
        laws = _subset_laws(p[r, support], top)
        if laws is None:
            exact[r] = False
            contained = _sampled_last_ranks(rng, p[r, support], ranks, top, p.shape[-1])
        for k in ks:
            if laws is not None:
                masks, probs = laws[min(k, support.size) - 1]
                members = (masks[:, None] >> np.arange(support.size)[None, :]) & 1
                last = np.max(np.where(members == 1, ranks[None, :], -1), axis=1)
                within = np.cumsum(np.bincount(last, weights=probs, minlength=p.shape[-1]))
            else:
                within = contained[min(k, support.size) - 1]
            gains[k][r] = max(float(np.max(np.minimum(within, 1.0) - cq[r])), 0.0)
    return {k: (gains[k], exact) for k in ks}


def _sampled_last_ranks(rng, pr, ranks, k, vocab):
    """For j = 1..min(k, s): per prefix of the cut order, the share of seeded drafted tuples
    without replacement whose first j draws all lie in it (the exponential race: the j tokens
    with the smallest Exp(1) / p(x) are the first j draws)."""
    n, s = WITHOUT_REPLACEMENT_PATHS, pr.size
    keys = rng.exponential(size=(n, s)) / pr[None, :]
    first = np.argsort(keys, axis=1)[:, : min(k, s)]
    last = np.maximum.accumulate(ranks[first], axis=1)
    return [np.cumsum(np.bincount(last[:, j], minlength=vocab)) / n for j in range(first.shape[1])]


def optimal_multi_draft_acceptance(draft_probs, target_probs, k, drafting="iid"):
    """The largest acceptance any lossless verification of k drafts reaches, for each way of
    drawing them (``drafting``), by max-flow min-cut over token sets C (the cut costs q(C) +
    P(some draft outside C)):

        alpha*(p, q, k) = 1 - max_C [ P(every draft in C) - q(C) ].

    - ``"iid"``: k drafts drawn i.i.d. from p; P(every draft in C) = p(C)^k; for k = 1 it is
      1 - TV(p, q). Khisti et al., ICLR 2025; Hu et al., ICLR 2025.
    - ``"without-replacement"``: k distinct drafts, each from p without the tokens drawn before
      (a row with fewer than k tokens drafts them all). P(every draft in C) from the exact law of
      the drafted *set* (enumerated over sets of at most k of the row's tokens; a row needing more
      than ``WITHOUT_REPLACEMENT_STATES`` is estimated from seeded drafted tuples, and
      ``optimal_multi_draft_exactness`` says which). Hu et al., ICLR 2025, arXiv 2502.18779.
    - ``"top"``: the k most likely tokens of p (ties: the lower id), a fixed set S: alpha* = q(S)
      (EAGLE's and SGLang's lossless tree verification reach it).

    The maximising C is a prefix of the tokens sorted by p(x) / q(x) (tokens with q(x) = 0
    first): one sort per row, O(V log V) for ``"iid"`` and ``"top"`` (checked against a linear
    program over the drafted tuples and, for every scheme, against the brute force over all 2^V
    sets C). Every lossless rule of a scheme accepts at most its scheme's optimum; the schemes'
    optima differ, so a tree rule is measured against its own.

    Examples
    --------
    >>> import numpy as np
    >>> p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.5, 0.3])
    >>> round(float(optimal_multi_draft_acceptance(p, q, 1)), 6)   # 1 - TV
    0.6
    >>> round(float(optimal_multi_draft_acceptance(p, q, 2, drafting="top")), 6)   # q({0, 1})
    0.7
    """
    return _optimum(draft_probs, target_probs, k, drafting)[0]


def optimal_multi_draft_exactness(draft_probs, target_probs, k, drafting="iid"):
    """Per row, True where ``optimal_multi_draft_acceptance`` is exact (every row for ``"iid"``
    and ``"top"``; without replacement, a row whose drafted sets were enumerated)."""
    return _optimum(draft_probs, target_probs, k, drafting)[1]


def _optimum(draft_probs, target_probs, k, drafting):
    _check_k(k)
    _check_drafting(drafting)
    p = host_probabilities(draft_probs, "draft_probs")
    q = host_probabilities(target_probs, "target_probs")
    if p.shape != q.shape:
        raise ValueError(f"draft_probs with shape {p.shape} and target_probs with shape {q.shape} differ")
    return optimal_acceptances(p, q, (k,), drafting)[k]


def optimal_acceptances(p, q, ks, drafting):
    """``optimal_multi_draft_acceptance`` of checked float64 rows (..., V) for several k at once:
    {k: (acceptance (...), exact (...) bool)} (without replacement, one enumeration serves every k)."""
    shape = q.shape[:-1]
    flat_p, flat_q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
    out = {}
    if drafting == "top":
        ranked = _top(flat_p, max(ks))
        taken = np.cumsum(np.take_along_axis(flat_q, ranked, -1), -1)
        for k in ks:
            value = np.clip(taken[:, min(k, ranked.shape[-1]) - 1], 0.0, 1.0)
            out[k] = (value.reshape(shape), np.ones(shape, dtype=bool))
        return out
    if drafting == "iid":
        order = _cut_order(flat_p, flat_q)
        cp = np.minimum(np.cumsum(np.take_along_axis(flat_p, order, -1), -1), 1.0)
        cq = np.cumsum(np.take_along_axis(flat_q, order, -1), -1)
        for k in ks:
            gain = np.maximum(np.max(cp**k - cq, axis=-1), 0.0)  # C = {} gives 0
            out[k] = (np.clip(1.0 - gain, 0.0, 1.0).reshape(shape), np.ones(shape, dtype=bool))
        return out
    # a row of s tokens drafts them all once k >= s: k beyond the widest row's support changes nothing
    support = max(int((flat_p > 0).sum(-1).max(initial=1)), 1)
    effective = {k: min(int(k), support) for k in ks}
    # one enumeration serves every k up to the widest asked: the newest rows' results are kept (the
    # analysis asks for the widest first, then each yardstick rule for its own k on the same rows)
    digest = hashlib.blake2b(flat_p.tobytes() + flat_q.tobytes(), digest_size=16).digest()
    key = (digest, flat_p.shape, WITHOUT_REPLACEMENT_STATES, WITHOUT_REPLACEMENT_PATHS)
    known = _WITHOUT_REPLACEMENT_CACHE.get(key, {})
    if not all(k in known for k in effective.values()):
        widest = max(max(effective.values()), max(known, default=0))
        known = _without_replacement_gains(flat_p, flat_q, tuple(range(1, widest + 1)))
        _WITHOUT_REPLACEMENT_CACHE.clear()
        _WITHOUT_REPLACEMENT_CACHE[key] = known
    for k in ks:
        gain, exact = known[effective[k]]
        out[k] = (np.clip(1.0 - gain, 0.0, 1.0).reshape(shape), exact.reshape(shape))
    return out


#: The newest rows' optimum without replacement, {key: {k: (gains, exact)}}.
_WITHOUT_REPLACEMENT_CACHE: dict = {}
