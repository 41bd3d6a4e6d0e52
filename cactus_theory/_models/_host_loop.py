"""The decoders whose rows come to the host: ``HostChain`` (one sequence at a time: a KV-cached runner per
model, ``speculative_generate``'s loop) and ``HostBatch`` (B sequences in synchronous steps: llama.cpp's
sequences or a Hugging Face model's slots, ``_slots.SlotModel``), for any rule, gate, drafting policy, bonus
policy and drift record the ``DecodeSpec`` holds, and for the verifier alone.

One verification, as both judge it (``judge``): the m drafts are accepted in order with the rule's acceptance
probability (the draft at slot j judged by ``rule.at_slot(j)``, or by the gate's lossless fallback where the
gate is closed after the tokens before it); the first rejection emits the rule's correction; a fully
accepted block the bonus token, from q (``bonus_policy="verifier"``) or by one more step of the rule with the
drafter's distribution there (``"relaxed"``); a block rule's verdict comes from its ``block_law``. Both
distributions are processed with the run's sampling settings before the rule sees them (vLLM's order).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .._laws._block import greedy_draft
from .._laws._policies import draft_features
from .._math._logits import RuleLogits
from .._math._sampling import processed_probs
from ._clock import OwnClock, paused
from ._decode_spec import Decoder, DecodeResult
from ._drafters import NgramDrafter
from ._hf import cached_model, engine_of, generate_steps, sample_token

__all__ = ["HostBatch", "HostChain", "rule_step"]


def rule_step(rule, p_row, q_row, token, logits, coin, gen):
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


def draft_row(raw, spec, gen):
    """The drafter's token from its raw logit row: (token, processed row p as float64 NumPy (one-hot
    under greedy drafting), the raw row as NumPy when the rule reads logits, (top-1 p, entropy)
    when a drafting policy reads them)."""
    import torch

    p = processed_probs(raw[None], spec.settings)[0]
    p_row = p.double().cpu().numpy()
    features = None
    if spec.draft_policy is not None:
        top1, entropy = draft_features(p_row[None])
        features = (float(top1[0]), float(entropy[0]))
    if spec.draft_mode == "greedy":  # the rule sees the drafter's one-hot
        drafted = int(torch.argmax(p))
        p_row = greedy_draft(p_row)
    else:
        drafted = sample_token(p, gen)
    return drafted, p_row, raw.double().cpu().numpy() if spec.need_logits else None, features


def judge(spec, output, drafted, draft_rows, draft_raw, q_raw, coin, gen, eos_ids, draft_after):
    """One verification of ``drafted`` against the verifier's raw rows ``q_raw`` (m + 1 of them,
    torch) after ``output``: (accepted drafts, tokens emitted: the accepted drafts and then the
    correction, or the bonus when all were accepted, per emitted token its KL under drift).
    ``draft_after(token)``: one more draft forward (the relaxed bonus)."""
    import torch

    rule, sampling = spec.rule, spec.settings
    q_rows = processed_probs(q_raw, sampling).double().cpu().numpy()
    q_raw = q_raw.double().cpu().numpy() if spec.need_logits else None
    kls = []

    def step(slot, p_row, token, p_raw):
        """The rule at slot ``slot``: (accepted?, the token emitted)."""
        judging, logits = rule.at_slot(slot), None
        if spec.fallback is not None and not spec.gate.inside_after([*output, *drafted[:slot]]):
            judging = spec.fallback  # the gate is closed
        elif spec.need_logits:
            logits = RuleLogits(target=q_raw[slot], draft=p_raw, temperature=sampling.temperature)
        if spec.drift:
            kls.append(_emitted_kl(judging, p_row, q_rows[slot], token, logits))
        return rule_step(judging, p_row, q_rows[slot], token, logits, coin, gen)

    if spec.block_level and drafted:  # the whole block judged at once
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
        if spec.bonus_policy == "verifier" or not drafted:
            emitted.append(sample_token(torch.as_tensor(q_rows[len(drafted)]), gen))  # bonus from q
            kls.append(0.0)
        else:  # relaxed: the drafter drafts at the bonus position, the rule judges once more
            token, p_row, p_raw, _ = draft_after(drafted[-1])
            emitted.append(step(len(drafted), p_row, token, p_raw)[1])
    return n_acc, emitted, kls


def extend(result, context, emitted, kls, max_new_tokens, clock, eos_ids) -> bool:
    """Append a step's emitted tokens (cut at ``max_new_tokens``) to ``result`` and ``context``,
    with their time; True when the output has ended (an end-of-sequence token)."""
    emitted = emitted[: max_new_tokens - len(result.tokens)]
    if result.token_kl is not None:
        result.token_kl.extend(kls[: len(emitted)])
    context.extend(emitted)
    result.tokens.extend(emitted)
    result.token_seconds.extend([clock.elapsed() - result.prefill_seconds] * len(emitted))
    return any(t in eos_ids for t in emitted)


def book_step(row, step, max_new_tokens, clock, eos_ids) -> bool:
    """Book one step of a batch's ``row`` (``step``: drafted, accepted, emitted tokens, their per-token KLs,
    drafting and verifying seconds); True when the row is done (its output ended or full): its time taken
    and its caches closed."""
    drafted, n_acc, emitted, kls, draft_seconds, verify_seconds = step
    res = row.result
    res.drafted.append(drafted)
    res.accepted.append(n_acc)
    res.draft_seconds += draft_seconds
    res.verify_seconds += verify_seconds
    ended = extend(res, row.context, emitted, kls, max_new_tokens, clock, eos_ids)
    if not (ended or len(res.tokens) >= max_new_tokens):
        return False
    res.total_seconds = clock.elapsed()
    row.ver.close()
    if row.drf is not None:
        row.drf.close()
    return True


class HostChain(Decoder):
    """One sequence at a time, rows on the host: a KV-cached runner per model (``cached_model``); the
    verifier checks the m drafts in one forward, and after a rejection both caches are cropped back to
    the accepted prefix. Several prompts run one after another."""

    def _run(self, prompts_ids, seeds, eos_ids):
        results = []
        for ids, seed in zip(prompts_ids, seeds, strict=True):
            one = self._alone(ids, seed, eos_ids) if self.spec.rule is None else self._speculative(ids, seed, eos_ids)
            results.append((yield from one))
        return results

    def _alone(self, prompt_ids, seed, eos_ids):
        import torch

        gen = torch.Generator().manual_seed(int(seed))
        tokens, _, seconds, timing = yield from generate_steps(
            self.verifier, prompt_ids, self.spec.settings, self.spec.max_new_tokens, gen, set(eos_ids)
        )
        return DecodeResult(
            tokens=tokens,
            verify_seconds=seconds,
            total_seconds=seconds,
            prefill_seconds=timing["prefill"],
            token_seconds=timing["token_seconds"],
        )

    def _speculative(self, prompt_ids, seed, eos_ids):
        import torch

        spec, draft = self.spec, self.draft
        m, max_new_tokens = spec.m, spec.max_new_tokens
        gen = torch.Generator().manual_seed(int(seed))
        coin = np.random.default_rng(int(seed))
        ver = cached_model(self.verifier)
        ngram = isinstance(draft, NgramDrafter)
        drf = None if ngram else cached_model(draft)
        context = list(prompt_ids)
        result = DecodeResult(tokens=[], token_kl=[] if spec.drift else None)
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
            return draft_row(drf.feed([token])[-1], spec, gen)

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
                    if spec.draft_policy is not None:
                        if spec.draft_policy.stop(features[0], features[1], confidence):
                            break  # the drafter is unsure here: verify what is drafted
                        confidence *= features[0]
                    drafted.append(token)
                    draft_rows.append(p_row)
                    if spec.need_logits:
                        draft_raw.append(p_raw)
            t1 = time.perf_counter()
            q_raw = ver.feed([context[-1], *drafted])
            t2 = time.perf_counter()
            n_acc, emitted, kls = judge(
                spec, result.tokens, drafted, draft_rows, draft_raw, q_raw, coin, gen, eos_ids, draft_after
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
            if extend(result, context, emitted, kls, max_new_tokens, clock, eos_ids):
                break
            yield from paused(clock)
        result.total_seconds = clock.elapsed()
        return result


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


def _sequences(model, count, prompts_ids, extra):
    """``model`` as something with ``sequence`` / ``evaluate``: a llama.cpp model as it is, a Hugging
    Face model as a ``SlotModel`` of ``count`` slots long enough for the prompts and ``extra`` tokens."""
    if engine_of(model) == "llama.cpp":
        return model
    from ._slots import SlotModel

    return SlotModel(model, count, context=max(len(x) for x in prompts_ids) + extra)


class HostBatch(Decoder):
    """B prompts in synchronous steps, rows on the host. A step drafts up to m tokens for every request still
    running, one draft forward of all of them per drafted position (a request whose drafting policy stopped
    it drops out of the later ones), then verifies every request's block in one verifier evaluation of
    sum_b (m_b + 1) tokens, each at its own positions (``llama_decode`` with one sequence id per request);
    each request is judged exactly as ``HostChain`` judges it, with its own generators seeded by its seed,
    accepts its own length, and its caches are cut back to its accepted prefix. A request that ends (an
    end-of-sequence token, or ``max_new_tokens``) leaves the batch. So request b's tokens are those
    ``HostChain`` gives with the same seed whenever the logits agree (they do up to llama.cpp's rounding in
    batches of another shape). The verifier alone: one evaluation of every running request's next token per
    step, each sampled with its own generator (llama.cpp; the Hugging Face engine's verifier alone runs on
    the device, ``OnDevice``)."""

    def _run(self, prompts_ids, seeds, eos_ids):
        if self.spec.rule is None:
            return (yield from self._alone(prompts_ids, seeds, eos_ids))
        return (yield from self._speculative(prompts_ids, seeds, eos_ids))

    def _speculative(self, prompts_ids, seeds, eos_ids):
        import torch

        spec = self.spec
        m, max_new_tokens = spec.m, spec.max_new_tokens
        draft = self.draft
        ngram = isinstance(draft, NgramDrafter)
        verifier = _sequences(self.verifier, len(prompts_ids), prompts_ids, max_new_tokens + m + 2)
        draft = draft if ngram else _sequences(draft, len(prompts_ids), prompts_ids, max_new_tokens + m + 2)
        rows = [
            _Row(
                context=list(ids),
                result=DecodeResult(tokens=[], token_kl=[] if spec.drift else None),
                gen=torch.Generator().manual_seed(int(seed)),
                coin=np.random.default_rng(int(seed)),
                ver=verifier.sequence(),
                drf=None if ngram else draft.sequence(),
            )
            for ids, seed in zip(prompts_ids, seeds, strict=True)
        ]
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
                    token, p_row, p_raw, features = draft_row(raw[-1], spec, r.gen)
                    if spec.draft_policy is not None:
                        if spec.draft_policy.stop(features[0], features[1], r.confidence):
                            r.drafting = False  # unsure here: verify what is drafted
                            continue
                        r.confidence *= features[0]
                    r.drafted.append(token)
                    r.draft_rows.append(p_row)
                    if spec.need_logits:
                        r.draft_raw.append(p_raw)
            t1 = time.perf_counter()
            q_raws = verifier.evaluate([(r.ver, [r.context[-1], *r.drafted], "all") for r in active])
            steps = []
            for r, q_raw in zip(active, q_raws, strict=True):

                def draft_after(token, r=r):
                    return draft_row(draft.evaluate([(r.drf, [token], "all")])[0][-1], spec, r.gen)

                steps.append(
                    judge(
                        spec,
                        r.result.tokens,
                        r.drafted,
                        r.draft_rows,
                        r.draft_raw,
                        q_raw,
                        r.coin,
                        r.gen,
                        eos_ids,
                        draft_after,
                    )
                )
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
                step = (len(r.drafted), n_acc, emitted, kls, t1 - t0, t3 - t1)
                if not book_step(r, step, max_new_tokens, clock, eos_ids):
                    still.append(r)
            active = still
            if active:
                yield from paused(clock)
        return [r.result for r in rows]

    def _alone(self, prompts_ids, seeds, eos_ids):
        import torch

        model, sampling, max_new_tokens = self.verifier, self.spec.settings, self.spec.max_new_tokens
        clock = OwnClock()
        seqs = [model.sequence() for _ in prompts_ids]
        gens = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
        results = [DecodeResult(tokens=[]) for _ in prompts_ids]
        evaluated = model.evaluate([(q, list(ids), "last") for q, ids in zip(seqs, prompts_ids, strict=True)])
        logits = [x[-1] for x in evaluated]
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
