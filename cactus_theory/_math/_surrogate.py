"""The Cactus surrogate h for a drafted token (Hao & Mou, ICLR 2026, Theorem 2).

Word use: the *target* is always the verifier's distribution q (``target_probs``); the
distribution h that generalised speculative sampling accepts towards, in place of q, is the
rule's *surrogate*."""

from __future__ import annotations

import numpy as np

from ._backend import namespace
from ._validation import NORMALISATION_ATOL, check_distribution, check_token, is_integer

__all__ = ["cactus_surrogate"]


def cactus_surrogate(target_probs, drafted_token, gamma, *, atol=NORMALISATION_ATOL):
    """Cactus surrogate h: h(n) = gamma, h(x) = q(x) (1 - gamma) / (1 - q(n)) for x != n.

    Batched over leading axes; works on NumPy arrays and torch tensors (dtype and device
    kept; float16 / bfloat16 are computed in float32 and cast back). ``1 - q(n)`` is taken as
    the sum of the other tokens' mass, so h sums to 1 to rounding even when q(n) is near 1.
    Exact when q(n) = 1: there is no other token to scale, and h is one-hot on n
    (the only gamma in [q(n), 1] is 1).

    Parameters
    ----------
    target_probs : array (..., V)
        The verifier distribution q.
    drafted_token : int array (...)
        The drafted token n per row.
    gamma : array broadcastable to (...)
        The bonus, e.g. ``exact_gamma(q[n], delta)``, in [0, 1].

    Examples
    --------
    >>> import numpy as np
    >>> cactus_surrogate(np.array([0.5, 0.3, 0.2]), 1, 0.65)
    array([0.25, 0.65, 0.1 ])
    """
    b = namespace(target_probs, drafted_token if not is_integer(drafted_token) else None)
    q_in = check_distribution(target_probs, "target_probs", atol, backend=b)
    vocab = b.shape(q_in)[-1]
    n = check_token(drafted_token, vocab, "drafted_token", b)
    batch = b.shape(q_in)[:-1]
    try:
        n = b.broadcast_to(n, batch)
    except (ValueError, RuntimeError):
        raise ValueError(
            f"drafted_token with shape {b.shape(n)} does not match the batch shape {batch} of target_probs"
        ) from None
    q = b.promote(q_in)
    g = b.asarray(gamma, like=q)
    if b.any(b.isnan(g)) or b.any((g < 0) | (g > 1)):
        raise ValueError(f"gamma must be probabilities in [0, 1] without NaN; got {b.to_numpy(g)!r}")
    try:
        g = b.broadcast_to(g, batch)
    except (ValueError, RuntimeError):
        raise ValueError(f"gamma with shape {b.shape(g)} does not broadcast to the batch shape {batch}") from None
    return b.cast(surrogate_core(b, q, n, g), q_in)


def surrogate_core(b, q, n, g):
    """Cactus surrogate on validated backend arrays (no checks).

    1 - q(n) is the other tokens' summed mass: the row total minus q(n), recomputed as the sum of
    the others where that difference would cancel (q(n) within 1e-4 of the total), so h sums to
    1 to rounding even when q(n) is near 1. About three passes over q in the common case. Torch
    rows below float64 are summed in float64 (1 - q(n) is then exact to ~1e-13 without a second
    sum, and nothing is read back to the host); half precision rows are scaled in their dtype.
    """
    if b.name == "torch" and b.eps(q) > np.finfo(np.float64).eps:
        t = b.torch
        total = q.sum(dim=-1, dtype=t.float64)
        qn = b.take_last(q, n).to(t.float64)
        rest = total - qn
    else:
        total = b.sum_last(q)
        qn = b.take_last(q, n)
        rest = total - qn
        close = rest < 1e-4 * total
        if b.any(close):
            rest = b.where(close, b.sum_last(b.put_last(q, n, 0.0)), rest)
    g = b.asarray(g, like=rest)
    has_rest = rest > 0
    # (1 - gamma) / (1 - q(n)) with 1 - q(n) taken as the other tokens' summed mass: written
    # 1 - (gamma - q(n)) / rest below gamma = 1/2 (no cancellation there) and (1 - gamma) / rest
    # above (1 - gamma is exact there); exactly 1 when gamma = q(n), so delta = 0 is SpS to the bit.
    safe_rest = b.where(has_rest, rest, 1.0)
    scale = b.where(g < 0.5, 1.0 - (g - qn) / safe_rest, (1.0 - g) / safe_rest)
    scale = b.where(g == qn, 1.0, scale)
    scale = b.maximum(b.where(has_rest, scale, 0.0), 0.0)
    top = b.where(has_rest, g, 1.0)
    return b.put_last_(q * b.asarray(scale, like=q)[..., None], n, b.asarray(top, like=q))
