"""Lenient speculative sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._protocol import GeneralizedRule

__all__ = ["Lenience"]


@dataclass(frozen=True)
class Lenience(GeneralizedRule):
    """Accept with min(1, q(n) / (l p(n))), correct from norm(max(0, q - l p)).

    Generalised speculative sampling with the unnormalised surrogate h = q / l.
    Leviathan et al., ICML 2023, appendix A.5. l = 1 is SpS (lossless); l < 1 is **not lossless**.
    """

    leniency: float = 0.5
    name: ClassVar[str] = "lenience"
    reference: ClassVar[str] = "Leviathan, Kalman & Matias, ICML 2023, appendix A.5"
    table: ClassVar[dict] = {
        "acceptance": "min(1, q(n)/(l p(n)))",
        "correction": "norm((q − l p)+)",
        "emitted": "GSS formula",
        "lossless": "only l = 1",
    }
    frontier: ClassVar[tuple] = tuple({"leniency": x} for x in (0.9, 0.7, 0.5, 0.3))
    comparison: ClassVar[tuple] = (("", {"leniency": 0.5}, "verifier"),)
    examples: ClassVar[tuple] = ({"leniency": 0.6},)

    def __post_init__(self):
        if not (0 < self.leniency <= 1 and np.isfinite(self.leniency)):
            raise ValueError(f"Lenience leniency must lie in (0, 1]; got {self.leniency!r}")

    def _surrogate(self, b, p, q, n, lg):
        return q / self.leniency
