"""Cactus: constrained acceptance speculative sampling (Taylor, exact or safe bonus)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._math._divergences import FDivergence, get_divergence
from .._math._gamma import approx_gamma, exact_gamma
from .._math._row_kernels import emitted_rows
from .._math._surrogate import surrogate_core
from ._helpers import ratio_acceptance, ratio_acceptance_host
from ._protocol import GeneralizedRule

__all__ = ["Cactus"]


def _rowwise_searchsorted(sorted_rows, sorted_values, side):
    """np.searchsorted row by row (2-D arrays); the queries are sorted too, which keeps the
    binary searches in cache (3x faster than unsorted queries at V = 151,936). A batched merge
    (stable argsort of each row's two runs) was measured slower at every size tried."""
    out = np.empty(sorted_values.shape, dtype=np.int64)
    for i in range(sorted_rows.shape[0]):
        out[i] = np.searchsorted(sorted_rows[i], sorted_values[i], side=side)
    return out


def emitted_drafted_bonus(gamma, p, q, compiled=True, order=None, accept=None, order_s_hint=None):
    """Exact emitted distribution of a rule whose target raises the drafted token n to gamma_n
    and scales the other tokens of q by s_n = (1 - gamma_n) / (1 - q(n)) (Cactus, any bonus).

    pi(x) = p(x) a_x + sum_{n != x} c_n max(0, s_n q(x) - p(x)), a_n = min(1, gamma_n / p(n)),
    c_n = p(n) (1 - a_n) / Z_n, Z_n = sum_x max(0, s_n q(x) - p(x)).

    With tokens sorted by rho = p/q, prefix sums give every Z_n; with the s_n sorted, suffix
    sums give every pi(x): O(V log V) per row instead of O(V^2). Both searches run with sorted
    queries (Z in s order, pi in rho order, scattered back once), batched over rows with one
    Python step per row. ``gamma``, ``p`` and ``q`` are float64 arrays (..., V); gamma[..., n] is
    the bonus if n were drafted; ``order``: np.argsort of rho = p / q along the rows (rows of a 2-D
    view) and ``accept``: min(1, gamma / p), when the caller has them (the sort does not depend on
    gamma: shared across settings); ``order_s_hint``: an order of the tokens that may sort s (for
    Cactus, q descending: s falls as q rises), used where it does, checked row by row (else
    np.argsort). Exact up to rounding (sums of non-negative terms taken as
    differences of prefix sums: absolute error ~ V eps). With numba (``compiled``), the part
    after the two sorts runs as one compiled pass per row (rows in parallel), the same sums in
    the same order (``tests/math/test_kernels.py`` checks both paths agree).
    """
    shape = q.shape
    gamma, p, q = (np.broadcast_to(x, shape).reshape(-1, shape[-1]) for x in (gamma, p, q))
    rows = np.arange(q.shape[0])[:, None]
    with np.errstate(all="ignore"):
        other = np.sum(q, axis=-1, keepdims=True) - q  # 1 - q(n)
        s = np.where(other > 0, (1.0 - gamma) / np.where(other > 0, other, 1.0), 0.0)
        s[gamma == q] = 1.0  # no bonus: exactly SpS
        accept = ratio_acceptance_host(gamma, p) if accept is None else accept.reshape(q.shape)
        rho = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf)
    order = np.argsort(rho, axis=-1) if order is None else order.reshape(q.shape)
    order_s = None
    if order_s_hint is not None:  # any order that sorts s will do: ties only reorder sums
        order_s = order_s_hint.reshape(q.shape)
        bad = np.any(np.diff(np.take_along_axis(s, order_s, axis=-1), axis=-1) < 0, axis=-1)
        if bad.any():
            order_s = order_s.copy()
            order_s[bad] = np.argsort(s[bad], axis=-1)
    if order_s is None:
        order_s = np.argsort(s, axis=-1)
    if compiled:
        out = emitted_rows(p, q, s, accept, rho, order, order_s)
        if out is not None:
            return out.reshape(shape)
    w = p * (1.0 - accept)
    rho_sorted, s_sorted = rho[rows, order], s[rows, order_s]
    zeros = np.zeros((q.shape[0], 1))
    cq = np.concatenate([zeros, np.cumsum(q[rows, order], axis=-1)], axis=-1)
    cp = np.concatenate([zeros, np.cumsum(p[rows, order], axis=-1)], axis=-1)
    # Z_n = G(s_n), G(s) = s Q(rho < s) - P(rho < s), for the drafted tokens n in s order
    k = _rowwise_searchsorted(rho_sorted, s_sorted, side="left")
    z = s_sorted * cq[rows, k] - cp[rows, k]
    # n itself never receives residual mass (h_n(n) = gamma_n < p(n) when rejected), but rounding
    # in 1 - q(n) can put s_n q(n) a hair above p(n): take it out of Z_n explicitly.
    own = np.maximum(s * q - p, 0.0)
    z -= own[rows, order_s]
    w_sorted = w[rows, order_s]
    with np.errstate(all="ignore"):
        c_sorted = np.where((w_sorted > 0) & (z > 0), w_sorted / np.where(z > 0, z, 1.0), 0.0)
    # S1(x) = sum_{n: s_n > rho(x)} c_n s_n, S2(x) = sum_{n: s_n > rho(x)} c_n, for x in rho order
    suffix1 = np.concatenate([np.cumsum((c_sorted * s_sorted)[:, ::-1], axis=-1)[:, ::-1], zeros], axis=-1)
    suffix2 = np.concatenate([np.cumsum(c_sorted[:, ::-1], axis=-1)[:, ::-1], zeros], axis=-1)
    j = _rowwise_searchsorted(s_sorted, rho_sorted, side="right")
    s1, s2 = np.empty_like(q), np.empty_like(q)
    s1[rows, order], s2[rows, order] = suffix1[rows, j], suffix2[rows, j]
    c = np.empty_like(q)
    c[rows, order_s] = c_sorted
    with np.errstate(all="ignore"):
        self_term = np.where(s > rho, c * own, 0.0)
        pi = p * accept + q * s1 - p * s2 - self_term
    return np.maximum(np.where(np.isfinite(pi), pi, 0.0), 0.0).reshape(shape)


BONUS_FORMS = ("taylor", "exact", "safe")


def _distinct(q):
    """(q > 0, the distinct positive values of q, the index of each positive entry among them): the
    exact bonus is solved once per distinct q(n) (rows repeat values: ties, the same token across
    positions; most entries of a top-k row are 0)."""
    positive = q > 0
    values, inverse = np.unique(q[positive], return_inverse=True)
    return positive, values, inverse


@dataclass(frozen=True)
class Cactus(GeneralizedRule):
    """Cactus: raise the drafted token to a bonus gamma, scale the others of q (Theorem 2).

    Target for drafted token n: h(n) = gamma, h(x) = q(x)(1 - gamma)/(1 - q(n)). Accept with
    min(1, gamma / p(n)); correct from norm(max(0, h - p)). The draft distribution does not
    enter gamma. delta = 0 is SpS (lossless); delta > 0 is **not lossless**: the emitted
    distribution is the mixture of Theorem 3, not h. Hao & Mou, "Cactus", ICLR 2026.

    Parameters
    ----------
    delta : float >= 0
        Divergence budget per position.
    divergence : str or FDivergence
        f-divergence of the constraint (default "kl", the paper's).
    bonus : "taylor", "exact" or "safe"
        How gamma is computed from q(n) and delta:

        - "taylor" (default, the authors' code and the overlay): the closed form of Corollary 5,
          gamma = min(q(n) + sqrt(2 delta q(n)(1 - q(n)) / f''(1)), 1) (``approx_gamma``). An
          approximation: h may overspend delta.
        - "exact": gamma* = the largest gamma with B_f(gamma; q(n)) <= delta (``exact_gamma``),
          so every per-token target satisfies D_f(h || q) <= delta. Spec name ``cactus-exact``.
        - "safe": the provably delta-safe closed form (``approx_gamma(method="safe")``).

        Whatever the bonus, the emitted distribution drifts beyond delta (Theorem 3 of the paper).
    """

    delta: float = 1.0
    grid_parameters: ClassVar[tuple] = ("delta",)
    keeps_input_precision: ClassVar[bool] = True
    divergence: str | FDivergence = "kl"
    bonus: str = "taylor"
    surrogate_depends_on_token: ClassVar[bool] = True
    name: ClassVar[str] = "cactus"
    reference: ClassVar[str] = (
        'Hao & Mou, "Cactus: Accelerating Auto-Regressive Decoding with Constrained Acceptance '
        'Speculative Sampling", ICLR 2026; MANGA-UOFA/Cactus'
    )
    table: ClassVar[dict] = {
        "acceptance": "min(1, γ/p(n)); γ Taylor, exact or safe",
        "correction": "norm((h_n − p)+)",
        "emitted": "O(V log V) mixture",
        "lossless": "only δ = 0",
    }
    frontier: ClassVar[tuple] = tuple(
        {"delta": d, "bonus": bonus} for bonus in ("taylor", "exact") for d in (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
    )
    comparison: ClassVar[tuple] = (
        ("CACTUS", {"delta": 0.1}, "verifier"),
        ("CACTUS", {"delta": 0.25}, "verifier"),
        ("CACTUS", {"delta": 1.0}, "verifier"),
        ("CACTUS", {"delta": 10.0}, "verifier"),
        ("", {"delta": 0.25, "bonus": "exact"}, "verifier"),
        ("", {"delta": 1.0, "bonus": "exact"}, "verifier"),
    )
    alias_summaries: ClassVar[dict] = {
        "cactus-exact": "Cactus with the exact bonus gamma* (never over delta per token): cactus(bonus=exact)."
    }
    alias_tables: ClassVar[dict] = {
        "cactus-exact": {
            "acceptance": "min(1, γ*/p(n)), γ* exact",
            "correction": "norm((h_n − p)+)",
            "emitted": "O(V log V) mixture",
            "lossless": "only δ = 0",
        }
    }
    aliases: ClassVar[dict] = {"cactus-exact": {"bonus": "exact"}}
    examples: ClassVar[tuple] = (
        {"delta": 0.5},
        {"delta": 1.0, "divergence": "hellinger"},
        {"delta": 0.5, "bonus": "exact"},
        {"delta": 0.3, "divergence": "reverse_kl", "bonus": "exact"},
        {"delta": 0.4, "bonus": "safe"},
    )

    def __post_init__(self):
        if not (isinstance(self.delta, (int, float, np.floating, np.integer)) and self.delta >= 0):
            raise ValueError(f"{type(self).__name__} delta must be a number >= 0; got {self.delta!r}")
        get_divergence(self.divergence)  # raises for an unknown name
        if self.bonus not in BONUS_FORMS:
            raise ValueError(f"Cactus bonus must be one of {BONUS_FORMS}; got {self.bonus!r}")

    @property
    def lossless(self) -> bool:  # delta = 0 reduces to SpS
        return self.delta == 0

    def gamma(self, target_prob, shared=None):
        """The bonus for drafted tokens with verifier probability ``target_prob`` (NumPy). The
        exact bonus is solved and certified once per distinct q(n) (rows repeat values: zeros,
        ties, the same token across positions); ``shared`` (``step_metrics``) keeps the distinct
        values of these rows for every setting."""
        if self.bonus == "exact":
            q = np.asarray(target_prob, dtype=np.float64)
            if q.size > 64:
                if shared is not None:
                    if "q_distinct" not in shared:
                        shared["q_distinct"] = _distinct(q)
                    positive, values, inverse = shared["q_distinct"]
                else:
                    positive, values, inverse = _distinct(q)
                out = np.empty(q.shape)
                out[positive] = np.asarray(exact_gamma(values, self.delta, self.divergence))[inverse]
                out[~positive] = exact_gamma(0.0, self.delta, self.divergence)  # q(n) = 0: one value
                return out
            return exact_gamma(target_prob, self.delta, self.divergence)
        return approx_gamma(target_prob, self.delta, self.divergence, method=self.bonus)

    def _gamma_on(self, b, qn):
        """The bonus for the gathered q(n), float64 on ``qn``'s device: the Taylor form of a finite
        delta computed there with the NumPy path's operations in its order (the same float64 bits,
        nothing read back to the host); the exact and safe forms, and an infinite delta, on the host."""
        div = get_divergence(self.divergence)
        if b.name == "torch" and self.bonus == "taylor" and div.f_second_at_one is not None and np.isfinite(self.delta):
            q = qn.to(b.torch.float64)
            inc = (1.0 - q) * q
            inc = (inc * (2.0 * np.float64(self.delta) / div.f_second_at_one)).sqrt_()
            return b.torch.clamp(inc.add_(q), max=1.0)
        return b.asarray(
            np.asarray(self.gamma(b.to_numpy(qn)), dtype=np.float64),
            like=qn,
            dtype=b.torch.float64 if b.name == "torch" else np.float64,
        )

    def _surrogate(self, b, p, q, n, lg):
        return surrogate_core(b, q, n, self._gamma_on(b, b.take_last(q, n)))

    def _acceptance(self, b, p, q, n, lg):
        # Only gamma is needed: h(n) = gamma (one-hot edge: q(n) = 1 gives gamma = 1).
        gamma = self._gamma_on(b, b.take_last(q, n))
        return ratio_acceptance(b, gamma, b.asarray(b.take_last(p, n), like=gamma))

    def _acceptance_all(self, p, q, lg):
        return ratio_acceptance_host(np.asarray(self.gamma(q), dtype=np.float64), p)

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """Exact emitted distribution in O(V log V) (see ``emitted_drafted_bonus``)."""
        p, q, _ = self._host(draft_probs, target_probs, logits)
        return emitted_drafted_bonus(np.asarray(self.gamma(q), dtype=np.float64), p, q)

    def emitted_and_acceptance_all(self, p, q, *, logits=None, shared=None):
        """The emitted law and a_n for every n from one bonus per token (not one for each), with
        the sort of p / q kept in ``shared`` for every Cactus setting on these rows."""
        p, q, _ = self._host(p, q, logits, validate=False)
        gamma = np.asarray(self.gamma(q, shared), dtype=np.float64)
        order = None
        if shared is not None:
            if "rho_order" not in shared:
                with np.errstate(all="ignore"):
                    rho = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf)
                shared["rho_order"] = np.argsort(rho.reshape(-1, q.shape[-1]), axis=-1)
            order = shared["rho_order"]
            if "q_descending" not in shared:
                shared["q_descending"] = np.argsort(-q.reshape(-1, q.shape[-1]), axis=-1, kind="stable")
        accept = ratio_acceptance_host(gamma, p)
        hint = None if shared is None else shared["q_descending"]
        pi = emitted_drafted_bonus(gamma, p, q, order=order, accept=accept, order_s_hint=hint)
        return pi, np.where((p <= 0) & (q <= 0), 0.0, accept)
