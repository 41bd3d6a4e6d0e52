"""Analyse a trace at scale: per rule and setting, acceptance, accepted length and the drift of
what the rule emits, with bootstrap confidence intervals over sequences and a per-task breakdown."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from ._emitted import block_statistics, step_metrics
from ._io import atomic_write
from ._rules import TAS, Cactus, ExactCactus, Interpolation, Lenience, Mentored, SpS, TopK
from ._sampling import SamplingSettings
from ._trace import Trace

__all__ = ["METRICS", "RULE_NAMES", "AnalysisResult", "analyze_trace", "parse_rules"]

RULE_NAMES = ("sps", "tas", "topk", "cactus", "cactus-exact", "mentored", "interpolation", "lenience")
_WITH_DELTA = {"cactus": Cactus, "cactus-exact": ExactCactus, "mentored": Mentored}
METRICS = ("acceptance", "kl_emitted_target", "tv", "entropy_change")


def parse_rules(names, deltas=(1.0,), alpha=0.5, leniency=0.5, k=5):
    """Rule objects from names; budgeted rules (cactus, cactus-exact, mentored) once per delta."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    rules = []
    for name in names:
        if name not in RULE_NAMES:
            raise ValueError(f"unknown rule {name!r}; choose from {RULE_NAMES}")
        if name in _WITH_DELTA:
            rules.extend(_WITH_DELTA[name](float(d)) for d in deltas)
        elif name == "sps":
            rules.append(SpS())
        elif name == "tas":
            rules.append(TAS())
        elif name == "topk":
            rules.append(TopK(k))
        elif name == "interpolation":
            rules.append(Interpolation(alpha))
        else:
            rules.append(Lenience(leniency))
    return rules


def _rule_label(rule):
    return rule.describe() if hasattr(rule, "describe") else type(rule).__name__


def _shard_stats(args):
    """Per-sequence sums for one shard (runs in a worker process)."""
    directory, index, rules, ms, settings = args
    trace = Trace(directory, verify=False)
    out = []
    for seq in trace.shard(index):
        p, q = seq.distributions(settings)
        rec = {"id": seq.id, "task": seq.task, "positions": seq.n_positions, "rules": {}}
        for rule in rules:
            sm = step_metrics(rule, p, q)
            per = {name: float(np.sum(getattr(sm, name))) for name in METRICS}
            for m in ms:
                block = block_statistics(sm.acceptance, m)
                per[f"al_sum_{m}"] = float(np.sum(block["per_start"][: block["starts"]]))
                per[f"al_n_{m}"] = block["starts"]
            rec["rules"][_rule_label(rule)] = per
        out.append(rec)
    return out


@dataclass
class AnalysisResult:
    """Rows of statistics (one per rule x m x task, task 'all' included) and per-sequence data."""

    rows: list
    sequences: list
    settings: dict
    seconds: float

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(self.rows[0]))
        writer.writeheader()
        writer.writerows(self.rows)
        return buf.getvalue()

    def to_json(self) -> str:
        return json.dumps({"settings": self.settings, "seconds": self.seconds, "rows": self.rows}, indent=1)

    def table(self, task="all") -> str:
        lines = [
            f"{'rule':<28} {'m':>3} {'accept':>8} {'AL':>7} {'AL 95% CI':>15} {'vLLM MAL':>9} "
            f"{'KL(pi||q)':>10} {'TV':>7} {'dH':>8}"
        ]
        for r in self.rows:
            if r["task"] != task:
                continue
            lines.append(
                f"{r['rule']:<28} {r['m']:>3} {r['acceptance']:>8.4f} {r['al']:>7.3f} "
                f"[{r['al_lo']:>6.3f},{r['al_hi']:>6.3f}] {r['mean_acceptance_length']:>9.3f} "
                f"{r['kl_emitted_target']:>10.5f} {r['tv']:>7.4f} {r['entropy_change']:>8.4f}"
            )
        return "\n".join(lines)


def _ratio_ci(num, den, rng, n_boot):
    """Ratio of sums over sequences and its percentile bootstrap 95% interval (resampling sequences)."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    value = num.sum() / den.sum()
    if len(num) < 2 or n_boot == 0:
        return value, value, value
    idx = rng.integers(len(num), size=(n_boot, len(num)))
    boot = num[idx].sum(axis=1) / den[idx].sum(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return value, float(lo), float(hi)


def analyze_trace(trace, rules, ms=(4, 8, 20), settings=None, n_boot=1000, seed=0, processes=1, progress=True):
    """Statistics of ``rules`` on ``trace`` (a Trace or a directory).

    Per rule, m and task (plus 'all'): mean acceptance (per position), AL(m) (expected accepted
    drafts per verification, averaged over block starts; exact for the recorded positions),
    vLLM's mean acceptance length 1 + AL, and the per-position means of KL(pi || q), TV(pi, q) and
    H(pi) - H(q) of the exact emitted distribution; each with a bootstrap 95% interval over
    sequences. Shards are processed in ``processes`` worker processes.
    """
    start = time.perf_counter()
    trace = trace if isinstance(trace, Trace) else Trace(trace)
    if settings is None:
        settings = (
            SamplingSettings(**trace.metadata.get("sampling", {}))
            if trace.metadata.get("sampling")
            else (SamplingSettings())
        )
    jobs = [(trace.directory, i, list(rules), tuple(ms), settings) for i in range(trace.n_shards)]
    sequences = []
    pool = None
    if processes > 1 and len(jobs) > 1:
        from multiprocessing import get_context

        pool = get_context("spawn").Pool(processes)
    try:
        for i, part in enumerate(pool.imap(_shard_stats, jobs) if pool else map(_shard_stats, jobs), 1):
            sequences.extend(part)
            if progress:
                done = sum(s["positions"] for s in sequences)
                print(f"\r[{i}/{len(jobs)} shards] {done} positions", end="", file=sys.stderr, flush=True)
    finally:
        if pool:
            pool.close()
            pool.join()
    if progress:
        print(file=sys.stderr)
    rng = np.random.default_rng(seed)
    rows = []
    tasks = ["all", *sorted({s["task"] for s in sequences})]
    for rule in rules:
        label = _rule_label(rule)
        for m in ms:
            for task in tasks:
                sel = [s for s in sequences if task in ("all", s["task"])]
                if not sel:
                    continue
                pos = [s["positions"] for s in sel]
                stats = {name: _ratio_ci([s["rules"][label][name] for s in sel], pos, rng, n_boot) for name in METRICS}
                al = _ratio_ci(
                    [s["rules"][label][f"al_sum_{m}"] for s in sel],
                    [s["rules"][label][f"al_n_{m}"] for s in sel],
                    rng,
                    n_boot,
                )
                row = {
                    "rule": label,
                    "delta": getattr(rule, "delta", ""),
                    "m": m,
                    "task": task,
                    "sequences": len(sel),
                    "positions": int(sum(pos)),
                    "al": al[0],
                    "al_lo": al[1],
                    "al_hi": al[2],
                    "mean_acceptance_length": 1 + al[0],
                }
                for name, (v, lo, hi) in stats.items():
                    row[name], row[f"{name}_lo"], row[f"{name}_hi"] = v, lo, hi
                rows.append(row)
    return AnalysisResult(
        rows=rows, sequences=sequences, settings=settings.as_dict(), seconds=time.perf_counter() - start
    )


def write_outputs(result: AnalysisResult, out_dir: str, figures: bool = True) -> list[str]:
    """analysis.csv, analysis.json and (optionally) figures into ``out_dir``, atomically."""
    written = []

    def put(name, data):
        written.append(atomic_write(os.path.join(out_dir, name), data))

    put("analysis.csv", result.to_csv())
    put("analysis.json", result.to_json())
    if figures:
        for name, data in analysis_figures(result).items():
            put(name, data)
    return written


def analysis_figures(result: AnalysisResult) -> dict:
    """PNG bytes: acceptance and AL vs delta per rule; AL vs emitted KL (the trade-off front)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result.rows if r["task"] == "all"]
    ms = sorted({r["m"] for r in rows})
    m = ms[len(ms) // 2]
    families = {}
    for r in rows:
        if r["m"] != m:
            continue
        family = r["rule"].split("(")[0]
        families.setdefault(family, []).append(r)
    out = {}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    deltas = sorted({r["delta"] for r in rows if r["delta"] != ""})
    for idx, (family, rs) in enumerate(families.items()):
        color = f"C{idx}"
        budgeted = [r for r in rs if r["delta"] != ""]
        if budgeted:
            budgeted.sort(key=lambda r: r["delta"])
            d = [r["delta"] for r in budgeted]
            axes[0].plot(d, [r["acceptance"] for r in budgeted], marker="o", label=family, color=color)
            axes[1].errorbar(
                d,
                [r["al"] for r in budgeted],
                yerr=[[r["al"] - r["al_lo"] for r in budgeted], [r["al_hi"] - r["al"] for r in budgeted]],
                marker="o",
                capsize=3,
                label=family,
                color=color,
            )
        else:
            axes[0].axhline(rs[0]["acceptance"], ls="--", lw=1, label=family, color=color)
            axes[1].axhline(rs[0]["al"], ls="--", lw=1, label=family, color=color)
    for ax, what in zip(
        axes, ("mean acceptance per draft", f"AL (accepted drafts per verification), m = {m}"), strict=True
    ):
        ax.set_xscale("log")
        if deltas:
            ax.set_xticks(deltas, [f"{d:g}" for d in deltas])
            ax.minorticks_off()
        ax.set_xlabel("delta")
        ax.set_ylabel(what)
        ax.legend(fontsize=8)
    fig.suptitle(f"Acceptance and AL vs delta (settings {result.settings})", fontsize=9)
    fig.tight_layout()
    out["acceptance_al_vs_delta.png"] = _png(fig)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for family, rs in families.items():
        ax.plot([r["kl_emitted_target"] for r in rs], [r["al"] for r in rs], marker="o", ls="-", label=family)
    ax.set_xscale("symlog", linthresh=1e-4)
    ax.set_xlabel("mean KL(pi || q) of the emitted distribution (nats / position)")
    ax.set_ylabel(f"AL, m = {m}")
    ax.set_title("Trade-off: accepted length vs drift", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out["al_vs_kl.png"] = _png(fig)
    return out


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
