"""The independent reference for the fast algorithms: a rule's emitted distribution by looping
over every drafted token through the per-token interface (O(V^2); tests and small V)."""

from __future__ import annotations

import numpy as np

__all__ = ["emitted_bruteforce"]


def emitted_bruteforce(rule, draft_probs, target_probs, *, logits=None):
    """pi(x) = sum_n p(n) [a_n 1{x = n} + (1 - a_n) r_n(x)] by looping over every drafted token n.

    O(V^2) time: the independent reference for the fast algorithms (tests, small V).
    """
    p, q, lg = rule._host(draft_probs, target_probs, logits)
    vocab = q.shape[-1]
    out = np.zeros(np.broadcast_shapes(p.shape, q.shape))
    for token in range(vocab):
        n = np.full(out.shape[:-1], token)
        a = np.asarray(rule.acceptance(p, q, n, logits=lg), dtype=np.float64)
        w = p[..., token]
        out[..., token] += w * a
        if np.any(w * (1.0 - a) > 0):
            r = np.asarray(rule.correction(p, q, n, logits=lg), dtype=np.float64)
            out += (w * (1.0 - a))[..., None] * r
    return out
