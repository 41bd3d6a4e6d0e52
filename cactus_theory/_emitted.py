"""What a rule really emits at one position, its distance from the verifier, and block statistics."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from ._backend import namespace
from ._rules._base import _host_pair, as_rule

__all__ = [
    "StepMetrics",
    "block_statistics",
    "emitted_distribution",
    "expected_accepted_length",
    "step_metrics",
]


def emitted_distribution(rule, draft_probs, target_probs):
    """Exact distribution pi of the token a rule emits at one position, n ~ p marginalised.

        pi(x) = p(x) a_x + sum_n p(n) (1 - a_n) r_n(x)          (PAPER.md section 3)

    with a_n the acceptance and r_n the correction for drafted token n. Batched over leading
    axes. SpS gives q (to rounding); rules whose target does not depend on n emit their target
    (O(V)); Cactus and exact Cactus use an O(V log V) algorithm (sorted ratios and prefix sums);
    other rules fall back to an O(V^2) loop. Computed in float64 on the host: NumPy in gives
    NumPy out, torch in gives a float64 tensor on the input's device.

    Examples
    --------
    >>> import numpy as np
    >>> from cactus_theory import SpS
    >>> p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.3, 0.5])
    >>> np.allclose(emitted_distribution(SpS(), p, q), q)
    True
    """
    rule = as_rule(rule)
    pi = np.asarray(rule.emitted(draft_probs, target_probs), dtype=np.float64)
    b = namespace(draft_probs, target_probs)
    if b.name == "numpy":
        return pi
    return b.asarray(pi, like=b.asarray(target_probs)).to(dtype=b.torch.float64)


@dataclass(frozen=True)
class StepMetrics:
    """Per-position statistics of a rule (arrays shaped like the batch axes).

    Attributes
    ----------
    acceptance : expected acceptance of one draft, sum_n p(n) a_n (or a_n of ``drafted_token``)
    kl_emitted_target : KL(pi || q)
    kl_target_emitted : KL(q || pi) (inf where pi drops mass q keeps, e.g. TAS)
    tv : total variation between pi and q
    entropy_change : H(pi) - H(q) in nats
    emitted : pi itself, shape (..., V)
    """

    acceptance: np.ndarray
    kl_emitted_target: np.ndarray
    kl_target_emitted: np.ndarray
    tv: np.ndarray
    entropy_change: np.ndarray
    emitted: np.ndarray


def _entropy(x):
    return -np.sum(special.xlogy(x, x), axis=-1)


def step_metrics(rule, draft_probs, target_probs, drafted_token=None):
    """Acceptance and the drift of the emitted distribution from the verifier, per position.

    All exact (from ``emitted_distribution``); NumPy float64 out.
    """
    rule = as_rule(rule)
    p, q = _host_pair(draft_probs, target_probs)
    pi = np.asarray(rule.emitted(p, q), dtype=np.float64)
    if drafted_token is None:
        acceptance = np.clip(np.sum(p * rule.acceptance_all(p, q), axis=-1), 0.0, 1.0)
    else:
        acceptance = np.asarray(rule.acceptance(p, q, drafted_token), dtype=np.float64)
    return StepMetrics(
        acceptance=acceptance,
        kl_emitted_target=np.maximum(np.sum(special.rel_entr(pi, q), axis=-1), 0.0),
        kl_target_emitted=np.maximum(np.sum(special.rel_entr(q, pi), axis=-1), 0.0),
        tv=0.5 * np.sum(np.abs(pi - q), axis=-1),
        entropy_change=_entropy(pi) - _entropy(q),
        emitted=pi,
    )


def expected_accepted_length(acceptance_rates, m: int):
    """Expected accepted draft tokens of a block of m drafts starting at each position.

        AL_t = sum_{k=1}^{m} prod_{j=0}^{k-1} beta_{t+j}

    where beta_t is the expected acceptance at position t (``step_metrics(...).acceptance``).
    Exact when positions are independent (the verifier's and draft's distributions at t do not
    depend on which tokens were accepted before). Positions past the end count as rejections,
    so windows that run off the end are truncated. Shape (..., T) in and out; bonus and
    correction tokens are not counted (vLLM's "mean acceptance length" is 1 + AL).

    Examples
    --------
    >>> expected_accepted_length([0.5, 0.5, 0.5], 2)   # 0.5 + 0.25 for full windows
    array([0.75, 0.75, 0.5 ])
    """
    beta = np.asarray(acceptance_rates, dtype=np.float64)
    if beta.ndim == 0:
        raise ValueError("acceptance_rates must have a position axis (last axis)")
    if beta.size and not (beta.min() >= 0 and beta.max() <= 1):  # NaN fails both comparisons
        raise ValueError("acceptance_rates must be probabilities in [0, 1] without NaN")
    if not (isinstance(m, (int, np.integer)) and m >= 1):
        raise ValueError(f"m (drafted tokens per verification) must be an integer >= 1; got {m!r}")
    return _windowed_prefix_sums(beta, int(m))


def _windowed_prefix_sums(beta, m):
    """S_t = sum_{k=1}^{m} prod_{j<k} beta_{t+j} (beta = 0 past the end) by doubling windows:
    S_{2k,t} = S_{k,t} + P_{k,t} S_{k,t+k}, P_{2k,t} = P_{k,t} P_{k,t+k}; the windows of the set
    bits of m are chained. About 3 log2(m) array passes (7 for m = 8) instead of 2 m (Horner)."""
    n = beta.shape[-1]

    def shifted_product(left, right, k):  # left_t * right_{t+k}, 0 where t + k is past the end
        out = np.empty_like(left)
        if k < n:
            np.multiply(left[..., : n - k], right[..., k:], out=out[..., : n - k])
        out[..., max(n - k, 0) :] = 0.0
        return out

    def shifted_sum(base, left, right, k):  # base_t + left_t * right_{t+k}
        out = shifted_product(left, right, k)
        out += base
        return out

    win_s = win_p = beta  # window of size k = 1: S_1 = P_1 = beta (never written to)
    acc_s = acc_p = None  # the chained windows so far, of total length `length`
    length, k = 0, 1
    while True:
        if m & k:
            if acc_s is None:
                acc_s, acc_p = win_s, win_p
            else:
                new_s = shifted_sum(acc_s, acc_p, win_s, length)
                acc_p = shifted_product(acc_p, win_p, length) if 2 * k <= m else None
                acc_s = new_s
            length += k
        if 2 * k > m:
            return np.array(acc_s, copy=True) if acc_s is beta else acc_s
        new_p = shifted_product(win_p, win_p, k) if 4 * k <= m or k == 1 else None
        # S_2 = beta + P_2 (S_1 = P_1 = beta): one pass instead of two
        win_s = (new_p + beta) if k == 1 else shifted_sum(win_s, win_p, win_s, k)
        win_p = new_p
        k *= 2


def block_statistics(acceptance_rates, m: int):
    """AL(m) and vLLM's mean acceptance length (1 + AL), averaged over block starts whose m
    drafts all lie inside the sequence (``starts`` of them); also the per-start values. Exact for
    independent positions.
    """
    beta = np.asarray(acceptance_rates, dtype=np.float64)
    al = expected_accepted_length(beta, m)
    starts = max(beta.shape[-1] - m + 1, 1)
    mean_al = al[..., :starts].mean(axis=-1)
    return {
        "m": m,
        "starts": starts,
        "accepted_length": mean_al,
        "mean_acceptance_length": 1.0 + mean_al,
        "per_start": al,
    }
