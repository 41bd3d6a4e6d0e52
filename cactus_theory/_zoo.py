"""Every rule at the paper grid's parameters on one trace: the comparison table, the front of
accepted length against emitted drift, and which rules accept tokens the verifier excludes.

The grid is the overlay's paper grid (graphcore-research/relaxed-spec-dec-repro,
``scripts/run_paper_grid.py``; RULES_ZOO.md section 2), with its bonus-token policy per rule
(relaxed for SCD, the verifier's elsewhere), plus the rules of this package that it lacks.
``synthetic`` is left out: its acceptance is fixed by the user, not by the trace.
"""

from __future__ import annotations

import math

from ._analysis import analyze_trace
from ._rules import make_rule

__all__ = ["EXTRA_RULES", "PAPER_GRID", "compare_rules", "comparison_markdown", "pareto_front"]

#: (grid label, rule spec, bonus policy) of the overlay's paper grid.
PAPER_GRID = (
    ("strict spec-dec", "sps", "verifier"),
    ("always-accept", "always-accept", "verifier"),
    *(("CACTUS", f"cactus(delta={d})", "verifier") for d in ("0.1", "0.25", "1", "10")),
    *(("ens", f"ensemble(verifier_weight={w})", "verifier") for w in ("0.95", "0.9", "0.8")),
    *(("spec-casc-opt", f"spec-cascade-opt(alpha={a})", "verifier") for a in ("-0.1", "0", "0.05")),
    *(("spec-casc-tok", f"spec-cascade-tok3(alpha={a})", "verifier") for a in ("0", "0.35", "0.8")),
    *(("mentored-dec", f"lossy(alpha={a})", "verifier") for a in ("0.95", "0.7", "0.3")),
    *(("spec-cont-dec", f"scd(beta={b}, temperature=0.6)", "relaxed") for b in ("0.1", "0.5", "1")),
    *(("r-fuzzy", f"rfsd(divergence=js, threshold={t})", "verifier") for t in ("0.05", "0.2", "0.3")),
)
#: Rules of this package (and variants) the grid does not have, at the settings we report elsewhere.
EXTRA_RULES = (
    ("", "tas", "verifier"),
    ("", "topk(k=5)", "verifier"),
    ("", "topk(k=5, semantics=authors)", "verifier"),
    *(("", f"cactus-exact(delta={d})", "verifier") for d in ("0.25", "1")),
    *(("", f"mentored(delta={d})", "verifier") for d in ("0.25", "1")),
    ("", "interpolation(alpha=0.5)", "verifier"),
    ("", "lenience(leniency=0.5)", "verifier"),
    ("", "fsd(divergence=js, threshold=0.2)", "verifier"),
    ("", "spec-cascade-opt(alpha=0, gate=paper)", "verifier"),
    ("", "spec-cascade-tok3(alpha=0.35, top_set=processed)", "verifier"),
    ("", "scd(beta=0.5, temperature=0.6, gate=alpha, alpha=0.1)", "relaxed"),
)


def compare_rules(trace=None, entries=PAPER_GRID + EXTRA_RULES, ms=(4, 8, 20), n_boot=1000, processes=1, progress=None):
    """Analyse ``entries`` ((label, spec, bonus policy) triples) on ``trace`` (default: the embedded one).

    Returns ``{"rows": [...], "settings": ..., "trace": ...}`` with one row per rule and m (task
    'all'), each carrying its grid label and bonus policy; the analysis runs once per policy.
    """
    from ._trace import load_trace

    trace = load_trace(trace) if trace is None or isinstance(trace, str) else trace
    rows, settings = [], None
    for policy in ("verifier", "relaxed"):
        chosen = [(label, spec) for label, spec, pol in entries if pol == policy]
        if not chosen:
            continue
        result = analyze_trace(
            trace, [s for _, s in chosen], ms=ms, n_boot=n_boot, processes=processes, progress=progress,
            bonus_policy=policy,
        )  # fmt: skip
        settings = result.settings
        labels = {make_rule(spec).describe(): label for label, spec in chosen}
        rows += [{**row, "grid_label": labels[row["rule"]]} for row in result.rows if row["task"] == "all"]
    rank = {make_rule(spec).describe(): i for i, (_, spec, _) in enumerate(entries)}
    rows.sort(key=lambda r: (rank[r["rule"]], r["m"]))
    return {"rows": rows, "settings": settings, "positions": trace.n_positions, "sequences": len(trace)}


def pareto_front(points):
    """Labels of the points (label, AL, drift) that no other point dominates: none has AL >= and
    drift <= with one of them strict. An infinite drift is dominated by any finite one with AL >=."""
    front = []
    for label, al, drift in points:
        dominated = any((a >= al and d <= drift and (a > al or d < drift)) for other, a, d in points if other != label)
        if not dominated:
            front.append(label)
    return front


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
        al = " | ".join(f"{per_m[m]['al']:.2f} [{per_m[m]['al_lo']:.2f}, {per_m[m]['al_hi']:.2f}]" for m in ms)
        front_row = per_m.get(m_front, r)
        out.append(
            f"| {r['grid_label']} | `{rule}` | {r['bonus_policy']} | {r['acceptance']:.4f} | "
            f"{r['acceptance_outside_support']:.4f} | {al} | {_fmt(r['kl_emitted_target'])} | {r['tv']:.4f} | "
            f"{_fmt(front_row['kl_per_token'])} | {r['logits_exact']:.3f} |"
        )
    if m_front in ms:
        at = [per_m[m_front] for per_m in by_rule.values()]
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
            "",
            "**Rules that accept tokens the verifier excludes** (q(n) = 0 after its top-k / top-p), with the share "
            "of their acceptance that such tokens make up: " + ", ".join(shares) + ". Each of them emits tokens "
            "the verifier never would, so its KL(π‖q) is infinite.",
        ]
    return "\n".join(out)
