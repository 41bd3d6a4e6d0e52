"""The chain verifications serving engines run under their own names: SGLang's rejection sampling
of a sampled chain, and TLI for a drafter of another vocabulary. (vLLM's verification of a drafter
that passes no probabilities is ``strict``.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .sps import SpS

__all__ = ["SGLangChain", "TokenLevelIntersection"]


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
class TokenLevelIntersection(SpS):
    """TLI, speculative decoding with a drafter of another vocabulary (Timor et al., ICML 2025):
    the drafter drafts from its distribution restricted to the tokens both vocabularies share,
    renormalised (``VocabularyMap.project``, which also maps its ids to the verifier's), and the
    verifier runs standard speculative sampling on that law. Give it the projected rows as
    ``draft_probs``: on them its law is SpS's, so it is **lossless** with acceptance
    sum_x min(p'(x), q(x)) (exact); what the heterogeneous drafter loses is in p', which puts no
    mass on tokens the drafter lacks and more on the shared ones. vLLM ``use_heterogeneous_vocab``
    (token-level intersection at start-up; greedy draft sampling only there: ``strict``
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
        "sps",
        "sglang-chain",
        "block",
        "traversal",
        "hsd",
        "fly",
        "magic-mtp",
        "entropy-verify",
    )
