"""Interpolation between draft and verifier."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._protocol import GeneralizedRule

__all__ = ["Interpolation"]


@dataclass(frozen=True)
class Interpolation(GeneralizedRule):
    """Generalised speculative sampling with h = alpha p + (1 - alpha) q.

    Emits exactly h (h does not depend on the drafted token), with acceptance
    1 - TV(p, h) = 1 - (1 - alpha) TV(p, q). alpha = 0 is SpS (lossless); otherwise
    **not lossless**. A baseline of Hao & Mou, ICLR 2026. The overlay's ``ensemble`` is the same law with
    ``verifier_weight = 1 - alpha`` (``Ensemble``).
    """

    alpha: float = 0.5
    name: ClassVar[str] = "interpolation"
    reference: ClassVar[str] = "Hao & Mou, ICLR 2026 (a baseline)"
    table: ClassVar[dict] = {
        "acceptance": "min(1, h(n)/p(n)), h = αp + (1−α)q",
        "correction": "norm((h − p)+)",
        "emitted": "h",
        "lossless": "only α = 0",
    }
    frontier: ClassVar[tuple] = tuple({"alpha": a} for a in (0.1, 0.3, 0.5, 0.7))
    comparison: ClassVar[tuple] = (("", {"alpha": 0.5}, "verifier"),)
    examples: ClassVar[tuple] = ({"alpha": 0.4},)

    def __post_init__(self):
        if not (0 <= self.alpha <= 1 and np.isfinite(self.alpha)):
            raise ValueError(f"Interpolation alpha must lie in [0, 1]; got {self.alpha!r}")

    def _surrogate(self, b, p, q, n, lg):
        return p * self.alpha + q * (1.0 - self.alpha)
