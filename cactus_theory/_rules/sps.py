"""Standard speculative sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._base import GeneralizedRule


@dataclass(frozen=True)
class SpS(GeneralizedRule):
    """Standard speculative sampling: accept with min(1, q(n)/p(n)), correct from norm(max(0, q - p)).

    Generalised speculative sampling with h = q (PAPER.md section 1). **Lossless**: the emitted
    distribution is exactly q for every draft p. The overlay's ``strict`` (RULES_ZOO.md 3.0).
    Leviathan et al., ICML 2023; Chen et al. 2023.

    Examples
    --------
    >>> import numpy as np
    >>> SpS().acceptance(np.array([0.5, 0.5]), np.array([0.2, 0.8]), 0)
    array(0.4)
    """

    lossless: ClassVar[bool] = True
    name: ClassVar[str] = "sps"

    def _target(self, b, p, q, n, lg):
        return q
