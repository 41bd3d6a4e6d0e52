"""Speculative contrastive decoding: the surrogate is a contrast of verifier and drafter logits."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._helpers import NUMPY
from ._protocol import GeneralizedRule

__all__ = ["SCD"]

SCD_GATES = ("toppk", "alpha")


@dataclass(frozen=True)
class SCD(GeneralizedRule):
    """Speculative contrastive decoding: generalised SpS with the surrogate pi_scd, a contrast of
    the verifier's and the drafter's raw logits on the gate G:

        pi_scd = softmax( ((1 + beta) zq - beta zp) / T_cd )  on the gate G, 0 off it,

    where zq, zp are the verifier's and drafter's raw logits (before temperature / top-k /
    top-p; ``logits=RuleLogits(target=..., draft=..., temperature=...)``). The emitted law is
    pi_scd; tokens off G (outside the verifier's support for the "toppk" gate) are never accepted.
    beta = 0 with T_cd = the sampling temperature and the "toppk" gate is SpS.

    Gates: ``"toppk"`` (the grid's ``scd_expert_toppk_gated``): G = the verifier's support after its
    top-k / top-p (q > 0). ``"alpha"`` (``scd_alpha``): G = {x : zq(x) >= max zq + T log alpha}
    with T the sampling temperature (0 counts as 1). On a top-K trace, zp is stored only for the
    drafter's top K: where G holds a token outside it, the bound stored in its place is used
    and ``logits_exact`` is False for that position. **Not lossless** for beta > 0.
    Yuan et al. 2023 (SCD), Li et al. 2023 (contrastive decoding); attribution ours;
    graphcore-research/relaxed-spec-dec-repro (@ c28353f; its grid uses the relaxed
    bonus policy for SCD).

    Parameters
    ----------
    beta : float >= 0
        Contrast strength. Paper grid: 0.1, 0.5, 1.
    temperature : float > 0 or None
        T_cd; None: the sampling temperature given in the logits (the grid's 0.6).
    gate : "toppk" or "alpha"
    alpha : float in (0, 1]
        Plausibility level of the "alpha" gate (unused by "toppk").
    """

    beta: float = 0.5
    temperature: float | None = None
    gate: str = "toppk"
    alpha: float = 0.1
    name: ClassVar[str] = "scd"
    reference: ClassVar[str] = (
        'Yuan et al., "Speculative Contrastive Decoding", 2023; Li et al., "Contrastive Decoding", '
        "ACL 2023 (attribution ours); graphcore-research/relaxed-spec-dec-repro @ c28353f, "
        "scd_expert_toppk_gated / scd_alpha"
    )
    table: ClassVar[dict] = {
        "acceptance": "min(1, π_scd(n)/p(n))",
        "correction": "norm((π_scd − p)+)",
        "emitted": "π_scd = softmax(((1+β) zq − β zp)/T) on G",
        "lossless": "no",
    }
    comparison: ClassVar[tuple] = (
        ("spec-cont-dec", {"beta": 0.1, "temperature": 0.6}, "relaxed"),
        ("spec-cont-dec", {"beta": 0.5, "temperature": 0.6}, "relaxed"),
        ("spec-cont-dec", {"beta": 1.0, "temperature": 0.6}, "relaxed"),
        ("", {"beta": 0.5, "temperature": 0.6, "gate": "alpha", "alpha": 0.1}, "relaxed"),
    )
    examples: ClassVar[tuple] = (
        {"beta": 0.1},
        {"beta": 1.0, "temperature": 1.0},
        {"beta": 0.5, "gate": "alpha", "alpha": 0.1},
        {"beta": 0.0, "gate": "alpha", "alpha": 0.5},
    )

    def __post_init__(self):
        if not (isinstance(self.beta, (int, float, np.number)) and self.beta >= 0 and np.isfinite(self.beta)):
            raise ValueError(f"SCD beta must be a finite number >= 0; got {self.beta!r}")
        if self.temperature is not None and not (self.temperature > 0 and np.isfinite(self.temperature)):
            raise ValueError(f"SCD temperature must be a finite number > 0 or None; got {self.temperature!r}")
        if self.gate not in SCD_GATES:
            raise ValueError(f"SCD gate must be one of {SCD_GATES}; got {self.gate!r}")
        if not (isinstance(self.alpha, (int, float, np.number)) and 0 < self.alpha <= 1):
            raise ValueError(f"SCD alpha must lie in (0, 1]; got {self.alpha!r}")

    @property
    def needs_logits(self) -> tuple:
        return ("target", "draft")

    def _sampling_temperature(self, lg):
        if lg.temperature is None:
            raise ValueError(
                f"{self.describe()} needs the sampling temperature: pass RuleLogits(..., temperature=T) "
                "or give the rule temperature=..."
            )
        return float(lg.temperature) if lg.temperature > 0 else 1.0

    def gate_mask(self, b, p, q, lg):
        """G as a boolean mask, shape (..., V)."""
        if self.gate == "toppk":
            return q > 0
        zq = lg.target
        finite = b.isfinite(zq)
        top = b.max_last(b.where(finite, zq, -np.inf), keepdims=True)
        return finite & (zq >= top + self._sampling_temperature(lg) * math.log(self.alpha))

    def _surrogate(self, b, p, q, n, lg):
        t_cd = self.temperature if self.temperature is not None else self._sampling_temperature(lg)
        gate = self.gate_mask(b, p, q, lg)
        if b.any(b.sum_last(b.where(gate, 1.0, 0.0) + 0.0 * q) == 0):
            raise ValueError(f"{self.describe()}: the gate is empty in some row (no token the verifier keeps)")
        for role in ("target", "draft"):
            if b.any(gate & ~b.isfinite(getattr(lg, role))):
                raise ValueError(
                    f"{self.describe()}: logits.{role} is not finite on a token of the gate "
                    "(the contrast needs both models' logits wherever the verifier keeps a token)"
                )
        zq = b.where(gate, lg.target, 0.0)
        zp = b.where(gate, lg.draft, 0.0)
        score = b.where(gate, (zq * (1.0 + self.beta) - zp * self.beta) / t_cd, -np.inf)
        weights = b.where(gate, b.exp(score - b.max_last(score, keepdims=True)), 0.0)
        return weights / b.sum_last(weights, keepdims=True)

    def _logits_exact(self, p, q, lg):
        gate = self.gate_mask(NUMPY, p, q, lg)
        exact = np.ones(q.shape[:-1], dtype=bool)
        if lg.draft_known is not None:
            exact &= ~np.any(gate & ~np.asarray(lg.draft_known), axis=-1)
        if self.gate == "alpha":
            if lg.target_known is not None:
                exact &= ~np.any(gate & ~np.asarray(lg.target_known), axis=-1)
            if lg.target_floor is not None:
                zq = np.where(np.isfinite(lg.target), lg.target, -np.inf)
                thr = np.max(zq, axis=-1) + self._sampling_temperature(lg) * math.log(self.alpha)
                exact &= np.asarray(lg.target_floor) < thr
        return exact
