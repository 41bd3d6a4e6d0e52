"""Speculative cascades: defer to the drafter or the verifier per position (OPT), or per token (Tok3)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._protocol import GeneralizedRule

__all__ = ["SpecCascadeOpt", "SpecCascadeTok3"]

OPT_GATES = ("processed", "paper")
TOP_SETS = ("paper", "processed")


@dataclass(frozen=True)
class SpecCascadeOpt(GeneralizedRule):
    """SpecCascades [OPT]: per position, use the drafter outright (h = p) unless the rule defers
    to the verifier (h = q, SpS):

        defer  iff  max p~ < max q~ - alpha TV(p, q)      (strict; TV on the processed rows)

    with p~, q~ the processed rows (``gate="processed"``, the grid's default) or the softmax of
    the raw logits at temperature 1 without truncation (``gate="paper"``: needs
    ``logits=RuleLogits(target=..., draft=...)``; exact on a top-K trace, which stores the top
    logit and the log-sum-exp). Emitted law: q where it defers, p elsewhere; accepts tokens the
    verifier excludes where it keeps the drafter. **Not lossless.** Narasimhan et al., "Faster
    Cascades via Speculative Decoding" (attribution ours); graphcore-research/relaxed-spec-dec-repro
    ``spec_cascade_opt``.

    Parameters
    ----------
    alpha : float
        Negative alpha defers more. Paper grid: -0.1, 0, 0.05.
    gate : "processed" or "paper"
    """

    alpha: float = 0.0
    gate: str = "processed"
    name: ClassVar[str] = "spec-cascade-opt"
    reference: ClassVar[str] = (
        'Narasimhan et al., "Faster Cascades via Speculative Decoding", ICLR 2025 ([OPT]; '
        "attribution ours); graphcore-research/relaxed-spec-dec-repro @ c28353f, spec_cascade_opt"
    )
    table: ClassVar[dict] = {
        "acceptance": "1 unless it defers (then SpS)",
        "correction": "SpS's",
        "emitted": "p or q",
        "lossless": "no",
    }
    comparison: ClassVar[tuple] = (
        ("spec-casc-opt", {"alpha": -0.1}, "verifier"),
        ("spec-casc-opt", {"alpha": 0.0}, "verifier"),
        ("spec-casc-opt", {"alpha": 0.05}, "verifier"),
        ("", {"alpha": 0.0, "gate": "paper"}, "verifier"),
    )
    examples: ClassVar[tuple] = ({"alpha": -0.1}, {"alpha": 0.05}, {"alpha": 0.0, "gate": "paper"})

    def __post_init__(self):
        if not (isinstance(self.alpha, (int, float, np.number)) and np.isfinite(self.alpha)):
            raise ValueError(f"SpecCascadeOpt alpha must be a finite number; got {self.alpha!r}")
        if self.gate not in OPT_GATES:
            raise ValueError(f"SpecCascadeOpt gate must be one of {OPT_GATES}; got {self.gate!r}")

    @property
    def needs_logits(self) -> tuple:
        return ("target", "draft") if self.gate == "paper" else ()

    def defer(self, b, p, q, lg):
        """Where the rule defers to the verifier, shape (...)."""
        tv = b.sum_last(b.maximum(q - p, 0.0))
        if self.gate == "processed":
            top_draft, top_target = b.max_last(p), b.max_last(q)
        else:
            top_draft, top_target = lg.max_prob(b, "draft"), lg.max_prob(b, "target")
        return top_draft < top_target - tv * self.alpha

    def _surrogate(self, b, p, q, n, lg):
        return b.where(self.defer(b, p, q, lg)[..., None], q, p)


@dataclass(frozen=True)
class SpecCascadeTok3(GeneralizedRule):
    """SpecCascades token-level (TokenV3): keep the drafter on the verifier's top set T, move the
    rest of its mass onto q:

        h(x) = p(x) 1{x in T} + eta q(x),   eta = sum_{x not in T} p(x)      (sum h = 1)

    T = {x : z(x) >= max z + log(1 - alpha)} (ties included), i.e. softmax(z)(x) >= (1 - alpha)
    max softmax(z); alpha = 0 keeps the single argmax (first index on ties), alpha = 1 every token
    with a finite logit. ``top_set="paper"`` (the grid's default) takes z = the verifier's raw
    logits before temperature / top-k / top-p (needs ``logits=RuleLogits(target=...)``);
    ``"processed"`` the processed ones (computed from q). Drafts in T are always accepted, even
    when q(n) = 0. The emitted law is h. **Not lossless.** On a top-K trace with the paper top
    set, T is exact where the smallest stored verifier logit lies below the threshold (always
    for alpha = 0; for alpha = 1 unstored logits are taken as finite). Narasimhan et al.
    (attribution ours); graphcore-research/relaxed-spec-dec-repro ``spec_cascade_tok3``
    (``spec_cascade_tok3``).

    Parameters
    ----------
    alpha : float in [0, 1]
        Paper grid: 0, 0.35, 0.8.
    top_set : "paper" or "processed"
    """

    alpha: float = 0.35
    top_set: str = "paper"
    name: ClassVar[str] = "spec-cascade-tok3"
    #: alpha = 1 keeps every token with a finite logit in T: h = p, the law of always-accept.
    same_law_as: ClassVar[tuple] = ("always-accept",)
    reference: ClassVar[str] = (
        'Narasimhan et al., "Faster Cascades via Speculative Decoding", ICLR 2025 (TokenV3; '
        "attribution ours); graphcore-research/relaxed-spec-dec-repro @ c28353f, spec_cascade_tok3"
    )
    table: ClassVar[dict] = {
        "acceptance": "1 on T, min(1, η q(n)/p(n)) off T",
        "correction": "norm((h − p)+)",
        "emitted": "h = p·1_T + η q",
        "lossless": "no",
    }
    comparison: ClassVar[tuple] = (
        ("spec-casc-tok", {"alpha": 0.0}, "verifier"),
        ("spec-casc-tok", {"alpha": 0.35}, "verifier"),
        ("spec-casc-tok", {"alpha": 0.8}, "verifier"),
        ("", {"alpha": 0.35, "top_set": "processed"}, "verifier"),
    )
    examples: ClassVar[tuple] = (
        {"alpha": 0.0},
        {"alpha": 0.8},
        {"alpha": 1.0},
        {"alpha": 0.35, "top_set": "processed"},
        {"alpha": 0.0, "top_set": "processed"},
    )

    def __post_init__(self):
        if not (isinstance(self.alpha, (int, float, np.number)) and 0 <= self.alpha <= 1):
            raise ValueError(f"SpecCascadeTok3 alpha must lie in [0, 1]; got {self.alpha!r}")
        if self.top_set not in TOP_SETS:
            raise ValueError(f"SpecCascadeTok3 top_set must be one of {TOP_SETS}; got {self.top_set!r}")

    @property
    def needs_logits(self) -> tuple:
        return ("target",) if self.top_set == "paper" else ()

    def _threshold_log(self):
        return math.log1p(-self.alpha) if self.alpha < 1 else -math.inf

    def in_top_set(self, b, p, q, lg):
        """T as a boolean mask, shape (..., V)."""
        if self.top_set == "processed":
            score = b.where(q > 0, q, -1.0)
            top = b.max_last(score, keepdims=True)
            if self.alpha == 0:
                return b.put_last(q * 0.0, b.argmax_last(score), 1.0) > 0
            return (q > 0) & (score >= top * (1.0 - self.alpha))
        z = lg.target
        finite = b.isfinite(z)
        z = b.where(finite, z, -np.inf)
        if self.alpha == 0:
            return b.put_last(q * 0.0, b.argmax_last(z), 1.0) > 0
        if self.alpha == 1:
            return finite
        return finite & (z >= b.max_last(z, keepdims=True) + self._threshold_log())

    def _surrogate(self, b, p, q, n, lg):
        kept = b.where(self.in_top_set(b, p, q, lg), p, 0.0)
        eta = b.sum_last(p - kept, keepdims=True)
        return kept + q * eta

    def _logits_exact(self, p, q, lg):
        if self.top_set == "processed" or self.alpha in (0, 1) or lg.target_floor is None:
            return True
        z = np.where(np.isfinite(lg.target), lg.target, -np.inf)
        return np.asarray(lg.target_floor) < np.max(z, axis=-1) + self._threshold_log()
