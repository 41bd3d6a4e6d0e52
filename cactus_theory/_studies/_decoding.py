"""Decoding many prompts with several rules and the verifier alone, as a study (``DecodeStudy``, run by
``run_study``; ``decode_prompts`` builds one and runs it): a unit is one group of ``batch`` prompts, each rule's
run and the baseline's interleaved in short chunks so all feel the same machine (``interleave``), one JSON Lines
record per (prompt, rule). What records say in a table is in ``_analysis._decode_records``."""

from __future__ import annotations

from typing import ClassVar

from .._models._clock import INTERLEAVE_SECONDS, interleave
from .._models._decode_spec import DecodeSpec
from .._models._decoding import decoder_for
from .._models._pair import ModelPair
from .._util._study import Study, run_study

__all__ = ["DecodeStudy", "decode_prompts"]

#: The kind of record ``decode_prompts`` writes (``RecordLog``).
KIND = "cactus-theory decode"
#: Record fields a rerun gives differently (timings, the machine's load, and how many runs a run was timed among).
TIMINGS = (
    "interleaved_with",
    "seconds",
    "prefill_seconds",
    "token_seconds",
    "draft_seconds",
    "verify_seconds",
    "tokens_per_second",
    "chunks",
    "other_load",
    "batch_seconds",
)


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


class DecodeStudy(Study):
    """Speculative decoding of ``prompts`` with each rule of ``rules`` (and with ``spec.baseline`` the verifier
    alone beside each prompt, for the speedup), as a study: see ``decode_prompts`` for the records."""

    kind: ClassVar[str] = KIND
    unit_name: ClassVar[str] = "group"
    volatile: ClassVar[tuple] = TIMINGS
    outside_setting: ClassVar[dict] = {
        "prompts": "the units: each record names its prompt",
        "rules": "each record's key names its rule, m, seed, bonus and drafting policies, gate, baseline, batch",
        "spec": "its fields are each record's key (m, seed, policies, gate, baseline, drift, batch), or the "
        "setting's (sampling, max_new_tokens), or timing alone (chunk_seconds)",
        **ModelPair.OUTSIDE_SETTING,
    }
    summary_options: ClassVar[dict] = {"seed": None}

    def __init__(self, verifier, draft, rules, prompts, spec=None, *, load_options=None):
        spec = (spec if spec is not None else DecodeSpec()).with_rule(None)
        self.rules = [spec.with_rule(r) for r in (rules if isinstance(rules, (list, tuple)) else [rules])]
        if not self.rules:
            raise ValueError("rule: give at least one rule")
        labels = [r.label for r in self.rules]
        if len(set(labels)) != len(labels):
            raise ValueError(f"rule: the rules must be distinct; got {labels}")
        self.spec, self.prompts = spec, list(prompts)
        self.sampling, self.max_new_tokens = spec.settings, int(spec.max_new_tokens)
        self.pair = ModelPair(verifier, draft, load_options)

    def prepare(self) -> dict:
        """Every rule's decoder (each checked against the drafter first) and the verifier alone's; the models'
        identities and arithmetic."""

        model, draft = self.pair.models()
        self._decoders = [decoder_for(r, model, draft) for r in self.rules]
        self._alone = decoder_for(self.spec, model) if self.spec.baseline else None
        return self.pair.facts()

    def units(self) -> list:
        batch = self.spec.batch
        return [tuple(self.prompts[s : s + batch]) for s in range(0, len(self.prompts), batch)]

    def unit_keys(self, group) -> list:
        return [_key(p.id, r) for p in group for r in self.rules]

    def key(self, record) -> tuple:
        try:
            return _record_key(record)
        except (KeyError, TypeError):
            raise ValueError(f"record {record.get('id')!r}: not a decoding record; write to another --out") from None

    def run_unit(self, group, held) -> list:
        from .._data._prompts import prompt_seed
        from .._models._hf import encode_chat, eos_ids

        spec, rules = self.spec, self.rules
        model, tokenizer = self.pair.verifier[0], self.pair.verifier[1]
        eos = eos_ids(model, tokenizer)
        keys = [[_key(p.id, r) for r in rules] for p in group]
        todo = [i for i in range(len(rules)) if any(k[i] not in held for k in keys)]
        ids = [encode_chat(tokenizer, p.text, f"prompt {p.id!r}") for p in group]
        seeds = [prompt_seed(spec.seed, p.id) for p in group]
        shared = [
            next((held[k]["baseline"] for k in row if k in held), None) if spec.baseline else None for row in keys
        ]
        runs = [self._decoders[i].steps(ids, seeds, eos) for i in todo]
        fresh_baseline = spec.baseline and any(x is None for x in shared)
        if fresh_baseline:
            runs.append(self._alone.steps(ids, seeds, eos))
        chunk = INTERLEAVE_SECONDS if spec.chunk_seconds is None else spec.chunk_seconds
        values, loads, chunks = interleave(runs, chunk)
        if fresh_baseline:
            batch_seconds = max(r.total_seconds for r in values[-1])
            shared = [_baseline_record(r, loads[-1], chunks[-1]) for r in values[-1]]
            if spec.batch > 1:
                for rec in shared:
                    rec["batch_seconds"] = batch_seconds
        records = []
        for j, i in enumerate(todo):
            batch_seconds = max(r.total_seconds for r in values[j])
            for b, (prompt, res) in enumerate(zip(group, values[j], strict=True)):
                if keys[b][i] in held:
                    continue
                rec = _decode_record(prompt, rules[i], ids[b], tokenizer, res)
                rec.update(
                    {
                        "chunks": chunks[j],
                        "interleaved_with": len(runs) - 1,
                        "baseline": shared[b] if spec.baseline else None,
                    }
                )
                if spec.batch > 1:  # the batch's size and wall time: its throughput is their tokens over it
                    rec.update(
                        {
                            "batch": spec.batch,
                            "batch_size": len(group),
                            "batch_seconds": batch_seconds,
                            "batch_ids": [p.id for p in group],
                        }
                    )
                if loads[j] is not None:
                    rec["other_load"] = loads[j]  # the share of the cores other processes used in its chunks
                if spec.drift:
                    rec["token_kl"] = [float(x) for x in res.token_kl]
                    rec["answer_kl"] = res.answer_kl
                records.append(rec)
        return records

    def summarize(self, records, *, seed=None):
        """``decoding_summary`` of the records (its bootstrap seeded by ``seed``, default the run's)."""
        from .._analysis._decode_records import decoding_summary

        return decoding_summary(records, seed=self.spec.seed if seed is None else seed)

    @property
    def label(self) -> str:
        return "decode"


def decode_prompts(verifier, draft, rule, prompts, spec=None, *, out=None, progress=None, client=None, **settings):
    """Speculative decoding of many prompts with the models loaded once: one record per prompt
    and rule (``rule``: one rule or a list of them). ``DecodeStudy`` run by ``run_study``.

    ``spec``: the run's ``DecodeSpec`` (m, sampling, max_new_tokens, seed, baseline, bonus policy, draft
    mode, drafting policy, chunk seconds, gate, drift, batch; its rule is ignored), or its fields as
    keywords (``settings``; not both). ``verifier`` is a (model, tokenizer, identity) triple as
    ``load_model`` returns it; ``draft`` a model, its triple (its identity is recorded) or an
    ``NgramDrafter``. Each prompt goes through the chat template and is seeded by ``prompt_seed(seed,
    prompt.id)``; with ``baseline`` the verifier alone decodes it once, with the same seed, and every rule's
    record of that prompt carries that one baseline (for the speedup). A group's runs (each rule's and the
    baseline) alternate in chunks of about ``chunk_seconds`` of compute (default ``INTERLEAVE_SECONDS``;
    ``interleave``), each timed by its own clock, so a change of the machine's load between them does not
    skew their ratio; the share of the cores other processes used during each run's chunks is recorded
    beside it (``other_load``, and the baseline's own). Records (dicts: id, task, rule, m, token ids, text,
    accepted and drafted counts per step, AL, timings with the prefill apart and when each token was out,
    tokens per second, the load, and the baseline's) are returned, prompt by prompt, rules in the order
    given; with ``out`` they are also appended to that JSON Lines file as each group finishes
    (``RecordLog``: the file locked, each record stamped with the run's setting: the models' identities,
    engine and dtype, the sampling and ``max_new_tokens``; a file holding anything else, or records of
    another setting, is refused before anything is decoded), and records already there with the same
    prompt, rule, m, seed, bonus policy, draft mode, drafting policy, gate and baseline setting are not
    decoded again (a prompt missing only some rules decodes those, with the baseline already recorded for
    it). ``gate``: gated relaxation (``speculative_generate``), recorded as ``gate``; ``drift``: each record
    carries ``token_kl`` and ``answer_kl`` (``speculative_generate(drift=True)``; ``answer_drift`` sums
    them). The prompts go ``batch`` at a time, in order, through the decoder ``decoder_for`` picks (llama.cpp
    at batch 1: one sequence on the host; else batched, on the Hugging Face engine on the model's device
    where the spec allows); at ``batch`` > 1 each record also carries ``batch``, ``batch_size`` (the last
    group may be smaller) and ``batch_seconds`` (the group's wall time: its throughput is the group's
    tokens over it), and ``seconds`` is the request's own latency. A rerun decodes a group again for a rule
    that lacks any of its records (writing only the missing ones).
    """
    if spec is not None and settings:
        raise ValueError(f"give spec= or the keywords {', '.join(sorted(settings))}, not both")
    spec = spec if spec is not None else DecodeSpec(**settings)
    return run_study(DecodeStudy(verifier, draft, rule, prompts, spec), out=out, progress=progress, client=client)


def _key(prompt_id, spec):
    """The key of a prompt's record under ``spec`` (``_record_key`` of the record it gives)."""
    return (
        prompt_id,
        spec.label,
        spec.m,
        spec.seed,
        spec.bonus_policy,
        bool(spec.baseline),
        spec.draft_mode,
        spec.policy_label,
        spec.gate_label,
        bool(spec.drift),
        spec.batch,
    )


def _decode_record(prompt, spec, ids, tokenizer, res):
    """The fields of one decoding record that come from its run."""
    return {
        "id": prompt.id,
        "task": prompt.task,
        "rule": spec.label,
        "m": spec.m,
        "seed": spec.seed,
        "bonus_policy": spec.bonus_policy,
        "draft_mode": spec.draft_mode,
        "draft_policy": spec.policy_label,
        "gate": spec.gate_label,
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
