"""Fuzzy speculative decoding: use the drafter outright when it is close to the verifier."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._helpers import NUMPY
from ._protocol import GeneralizedRule, Rule

__all__ = ["FSD", "RFSD"]

FUZZY_DIVERGENCES = ("kl", "js")
#: The overlay clamps probabilities inside logarithms at float32's smallest normal number.
_TINY32 = float(np.finfo(np.float32).tiny)


def fuzzy_divergence(b, p, q, kind):
    """The gate statistic D(p, q) per row, as the overlay computes it (``fsd_divergence_scores``).

    kind "kl": KL(q || p) (verifier first), logarithms of max(x, float32 tiny), so a token with
    q(x) > 0 = p(x) adds the finite q(x) (log q(x) + 87.34); "js": the Jensen-Shannon divergence,
    in [0, log 2]. Natural logarithms.
    """
    lq, lp = b.log(b.maximum(q, _TINY32)), b.log(b.maximum(p, _TINY32))
    if kind == "kl":
        return b.sum_last(q * (lq - lp))
    lm = b.log(b.maximum((p + q) * 0.5, _TINY32))
    return b.sum_last(q * (lq - lm)) * 0.5 + b.sum_last(p * (lp - lm)) * 0.5


@dataclass(frozen=True)
class _FuzzyGate:
    """The parameters and the gate statistic shared by ``rfsd`` and ``fsd``."""

    divergence: str = "js"
    threshold: float = 0.2
    label_fields: ClassVar[tuple] = ("divergence", "threshold")

    def __post_init__(self):
        if self.divergence not in FUZZY_DIVERGENCES:
            raise ValueError(
                f"{type(self).__name__} divergence must be one of {FUZZY_DIVERGENCES}; got {self.divergence!r}"
            )
        t = self.threshold
        if not (isinstance(t, (int, float, np.number)) and t >= 0 and np.isfinite(t)):
            raise ValueError(f"{type(self).__name__} threshold must be a finite number >= 0; got {t!r}")

    def statistic(self, b, p, q):
        """D(p, q) per row (``fuzzy_divergence``)."""
        return fuzzy_divergence(b, p, q, self.divergence)


@dataclass(frozen=True)
class RFSD(_FuzzyGate, GeneralizedRule):
    """Relaxed fuzzy speculative decoding: if D(p, q) <= threshold use the drafter (h = p, every
    draft accepted), else SpS (h = q).

    The gate is per position and non-strict; D is ``fuzzy_divergence`` (KL(q || p) or JS, on
    the processed rows). Emitted law: p where the gate holds, q elsewhere. Accepts tokens the
    verifier excludes wherever the gate holds. **Not lossless.** A "relaxed" variant of Fuzzy
    Speculative Decoding (Holsman et al. 2025; attribution ours), as in
    graphcore-research/relaxed-spec-dec-repro @ c28353f (``rfsd``, grid label "r-fuzzy").

    Parameters
    ----------
    divergence : "js" or "kl"
    threshold : float >= 0
        Paper grid: js with 0.05, 0.2, 0.3.
    """

    name: ClassVar[str] = "rfsd"
    reference: ClassVar[str] = (
        'Holsman et al., "Fuzzy Speculative Decoding for a Tunable Accuracy-Runtime Tradeoff", 2025'
        " (attribution ours); graphcore-research/relaxed-spec-dec-repro @ c28353f, rfsd"
    )
    table: ClassVar[dict] = {
        "acceptance": "1 if D(p, q) ≤ τ, else SpS",
        "correction": "SpS's",
        "emitted": "p or q",
        "lossless": "no",
    }
    comparison: ClassVar[tuple] = (
        ("r-fuzzy", {"divergence": "js", "threshold": 0.05}, "verifier"),
        ("r-fuzzy", {"divergence": "js", "threshold": 0.2}, "verifier"),
        ("r-fuzzy", {"divergence": "js", "threshold": 0.3}, "verifier"),
    )
    examples: ClassVar[tuple] = ({"threshold": 0.05}, {"divergence": "kl", "threshold": 0.5})

    def use_draft(self, b, p, q):
        """Where the gate holds (the drafter is used outright), shape (...)."""
        return self.statistic(b, p, q) <= self.threshold

    def _surrogate(self, b, p, q, n, lg):
        return b.where(self.use_draft(b, p, q)[..., None], p, q)


@dataclass(frozen=True)
class FSD(_FuzzyGate, Rule):
    """Fuzzy speculative decoding, exact form: accept every draft iff D(p, q) < threshold
    (strict), otherwise reject every draft and sample the correction from q itself.

    Deterministic; not generalised SpS (a rejected draft with q(n) >= p(n) is still replaced).
    Emitted law: p where the gate holds, q elsewhere (the law of ``rfsd`` with a strict gate, at
    lower acceptance). **Not lossless.** Holsman et al. 2025 (attribution ours);
    graphcore-research/relaxed-spec-dec-repro @ c28353f, ``fsd``.

    Parameters
    ----------
    divergence : "js" or "kl"
    threshold : float >= 0
    """

    deterministic: ClassVar[bool] = True
    name: ClassVar[str] = "fsd"
    reference: ClassVar[str] = (
        'Holsman et al., "Fuzzy Speculative Decoding for a Tunable Accuracy-Runtime Tradeoff", '
        "2025; graphcore-research/relaxed-spec-dec-repro @ c28353f, fsd"
    )
    table: ClassVar[dict] = {"acceptance": "1{D(p, q) < τ}", "correction": "q", "emitted": "p or q", "lossless": "no"}
    comparison: ClassVar[tuple] = (("", {"divergence": "js", "threshold": 0.2}, "verifier"),)
    examples: ClassVar[tuple] = ({"threshold": 0.3}, {"divergence": "kl", "threshold": 0.5})

    def gate(self, b, p, q):
        """Where every draft is accepted (strict D < threshold), shape (...)."""
        return self.statistic(b, p, q) < self.threshold

    def _acceptance(self, b, p, q, n, lg):
        return b.where(self.gate(b, p, q), 1.0, 0.0) + 0.0 * b.take_last(q, n)

    def _correction(self, b, p, q, n, lg):
        return q + 0.0

    def _acceptance_all(self, p, q, lg):
        return np.broadcast_to(self.gate(NUMPY, p, q)[..., None], q.shape).astype(np.float64)

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """p where D(p, q) < threshold, else q. O(V), exact."""
        p, q, _ = self._host(draft_probs, target_probs, logits)
        return np.where(self.gate(NUMPY, p, q)[..., None], p, q)
