"""Top-k acceptance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._math._validation import check_int
from ._protocol import GeneralizedRule

__all__ = ["TopK"]

SEMANTICS = ("support", "authors")


@dataclass(frozen=True)
class TopK(GeneralizedRule):
    """Top-k acceptance: accept n iff q(n) >= q_(k), the k-th largest value of q, and q(n) > 0.

    Every token tied with the k-th largest value is accepted, so more than k tokens may be.
    Generalised speculative sampling with the unnormalised surrogate h = 1{q >= q_(k), q > 0}, so
    the correction is norm(max(0, h - p)) (a baseline of Hao & Mou, ICLR 2026). Deterministic. **Not lossless.**

    Parameters
    ----------
    k : int >= 1
    semantics : "support" or "authors"
        "support" (default): only tokens the verifier keeps (q(n) > 0) are accepted.
        "authors": the authors' baseline (MANGA-UOFA/Cactus, ``cactus/topk.py``), h = 1{q >= q_(k)}
        without the support condition; when the verifier keeps fewer than k tokens (after its
        top-k / top-p), q_(k) = 0 and every token is accepted, those it excludes included.
    """

    k: int = 5
    semantics: str = "support"
    deterministic: ClassVar[bool] = True
    name: ClassVar[str] = "topk"
    reference: ClassVar[str] = "Hao & Mou, ICLR 2026 (a baseline); MANGA-UOFA/Cactus, cactus/topk.py"
    table: ClassVar[dict] = {
        "acceptance": "1{q(n) ≥ q_(k)} (and q(n) > 0 unless semantics=authors)",
        "correction": "norm((1{…} − p)+)",
        "emitted": "GSS formula",
        "lossless": "no",
    }
    frontier: ClassVar[tuple] = tuple({"k": k} for k in (2, 3, 5, 10))
    comparison: ClassVar[tuple] = (("", {"k": 5}, "verifier"), ("", {"k": 5, "semantics": "authors"}, "verifier"))
    examples: ClassVar[tuple] = ({"k": 3}, {"k": 3, "semantics": "authors"})

    def __post_init__(self):
        check_int(self.k, "TopK k", 1)
        if self.semantics not in SEMANTICS:
            raise ValueError(f"TopK semantics must be one of {SEMANTICS}; got {self.semantics!r}")

    def _surrogate(self, b, p, q, n, lg):
        keep = q >= b.topk_threshold(q, self.k)[..., None]
        if self.semantics == "support":
            keep = keep & (q > 0)
        return b.where(keep, 1.0, 0.0) + 0.0 * q
