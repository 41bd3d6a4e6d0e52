"""The exact quality referee, where one token decides: for a multiple-choice problem asked at the answer
position (the prompt ends in "Answer:", the next token is the letter: ``_data._benchmarks.choice``), each
method's expected accuracy is the mass its law of that token puts on the correct letter, computed without
sampling.

- The verifier alone: q(correct letter), q the verifier's processed row (the run's temperature, top-k,
  top-p) at the answer position.
- A token rule: pi(correct letter), pi = the exact law the rule emits the answer token from
  (``emitted_distribution`` of ``rule.at_slot(0)`` over the draft's processed row p there): the first
  position of a block, where the draft is judged by the rule, its correction drawn on a rejection; the
  tokens after it do not change the grade.
- Mass on any other token (another letter, a space, "The") counts as wrong, as in lm-evaluation-harness's
  exact match on the generated letter. A letter's tokens are every single token that reads as it, with or
  without a leading space (``letter_token_ids``: `` A`` and ``A``).

One prompt pass per model per problem (``teacher_forced_logits``). Each problem's paired difference
(pi(c) - q(c)) is exact; the interval of the mean difference comes from the problems alone (the paired
bootstrap of ``_math._paired``, the same as the sampled referee's; a difference within ``ROUNDING``, 1e-12,
the float64 rounding of the laws, counts as none, so a lossless rule's is exactly 0). Beside each method the
drift it spends at the answer token, KL(pi || q) and TV(pi, q). Records (one per problem and method) go through a
``RecordLog`` (``KIND``); ``summarize_exact`` recomputes the table from them alone. Block and multi-draft
rules are refused: their first token's law is not a per-token law.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._data._benchmarks import get_benchmark
from .._data._benchmarks.choice import LETTERS
from .._math._bootstrap import percentile_interval, resample_counts, resampled_sums
from .._math._paired import paired_difference
from .._math._sampling import SamplingSettings
from .._math._validation import check_int, is_integer
from .._rules._protocol import judgement_of
from .._util._files import json_lines
from .._util._records import setting_difference
from .._util._results import RowsResult
from .._util._study import Study, run_study
from ._pair import ModelPair
from ._quality_trace import ANSWER_ROWS, answer_rows

__all__ = [
    "KIND",
    "ExactReferee",
    "ExactSummary",
    "exact_answer_accuracy",
    "exact_choice_referee",
    "letter_token_ids",
    "read_exact_records",
    "rescore_exact",
    "summarize_exact",
]

#: The kind of record the exact referee writes (``RecordLog``).
KIND = "cactus-theory evaluate --exact"
#: The method name of the verifier alone.
ALONE = "verifier alone"
#: Differences of a problem's exact accuracies this small are the laws' float64 rounding, not a difference.
ROUNDING = 1e-12
_FIELDS = {"id": str, "benchmark": str, "method": str, "accuracy": float, "kl": float, "tv": float}


def letter_token_ids(tokenizer, letters=LETTERS) -> dict:
    """{letter: sorted ids of the single tokens that read as that letter} (with a leading space, as
    lm-evaluation-harness's target `` A`` is tokenized after "Answer:", and without). A letter no single
    token reads as is a ValueError (the exact referee would count its answers wrong)."""
    out = {}
    for letter in letters:
        ids = set()
        for text in (" " + letter, letter):
            enc = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(enc) == 1 and tokenizer.decode(enc).strip() == letter:
                ids.add(int(enc[0]))
        if not ids:
            raise ValueError(f"no single token of this tokenizer reads as the letter {letter!r}")
        out[letter] = sorted(ids)
    return out


def exact_answer_accuracy(rule, draft_probs, target_probs, correct_ids, *, logits=None) -> dict:
    """The exact expected accuracy at the answer position: ``target_probs`` (q) mass on ``correct_ids``
    for the verifier alone (``rule`` None), else the mass of the law ``rule`` emits the position from
    (its slot-0 law over ``draft_probs``, p), with the drift it spends there: {"accuracy", "kl", "tv"}
    (float64; KL(pi || q) in nats)."""
    from .._laws._emitted import emitted_distribution
    from .._rules._protocol import judgement_of

    q = np.asarray(target_probs, dtype=np.float64)
    q = q / q.sum()
    correct = np.asarray(sorted(set(int(i) for i in correct_ids)), dtype=np.int64)
    if rule is None:
        return {"accuracy": float(q[correct].sum()), "kl": 0.0, "tv": 0.0}
    if not judgement_of(rule).per_token:
        raise ValueError(
            f"{rule.describe()} judges whole blocks or several drafts: the exact referee needs a token rule's law"
        )
    p = np.asarray(draft_probs, dtype=np.float64)
    p = p / p.sum()
    pi = np.asarray(emitted_distribution(rule.at_slot(0), p, q, logits=logits), dtype=np.float64)
    support = pi > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = float(np.sum(pi[support] * (np.log(pi[support]) - np.log(q[support]))))
    # a KL is never negative: a lossless rule's pi equals q to rounding, whose sum can fall a hair below 0
    return {"accuracy": float(pi[correct].sum()), "kl": max(kl, 0.0), "tv": float(0.5 * np.abs(pi - q).sum())}


def read_exact_records(path) -> list:
    """The records of a file the exact referee wrote (plain or gzip), each checked for its fields."""
    out = []
    for n, rec in json_lines(path, "a record of cactus-theory evaluate --exact"):
        if not isinstance(rec, dict) or rec.get("record", KIND) != KIND:
            raise ValueError(f"{path}, line {n}: not a record of cactus-theory evaluate --exact")
        for key, kind in _FIELDS.items():
            value = rec.get(key)
            good = isinstance(value, kind) or (kind is float and is_integer(value))
            if not good or (kind is float and not np.isfinite(value) and key != "kl"):
                raise ValueError(f"{path}, line {n}: {key!r} must be {'a number' if kind is float else 'a string'}")
        out.append(rec)
    return out


class ExactReferee(Study):
    """The exact referee as a study (``run_study``): one unit per problem, the records of the verifier alone and
    of each rule of ``rules`` there (see the module docstring); the verifier alone's carries the problem's
    answer rows (``_quality_trace``), from which any token rule under any chain is scored again without a model.

    ``verifier``, ``draft``: loaded ((model, tokenizer, identity) triples, or a bare draft model), or paths /
    ids with ``load_options`` (``load_model``'s; a Dask worker loads them once). ``settings``: the sampling and
    its chain (default: the paper's, vLLM's chain). ``threads``: CPU threads of the forwards (default: the CPUs
    this process may use; ``model_threads_for``), said in the progress line."""

    kind: ClassVar[str] = KIND
    unit_name: ClassVar[str] = "problem"

    def __init__(
        self, verifier, draft, problems, rules, *, settings=None, threads=None, load_options=None, rows=ANSWER_ROWS
    ):
        from .._models._decode_spec import DecodeSpec

        self.settings = settings or SamplingSettings()
        if not problems:
            raise ValueError("problems: give at least one problem (load_problems)")
        for bench in sorted({p.benchmark for p in problems}):
            if not get_benchmark(bench).one_token:
                raise ValueError(
                    f"benchmark {bench!r}: the exact referee needs one token to decide the grade (a multiple-choice "
                    "benchmark asked at the answer position: choice, arc_challenge, ...); grade it by sampling instead"
                )
        self.problems = list(problems)
        _distinct_problems(self.problems)
        base = DecodeSpec(settings=self.settings)
        self.specs = [base.with_rule(r) for r in rules]
        for spec in self.specs:  # block and multi-draft rules refused up front
            if not judgement_of(spec.rule).per_token:
                raise ValueError(
                    f"{spec.rule.describe()} judges whole blocks or several drafts: the exact referee needs a token "
                    "rule's law"
                )
        self.methods = [ALONE, *(s.label for s in self.specs)]
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"the rules must be distinct; got {self.methods[1:]}")
        self.threads, self.rows = threads, check_int(rows, "rows", 1, what="logits kept per model and problem")
        self.pair = ModelPair(verifier, draft, load_options)
        self._rows = None

    def setting(self) -> dict:
        from .._models._hf import model_arithmetic, split_model

        model, tokenizer = self.pair.verifier[0], self.pair.verifier[1]
        draft, draft_identity = split_model(self.pair.draft)
        needed = sorted({c for p in self.problems for c in p.reference.get("letters", p.reference["answer"])})
        self._letters = letter_token_ids(tokenizer, "".join(needed))
        return {
            "sampling": self.settings.as_dict(),
            "models": {"verifier": split_model(tuple(self.pair.verifier))[1], "draft": draft_identity},
            "arithmetic": {"verifier": model_arithmetic(model), "draft": model_arithmetic(draft)},
            "benchmarks": sorted({p.benchmark for p in self.problems}),
            "answer_tokens": dict(self._letters),
            "answer_rows": self.rows,
        }

    def units(self) -> list:
        return self.problems

    def unit_keys(self, problem) -> list:
        return [(problem.id, method) for method in self.methods]

    def key(self, record) -> tuple:
        return (record["id"], record["method"])

    def check_held(self, records) -> None:
        _same_problems(records, self.problems)

    @contextlib.contextmanager
    def running(self):
        from .._models._hf import model_threads_for, split_model

        models = [self.pair.verifier[0], split_model(self.pair.draft)[0]]
        with model_threads_for(models, self.threads) as (used, line):
            self._used = used
            yield line

    def run_unit(self, problem, held) -> list:
        from .._math._logits import RuleLogits
        from .._math._sampling import processed_probs
        from .._models._hf import encode_chat, split_model
        from .._models._prefix import NextTokenLogits

        if not hasattr(self, "_letters"):  # on a worker: the setting was asked of another
            self.setting()
        if getattr(self, "_rows", None) is None:
            self._rows = (NextTokenLogits(self.pair.verifier[0]), NextTokenLogits(split_model(self.pair.draft)[0]))
        tokenizer, settings = self.pair.verifier[1], self.settings
        ids = encode_chat(tokenizer, problem.prompt.text, f"problem {problem.id!r}", chat=False)
        q_raw, p_raw = self._rows[0](ids), self._rows[1](ids)
        q = np.asarray(processed_probs(q_raw[None], settings)[0], dtype=np.float64)
        p = np.asarray(processed_probs(p_raw[None], settings)[0], dtype=np.float64)
        answer = problem.reference["answer"]
        correct = self._letters[answer]
        own = problem.reference.get("letters", answer)
        records = []
        for method, spec in zip(self.methods, [None, *self.specs], strict=True):
            if (problem.id, method) in held:
                continue
            rule = None if spec is None else spec.rule
            logits = None
            if rule is not None and rule.needs_logits:
                logits = RuleLogits(target=q_raw, draft=p_raw, temperature=settings.temperature)
            law = exact_answer_accuracy(rule, p, q, correct, logits=logits)
            records.append(
                {
                    "id": problem.id,
                    "problem": problem.digest,
                    "benchmark": problem.benchmark,
                    "method": method,
                    "answer": answer,
                    **law,
                    "q_correct": float(q[correct].sum()),
                    "p_correct": float(p[correct].sum()),
                    "q_letters": float(q[[i for c in own for i in self._letters[c]]].sum()),
                    "prompt_tokens": len(ids),
                    "threads": getattr(self, "_used", None),
                    # what rescoring needs: the rows' tops and their log-sum-exps, beside the correct ids
                    **({"rows": answer_rows(q_raw, p_raw, correct, self.rows)} if spec is None else {}),
                }
            )
        return records

    def summarize(self, records):
        return summarize_exact(records)

    def close(self) -> None:
        if getattr(self, "_rows", None) is not None:
            for row in self._rows:
                row.close()
            self._rows = None

    @property
    def label(self) -> str:
        return "exact referee"


def _distinct_problems(problems) -> None:
    """Two different problems under one id are refused."""
    by_id = {}
    for p in problems:
        if by_id.setdefault(p.id, p.digest) != p.digest:
            raise ValueError(f"problems: two different problems share the id {p.id!r}")


def _same_problems(records, problems) -> None:
    """A held record whose id names another problem than this run's (another file of the same benchmark) is
    refused."""
    by_id = {p.id: p.digest for p in problems}
    for n, rec in enumerate(records, 1):
        if rec.get("id") in by_id and rec.get("problem") != by_id[rec["id"]]:
            raise ValueError(
                f"the records file holds answers to another problem under the id {rec['id']!r} (record {n}; another "
                "--file?): write to another file"
            )


def rescore_exact(records, rules, *, settings=None) -> list:
    """The exact referee's records of ``rules`` (token rules: specs or objects) under ``settings`` (the
    sampling and its chain; default: the records' own), scored again from the answer rows the verifier
    alone's records keep (``_quality_trace``), without a model: one record per problem and method, the
    verifier alone's first, as ``exact_choice_referee`` makes them (its accuracy, KL and TV to 1e-12 of the
    model run's, where the run's sampling is the same). ``records``: a list or the path of a records file.
    Their setting is kept but for its ``sampling``, and ``rescored`` (the sampling the rows were made with)."""
    from .._rules._registry import as_rule
    from ._quality_trace import read_answer_rows, rescored_laws

    if not isinstance(records, list):
        records = read_exact_records(records)
    alone = [r for r in records if r.get("method") == ALONE]
    if not alone:
        raise ValueError("records: none of the verifier alone, whose records keep the answer rows")
    missing = [r["id"] for r in alone if "rows" not in r]
    if missing:
        raise ValueError(
            f"records: {len(missing)} problem(s) (the first {missing[0]!r}) keep no answer rows (records made before "
            "the referee kept them): run the referee again to rescore them"
        )
    source = alone[0].get("setting") or {}
    made = SamplingSettings.from_dict(source.get("sampling"), "the records' setting.sampling")
    settings = settings or made
    rules = [as_rule(r) for r in rules]
    methods = [ALONE, *(r.describe() for r in rules)]
    if len(set(methods)) != len(methods):
        raise ValueError(f"the rules must be distinct; got {methods[1:]}")
    rows = [read_answer_rows(r["rows"], f"record of {r['id']!r}") for r in alone]
    vocabularies = sorted({r.vocab for r in rows})
    if len(vocabularies) > 1:  # another tokenizer's rows among them: never scored together
        other = next(rec["id"] for rec, r in zip(alone, rows, strict=True) if r.vocab != rows[0].vocab)
        raise ValueError(
            f"records: rows of vocabularies of {vocabularies} tokens (the first of another size: {other!r}): records "
            "of different tokenizers are never rescored together; rescore each model pair's records apart"
        )
    other = next((r for r in alone if (r.get("setting") or {}) != source), None)
    if other is not None:  # records of another run among them (another pair, sampling or benchmark)
        raise ValueError(
            f"records: the verifier alone's records hold different settings ({other['id']!r} against "
            f"{alone[0]['id']!r}: {setting_difference(source, other.get('setting') or {})}): rescore each run's "
            "records apart"
        )
    laws = rescored_laws(rows, rules, settings)
    setting = {**source, "sampling": settings.as_dict(), "rescored": made.as_dict()}
    out = []
    for i, rec in enumerate(alone):
        base = {k: rec[k] for k in ("id", "problem", "benchmark", "answer", "prompt_tokens") if k in rec}
        common = {
            "q_correct": float(laws[ALONE]["accuracy"][i]),
            "p_correct": float(laws[ALONE]["p_correct"][i]),
        }
        for method in methods:
            law = {k: float(laws[method][k][i]) for k in ("accuracy", "kl", "tv")}
            out.append({"record": KIND, **base, "method": method, **law, **common, "setting": setting})
    return out


def exact_choice_referee(
    verifier,
    draft,
    problems,
    rules,
    *,
    settings=None,
    out=None,
    progress=None,
    threads=None,
    client=None,
    load_options=None,
    rows=ANSWER_ROWS,
) -> list:
    """The exact expected accuracy of the verifier alone and of each token rule of ``rules`` on
    ``problems`` (``load_problems`` of a benchmark whose one token decides: ``choice``, ``arc_challenge``, ...),
    without sampling (see the module docstring): one record per problem and method (id, problem digest,
    method, accuracy, the drift at the answer token, and the mass p and q put on the correct letter; the
    verifier alone's with the answer rows). ``ExactReferee`` run by ``run_study``: ``out`` a records file
    (resumed, refused when it holds another setting), ``client`` a Dask client to spread the problems over
    (``verifier`` and ``draft`` then paths, loaded on each worker with ``load_options``); ``rows``: the logits
    kept per model at each answer position (``ANSWER_ROWS``). Returns the records, problems in order, methods in
    order."""
    study = ExactReferee(
        verifier, draft, problems, rules, settings=settings, threads=threads, load_options=load_options, rows=rows
    )
    return run_study(study, out=out, progress=progress, client=client)


@dataclass(frozen=True)
class ExactSummary(RowsResult):
    """Per benchmark and method: the exact expected accuracy, the paired difference from the verifier alone
    with its 95% interval over problems, and the drift at the answer token (``rows``: dicts)."""

    rows: list
    problems: dict

    name = "quality_exact"

    def render(self) -> str:
        return exact_markdown(self)


def summarize_exact(records, *, n_boot=2000, seed=0) -> ExactSummary:
    """The exact referee's summary from its records alone (a list, or the path of its file): per benchmark
    (and "all" where there are several) and method, the mean exact accuracy, the mean paired difference
    from the verifier alone with the paired bootstrap's 95% interval over problems, the problems a +-0.5 and
    +-1 point interval would need at the spread observed, and the mean KL(pi || q) and TV at the answer
    token with their intervals."""
    if not isinstance(records, list):
        records = read_exact_records(records)
    if not records:
        raise ValueError("records: none to summarise")
    rows, covered = [], {}
    benches = sorted({r["benchmark"] for r in records})
    groups = [(b, [r for r in records if r["benchmark"] == b]) for b in benches]
    if len(benches) > 1:
        groups.append(("all", [{**r, "id": f"{r['benchmark']}/{r['id']}"} for r in records]))
    for bench, mine in groups:
        by = {}
        for r in mine:
            by.setdefault(r["method"], {})[r["id"]] = r
        if ALONE not in by:
            raise ValueError(f"records of {bench}: none of the verifier alone, the reference of every comparison")
        base = by[ALONE]
        covered[bench] = len(base)
        for method, recs in [(ALONE, base), *((m, v) for m, v in by.items() if m != ALONE)]:
            ids = sorted(set(recs) & set(base))
            score = np.array([recs[i]["accuracy"] for i in ids])
            ref = np.array([base[i]["accuracy"] for i in ids])
            # float64 rounding of a law (a lossless rule's pi is q to ~1e-16) is no difference
            score = np.where(np.abs(score - ref) <= ROUNDING, ref, score)
            cmp = paired_difference(ids, np.clip(score, 0, 1), np.clip(ref, 0, 1), n_boot=n_boot, seed=seed)
            row = {
                "benchmark": bench,
                "method": method,
                "problems": len(ids),
                "accuracy": float(score.mean()),
                "difference": float((score - ref).mean()),
                "low": cmp.low,
                "high": cmp.high,
                "verdict": "reference" if method == ALONE else cmp.verdict,
                "needed_half": float(cmp.needed_1 * 4),
                "needed_1": cmp.needed_1,
            }
            for key in ("kl", "tv"):  # never negative: rounding below 0 (records of earlier versions) reads as 0
                values = np.maximum(np.array([recs[i][key] for i in ids], dtype=np.float64), 0.0)
                row[key] = float(values.mean())
                counts = resample_counts(ids, n_boot, seed)
                if counts is not None and np.all(np.isfinite(values)):
                    (sums,) = resampled_sums(counts, values)
                    row[f"{key}_lo"], row[f"{key}_hi"] = percentile_interval(sums / len(ids))
                else:
                    row[f"{key}_lo"] = row[f"{key}_hi"] = float("nan")
            rows.append(row)
    return ExactSummary(rows, covered)


def _pts(x, sign=False) -> str:
    if not np.isfinite(x):
        return "-"
    return f"{100 * x:+.2f}" if sign else f"{100 * x:.2f}"


def exact_markdown(summary: ExactSummary) -> str:
    """The exact summary as a Markdown table: per benchmark and method, the exact accuracy (%), the paired
    difference from the verifier alone with its 95% interval (points), the verdict, the problems a +-0.5 /
    +-1 point interval would need, and the drift at the answer token (KL, TV, with intervals)."""
    lines = [
        "| benchmark | method | problems | exact accuracy % | difference, points [95%] | verdict | "
        "problems for +-0.5 / +-1 pts | KL at the answer token [95%] | TV [95%] |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary.rows:
        if r["method"] == ALONE:
            diff, verdict, need = "-", "reference", "-"
        else:
            diff = f"{_pts(r['difference'], True)} [{_pts(r['low'], True)}, {_pts(r['high'], True)}]"
            verdict = r["verdict"]
            need = "- (no spread)" if r["needed_1"] == 0 else f"{r['needed_half']:,.0f} / {r['needed_1']:,.0f}"
            if not np.isfinite(r["needed_1"]):
                need = "-"
        kl = f"{r['kl']:.4f} [{r['kl_lo']:.4f}, {r['kl_hi']:.4f}]" if np.isfinite(r["kl_lo"]) else f"{r['kl']:.4f}"
        tv = f"{r['tv']:.4f} [{r['tv_lo']:.4f}, {r['tv_hi']:.4f}]" if np.isfinite(r["tv_lo"]) else f"{r['tv']:.4f}"
        lines.append(
            f"| {r['benchmark']} | {r['method']} | {r['problems']} | {_pts(r['accuracy'])} | {diff} | {verdict} | "
            f"{need} | {kl} | {tv} |"
        )
    return "\n".join(lines)
