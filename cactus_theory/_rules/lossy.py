"""Lossy speculative decoding with beta = 1 (the overlay's grid label "mentored-dec")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._protocol import GeneralizedRule

__all__ = ["Lossy"]


@dataclass(frozen=True)
class Lossy(GeneralizedRule):
    """Lossy SpS with beta = 1: accept with min(1, q(n) / ((1 - alpha) p(n))), correct from the
    vanilla residual norm((q - p)+).

    Generalised SpS with the unnormalised surrogate h = min(max(p, q), q / (1 - alpha)); emitted law
    pi = min(p, q/(1 - alpha)) + (1 - sum min(p, q/(1 - alpha))) norm((q - p)+), between q
    (alpha = 0, SpS) and p. Never accepts a token the verifier excludes. **Not lossless** for
    alpha > 0. graphcore-research/relaxed-spec-dec-repro ``lossy_spec_decode_beta1``, which its
    paper grid labels "mentored-dec". It is *not* our ``mentored``: that rule
    solves for the acceptance-optimal target under a KL budget on what is emitted; this one
    boosts the acceptance by a fixed factor and has no budget.

    Parameters
    ----------
    alpha : float in [0, 1)
        Paper grid: 0.95, 0.7, 0.3.
    """

    alpha: float = 0.7
    name: ClassVar[str] = "lossy"
    reference: ClassVar[str] = (
        "graphcore-research/relaxed-spec-dec-repro @ c28353f, lossy_spec_decode_beta1 (grid label "
        '"mentored-dec"; no paper cited there)'
    )
    table: ClassVar[dict] = {
        "acceptance": "min(1, q(n)/((1−α) p(n)))",
        "correction": "norm((q − p)+)",
        "emitted": "min(p, q/(1−α)) + R·norm((q − p)+)",
        "lossless": "only α = 0",
    }
    frontier: ClassVar[tuple] = tuple({"alpha": a} for a in (0.1, 0.3, 0.5, 0.7, 0.9))
    comparison: ClassVar[tuple] = (
        ("mentored-dec", {"alpha": 0.95}, "verifier"),
        ("mentored-dec", {"alpha": 0.7}, "verifier"),
        ("mentored-dec", {"alpha": 0.3}, "verifier"),
    )
    examples: ClassVar[tuple] = ({"alpha": 0.95}, {"alpha": 0.3})

    def __post_init__(self):
        if not (isinstance(self.alpha, (int, float, np.number)) and 0 <= self.alpha < 1):
            raise ValueError(f"Lossy alpha must lie in [0, 1); got {self.alpha!r}")

    @property
    def lossless(self) -> bool:
        return self.alpha == 0

    def _surrogate(self, b, p, q, n, lg):
        return b.minimum(b.maximum(p, q), q / (1.0 - self.alpha))
