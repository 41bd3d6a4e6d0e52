"""Standard speculative sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._protocol import GeneralizedRule

__all__ = ["SpS"]


@dataclass(frozen=True)
class SpS(GeneralizedRule):
    """Standard speculative sampling: accept with min(1, q(n)/p(n)), correct from norm(max(0, q - p)).

    Generalised speculative sampling with h = q. **Lossless**: the emitted distribution is
    exactly q for every draft p. The overlay's ``strict``. Leviathan et al., ICML 2023; Chen et
    al. 2023.

    Examples
    --------
    >>> import numpy as np
    >>> SpS().acceptance(np.array([0.5, 0.5]), np.array([0.2, 0.8]), 0)
    array(0.4)
    """

    lossless: ClassVar[bool] = True
    keeps_input_precision: ClassVar[bool] = True
    name: ClassVar[str] = "sps"
    reference: ClassVar[str] = (
        'Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative Decoding", '
        'ICML 2023; Chen et al., "Accelerating Large Language Model Decoding with Speculative '
        'Sampling", arXiv 2302.01318'
    )
    table: ClassVar[dict] = {
        "acceptance": "min(1, q(n)/p(n))",
        "correction": "norm((q − p)+)",
        "emitted": "q",
        "lossless": "yes",
    }
    comparison: ClassVar[tuple] = (("strict spec-dec", {}, "verifier"),)

    def _surrogate(self, b, p, q, n, lg):
        return q
