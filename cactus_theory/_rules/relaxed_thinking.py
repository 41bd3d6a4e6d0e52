"""vLLM's relaxed acceptance of reasoning spans (vllm-project/vllm #45229, a port of #22238): a draft among the
verifier's top three whose logit is at least the top logit plus log 0.5 is accepted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .relaxed_topk import RelaxedTopK

__all__ = ["RelaxedThinking"]


@dataclass(frozen=True)
class RelaxedThinking(RelaxedTopK):
    """vLLM's relaxed thinking (``speculative_config.relaxed_thinking=True``, vllm-project/vllm #45229): inside
    a reasoning span a draft n is accepted iff it is among the verifier's ``top_n`` largest raw logits (3 in
    vLLM, a module constant; ties by the lower id) and z(n) >= z_max + log(``ratio``) (``ratio`` 0.5 in vLLM),
    the raw logits compared directly; after a rejection the verifier's own token is emitted (vLLM applies it
    to greedy requests: the argmax; here the argmax of q, whatever the sampling). Outside reasoning spans vLLM
    keeps strict verification; this rule is the in-span law.

    z(n) >= z_max + log r is softmax(z)(n) >= r max softmax(z) at temperature 1, so this is ``relaxed-topk``'s
    ratio form over the raw logits (``relaxed-topk(top_n=3, delta=none, ratio=0.5, probs=logits)``) but for
    one thing: vLLM compares raw logits whatever the sampler keeps, so a draft the processed q excludes
    (q(n) = 0: cut by top-k / top-p at the request's temperature) is accepted too, and the emitted law then
    puts mass where the verifier's sampler puts none (infinite KL). Deterministic. **Not lossless**: pi =
    p 1_A + (1 - p(A)) one-hot(argmax q). Exact on a top-K trace for top_n <= K.
    """

    top_n: int = 3
    delta: float | None = None
    ratio: float | None = 0.5
    probs: str = "logits"
    name: ClassVar[str] = "relaxed-thinking"
    reference: ClassVar[str] = (
        "vllm-project/vllm #45229 ([V1][Spec Decode] Relaxed acceptance for thinking-phase tokens, a port of #22238: "
        "top-K 3, draft_logit >= top1_logit + log(0.5))"
    )
    table: ClassVar[dict] = {
        "acceptance": "1{n in top-3 of z and z(n) ≥ z_max + log r}",
        "correction": "argmax q",
        "emitted": "p·1_A + (1 − p(A)) δ_argmax",
        "lossless": "no",
    }
    comparison: ClassVar[tuple] = (("", {}, "verifier"),)
    examples: ClassVar[tuple] = ({"top_n": 2, "ratio": 0.8}, {"top_n": 5, "ratio": 0.1})
    frontier: ClassVar[tuple] = tuple({"ratio": r} for r in (0.9, 0.7, 0.5, 0.3, 0.1))
    label_fields: ClassVar[tuple] = ("top_n", "ratio")
    same_law_as: ClassVar[tuple] = ("relaxed-topk",)
    within_support: ClassVar[bool] = False

    def __post_init__(self):
        if self.probs != "logits" or self.delta is not None:
            raise ValueError("relaxed-thinking compares raw logits by a ratio: give top_n and ratio only")
        super().__post_init__()
