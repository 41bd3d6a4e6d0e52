"""Relaxed acceptance of multi-token-prediction engines: accept a draft among the verifier's top
candidates close to its top-1 (TensorRT-LLM's MTP "relaxed acceptance" for the thinking phase)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._math._validation import check_int
from ._helpers import NUMPY
from ._protocol import Rule

__all__ = ["RelaxedTopK"]


@dataclass(frozen=True)
class RelaxedTopK(Rule):
    """Accept the draft n iff it is among the verifier's ``top_n`` most likely tokens and its
    probability is within ``delta`` of the top-1's (q(n) >= q_max - delta), or, with ``ratio``
    instead, q(n) >= ratio * q_max; after a rejection emit the verifier's top-1 token.

    TensorRT-LLM (``tensorrt_llm/_torch/speculative/mtp.py``, ``_process_generation_logits`` and
    ``cpp/tensorrt_llm/kernels/speculativeDecoding/mtpKernels.cu``, ``mtpRelaxedAcceptanceKernel``,
    NVIDIA/TensorRT-LLM @ 3585984) takes the top-N of the softmax of the verifier's raw logits at
    temperature 1 and compares *probabilities*: ``threshold = p_top1 - relaxed_delta``, the top-1
    always accepted, and a rejection or a fully accepted block emits the top-1 ("golden") token
    (its decoding is greedy). TensorRT-LLM's MTP options ``relaxed_topk`` and ``relaxed_delta``
    (``MTPDecodingConfig``, with ``use_relaxed_acceptance_for_thinking``) are this rule's ``top_n`` and
    ``delta``: one rule, not two (``tests/rules/test_engine_rules_2026.py`` checks it against the kernel's
    description written out). ``probs="logits"`` (the default) does the same here: it needs the
    verifier's raw logits (``RuleLogits(target=...)``); ``probs="processed"`` uses q, the
    distribution after temperature / top-k / top-p. The ``ratio`` form (q(n) >= ratio q_max) is
    the scale-free variant of the same idea found in vLLM ports; give ``delta`` or ``ratio``, not
    both. Candidates are ranked by probability, ties by the lower token id (the engines'
    ``torch.topk`` leaves tie order unspecified); only tokens with q(n) > 0 are accepted (the
    engines' softmax of raw logits has no zeros). Deterministic. **Not lossless**: pi = p 1_A +
    (1 - p(A)) one-hot(argmax q), A the accepted set. On a top-K trace the top-N set is exact for
    top_n <= K.
    """

    top_n: int = 10
    delta: float | None = 0.6
    ratio: float | None = None
    probs: str = "logits"
    name: ClassVar[str] = "relaxed-topk"
    reference: ClassVar[str] = (
        "NVIDIA/TensorRT-LLM @ 3585984, cpp/tensorrt_llm/kernels/speculativeDecoding/mtpKernels.cu "
        "(mtpRelaxedAcceptanceKernel) and tensorrt_llm/_torch/speculative/mtp.py (MTP relaxed acceptance)"
    )
    table: ClassVar[dict] = {
        "acceptance": "1{n in top-N of q and q(n) ≥ q_max − δ (or ≥ ratio·q_max)}",
        "correction": "argmax q",
        "emitted": "p·1_A + (1 − p(A)) δ_argmax",
        "lossless": "no",
    }
    comparison: ClassVar[tuple] = (
        ("", {"top_n": 10, "delta": 0.6}, "verifier"),
        ("", {"top_n": 10, "delta": 0.1}, "verifier"),
        ("", {"top_n": 10, "delta": None, "ratio": 0.5}, "verifier"),
    )
    examples: ClassVar[tuple] = (
        {"top_n": 3, "delta": 0.2},
        {"top_n": 2, "delta": None, "ratio": 0.3, "probs": "processed"},
        {"top_n": 1, "delta": 0.0, "probs": "processed"},
    )
    frontier: ClassVar[tuple] = tuple({"top_n": 10, "delta": d} for d in (0.05, 0.1, 0.2, 0.3, 0.45, 0.6))
    label_fields: ClassVar[tuple] = ("top_n", "delta", "ratio")
    #: Only tokens the processed q keeps are accepted (the engines' softmax of raw logits has no zeros).
    within_support: ClassVar[bool] = True
    deterministic: ClassVar[bool] = True

    def __post_init__(self):
        check_int(self.top_n, "relaxed-topk top_n", 1)
        if (self.delta is None) == (self.ratio is None):
            raise ValueError("relaxed-topk needs exactly one of delta (a probability gap) and ratio (a share of q_max)")
        if self.delta is not None and not (0 <= self.delta <= 1):
            raise ValueError(f"relaxed-topk delta must be a probability gap in [0, 1]; got {self.delta!r}")
        if self.ratio is not None and not (0 <= self.ratio <= 1):
            raise ValueError(f"relaxed-topk ratio must lie in [0, 1]; got {self.ratio!r}")
        if self.probs not in ("logits", "processed"):
            raise ValueError(f"relaxed-topk probs must be 'logits' or 'processed'; got {self.probs!r}")

    @property
    def needs_logits(self) -> tuple:
        return ("target",) if self.probs == "logits" else ()

    def _scores(self, b, q, lg):
        """The probabilities the rule ranks: softmax of the raw target logits at temperature 1
        (over the full vocabulary: a top-K trace's log-sum-exp), or q."""
        if self.probs == "processed":
            return q
        return b.exp(lg.target - lg.lse(b, "target")[..., None])

    def _accepted_set(self, b, q, lg):
        """Boolean (..., V): the tokens that would be accepted."""
        s = self._scores(b, q, lg)
        top = b.max_last(s, keepdims=True)
        close = s >= (top - self.delta) if self.delta is not None else s >= top * self.ratio
        # rank by (score desc, id asc): the tokens strictly above x, and the equal ones before it
        rows = np.asarray(b.to_numpy(s), dtype=np.float64)
        order = np.lexsort((np.broadcast_to(np.arange(rows.shape[-1]), rows.shape), -rows), axis=-1)
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.broadcast_to(np.arange(rows.shape[-1]), rows.shape), axis=-1)
        in_top = rank < self.top_n
        if b.name != "numpy":
            in_top = b.torch.as_tensor(in_top, device=s.device)
        return close & in_top & (q > 0) if self.within_support else close & in_top

    def _acceptance(self, b, p, q, n, lg):
        accepted = self._accepted_set(b, q, lg)
        hit = b.take_last(b.where(accepted, 1.0, 0.0) + 0.0 * q, n)
        return hit

    def _correction(self, b, p, q, n, lg):
        return b.put_last(q * 0.0, b.argmax_last(q), 1.0)

    def _acceptance_all(self, p, q, lg):
        return np.where(self._accepted_set(NUMPY, q, lg), 1.0, 0.0)

    def _logits_exact(self, p, q, lg):
        if self.probs == "processed" or lg.target_known is None:
            return True
        # the top-N are exact when at least top_n tokens with known logits are stored per row
        return np.sum(lg.target_known, axis=-1) >= self.top_n

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """pi = p 1_A + (1 - p(A)) one-hot(argmax q). O(V log V) (the ranking), exact."""
        p, q, lg = self._host(draft_probs, target_probs, logits)
        accept = self._acceptance_all(p, q, lg)
        rejected = np.sum(p * (1.0 - accept), axis=-1)
        return p * accept + rejected[..., None] * self._correction(NUMPY, p, q, None, lg)
