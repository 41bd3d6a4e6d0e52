"""Raw logits for the rules that need them (``RuleLogits``): the logits from before the sampling
processing, with what a top-K trace knows of them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["RuleLogits"]


@dataclass(frozen=True)
class RuleLogits:
    """Logits from before the sampling processing, for the rules that need them.

    Parameters
    ----------
    target, draft : arrays (..., V) or None
        The verifier's and the drafter's logit rows after logits processors (penalties, bad
        words) and *before* temperature, top-k and top-p (the overlay's "rule logits"), on the
        same vocabulary as ``target_probs``. Adding a constant to a row changes nothing.
    temperature : float or None
        The sampling temperature the probabilities were processed with (SCD's default contrast
        temperature, and the temperature of its alpha gate; 0 counts as 1 there).
    target_lse, draft_lse : arrays (...) or None
        Log-sum-exp of each row over the *full* vocabulary, when a row holds only part of it
        (a top-K trace); None: the row's own log-sum-exp.
    target_known, draft_known : bool arrays (..., V) or None
        Which entries are known exactly; the others hold an upper bound of the true logit
        (a top-K trace stores K logits per model). None: all known.
    target_floor, draft_floor : arrays (...) or None
        An upper bound of every logit *outside* the row (tokens a top-K trace does not list);
        None: the row is the whole vocabulary.

    Rules state per row whether the logits they saw determine their result exactly
    (``Rule.logits_exact``); with full rows (decoding, ``import_logits``) everything is exact.
    """

    target: Any = None
    draft: Any = None
    temperature: float | None = None
    target_lse: Any = None
    draft_lse: Any = None
    target_known: Any = None
    draft_known: Any = None
    target_floor: Any = None
    draft_floor: Any = None

    def apply(self, change) -> RuleLogits:
        """The same logits with ``change`` (an array to an array) applied to every field that holds rows or
        per-row values (not the temperature)."""
        changes = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "temperature" and value is not None:
                changes[f.name] = change(value)
        return dataclasses.replace(self, **changes)

    def rows(self, index) -> RuleLogits:
        """The same logits restricted to rows ``index`` of the leading axis (NumPy indexing)."""
        return self.apply(lambda value: value[index])

    def lse(self, b, role):
        """Full-vocabulary log-sum-exp of one role's row, shape (...)."""
        given = getattr(self, f"{role}_lse")
        if given is not None:
            return given
        z = getattr(self, role)
        top = b.max_last(z, keepdims=True)
        top = b.where(b.isfinite(top), top, 0.0)
        return b.log(b.sum_last(b.exp(z - top))) + top[..., 0]

    def max_prob(self, b, role):
        """max_x softmax(z)(x) over the full vocabulary, at temperature 1 (exact on a top-K trace)."""
        z = getattr(self, role)
        return b.exp(b.max_last(z) - self.lse(b, role))
