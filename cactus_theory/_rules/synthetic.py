"""Synthetic acceptance (vLLM's benchmarking mode): a fixed acceptance rate per draft slot."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._math._validation import check_int
from ._protocol import Rule

__all__ = ["SyntheticAcceptance"]


def _others(x):
    """sum_{y != x} over the last axis, as exclusive prefix plus suffix sums (no cancellation)."""
    zero = np.zeros((*x.shape[:-1], 1))
    before = np.concatenate([zero, np.cumsum(x, axis=-1)[..., :-1]], axis=-1)
    after = np.concatenate([zero, np.cumsum(x[..., ::-1], axis=-1)[..., :-1]], axis=-1)[..., ::-1]
    return before + after


def _length_to_rates(length):
    """vLLM's minimum-variance schedule of a mean acceptance length L (``SpeculativeConfig.
    _acceptance_length_to_rates``): floor(L - 1) ones, the fraction, then nothing (rate 0)."""
    drafts = length - 1.0
    full = int(drafts)
    return (1.0,) * full + ((drafts - full,) if drafts > full else ()) or (0.0,)


@dataclass(frozen=True)
class SyntheticAcceptance(Rule):
    """Accept the draft at block slot i with a fixed probability, whatever p, q and n.

    ``rates`` are unconditional: r_i = P(the first i + 1 drafts of a block are accepted),
    non-increasing, so the draft at slot i is accepted with the conditional rate
    c_i = r_i / r_{i-1} (r_{-1} = 1; 0 past the list or after a zero rate) and AL(m) = sum_{i<m} r_i.
    After a rejection the token is drawn from q without the drafted token, norm(q 1{x != n})
    (vLLM's no-draft-probabilities residual); if q is one-hot on n that is token 0, a token the
    verifier may exclude. Emitted law at slot i:
    pi = c_i p + (1 - c_i) [q sum_{n != x, q(n) < 1} p(n) / (1 - q(n)) + 1{x = 0} sum_{q(n) = 1} p(n)].
    **Not lossless.** vLLM ``synthetic`` rejection sampling (the overlay's ``rejection_sample_method="synthetic"``).

    Parameters
    ----------
    rates : tuple of floats in [0, 1], non-increasing
    acceptance_length : float >= 1 or None
        vLLM's ``synthetic_acceptance_length`` instead of ``rates``: a target mean acceptance length
        L, resolved as vLLM does (``_acceptance_length_to_rates``, its minimum-variance schedule):
        floor(L - 1) rates of 1, then the fraction L - 1 - floor(L - 1), then 0. Give ``rates`` or
        ``acceptance_length``, not both.
    slot : int >= 0
        The block slot this instance applies to (``at_slot``); per-position statistics (acceptance,
        emitted law) are those of this slot; accepted lengths use every slot.
    """

    rates: tuple[float, ...] = (0.9, 0.6, 0.3)
    slot: int = 0
    acceptance_length: float | None = None
    name: ClassVar[str] = "synthetic"
    reference: ClassVar[str] = 'vLLM, rejection_sample_method="synthetic" (a benchmarking mode)'
    table: ClassVar[dict] = {
        "acceptance": "c_slot (whatever p, q, n)",
        "correction": "norm(q·1{x ≠ n})",
        "emitted": "closed form",
        "lossless": "no",
    }
    comparison: ClassVar[tuple] = ()
    slot_dependent: ClassVar[bool] = True
    examples: ClassVar[tuple] = (
        {"rates": (0.7,)},
        {"rates": (0.9, 0.6, 0.3), "slot": 1},
        {"acceptance_length": 2.5, "slot": 1},
    )

    def __post_init__(self):
        if self.acceptance_length is not None:
            length = self.acceptance_length
            if (
                isinstance(length, bool)
                or not isinstance(length, (int, float, np.number))
                or not (np.isfinite(length) and length >= 1)
            ):
                raise ValueError(f"synthetic acceptance_length must be a number >= 1; got {length!r}")
            resolved = _length_to_rates(float(length))
            if tuple(np.atleast_1d(np.asarray(self.rates, dtype=np.float64)).tolist()) not in (
                (0.9, 0.6, 0.3),
                resolved,
            ):
                raise ValueError("synthetic takes rates or acceptance_length, not both")
            object.__setattr__(self, "rates", resolved)
        rates = tuple(float(r) for r in np.atleast_1d(np.asarray(self.rates, dtype=np.float64)))
        object.__setattr__(self, "rates", rates)
        if not rates or not all(0 <= r <= 1 for r in rates):
            raise ValueError(f"synthetic rates must be a non-empty list of probabilities in [0, 1]; got {self.rates!r}")
        if any(b > a for a, b in itertools.pairwise(rates)):
            raise ValueError(f"synthetic rates are unconditional and must not increase; got {rates!r}")
        check_int(self.slot, "synthetic slot", 0)

    def describe(self) -> str:
        if self.acceptance_length is None:
            return super().describe()
        slot = f", slot={self.slot}" if self.slot else ""
        return f"synthetic(acceptance_length={self.acceptance_length:g}{slot})"

    def at_slot(self, slot: int) -> SyntheticAcceptance:
        return dataclasses.replace(self, slot=int(slot))

    @property
    def conditional_rate(self) -> float:
        """c_slot = r_slot / r_{slot - 1} (0 past the list or after a zero rate)."""
        if self.slot >= len(self.rates):
            return 0.0
        before = self.rates[self.slot - 1] if self.slot > 0 else 1.0
        return self.rates[self.slot] / before if before > 0 else 0.0

    def _acceptance(self, b, p, q, n, lg):
        return 0.0 * b.take_last(q, n) + self.conditional_rate

    def _correction(self, b, p, q, n, lg):
        w = b.put_last(q, n, 0.0)
        z = b.sum_last(w, keepdims=True)
        token0 = b.put_last(q * 0.0, 0 * b.argmax_last(q), 1.0)
        return b.where(z > 0, w / b.where(z > 0, z, 1.0), token0)

    def _acceptance_all(self, p, q, lg):
        return np.full(q.shape, self.conditional_rate)

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """The closed form in the class docstring, O(V), exact up to rounding."""
        p, q, _ = self._host(draft_probs, target_probs, logits)
        c = self.conditional_rate
        rest = _others(q)  # 1 - q(n) as the others' mass
        with np.errstate(all="ignore"):
            w = np.where(rest > 0, p / np.where(rest > 0, rest, 1.0), 0.0)
        out = q * _others(w)
        out[..., 0] += np.sum(np.where(rest > 0, 0.0, p), axis=-1)
        return c * p + (1.0 - c) * out
