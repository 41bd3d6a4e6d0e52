"""Synthetic (draft, verifier) distribution pairs for simulation and property checks."""

from __future__ import annotations

import numpy as np

from ._validation import check_int, seeded_rng

__all__ = ["SYNTHETIC_KINDS", "synthetic_pairs"]

SYNTHETIC_KINDS = ("dirichlet", "zipf", "temperature", "noised", "mixture")


def _softmax(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def synthetic_pairs(kind="temperature", n_positions=64, vocab_size=32, seed=0, **params):
    """(draft_probs, target_probs), each (n_positions, vocab_size) float64, rows summing to 1.

    kinds and their parameters:

    - "dirichlet": q, p ~ Dirichlet(concentration) independently (``concentration`` = 0.5).
    - "zipf": q ∝ rank^-exponent over a random order of the vocabulary; p the same law over an
      order where a share ``shuffle`` of the ranks is permuted (``exponent`` = 1.1, ``shuffle`` = 0.3).
    - "temperature": verifier logits ~ N(0, ``scale``^2) (``scale`` = 3); q = softmax(logits),
      p = softmax(logits / ``temperature``) (``temperature`` = 1.5: a flatter draft).
    - "noised": p = softmax(logits + N(0, ``noise``^2)) (``noise`` = 1.0, ``scale`` = 3).
    - "mixture": p = ``weight`` q + (1 - ``weight``) Dirichlet(``concentration``) (``weight`` = 0.7).

    Seeded: the same arguments give the same arrays.
    """
    if kind not in SYNTHETIC_KINDS:
        raise ValueError(f"kind must be one of {SYNTHETIC_KINDS}; got {kind!r}")
    check_int(n_positions, "n_positions", 1)
    check_int(vocab_size, "vocab_size", 2)
    rng = seeded_rng(seed)
    shape = (n_positions, vocab_size)
    if kind == "dirichlet":
        alpha = float(params.get("concentration", 0.5))
        q = rng.dirichlet(np.full(vocab_size, alpha), size=n_positions)
        p = rng.dirichlet(np.full(vocab_size, alpha), size=n_positions)
    elif kind == "zipf":
        exponent, share = float(params.get("exponent", 1.1)), float(params.get("shuffle", 0.3))
        law = np.arange(1, vocab_size + 1, dtype=np.float64) ** -exponent
        law /= law.sum()
        q, p = np.empty(shape), np.empty(shape)
        for t in range(n_positions):
            order = rng.permutation(vocab_size)
            q[t, order] = law
            moved = rng.choice(vocab_size, size=max(2, int(share * vocab_size)), replace=False)
            draft_order = order.copy()
            draft_order[moved] = rng.permutation(order[moved])
            p[t, draft_order] = law
    elif kind in ("temperature", "noised"):
        logits = rng.normal(0.0, float(params.get("scale", 3.0)), size=shape)
        q = _softmax(logits)
        if kind == "temperature":
            p = _softmax(logits / float(params.get("temperature", 1.5)))
        else:
            p = _softmax(logits + rng.normal(0.0, float(params.get("noise", 1.0)), size=shape))
    else:
        weight, alpha = float(params.get("weight", 0.7)), float(params.get("concentration", 0.5))
        q = rng.dirichlet(np.full(vocab_size, alpha), size=n_positions)
        p = weight * q + (1 - weight) * rng.dirichlet(np.full(vocab_size, alpha), size=n_positions)
    # exact normalisation in float64
    p /= p.sum(axis=-1, keepdims=True)
    q /= q.sum(axis=-1, keepdims=True)
    return p, q
