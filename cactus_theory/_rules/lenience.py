"""Lenient speculative sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._base import GeneralizedRule


@dataclass(frozen=True)
class Lenience(GeneralizedRule):
    """Accept with min(1, q(n) / (l p(n))), correct from norm(max(0, q - l p)).

    Generalised speculative sampling with the unnormalised target h = q / l.
    Leviathan et al., ICML 2023, appendix A.5. l = 1 is SpS (lossless); l < 1 is **not lossless**.
    """

    leniency: float = 0.5
    name: ClassVar[str] = "lenience"
    examples: ClassVar[tuple] = ({"leniency": 0.6},)

    def __post_init__(self):
        if not (0 < self.leniency <= 1 and np.isfinite(self.leniency)):
            raise ValueError(f"Lenience leniency must lie in (0, 1]; got {self.leniency!r}")

    def _target(self, b, p, q, n, lg):
        return q / self.leniency
