"""Every setting of a decoding run in one frozen record, built and checked once (``DecodeSpec``): the rule (or
none: the verifier alone), how many drafts a step, the sampling, the length, the seed, the bonus policy, the
draft mode, the drafting policy, the gate, the drift record, the batch. Every decoder (``_decoders``) reads
the rule's kind from the spec's ``judgement`` (``judgement_of``, asked once here) and nothing else re-checks
what the spec holds."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .._laws._block import DRAFT_MODES
from .._laws._gate import gated_rule, make_gate
from .._laws._policies import make_draft_policy
from .._math._sampling import SamplingSettings
from .._math._validation import check_count
from .._rules._protocol import BONUS_POLICIES, Judgement, judgement_of
from .._rules._registry import as_rule
from ._drafters import NgramDrafter

__all__ = ["CHAINS_ONLY", "DecodeSpec", "check_chain_rule"]

#: Why a multi-draft rule is refused here.
CHAINS_ONLY = (
    "{rule} verifies a tree of k = {k} drafts per position, and real decoding here runs chains (one draft per "
    "position; tree attention is not implemented): decode with its one-draft form, or predict the tree from a "
    "trace (analyze / plan)"
)


def check_chain_rule(rule):
    """Refuse a multi-draft rule: decoding here drafts chains (one draft per position). Returns the rule."""
    rule = as_rule(rule)
    if not judgement_of(rule).chain:
        raise ValueError(CHAINS_ONLY.format(rule=rule.describe(), k=rule.draft_count))
    return rule


@dataclass(frozen=True)
class DecodeSpec:
    """The settings of one decoding run, checked when built (each a ValueError naming it).

    ``rule``: a rule or its spec string, or None for the verifier decoding alone; ``m`` drafts per
    verification; ``settings`` the sampling (``SamplingSettings``; default: the paper's); ``max_new_tokens``;
    ``seed`` the run's seed (each prompt's comes from it: ``prompt_seed``); ``bonus_policy`` ("verifier":
    the bonus token from q; "relaxed": the rule judges one more draft); ``draft_mode`` ("sampled", "greedy":
    the rule sees the drafter's one-hot); ``draft_policy`` (a spec such as "p-min(0.4)": stop a block when
    the drafter is unsure); ``gate`` (a ``RegionGate``, a callable or "OPEN:CLOSE": relaxed only where open);
    ``drift`` (record each emitted token's KL against the verifier); ``batch`` prompts decoded at once;
    ``baseline`` (the verifier alone beside each prompt, for the speedup) and ``chunk_seconds`` (compute a
    run gets before the next takes the machine) for many prompts (``decode_prompts``); ``static_cache`` (the
    device decoder's KV cache preallocated at its full length and every forward over every request's slot, so
    a step has one shape per block size) and ``cuda_graphs`` (that, with each shape's forward captured once
    as a CUDA graph and replayed: the host launches one graph a forward; a CUDA device only). Both emit the
    eager path's tokens (its arithmetic up to the rounding of other shapes); ``fuse_rule`` (the device
    decoder judges with the rule's torch path compiled: ``FusedRule``, equal to the eager path within the
    rule's tolerance).

    Derived once: ``judgement`` (what the rule judges: ``judgement_of``), ``fallback`` (the lossless rule
    where the gate is closed, or None), ``need_logits`` (the rule reads raw logits), and the policy's and
    gate's objects. ``with_rule(rule)`` is the same settings for another rule; ``check_drafter(draft)`` what
    a drafter without probabilities cannot do."""

    rule: object = None
    m: int = 8
    settings: SamplingSettings | None = None
    max_new_tokens: int = 128
    seed: int = 0
    bonus_policy: str = "verifier"
    draft_mode: str = "sampled"
    draft_policy: object = None
    gate: object = None
    drift: bool = False
    batch: int = 1
    baseline: bool = False
    chunk_seconds: float | None = None
    static_cache: bool = False
    cuda_graphs: bool = False
    fuse_rule: bool = False
    judgement: Judgement | None = field(default=None, init=False, compare=False, repr=False)
    fallback: object = field(default=None, init=False, compare=False, repr=False)
    need_logits: bool = field(default=False, init=False, compare=False, repr=False)

    def __post_init__(self):
        put = object.__setattr__
        put(self, "settings", self.settings or SamplingSettings())
        if not isinstance(self.settings, SamplingSettings):
            raise ValueError(f"settings must be SamplingSettings; got {type(self.settings).__name__}")
        check_count(self.m, "m", what="drafted tokens per verification")
        check_count(self.max_new_tokens, "max_new_tokens")
        check_count(self.batch, "batch", what="prompts decoded at once")
        from .._data._prompts import prompt_seed

        prompt_seed(self.seed, "")  # the seed checked as every prompt's is derived from it
        for name in ("drift", "baseline", "static_cache", "cuda_graphs", "fuse_rule"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False; got {getattr(self, name)!r}")
        if self.chunk_seconds is not None:
            bad = isinstance(self.chunk_seconds, bool) or not isinstance(self.chunk_seconds, (int, float))
            if bad or not (math.isfinite(self.chunk_seconds) and self.chunk_seconds >= 0):
                raise ValueError(f"chunk_seconds must be a finite number of seconds >= 0; got {self.chunk_seconds!r}")
        if self.bonus_policy not in BONUS_POLICIES:
            raise ValueError(f"bonus_policy must be one of {BONUS_POLICIES}; got {self.bonus_policy!r}")
        if self.draft_mode not in DRAFT_MODES:
            raise ValueError(f"draft_mode must be one of {DRAFT_MODES}; got {self.draft_mode!r}")
        policy = make_draft_policy(self.draft_policy)
        if policy is not None and policy.kind == "llama.cpp":
            raise ValueError(
                f"draft policy {policy.describe()} is llama-server's own drafting: the planner models it and "
                "experiments/referee_llama_server.py runs it in llama-server; decode here with p-min(...)"
            )
        if policy is not None and policy.needs_cost:
            raise ValueError(
                f"draft policy {policy.describe()} needs a cost model: it is for the planner; decode with p-min, "
                "entropy or accept-prob"
            )
        if self.cuda_graphs:
            put(self, "static_cache", True)  # a captured forward has one shape
        put(self, "draft_policy", policy)
        put(self, "gate", make_gate(self.gate))
        if self.rule is None:
            return
        rule = check_chain_rule(self.rule)
        put(self, "rule", rule)
        judgement = judgement_of(rule)  # what the rule judges, asked once: every decoder reads it from here
        put(self, "judgement", judgement)
        put(self, "fallback", gated_rule(self.gate, rule))  # None: not gated (no gate, or a lossless rule)
        put(self, "need_logits", bool(rule.needs_logits))
        if self.drift and not judgement.token_drift:
            raise ValueError(
                f"drift=True records the law of each emitted token: {rule.describe()} judges whole blocks, "
                "whose law at a slot depends on drafts not yet drawn; record it for a token rule"
            )
        if judgement.block and self.bonus_policy != "verifier":
            raise ValueError(
                f"{rule.describe()} judges whole blocks: its bonus token is the verifier's (bonus_policy='verifier')"
            )

    @property
    def label(self) -> str:
        """The rule's description, or "verifier alone"."""
        return self.rule.describe() if self.rule is not None else "verifier alone"

    @property
    def policy_label(self):
        return None if self.draft_policy is None else self.draft_policy.describe()

    @property
    def gate_label(self):
        return None if self.gate is None else self.gate.describe()

    @property
    def block_level(self) -> bool:
        """The whole drafted block judged at once."""
        return self.judgement is not None and self.judgement.block

    def with_rule(self, rule) -> DecodeSpec:
        """These settings for ``rule`` (None: the verifier alone), checked again for it."""
        return dataclasses.replace(self, rule=rule, draft_policy=self.draft_policy, gate=self.gate)

    def check_drafter(self, draft) -> None:
        """Refuse what the n-gram drafter cannot do under this spec (it has no probabilities nor logits)."""
        if not isinstance(draft, NgramDrafter) or self.rule is None:
            return
        if self.draft_policy is not None:
            raise ValueError(
                f"draft policy {self.policy_label} reads the drafter's probabilities; the n-gram drafter has none"
            )
        if self.bonus_policy == "relaxed" or "draft" in self.rule.needs_logits:
            raise ValueError(
                f"{self.rule.describe()} with bonus_policy={self.bonus_policy!r} needs a draft model with "
                "probabilities and logits; the n-gram drafter has none"
            )
