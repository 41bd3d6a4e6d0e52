"""What a rule really emits at one position, its distance from the verifier, and block statistics."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy import special

from .._math._backend import namespace
from .._math._kernels import position_metrics, windowed_accepted_length
from .._math._validation import check_int
from .._rules._protocol import judgement_of
from .._rules._registry import as_rule

__all__ = [
    "StepMetrics",
    "block_statistics",
    "block_sums",
    "emitted_distribution",
    "expected_accepted_length",
    "step_metrics",
]


def emitted_distribution(rule, draft_probs, target_probs, *, logits=None):
    """Exact distribution pi of the token a rule emits at one position, n ~ p marginalised.

        pi(x) = p(x) a_x + sum_n p(n) (1 - a_n) r_n(x)          (Hao & Mou, ICLR 2026, Theorem 3)

    with a_n the acceptance and r_n the correction for drafted token n. Batched over leading
    axes. SpS gives q (to rounding); rules whose target does not depend on n emit their target
    (O(V)); Cactus and exact Cactus use an O(V log V) algorithm (sorted ratios and prefix sums);
    other rules fall back to an O(V^2) loop. Computed in float64 on the host: NumPy in gives
    NumPy out, torch in gives a float64 tensor on the input's device. ``logits`` (a
    ``RuleLogits``) for the rules that need the raw logits.

    Examples
    --------
    >>> import numpy as np
    >>> from cactus_theory import SpS
    >>> p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.3, 0.5])
    >>> np.allclose(emitted_distribution(SpS(), p, q), q)
    True
    """
    rule = as_rule(rule)
    pi = np.asarray(rule.emitted(draft_probs, target_probs, logits=logits), dtype=np.float64)
    b = namespace(draft_probs, target_probs)
    if b.name == "numpy":
        return pi
    return b.asarray(pi, like=b.asarray(target_probs), dtype=b.torch.float64)


@dataclass(frozen=True)
class StepMetrics:
    """Per-position statistics of a rule (arrays shaped like the batch axes).

    Attributes
    ----------
    acceptance : expected acceptance of one draft, sum_n p(n) a_n (or a_n of ``drafted_token``)
    acceptance_outside_support : the part of it from tokens the verifier excludes,
        sum_n p(n) a_n 1{q(n) = 0} (or a_n 1{q(n) = 0} of ``drafted_token``)
    kl_emitted_target : KL(pi || q)
    kl_target_emitted : KL(q || pi) (inf where pi drops mass q keeps, e.g. TAS)
    tv : total variation between pi and q
    entropy_change : H(pi) - H(q) in nats
    emitted : pi itself, shape (..., V)
    """

    acceptance: np.ndarray
    acceptance_outside_support: np.ndarray
    kl_emitted_target: np.ndarray
    kl_target_emitted: np.ndarray
    tv: np.ndarray
    entropy_change: np.ndarray
    emitted: np.ndarray


def _entropy(x):
    return -np.sum(special.xlogy(x, x), axis=-1)


def step_metrics(rule, draft_probs, target_probs, drafted_token=None, *, logits=None, validate=True, shared=None):
    """Acceptance and the drift of the emitted distribution from the verifier, per position.

    All exact (from ``emitted_distribution``); NumPy float64 out. ``logits`` (a ``RuleLogits``)
    for the rules that need the raw logits. For a multi-draft rule (k drafts per position) the
    acceptance is the chance that some draft is accepted (``multi_acceptance``, over the drafts)
    and the emitted law is over the k drafts; ``drafted_token`` does not apply to it.

    ``validate=False`` skips the checks of the rows (for callers that made them once: the
    analysis, over many rules). ``shared``: a dict the caller keeps per set of rows and passes to
    every rule's ``step_metrics`` on them, where rules keep what they share (a sort of p / q, the
    distinct values of q, H(q)); the same numbers as without it.
    """
    rule = as_rule(rule)
    p, q, lg = rule._host(draft_probs, target_probs, logits, validate=validate)
    if judgement_of(rule).multi_draft:
        if drafted_token is not None:
            raise ValueError(
                f"{rule.describe()} verifies k = {rule.draft_count} drafts per position: step_metrics gives its "
                "acceptance over the drafts (drafted_token=None); rule.verify(...) judges one drafted tuple"
            )
        pi = np.asarray(rule.emitted(p, q), dtype=np.float64)
        acceptance = np.clip(np.asarray(rule.multi_acceptance(p, q), dtype=np.float64), 0.0, 1.0)
        outside = np.clip(np.asarray(rule.multi_outside_support(p, q), dtype=np.float64), 0.0, 1.0)
    elif drafted_token is None:
        both = getattr(rule, "emitted_and_acceptance_all", None)
        if both is not None and shared is not None and _takes_shared(type(rule)):
            pi, accept_all = both(p, q, logits=lg, shared=shared)
        elif both is not None:
            pi, accept_all = both(p, q, logits=lg)
        else:  # an object implementing only the protocol's four methods
            pi, accept_all = rule.emitted(p, q), rule.acceptance_all(p, q)
        pi = np.asarray(pi, dtype=np.float64)
        if shared is not None:  # the analysis: the sums in one compiled pass
            fused = _fused_metrics(p, q, pi, np.asarray(accept_all, dtype=np.float64))
            if fused is not None:
                return fused
        per_token = p * accept_all
        acceptance = np.clip(np.sum(per_token, axis=-1), 0.0, 1.0)
        outside = np.clip(np.sum(np.where(q > 0, 0.0, per_token), axis=-1), 0.0, 1.0)
    else:
        pi = np.asarray(rule.emitted(p, q, logits=lg), dtype=np.float64)
        acceptance = np.asarray(rule.acceptance(p, q, drafted_token, logits=lg), dtype=np.float64)
        qn = np.take_along_axis(q, np.asarray(drafted_token)[..., None] + np.zeros((*q.shape[:-1], 1), int), -1)
        outside = np.where(qn[..., 0] > 0, 0.0, acceptance)
    return StepMetrics(
        acceptance=acceptance,
        acceptance_outside_support=outside,
        kl_emitted_target=np.maximum(np.sum(special.rel_entr(pi, q), axis=-1), 0.0),
        kl_target_emitted=np.maximum(np.sum(special.rel_entr(q, pi), axis=-1), 0.0),
        tv=0.5 * np.sum(np.abs(pi - q), axis=-1),
        entropy_change=_entropy(pi) - (_entropy(q) if shared is None else _shared(shared, "entropy_q", _entropy, q)),
        emitted=pi,
    )


def _fused_metrics(p, q, pi, accept_all):
    """``StepMetrics`` of a token rule from its emitted law and a_n for every n, the sums in one
    compiled pass (``_kernels.position_metrics``; the same values as the NumPy sums to rounding),
    or None without numba."""
    sums = position_metrics(p, q, pi, accept_all)
    if sums is None:
        return None
    return StepMetrics(
        acceptance=np.clip(sums[..., 0], 0.0, 1.0),
        acceptance_outside_support=np.clip(sums[..., 1], 0.0, 1.0),
        kl_emitted_target=np.maximum(sums[..., 2], 0.0),
        kl_target_emitted=np.maximum(sums[..., 3], 0.0),
        tv=sums[..., 4],
        entropy_change=sums[..., 5] - sums[..., 6],
        emitted=pi,
    )


def _shared(shared, key, fn, *args):
    """``fn(*args)`` computed once per ``shared`` dict (``step_metrics``)."""
    if key not in shared:
        shared[key] = fn(*args)
    return shared[key]


@functools.cache
def _takes_shared(cls) -> bool:
    """Whether a rule class's ``emitted_and_acceptance_all`` takes ``shared=`` (the package's do;
    a user's override may not)."""
    import inspect

    try:
        return "shared" in inspect.signature(cls.emitted_and_acceptance_all).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin or C-level callable
        return False


def expected_accepted_length(acceptance_rates, m: int):
    """Expected accepted draft tokens of a block of m drafts starting at each position.

        AL_t = sum_{k=1}^{m} prod_{j=0}^{k-1} beta_{t+j}

    where beta_t is the expected acceptance at position t (``step_metrics(...).acceptance``).
    Exact when positions are independent (the verifier's and draft's distributions at t do not
    depend on which tokens were accepted before). Positions past the end count as rejections,
    so windows that run off the end are truncated. Shape (..., T) in and out; bonus and
    correction tokens are not counted (vLLM's "mean acceptance length" is 1 + AL). With numba
    (the ``fast`` extra) one compiled pass for m <= 64; otherwise doubling windows in NumPy
    (about 3 log2(m) array passes); the two agree to rounding (tested).

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
    check_int(m, "m", 1, what="drafted tokens per verification")
    if m <= 64 and beta.size:
        compiled = windowed_accepted_length(beta, int(m))  # one pass, m multiply-adds per position
        if compiled is not None:
            return compiled
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


def _shifted(x, k):
    """x_{t+k} along the last axis, 0 past the end."""
    out = np.zeros_like(x)
    if k < x.shape[-1]:
        out[..., : x.shape[-1] - k] = x[..., k:]
    return out


def block_sums(acceptance_rates, values, m: int, bonus_values=None, *, per_slot=False):
    """Per block start t, the expected sum of ``values`` over the tokens one block emits:

        S_t = sum_{k=0}^{m-1} R_k(t) values_{t+k}  +  R_m(t) bonus_values_{t+m},
        R_k(t) = prod_{i<k} beta^{(i)}_{t+i}

    (R_k(t): the probability that the block reaches slot k). ``values = acceptance_rates`` gives
    AL_t; ``values`` = KL(pi || q) per position gives the expected drift of the block's drafted
    positions, and ``bonus_values`` adds its bonus position (the relaxed bonus policy). With
    ``per_slot=True`` the acceptance rates are given per slot, shape (m, ..., T), for rules whose
    acceptance depends on the draft's place in the block (``Rule.at_slot``), and so may
    ``values`` (then one more axis than per position). Exact for independent positions; positions
    past the end count as rejections. Horner's scheme from the last slot: m array passes.

    Examples
    --------
    >>> block_sums([0.5, 0.5, 0.5], [0.5, 0.5, 0.5], 2)   # = expected_accepted_length
    array([0.75, 0.75, 0.5 ])
    """
    beta = np.asarray(acceptance_rates, dtype=np.float64)
    vals = np.asarray(values, dtype=np.float64)
    check_int(m, "m", 1, what="drafted tokens per verification")

    vals_slots = per_slot and vals.ndim == beta.ndim
    if per_slot and beta.shape[0] < m:
        raise ValueError(f"per-slot acceptance rates cover {beta.shape[0]} slots; m = {m} needs {m}")
    acc = np.zeros(beta.shape[1:] if per_slot else beta.shape)
    if bonus_values is not None:
        acc = _shifted(np.asarray(bonus_values, dtype=np.float64), m)
    for k in range(m - 1, -1, -1):
        reach = _shifted(beta[k] if per_slot else beta, k)
        with np.errstate(invalid="ignore"):
            step = np.where(reach > 0, reach * acc, 0.0)  # an unreachable slot adds nothing (0 * inf = 0)
        acc = _shifted(vals[k] if vals_slots else vals, k) + step
    return acc


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
