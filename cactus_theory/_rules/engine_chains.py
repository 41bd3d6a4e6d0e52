"""The chain verifications serving engines run under their own names: SGLang's rejection sampling
of a sampled chain, and vLLM's verification of a drafter that passes no probabilities (greedy
drafts)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._protocol import Rule
from .sps import SpS

__all__ = ["SGLangChain", "TokenLevelIntersection", "VLLMGreedy"]


@dataclass(frozen=True)
class SGLangChain(SpS):
    """SGLang's chain rejection sampling (``--speculative-use-rejection-sampling``, EAGLE / EAGLE3
    with top-k 1): the draft is sampled from the drafter's processed distribution and the kernel
    accepts it iff u p(n) < q(n), u ~ U(0, 1); after a rejection it samples norm((q - p)+), or q
    where that has no mass; after the whole chain, q. The law is SpS's exactly (P(u p(n) < q(n)) =
    min(1, q(n)/p(n)); p(n) = 0 accepts iff q(n) > 0): **lossless**. Registered under the engine's
    name so that a comparison can say which engine runs which law. sgl-project/sglang,
    ``speculative_sampling_classic_kernel`` (``chain_speculative_sampling_triton``).
    """

    name: ClassVar[str] = "sglang-chain"
    reference: ClassVar[str] = (
        "sgl-project/sglang, reject_sampling.py (chain_speculative_sampling_triton, "
        "--speculative-use-rejection-sampling)"
    )
    table: ClassVar[dict] = {
        "acceptance": "u·p(n) < q(n): min(1, q(n)/p(n))",
        "correction": "norm((q − p)+), q if empty",
        "emitted": "q",
        "lossless": "yes",
    }
    comparison: ClassVar[tuple] = ()
    same_law_as: ClassVar[tuple] = ("sps", "block", "traversal", "hsd", "fly", "magic-mtp", "entropy-verify")


@dataclass(frozen=True)
class VLLMGreedy(Rule):
    """vLLM's verification when the drafter passes no probabilities (``draft_probs=None``: n-gram,
    EAGLE / MTP with greedy draft sampling, heterogeneous vocabularies): the drafted token n is
    taken as one-hot, accepted with probability q(n) (the kernel's u <= q(n) / 1), and after a
    rejection a token is sampled from q with n removed (renormalised). Whatever the drafter's real
    law p, the emitted law is p(y) q(y) + q(y) (1 - p(y)) = q(y): **lossless**, with acceptance
    sum_n p(n) q(n) (for a greedy drafter, q(argmax p)); SpS on the one-hot row is the same rule.
    vllm-project/vllm ``v1/sample/rejection_sampler.py`` (``NO_DRAFT_PROBS``;
    ``sample_recovered_tokens_kernel``).
    """

    lossless: ClassVar[bool] = True
    name: ClassVar[str] = "vllm-greedy"
    reference: ClassVar[str] = (
        "vllm-project/vllm, v1/sample/rejection_sampler.py (rejection_random_sample_kernel and "
        "sample_recovered_tokens_kernel with NO_DRAFT_PROBS)"
    )
    table: ClassVar[dict] = {
        "acceptance": "q(n) (p taken one-hot)",
        "correction": "q without n",
        "emitted": "q",
        "lossless": "yes",
    }
    #: not in the every-rule grid (its acceptance there is sum p q): ``experiments/sequence_rules.py`` runs it
    comparison: ClassVar[tuple] = ()
    same_law_as: ClassVar[tuple] = ("eagle-tree", "sglang-tree", "strict")

    def _acceptance(self, b, p, q, n, lg):
        return b.take_last(q, n) + 0.0 * b.take_last(p, n)

    def _correction(self, b, p, q, n, lg):
        rest = b.put_last(q, n, 0.0)
        z = b.sum_last(rest, keepdims=True)
        return b.where(z > 0, rest / b.where(z > 0, z, 1.0), q)

    def _acceptance_all(self, p, q, lg):
        return np.array(q, dtype=np.float64)

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """q: lossless for any draft law (exact)."""
        _, q, _ = self._host(draft_probs, target_probs, logits)
        return np.array(q)


@dataclass(frozen=True)
class TokenLevelIntersection(SpS):
    """TLI, speculative decoding with a drafter of another vocabulary (Timor et al., ICML 2025):
    the drafter drafts from its distribution restricted to the tokens both vocabularies share,
    renormalised (``VocabularyMap.project``, which also maps its ids to the verifier's), and the
    verifier runs standard speculative sampling on that law. Give it the projected rows as
    ``draft_probs``: on them its law is SpS's, so it is **lossless** with acceptance
    sum_x min(p'(x), q(x)) (exact); what the heterogeneous drafter loses is in p', which puts no
    mass on tokens the drafter lacks and more on the shared ones. vLLM ``use_heterogeneous_vocab``
    (token-level intersection at start-up; greedy draft sampling only there: ``vllm-greedy``
    on p').
    """

    name: ClassVar[str] = "tli"
    reference: ClassVar[str] = (
        'Timor et al., "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for Heterogeneous '
        'Vocabularies", ICML 2025 (TLI); vLLM use_heterogeneous_vocab'
    )
    table: ClassVar[dict] = {
        "acceptance": "min(1, q(n)/p'(n)), p' = p on the shared tokens, renormalised",
        "correction": "norm((q − p')+)",
        "emitted": "q",
        "lossless": "yes",
    }
    comparison: ClassVar[tuple] = ()
    same_law_as: ClassVar[tuple] = (
        "sps", "sglang-chain", "block", "traversal", "hsd", "fly", "magic-mtp", "entropy-verify",
    )  # fmt: skip
