"""What decoding records say: the speedup table over prompts with its bootstrap intervals
(``decoding_summary``), a batch's throughput (``batch_throughput``), the flags of a record that
cannot be compared like for like (``decoding_flags``, ``matched_times``) and the drift of whole
answers (``answer_drift``). Pure functions of records (the same whatever order they come in): no model is
loaded here, and no torch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._math._bootstrap import percentile_interval, ratio_interval, resample_counts, resampled_sums
from .._util._results import Result, RowsResult

__all__ = [
    "AnswerDrift",
    "DecodingSummary",
    "answer_drift",
    "batch_throughput",
    "decoding_flags",
    "decoding_summary",
    "matched_times",
]


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
    return (
        n,
        (rec["prefill_seconds"], rec["token_seconds"][n - 1]),
        (base["prefill_seconds"], base["token_seconds"][n - 1]),
    )


def _canonical(records) -> list:
    """The records in one order whatever order they came in (task, prompt, rule): what a summary resamples
    and lists depends on the records alone."""
    return sorted(records, key=lambda r: (str(r.get("task")), str(r.get("id")), str(r.get("rule"))))


@dataclass(frozen=True)
class DecodingSummary(Result):
    """The speedup table of decoding records (``decoding_summary``): ``rows`` (one dict per task, and "all"),
    ``throughput`` (``batch_throughput``'s, or None) and ``notes`` (the flagged prompts); ``table()`` the text
    table the command line prints."""

    rows: list
    throughput: dict | None
    notes: list
    matched: bool

    name = "decoding"

    def records(self) -> list:
        return [dict(r) for r in self.rows]

    def table(self) -> str:
        head = (
            f"{'task':<14} {'prompts':>7} {'tokens':>7} {'AL':>6} {'MAL':>6} {'tok/s':>7} "
            f"{'alone tok/s':>11} {'speedup':>8} {'95% CI':>15}"
        )
        if self.matched:
            head += f" {'prefill':>7} {'request (matched)':>26} {'decode (matched)':>26}"
        lines = [head]
        for r in self.rows:
            row = (
                f"{r['task']:<14} {r['prompts']:>7} {r['tokens']:>7} {r['al']:>6.2f} {1 + r['al']:>6.2f} "
                f"{r['tokens_per_second']:>7.2f}"
            )
            if "speedup" in r:
                row += (
                    f" {r['alone_tokens_per_second']:>11.2f} {r['speedup']:>7.2f}x "
                    f"{_cell(r['speedup'], r['speedup_lo'], r['speedup_hi'])}"
                )
                if self.matched:
                    row += f" {r['prefill_share']:>7.0%} " + " ".join(
                        f"{r[k]:>7.2f}x {_cell(r[k], r[k + '_lo'], r[k + '_hi'], 0)}".rjust(26)
                        for k in ("request_speedup", "decode_speedup")
                    )
            lines.append(row)
        lines += _throughput_lines(self.throughput)
        if self.notes:
            lines += ["", "flagged:", *(f"  {n}" for n in self.notes)]
        return "\n".join(lines)


def decoding_summary(records, seed=0, n_boot=1000) -> DecodingSummary:
    """A table per task (and all) of decoding records: prompts, tokens, AL, vLLM MAL, tokens per
    second, and with baselines the verifier alone's tokens per second and the speedup (sum of
    tokens over sum of seconds, speculative over alone), with a bootstrap 95% interval over
    prompts (paired resampling). Records with per-token times add like-for-like columns: the
    prefill's share of the speculative time, and the request and decode speedups over the same
    number of tokens per prompt (the shorter output's), so outputs of different lengths compare
    fairly. Below the table: prompts whose output lengths differ by more than 20%, and prompts
    during which other processes kept more than a quarter of the cores busy. A ``DecodingSummary``
    (its ``table()`` the text), the same whatever order the records come in."""
    records = _canonical(records)
    tasks = sorted({r["task"] for r in records})
    matched_all = bool(records) and all(matched_times(r) is not None for r in records)
    rows = []
    for task in ["all", *tasks] if len(tasks) > 1 else tasks:
        sel = [r for r in records if task in ("all", r["task"])]
        tokens = np.array([r["tokens"] for r in sel], dtype=float)
        seconds = np.array([r["seconds"] for r in sel], dtype=float)
        steps = sum(len(r["accepted"]) for r in sel)
        al = sum(sum(r["accepted"]) for r in sel) / max(steps, 1)
        row = {
            "task": task,
            "prompts": len(sel),
            "tokens": int(tokens.sum()),
            "al": float(al),
            "tokens_per_second": float(tokens.sum() / seconds.sum()),
        }
        if all(r.get("baseline") for r in sel):
            b_tokens = np.array([r["baseline"]["tokens"] for r in sel], dtype=float)
            b_seconds = np.array([r["baseline"]["seconds"] for r in sel], dtype=float)
            counts = resample_counts([r["id"] for r in sel], n_boot, seed)  # one resampling per table row
            value, lo, hi = _speedup_interval((tokens, seconds, b_tokens, b_seconds), counts)
            row.update(
                alone_tokens_per_second=float(b_tokens.sum() / b_seconds.sum()),
                speedup=value,
                speedup_lo=lo,
                speedup_hi=hi,
            )
            if matched_all:
                times = [matched_times(r) for r in sel]
                spec = np.array([[t[1][0], t[1][1]] for t in times])
                base = np.array([[t[2][0], t[2][1]] for t in times])
                row["prefill_share"] = float(spec[:, 0].sum() / spec.sum())
                for key, (a, b) in (
                    ("request_speedup", (base.sum(1), spec.sum(1))),
                    ("decode_speedup", (base[:, 1], spec[:, 1])),
                ):
                    value, lo, hi = ratio_interval(a, b, counts)
                    row.update({key: float(value), f"{key}_lo": float(lo), f"{key}_hi": float(hi)})
        rows.append(row)
    notes = []
    for r in records:
        flags = decoding_flags(r)
        if flags["length_mismatch"]:
            notes.append(
                f"{r['id']}: {r['tokens']} tokens speculative, {r['baseline']['tokens']} alone (outputs of "
                "different lengths: compare the matched columns)"
            )
        if flags["busy"]:
            load = max(r.get("other_load") or 0.0, (r.get("baseline") or {}).get("other_load") or 0.0)
            notes.append(
                f"{r['id']}: other processes kept {load:.0%} of the cores busy while it (or its baseline) "
                "ran: its timings are suspect"
            )
    return DecodingSummary(rows, batch_throughput(records, seed, n_boot), notes, matched_all)


def batch_throughput(records, seed=0, n_boot=1000):
    """Throughput of decoding records made with ``batch`` > 1: (tokens per second over the batches:
    their tokens over their wall times, summed over batches; with baselines the verifier alone's at
    the same batch size, and the throughput speedup with its paired bootstrap 95% interval over
    batches), or None when no record was batched."""
    groups = {}
    for r in _canonical(records):
        if r.get("batch", 1) > 1:
            groups.setdefault((r["rule"], tuple(r["batch_ids"])), []).append(r)
    if not groups:
        return None
    groups = dict(sorted(groups.items()))
    tokens = np.array([sum(x["tokens"] for x in g) for g in groups.values()], dtype=float)
    seconds = np.array([g[0]["batch_seconds"] for g in groups.values()], dtype=float)
    out = {
        "batches": len(groups),
        "batch_sizes": sorted({r["batch"] for g in groups.values() for r in g}),
        "tokens_per_second": float(tokens.sum() / seconds.sum()),
    }
    if all(x.get("baseline") and "batch_seconds" in x["baseline"] for g in groups.values() for x in g):
        b_tokens = np.array([sum(x["baseline"]["tokens"] for x in g) for g in groups.values()], dtype=float)
        b_seconds = np.array([g[0]["baseline"]["batch_seconds"] for g in groups.values()], dtype=float)
        counts = resample_counts([str(k) for k in groups], n_boot, seed)
        value, lo, hi = _speedup_interval((tokens, seconds, b_tokens, b_seconds), counts)
        out.update(
            {
                "alone_tokens_per_second": float(b_tokens.sum() / b_seconds.sum()),
                "speedup": value,
                "speedup_lo": lo,
                "speedup_hi": hi,
            }
        )
    return out


def _throughput_lines(got):
    if got is None:
        return []
    line = (
        f"throughput at batch {'/'.join(map(str, got['batch_sizes']))} ({got['batches']} batches): "
        f"{got['tokens_per_second']:.2f} tok/s"
    )
    if "speedup" in got:
        line += (
            f"; the verifier alone at the same batch size {got['alone_tokens_per_second']:.2f} tok/s: "
            f"{got['speedup']:.2f}x {_cell(got['speedup'], got['speedup_lo'], got['speedup_hi'], 0)}"
        )
    return ["", line + " (the table's tok/s and speedups are per request: tokens over each request's own latency)"]


def answer_drift(records, n_boot=1000, seed=0) -> AnswerDrift:
    """The drift of whole answers from decoding records made with ``drift=True``: per rule and
    task (and "all"), the mean over prompts of sum_t KL(pi_t || q_t) along each answer (an
    unbiased estimate of an upper bound of the KL of the answer's law from the verifier's;
    ``speculative_generate``) with its percentile bootstrap 95% interval over prompts, the mean
    answer length, and the KL per emitted token (summed KL over summed tokens, with its paired
    interval): an ``AnswerDrift`` whose rows are dicts ``rule``, ``task``, ``prompts``, ``answer_kl`` (``_lo``,
    ``_hi``), ``tokens``, ``kl_per_token`` (``_lo``, ``_hi``); rules in the order their records first come
    (after ordering the records by task, prompt and rule: the same rows whatever order they come in)."""
    with_kl = [r for r in _canonical(records) if r.get("token_kl") is not None]
    if not with_kl:
        raise ValueError("records: none carries token_kl; decode with drift=True (decode --drift)")
    for r in with_kl:
        values = np.asarray(r["token_kl"], dtype=np.float64)
        if values.ndim != 1 or not np.all(np.isfinite(values) & (values >= 0)):
            bad = values.ravel()[~(np.isfinite(values.ravel()) & (values.ravel() >= 0))][:1]
            raise ValueError(
                f"records: prompt {r.get('id')!r} ({r.get('rule')}) has a token_kl that is not a list of "
                f"KLs >= 0 (got {bad[0] if bad.size else values.shape!r}): a KL is finite and never "
                "negative; decode again with drift=True"
            )
    rows = []
    for rule in sorted({r["rule"] for r in with_kl}):
        mine = [r for r in with_kl if r["rule"] == rule]
        for task in ["all", *sorted({r["task"] for r in mine})]:
            sel = [r for r in mine if task in ("all", r["task"])]
            kl = np.array([float(np.sum(r["token_kl"])) for r in sel])
            tokens = np.array([float(len(r["token_kl"])) for r in sel])
            counts = resample_counts([r["id"] for r in sel], n_boot, seed)  # None: one prompt, no interval
            mean, lo, hi = ratio_interval(kl, np.ones(kl.size), counts)
            per, per_lo, per_hi = ratio_interval(kl, tokens, counts)
            rows.append(
                {
                    "rule": rule,
                    "task": task,
                    "prompts": len(sel),
                    "answer_kl": float(mean),
                    "answer_kl_lo": float(lo),
                    "answer_kl_hi": float(hi),
                    "tokens": float(tokens.mean()),
                    "kl_per_token": float(per),
                    "kl_per_token_lo": float(per_lo),
                    "kl_per_token_hi": float(per_hi),
                }
            )
    return AnswerDrift(rows)


@dataclass(frozen=True)
class AnswerDrift(RowsResult):
    """The drift of whole answers per rule and task (``answer_drift``): ``rows`` of dicts; ``table()`` one line
    each, as ``decode --drift`` prints them. Iterating gives the rows."""

    rows: list

    name = "answer_drift"

    def __iter__(self):
        return iter(self.rows)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]

    def render(self) -> str:
        from .._util._results import interval

        return "\n".join(
            f"  {row['rule']:<28} {row['task']:<12} {row['prompts']:>4} prompts  answer KL "
            f"{row['answer_kl']:.4f} {interval(row['answer_kl_lo'], row['answer_kl_hi'], '.4f')}  over "
            f"{row['tokens']:.1f} tokens  KL/token {row['kl_per_token']:.5f} "
            f"{interval(row['kl_per_token_lo'], row['kl_per_token_hi'], '.5f')}"
            for row in self.rows
        )
