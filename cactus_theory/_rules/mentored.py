"""Mentored decoding: the KL-optimal single target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy import special

from .._math._row_kernels import mentored_rows
from ._helpers import prepare
from ._protocol import GeneralizedRule

__all__ = ["Mentored", "mentored_surrogate"]

_BISECTIONS = 200


def _mentored_row(p, q, delta):
    """h = clip(p, a q, b q) with sum h = 1 and KL(h || q) = delta (or h = p if KL(p || q) <= delta).

    Tokens sorted by rho = p/q; for a given b, sum h is piecewise linear in a, so a(b) is
    solved exactly segment by segment; KL(h || q) increases with b, which is bisected in log b.
    """
    kl_pq = float(np.sum(special.rel_entr(p, q)))
    if kl_pq <= delta:
        return p.copy()
    with np.errstate(all="ignore"):
        rho = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf)
    order = np.argsort(rho, kind="stable")
    rho_s, p_s, q_s = rho[order], p[order], q[order]
    cq = np.concatenate([[0.0], np.cumsum(q_s)])
    cp = np.concatenate([[0.0], np.cumsum(p_s)])
    with np.errstate(all="ignore"):
        plogr = np.where(p_s > 0, p_s * np.log(rho_s), 0.0)
    cpl = np.concatenate([[0.0], np.cumsum(np.where(np.isfinite(plogr), plogr, 0.0))])
    total_p = cp[-1]
    # q mass above an index as a suffix sum: the tail can be 1e-29 (a token the verifier all but
    # excludes), which 1 - (prefix sum) would round to 0.
    q_above = np.concatenate([np.cumsum(q_s[::-1])[::-1], [0.0]])

    def solve_a(b):
        hi = int(np.searchsorted(rho_s, b, side="right"))  # tokens with rho <= b
        fixed = cp[hi] + b * q_above[hi]  # mass if no token is raised to a q
        k = np.arange(1, hi + 1)
        with np.errstate(all="ignore"):
            a_k = (total_p - fixed + cp[k]) / cq[k]
        upper = np.where(k < hi, rho_s[np.minimum(k, len(rho_s) - 1)], b)
        valid = (a_k >= rho_s[k - 1]) & (a_k <= upper) & np.isfinite(a_k)
        if valid.any():
            j = int(np.argmax(valid))
            return float(a_k[j]), int(k[j]), hi

        # Rounding left no segment consistent: bisect the (monotone) mass in a instead.
        def mass(a):
            lo = int(np.searchsorted(rho_s, a, side="left"))
            return a * cq[lo] + (cp[hi] - cp[min(lo, hi)]) + b * q_above[hi] if lo <= hi else np.inf

        a_lo, a_hi = 0.0, b
        for _ in range(_BISECTIONS):
            mid = 0.5 * (a_lo + a_hi)
            a_lo, a_hi = (mid, a_hi) if mass(mid) < total_p else (a_lo, mid)
            if a_hi - a_lo <= 1e-16 * a_hi:
                break
        a = 0.5 * (a_lo + a_hi)
        return a, min(int(np.searchsorted(rho_s, a, side="left")), hi), hi

    def kl(b):
        a, lo, hi = solve_a(b)
        value = special.xlogy(a, a) * cq[lo] + (cpl[hi] - cpl[lo]) + special.xlogy(b, b) * q_above[hi]
        return value, a

    finite = rho_s[np.isfinite(rho_s) & (rho_s > 0)]
    log_lo, log_hi = 0.0, max(float(np.log(finite[-1])) if finite.size else 0.0, 0.0)
    for _ in range(_BISECTIONS):
        mid = 0.5 * (log_lo + log_hi)
        if kl(np.exp(mid))[0] > delta:
            log_hi = mid
        else:
            log_lo = mid
        if log_hi - log_lo <= 4e-16 * max(1.0, log_hi):
            break
    b = float(np.exp(log_lo))  # the feasible side: KL <= delta
    a = kl(b)[1]
    h = np.minimum(np.maximum(p, a * q), b * q)
    return h / h.sum()


def mentored_surrogate(draft_probs, target_probs, delta):
    """The KL-optimal surrogate of mentored decoding, h = clip(p, a q, b q) (Tran-Thien 2023; the
    KKT conditions are our derivation).

    Maximises the acceptance sum_x min(p(x), h(x)) subject to KL(h || q) <= delta; a <= 1 <= b
    are set by sum h = 1 and KL(h || q) = delta (found by nested bisection over sorted ratios
    p/q, O(V log V) per row). If KL(p || q) <= delta, h = p. NumPy or torch in, same out
    (solved on the host in float64).
    """
    b, p, q, _, ref = prepare(draft_probs, target_probs, None)
    if not (delta >= 0):
        raise ValueError(f"delta must be a divergence budget >= 0; got {delta!r}")
    return b.cast(b.asarray(_mentored_rows(b, p, q, float(delta)), like=q), ref)


def _mentored_rows(b, p, q, delta):
    """The surrogate row by row on the host in float64 (rows renormalised there), NumPy out."""
    p_h = np.asarray(b.to_numpy(p), dtype=np.float64)
    q_h = np.asarray(b.to_numpy(q), dtype=np.float64)
    p_h, q_h = p_h / p_h.sum(axis=-1, keepdims=True), q_h / q_h.sum(axis=-1, keepdims=True)
    flat_p, flat_q = p_h.reshape(-1, p_h.shape[-1]), q_h.reshape(-1, q_h.shape[-1])
    h = mentored_rows(flat_p, flat_q, delta, _BISECTIONS)  # compiled twin (numba), when installed
    if h is None:
        h = np.stack([_mentored_row(pr, qr, delta) for pr, qr in zip(flat_p, flat_q, strict=True)])
    return h.reshape(p_h.shape)


@dataclass(frozen=True)
class Mentored(GeneralizedRule):
    """Mentored decoding (Tran-Thien 2023): generalised SpS with the KL-optimal surrogate
    h = clip(p, a q, b q), KL(h || q) = delta.

    h does not depend on the drafted token, so the emitted distribution IS h and the budget
    holds for what is emitted: KL(pi || q) <= delta. Needs the full vocabulary of both
    distributions. delta = 0 is SpS (lossless); otherwise **not lossless**. Not the overlay's
    "mentored-dec" grid label, which is ``lossy`` (a boosted acceptance with the vanilla residual
    and no budget).
    """

    delta: float = 1.0
    grid_parameters: ClassVar[tuple] = ("delta",)
    name: ClassVar[str] = "mentored"
    reference: ClassVar[str] = (
        'Tran-Thien, "An Optimal Lossy Variant of Speculative Decoding" (mentored decoding), 2023; '
        "the KKT solution is our derivation"
    )
    table: ClassVar[dict] = {
        "acceptance": "min(1, h(n)/p(n)), h = clip(p, aq, bq), KL(h‖q) = δ",
        "correction": "norm((h − p)+)",
        "emitted": "h",
        "lossless": "only δ = 0",
    }
    frontier: ClassVar[tuple] = tuple({"delta": d} for d in (0.05, 0.1, 0.25, 0.5, 1.0))
    comparison: ClassVar[tuple] = (("", {"delta": 0.25}, "verifier"), ("", {"delta": 1.0}, "verifier"))
    examples: ClassVar[tuple] = ({"delta": 0.2},)

    def __post_init__(self):
        if not (isinstance(self.delta, (int, float, np.floating, np.integer)) and self.delta >= 0):
            raise ValueError(f"Mentored delta must be a number >= 0; got {self.delta!r}")

    @property
    def lossless(self) -> bool:
        return self.delta == 0

    def _surrogate(self, b, p, q, n, lg):
        return b.asarray(_mentored_rows(b, p, q, float(self.delta)), like=q)
