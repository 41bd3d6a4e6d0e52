"""Accepted lengths of every kind of rule, in one place: a token rule's prefix product of its
per-position acceptance (per slot for the slot-dependent ones), a multi-draft rule's the same over
its acceptance of k drafts (a tree of width k), a block rule's from the law of its weights (exact
by enumeration or Monte Carlo). The analysis and ``block_accepted_length`` both ask here."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._rules._protocol import judgement_of
from ._emitted import block_sums, expected_accepted_length, step_metrics

__all__ = ["BlockLength", "acceptance_rates", "accepted_lengths", "stated_law"]


@dataclass(frozen=True)
class BlockLength:
    """``block_accepted_length``'s result: per block start, the expected accepted drafts, its
    standard error (0 where exact), and how it was computed: "exact" (a token rule's prefix
    product, or a block rule's enumeration) or "monte-carlo" (with ``n_paths`` paths)."""

    accepted_length: np.ndarray
    standard_error: np.ndarray
    method: str
    n_paths: int = 0
    #: P(tau >= j) per block start, j = 1..m (starts, m), where the rule states its law per start (block
    #: and whole-tree rules: ``block_survival_for`` / ``tree_survival_for``); None for token rules (their
    #: law is the prefix product of their per-position acceptance)
    survival: np.ndarray | None = None

    @property
    def mean(self) -> float:
        """AL(m) averaged over the block starts."""
        return float(np.mean(self.accepted_length))

    @property
    def mean_standard_error(self) -> float:
        """A bound on the standard error of ``mean`` (the starts' errors, which may be
        correlated through shared paths, added as if perfectly correlated: their mean)."""
        return float(np.mean(self.standard_error))


def acceptance_rates(rule, p, q, slots, *, logits=None, metrics=None):
    """The acceptance a block multiplies along a sequence of rows (T, V): per position (T,) (over
    the k drafts for a multi-draft rule), or for a slot-dependent rule per slot of the block,
    (slots, T), the draft at slot j judged by ``rule.at_slot(j)``. ``metrics``: the rule's
    ``step_metrics`` on these rows when the caller has them already."""
    if judgement_of(rule).slot_dependent:
        return np.stack([step_metrics(rule.at_slot(j), p, q, logits=logits).acceptance for j in range(slots)])
    return (metrics if metrics is not None else step_metrics(rule, p, q, logits=logits)).acceptance


#: The laws a rule may state beyond the protocol, looked up here alone (``stated_law``): per block start
#: (block rules), per tree root (whole-tree rules), a block rule's drift per block, and the depths a
#: whole-tree rule can judge.
OPTIONAL_LAWS = (
    "block_survival_for",
    "expected_block_lengths_for",
    "tree_survival_for",
    "expected_tree_lengths_for",
    "block_drift_for",
    "check_depths",
)


def stated_law(rule, law, refines=None):
    """The bound method ``law`` (``OPTIONAL_LAWS``) where ``rule`` states it, else None. With ``refines``
    (the method the law refines, e.g. the mean per start a survival law sums to): only where ``law`` is
    defined no higher in the rule's class tree than ``refines``, so a subclass that overrides only the
    means is taken at its word (the law per start it inherits may not be its own)."""
    if law not in OPTIONAL_LAWS:
        raise ValueError(f"law must be one of {OPTIONAL_LAWS}; got {law!r}")
    method = getattr(rule, law, None)
    if method is None or refines is None:
        return method
    mro = type(rule).__mro__
    owner = next((c for c in mro if law in c.__dict__), None)
    refined = next((c for c in mro if refines in c.__dict__), None)
    return method if owner is not None and (refined is None or issubclass(owner, refined)) else None


def accepted_lengths(
    rule, p, q, ms, *, beta=None, logits=None, method="auto", n_paths=1024, seed=0, max_support=1_000_000
) -> dict:
    """{m: ``BlockLength``} of ``rule`` on validated float64 rows (T, V), for each m: per block
    start whose window fits (T - m + 1 of them; one, the whole sequence, for m > T), the expected
    accepted drafts under independent positions.

    By what one judgement covers (``judgement_of``): token and multi-draft rules that judge a token
    (a node's children) at a time, the prefix product of ``beta`` (their ``acceptance_rates``,
    computed when not given): exact; a rule that judges the whole tree (``traversal-tree``:
    ``tree_survival_for`` or ``expected_tree_lengths_for``), Monte Carlo over ``n_paths``
    drafted trees per root, each with its exact law; block rules, E[tau] = sum_i E[w_i]
    from ``expected_block_lengths_for``, exact by enumeration where every start needs at most
    ``max_support`` weight values (``method="auto"`` or ``"exact"``), else Monte Carlo over
    ``n_paths`` drafted paths per start, seeded by ``seed``, with its standard error."""
    ms = list(ms)
    positions = p.shape[0]
    judgement = judgement_of(rule)
    if judgement.block:  # a window longer than the sequence is the whole sequence
        sizes = sorted({min(m, positions) for m in ms})
        survival = stated_law(rule, "block_survival_for", refines="expected_block_lengths_for")
        if survival is not None:
            found = survival(p, q, sizes, method=method, n_paths=int(n_paths), seed=seed, max_support=max_support)
        else:  # a block rule that states only its mean per start
            means = rule.expected_block_lengths_for(
                p, q, sizes, method=method, n_paths=int(n_paths), seed=seed, max_support=max_support
            )
            found = {m: (*v, None) for m, v in means.items()}
        return {
            m: BlockLength(values, errors, used, int(n_paths) if used == "monte-carlo" else 0, survival)
            for m, (used, values, errors, survival) in ((m, found[min(m, positions)]) for m in ms)
        }
    if judgement.tree:
        # a sequence-level tree rule (``traversal-tree``): its whole tree's law, Monte Carlo over trees
        survival = stated_law(rule, "tree_survival_for", refines="expected_tree_lengths_for")
        if survival is not None:
            found = survival(p, q, sorted(set(ms)), n_paths=int(n_paths), seed=seed, acceptance=beta)
        else:
            means = rule.expected_tree_lengths_for(
                p, q, sorted(set(ms)), n_paths=int(n_paths), seed=seed, acceptance=beta
            )
            found = {m: (*v, None) for m, v in means.items()}
        return {m: BlockLength(found[m][1], found[m][2], found[m][0], int(n_paths), found[m][3]) for m in ms}
    if beta is None:
        beta = acceptance_rates(rule, p, q, max(ms), logits=logits)
    out = {}
    for m in ms:
        starts = max(positions - m + 1, 1)
        if judgement_of(rule).slot_dependent:
            values = block_sums(beta[:m], beta[:m], m, per_slot=True)[:starts]
        else:
            values = expected_accepted_length(beta, m)[:starts]
        out[m] = BlockLength(values, np.zeros(starts), "exact")
    return out
