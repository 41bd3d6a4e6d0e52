"""The quality referee: what relaxing verification costs in answers. Every problem of a graded benchmark
is decoded by the verifier alone and by each rule (``samples`` times each, seeded per problem, method and
sample), graded (``_data._graders``), and each rule is compared with the verifier alone on the same
problems (``_math._paired``: the paired difference with a bootstrap interval over problems, McNemar's
exact test at one sample, the problems a +-1 and +-2 point interval would need), beside the drift the
rule spends on those answers (per emitted token, KL(pi_t || q_t) of the law it emitted the token from,
and its sum along each answer: ``speculative_generate(drift=True)``).

Records: one JSON line per (problem, method, sample), appended as each batch of problems completes through a
``RecordLog`` (``_util._records``: the records file is locked while a run writes; a rerun skips what is
there; a file that is not this command's records, or records of another setting, models, benchmark or
problems, is refused before anything is decoded; Ctrl-C and SIGTERM keep every completed batch). Each
record carries its problem's ``digest`` (what the problem is, whatever its place in its file). The summary
is computed from the records alone (``summarize_records``), so it can be recomputed without a model
(``cactus-theory evaluate --summarize RECORDS``).

HumanEval and MBPP answers are programs: they run (isolated by the operating system, ``_util._sandbox``)
only with ``allow_code_execution=True`` or ``CACTUS_ALLOW_CODE_EXECUTION=1``, checked before decoding.
"""

from __future__ import annotations

import contextlib
from typing import ClassVar

from .._analysis._referee_summary import ALONE, SAMPLED_KIND, summarize_records
from .._data._benchmarks import get_benchmark
from .._data._graders import PROGRAM_SECONDS, grade, require_code_execution
from .._data._prompts import prompt_seed
from .._math._validation import RUN_LIMITS, check_count, check_int
from .._models._pair import ModelPair
from .._util._study import Study, run_study
from ._exact_choice import REFEREE_OUTSIDE, _distinct_problems, _same_problems

__all__ = ["LIMITS", "SampledReferee", "check_evaluate_limits", "evaluate_rules"]

#: The kind of record this referee writes (``RecordLog``).
KIND = SAMPLED_KIND
#: The largest value of each count a run may ask for (``RUN_LIMITS``), checked before any model loads.
LIMITS = RUN_LIMITS


def _method_seed(seed, problem_id, method, sample) -> int:
    """The seed of one (problem, method, sample): from the run's seed and the three (``prompt_seed``)."""
    return prompt_seed(seed, f"{problem_id}|{method}|{sample}")


def check_evaluate_limits(*, m=8, max_new_tokens=512, batch=1, samples=1) -> None:
    """Each count an integer between 1 and its ``LIMITS`` bound (one ValueError line naming it)."""
    for name, value in (("m", m), ("max_new_tokens", max_new_tokens), ("batch", batch), ("samples", samples)):
        check_count(value, name)


class SampledReferee(Study):
    """The sampled referee as a study (``run_study``): a unit is one group of ``batch`` problems at one sample,
    every method on it (so a stopped run holds paired answers of every method on the problems it reached);
    its records, one per (problem, method, sample), as ``evaluate_rules`` describes them. ``verifier``,
    ``draft``: loaded, or paths / ids with ``load_options`` (a Dask worker loads them once)."""

    kind: ClassVar[str] = KIND
    unit_name: ClassVar[str] = "group"
    outside_setting: ClassVar[dict] = {
        **REFEREE_OUTSIDE,
        "spec": "the run's decoding spec, made of the setting's fields",
        "samples": "how many samples: each record names its sample",
        "allow_code_execution": "consent to run programs: a run without it is refused before it starts",
    }
    setting_as: ClassVar[dict] = {"settings": "sampling", "timeout": "program_seconds", "rows": "answer_rows"}
    volatile: ClassVar[tuple] = ("rows_seconds",)
    summary_options: ClassVar[dict] = {"n_boot": 2000, "seed": 0}

    def __init__(
        self,
        verifier,
        draft,
        problems,
        rules,
        *,
        m=8,
        settings=None,
        max_new_tokens=512,
        samples=1,
        seed=0,
        batch=1,
        drift=True,
        timeout=PROGRAM_SECONDS,
        allow_code_execution=None,
        benchmarks=None,
        threads=None,
        load_options=None,
        rows=0,
    ):
        from .._models._decode_spec import DecodeSpec

        self.answer_rows = check_int(rows, "rows", 0, what="logits kept per model and answer position; 0: none")
        check_evaluate_limits(m=m, max_new_tokens=max_new_tokens, batch=batch, samples=samples)
        # the run's one spec, checked once; each rule's is the same settings for it
        spec = DecodeSpec(m=m, settings=settings, max_new_tokens=max_new_tokens, seed=seed, batch=batch, drift=drift)
        self.specs = {ALONE: spec, **{s.label: s for s in (spec.with_rule(r) for r in rules)}}
        self.methods = list(self.specs)
        if len(self.methods) != len(rules) + 1:
            raise ValueError(f"the rules must be distinct; got {[spec.with_rule(r).label for r in rules]}")
        if not problems:
            raise ValueError("problems: give at least one problem (load_problems)")
        _distinct_problems(problems)
        present = sorted({p.benchmark for p in problems})
        self.benchmarks = present if benchmarks is None else sorted({str(b) for b in benchmarks})
        if set(present) - set(self.benchmarks):
            raise ValueError(f"benchmarks: the problems hold {present}, beyond the benchmarks named, {self.benchmarks}")
        for bench in present:
            require_code_execution(bench, allow_code_execution)
        if any(get_benchmark(b).runs_code for b in present):
            from .._util._sandbox import _isolation_decision

            _isolation_decision(None)  # no isolation and no knowing consent: refused before anything is decoded
        if self.answer_rows and not spec.settings.support_within(self.answer_rows):
            raise ValueError(
                f"rows: {self.answer_rows} logits a position cannot hold the law of the sampling "
                f"({spec.settings.describe()}; it needs a top-k of at most that many, before any top-p): give rows "
                f"of at least its top-k ({spec.settings.top_k or 'none set'})"
            )
        self.problems, self.spec, self.samples = list(problems), spec, int(samples)
        # what decides every answer besides its (problem, method, sample): with the models, the setting
        self.m, self.sampling, self.max_new_tokens, self.seed = spec.m, spec.settings, spec.max_new_tokens, int(seed)
        self.batch, self.drift, self.program_seconds = spec.batch, spec.drift, float(timeout)
        self.allow_code_execution, self.threads = allow_code_execution, threads
        self.pair = ModelPair(verifier, draft, load_options)

    def prepare(self) -> dict:
        """The decoders and the prompts' ids, made once in each process that runs units; the models' identities
        and arithmetic."""
        from .._models._decoding import decoder_for
        from .._models._hf import encode_chat, eos_ids

        (model, draft), tokenizer = self.pair.models(), self.pair.verifier[1]
        self._eos = eos_ids(model, tokenizer)
        self._decoders = {
            method: decoder_for(s, model, draft if s.rule is not None else None) for method, s in self.specs.items()
        }
        chat = {b: get_benchmark(b).chat for b in self.benchmarks}
        self._ids = {
            p.id: encode_chat(tokenizer, p.prompt.text, f"problem {p.id!r}", chat=chat[p.benchmark])
            for p in self.problems
        }
        return self.pair.facts()

    def units(self) -> list:
        batch = self.spec.batch
        return [(k, s) for k in range(self.samples) for s in range(0, len(self.problems), batch)]

    def _group(self, unit):
        k, start = unit
        return k, self.problems[start : start + self.spec.batch]

    def unit_keys(self, unit) -> list:
        k, group = self._group(unit)
        return [(p.id, method, k) for method in self.methods for p in group]

    def key(self, record) -> tuple:
        return (record["id"], record["method"], record["sample"])

    def check_held(self, records) -> None:
        _same_problems(records, self.problems)

    @contextlib.contextmanager
    def running(self):
        from .._models._hf import model_threads_for

        with model_threads_for(self.pair.models(), self.threads) as (_, line):
            yield line

    def run_unit(self, unit, held) -> list:
        k, group = self._group(unit)
        setting = self.setting()
        tokenizer, records = self.pair.verifier[1], []
        for method in self.methods:
            todo = [p for p in group if (p.id, method, k) not in held]
            if not todo:
                continue
            seeds = [_method_seed(self.seed, p.id, method, k) for p in todo]
            results = self._decoders[method].generate([self._ids[p.id] for p in todo], seeds, self._eos)
            for p, s, res in zip(todo, seeds, results, strict=True):
                rec = _record(p, method, k, s, res, tokenizer, setting, self.program_seconds)
                if self.answer_rows and res.tokens:
                    rec.update(self._rows(self._ids[p.id], res.tokens))
                records.append(rec)
        return records

    def _rows(self, prompt_ids, tokens) -> dict:
        """Both models' kept rows at every position of one answer (``sequence_rows``), teacher-forced after it
        (one forward of prompt and answer per model), and the seconds they took."""
        import time

        from .._analysis._answer_rows import sequence_rows
        from .._models._dump import _forced_rows

        start = time.perf_counter()
        model, draft = self.pair.models()
        target, drafter = (_forced_rows(m, prompt_ids, tokens).float().cpu().numpy() for m in (model, draft))
        rows = sequence_rows(target, drafter, tokens, self.answer_rows)
        return {"rows": rows, "rows_seconds": time.perf_counter() - start}

    def summarize(self, records, *, n_boot=2000, seed=0):
        return summarize_records(records, n_boot=n_boot, seed=seed)

    @property
    def label(self) -> str:
        return "evaluate"


def evaluate_rules(
    verifier,
    draft,
    problems,
    rules,
    *,
    out=None,
    progress=None,
    client=None,
    **options,
) -> list:
    """Decode and grade ``problems`` (``load_problems``) with the verifier alone and each of ``rules``:
    the records (dicts: id, benchmark, method, sample, seed, token ids, text, correct, what was
    extracted, and for a rule its accepted counts and, with ``drift``, token_kl and answer_kl).
    ``SampledReferee`` run by ``run_study``; ``options`` are its keywords:

    ``verifier``: a (model, tokenizer, identity) triple (``load_model``); ``draft``: a model or its
    triple (its identity is recorded); or both as paths with ``load_options``. ``m`` drafts a step;
    ``settings`` the sampling (default: the paper's); ``batch`` problems decoded at once (either engine; at 1
    on llama.cpp, ``speculative_generate`` as ``decode`` runs it). Each answer has its own seed (from ``seed``,
    the problem, the method and the sample), so it does not depend on what else the run holds; whether it
    depends on ``batch``: not in float32 on the Hugging Face engine (tested: the same tokens at batch 1 and
    3), but in bfloat16 and float16 the batched kernels round with the batch's shape (padding, tiling), and on
    llama.cpp batches of another shape round differently too, so an answer can change with the batch there:
    compare runs of one batch size, or use float32. ``out``: a JSON Lines file the records are appended to as
    each batch completes (``RecordLog``); a rerun with the same setting skips the (problem, method, sample)
    it holds, and anything else is refused before decoding. ``timeout``: seconds a program under test may run
    (HumanEval, MBPP); those programs run only with ``allow_code_execution=True`` (or
    ``CACTUS_ALLOW_CODE_EXECUTION=1``), isolated by the operating system (``_util._sandbox``).
    ``benchmarks``: the benchmarks ``out`` is for (default: those of ``problems``), part of its setting: a
    run that pools several benchmarks in one file over several calls names them all. ``threads``: CPU threads
    of the forwards (default: the CPUs this process may use: ``model_threads_for``), said in the progress
    line. ``client``: a Dask client to spread the groups over (``verifier`` and ``draft`` then paths). Returns
    the records by sample, then method, then problem."""
    study = SampledReferee(verifier, draft, problems, rules, **options)
    records = run_study(study, out=out, progress=progress, client=client)
    order = {p.id: i for i, p in enumerate(study.problems)}
    return sorted(records, key=lambda r: (r["sample"], study.methods.index(r["method"]), order[r["id"]]))


def _record(problem, method, sample, seed, result, tokenizer, setting, timeout) -> dict:
    text = tokenizer.decode(result.tokens, skip_special_tokens=True)
    verdict = grade(problem, text, timeout=timeout, allow_code_execution=True)  # allowed: checked before decoding
    rec = {
        "id": problem.id,
        "problem": problem.digest,
        "benchmark": problem.benchmark,
        "method": method,
        "sample": int(sample),
        "seed": int(seed),
        "setting": setting,
        "token_ids": [int(t) for t in result.tokens],
        "tokens": len(result.tokens),
        "text": text,
        "correct": bool(verdict.correct),
        "extracted": verdict.extracted,
        "detail": verdict.detail,
    }
    if verdict.strict is not None:
        rec["correct_strict"], rec["correct_flexible"] = bool(verdict.strict), bool(verdict.flexible)
    if method != ALONE:
        rec["accepted"] = [int(a) for a in result.accepted]
        rec["drafted"] = [int(d) for d in result.drafted]
        if result.token_kl is not None:
            rec["token_kl"] = [float(x) for x in result.token_kl]
            rec["answer_kl"] = result.answer_kl
    return rec
