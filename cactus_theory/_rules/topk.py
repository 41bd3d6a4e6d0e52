"""Top-k acceptance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._base import GeneralizedRule


@dataclass(frozen=True)
class TopK(GeneralizedRule):
    """Top-k acceptance: accept n iff q(n) is among the k largest values of q (ties included).

    Generalised speculative sampling with the unnormalised target h = 1{q >= q_(k)}, so the
    correction is norm(max(0, 1{q >= q_(k)} - p)) (PAPER.md section 4). Deterministic.
    **Not lossless.**
    """

    k: int = 5
    deterministic: ClassVar[bool] = True
    name: ClassVar[str] = "topk"

    def __post_init__(self):
        if not (isinstance(self.k, int) and self.k >= 1):
            raise ValueError(f"TopK k must be an integer >= 1; got {self.k!r}")

    def _target(self, b, p, q, n):
        kth = b.topk_threshold(q, self.k)
        return b.where((q >= kth[..., None]) & (q > 0), 1.0, 0.0) + 0.0 * q
