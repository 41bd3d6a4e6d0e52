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

import collections
import contextlib
import json
import os
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._data._benchmarks import get_benchmark
from .._data._graders import PROGRAM_SECONDS, grade, require_code_execution
from .._data._prompts import prompt_seed
from .._math._bootstrap import ratio_interval, resample_counts
from .._math._paired import paired_difference
from .._math._validation import RUN_LIMITS, check_count
from .._util._files import json_lines
from .._util._results import RowsResult
from .._util._study import Study, run_study
from ._exact_choice import _distinct_problems, _same_problems
from ._pair import ModelPair

__all__ = [
    "ALONE",
    "LIMITS",
    "QualitySummary",
    "SampledReferee",
    "check_evaluate_limits",
    "evaluate_rules",
    "quality_markdown",
    "read_records",
    "summarize_records",
]

#: The method name of the verifier decoding alone.
ALONE = "verifier alone"
#: The kind of record this referee writes (``RecordLog``).
KIND = "cactus-theory evaluate"
#: Fields a record must hold to be summarised, with the types they must have.
_FIELDS = {"id": str, "benchmark": str, "method": str, "sample": int, "correct": bool, "tokens": int}
#: The largest value of each count a run may ask for (``RUN_LIMITS``), checked before any model loads.
LIMITS = RUN_LIMITS


def _method_seed(seed, problem_id, method, sample) -> int:
    """The seed of one (problem, method, sample): from the run's seed and the three (``prompt_seed``)."""
    return prompt_seed(seed, f"{problem_id}|{method}|{sample}")


def read_records(path) -> list:
    """The records of a JSON Lines file written by ``evaluate_rules`` (plain or gzip-compressed), each
    checked for its fields and their types (``correct`` a JSON boolean, ``sample`` and ``tokens``
    non-negative integers): a bad one is a ValueError naming the file and the line."""
    out = []
    for n, rec in json_lines(path, "a record of cactus-theory evaluate"):
        if not isinstance(rec, dict) or any(k not in rec for k in _FIELDS):
            raise ValueError(f"{path}, line {n}: not a record of cactus-theory evaluate (it needs {list(_FIELDS)})")
        for key, kind in _FIELDS.items():
            value = rec[key]
            good = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
            if not good or (kind is int and value < 0):
                want = {bool: "true or false", int: "an integer >= 0", str: "a string"}[kind]
                raise ValueError(f"{path}, line {n}: {key!r} must be {want}; got {json.dumps(value)}")
        out.append(rec)
    return out


def check_evaluate_limits(*, m=8, max_new_tokens=512, batch=1, samples=1) -> None:
    """Each count an integer between 1 and its ``LIMITS`` bound (one ValueError line naming it)."""
    for name, value in (("m", m), ("max_new_tokens", max_new_tokens), ("batch", batch), ("samples", samples)):
        check_count(value, name)


def _setting(m, settings, max_new_tokens, seed, models, arithmetic, benchmarks, timeout) -> dict:
    """What decides every answer of a run besides its (problem, method, sample): the models (each one's
    identity), their arithmetic (engine, dtype), the sampling, lengths, seed, benchmarks and the programs'
    time limit. Records of another setting are never mixed with this run's."""
    return {
        "m": int(m),
        "sampling": settings.as_dict(),
        "max_new_tokens": int(max_new_tokens),
        "seed": int(seed),
        "models": models,
        "arithmetic": arithmetic,
        "benchmarks": benchmarks,
        "program_seconds": float(timeout),
    }


class SampledReferee(Study):
    """The sampled referee as a study (``run_study``): a unit is one group of ``batch`` problems at one sample,
    every method on it (so a stopped run holds paired answers of every method on the problems it reached);
    its records, one per (problem, method, sample), as ``evaluate_rules`` describes them. ``verifier``,
    ``draft``: loaded, or paths / ids with ``load_options`` (a Dask worker loads them once)."""

    kind: ClassVar[str] = KIND
    unit_name: ClassVar[str] = "group"

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
    ):
        from .._models._decode_spec import DecodeSpec

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
        self.problems, self.spec, self.samples, self.seed = list(problems), spec, int(samples), int(seed)
        self.timeout, self.threads = timeout, threads
        self.pair = ModelPair(verifier, draft, load_options)
        self._decoders = None

    def setting(self) -> dict:
        from .._models._hf import model_arithmetic, split_model

        model = self.pair.verifier[0]
        draft, draft_identity = split_model(self.pair.draft)
        arithmetic = {"verifier": model_arithmetic(model), "draft": model_arithmetic(draft)}
        models = {"verifier": split_model(tuple(self.pair.verifier))[1], "draft": draft_identity}
        spec = self.spec
        self._setting = _setting(
            spec.m, spec.settings, spec.max_new_tokens, self.seed, models, arithmetic, self.benchmarks, self.timeout
        )
        self._ready()
        return self._setting

    def _ready(self):
        """The decoders and the prompts' ids, made once in the process that runs the units."""
        if getattr(self, "_decoders", None) is not None:
            return
        from .._models._decoding import decoder_for
        from .._models._hf import encode_chat, eos_ids, split_model

        model, tokenizer = self.pair.verifier[0], self.pair.verifier[1]
        draft = split_model(self.pair.draft)[0]
        self._eos = eos_ids(model, tokenizer)
        self._decoders = {
            method: decoder_for(s, model, draft if s.rule is not None else None) for method, s in self.specs.items()
        }
        chat = {b: get_benchmark(b).chat for b in self.benchmarks}
        self._ids = {
            p.id: encode_chat(tokenizer, p.prompt.text, f"problem {p.id!r}", chat=chat[p.benchmark])
            for p in self.problems
        }

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
        from .._models._hf import model_threads_for, split_model

        with model_threads_for([self.pair.verifier[0], split_model(self.pair.draft)[0]], self.threads) as (_, line):
            yield line

    def run_unit(self, unit, held) -> list:
        if not hasattr(self, "_setting"):  # on a worker: the setting was asked of another
            self.setting()
        k, group = self._group(unit)
        tokenizer, records = self.pair.verifier[1], []
        for method in self.methods:
            todo = [p for p in group if (p.id, method, k) not in held]
            if not todo:
                continue
            seeds = [_method_seed(self.seed, p.id, method, k) for p in todo]
            results = self._decoders[method].generate([self._ids[p.id] for p in todo], seeds, self._eos)
            records += [
                _record(p, method, k, s, res, tokenizer, self._setting, self.timeout)
                for p, s, res in zip(todo, seeds, results, strict=True)
            ]
        return records

    def summarize(self, records):
        return summarize_records(records)

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


@dataclass(frozen=True)
class QualitySummary(RowsResult):
    """Per benchmark and method: the paired comparison with the verifier alone (``rows``: dicts), and the
    problems and samples it covers; a study result as every other (``records``, ``table``, ``markdown``,
    ``write``)."""

    rows: list
    problems: dict
    samples: int

    name = "quality"

    def render(self) -> str:
        return quality_markdown(self)


def _scores(records, method, problems, key="correct"):
    """Per problem, the share of its samples of ``method`` graded correct (NaN where it has none)."""
    by = {}
    for r in records:
        if r["method"] == method and key in r:
            by.setdefault(r["id"], []).append(float(bool(r[key])))
    return np.array([np.mean(by[p]) if p in by else np.nan for p in problems])


def summarize_records(records, *, n_boot=2000, seed=0) -> QualitySummary:
    """The referee's summary from records alone (``evaluate_rules``'s list, or the path of the JSON Lines
    file it wrote): per benchmark (and "all", the benchmarks' problems pooled, when there are several),
    every method's accuracy and, for each rule, its paired difference from the verifier alone on the
    problems both decoded (interval, McNemar at one sample, problems needed for +-1 and +-2 points), with
    GSM8K's strict and flexible extractions beside its score, and the drift each rule spent on those
    answers (KL per emitted token and per answer, intervals over problems)."""
    if isinstance(records, (str, os.PathLike)):
        records = read_records(records)
    if not records:
        raise ValueError("records: none to summarise")
    rows, covered, samples = [], {}, 1 + max(int(r["sample"]) for r in records)
    benches = sorted({r["benchmark"] for r in records})
    for bench in benches:
        mine = [r for r in records if r["benchmark"] == bench]
        covered[bench] = _rows(bench, mine, rows, n_boot, seed)
    if len(benches) > 1:  # every problem once, its id made unique by its benchmark
        pooled = [{**r, "id": f"{r['benchmark']}/{r['id']}"} for r in records]
        covered["all"] = _rows("all", pooled, rows, n_boot, seed)
    return QualitySummary(rows, covered, samples)


def _rows(bench, mine, rows, n_boot, seed) -> int:
    """Append the rows of one benchmark's records to ``rows``; the problems the verifier alone decoded."""
    methods = list(dict.fromkeys(r["method"] for r in mine))
    if ALONE not in methods:
        raise ValueError(f"records of {bench}: none of the verifier alone, the reference of every comparison")
    base_ids = {r["id"] for r in mine if r["method"] == ALONE}
    answers = collections.Counter((r["method"], r["id"]) for r in mine)
    for method in [ALONE, *(x for x in methods if x != ALONE)]:
        ids = sorted({r["id"] for r in mine if r["method"] == method} & base_ids)
        if not ids:
            continue
        one = all(answers[(method, i)] == 1 and answers[(ALONE, i)] == 1 for i in ids)
        score, ref = _scores(mine, method, ids), _scores(mine, ALONE, ids)
        comparison = paired_difference(ids, score, ref, n_boot=n_boot, seed=seed, single_sample=one)
        row = {
            "benchmark": bench,
            "method": method,
            "problems": len(ids),
            "accuracy": comparison.accuracy,
            "difference": comparison.difference,
            "low": comparison.low,
            "high": comparison.high,
            "mcnemar_p": comparison.mcnemar_p,
            "discordant": list(comparison.discordant),
            "needed_1": comparison.needed_1,
            "needed_2": comparison.needed_2,
            "verdict": "reference" if method == ALONE else comparison.verdict,
        }
        for key in ("strict", "flexible"):
            alone = _scores(mine, method, ids, f"correct_{key}")
            if np.all(np.isfinite(alone)):
                row[f"accuracy_{key}"] = float(np.mean(alone))
        if method != ALONE:
            row.update(_drift(mine, method, ids, n_boot, seed))
        rows.append(row)
    return len(base_ids)


def _drift(records, method, ids, n_boot, seed) -> dict:
    """KL per emitted token and per answer of ``method``'s answers (per problem: summed over its samples),
    with bootstrap intervals over problems; {} when the records hold no drift."""
    kl, tokens, answers = np.zeros(len(ids)), np.zeros(len(ids)), np.zeros(len(ids))
    index = {p: i for i, p in enumerate(ids)}
    seen = False
    for r in records:
        if r["method"] == method and r["id"] in index and r.get("token_kl") is not None:
            i = index[r["id"]]
            kl[i] += float(np.sum(r["token_kl"]))
            tokens[i] += len(r["token_kl"])
            answers[i] += 1
            seen = True
    if not seen:
        return {}
    counts = resample_counts(ids, n_boot, seed)
    per_token = ratio_interval(kl, tokens, counts)
    per_answer = ratio_interval(kl, answers, counts)
    return {
        "kl_per_token": per_token[0],
        "kl_per_token_lo": per_token[1],
        "kl_per_token_hi": per_token[2],
        "answer_kl": per_answer[0],
        "answer_kl_lo": per_answer[1],
        "answer_kl_hi": per_answer[2],
    }


def _pct(x) -> str:
    return f"{100 * x:.1f}" if np.isfinite(x) else "-"


def quality_markdown(summary: QualitySummary) -> str:
    """The summary as a Markdown table: per benchmark and method, accuracy (GSM8K: the score, then strict /
    flexible alone), the
    paired difference from the verifier alone with its 95% interval (points), the verdict, McNemar's p,
    the problems a +-1 / +-2 point interval would need, and the drift per token and per answer."""
    lines = [
        "| benchmark | method | problems | accuracy % | difference, points [95%] | verdict | McNemar p | "
        "problems for +-1 / +-2 pts | KL / token | KL / answer [95%] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary.rows:
        acc = _pct(r["accuracy"])
        if "accuracy_strict" in r:
            acc += f" ({_pct(r['accuracy_strict'])} / {_pct(r['accuracy_flexible'])})"
        if r["method"] == ALONE:
            diff, verdict, p, need = "-", "reference", "-", "-"
        else:
            diff = f"{100 * r['difference']:+.1f} [{100 * r['low']:+.1f}, {100 * r['high']:+.1f}]"
            verdict = r["verdict"]
            p = f"{r['mcnemar_p']:.3g}" if r["mcnemar_p"] is not None else "- (K > 1)"
            if not np.isfinite(r["needed_1"]):
                need = "-"
            elif r["needed_1"] == 0:  # the same difference on every problem: no spread to scale an interval by
                need = "- (no spread)"
            else:
                need = f"{r['needed_1']:,.0f} / {r['needed_2']:,.0f}"
        kl = f"{r['kl_per_token']:.4f}" if "kl_per_token" in r else "-"
        answer = f"{r['answer_kl']:.3f} [{r['answer_kl_lo']:.3f}, {r['answer_kl_hi']:.3f}]" if "answer_kl" in r else "-"
        lines.append(
            f"| {r['benchmark']} | {r['method']} | {r['problems']} | {acc} | {diff} | {verdict} | {p} | "
            f"{need} | {kl} | {answer} |"
        )
    return "\n".join(lines)
