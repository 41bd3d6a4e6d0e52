"""Decoding many prompts with several rules and the verifier alone (``decode_prompts``): models loaded
once, runs interleaved in short chunks so both feel the same machine, one JSON Lines record per
(prompt, rule), resumable. What a record says in a table is in ``_decode_summary``."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

from .._laws._gate import gated_rule, make_gate
from .._laws._policies import make_draft_policy
from .._math._sampling import SamplingSettings
from .._math._validation import check_count
from .._rules._registry import as_rule
from .._util._files import LockError
from .._util._options import merged_options
from .._util._records import RecordLog
from ._batch_decode import autoregressive_batch_steps, speculative_batch_steps
from ._decode import autoregressive_steps, check_chain_rule, speculative_steps

__all__ = ["DecodeOptions", "decode_prompts", "interleave"]


def _record_key(rec):
    draft_mode = rec.get("draft_mode", "sampled")  # records written before draft modes existed sampled
    return (
        rec["id"],
        rec["rule"],
        rec["m"],
        rec["seed"],
        rec["bonus_policy"],
        rec["baseline"] is not None,
        draft_mode,
        rec.get("draft_policy"),
        rec.get("gate"),
        rec.get("token_kl") is not None,
        rec.get("batch", 1),
    )


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
    loads = [
        float(min(o / (w * cores), 1.0)) if k and w > 0 else None for o, w, k in zip(other, wall, known, strict=True)
    ]
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


@dataclass(frozen=True)
class DecodeOptions:
    """``decode_prompts``'s settings (each as its keyword of the same name documents it): one record the
    command line builds from its arguments in one place (``_cli._common.decoding_options``)."""

    m: int = 8
    settings: object = None
    max_new_tokens: int = 128
    seed: int = 0
    baseline: bool = False
    bonus_policy: str = "verifier"
    draft_mode: str = "sampled"
    draft_policy: object = None
    chunk_seconds: object = None
    gate: object = None
    drift: bool = False
    batch: int = 1

    def keywords(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


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
    options=None,
):
    """Speculative decoding of many prompts with the models loaded once: one record per prompt
    and rule (``rule``: one rule or a list of them).

    ``verifier`` is a (model, tokenizer, identity) triple as ``load_model`` returns it; ``draft`` a model, its
    triple (its identity is recorded) or an ``NgramDrafter``. Each prompt goes through the chat template and is
    seeded by ``prompt_seed(seed, prompt.id)``; with ``baseline`` the verifier alone decodes it once, with the same
    seed, and every rule's record of that prompt carries that one baseline (for the speedup). A prompt's runs (each
    rule's and the baseline) alternate in chunks of about ``chunk_seconds`` of compute (default
    ``INTERLEAVE_SECONDS``; ``interleave``), each timed by its own clock, so a change of the machine's load between
    them does not skew their ratio; the share of the cores other processes used during each run's chunks is recorded
    beside it (``other_load``, and the baseline's own). Records (dicts: id, task, rule, m, token ids, text, accepted
    and drafted counts per step, AL, timings with the prefill apart and when each token was out, tokens per second,
    the load, and the baseline's) are returned, prompt by prompt, rules in the order given; with ``out`` they are
    also appended to that JSON Lines file as each prompt finishes (``RecordLog``: the file locked, each record
    stamped with the run's setting: the models' identities, engine and dtype, the sampling and ``max_new_tokens``; a
    file holding anything else, or records of another setting, is refused before anything is decoded), and records
    already there with the same prompt, rule, m, seed, bonus policy, draft mode, drafting policy, gate and baseline
    setting are not decoded again (read back; a prompt missing only some rules decodes those, with the baseline
    already recorded for it). ``gate``: gated relaxation (``speculative_generate``), recorded as ``gate``;
    ``drift``: each record carries ``token_kl`` and ``answer_kl`` (``speculative_generate(drift=True)``;
    ``answer_drift`` sums them). ``batch`` > 1: the prompts go ``batch`` at a time, in order, through
    ``speculative_batch_steps`` (the baseline through ``autoregressive_batch_steps``, the verifier alone at the same
    batch size; on the Hugging Face engine batch 1 goes that way too: the rows stay on the model's device,
    ``_device_decode``); each record also carries ``batch``, ``batch_size`` (the last group may be smaller) and
    ``batch_seconds`` (the group's wall time: its throughput is the group's tokens over it), and ``seconds`` is the
    request's own latency. A rerun decodes a group again for a rule that lacks any of its records (writing only the
    missing ones).

    ``options``: a ``DecodeOptions`` holding every setting above at once (then none of them as a
    keyword): what the command line passes.
    """
    given = {
        "m": m,
        "settings": settings,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "baseline": baseline,
        "bonus_policy": bonus_policy,
        "draft_mode": draft_mode,
        "draft_policy": draft_policy,
        "chunk_seconds": chunk_seconds,
        "gate": gate,
        "drift": drift,
        "batch": batch,
    }
    if options is not None:
        chosen = merged_options(DecodeOptions, options, given)
        (
            m,
            settings,
            max_new_tokens,
            seed,
            baseline,
            bonus_policy,
            draft_mode,
            draft_policy,
            chunk_seconds,
            gate,
            drift,
            batch,
        ) = (chosen[k] for k in given)
    check_count(batch, "batch", what="prompts decoded at once")
    check_count(max_new_tokens, "max_new_tokens")
    from .._data._prompts import prompt_seed
    from .._util._progress import progress_bar
    from ._hf import encode_chat, engine_of, eos_ids, split_model

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
    setting = _setting(verifier, draft, settings, max_new_tokens)
    draft = split_model(draft)[0]
    done, log = {}, None
    if out is not None:
        log = RecordLog(out, KIND, setting)
        try:
            held = log.open()
        except LockError as exc:
            raise ValueError(str(exc)) from None
        for n, rec in enumerate(held, 1):
            try:
                done[_record_key(rec)] = rec
            except (KeyError, TypeError):
                log.close()
                raise ValueError(f"{out}, record {n}: not a decoding record; write to another --out") from None
    records = []
    try:
        bar = progress_bar(total=len(prompts), desc="decode", unit="prompt", enabled=progress)
        for start in range(0, len(prompts), batch):
            group = list(prompts[start : start + batch])
            keys = [
                [
                    (
                        prompt.id,
                        label,
                        m,
                        seed,
                        bonus_policy,
                        bool(baseline),
                        draft_mode,
                        policy_label,
                        gate_label,
                        bool(drift),
                        batch,
                    )
                    for label in labels
                ]
                for prompt in group
            ]
            todo = [i for i in range(len(rules)) if any(k[i] not in done for k in keys)]
            fresh = {}
            if todo:
                ids = [encode_chat(tokenizer, p.text, f"prompt {p.id!r}") for p in group]
                seeds = [prompt_seed(seed, p.id) for p in group]
                shared = [
                    next((done[k]["baseline"] for k in row if k in done), None) if baseline else None for row in keys
                ]
                options = {
                    "bonus_policy": bonus_policy,
                    "draft_mode": draft_mode,
                    "draft_policy": policy,
                    "gate": gate,
                    "drift": drift,
                }
                one = batch == 1 and engine_of(model) == "llama.cpp"  # the Hugging Face engine: batched, on its device
                if one:
                    runs = [
                        speculative_steps(
                            model, draft, rules[i], m, settings, max_new_tokens, seeds[0], ids[0], eos, **options
                        )
                        for i in todo
                    ]
                else:
                    runs = [
                        speculative_batch_steps(
                            model, draft, rules[i], m, ids, seeds, settings, max_new_tokens, eos, **options
                        )
                        for i in todo
                    ]
                alone = baseline and any(x is None for x in shared)
                if alone:
                    runs.append(
                        autoregressive_steps(model, ids[0], settings, max_new_tokens, seeds[0], eos)
                        if one
                        else autoregressive_batch_steps(model, ids, seeds, settings, max_new_tokens, eos)
                    )
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
                        rec = _decode_record(
                            prompt,
                            labels[i],
                            m,
                            seed,
                            bonus_policy,
                            draft_mode,
                            policy_label,
                            gate_label,
                            ids[b],
                            tokenizer,
                            res,
                        )
                        rec.update(
                            {
                                "chunks": chunks[j],
                                "interleaved_with": len(runs) - 1,
                                "baseline": shared[b] if baseline else None,
                            }
                        )
                        if batch > 1:  # the batch's size and wall time: its throughput is their tokens over it
                            rec.update(
                                {
                                    "batch": batch,
                                    "batch_size": len(group),
                                    "batch_seconds": batch_seconds,
                                    "batch_ids": [p.id for p in group],
                                }
                            )
                        if loads[j] is not None:
                            rec["other_load"] = loads[j]  # the share of the cores other processes used in its chunks
                        if drift:
                            rec["token_kl"] = [float(x) for x in res.token_kl]
                            rec["answer_kl"] = res.answer_kl
                        fresh[(b, i)] = rec
            if log is not None:
                log.append([fresh[k] for k in sorted(fresh)])
                fresh = {k: log.stamped(r) for k, r in fresh.items()}
            for b, row in enumerate(keys):
                for i, key in enumerate(row):
                    records.append(fresh.get((b, i), done.get(key)))
            bar.update(len(group))
        bar.close()
    finally:
        if log is not None:
            log.close()
    return records


#: The kind of record ``decode_prompts`` writes (``RecordLog``).
KIND = "cactus-theory decode"


def _setting(verifier, draft, settings, max_new_tokens) -> dict:
    """What decides every record of a file besides its own key (prompt, rule, m, seed, policies, gate,
    baseline, batch): the models (identity, engine, dtype), the sampling and the length."""
    from ._hf import model_arithmetic, split_model

    draft, draft_identity = split_model(draft)
    return {
        "models": {"verifier": split_model(tuple(verifier))[1], "draft": draft_identity},
        "arithmetic": {"verifier": model_arithmetic(verifier[0]), "draft": model_arithmetic(draft)},
        "sampling": settings.as_dict(),
        "max_new_tokens": int(max_new_tokens),
    }


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
