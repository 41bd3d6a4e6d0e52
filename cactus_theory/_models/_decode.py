"""Real speculative decoding with Hugging Face causal LMs and any acceptance rule (batch size 1).

Both distributions are processed with the same sampling settings (temperature, top-k, top-p)
before the rule sees them, as in vLLM and the paper; temperature 0 is greedy. The verifier
checks m drafted tokens in one forward pass; after a rejection both KV caches are cropped back
to the accepted prefix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .._laws._block import DRAFT_MODES, greedy_draft
from .._laws._gate import gated_rule, make_gate
from .._laws._policies import draft_features, make_draft_policy
from .._math._logits import RuleLogits
from .._math._sampling import SamplingSettings, processed_probs
from .._math._validation import check_count
from .._rules._protocol import BONUS_POLICIES, Judgement, judgement_of
from .._rules._registry import as_rule
from ._hf import OwnClock, cached_model, drain, generate_steps, paused, sample_token

__all__ = [
    "DecodeResult",
    "NgramDrafter",
    "autoregressive_generate",
    "autoregressive_steps",
    "check_chain_rule",
    "speculative_generate",
    "speculative_steps",
]


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


@dataclass(frozen=True)
class NgramDrafter:
    """Prompt lookup: propose the tokens that followed the latest earlier occurrence of the last
    n-gram (n from ``max_ngram`` down to ``min_ngram``) in the prompt and output so far.
    No draft probabilities: the rule sees a one-hot draft distribution."""

    max_ngram: int = 3
    min_ngram: int = 1

    @property
    def identity(self) -> dict:
        """What a record says of this drafter (``model_identity``'s shape)."""
        return {"name": f"ngram({self.min_ngram}-{self.max_ngram})", "source": "prompt lookup", "files": {}}

    def propose(self, context: list, m: int) -> list:
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) <= n:
                continue
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):
                if context[start : start + n] == tail:
                    follow = context[start + n : start + n + m]
                    if follow:
                        return list(follow)
        return []


def _rule_step(rule, p_row, q_row, token, logits, coin, gen):
    """Accept ``token`` with the rule's probability, else sample its correction: (accepted?, token)."""
    if coin.random() < float(rule.acceptance(p_row, q_row, token, logits=logits)):
        return True, token
    r = np.asarray(rule.correction(p_row, q_row, token, logits=logits), dtype=np.float64)
    import torch

    return False, sample_token(torch.as_tensor(r), gen)


def _emitted_kl(rule, p_row, q_row, token, logits):
    """KL(pi || q) of the law ``rule`` emits a position from, over the draft there (one-hot on
    ``token`` for a drafter without probabilities), exact (``emitted_distribution``)."""
    from .._laws._emitted import step_metrics

    if p_row is None:
        p_row = np.zeros(q_row.shape[-1])
        p_row[token] = 1.0
    # the models' rows are float32 probabilities: renormalised in float64, so that a lossless rule gives 0
    p_row = np.asarray(p_row, dtype=np.float64) / np.sum(p_row, dtype=np.float64)
    q_row = np.asarray(q_row, dtype=np.float64) / np.sum(q_row, dtype=np.float64)
    return float(step_metrics(rule, p_row, q_row, logits=logits).kl_emitted_target)


def _block_step(rule, drafted, draft_rows, q_rows, q_raw, draft_raw, sampling, coin, gen):
    """A block rule's verification of ``drafted``: (accepted drafts, tokens emitted: the accepted
    drafts and then the correction, or the bonus when all were accepted)."""
    import torch

    m = len(drafted)
    p = np.stack(draft_rows) if draft_rows else None  # an n-gram drafter has none: one-hot
    logits = None
    if rule.needs_logits:
        draft_part = np.concatenate([np.stack(draft_raw), np.zeros((1, q_raw.shape[-1]))]) if draft_raw else None
        logits = RuleLogits(target=q_raw[: m + 1], draft=draft_part, temperature=sampling.temperature)
    law = rule.block_law(p, q_rows[: m + 1], np.asarray(drafted), logits=logits)
    tau = int(min(np.searchsorted(np.cumsum(law.accepted), coin.random() * law.accepted.sum(), side="right"), m))
    token = sample_token(torch.as_tensor(law.emitted[tau]), gen)
    return tau, [*drafted[:tau], token]


#: Why a multi-draft rule is refused here.
CHAINS_ONLY = (
    "{rule} verifies a tree of k = {k} drafts per position, and real decoding here runs chains (one draft per "
    "position; tree attention is not implemented): decode with its one-draft form, or predict the tree from a "
    "trace (analyze / plan)"
)


def check_chain_rule(rule):
    """Refuse a multi-draft rule: decoding here drafts chains (one draft per position)."""
    if not judgement_of(rule).chain:
        raise ValueError(CHAINS_ONLY.format(rule=rule.describe(), k=rule.draft_count))


def autoregressive_steps(model, prompt_ids, sampling=None, max_new_tokens=128, seed=0, eos_ids=()):
    """``autoregressive_generate`` as a generator of steps (one per token; ``interleave`` runs
    several in alternation); its value is the ``DecodeResult``, timed by the run's own clock."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    tokens, _, seconds, timing = yield from generate_steps(
        model, prompt_ids, sampling or SamplingSettings(), max_new_tokens, gen, set(eos_ids)
    )
    return DecodeResult(
        tokens=tokens,
        verify_seconds=seconds,
        total_seconds=seconds,
        prefill_seconds=timing["prefill"],
        token_seconds=timing["token_seconds"],
    )


def autoregressive_generate(model, prompt_ids, sampling=None, max_new_tokens=128, seed=0, eos_ids=()):
    """The verifier alone: the baseline for accuracy and wall time (the same sampling loop as the dumper)."""
    return drain(autoregressive_steps(model, prompt_ids, sampling, max_new_tokens, seed, eos_ids))


def speculative_generate(
    verifier,
    draft,
    rule,
    m,
    sampling=None,
    max_new_tokens=128,
    seed=0,
    prompt_ids=(),
    eos_ids=(),
    *,
    bonus_policy="verifier",
    draft_mode="sampled",
    draft_policy=None,
    gate=None,
    drift=False,
):
    """Speculative decoding of ``prompt_ids`` with ``rule``; ``draft`` is a causal LM or an ``NgramDrafter``.

    Per step: draft m tokens (sampling from the processed draft distribution p), verify them in
    one forward pass of the verifier (processed q), accept in order with the rule's acceptance
    probability (the draft at slot j judged by ``rule.at_slot(j)``), sample the rule's
    correction token after the first rejection, or a bonus token when all m are accepted: from
    q (``bonus_policy="verifier"``) or, under ``"relaxed"``, by one more step of the rule with
    the drafter's distribution at the bonus position (one extra draft forward pass; needs a
    draft model). Rules that need raw logits get both models' full rows. A block rule
    (``block``) judges the m drafts at once: the number accepted and the token after them are
    drawn from its ``block_law`` (the verifier's bonus policy only). ``draft_mode="greedy"``
    drafts argmax p, and the rule sees p one-hot (an MTP head or EAGLE drafter). Multi-draft
    rules (trees) are refused: decoding here drafts chains. ``draft_policy`` (``"p-min(0.4)"``,
    ``"entropy(1)"``, ``"accept-prob(0.3)"``) stops a block early when the drafter is unsure, as
    ``policy_blocks`` models it (the stop reads p at one more place: one more draft forward).
    ``gate`` (``RegionGate``, ``FunctionGate``, a callable or "OPEN:CLOSE"): gated relaxation, a
    relaxed token rule judges a draft only where the gate is open after the tokens generated
    before it (the output so far and the drafts before it in the block), the gate's lossless
    fallback (SpS) elsewhere. ``drift=True`` records, per emitted token, KL(pi_t || q_t): pi_t the
    exact law the rule emits that position from (``emitted_distribution`` of the rule that judged
    it, over the draft there; q at a verifier bonus), q_t the verifier's processed row there; their
    sum along the output (``DecodeResult.answer_kl``) is an unbiased estimate of E[sum_t KL(pi_t ||
    q_t)], which bounds the KL of the whole answer's law from the verifier's from above (the chain
    rule over the tokens and the block's hidden accept decisions, then the data processing
    inequality; equal to 0 for a lossless rule). Token rules only (a block rule's law at a slot
    depends on drafts not yet drawn).
    Returns a ``DecodeResult`` with timings (the prefill apart, and when each token was out). ``speculative_steps`` is
    the same run as a generator of steps.
    """
    options = {
        "bonus_policy": bonus_policy,
        "draft_mode": draft_mode,
        "draft_policy": draft_policy,
        "gate": gate,
        "drift": drift,
    }
    return drain(
        speculative_steps(verifier, draft, rule, m, sampling, max_new_tokens, seed, prompt_ids, eos_ids, **options)
    )


def speculative_steps(
    verifier,
    draft,
    rule,
    m,
    sampling=None,
    max_new_tokens=128,
    seed=0,
    prompt_ids=(),
    eos_ids=(),
    *,
    bonus_policy="verifier",
    draft_mode="sampled",
    draft_policy=None,
    gate=None,
    drift=False,
):
    """``speculative_generate`` as a generator that yields after the prefill and after each
    verification step, so several runs (the verifier alone among them) can alternate on one
    machine (``interleave``); its value is the ``DecodeResult``, timed by the run's own clock
    (``OwnClock``: the chunks of the other runs are not counted)."""
    import torch

    o = _options(rule, m, sampling, draft, bonus_policy, draft_mode, draft_policy, gate, drift)
    gen = torch.Generator().manual_seed(seed)
    coin = np.random.default_rng(seed)
    ver = cached_model(verifier)
    ngram = isinstance(draft, NgramDrafter)
    drf = None if ngram else cached_model(draft)
    context = list(prompt_ids)
    result = DecodeResult(tokens=[], token_kl=[] if drift else None)
    clock = OwnClock()
    # verifier and draft caches hold every context token but the last; the last is fed each step
    if len(context) < 1:
        raise ValueError("prompt_ids must hold at least one token")
    if len(context) > 1:
        ver.feed(context[:-1], want="last")
        if drf is not None:
            drf.feed(context[:-1], want="last")
    result.prefill_seconds = clock.elapsed()
    yield from paused(clock)

    def draft_after(token):
        """The drafter's next token after ``token``: (token, processed row, raw row or None, features)."""
        return _draft_row(drf.feed([token])[-1], o, gen)

    while len(result.tokens) < max_new_tokens:
        budget = min(m, max_new_tokens - len(result.tokens))
        t0 = time.perf_counter()
        drafted, draft_rows, draft_raw = [], [], []
        if ngram:
            drafted = draft.propose(context, budget)
        else:
            token, confidence = context[-1], 1.0
            for _ in range(budget):
                token, p_row, p_raw, features = draft_after(token)
                if o.policy is not None:
                    if o.policy.stop(features[0], features[1], confidence):
                        break  # the drafter is unsure here: verify what is drafted
                    confidence *= features[0]
                drafted.append(token)
                draft_rows.append(p_row)
                if o.need_logits:
                    draft_raw.append(p_raw)
        t1 = time.perf_counter()
        q_raw = ver.feed([context[-1], *drafted])
        t2 = time.perf_counter()
        n_acc, emitted, kls = _judge(
            o, result.tokens, drafted, draft_rows, draft_raw, q_raw, coin, gen, eos_ids, draft_after
        )
        t3 = time.perf_counter()
        result.drafted.append(len(drafted))
        result.accepted.append(n_acc)
        result.draft_seconds += t1 - t0
        result.verify_seconds += (t2 - t1) + (t3 - t2)
        # Caches keep the old context and the accepted drafts; the last emitted token is fed
        # next step. The draft cache lacks d_m when all m drafts were accepted: feed it.
        keep = len(context) + n_acc
        ver.crop(keep)
        if drf is not None:
            if drf.length < keep:
                drf.feed(drafted[drf.length - len(context) : n_acc], want="last")
            drf.crop(keep)
        if _extend(result, context, emitted, kls, max_new_tokens, clock, eos_ids):
            break
        yield from paused(clock)
    result.total_seconds = clock.elapsed()
    return result


@dataclass
class _Options:
    """What every step of a speculative run reads: the checked rule and settings."""

    rule: object
    sampling: SamplingSettings
    bonus_policy: str
    draft_mode: str
    policy: object
    gate: object
    fallback: object
    judgement: Judgement
    need_logits: bool
    drift: bool

    @property
    def block_level(self) -> bool:
        """The whole drafted block judged at once (``_block_step``)."""
        return self.judgement.block


def _options(rule, m, sampling, draft, bonus_policy, draft_mode, draft_policy, gate, drift) -> _Options:
    """The checks of ``speculative_steps`` (and ``speculative_batch_steps``): ValueErrors naming
    the argument, before anything runs."""
    rule = as_rule(rule)
    sampling = sampling or SamplingSettings()
    check_count(m, "m", what="drafted tokens per verification")
    if bonus_policy not in BONUS_POLICIES:
        raise ValueError(f"bonus_policy must be one of {BONUS_POLICIES}; got {bonus_policy!r}")
    if draft_mode not in DRAFT_MODES:
        raise ValueError(f"draft_mode must be one of {DRAFT_MODES}; got {draft_mode!r}")
    judgement = judgement_of(rule)  # what the rule judges, asked once: every step reads it from the options
    if not judgement.chain:
        raise ValueError(CHAINS_ONLY.format(rule=rule.describe(), k=rule.draft_count))
    gate = make_gate(gate)
    fallback = gated_rule(gate, rule)  # None: not gated (no gate, or a lossless rule)
    policy = make_draft_policy(draft_policy)
    if policy is not None and policy.kind == "llama.cpp":
        raise ValueError(
            f"draft policy {policy.describe()} is llama-server's own drafting: the planner models it and "
            "experiments/referee_llama_server.py runs it in llama-server; decode here with p-min(...)"
        )
    if policy is not None and (policy.needs_cost or isinstance(draft, NgramDrafter)):
        raise ValueError(
            f"draft policy {policy.describe()} "
            + (
                "needs a cost model: it is for the planner; decode with p-min, entropy or accept-prob"
                if policy.needs_cost
                else "reads the drafter's probabilities; the n-gram drafter has none"
            )
        )
    if drift and not judgement.token_drift:
        raise ValueError(
            f"drift=True records the law of each emitted token: {rule.describe()} judges whole blocks, "
            "whose law at a slot depends on drafts not yet drawn; record it for a token rule"
        )
    if judgement.block and bonus_policy != "verifier":
        raise ValueError(
            f"{rule.describe()} judges whole blocks: its bonus token is the verifier's (bonus_policy='verifier')"
        )
    if isinstance(draft, NgramDrafter) and (bonus_policy == "relaxed" or "draft" in rule.needs_logits):
        raise ValueError(
            f"{rule.describe()} with bonus_policy={bonus_policy!r} needs a draft model with probabilities and "
            "logits; the n-gram drafter has none"
        )
    return _Options(
        rule,
        sampling,
        bonus_policy,
        draft_mode,
        policy,
        gate,
        fallback,
        judgement,
        bool(rule.needs_logits),
        bool(drift),
    )


def _draft_row(raw, o, gen):
    """The drafter's token from its raw logit row: (token, processed row p as float64 NumPy (one-hot
    under greedy drafting), the raw row as NumPy when the rule reads logits, (top-1 p, entropy)
    when a drafting policy reads them)."""
    import torch

    p = processed_probs(raw[None], o.sampling)[0]
    p_row = p.double().cpu().numpy()
    features = None
    if o.policy is not None:
        top1, entropy = draft_features(p_row[None])
        features = (float(top1[0]), float(entropy[0]))
    if o.draft_mode == "greedy":  # the rule sees the drafter's one-hot
        drafted = int(torch.argmax(p))
        p_row = greedy_draft(p_row)
    else:
        drafted = sample_token(p, gen)
    return drafted, p_row, raw.double().cpu().numpy() if o.need_logits else None, features


def _judge(o, output, drafted, draft_rows, draft_raw, q_raw, coin, gen, eos_ids, draft_after):
    """One verification of ``drafted`` against the verifier's raw rows ``q_raw`` (m + 1 of them,
    torch) after ``output``: (accepted drafts, tokens emitted: the accepted drafts and then the
    correction, or the bonus when all were accepted, per emitted token its KL under drift).
    ``draft_after(token)``: one more draft forward (the relaxed bonus)."""
    import torch

    rule, sampling = o.rule, o.sampling
    q_rows = processed_probs(q_raw, sampling).double().cpu().numpy()
    q_raw = q_raw.double().cpu().numpy() if o.need_logits else None
    kls = []

    def step(slot, p_row, token, p_raw):
        """The rule at slot ``slot``: (accepted?, the token emitted)."""
        judge, logits = rule.at_slot(slot), None
        if o.fallback is not None and not o.gate.inside_after([*output, *drafted[:slot]]):
            judge = o.fallback  # the gate is closed
        elif o.need_logits:
            logits = RuleLogits(target=q_raw[slot], draft=p_raw, temperature=sampling.temperature)
        if o.drift:
            kls.append(_emitted_kl(judge, p_row, q_rows[slot], token, logits))
        return _rule_step(judge, p_row, q_rows[slot], token, logits, coin, gen)

    if o.block_level and drafted:  # the whole block judged at once
        n_acc, emitted = _block_step(rule, drafted, draft_rows, q_rows, q_raw, draft_raw, sampling, coin, gen)
        end = next((i for i, t in enumerate(emitted[:n_acc]) if t in eos_ids), None)
        if end is not None:  # an accepted end token ends the output there
            n_acc, emitted = end + 1, emitted[: end + 1]
        return n_acc, emitted, kls
    n_acc, emitted = 0, []
    for j, token in enumerate(drafted):
        ok, out = step(j, draft_rows[j] if draft_rows else None, token, draft_raw[j] if draft_raw else None)
        emitted.append(out)
        if not ok:
            break
        n_acc += 1
        if token in eos_ids:
            break
    else:
        if o.bonus_policy == "verifier" or not drafted:
            emitted.append(sample_token(torch.as_tensor(q_rows[len(drafted)]), gen))  # bonus from q
            kls.append(0.0)
        else:  # relaxed: the drafter drafts at the bonus position, the rule judges once more
            token, p_row, p_raw, _ = draft_after(drafted[-1])
            emitted.append(step(len(drafted), p_row, token, p_raw)[1])
    return n_acc, emitted, kls


def _extend(result, context, emitted, kls, max_new_tokens, clock, eos_ids) -> bool:
    """Append a step's emitted tokens (cut at ``max_new_tokens``) to ``result`` and ``context``,
    with their time; True when the output has ended (an end-of-sequence token)."""
    emitted = emitted[: max_new_tokens - len(result.tokens)]
    if result.token_kl is not None:
        result.token_kl.extend(kls[: len(emitted)])
    context.extend(emitted)
    result.tokens.extend(emitted)
    result.token_seconds.extend([clock.elapsed() - result.prefill_seconds] * len(emitted))
    return any(t in eos_ids for t in emitted)
