"""Batched decoding (per-sequence caches: llama.cpp's sequences, or a Hugging Face model's slots,
``_slots.SlotModel``): B prompts advanced in synchronous steps, the verifier alone
(``autoregressive_batch_steps``) and speculative decoding with any rule (``speculative_batch_steps``:
each request drafts, is judged and rolls back its own cache). On the Hugging Face engine the rows stay
on the device where the options allow (``_device_decode``). One sequence at a time on the host lives
in ``_decode``; the prompt-level driver in ``_decode_prompts``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .._math._sampling import SamplingSettings, processed_probs
from ._decode import DecodeResult, NgramDrafter, _draft_row, _extend, _judge, _options
from ._device_decode import device_autoregressive_steps, device_ready, device_speculative_steps
from ._hf import OwnClock, drain, engine_of, paused, sample_token


def _sequences(model, count, prompts_ids, extra):
    """``model`` as something with ``sequence`` / ``evaluate``: a llama.cpp model as it is, a Hugging
    Face model as a ``SlotModel`` of ``count`` slots long enough for the prompts and ``extra`` tokens."""
    if engine_of(model) == "llama.cpp":
        return model
    from ._slots import SlotModel

    return SlotModel(model, count, context=max(len(x) for x in prompts_ids) + extra)


__all__ = [
    "autoregressive_batch_steps",
    "autoregressive_generate_batch",
    "speculative_batch_steps",
    "speculative_generate_batch",
]


def _check_batch(models, prompts_ids, seeds):
    """Refuse a batch the models cannot run: one engine for both, a seed per prompt, no empty prompt."""
    from ._hf import engine_of

    engines = {engine_of(model) for _, model in models}
    if len(engines) > 1:
        raise ValueError(f"the verifier and the draft run on different engines ({sorted(engines)}): load both on one")
    if not prompts_ids or len(prompts_ids) != len(seeds):
        raise ValueError(
            f"give one seed per prompt, and at least one prompt; got {len(prompts_ids)} prompt(s) and "
            f"{len(seeds)} seed(s)"
        )
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


def speculative_batch_steps(
    verifier,
    draft,
    rule,
    m,
    prompts_ids,
    seeds,
    sampling=None,
    max_new_tokens=128,
    eos_ids=(),
    *,
    bonus_policy="verifier",
    draft_mode="sampled",
    draft_policy=None,
    gate=None,
    drift=False,
):
    """Speculative decoding of B prompts at once, as a generator of steps (``interleave`` alternates
    it with other runs); its value is one ``DecodeResult`` per prompt. On the Hugging Face engine,
    where the options allow (``device_ready``: a token rule, the verifier's bonus, no gate, drafting
    policy, drift record or raw logits), the rows stay on the device (``_device_decode``: one host
    synchronisation a step, each request's own random streams); otherwise, and on llama.cpp, the
    host path below.

    The B requests advance in synchronous steps. A step drafts up to m tokens for every request
    that is still running, one draft forward of all of them per drafted position (a request whose
    drafting policy stopped it drops out of the later ones), then verifies every request's block in
    one verifier evaluation of sum_b (m_b + 1) tokens, each at its own positions (``llama_decode``
    with one sequence id per request); each request is judged by the rule exactly as
    ``speculative_steps`` judges it, with its own generators seeded by ``seeds[b]``, accepts its
    own length, and its caches are cut back to its accepted prefix (``llama_memory_seq_rm``, or
    the slot's length). A
    request that ends (an end-of-sequence token, or ``max_new_tokens``) leaves the batch. So
    request b's tokens are those ``speculative_generate`` gives with the same seed whenever the
    logits agree (they do up to llama.cpp's rounding in batches of another shape).

    Timing: ``prefill_seconds`` is the batch's prefill (every prompt in one evaluation of each
    model), ``token_seconds`` when each token was out, ``total_seconds`` the request's own latency
    (the batch's clock when it ended); ``draft_seconds`` / ``verify_seconds`` the batch's steps
    while it ran. Options as in ``speculative_generate``."""
    import torch

    _check_batch(
        [("verifier", verifier)] + ([] if isinstance(draft, NgramDrafter) else [("draft", draft)]), prompts_ids, seeds
    )
    o = _options(rule, m, sampling, draft, bonus_policy, draft_mode, draft_policy, gate, drift)
    if device_ready(o, verifier, draft):
        return (yield from device_speculative_steps(verifier, draft, o, m, prompts_ids, seeds, max_new_tokens, eos_ids))
    ngram = isinstance(draft, NgramDrafter)
    verifier = _sequences(verifier, len(prompts_ids), prompts_ids, max_new_tokens + m + 2)
    draft = draft if ngram else _sequences(draft, len(prompts_ids), prompts_ids, max_new_tokens + m + 2)
    rows = [
        _Row(
            context=list(ids),
            result=DecodeResult(tokens=[], token_kl=[] if drift else None),
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

            steps.append(
                _judge(
                    o, r.result.tokens, r.drafted, r.draft_rows, r.draft_raw, q_raw, r.coin, r.gen, eos_ids, draft_after
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


def speculative_generate_batch(
    verifier, draft, rule, m, prompts_ids, seeds, sampling=None, max_new_tokens=128, eos_ids=(), **options
):
    """Speculative decoding of B prompts at once: one ``DecodeResult`` per prompt
    (``speculative_batch_steps`` run to its end; options as there)."""
    return drain(
        speculative_batch_steps(
            verifier, draft, rule, m, prompts_ids, seeds, sampling, max_new_tokens, eos_ids, **options
        )
    )


def autoregressive_generate_batch(model, prompts_ids, seeds, sampling=None, max_new_tokens=128, eos_ids=()):
    """The verifier alone on B prompts at once: ``autoregressive_batch_steps`` run to its end."""
    return drain(autoregressive_batch_steps(model, prompts_ids, seeds, sampling, max_new_tokens, eos_ids))


def autoregressive_batch_steps(model, prompts_ids, seeds, sampling=None, max_new_tokens=128, eos_ids=()):
    """The verifier alone on B prompts at once: one evaluation of every running request's next token
    per step; on llama.cpp each sampled as ``generate`` samples it (its own generator, seeded by
    ``seeds[b]``), on the Hugging Face engine on the device with the dumper's streams
    (``device_autoregressive_steps``); a generator of steps whose value is one ``DecodeResult`` per
    prompt, timed as ``speculative_batch_steps`` times them."""
    import torch

    _check_batch([("verifier", model)], prompts_ids, seeds)
    sampling = sampling or SamplingSettings()
    if engine_of(model) != "llama.cpp":
        return (yield from device_autoregressive_steps(model, prompts_ids, seeds, sampling, max_new_tokens, eos_ids))
    clock = OwnClock()
    seqs = [model.sequence() for _ in prompts_ids]
    gens = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
    results = [DecodeResult(tokens=[]) for _ in prompts_ids]
    logits = [x[-1] for x in model.evaluate([(q, list(ids), "last") for q, ids in zip(seqs, prompts_ids, strict=True)])]
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
