"""Typical acceptance sampling (Medusa; vLLM v0 TypicalAcceptanceSampler)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._helpers import NUMPY
from ._protocol import Rule

__all__ = ["TAS"]


@dataclass(frozen=True)
class TAS(Rule):
    """Typical acceptance: accept n iff q(n) > min(epsilon, alpha exp(-H(q))), H(q) = -sum q log(q + 1e-5).

    Deterministic. After a rejection the correction token is argmax q; the bonus token is
    sampled from q. The 1e-5 inside the logarithm is vLLM's. **Not lossless.**
    Cai et al., "Medusa", ICML 2024, section 3.3.1; defaults epsilon = 0.09, alpha = 0.3
    (vLLM v0); the Cactus paper's script uses epsilon = t, alpha = sqrt(t).

    Parameters
    ----------
    epsilon : float in (0, 1]
        Posterior threshold (hard cap on the threshold).
    alpha : float > 0
        Entropy-scaled threshold factor.
    """

    epsilon: float = 0.09
    alpha: float = 0.3
    deterministic: ClassVar[bool] = True
    name: ClassVar[str] = "tas"
    reference: ClassVar[str] = 'Cai et al., "Medusa", ICML 2024, section 3.3.1; vLLM v0 TypicalAcceptanceSampler'
    table: ClassVar[dict] = {
        "acceptance": "1{q(n) > min(ε, α e^−H(q))}",
        "correction": "argmax q",
        "emitted": "p·1{accepted} + rest on argmax q",
        "lossless": "no",
    }
    #: The paper's script sets epsilon = t, alpha = sqrt(t).
    frontier: ClassVar[tuple] = tuple({"epsilon": t, "alpha": round(t**0.5, 6)} for t in (0.01, 0.03, 0.09, 0.2, 0.3))
    comparison: ClassVar[tuple] = (("", {}, "verifier"),)
    label_fields: ClassVar[tuple] = ()
    examples: ClassVar[tuple] = ({"epsilon": 0.5, "alpha": 0.7},)

    def __post_init__(self):
        if not (0 < self.epsilon <= 1):
            raise ValueError(f"TAS epsilon must lie in (0, 1]; got {self.epsilon!r}")
        if not (self.alpha > 0 and np.isfinite(self.alpha)):
            raise ValueError(f"TAS alpha must be a finite number > 0; got {self.alpha!r}")

    def threshold(self, b, q):
        entropy = -b.sum_last(q * b.log(q + 1e-5))
        return b.minimum(b.exp(-entropy) * self.alpha, self.epsilon)

    def _acceptance(self, b, p, q, n, lg):
        accept = b.take_last(q, n) > self.threshold(b, q)
        return b.where(accept, 1.0, 0.0) + 0.0 * b.take_last(q, n)

    def _correction(self, b, p, q, n, lg):
        return b.put_last(q * 0.0, b.argmax_last(q), 1.0)

    def _acceptance_all(self, p, q, lg):
        return (q > self.threshold(NUMPY, q)[..., None]).astype(np.float64)

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """pi = p * 1{q > threshold} + (rejected mass) * one-hot(argmax q). O(V), exact."""
        p, q, lg = self._host(draft_probs, target_probs, logits)
        accept = self.acceptance_all(p, q)
        rejected = np.sum(p * (1.0 - accept), axis=-1)
        return p * accept + rejected[..., None] * self._correction(NUMPY, p, q, None, lg)
