"""The oracle's verdict from its records alone (``summarize_conformance``, a ``ConformanceResult``): per context the
G test of the samples against the exact law (a Monte Carlo p-value), the total variation with its interval, the
power and the N for a total variation of 0.02; the acceptance counters against each candidate law (the exact
binomial test per context, a pooled z test over all); the contexts combined by the sum of their G's. The
statistics are ``_math._multinomial``'s."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from .._math._multinomial import (
    binomial_p_value,
    combined_test,
    detectable_tv,
    draws_for_tv,
    g_test,
    pooled_z_p_value,
    tv_with_interval,
)
from .._util._results import Result

__all__ = ["SIMS", "ConformanceResult", "context_seed", "summarize_conformance"]

#: Monte Carlo draws of each context's null law.
SIMS = 2000


def context_seed(seed, context_id, what) -> int:
    """The seed of one draw of a context (a sample, or the null law's draws): from the run's seed, the context and
    what is drawn, so draws of different contexts and purposes are independent."""
    digest = hashlib.sha256(f"{seed}|{context_id}|{what}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True)
class ConformanceResult(Result):
    """The oracle's verdict: ``rows`` per context (p-value, TV with its interval, the power, the N for a TV of
    0.02, the samples kept and set aside, the counters and the consistent acceptance laws), ``overall`` (the
    combined p-value, its verdict at ``alpha``, the median power), ``alpha``."""

    rows: list
    overall: dict
    alpha: float = 0.01
    notes: list = field(default_factory=list)
    name = "conform"

    def records(self) -> list:
        return [dict(r) for r in self.rows]

    def to_json(self) -> str:
        """The rows with the verdict over all contexts (``overall``), the level and the notes."""
        import json

        from .._util._results import json_ready

        data = {"name": self.name, "rows": self.records(), "overall": self.overall, "alpha": self.alpha}
        return json.dumps(json_ready({**data, "notes": list(self.notes)}), indent=1)

    def table(self) -> str:
        o = self.overall
        lines = [
            f"{'context':<18} {'kept':>6} {'aside':>6} {'p-value':>8} {'TV [95%]':>24} {'detects TV':>10} "
            f"{'N for 0.02':>10}  acceptance consistent with",
        ]
        for r in self.rows:
            consistent = ", ".join(r.get("consistent", [])) if "consistent" in r else "-"
            lines.append(
                f"{r['context']:<18} {r['kept']:>6} {r['set_aside']:>6} {r['p_value']:>8.3g} "
                f"{r['tv']:>8.4f} [{r['tv_low']:.4f}, {r['tv_high']:.4f}] {r['detectable_tv']:>10.4f} "
                f"{r['n_for_002']:>10,.0f}  {consistent}"
            )
        lines += [
            "",
            f"all {o['contexts']} contexts: sum of G {o['g']:.1f}, p = {o['p_value']:.3g} (Monte Carlo, {SIMS} draws "
            f"per context): {o['verdict']} at alpha = {self.alpha:g}; the test detects a TV of "
            f"{o['median_detectable_tv']:.4f} per context at 80% (median over contexts)",
        ]
        if o.get("consistent"):
            lines.append(f"the engine's acceptance counts are consistent with: {', '.join(o['consistent'])}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def summarize_conformance(records, *, alpha=0.01) -> ConformanceResult:
    """The oracle's verdict from its records alone (see the module docstring)."""
    rows, stats, nulls, notes = [], [], [], []
    pooled = {}
    for rec in sorted(records, key=lambda r: str(r["context"])):
        law = {k: float(v) for k, v in rec["law"]}
        counts = dict(rec["counts"])
        keys = sorted(set(law) | set(counts))
        p = np.array([law.get(k, 0.0) for k in keys])
        c = np.array([counts.get(k, 0) for k in keys], dtype=np.float64)
        seed = context_seed(0, rec["context"], "null")
        if c.sum() == 0:
            raise ValueError(f"context {rec['context']}: no sample kept (its forced first token never came)")
        g, pv, null = g_test(c, p / p.sum(), sims=SIMS, seed=seed)
        tv, low, high = tv_with_interval(c, p / p.sum())
        row = {
            "context": rec["context"],
            "kept": int(rec["kept"]),
            "set_aside": int(rec["set_aside"]),
            "categories": int(np.sum(p > 0)),
            "g": g,
            "p_value": pv,
            "tv": tv,
            "tv_low": low,
            "tv_high": high,
            "detectable_tv": detectable_tv(p, c.sum(), alpha=alpha),
            "n_for_002": draws_for_tv(p, 0.02, alpha=alpha),
            "row_drift": rec.get("row_drift"),
        }
        if rec.get("row_drift") is not None and rec["row_drift"] > 1e-6:
            notes.append(
                f"context {rec['context']}: the engine reported other rows for the same context when asked again "
                f"(TV {rec['row_drift']:.2g} between the two laws): its verdict is not to be trusted"
            )
        if "counters" in rec:
            row["drafted"], row["accepted"] = rec["counters"]["drafted"], rec["counters"]["accepted"]
        if "counters" in rec and rec.get("candidates"):
            counters = rec["counters"]
            row["consistent"] = [
                name
                for name, rate in rec["candidates"].items()
                if binomial_p_value(counters["accepted"], counters["drafted"], rate) > alpha
            ]
            for name, rate in rec["candidates"].items():
                pooled.setdefault(name, []).append((counters["accepted"], counters["drafted"], rate))
        rows.append(row)
        stats.append(g)
        nulls.append(null)
    g_all, p_all = combined_test(stats, nulls)
    overall = {
        "contexts": len(rows),
        "g": g_all,
        "p_value": p_all,
        "verdict": "emits the claimed law (not rejected)" if p_all > alpha else "does NOT emit the claimed law",
        "median_detectable_tv": _median([r["detectable_tv"] for r in rows]),
        "kept": int(sum(r["kept"] for r in rows)),
    }
    if pooled:  # the counts of all contexts against each candidate: expected accepted vs observed (a z test)
        overall["consistent"] = [name for name, parts in pooled.items() if pooled_z_p_value(parts) > alpha]
    return ConformanceResult(rows, overall, alpha, notes)


def _median(values) -> float:
    """The median of the finite values (NaN where none is: every context's law one outcome)."""
    finite = [v for v in values if np.isfinite(v)]
    return float(np.median(finite)) if finite else float("nan")
