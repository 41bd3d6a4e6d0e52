"""What a decoding run is, whichever decoder runs it: every setting in one frozen record, built and checked once
(``DecodeSpec``: the rule, or none for the verifier alone, how many drafts a step, the sampling, the length, the
seed, the bonus policy, the draft mode, the drafting policy, the gate, the drift record, the batch), the one
interface every decoder implements (``Decoder``: the host loop's ``HostChain`` and ``HostBatch``, the device
loop's ``OnDevice``; ``_decoding.decoder_for`` picks one), and what a run gives back for one prompt
(``DecodeResult``). Every decoder reads the rule's kind from the spec's ``judgement`` (``judgement_of``, asked
once here) and nothing else re-checks what the spec holds."""

from __future__ import annotations

import abc
import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from .._laws._block import DRAFT_MODES
from .._laws._gate import gated_rule, make_gate
from .._laws._policies import make_draft_policy
from .._math._sampling import SamplingSettings
from .._math._validation import SettingError, check_count
from .._rules._protocol import BONUS_POLICIES, Judgement, judgement_of
from .._rules._registry import as_rule
from .._util._results import Result
from ._clock import drain
from ._drafters import NgramDrafter

__all__ = ["CHAINS_ONLY", "DecodeResult", "DecodeSpec", "Decoder", "check_chain_rule", "device_only_refusal"]

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


def device_only_refusal(spec) -> SettingError:
    """The refusal of ``spec``'s device-only options (the static cache, CUDA graphs, the fused rule) where the
    device decoder cannot run it: for its rule or options (``DecodeSpec``) or for its models (the chooser)."""
    return SettingError(
        "static_cache" if spec.static_cache else "fuse_rule",
        "the static cache, CUDA graphs and the fused rule run in the Hugging Face engine's device decoder, which "
        "takes the verifier alone or a token rule with the verifier's bonus and no gate, drafting policy, drift "
        "record or raw logits: drop them, or those options",
        given="static_cache / cuda_graphs / fuse_rule",
    )


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
            raise SettingError(
                "drift",
                f"the law of each emitted token is recorded for token rules only: {rule.describe()} judges whole "
                "blocks, whose law at a slot depends on drafts not yet drawn",
                given="drift=True",
            )
        device_only = self.static_cache or self.fuse_rule
        simple = judgement.per_token and self.bonus_policy == "verifier" and not self.need_logits
        if device_only and not (simple and self.gate is None and self.draft_policy is None and not self.drift):
            raise device_only_refusal(self)
        if judgement.block and self.bonus_policy != "verifier":
            raise SettingError(
                "bonus_policy",
                f"{rule.describe()} judges whole blocks: its bonus token is the verifier's ('verifier')",
                given=f"bonus_policy={self.bonus_policy!r}",
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
            raise SettingError(
                "bonus_policy" if self.bonus_policy == "relaxed" else "draft",
                f"{self.rule.describe()} needs a draft model with probabilities and logits here; the n-gram drafter "
                "has none",
                given=f"bonus_policy={self.bonus_policy!r}",
            )


class Decoder(abc.ABC):
    """Decodes prompts under one ``spec`` with ``verifier`` (a model) and ``draft`` (a model, an
    ``NgramDrafter``, or None for the verifier alone). Each prompt is decoded with its own seed (the
    generators of its draws), so its tokens do not depend on the prompts beside it."""

    def __init__(self, spec, verifier, draft=None):
        if spec.rule is not None:
            if draft is None:
                raise ValueError(f"{spec.label} needs a drafter: give a draft model or an NgramDrafter")
            spec.check_drafter(draft)
        self.spec, self.verifier, self.draft = spec, verifier, draft

    def steps(self, prompts_ids, seeds, eos_ids=()):
        """A generator of steps whose value is one ``DecodeResult`` per prompt of ``prompts_ids`` (lists of
        token ids, each decoded with its seed of ``seeds``)."""
        prompts_ids, seeds = [list(x) for x in prompts_ids], list(seeds)
        if not prompts_ids or len(prompts_ids) != len(seeds):
            raise ValueError(
                f"give one seed per prompt, and at least one prompt; got {len(prompts_ids)} prompt(s) and "
                f"{len(seeds)} seed(s)"
            )
        if any(len(ids) < 1 for ids in prompts_ids):
            raise ValueError("every prompt's ids must hold at least one token")
        return (yield from self._run(prompts_ids, seeds, set(eos_ids)))

    @abc.abstractmethod
    def _run(self, prompts_ids, seeds, eos_ids):
        """``steps`` once its arguments are checked."""

    def generate(self, prompts_ids, seeds, eos_ids=()) -> list:
        """``steps`` run to its end: one ``DecodeResult`` per prompt."""
        return drain(self.steps(prompts_ids, seeds, eos_ids))


@dataclass
class DecodeResult(Result):
    """Tokens emitted, and per verification step the drafted and accepted counts; a result as every other
    (``records``: one row per verification step; ``table``)."""

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

    name = "decode"

    def records(self) -> list:
        """One row per verification step: drafts judged and accepted."""
        return [
            {"step": i, "drafted": int(d), "accepted": int(a)}
            for i, (d, a) in enumerate(zip(self.drafted, self.accepted, strict=True))
        ]

    def table(self) -> str:
        line = (
            f"{len(self.tokens)} tokens, {len(self.accepted)} verifications, AL {self.accepted_length:.2f} "
            f"(vLLM's mean acceptance length {self.mean_acceptance_length:.2f}), {self.tokens_per_second:.2f} tok/s "
            f"(prefill {self.prefill_seconds:.2f} s, draft {self.draft_seconds:.2f} s, "
            f"verify {self.verify_seconds:.2f} s)"
        )
        if self.token_kl is not None:
            line += f", answer KL {self.answer_kl:.4f}"
        return line
