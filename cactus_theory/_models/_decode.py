"""Real speculative decoding with Hugging Face causal LMs and any acceptance rule (batch size 1).

Both distributions are processed with the same sampling settings (temperature, top-k, top-p)
before the rule sees them, as in vLLM and the paper; temperature 0 is greedy. The verifier
checks m drafted tokens in one forward pass; after a rejection both KV caches are cropped back
to the accepted prefix.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import numpy as np

from .._laws._block import DRAFT_MODES, greedy_draft
from .._laws._gate import gated_rule, make_gate
from .._laws._policies import draft_features, make_draft_policy
from .._math._bootstrap import percentile_interval, ratio_interval, resample_counts, resampled_sums
from .._math._logits import RuleLogits
from .._math._sampling import SamplingSettings, processed_probs
from .._rules._protocol import BONUS_POLICIES, as_rule, kind_of
from .._util._files import json_lines
from ._hf import OwnClock, cached_model, drain, generate_steps, paused, sample_token

__all__ = [
    "DecodeResult",
    "NgramDrafter",
    "answer_drift",
    "autoregressive_batch_steps",
    "autoregressive_generate",
    "autoregressive_generate_batch",
    "autoregressive_steps",
    "batch_throughput",
    "decode_prompts",
    "decoding_flags",
    "decoding_summary",
    "interleave",
    "matched_times",
    "speculative_batch_steps",
    "speculative_generate",
    "speculative_generate_batch",
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


def check_chain_rule(rule):
    """Refuse a multi-draft rule: decoding here drafts chains (one draft per position)."""
    if kind_of(rule) == "multi-draft":
        raise ValueError(
            f"{rule.describe()} verifies a tree of k = {rule.draft_count} drafts per position, and real decoding here "
            "runs chains (one draft per position; tree attention is not implemented): decode with its one-draft "
            "form, or predict the tree from a trace (analyze / plan)"
        )


def autoregressive_steps(model, prompt_ids, sampling=None, max_new_tokens=128, seed=0, eos_ids=()):
    """``autoregressive_generate`` as a generator of steps (one per token; ``interleave`` runs
    several in alternation); its value is the ``DecodeResult``, timed by the run's own clock."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    tokens, _, seconds, timing = yield from generate_steps(
        model, prompt_ids, sampling or SamplingSettings(), max_new_tokens, gen, set(eos_ids)
    )
    return DecodeResult(tokens=tokens, verify_seconds=seconds, total_seconds=seconds, prefill_seconds=timing["prefill"],
                        token_seconds=timing["token_seconds"])  # fmt: skip


def autoregressive_generate(model, prompt_ids, sampling=None, max_new_tokens=128, seed=0, eos_ids=()):
    """The verifier alone: the baseline for accuracy and wall time (the same sampling loop as the dumper)."""
    return drain(autoregressive_steps(model, prompt_ids, sampling, max_new_tokens, seed, eos_ids))


def speculative_generate(verifier, draft, rule, m, sampling=None, max_new_tokens=128, seed=0, prompt_ids=(), eos_ids=(),
                         *, bonus_policy="verifier", draft_mode="sampled", draft_policy=None, gate=None,
                         drift=False):  # fmt: skip
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
    return drain(speculative_steps(verifier, draft, rule, m, sampling, max_new_tokens, seed, prompt_ids, eos_ids,
                                   **options))  # fmt: skip


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
        n_acc, emitted, kls = _judge(o, result.tokens, drafted, draft_rows, draft_raw, q_raw, coin, gen, eos_ids,
                                     draft_after)  # fmt: skip
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


def _check_batch(models, prompts_ids, seeds):
    """Refuse a batch the engine cannot run: several sequences at once need llama.cpp models."""
    from ._hf import engine_of

    for name, model in models:
        if engine_of(model) != "llama.cpp":
            raise ValueError(f"decoding several prompts in one batch needs engine 'llama.cpp' (per-sequence KV "
                             f"caches): the {name} runs on {engine_of(model)!r}; decode one prompt at a time there "
                             "(batch=1)")  # fmt: skip
    if not prompts_ids or len(prompts_ids) != len(seeds):
        raise ValueError(f"give one seed per prompt, and at least one prompt; got {len(prompts_ids)} prompt(s) and "
                         f"{len(seeds)} seed(s)")  # fmt: skip
    if any(len(ids) < 1 for ids in prompts_ids):
        raise ValueError("every prompt's ids must hold at least one token")


@dataclass
class _Row:
    """One request of a batch: its caches, output, generators and the block being drafted."""

    context: list
    result: DecodeResult
    gen: object
    coin: object
    ver: object
    drf: object
    drafted: list = field(default_factory=list)
    draft_rows: list = field(default_factory=list)
    draft_raw: list = field(default_factory=list)
    budget: int = 0
    drafting: bool = True
    confidence: float = 1.0


def speculative_batch_steps(verifier, draft, rule, m, prompts_ids, seeds, sampling=None, max_new_tokens=128,
                            eos_ids=(), *, bonus_policy="verifier", draft_mode="sampled", draft_policy=None, gate=None,
                            drift=False):  # fmt: skip
    """Speculative decoding of B prompts at once on the llama.cpp engine, as a generator of steps
    (``interleave`` alternates it with other runs); its value is one ``DecodeResult`` per prompt.

    The B requests advance in synchronous steps. A step drafts up to m tokens for every request
    that is still running, one draft forward of all of them per drafted position (a request whose
    drafting policy stopped it drops out of the later ones), then verifies every request's block in
    one verifier evaluation of sum_b (m_b + 1) tokens, each at its own positions (``llama_decode``
    with one sequence id per request); each request is judged by the rule exactly as
    ``speculative_steps`` judges it, with its own generators seeded by ``seeds[b]``, accepts its
    own length, and its caches are cut back to its accepted prefix (``llama_memory_seq_rm``). A
    request that ends (an end-of-sequence token, or ``max_new_tokens``) leaves the batch. So
    request b's tokens are those ``speculative_generate`` gives with the same seed whenever the
    logits agree (they do up to llama.cpp's rounding in batches of another shape).

    Timing: ``prefill_seconds`` is the batch's prefill (every prompt in one evaluation of each
    model), ``token_seconds`` when each token was out, ``total_seconds`` the request's own latency
    (the batch's clock when it ended); ``draft_seconds`` / ``verify_seconds`` the batch's steps
    while it ran. Options as in ``speculative_generate``."""
    import torch

    _check_batch([("verifier", verifier)] + ([] if isinstance(draft, NgramDrafter) else [("draft", draft)]),
                 prompts_ids, seeds)  # fmt: skip
    o = _options(rule, m, sampling, draft, bonus_policy, draft_mode, draft_policy, gate, drift)
    ngram = isinstance(draft, NgramDrafter)
    rows = [
        _Row(context=list(ids), result=DecodeResult(tokens=[], token_kl=[] if drift else None),
             gen=torch.Generator().manual_seed(int(seed)), coin=np.random.default_rng(int(seed)),
             ver=verifier.sequence(), drf=None if ngram else draft.sequence())
        for ids, seed in zip(prompts_ids, seeds, strict=True)
    ]  # fmt: skip
    clock = OwnClock()
    verifier.evaluate([(r.ver, r.context[:-1], "last") for r in rows])
    if not ngram:
        draft.evaluate([(r.drf, r.context[:-1], "last") for r in rows])
    for r in rows:
        r.result.prefill_seconds = clock.elapsed()
    yield from paused(clock)
    active = list(rows)
    while active:
        t0 = time.perf_counter()
        for r in active:
            r.budget = min(m, max_new_tokens - len(r.result.tokens))
            r.drafted, r.draft_rows, r.draft_raw, r.drafting, r.confidence = [], [], [], True, 1.0
            if ngram:
                r.drafted = draft.propose(r.context, r.budget)
        while not ngram:
            live = [r for r in active if r.drafting and len(r.drafted) < r.budget]
            if not live:
                break
            raws = draft.evaluate([(r.drf, [r.drafted[-1] if r.drafted else r.context[-1]], "all") for r in live])
            for r, raw in zip(live, raws, strict=True):
                token, p_row, p_raw, features = _draft_row(raw[-1], o, r.gen)
                if o.policy is not None:
                    if o.policy.stop(features[0], features[1], r.confidence):
                        r.drafting = False  # unsure here: verify what is drafted
                        continue
                    r.confidence *= features[0]
                r.drafted.append(token)
                r.draft_rows.append(p_row)
                if o.need_logits:
                    r.draft_raw.append(p_raw)
        t1 = time.perf_counter()
        q_raws = verifier.evaluate([(r.ver, [r.context[-1], *r.drafted], "all") for r in active])
        steps = []
        for r, q_raw in zip(active, q_raws, strict=True):

            def draft_after(token, r=r):
                return _draft_row(draft.evaluate([(r.drf, [token], "all")])[0][-1], o, r.gen)

            steps.append(_judge(o, r.result.tokens, r.drafted, r.draft_rows, r.draft_raw, q_raw, r.coin, r.gen,
                                eos_ids, draft_after))  # fmt: skip
        feeds = []  # the draft caches that lack d_m (all m accepted) get it in one evaluation
        for r, (n_acc, _, _) in zip(active, steps, strict=True):
            keep = len(r.context) + n_acc
            r.ver.crop(keep)
            if r.drf is not None and r.drf.length < keep:
                feeds.append((r.drf, r.drafted[r.drf.length - len(r.context) : n_acc], "last"))
        if feeds:
            draft.evaluate(feeds)
        t3 = time.perf_counter()
        still = []
        for r, (n_acc, emitted, kls) in zip(active, steps, strict=True):
            if r.drf is not None:
                r.drf.crop(len(r.context) + n_acc)
            res = r.result
            res.drafted.append(len(r.drafted))
            res.accepted.append(n_acc)
            res.draft_seconds += t1 - t0
            res.verify_seconds += t3 - t1
            ended = _extend(res, r.context, emitted, kls, max_new_tokens, clock, eos_ids)
            if ended or len(res.tokens) >= max_new_tokens:
                res.total_seconds = clock.elapsed()
                r.ver.close()
                if r.drf is not None:
                    r.drf.close()
            else:
                still.append(r)
        active = still
        if active:
            yield from paused(clock)
    return [r.result for r in rows]


def speculative_generate_batch(verifier, draft, rule, m, prompts_ids, seeds, sampling=None, max_new_tokens=128,
                               eos_ids=(), **options):  # fmt: skip
    """Speculative decoding of B prompts at once on the llama.cpp engine: one ``DecodeResult`` per
    prompt (``speculative_batch_steps`` run to its end; options as there)."""
    return drain(speculative_batch_steps(verifier, draft, rule, m, prompts_ids, seeds, sampling, max_new_tokens,
                                         eos_ids, **options))  # fmt: skip


def autoregressive_generate_batch(model, prompts_ids, seeds, sampling=None, max_new_tokens=128, eos_ids=()):
    """The verifier alone on B prompts at once (llama.cpp): ``autoregressive_batch_steps`` run to its end."""
    return drain(autoregressive_batch_steps(model, prompts_ids, seeds, sampling, max_new_tokens, eos_ids))


def autoregressive_batch_steps(model, prompts_ids, seeds, sampling=None, max_new_tokens=128, eos_ids=()):
    """The verifier alone on B prompts at once (llama.cpp): one evaluation of every running
    request's next token per step, each sampled as ``generate`` samples it (its own generator,
    seeded by ``seeds[b]``); a generator of steps whose value is one ``DecodeResult`` per prompt,
    timed as ``speculative_batch_steps`` times them."""
    import torch

    _check_batch([("verifier", model)], prompts_ids, seeds)
    sampling = sampling or SamplingSettings()
    clock = OwnClock()
    seqs = [model.sequence() for _ in prompts_ids]
    gens = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
    results = [DecodeResult(tokens=[]) for _ in prompts_ids]
    logits = [x[-1] for x in model.evaluate([(q, list(ids), "last") for q, ids in zip(seqs, prompts_ids,
                                                                                        strict=True)])]  # fmt: skip
    for res in results:
        res.prefill_seconds = clock.elapsed()
    yield from paused(clock)
    active = list(range(len(seqs)))
    while active:
        feeds, still = [], []
        for b in active:
            res = results[b]
            token = sample_token(processed_probs(logits[b][None], sampling)[0], gens[b])
            res.tokens.append(token)
            res.token_seconds.append(clock.elapsed() - res.prefill_seconds)
            if token in eos_ids or len(res.tokens) >= max_new_tokens:
                res.total_seconds = res.verify_seconds = clock.elapsed()
                seqs[b].close()
            else:
                feeds.append((seqs[b], [token], "last"))
                still.append(b)
        if feeds:
            for b, out in zip(still, model.evaluate(feeds), strict=True):
                logits[b] = out[-1]
        active = still
        if active:
            yield from paused(clock)
    return results


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
    block_level: bool
    need_logits: bool
    drift: bool


def _options(rule, m, sampling, draft, bonus_policy, draft_mode, draft_policy, gate, drift) -> _Options:
    """The checks of ``speculative_steps`` (and ``speculative_batch_steps``): ValueErrors naming
    the argument, before anything runs."""
    rule = as_rule(rule)
    sampling = sampling or SamplingSettings()
    if not (isinstance(m, int) and m >= 1):
        raise ValueError(f"m (drafted tokens per verification) must be an integer >= 1; got {m!r}")
    if bonus_policy not in BONUS_POLICIES:
        raise ValueError(f"bonus_policy must be one of {BONUS_POLICIES}; got {bonus_policy!r}")
    if draft_mode not in DRAFT_MODES:
        raise ValueError(f"draft_mode must be one of {DRAFT_MODES}; got {draft_mode!r}")
    check_chain_rule(rule)
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
            + ("needs a cost model: it is for the planner; decode with p-min, entropy or accept-prob"
               if policy.needs_cost else "reads the drafter's probabilities; the n-gram drafter has none")
        )  # fmt: skip
    block_level = kind_of(rule) == "block"
    if drift and block_level:
        raise ValueError(f"drift=True records the law of each emitted token: {rule.describe()} judges whole blocks, "
                         "whose law at a slot depends on drafts not yet drawn; record it for a token rule")  # fmt: skip
    if block_level and bonus_policy != "verifier":
        raise ValueError(
            f"{rule.describe()} judges whole blocks: its bonus token is the verifier's (bonus_policy='verifier')"
        )
    if isinstance(draft, NgramDrafter) and (bonus_policy == "relaxed" or "draft" in rule.needs_logits):
        raise ValueError(
            f"{rule.describe()} with bonus_policy={bonus_policy!r} needs a draft model with probabilities and "
            "logits; the n-gram drafter has none"
        )
    return _Options(rule, sampling, bonus_policy, draft_mode, policy, gate, fallback, block_level,
                    bool(rule.needs_logits), bool(drift))  # fmt: skip


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


def _record_key(rec):
    draft_mode = rec.get("draft_mode", "sampled")  # records written before draft modes existed sampled
    return (rec["id"], rec["rule"], rec["m"], rec["seed"], rec["bonus_policy"], rec["baseline"] is not None, draft_mode,
            rec.get("draft_policy"), rec.get("gate"), rec.get("token_kl") is not None, rec.get("batch", 1))  # fmt: skip


#: Seconds of its own compute each run gets before the next takes the machine (``interleave``).
INTERLEAVE_SECONDS = 0.25


def interleave(runs, chunk_seconds=None):
    """Run generators of steps (``speculative_steps``, ``autoregressive_steps``) in alternating
    chunks of about ``chunk_seconds`` of wall time each (at least one step), round robin, until
    all end: a swing in
    the machine's load then falls on every run alike instead of on whichever ran during it.
    Returns (their values, in order; per run the share of the cores other processes kept busy
    during its own chunks, None where /proc cannot tell, and its number of chunks)."""
    from .._util._machine import machine_sample

    runs = list(runs)
    chunk_seconds = INTERLEAVE_SECONDS if chunk_seconds is None else chunk_seconds
    values, alive = [None] * len(runs), set(range(len(runs)))
    other, wall, chunks = [0.0] * len(runs), [0.0] * len(runs), [0] * len(runs)
    known = [True] * len(runs)
    while alive:
        for i in sorted(alive):
            before = machine_sample()
            start = time.perf_counter()
            while True:  # at least one step a chunk
                try:
                    next(runs[i])
                except StopIteration as stop:
                    values[i] = stop.value
                    alive.discard(i)
                    break
                if time.perf_counter() - start >= chunk_seconds:
                    break
            after = machine_sample()
            chunks[i] += 1
            if before is None or after is None:
                known[i] = False
            else:
                other[i] += max((after[1] - before[1]) - (after[2] - before[2]), 0.0)
                wall[i] += after[0] - before[0]
    cores = os.cpu_count() or 1
    # /proc counts in clock ticks (10 ms): over chunks that short the share is clipped to [0, 1]
    loads = [float(min(o / (w * cores), 1.0)) if k and w > 0 else None
             for o, w, k in zip(other, wall, known, strict=True)]  # fmt: skip
    return values, loads, chunks


def _baseline_record(alone, load, chunks) -> dict:
    out = {
        "token_ids": [int(t) for t in alone.tokens],
        "tokens": len(alone.tokens),
        "seconds": alone.total_seconds,
        "prefill_seconds": alone.prefill_seconds,
        "token_seconds": [round(float(t), 6) for t in alone.token_seconds],
        "tokens_per_second": alone.tokens_per_second,
        "chunks": chunks,
    }
    if load is not None:
        out["other_load"] = load
    return out


def decode_prompts(
    verifier,
    draft,
    rule,
    prompts,
    *,
    m=8,
    settings=None,
    max_new_tokens=128,
    seed=0,
    baseline=False,
    bonus_policy="verifier",
    out=None,
    progress=None,
    draft_mode="sampled",
    draft_policy=None,
    chunk_seconds=None,
    gate=None,
    drift=False,
    batch=1,
):
    """Speculative decoding of many prompts with the models loaded once: one record per prompt
    and rule (``rule``: one rule or a list of them).

    ``verifier`` is a (model, tokenizer, identity) triple as ``load_model`` returns it; ``draft``
    a model or an ``NgramDrafter``. Each prompt goes through the chat template and is seeded by
    ``prompt_seed(seed, prompt.id)``; with ``baseline`` the verifier alone decodes it once, with
    the same seed, and every rule's record of that prompt carries that one baseline (for the
    speedup). A prompt's runs (each rule's and the baseline) alternate in chunks of about
    ``chunk_seconds`` of compute (default ``INTERLEAVE_SECONDS``; ``interleave``), each timed by
    its own clock, so a change of the machine's load between them does not skew their ratio;
    the share of the cores other processes used during each run's chunks is recorded beside it (``other_load``, and the
    baseline's own). Records (dicts: id, task, rule, m, token ids, text, accepted and drafted
    counts per step, AL, timings with the prefill apart and when each token was out, tokens per
    second, the load, and the baseline's) are returned, prompt by prompt, rules in the order
    given; with ``out`` they are also appended to that JSON Lines file as each prompt finishes,
    and records already there with the same prompt, rule, m, seed, bonus policy, draft mode,
    drafting policy, gate and baseline setting are not decoded again (read back; a prompt missing
    only some rules decodes those, with the baseline already recorded for it). ``gate``: gated
    relaxation (``speculative_generate``), recorded as ``gate``; ``drift``: each record carries
    ``token_kl`` and ``answer_kl`` (``speculative_generate(drift=True)``; ``answer_drift`` sums them).
    ``batch`` > 1 (the llama.cpp engine): the prompts go ``batch`` at a time, in order, through
    ``speculative_batch_steps`` (the baseline through ``autoregressive_batch_steps``, the verifier
    alone at the same batch size); each record also carries ``batch``, ``batch_size`` (the last
    group may be smaller) and ``batch_seconds`` (the group's wall time: its throughput is the
    group's tokens over it), and ``seconds`` is the request's own latency. A rerun decodes a group
    again for a rule that lacks any of its records (writing only the missing ones).
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1 (prompts decoded at once); got {batch!r}")
    from .._data._prompts import prompt_seed
    from .._util._progress import progress_bar
    from ._hf import encode_chat, eos_ids

    rules = [as_rule(r) for r in (rule if isinstance(rule, (list, tuple)) else [rule])]
    if not rules:
        raise ValueError("rule: give at least one rule")
    labels = [r.describe() for r in rules]
    if len(set(labels)) != len(labels):
        raise ValueError(f"rule: the rules must be distinct; got {labels}")
    for r in rules:
        check_chain_rule(r)
    policy = make_draft_policy(draft_policy)
    policy_label = None if policy is None else policy.describe()
    gate = make_gate(gate)
    gate_label = None if gate is None else gate.describe()
    for r in rules:
        gated_rule(gate, r)  # a gate on a block rule is refused before anything is decoded
    model, tokenizer = verifier[0], verifier[1]
    settings = settings or SamplingSettings()
    eos = eos_ids(model, tokenizer)
    done = {}
    if out is not None and os.path.exists(out):
        expected = "not a decoding record; write to another --out"
        for n, rec in json_lines(out, expected):
            try:
                done[_record_key(rec)] = rec
            except (KeyError, TypeError):
                raise ValueError(f"{out}, line {n}: {expected}") from None
    records = []
    sink = open(out, "a", encoding="utf-8") if out is not None else None
    try:
        bar = progress_bar(total=len(prompts), desc="decode", unit="prompt", enabled=progress)
        for start in range(0, len(prompts), batch):
            group = list(prompts[start : start + batch])
            keys = [[(prompt.id, label, m, seed, bonus_policy, bool(baseline), draft_mode, policy_label, gate_label,
                      bool(drift), batch) for label in labels] for prompt in group]  # fmt: skip
            todo = [i for i in range(len(rules)) if any(k[i] not in done for k in keys)]
            fresh = {}
            if todo:
                ids = [encode_chat(tokenizer, p.text, f"prompt {p.id!r}") for p in group]
                seeds = [prompt_seed(seed, p.id) for p in group]
                shared = [next((done[k]["baseline"] for k in row if k in done), None) if baseline else None
                          for row in keys]  # fmt: skip
                options = {"bonus_policy": bonus_policy, "draft_mode": draft_mode, "draft_policy": policy,
                           "gate": gate, "drift": drift}  # fmt: skip
                if batch == 1:
                    runs = [speculative_steps(model, draft, rules[i], m, settings, max_new_tokens, seeds[0], ids[0],
                                              eos, **options) for i in todo]  # fmt: skip
                else:
                    runs = [speculative_batch_steps(model, draft, rules[i], m, ids, seeds, settings, max_new_tokens,
                                                    eos, **options) for i in todo]  # fmt: skip
                alone = baseline and any(x is None for x in shared)
                if alone:
                    runs.append(autoregressive_steps(model, ids[0], settings, max_new_tokens, seeds[0], eos)
                                if batch == 1 else
                                autoregressive_batch_steps(model, ids, seeds, settings, max_new_tokens,
                                                           eos))  # fmt: skip
                values, loads, chunks = interleave(runs, INTERLEAVE_SECONDS if chunk_seconds is None else chunk_seconds)
                values = [v if isinstance(v, list) else [v] for v in values]
                if alone:
                    batch_seconds = max(r.total_seconds for r in values[-1])
                    shared = [_baseline_record(r, loads[-1], chunks[-1]) for r in values[-1]]
                    if batch > 1:
                        for rec in shared:
                            rec["batch_seconds"] = batch_seconds
                for j, i in enumerate(todo):
                    batch_seconds = max(r.total_seconds for r in values[j])
                    for b, (prompt, res) in enumerate(zip(group, values[j], strict=True)):
                        if keys[b][i] in done:
                            continue
                        rec = _decode_record(prompt, labels[i], m, seed, bonus_policy, draft_mode, policy_label,
                                             gate_label, ids[b], tokenizer, res)  # fmt: skip
                        rec.update({"chunks": chunks[j], "interleaved_with": len(runs) - 1,
                                    "baseline": shared[b] if baseline else None})  # fmt: skip
                        if batch > 1:  # the batch's size and wall time: its throughput is their tokens over it
                            rec.update({"batch": batch, "batch_size": len(group), "batch_seconds": batch_seconds,
                                        "batch_ids": [p.id for p in group]})  # fmt: skip
                        if loads[j] is not None:
                            rec["other_load"] = loads[j]  # the share of the cores other processes used in its chunks
                        if drift:
                            rec["token_kl"] = [float(x) for x in res.token_kl]
                            rec["answer_kl"] = res.answer_kl
                        fresh[(b, i)] = rec
            for b, row in enumerate(keys):
                for i, key in enumerate(row):
                    rec = fresh.get((b, i), done.get(key))
                    records.append(rec)
                    if (b, i) in fresh and sink is not None:
                        sink.write(json.dumps(rec) + "\n")
            bar.update(len(group))
            if sink is not None:
                sink.flush()
        bar.close()
    finally:
        if sink is not None:
            sink.close()
    return records


def _decode_record(prompt, rule, m, seed, bonus_policy, draft_mode, policy_label, gate_label, ids, tokenizer, res):
    """The fields of one decoding record that come from its run."""
    return {
        "id": prompt.id,
        "task": prompt.task,
        "rule": rule,
        "m": m,
        "seed": seed,
        "bonus_policy": bonus_policy,
        "draft_mode": draft_mode,
        "draft_policy": policy_label,
        "gate": gate_label,
        "prompt_tokens": len(ids),
        "token_ids": [int(t) for t in res.tokens],
        "text": tokenizer.decode(res.tokens, skip_special_tokens=True),
        "tokens": len(res.tokens),
        "accepted": [int(a) for a in res.accepted],
        "drafted": [int(d) for d in res.drafted],
        "al": res.accepted_length,
        "seconds": res.total_seconds,
        "prefill_seconds": res.prefill_seconds,
        "token_seconds": [round(float(t), 6) for t in res.token_seconds],
        "draft_seconds": res.draft_seconds,
        "verify_seconds": res.verify_seconds,
        "tokens_per_second": res.tokens_per_second,
    }


def _speedup_interval(columns, counts):
    """(sum tokens / sum seconds) speculative over the verifier alone, and its paired bootstrap 95%
    interval over prompts (``counts``: ``resample_counts``; None: NaN, no interval)."""
    tokens, seconds, b_tokens, b_seconds = columns
    value = float((tokens.sum() / seconds.sum()) / (b_tokens.sum() / b_seconds.sum()))
    if counts is None:
        return value, float("nan"), float("nan")
    t, s, bt, bs = resampled_sums(counts, *columns)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (value, *percentile_interval((t / s) / (bt / bs)))


def _cell(value, lo, hi, width=15) -> str:
    """'[lo, hi]', or 'n/a' where no interval can be had (one prompt, no resamples)."""
    return (f"[{lo:5.2f}, {hi:5.2f}]" if np.isfinite(lo) and np.isfinite(hi) else "n/a").rjust(width)


#: Outputs whose lengths differ by more than this share between speculative decoding and the
#: verifier alone are flagged (their tokens per second compare different texts).
LENGTH_MISMATCH = 0.2
#: A prompt during which other processes kept more than this share of the cores busy is flagged.
BUSY_SHARE = 0.25


def decoding_flags(rec) -> dict:
    """Why a decoding record's speedup may mislead: {"length_mismatch": its output and the
    verifier alone's differ by more than ``LENGTH_MISMATCH`` of the longer, "busy": other
    processes kept more than ``BUSY_SHARE`` of the cores busy while it, or its baseline, ran}."""
    base = rec.get("baseline")
    longer = max(rec["tokens"], base["tokens"]) if base else 0
    load = max(rec.get("other_load") or 0.0, (base or {}).get("other_load") or 0.0)
    return {
        "length_mismatch": longer > 0 and abs(rec["tokens"] - base["tokens"]) / longer > LENGTH_MISMATCH,
        "busy": load > BUSY_SHARE,
    }


def matched_times(rec):
    """(n, speculative (prefill, decode) seconds, alone's) to the first n = min(lengths) tokens of a
    decoding record with a baseline: the two runs compared on the same number of tokens. None if
    the record has no per-token times (written by an older version)."""
    base = rec.get("baseline")
    if not base or "token_seconds" not in rec or "token_seconds" not in base:
        return None
    n = min(rec["tokens"], base["tokens"])
    if n == 0:
        return None
    return (n, (rec["prefill_seconds"], rec["token_seconds"][n - 1]),
            (base["prefill_seconds"], base["token_seconds"][n - 1]))  # fmt: skip


def decoding_summary(records, seed=0, n_boot=1000) -> str:
    """A table per task (and all) of decoding records: prompts, tokens, AL, vLLM MAL, tokens per
    second, and with baselines the verifier alone's tokens per second and the speedup (sum of
    tokens over sum of seconds, speculative over alone), with a bootstrap 95% interval over
    prompts (paired resampling). Records with per-token times add like-for-like columns: the
    prefill's share of the speculative time, and the request and decode speedups over the same
    number of tokens per prompt (the shorter output's), so outputs of different lengths compare
    fairly. Below the table: prompts whose output lengths differ by more than 20%, and prompts
    during which other processes kept more than a quarter of the cores busy."""
    tasks = sorted({r["task"] for r in records})
    matched_all = all(matched_times(r) is not None for r in records) and records
    head = (
        f"{'task':<14} {'prompts':>7} {'tokens':>7} {'AL':>6} {'MAL':>6} {'tok/s':>7} "
        f"{'alone tok/s':>11} {'speedup':>8} {'95% CI':>15}"
    )
    if matched_all:
        head += f" {'prefill':>7} {'request (matched)':>26} {'decode (matched)':>26}"
    lines = [head]
    for task in ["all", *tasks] if len(tasks) > 1 else tasks:
        sel = [r for r in records if task in ("all", r["task"])]
        tokens = np.array([r["tokens"] for r in sel], dtype=float)
        seconds = np.array([r["seconds"] for r in sel], dtype=float)
        steps = sum(len(r["accepted"]) for r in sel)
        al = sum(sum(r["accepted"]) for r in sel) / max(steps, 1)
        rate = tokens.sum() / seconds.sum()
        row = f"{task:<14} {len(sel):>7} {int(tokens.sum()):>7} {al:>6.2f} {1 + al:>6.2f} {rate:>7.2f}"
        if all(r.get("baseline") for r in sel):
            b_tokens = np.array([r["baseline"]["tokens"] for r in sel], dtype=float)
            b_seconds = np.array([r["baseline"]["seconds"] for r in sel], dtype=float)
            counts = resample_counts([r["id"] for r in sel], n_boot, seed)  # one resampling per table row
            value, lo, hi = _speedup_interval((tokens, seconds, b_tokens, b_seconds), counts)
            row += f" {b_tokens.sum() / b_seconds.sum():>11.2f} {value:>7.2f}x {_cell(value, lo, hi)}"
            if matched_all:
                times = [matched_times(r) for r in sel]
                spec = np.array([[t[1][0], t[1][1]] for t in times])
                base = np.array([[t[2][0], t[2][1]] for t in times])
                share = spec[:, 0].sum() / spec.sum()
                req = ratio_interval(base.sum(1), spec.sum(1), counts)
                dec = ratio_interval(base[:, 1], spec[:, 1], counts)
                row += f" {share:>7.0%} " + " ".join(
                    f"{v:>7.2f}x {_cell(v, a, b, 0)}".rjust(26) for v, a, b in (req, dec)
                )
        lines.append(row)
    lines += _throughput_lines(records, seed, n_boot)
    notes = []
    for r in records:
        flags = decoding_flags(r)
        if flags["length_mismatch"]:
            notes.append(f"{r['id']}: {r['tokens']} tokens speculative, {r['baseline']['tokens']} alone (outputs of "
                         "different lengths: compare the matched columns)")  # fmt: skip
        if flags["busy"]:
            load = max(r.get("other_load") or 0.0, (r.get("baseline") or {}).get("other_load") or 0.0)
            notes.append(f"{r['id']}: other processes kept {load:.0%} of the cores busy while it (or its baseline) "
                         "ran: its timings are suspect")  # fmt: skip
    if notes:
        lines += ["", "flagged:", *(f"  {n}" for n in notes)]
    return "\n".join(lines)


def batch_throughput(records, seed=0, n_boot=1000):
    """Throughput of decoding records made with ``batch`` > 1: (tokens per second over the batches:
    their tokens over their wall times, summed over batches; with baselines the verifier alone's at
    the same batch size, and the throughput speedup with its paired bootstrap 95% interval over
    batches), or None when no record was batched."""
    groups = {}
    for r in records:
        if r.get("batch", 1) > 1:
            groups.setdefault((r["rule"], tuple(r["batch_ids"])), []).append(r)
    if not groups:
        return None
    tokens = np.array([sum(x["tokens"] for x in g) for g in groups.values()], dtype=float)
    seconds = np.array([g[0]["batch_seconds"] for g in groups.values()], dtype=float)
    out = {"batches": len(groups), "tokens_per_second": float(tokens.sum() / seconds.sum())}
    if all(x.get("baseline") and "batch_seconds" in x["baseline"] for g in groups.values() for x in g):
        b_tokens = np.array([sum(x["baseline"]["tokens"] for x in g) for g in groups.values()], dtype=float)
        b_seconds = np.array([g[0]["baseline"]["batch_seconds"] for g in groups.values()], dtype=float)
        counts = resample_counts([str(k) for k in groups], n_boot, seed)
        value, lo, hi = _speedup_interval((tokens, seconds, b_tokens, b_seconds), counts)
        out.update({"alone_tokens_per_second": float(b_tokens.sum() / b_seconds.sum()), "speedup": value,
                    "speedup_lo": lo, "speedup_hi": hi})  # fmt: skip
    return out


def _throughput_lines(records, seed, n_boot):
    got = batch_throughput(records, seed, n_boot)
    if got is None:
        return []
    sizes = sorted({r["batch"] for r in records if r.get("batch", 1) > 1})
    line = (f"throughput at batch {'/'.join(map(str, sizes))} ({got['batches']} batches): "
            f"{got['tokens_per_second']:.2f} tok/s")  # fmt: skip
    if "speedup" in got:
        line += (f"; the verifier alone at the same batch size {got['alone_tokens_per_second']:.2f} tok/s: "
                 f"{got['speedup']:.2f}x {_cell(got['speedup'], got['speedup_lo'], got['speedup_hi'], 0)}")  # fmt: skip
    return ["", line + " (the table's tok/s and speedups are per request: tokens over each request's own latency)"]


def answer_drift(records, n_boot=1000, seed=0) -> list:
    """The drift of whole answers from decoding records made with ``drift=True``: per rule and
    task (and "all"), the mean over prompts of sum_t KL(pi_t || q_t) along each answer (an
    unbiased estimate of an upper bound of the KL of the answer's law from the verifier's;
    ``speculative_generate``) with its percentile bootstrap 95% interval over prompts, the mean
    answer length, and the KL per emitted token (summed KL over summed tokens, with its paired
    interval): rows of dicts ``rule``, ``task``, ``prompts``, ``answer_kl`` (``_lo``, ``_hi``),
    ``tokens``, ``kl_per_token`` (``_lo``, ``_hi``)."""
    with_kl = [r for r in records if r.get("token_kl") is not None]
    if not with_kl:
        raise ValueError("records: none carries token_kl; decode with drift=True (decode --drift)")
    for r in with_kl:
        values = np.asarray(r["token_kl"], dtype=np.float64)
        if values.ndim != 1 or not np.all(np.isfinite(values) & (values >= 0)):
            bad = values.ravel()[~(np.isfinite(values.ravel()) & (values.ravel() >= 0))][:1]
            raise ValueError(f"records: prompt {r.get('id')!r} ({r.get('rule')}) has a token_kl that is not a list of "
                             f"KLs >= 0 (got {bad[0] if bad.size else values.shape!r}): a KL is finite and never "
                             "negative; decode again with drift=True")  # fmt: skip
    rows = []
    for rule in dict.fromkeys(r["rule"] for r in with_kl):
        mine = [r for r in with_kl if r["rule"] == rule]
        for task in ["all", *sorted({r["task"] for r in mine})]:
            sel = [r for r in mine if task in ("all", r["task"])]
            kl = np.array([float(np.sum(r["token_kl"])) for r in sel])
            tokens = np.array([float(len(r["token_kl"])) for r in sel])
            counts = resample_counts([r["id"] for r in sel], n_boot, seed)  # None: one prompt, no interval
            mean, lo, hi = ratio_interval(kl, np.ones(kl.size), counts)
            per, per_lo, per_hi = ratio_interval(kl, tokens, counts)
            rows.append({"rule": rule, "task": task, "prompts": len(sel), "answer_kl": float(mean),
                         "answer_kl_lo": float(lo), "answer_kl_hi": float(hi), "tokens": float(tokens.mean()),
                         "kl_per_token": float(per), "kl_per_token_lo": float(per_lo),
                         "kl_per_token_hi": float(per_hi)})  # fmt: skip
    return rows
