"""Strict verification: sample the verifier's token and accept the draft only if they are equal
(llama.cpp, mlx-lm, vLLM's ``rejection_sample_method="strict"``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._protocol import Rule

__all__ = ["Strict"]


@dataclass(frozen=True)
class Strict(Rule):
    """Strict verification: draw y from q; accept the drafted token n iff y = n, else emit y.

    Acceptance q(n), whatever p (the draft's probabilities are not used); after a rejection the
    token is y given y != n, norm(q 1{x != n}). **Lossless**: pi = p q + q (1 - p) = q. The
    expected acceptance of a sampled draft is sum_x p(x) q(x), below SpS's sum_x min(p, q); with
    a greedy (one-hot) draft it equals SpS. llama.cpp's and mlx-lm's speculative decoding, vLLM
    ``rejection_sample_method="strict"`` (the default of its MTP path), and vLLM's standard
    rejection sampler when the drafter passes no probabilities (``draft_probs=None``: n-gram,
    greedy EAGLE / MTP drafts, heterogeneous vocabularies): its kernel takes the draft as one-hot,
    accepts with q(n) / 1 and recovers from q with n removed (``NO_DRAFT_PROBS``).
    """

    name: ClassVar[str] = "strict"
    reference: ClassVar[str] = (
        'vLLM rejection_sample_method="strict" and the rejection sampler with draft_probs=None (NO_DRAFT_PROBS); '
        "llama.cpp common/speculative.cpp; mlx-lm speculative generation"
    )
    table: ClassVar[dict] = {
        "acceptance": "q(n)",
        "correction": "norm(q·1{x ≠ n})",
        "emitted": "q",
        "lossless": "yes",
    }
    comparison: ClassVar[tuple] = (("", {}, "verifier"),)
    lossless: ClassVar[bool] = True

    def _acceptance(self, b, p, q, n, lg):
        return b.take_last(q, n) + 0.0 * b.take_last(p, n)

    def _correction(self, b, p, q, n, lg):
        # y given y != n; where q is one-hot on n (never rejected) q itself, so the row is a distribution
        rest = b.put_last(q, n, 0.0)
        mass = b.sum_last(rest, keepdims=True)
        return b.where(mass > 0, rest / b.where(mass > 0, mass, 1.0), q)

    def _acceptance_all(self, p, q, lg):
        return q + 0.0 * p

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """q (exact: lossless)."""
        _, q, _ = self._host(draft_probs, target_probs, logits)
        return np.array(q)

    def emitted_and_acceptance_all(self, p, q, *, logits=None, shared=None):
        p, q, _ = self._host(p, q, logits, validate=False)
        return np.array(q), np.where((p <= 0) & (q <= 0), 0.0, self._acceptance_all(p, q, None))
