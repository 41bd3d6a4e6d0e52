"""The deployment decision: every rule's predicted speedup against its exact accuracy cost, on one frontier, and
the fastest setting within an accuracy budget (``deployment_frontier``).

For each rule family over the grid its class declares (``Rule.frontier``: delta for Cactus and exact Cactus,
alpha for the lossy rule, each threshold rule's threshold), SpS, and any rule the user adds, and for each draft
length m:

- the speed: the planner's predicted speedup with its 95% interval (``predict_speedup`` on a logit trace and a
  cost model: per request where the cost model timed prompt processing, else per step; with ``batch``, the
  throughput speedup at that many requests in flight, ``batch_plan``);
- the cost in answers: the exact referee's paired accuracy difference from the verifier alone with its 95%
  interval over problems (``summarize_exact``), every setting scored again from the records' answer rows
  (``rescore_exact``: no model), pooled over the benchmarks the records hold (each benchmark's row beside it);
- the front: the settings no other is at least as fast and as accurate as, one of the two strictly;
- the recommendation: the fastest setting (by its predicted speedup) whose loss's upper 95% bound stays within
  ``max_loss`` points (the interval's lower end of the difference at or above -max_loss), or SpS (lossless, the
  difference exactly 0) at its fastest m where none does; and the verifier alone (no speculation: speedup exactly
  1, difference exactly 0, one row of the frontier, m = 0) where no setting within the budget is predicted faster
  than it (a draft as costly as a slow CPU's: speculation loses).

Both computations process the logits with one sampler chain (``settings``: the chain of the engine deployed
on), said on every line. The trace and the records come from different prompts (a workload's and a
benchmark's): the frontier says so; a trace and records of different model pairs are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._math._pareto import pareto_front
from .._math._sampling import SamplingSettings
from .._util._results import Result, interval
from ._referee_summary import ALONE

__all__ = ["FRONTIER_MS", "Frontier", "decide", "deployment_frontier", "frontier_rules"]

#: The draft lengths the frontier tries by default.
FRONTIER_MS = (2, 4, 6, 8, 10)
#: The accuracy budget by default: the loss's upper 95% bound, in points.
MAX_LOSS = 0.5
#: The lossless settings: always within the budget.
LOSSLESS = ("sps", ALONE)


def frontier_rules(extra=()) -> list:
    """SpS and every registered token rule family at each setting of its declared grid (``Rule.frontier``),
    then ``extra`` (specs or rules), each once."""
    from .._rules._protocol import judgement_of
    from .._rules._registry import as_rule, rule_classes

    out = [as_rule("sps")]
    for _, (cls, fixed) in rule_classes().items():
        if fixed or not cls.frontier:
            continue
        for params in cls.frontier:
            rule = cls(**params)
            if judgement_of(rule).per_token:
                out.append(rule)
    out += [as_rule(r) for r in extra]
    seen, unique = set(), []
    for rule in out:
        if rule.describe() not in seen:
            seen.add(rule.describe())
            unique.append(rule)
    return unique


def _family(label: str) -> str:
    return label.split("(")[0]


@dataclass(frozen=True)
class Frontier(Result):
    """``deployment_frontier``'s result: ``rows`` (one per rule and m: the rule, its family, m, the speedup and
    its interval, the accuracy difference in points and its interval, the drift at the answer token, whether the
    setting is on the front, whether its loss is within the budget), the ``recommendation`` (a row), the
    ``budget`` (points), the ``settings`` (sampling and chain), ``speed`` (what the speedup is: per request, per
    step or at a batch size), ``benchmarks`` (per benchmark and method, the accuracy rows), and ``notes``."""

    rows: list
    recommendation: dict
    budget: float
    settings: SamplingSettings
    speed: str
    benchmarks: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    name = "frontier"

    def records(self) -> list:
        return [dict(r) for r in self.rows]

    def recommendation_line(self) -> str:
        """The decision in one line, with its two intervals."""
        r = self.recommendation
        if r["rule"] == ALONE:
            best = max((x for x in self.rows if x["within"] and x["rule"] != ALONE), key=lambda x: x["speedup"])
            return (
                f"deploy the verifier alone, without speculation: no setting whose loss stays within {self.budget:g} "
                f"points at 95% is predicted faster (the fastest, {best['rule']} at m = {best['m']}: {self.speed} "
                f"{best['speedup']:.2f}x {interval(best['speedup_lo'], best['speedup_hi'], '.2f')}, accuracy "
                f"{best['difference']:+.2f} points {interval(best['low'], best['high'], '+.2f')}); chain "
                f"{self.settings.chain_name}"
            )
        edges = self.edges()
        long = f", on long answers {self._long_cell(r)}" if "long_difference" in r and self.benchmarks else ""
        return (
            f"deploy {r['rule']} at m = {r['m']}: {self.speed} {r['speedup']:.2f}x "
            f"{interval(r['speedup_lo'], r['speedup_hi'], '.2f')}, accuracy {r['difference']:+.2f} points "
            f"{interval(r['low'], r['high'], '+.2f')}{long} (the fastest setting whose loss stays within "
            f"{self.budget:g} points at 95%{'; none other does' if r['rule'] == 'sps' else ''}); chain "
            f"{self.settings.chain_name}" + (f" (at the edge of the grid: {'; '.join(edges)})" if edges else "")
        )

    def edges(self) -> list:
        """Where the recommended setting sits at the edge of the grid tried, each with what to try: the largest m,
        or the most relaxed setting of its family (the last of its declared grid and of ``--rules``): a setting
        beyond it may be faster within the budget."""
        r, out = self.recommendation, []
        if r["rule"] == ALONE:
            return out
        ms = {x["m"] for x in self.rows if x["rule"] != ALONE}
        if len(ms) > 1 and r["m"] == max(ms):
            out.append("the largest m tried: try larger --m")
        family = [x["rule"] for x in self.rows if x["family"] == r["family"]]
        if r["rule"] != "sps" and len(set(family)) > 1 and r["rule"] == family[-1]:
            out.append(f"the most relaxed {r['family']} tried: add more relaxed settings with --rules")
        return out

    def _long(self) -> bool:
        return any("long_difference" in r for r in self.rows)

    def _long_cell(self, r) -> str:
        """A row's long-answer difference and interval, with how it was estimated where not from the pool."""
        cell = f"{r['long_difference']:+.2f} {interval(r['long_difference_lo'], r['long_difference_hi'], '+.2f')}"
        if r["long_estimate"] == "refused":
            return "refused (too few effective answers)"
        return cell + (" (own answers)" if r["long_estimate"] == "own answers" else "")

    def _accuracy_line(self) -> str:
        exact = sorted({b["benchmark"] for b in self.benchmarks} - {"all"})
        parts = [f"exact, paired with the verifier alone, pooled over {', '.join(exact)}"] if exact else []
        if self._long():
            parts.append("long answers: pooled, weighted by exact likelihoods, paired with the verifier alone")
        return "; ".join(parts)

    def table(self) -> str:
        long = self._long()
        lines = [
            f"sampling: {self.settings.describe()}; speed: {self.speed}; accuracy: {self._accuracy_line()}",
            *(f"note: {n}" for n in self.notes),
            f"{'rule':<42} {'m':>3} {'speedup':>8} {'95%':>14} {'accuracy, points':>16} {'95%':>16} {'KL':>8}"
            + (f" {'long answers, points [95%]':>34}" if long else "")
            + f" {'front':>5} {'budget':>6}",
        ]
        for r in sorted(self.rows, key=lambda r: (-r["speedup"], r["rule"], r["m"])):
            speed = interval(r["speedup_lo"], r["speedup_hi"], ".2f")
            lines.append(
                f"{r['rule']:<42} {r['m']:>3} {r['speedup']:>7.2f}x {speed:>14} "
                f"{r['difference']:>+16.2f} {interval(r['low'], r['high'], '+.2f'):>16} {r['kl']:>8.4f}"
                + (f" {self._long_cell(r):>34}" if long else "")
                + f" {'*' if r['front'] else '':>5} {'ok' if r['within'] else '':>6}"
            )
        return "\n".join([*lines, "", self.recommendation_line()])

    def markdown(self) -> str:
        long = self._long()
        head = (
            "| rule | m | speedup [95%] | accuracy difference, points [95%] | KL at the answer token | "
            + ("long answers, points [95%] | " if long else "")
            + f"on the front | loss within {self.budget:g} pts |\n|---|---|---|---|---|"
            + ("---|" if long else "")
            + "---|---|"
        )
        body = [
            f"| {r['rule']} | {r['m']} | {r['speedup']:.2f}x {interval(r['speedup_lo'], r['speedup_hi'], '.2f')} | "
            f"{r['difference']:+.2f} {interval(r['low'], r['high'], '+.2f')} | {r['kl']:.4f} | "
            + (f"{self._long_cell(r)} | " if long else "")
            + f"{'yes' if r['front'] else ''} | {'yes' if r['within'] else ''} |"
            for r in sorted(self.rows, key=lambda r: (not r["front"], -r["speedup"]))
            if r["front"] or r["best_m"]
        ]
        return "\n".join([head, *body, "", f"**{self.recommendation_line()}**"])

    def figure(self):
        """Speedup against the accuracy difference, error bars on both axes (each family at its best m), the
        front drawn, SpS and the verifier alone marked, the recommendation circled."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        from ._plotting import rule_colours

        fig, ax = plt.subplots(figsize=(8.5, 5.6))
        shown = [r for r in self.rows if (r["best_m"] or r["front"]) and r["rule"] != ALONE]  # marked below
        colours = rule_colours(sorted({_family(r["rule"]) for r in shown}))
        for r in shown:
            colour = colours.get(_family(r["rule"]), "C0")
            xerr = [[r["difference"] - r["low"]], [r["high"] - r["difference"]]]
            yerr = [[r["speedup"] - r["speedup_lo"]], [r["speedup_hi"] - r["speedup"]]]
            if not all(np.isfinite(v[0]) for v in (*xerr, *yerr)):
                xerr = yerr = None
            ax.errorbar(
                r["difference"],
                r["speedup"],
                xerr=xerr,
                yerr=yerr,
                fmt="o" if r["front"] else ".",
                color=colour,
                alpha=0.9 if r["front"] else 0.45,
                ms=6 if r["front"] else 4,
                capsize=2,
                lw=0.8,
            )
        front = sorted((r for r in self.rows if r["front"]), key=lambda r: r["difference"])
        ax.plot([r["difference"] for r in front], [r["speedup"] for r in front], "-", color="0.3", lw=1, label="front")
        sps = max((r for r in self.rows if r["rule"] == "sps"), key=lambda r: r["speedup"])
        ax.plot([0], [sps["speedup"]], "s", color="black", ms=8, mfc="none", label=f"SpS (m = {sps['m']})")
        ax.plot([0], [1.0], "D", color="black", ms=7, label="verifier alone")
        rec = self.recommendation
        ax.plot([rec["difference"]], [rec["speedup"]], "o", ms=16, mfc="none", mec="red", mew=2, label="recommended")
        ax.axvline(-self.budget, color="red", lw=0.8, ls="--", label=f"budget: -{self.budget:g} points")
        for family in sorted({_family(r["rule"]) for r in shown}):
            ax.plot([], [], "o", color=colours.get(family, "C0"), label=family)
        ax.set_xlabel("accuracy difference from the verifier alone, points (exact, 95% interval over problems)")
        ax.set_ylabel(f"predicted speedup ({self.speed}, 95% interval)")
        ax.set_title(f"Which rule should I deploy? (chain {self.settings.chain_name})")
        ax.legend(fontsize=7, loc="best", ncol=2)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        return fig


def _long_columns(row: dict, *, primary: bool) -> dict:
    """A frontier row's long-answer columns from a ``pooled_from_records`` row (points); ``primary``: the long
    answers are the frontier's only accuracy, so they are its difference and interval too (no drift known)."""
    out = {
        "long_difference": 100 * row["difference"],
        "long_difference_lo": 100 * row["difference_lo"],
        "long_difference_hi": 100 * row["difference_hi"],
        "long_accuracy": 100 * row["accuracy"],
        "long_estimate": row["estimate"],
        "long_ess_per_problem": row["ess_per_problem"],
    }
    if row["rule"] == ALONE:
        out.update(long_difference=0.0, long_difference_lo=0.0, long_difference_hi=0.0)
    if primary:
        out.update(
            difference=out["long_difference"],
            low=out["long_difference_lo"],
            high=out["long_difference_hi"],
            accuracy=out["long_accuracy"],
            kl=float("nan"),
            tv=float("nan"),
            problems=int(row["problems"]),
        )
    return out


def decide(rows: list, max_loss: float) -> dict:
    """Mark ``rows`` (dicts with rule, m, speedup, difference, low: points) in place: ``front`` (no other row at
    least as fast and as accurate, one of the two strictly), ``within`` (SpS and the verifier alone, or the
    difference's lower 95% end at or above -max_loss: the loss's upper bound within the budget; on long answers
    too, ``long_difference_lo``, where a row has it), ``best_m`` (the
    rule's fastest m); and return the recommendation: the fastest row within the budget (on a tie SpS, then the
    verifier alone: the lossless before the lossy)."""
    labels = [f"{r['rule']}@{r['m']}" for r in rows]
    front = set(pareto_front([(lab, r["speedup"], -r["difference"]) for lab, r in zip(labels, rows, strict=True)]))
    best = {}
    for r in rows:
        if r["rule"] not in best or r["speedup"] > best[r["rule"]]["speedup"]:
            best[r["rule"]] = r
    for lab, r in zip(labels, rows, strict=True):
        r["front"] = lab in front
        bounds = [r["low"], *([r["long_difference_lo"]] if "long_difference_lo" in r else [])]
        r["within"] = bool(r["rule"] in LOSSLESS or all(np.isfinite(b) and b >= -max_loss for b in bounds))
        r["best_m"] = best[r["rule"]] is r
    within = [r for r in rows if r["within"]]
    if not any(r["rule"] in LOSSLESS for r in rows):
        raise ValueError("no setting of SpS among the rows: the frontier always holds SpS, the lossless fallback")
    return max(within, key=lambda r: (r["speedup"], r["rule"] == "sps", r["rule"] == ALONE))


def _same_pair(trace_meta: dict, setting: dict) -> list:
    """Notes on the trace's and the records' model pairs; a ValueError when the weights differ."""
    notes = []
    for role, key in (("verifier", "verifier"), ("draft", "draft")):
        a = (trace_meta.get(key) or {}).get("files") or {}
        b = ((setting.get("models") or {}).get(role) or {}).get("files") or {}
        sums_a = sorted(v.get("sha256") for v in a.values())
        sums_b = sorted(v.get("sha256") for v in b.values())
        if sums_a and sums_b and sums_a != sums_b:
            raise ValueError(
                f"the trace's {role} ({(trace_meta.get(key) or {}).get('name')}) and the records' "
                f"({((setting.get('models') or {}).get(role) or {}).get('name')}) are different weights: a frontier "
                "pairs one model pair's speed with its own accuracy; give a trace and records of the same pair"
            )
        if not (sums_a and sums_b):
            notes.append(f"the {role}'s weights cannot be compared (a checksum is missing): check they are the same")
    engine = (setting.get("arithmetic") or {}).get("verifier", {}).get("engine")
    if engine and trace_meta.get("dtype") and engine != "hf":
        notes.append(
            f"the trace was dumped on the Hugging Face engine ({trace_meta.get('dtype')}), the records on {engine}: "
            "the same weights, another arithmetic"
        )
    return notes


def deployment_frontier(
    trace,
    records,
    cost,
    *,
    rules=None,
    ms=FRONTIER_MS,
    settings=None,
    max_loss=MAX_LOSS,
    batch=None,
    n_boot=2000,
    seed=0,
    allow_untrusted=False,
    progress=None,
    long_answers=None,
) -> Frontier:
    """Every rule setting's predicted speedup and exact accuracy difference, the front, and the recommendation
    (see the module docstring). ``trace``: a logit trace of the pair (what ``analyze_trace`` takes); ``records``:
    the exact referee's records with answer rows (a list or a path); ``cost``: the planner's cost model (a
    ``CostModel``, a cost file, or a draft / verifier cost ratio); ``rules``: the settings (default:
    ``frontier_rules()``; SpS is always added); ``ms``: draft lengths; ``settings``: the sampling and its chain
    (default: the records'); ``max_loss``: the budget, points; ``batch``: a number of requests in flight (the
    throughput speedup there; the cost model must have timed it)."""
    from .._data._traceset import open_traces
    from .._rules._registry import as_rule
    from ._analyze import analyze_trace
    from ._plan import batch_plan, predict_speedup
    from ._pooled import pooled_from_records
    from ._referee_summary import read_exact_records, read_records, summarize_exact
    from ._rescore import rescore_exact

    if not (isinstance(max_loss, (int, float)) and not isinstance(max_loss, bool) and 0 <= max_loss < 100):
        raise ValueError(f"max_loss must be a number of points in [0, 100); got {max_loss!r}")
    if records is None and long_answers is None:
        raise ValueError(
            "records: give the exact referee's records, or long_answers (the sampled referee's, with rows)"
        )
    if records is not None and not isinstance(records, list):
        records = read_exact_records(records)
    if records is not None and not records:
        raise ValueError("records: none (the exact referee's records, with answer rows)")
    if long_answers is not None and not isinstance(long_answers, list):
        long_answers = read_records(long_answers)
    setting = ((records or long_answers or [{}])[0]).get("setting") or {}
    settings = settings or SamplingSettings.from_dict(setting.get("sampling"), "the records' setting.sampling")
    rules = [as_rule(r) for r in (frontier_rules() if rules is None else ["sps", *rules])]
    rules = list({r.describe(): r for r in rules}.values())
    traces = open_traces(trace)
    notes = _same_pair(traces.metadata, setting)
    if records is not None and long_answers is not None:
        _same_pair(traces.metadata, long_answers[0].get("setting") or {})
    notes.append(
        "the speed comes from the trace's prompts, the accuracy from the benchmark's problems: two samples of the "
        "pair's behaviour, not one"
    )
    analysis = analyze_trace(
        traces, rules, ms=tuple(ms), settings=settings, n_boot=n_boot, seed=seed, progress=progress
    )
    options = {"allow_untrusted": allow_untrusted, "seed": seed}
    if batch is not None:
        plan = batch_plan(analysis, cost, [batch], **options)[batch]
        speed = f"throughput at {batch} requests in flight"
    else:
        plan = predict_speedup(analysis, cost, **options)
        speed = "per request" if plan.key == "request_speedup" else "per step"
    speeds = plan.speeds()
    summary, accuracy = None, None
    if records is not None:
        rescored = rescore_exact(
            records, [r for r in rules if r.describe() != "sps"] + [as_rule("sps")], settings=settings
        )
        summary = summarize_exact(rescored, n_boot=n_boot, seed=seed)
        accuracy = summary.pooled()
    long = {}
    if long_answers is not None:
        pooled = pooled_from_records(
            long_answers, rules, ms=list(ms), settings=settings, n_boot=n_boot, seed=seed, by_benchmark=False
        )
        long = {(r["rule"], int(r["m"])): r for r in pooled}
        long_alone = next(r for r in pooled if r["rule"] == ALONE)
    rows = []
    for rule in rules:  # each rule's speed at each m joined to its accuracy, by the rule (and m, on long answers)
        for m in ms:
            fast = speeds[(rule.describe(), int(m))]
            row = {
                "rule": rule.describe(),
                "family": _family(rule.describe()),
                "m": int(m),
                "speedup": fast.speedup,
                "speedup_lo": fast.lo,
                "speedup_hi": fast.hi,
                "al": fast.al,
            }
            if accuracy is not None:
                a = accuracy[rule.describe()]
                row.update(
                    {
                        "difference": 100 * a["difference"],
                        "low": 100 * a["low"],
                        "high": 100 * a["high"],
                        "accuracy": 100 * a["accuracy"],
                        "kl": float(a["kl"]),
                        "tv": float(a["tv"]),
                        "problems": int(a["problems"]),
                    }
                )
            if long:
                row.update(_long_columns(long[(rule.describe(), int(m))], primary=accuracy is None))
            rows.append(row)
    alone = {
        "rule": ALONE,
        "family": ALONE,
        "m": 0,
        **dict.fromkeys(("speedup", "speedup_lo", "speedup_hi", "al"), 1.0),
    }
    if accuracy is not None:
        alone.update(dict.fromkeys(("difference", "low", "high", "kl", "tv"), 0.0))
        alone.update({"accuracy": 100 * accuracy[ALONE]["accuracy"], "problems": int(accuracy[ALONE]["problems"])})
    if long:
        alone.update(_long_columns(long_alone, primary=accuracy is None))
    rows.append(alone)
    recommendation = decide(rows, max_loss)
    benchmarks = [
        {k: r[k] for k in ("benchmark", "method", "problems", "accuracy", "difference", "low", "high", "kl", "tv")}
        for r in (summary.rows if summary is not None else [])
    ]
    if long:
        notes.append(
            f"long answers: {long_alone['answers']} graded answers to {long_alone['problems']} problems pooled, every "
            "setting weighted by the exact likelihood of each answer (a setting the pool hardly sees: its own "
            "answers, or refused)"
        )
    return Frontier(rows, recommendation, float(max_loss), settings, speed, benchmarks, notes)
