"""What a decoding run gives back for one prompt (``DecodeResult``): the tokens, the drafted and accepted counts
of each verification step, its timings, and under ``drift`` the law each token was emitted from, measured."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["DecodeResult"]


@dataclass
class DecodeResult:
    """Tokens emitted, and per verification step the drafted and accepted counts."""

    tokens: list
    drafted: list = field(default_factory=list)
    accepted: list = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0
    #: Seconds processing the prompt (both models; the verifier alone: its own).
    prefill_seconds: float = 0.0
    #: Seconds after the prefill at which each emitted token was available (per token).
    token_seconds: list = field(default_factory=list)
    #: With ``drift=True``: per emitted token, KL(pi_t || q_t) of the law the rule emitted it from
    #: (given the output before it and its place in the block) against the verifier's there.
    token_kl: list | None = None

    @property
    def answer_kl(self) -> float:
        """sum_t KL(pi_t || q_t) along this output (``drift=True``; NaN otherwise): an unbiased
        estimate, over outputs, of an upper bound of KL(law of the answer || the verifier's)."""
        return float(np.sum(self.token_kl)) if self.token_kl is not None else float("nan")

    @property
    def decode_seconds(self) -> float:
        """Seconds after the prefill."""
        return self.total_seconds - self.prefill_seconds

    @property
    def accepted_length(self) -> float:
        """AL: accepted draft tokens per verification step (Hao & Mou, ICLR 2026, experiments)."""
        return float(np.mean(self.accepted)) if self.accepted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's mean acceptance length: 1 + AL."""
        return 1.0 + self.accepted_length

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.total_seconds if self.total_seconds > 0 else float("nan")
