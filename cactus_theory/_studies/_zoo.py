"""Every registered rule at the settings it declares on one trace: the comparison table, the
front of accepted length against emitted drift, and which rules accept tokens the verifier
excludes.

The settings come from the rule classes (``Rule.comparison``: the overlay's paper grid,
graphcore-research/relaxed-spec-dec-repro @ c28353f, ``scripts/run_paper_grid.py``, with its
bonus-token policy per rule, relaxed for SCD and the verifier's elsewhere, plus settings of the
rules the grid lacks), so a rule that registers itself is compared without a line here; a rule
that declares no setting (``synthetic``: its acceptance is fixed by the user, not by the trace)
is left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .._analysis._analyze import analyze_trace
from .._math._pareto import pareto_front
from .._rules import available_rules, make_rule
from .._util._results import Result, interval

__all__ = [
    "RulesComparison",
    "compare_rules",
    "comparison_entries",
    "comparison_markdown",
    "write_comparison",
]


def comparison_entries() -> list:
    """(grid label, spec, bonus policy) of every registered rule's declared comparison settings:
    the paper grid's first (lossless ones, then by label), then the others (lossless ones, then by
    rule name); each setting once."""
    seen, grid, extra = set(), [], []
    for info in available_rules().values():
        for label, params, policy in getattr(info.rule_class, "comparison", ()):
            rule = info.rule_class(**params)
            spec = rule.describe()
            if spec in seen:
                continue  # an alias and its class declare the same class's settings once
            seen.add(spec)
            (grid if label else extra).append((not rule.lossless, label, spec, policy))
    # lossless baselines first, then by label; stable: a class's settings keep their declared order
    grid.sort(key=lambda e: (e[0], e[1].lower()))
    extra.sort(key=lambda e: e[0])
    return [e[1:] for e in grid + extra]


@dataclass
class RulesComparison(Result):
    """``compare_rules``'s result: one row per rule setting and m (task 'all'), each with its grid
    label and bonus policy; the trace's sampling settings, positions and sequences. Indexing by the
    old keys ("rows", "settings", "positions", "sequences") still works."""

    rows: list
    settings: dict
    positions: int
    sequences: int
    name: ClassVar[str] = "rules_comparison"

    def __getitem__(self, key):
        return getattr(self, key)

    def records(self) -> list:
        return [dict(r) for r in self.rows]

    def as_dict(self) -> dict:
        return {"rows": self.rows, "settings": self.settings, "positions": self.positions, "sequences": self.sequences}

    def table(self, m=8) -> str:
        """AL(m), acceptance and drift per rule setting, fixed-width."""
        lines = [f"{'rule':<40} {'bonus':>8} {'accept':>7} {'AL':>6} {'AL 95% CI':>15} {'KL(pi||q)':>10} {'TV':>7}"]
        for r in self.rows:
            if r["m"] == m:
                ci = interval(r["al_lo"], r["al_hi"], ".2f")
                lines.append(
                    f"{r['rule']:<40} {r['bonus_policy']:>8} {r['acceptance']:>7.4f} {r['al']:>6.2f} "
                    f"{ci:>15} {_fmt(r['kl_emitted_target']):>10} {r['tv']:>7.4f}"
                )
        return "\n".join(lines)

    def markdown(self) -> str:
        return comparison_markdown(self)

    def figure(self):
        from .._analysis._plotting import plot_rule_front

        return plot_rule_front(self, m=8)

    def to_json(self) -> str:
        import json

        return json.dumps(self.as_dict(), indent=1, default=str)


def compare_rules(trace=None, entries=None, ms=(4, 8, 20), n_boot=1000, processes=1, progress=None):
    """Analyse ``entries`` ((label, spec, bonus policy) triples; default ``comparison_entries()``,
    every registered rule at its declared settings) on ``trace`` (a Trace, a directory, a glob
    or a list of them as ``analyze_trace`` takes; default: the embedded trace).

    Returns a ``RulesComparison``: one row per rule and m (task 'all'), each carrying its grid
    label and bonus policy; the analysis runs once per policy.
    """
    from .._data._trace import load_trace
    from .._data._traceset import open_traces

    entries = comparison_entries() if entries is None else list(entries)
    trace = open_traces(load_trace() if trace is None else trace)
    rows, settings = [], None
    for policy in ("verifier", "relaxed"):
        chosen = [(label, spec) for label, spec, pol in entries if pol == policy]
        if not chosen:
            continue
        result = analyze_trace(
            trace,
            [s for _, s in chosen],
            ms=ms,
            n_boot=n_boot,
            processes=processes,
            progress=progress,
            bonus_policy=policy,
        )
        settings = result.settings
        labels = {make_rule(spec).describe(): label for label, spec in chosen}
        rows += [{**row, "grid_label": labels[row["rule"]]} for row in result.rows if row["task"] == "all"]
    rank = {make_rule(spec).describe(): i for i, (_, spec, _) in enumerate(entries)}
    rows.sort(key=lambda r: (rank[r["rule"]], r["m"]))
    return RulesComparison(rows=rows, settings=settings, positions=trace.n_positions, sequences=len(trace))


def _fmt(x, digits=4):
    return "∞" if math.isinf(x) else f"{x:.{digits}f}"


def comparison_markdown(comparison, m_front=8) -> str:
    """The comparison as Markdown: the main table, the fronts at ``m_front`` and the rules that
    accept tokens outside the verifier's support."""
    rows = comparison["rows"]
    ms = sorted({r["m"] for r in rows})
    by_rule = {}
    for r in rows:
        by_rule.setdefault(r["rule"], {})[r["m"]] = r
    out = [
        f"{comparison['sequences']} sequences, {comparison['positions']} positions; settings {comparison['settings']}. "
        "Per position: acceptance (with the part from tokens the verifier excludes), emitted KL(π‖q) and TV(π, q); "
        f"AL(m) with bootstrap 95% intervals over sequences; KL per emitted token at m = {m_front} under the rule's "
        "bonus policy; the share of positions whose result the stored logits determine exactly.",
        "",
        "| grid label | rule | bonus | accept | outside q | "
        + " | ".join(f"AL({m})" for m in ms)
        + f" | KL(π‖q) | TV | KL/token (m={m_front}) | exact |",
        "|---|---|---|---|---|" + "---|" * len(ms) + "---|---|---|---|",
    ]
    for rule, per_m in by_rule.items():
        r = per_m[ms[0]]
        al = " | ".join(f"{per_m[m]['al']:.2f} {interval(per_m[m]['al_lo'], per_m[m]['al_hi'], '.2f')}" for m in ms)
        front_row = per_m.get(m_front, r)
        out.append(
            f"| {r['grid_label']} | `{rule}` | {r['bonus_policy']} | {r['acceptance']:.4f} | "
            f"{r['acceptance_outside_support']:.4f} | {al} | {_fmt(r['kl_emitted_target'])} | {r['tv']:.4f} | "
            f"{_fmt(front_row['kl_per_token'])} | {r['logits_exact']:.3f} |"
        )
    if m_front in ms:
        every = [per_m[m_front] for per_m in by_rule.values()]
        # a tree verifies k m + 1 tokens per step: it is not on the front of chains of m drafts
        at = [r for r in every if r.get("draft_count", 1) == 1]
        trees = [r["rule"] for r in every if r.get("draft_count", 1) > 1]
        kl_front = pareto_front([(r["rule"], r["al"], r["kl_emitted_target"]) for r in at])
        tv_front = pareto_front([(r["rule"], r["al"], r["tv"]) for r in at])
        dominated = [r["rule"] for r in at if r["rule"] not in kl_front + tv_front]
        outside = [r for r in at if r["acceptance_outside_support"] > 0]
        shares = [f"`{r['rule']}` {r['acceptance_outside_support'] / r['acceptance']:.2%}" for r in outside]
        out += [
            "",
            f"**Front at m = {m_front}** (not dominated: no other rule has AL ≥ and drift ≤, one of them strictly):",
            "",
            "- AL against KL(π‖q): " + ", ".join(f"`{x}`" for x in kl_front) + ".",
            "- AL against TV(π, q): " + ", ".join(f"`{x}`" for x in tv_front) + ".",
            "- Dominated on both: " + ", ".join(f"`{x}`" for x in dominated) + ".",
        ]
        if trees:
            out.append(
                "- Not on the front: the trees " + ", ".join(f"`{x}`" for x in trees) + " (k drafts per position: "
                "they verify k m + 1 tokens per step, a different cost; compared with each other and the optimum in "
                "their own section)."
            )
        out += [
            "",
            "**Rules that accept tokens the verifier excludes** (q(n) = 0 after its top-k / top-p), with the share "
            "of their acceptance that such tokens make up: " + ", ".join(shares) + ". Each of them emits tokens "
            "the verifier never would, so its KL(π‖q) is infinite.",
        ]
    return "\n".join(out)


def write_comparison(comparison, out_dir, *, command, seconds, trace_label=None) -> list:
    """Write the comparison page into ``out_dir``, atomically: rules_comparison.md (the table, the
    fronts and the rules that accept tokens the verifier excludes, with the ``command`` that
    made it and its ``seconds``), rules_comparison.json and rules_comparison.png (AL against the
    emitted drift at m = 8). What ``cactus-theory compare`` and ``experiments/rules_comparison.py``
    write; returns the paths."""
    import json
    import os
    import platform

    from .._analysis._plotting import plot_rule_front
    from .._util._files import atomic_write
    from .._util._results import figure_png

    where = trace_label or "the embedded one (Qwen2.5-Coder-0.5B drafting for 1.5B)."
    title = "on the embedded trace" if trace_label is None else "on a trace"
    md = [
        f"# Every rule {title}, at the paper grid's parameters",
        "",
        f"Command: `{command}` ({seconds:.0f} s on {os.cpu_count()} cores, {platform.machine()}). Trace: {where}",
        "",
        comparison_markdown(comparison),
        "",
        "![AL against emitted drift](rules_comparison.png)",
    ]
    png = figure_png(plot_rule_front(comparison, m=8))
    os.makedirs(out_dir, exist_ok=True)
    return [
        atomic_write(os.path.join(out_dir, name), data)
        for name, data in (
            ("rules_comparison.md", "\n".join(md) + "\n"),
            (
                "rules_comparison.json",
                json.dumps(getattr(comparison, "as_dict", lambda: comparison)(), indent=1, default=str),
            ),
            ("rules_comparison.png", png),
        )
    ]
