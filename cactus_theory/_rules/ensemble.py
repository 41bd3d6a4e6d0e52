"""Static ensemble of drafter and verifier (the overlay's ``ensemble``), and always-accept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._protocol import GeneralizedRule

__all__ = ["Ensemble"]


@dataclass(frozen=True)
class Ensemble(GeneralizedRule):
    """Static ensemble: generalised SpS with h = (1 - w) p + w q, w = ``verifier_weight``.

    Acceptance min(1, (1 - w) + w q(n)/p(n)), correction norm((q - p)+) (the same as SpS, since
    (h - p)+ = w (q - p)+); the emitted law is h = (1 - w) p + w q. A token the verifier excludes
    (q(n) = 0) is still accepted with probability 1 - w. ``always-accept`` is w = 0: every draft
    is accepted and the drafter's p is emitted. w = 1 is SpS (lossless); otherwise **not lossless**.
    graphcore-research/relaxed-spec-dec-repro @ c28353f, ``ensemble`` (no paper cited there).

    Parameters
    ----------
    verifier_weight : float in [0, 1]
        w, the verifier's weight in the surrogate. Paper grid: 0.95, 0.9, 0.8; always-accept: 0.
    """

    verifier_weight: float = 0.9
    name: ClassVar[str] = "ensemble"
    reference: ClassVar[str] = (
        "graphcore-research/relaxed-spec-dec-repro @ c28353f, ensemble (static ensemble; no paper cited there)"
    )
    table: ClassVar[dict] = {
        "acceptance": "min(1, (1−w) + w q(n)/p(n))",
        "correction": "norm((q − p)+)",
        "emitted": "(1−w)p + wq",
        "lossless": "only w = 1",
    }
    comparison: ClassVar[tuple] = (
        ("always-accept", {"verifier_weight": 0.0}, "verifier"),
        ("ens", {"verifier_weight": 0.95}, "verifier"),
        ("ens", {"verifier_weight": 0.9}, "verifier"),
        ("ens", {"verifier_weight": 0.8}, "verifier"),
    )
    alias_summaries: ClassVar[dict] = {
        "always-accept": "Always accept the draft: the static ensemble with verifier_weight = 0 (emits p)."
    }
    alias_tables: ClassVar[dict] = {
        "always-accept": {"acceptance": "1", "correction": "(never sampled)", "emitted": "p", "lossless": "no"}
    }
    aliases: ClassVar[dict] = {"always-accept": {"verifier_weight": 0.0}}
    examples: ClassVar[tuple] = ({"verifier_weight": 0.95}, {"verifier_weight": 0.8}, {"verifier_weight": 0.0})

    def __post_init__(self):
        w = self.verifier_weight
        if not (isinstance(w, (int, float, np.number)) and 0 <= w <= 1):
            raise ValueError(f"Ensemble verifier_weight must lie in [0, 1] (0 = always accept); got {w!r}")

    @property
    def lossless(self) -> bool:
        return self.verifier_weight == 1

    def _surrogate(self, b, p, q, n, lg):
        return p * (1.0 - self.verifier_weight) + q * self.verifier_weight
