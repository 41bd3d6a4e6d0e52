"""The accepted length of a block of m drafts, for token rules and block rules alike, and the
greedy drafting of multi-token-prediction and EAGLE-style drafters."""

from __future__ import annotations

import numpy as np

from .._math._validation import check_int, host_probabilities
from .._rules._registry import as_rule
from ._lengths import BlockLength, accepted_lengths

__all__ = ["BlockLength", "block_accepted_length", "greedy_draft"]

DRAFT_MODES = ("sampled", "greedy")


def greedy_draft(draft_probs):
    """The drafter's distribution when it drafts greedily (MTP heads, EAGLE): one-hot on argmax p
    (the lowest token id among ties), same shape, float64 NumPy. The drafted token is then the
    argmax, and a rule sees this p.

    Examples
    --------
    >>> greedy_draft([[0.2, 0.5, 0.3]])
    array([[0., 1., 0.]])
    """
    p = host_probabilities(draft_probs, "draft_probs")
    out = np.zeros(p.shape)
    np.put_along_axis(out, np.argmax(p, axis=-1)[..., None], 1.0, axis=-1)
    return out


def draft_rows(draft_probs, draft_mode):
    """``draft_probs`` as the rule sees them under a draft mode ("sampled": as given; "greedy":
    ``greedy_draft``)."""
    if draft_mode not in DRAFT_MODES:
        raise ValueError(f"draft_mode must be one of {DRAFT_MODES}; got {draft_mode!r}")
    return draft_probs if draft_mode == "sampled" else greedy_draft(draft_probs)


def block_accepted_length(
    rule,
    draft_probs,
    target_probs,
    m: int,
    *,
    logits=None,
    method="auto",
    n_paths=1024,
    seed=0,
    max_support=1_000_000,
    full_output=False,
):
    """Expected accepted drafts E[tau] of a block of m drafts started at each position whose
    window fits: T - m + 1 values for rows (T, V), under independent positions (the rows at a
    position do not depend on what was accepted before: a trace's model).

    Token rules: the prefix product sum_k prod_{j<k} beta_{t+j} of their per-position acceptance
    (``expected_accepted_length``; slot-dependent rules per slot): exact. Block rules (``block``):
    E[tau] = sum_i E[w_i], the block weights' expectations (``BlockVerification``), exact by
    enumeration when the drafted blocks' support allows (``method="exact"``, or ``"auto"`` when
    every start needs at most ``max_support`` weight values: V^m up to about 10^6), else by Monte
    Carlo over ``n_paths`` drafted paths per start (``method="monte-carlo"``; seeded, with its
    standard error; each path contributes its exact E[tau | drafts], so the only noise is the
    drafts'). ``full_output=True`` returns a ``BlockLength`` (values, standard errors, method);
    otherwise the values.

    Examples
    --------
    >>> import numpy as np
    >>> from cactus_theory import make_rule
    >>> small, big = np.array([[1 / 3, 2 / 3]] * 3), np.array([[2 / 3, 1 / 3]] * 3)   # Sun et al.'s toy pair
    >>> [round(float(block_accepted_length(r, big, small, 2)[0]), 6) for r in ("sps", "block")]
    [1.111111, 1.222222]
    """
    rule = as_rule(rule)
    check_int(m, "m", 1, what="drafted tokens per verification")
    if method not in ("auto", "exact", "monte-carlo"):
        raise ValueError(f"method must be 'auto', 'exact' or 'monte-carlo'; got {method!r}")
    check_int(n_paths, "n_paths", 2)
    p, q, lg = rule._host(draft_probs, target_probs, logits)
    if p.ndim != 2:
        raise ValueError(f"draft_probs and target_probs must be (positions, vocabulary); got shape {p.shape}")
    if p.shape[0] < m:
        raise ValueError(f"a block of m = {m} drafts needs at least {m} positions; got {p.shape[0]}")
    result = accepted_lengths(
        rule, p, q, [int(m)], logits=lg, method=method, n_paths=n_paths, seed=seed, max_support=max_support
    )[int(m)]
    return result if full_output else result.accepted_length
