"""Entropy verify (vllm-ascend PR 9772, ``rejection_sampler_config.enable_entropy_verify``): the
native acceptance test with the uniform scaled down where the verifier is uncertain."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._protocol import GeneralizedRule

__all__ = ["EntropyVerify"]

ENTROPY_SOURCES = ("logits", "processed")


@dataclass(frozen=True)
class EntropyVerify(GeneralizedRule):
    """Accept the draft n iff p(n) > 0 and q(n) / p(n) >= c u, u ~ U(0, 1), with
    c = min(exp(-alpha H), threshold) and H = -sum_x s(x) log(s(x) + epsilon) the entropy of the
    verifier's distribution s at that position; after a rejection sample the native residual
    norm((q - p)+). So the acceptance is min(1, q(n) / (c p(n))), applied at every slot of the
    block with its own c: generalised SpS with h = min(max(p, q), q / c), the ``lossy`` rule with
    1 - alpha = c chosen per position. **Not lossless** (c < 1 wherever threshold < 1); never
    accepts a token the verifier excludes.

    ``entropy_of="logits"`` (vllm-ascend's: ``ori_target_probs``, the softmax of the verifier's
    raw logits at temperature 1, before temperature / top-k / top-p) needs ``RuleLogits(target=)``;
    on a top-K trace the entropy is over the stored logits (the tail's share is missing, so
    ``logits_exact`` is False where a row does not hold the whole vocabulary);
    ``entropy_of="processed"`` uses q itself (the kernel's fallback when no original distribution
    is given). vllm-ascend ``rejection_random_sample_pytorch`` and ``rejection_random_sample_kernel``
    (``ENTROPY_VERIFY``; defaults posterior_threshold = 0.95, posterior_alpha = 1.0 as its log
    prints them). ``epsilon`` is the kernel's ``EPSILON`` constant; its value there was not read
    (1e-10 here: it changes H by less than V epsilon).
    """

    threshold: float = 0.95
    alpha: float = 1.0
    epsilon: float = 1e-10
    entropy_of: str = "logits"
    name: ClassVar[str] = "entropy-verify"
    reference: ClassVar[str] = (
        "vllm-project/vllm-ascend PR 9772 (rejection_sampler_config: enable_entropy_verify, posterior_threshold, "
        "posterior_alpha; rejection_random_sample_kernel with ENTROPY_VERIFY)"
    )
    table: ClassVar[dict] = {
        "acceptance": "min(1, q(n)/(c p(n))), c = min(exp(−α H), threshold)",
        "correction": "norm((q − p)+)",
        "emitted": "min(p, q/c) + R·norm((q − p)+)",
        "lossless": "only threshold = 1 at H = 0",
    }
    comparison: ClassVar[tuple] = (
        ("", {}, "verifier"),
        ("", {"alpha": 0.4}, "verifier"),
        ("", {"entropy_of": "processed"}, "verifier"),
    )
    examples: ClassVar[tuple] = (
        {"alpha": 0.4, "entropy_of": "processed"},
        {"threshold": 0.5, "alpha": 2.0},
        {"threshold": 1.0, "alpha": 0.0, "entropy_of": "processed"},
    )
    label_fields: ClassVar[tuple] = ("threshold", "alpha")
    #: at threshold = 1, alpha = 0 it is SpS (and so the one-draft form of the block rules)
    same_law_as: ClassVar[tuple] = ("sps", "lossy", "block", "fly", "magic-mtp")

    def __post_init__(self):
        if not (isinstance(self.threshold, (int, float, np.floating)) and 0 < self.threshold <= 1):
            raise ValueError(
                f"entropy-verify threshold (posterior_threshold) must lie in (0, 1]; got {self.threshold!r}"
            )
        if not (isinstance(self.alpha, (int, float, np.floating)) and np.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"entropy-verify alpha (posterior_alpha) must be a finite number >= 0; got {self.alpha!r}")
        if not (isinstance(self.epsilon, (int, float, np.floating)) and 0 <= self.epsilon < 1e-3):
            raise ValueError(f"entropy-verify epsilon must lie in [0, 1e-3); got {self.epsilon!r}")
        if self.entropy_of not in ENTROPY_SOURCES:
            raise ValueError(
                f"entropy-verify entropy_of must be one of {', '.join(ENTROPY_SOURCES)}; got {self.entropy_of!r}"
            )

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.threshold == 1 and self.alpha == 0

    @property
    def needs_logits(self) -> tuple:
        return ("target",) if self.entropy_of == "logits" else ()

    def _scale(self, b, q, lg):
        """c = min(exp(-alpha H), threshold) per row, shape (..., 1)."""
        if self.entropy_of == "processed":
            s = q
        else:
            s = b.exp(lg.target - lg.lse(b, "target")[..., None])
        entropy = -b.sum_last(s * b.log(s + self.epsilon))
        return b.minimum(b.exp(-self.alpha * entropy), self.threshold + 0.0 * entropy)[..., None]

    def _surrogate(self, b, p, q, n, lg):
        return b.minimum(b.maximum(p, q), q / self._scale(b, q, lg))

    def _logits_exact(self, p, q, lg):
        if self.entropy_of == "processed" or lg.target_known is None:
            return True
        return np.all(lg.target_known, axis=-1)
