"""What the quality referees' records say, without a model: each referee's records read and checked
(``read_exact_records``: the exact referee's, one per problem and method; ``read_records``: the sampled referee's,
one per problem, method and sample), and one paired summary for both (``paired_summary``): per benchmark (and
"all", the benchmarks' problems pooled with their ids made unique, where there are several) and method, the
method's accuracy and its paired difference from the verifier alone on the problems both hold, with the paired
bootstrap's 95% interval over problems (``_math._paired``), beside what each referee adds: the exact referee the
drift at the answer token (``summarize_exact``), the sampled one McNemar's test, GSM8K's two extractions and the
drift along the answers (``summarize_records``).
"""

from __future__ import annotations

import collections
import json
import os
from dataclasses import dataclass

import numpy as np

from .._math._bootstrap import percentile_interval, ratio_interval, resample_counts, resampled_sums
from .._math._paired import paired_difference
from .._math._validation import is_integer
from .._util._files import json_lines
from .._util._results import RowsResult

__all__ = [
    "ALONE",
    "EXACT_KIND",
    "ROUNDING",
    "SAMPLED_KIND",
    "ExactSummary",
    "QualitySummary",
    "exact_markdown",
    "paired_summary",
    "quality_markdown",
    "read_exact_records",
    "read_records",
    "summarize_exact",
    "summarize_records",
]

#: The method name of the verifier alone, the reference of every comparison.
ALONE = "verifier alone"
#: The kind of record the exact referee writes (``RecordLog``).
EXACT_KIND = "cactus-theory evaluate --exact"
#: The kind of record the sampled referee writes (``RecordLog``).
SAMPLED_KIND = "cactus-theory evaluate"
#: Differences of a problem's exact accuracies this small are the laws' float64 rounding, not a difference.
ROUNDING = 1e-12
_EXACT_FIELDS = {"id": str, "benchmark": str, "method": str, "accuracy": float, "kl": float, "tv": float}
_SAMPLED_FIELDS = {"id": str, "benchmark": str, "method": str, "sample": int, "correct": bool, "tokens": int}


def read_exact_records(path) -> list:
    """The records of a file the exact referee wrote (plain or gzip), each checked for its fields."""
    out = []
    for n, rec in json_lines(path, "a record of cactus-theory evaluate --exact"):
        if not isinstance(rec, dict) or rec.get("record", EXACT_KIND) != EXACT_KIND:
            raise ValueError(f"{path}, line {n}: not a record of cactus-theory evaluate --exact")
        for key, kind in _EXACT_FIELDS.items():
            value = rec.get(key)
            good = isinstance(value, kind) or (kind is float and is_integer(value))
            if not good or (kind is float and not np.isfinite(value) and key != "kl"):
                raise ValueError(f"{path}, line {n}: {key!r} must be {'a number' if kind is float else 'a string'}")
        out.append(rec)
    return out


def read_records(path) -> list:
    """The records of a JSON Lines file written by ``evaluate_rules`` (plain or gzip-compressed), each
    checked for its fields and their types (``correct`` a JSON boolean, ``sample`` and ``tokens``
    non-negative integers): a bad one is a ValueError naming the file and the line."""
    out = []
    for n, rec in json_lines(path, "a record of cactus-theory evaluate"):
        if not isinstance(rec, dict) or any(k not in rec for k in _SAMPLED_FIELDS):
            raise ValueError(
                f"{path}, line {n}: not a record of cactus-theory evaluate (it needs {list(_SAMPLED_FIELDS)})"
            )
        for key, kind in _SAMPLED_FIELDS.items():
            value = rec[key]
            good = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
            if not good or (kind is int and value < 0):
                want = {bool: "true or false", int: "an integer >= 0", str: "a string"}[kind]
                raise ValueError(f"{path}, line {n}: {key!r} must be {want}; got {json.dumps(value)}")
        out.append(rec)
    return out


def paired_summary(records, row_of) -> tuple:
    """(rows, {benchmark: problems the verifier alone holds}) of a paired referee's records: per benchmark (and
    "all" where there are several, each problem once, its id made unique by its benchmark) and method, the
    verifier alone first, the row ``row_of(method, ids, of, alone)`` gives (``of``, ``alone``: that method's and
    the verifier alone's records of the benchmark; ``ids``: the problems both hold, sorted) after the benchmark,
    method and problem count. A method that shares no problem with the verifier alone has no row; a benchmark
    without the verifier alone is a ValueError."""
    if not records:
        raise ValueError("records: none to summarise")
    benches = sorted({r["benchmark"] for r in records})
    groups = [(b, [r for r in records if r["benchmark"] == b]) for b in benches]
    if len(benches) > 1:
        groups.append(("all", [{**r, "id": f"{r['benchmark']}/{r['id']}"} for r in records]))
    rows, covered = [], {}
    for bench, mine in groups:
        by = {}
        for r in mine:
            by.setdefault(r["method"], []).append(r)
        if ALONE not in by:
            raise ValueError(f"records of {bench}: none of the verifier alone, the reference of every comparison")
        base = {r["id"] for r in by[ALONE]}
        covered[bench] = len(base)
        for method in [ALONE, *(m for m in by if m != ALONE)]:
            ids = sorted({r["id"] for r in by[method]} & base)
            if ids:
                row = row_of(method, ids, by[method], by[ALONE])
                rows.append({"benchmark": bench, "method": method, "problems": len(ids), **row})
    return rows, covered


@dataclass(frozen=True)
class ExactSummary(RowsResult):
    """Per benchmark and method: the exact expected accuracy, the paired difference from the verifier alone
    with its 95% interval over problems, and the drift at the answer token (``rows``: dicts)."""

    rows: list
    problems: dict

    name = "quality_exact"

    def render(self) -> str:
        return exact_markdown(self)

    def pooled(self) -> dict:
        """{method: its row over every benchmark (the "all" rows where there are several, else the one
        benchmark's)}: what the deployment frontier joins to each rule's speed."""
        several = any(r["benchmark"] == "all" for r in self.rows)
        return {r["method"]: r for r in self.rows if r["benchmark"] == "all" or not several}


def summarize_exact(records, *, n_boot=2000, seed=0) -> ExactSummary:
    """The exact referee's summary from its records alone (a list, or the path of its file): per benchmark
    (and "all" where there are several) and method (``paired_summary``), the mean exact accuracy, the mean paired
    difference from the verifier alone with the paired bootstrap's 95% interval over problems, the problems a
    +-0.5 and +-1 point interval would need at the spread observed, and the mean KL(pi || q) and TV at the answer
    token with their intervals."""
    if not isinstance(records, list):
        records = read_exact_records(records)

    def row_of(method, ids, of, alone):
        recs, base = {r["id"]: r for r in of}, {r["id"]: r for r in alone}
        score = np.array([recs[i]["accuracy"] for i in ids])
        ref = np.array([base[i]["accuracy"] for i in ids])
        # float64 rounding of a law (a lossless rule's pi is q to ~1e-16) is no difference
        score = np.where(np.abs(score - ref) <= ROUNDING, ref, score)
        cmp = paired_difference(ids, np.clip(score, 0, 1), np.clip(ref, 0, 1), n_boot=n_boot, seed=seed)
        row = {
            "accuracy": float(score.mean()),
            "difference": float((score - ref).mean()),
            "low": cmp.low,
            "high": cmp.high,
            "verdict": "reference" if method == ALONE else cmp.verdict,
            "needed_half": float(cmp.needed_1 * 4),
            "needed_1": cmp.needed_1,
        }
        counts = resample_counts(ids, n_boot, seed)  # the same resamples for both drifts
        for key in ("kl", "tv"):  # never negative: rounding below 0 (records of earlier versions) reads as 0
            values = np.maximum(np.array([recs[i][key] for i in ids], dtype=np.float64), 0.0)
            row[key] = float(values.mean())
            if counts is not None and np.all(np.isfinite(values)):
                (sums,) = resampled_sums(counts, values)
                row[f"{key}_lo"], row[f"{key}_hi"] = percentile_interval(sums / len(ids))
            else:
                row[f"{key}_lo"] = row[f"{key}_hi"] = float("nan")
        return row

    return ExactSummary(*paired_summary(records, row_of))


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


def _shares(records, ids, key="correct"):
    """Per problem of ``ids``, the share of its samples in ``records`` graded correct (NaN where it has none)."""
    by = {}
    for r in records:
        if key in r:
            by.setdefault(r["id"], []).append(float(bool(r[key])))
    return np.array([np.mean(by[p]) if p in by else np.nan for p in ids])


def summarize_records(records, *, n_boot=2000, seed=0) -> QualitySummary:
    """The sampled referee's summary from records alone (``evaluate_rules``'s list, or the path of the JSON Lines
    file it wrote): per benchmark (and "all", the benchmarks' problems pooled, when there are several) and method
    (``paired_summary``), every method's accuracy and, for each rule, its paired difference from the verifier alone
    on the problems both decoded (interval, McNemar at one sample, problems needed for +-1 and +-2 points), with
    GSM8K's strict and flexible extractions beside its score, and the drift each rule spent on those answers (KL
    per emitted token and per answer, intervals over problems)."""
    if isinstance(records, (str, os.PathLike)):
        records = read_records(records)
    if not records:
        raise ValueError("records: none to summarise")

    def row_of(method, ids, of, alone):
        answers, reference = collections.Counter(r["id"] for r in of), collections.Counter(r["id"] for r in alone)
        one = all(answers[i] == 1 and reference[i] == 1 for i in ids)
        comparison = paired_difference(
            ids, _shares(of, ids), _shares(alone, ids), n_boot=n_boot, seed=seed, single_sample=one
        )
        row = {
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
            shares = _shares(of, ids, f"correct_{key}")
            if np.all(np.isfinite(shares)):
                row[f"accuracy_{key}"] = float(np.mean(shares))
        if method != ALONE:
            row.update(_drift(of, ids, n_boot, seed))
        return row

    rows, covered = paired_summary(records, row_of)
    return QualitySummary(rows, covered, 1 + max(int(r["sample"]) for r in records))


def _drift(records, ids, n_boot, seed) -> dict:
    """KL per emitted token and per answer of one method's answers (``records``) (per problem: summed over its samples),
    with bootstrap intervals over problems; {} when the records hold no drift."""
    kl, tokens, answers = np.zeros(len(ids)), np.zeros(len(ids)), np.zeros(len(ids))
    index = {p: i for i, p in enumerate(ids)}
    seen = False
    for r in records:
        if r["id"] in index and r.get("token_kl") is not None:
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
