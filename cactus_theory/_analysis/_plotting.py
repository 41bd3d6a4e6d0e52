"""Figures for one step of a rule (matplotlib; used by the docs, notebooks and the report)."""

from __future__ import annotations

import io

import numpy as np

__all__ = ["plot_al_vs_kl", "plot_delta_sweep", "plot_delta_sweep_by_task", "plot_plan", "plot_rule_front", "plot_step"]


def figure_png(fig, dpi=110) -> bytes:
    """PNG bytes of a matplotlib figure, which is then closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


#: Markers for the settings of one family (delta, parameters), in order.
SETTING_MARKERS = "osD^v<>ph*P"


def family_colour(family):
    """One colour per rule family, the same in every figure: the registry's names in order on
    matplotlib's 20-colour palette (tab20); a name outside the registry gets grey."""
    import matplotlib

    from .._rules import available_rules

    names = sorted(available_rules())
    palette = matplotlib.colormaps["tab20"].colors
    if family not in names:
        return (0.5, 0.5, 0.5)
    return palette[(names.index(family) * 7) % len(palette)]  # a stride: neighbours in the registry differ


def plot_step(rule, draft_probs, target_probs, ax=None, top=None, *, logits=None):
    """Bar chart of the draft p, the verifier q and what one step of ``rule`` emits, pi (exact).

    ``top`` keeps the ``top`` tokens with the largest q (default: all). The title gives the
    expected acceptance sum_n p(n) a_n and KL(pi || q). ``logits`` (a ``RuleLogits``) for the
    rules that need raw logits. Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt

    from .._laws._emitted import step_metrics

    p = np.asarray(draft_probs, dtype=np.float64)
    q = np.asarray(target_probs, dtype=np.float64)
    if p.ndim != 1 or q.shape != p.shape:
        raise ValueError(f"draft_probs and target_probs must be 1-D of one length; got {p.shape} and {q.shape}")
    metrics = step_metrics(rule, p, q, logits=logits)
    pi = np.asarray(metrics.emitted, dtype=np.float64)
    order = np.argsort(-q)[: top or q.size]
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3))
    x = np.arange(order.size)
    for k, (values, label) in enumerate(((p, "draft p"), (q, "verifier q"), (pi, "emitted pi"))):
        ax.bar(x + (k - 1) * 0.27, values[order], width=0.27, label=label)
    ax.set_xticks(x, [str(i) for i in order], fontsize=7)
    ax.set_xlabel("token (sorted by q)")
    ax.set_ylabel("probability")
    acceptance, drift = float(metrics.acceptance), float(metrics.kl_emitted_target)
    ax.set_title(f"{rule.describe()}: acceptance {acceptance:.3f}, KL(pi||q) {drift:.4f}", fontsize=9)
    ax.legend(fontsize=7)
    return ax


def plot_rule_front(comparison, m=8, axes=None):
    """AL(m) of every rule against its emitted drift, KL(pi || q) (left) and TV(pi, q) (right),
    with the front of rules no other dominates (``compare_rules`` output). Rules with an infinite
    KL (they emit tokens the verifier excludes) sit on the right edge of the KL panel, marked.
    Chains only: trees (multi-draft rules) verify k m + 1 tokens per step and are left out.
    Returns the Figure.
    """
    import matplotlib.pyplot as plt

    from .._math._pareto import pareto_front

    rows = [r for r in comparison["rows"] if r["m"] == m and r.get("draft_count", 1) == 1]
    if not rows:
        raise ValueError(
            f"the comparison has no rows for m = {m}; it has m in {sorted({r['m'] for r in comparison['rows']})}"
        )
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    fig = axes[0].figure
    families = sorted({r["family"] for r in rows})
    colours = {f: family_colour(f) for f in families}
    finite_kl = [r["kl_emitted_target"] for r in rows if np.isfinite(r["kl_emitted_target"])]
    edge = 1.6 * max(finite_kl, default=1.0)
    for ax, key, title in ((axes[0], "kl_emitted_target", "KL(pi || q)"), (axes[1], "tv", "TV(pi, q)")):
        xs = {r["rule"]: (r[key] if np.isfinite(r[key]) else edge) for r in rows}
        for family in families:
            fam = [r for r in rows if r["family"] == family]
            for j, r in enumerate(fam):  # a marker per setting of the family, its colour for the family
                ax.scatter(xs[r["rule"]], r["al"], color=colours[family], marker=SETTING_MARKERS[j % 11],
                           label=family if j == 0 else None, s=28, zorder=3, edgecolors="k",
                           linewidths=0.3)  # fmt: skip
        front = pareto_front([(r["rule"], r["al"], r[key]) for r in rows])
        pts = sorted((xs[r["rule"]], r["al"]) for r in rows if r["rule"] in front)
        ax.step([x for x, _ in pts], [y for _, y in pts], where="post", color="k", lw=1, alpha=0.6, label="front")
        ax.set_xscale("symlog", linthresh=1e-3)
        ax.set_xlabel(f"mean {title} per position (emitted vs verifier)")
        ax.set_ylabel(f"AL, m = {m}")
        ax.set_title(f"AL against {title}", fontsize=10)
        ax.grid(alpha=0.3)
        if key == "kl_emitted_target" and any(not np.isfinite(r[key]) for r in rows):
            ax.axvline(edge, color="grey", ls=":", lw=1)
            ax.text(edge, ax.get_ylim()[0], " KL = inf", rotation=90, va="bottom", ha="right", fontsize=7, color="grey")
    axes[0].legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    return fig


def _middle_m(rows):
    ms = sorted({r["m"] for r in rows})
    return ms[len(ms) // 2]


def _by_family(rows, m, task="all"):
    families = {}
    for r in rows:
        if r["m"] == m and r["task"] == task:
            families.setdefault(r["family"], []).append(r)
    return families


def _delta_axis(ax, deltas):
    """Log delta axis with a tick (and only one) at every delta analysed."""
    ax.set_xscale("log")
    if deltas:
        ax.set_xticks(deltas, [f"{d:g}" for d in deltas])
        ax.minorticks_off()
        lo, hi = min(deltas), max(deltas)
        ax.set_xlim(lo / 1.25, hi * 1.25)
    ax.set_xlabel("delta")


def _pad_y(ax, values):
    """y limits with room around every value, reference lines included (none sits on the frame)."""
    values = [v for v in values if np.isfinite(v)]
    if values:
        lo, hi = min(values), max(values)
        pad = 0.08 * (hi - lo) if hi > lo else 0.05 * max(abs(hi), 1e-3)
        ax.set_ylim(lo - pad, hi + pad)


def _sweep(ax, families, key, deltas, errors):
    """One panel: budgeted families as lines over delta (dodged error bars), others as dashed references."""
    values = []
    budgeted = [f for f, rs in families.items() if any(r["delta"] is not None for r in rs)]
    for family, rs in families.items():
        color = family_colour(family)
        with_delta = sorted((r for r in rs if r["delta"] is not None), key=lambda r: r["delta"])
        if with_delta:
            shift = 1.04 ** (budgeted.index(family) - (len(budgeted) - 1) / 2)  # dodge the error bars
            x = [r["delta"] * shift for r in with_delta]
            y = [r[key] for r in with_delta]
            if errors and f"{key}_lo" in with_delta[0]:
                err = [[r[key] - r[f"{key}_lo"] for r in with_delta], [r[f"{key}_hi"] - r[key] for r in with_delta]]
                ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=2, lw=1.5, label=family, color=color)
                values += [r[f"{key}_lo"] for r in with_delta] + [r[f"{key}_hi"] for r in with_delta]
            else:
                ax.plot(x, y, marker="o", ms=4, label=family, color=color)
            values += y
        else:
            ax.axhline(rs[0][key], ls="--", lw=1.5, label=family, color=color)
            values.append(rs[0][key])
    _delta_axis(ax, deltas)
    _pad_y(ax, values)


def plot_delta_sweep(rows, settings=None, m=None):
    """Mean acceptance (left) and AL(m) with its bootstrap interval (right) against delta, per
    rule family, over all tasks (analysis rows, ``AnalysisResult.rows``); rules without a delta
    are dashed reference lines. Returns the Figure."""
    import matplotlib.pyplot as plt

    m = m or _middle_m(rows)
    families = _by_family(rows, m)
    deltas = sorted({r["delta"] for r in rows if r["delta"] is not None})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    _sweep(axes[0], families, "acceptance", deltas, errors=False)
    _sweep(axes[1], families, "al", deltas, errors=True)
    axes[0].set_ylabel("mean acceptance per draft")
    axes[1].set_ylabel(f"AL (accepted drafts per verification), m = {m}")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="best")
    if settings:
        fig.suptitle(f"Acceptance and AL against delta (sampling {settings})", fontsize=9)
    fig.tight_layout()
    return fig


def plot_delta_sweep_by_task(rows, m=None):
    """AL(m) against delta per rule family, one panel per task, on one y scale. Returns the Figure."""
    import matplotlib.pyplot as plt

    m = m or _middle_m(rows)
    tasks = sorted({r["task"] for r in rows} - {"all"})
    deltas = sorted({r["delta"] for r in rows if r["delta"] is not None})
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.8), sharey=True, squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        _sweep(ax, _by_family(rows, m, task), "al", deltas, errors=True)
        ax.set_title(f"{task} ({next(r['sequences'] for r in rows if r['task'] == task)} sequences)", fontsize=9)
        ax.grid(alpha=0.3)
    values = [v for r in rows if r["m"] == m and r["task"] != "all" for v in (r["al_lo"], r["al_hi"])]
    _pad_y(axes[0][0], values)
    axes[0][0].set_ylabel(f"AL, m = {m}")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle("AL against delta per task", fontsize=9)
    fig.tight_layout()
    return fig


def plot_al_vs_kl(rows, m=None):
    """AL(m) against the mean emitted KL(pi || q) per rule family (all tasks): the trade-off. Returns the Figure."""
    import matplotlib.pyplot as plt

    m = m or _middle_m(rows)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for family, rs in _by_family(rows, m).items():
        rs = sorted(rs, key=lambda r: r["kl_emitted_target"])
        ax.plot(
            [r["kl_emitted_target"] for r in rs], [r["al"] for r in rs], marker="o", ms=4, label=family,
            color=family_colour(family),
        )  # fmt: skip
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlabel("mean KL(pi || q) of the emitted distribution (nats / position)")
    ax.set_ylabel(f"AL, m = {m}")
    ax.set_title("Trade-off: accepted length against drift", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_plan(plan, task="all", ax=None, title=None):
    """Predicted speedup (``predict_speedup``) of every rule at its best m against the mean
    emitted KL(pi || q) per position, with the bootstrap interval of the speedup, the front of
    settings no other beats on both, the verifier alone at 1x and the plan's KL bound. Returns
    the Figure."""
    import matplotlib.pyplot as plt

    from .._math._pareto import pareto_front

    rows = plan.best_m(task)
    key = plan.key
    if not rows:
        raise ValueError(f"the plan has no rows for task {task!r}")
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4.8))
    fig = ax.figure
    families = sorted({r["family"] for r in rows})
    finite = [r["kl_emitted_target"] for r in rows if np.isfinite(r["kl_emitted_target"])]
    edge = 1.6 * max(finite, default=1.0)

    def x_of(r):
        return r["kl_emitted_target"] if np.isfinite(r["kl_emitted_target"]) else edge

    for family in families:
        fam = [r for r in rows if r["family"] == family]
        for j, r in enumerate(fam):  # colour: the family; marker: the setting
            ax.errorbar(
                [x_of(r)], [r[key]], yerr=[[r[key] - r[f"{key}_lo"]], [r[f"{key}_hi"] - r[key]]],
                fmt=SETTING_MARKERS[j % 11], ms=5, capsize=2, color=family_colour(family),
                label=family if j == 0 else None, zorder=3,
            )  # fmt: skip
    front = pareto_front([(r["rule"], r[key], r["kl_emitted_target"]) for r in rows])
    pts = sorted((x_of(r), r[key]) for r in rows if r["rule"] in front)
    ax.step([x for x, _ in pts], [y for _, y in pts], where="post", color="k", lw=1, alpha=0.6, label="front")
    ax.axhline(1.0, color="grey", lw=1, ls="--", label="verifier alone")
    if plan.max_kl is not None:
        ax.axvline(plan.max_kl, color="C3", lw=1, ls=":", label=f"KL bound {plan.max_kl:g}")
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlim(left=0.0)
    # labels on the front only, in display space: one is left out where it would overlap the last one drawn
    ax.figure.canvas.draw()
    placed = []
    for r in sorted((r for r in rows if r["rule"] in front), key=lambda r: (x_of(r), r[key])):
        at = ax.transData.transform((x_of(r), r[key]))
        if any(abs(at[0] - x) < 28 and abs(at[1] - y) < 10 for x, y in placed):
            continue
        placed.append(at)
        ax.annotate(f"m={r['m']}", (x_of(r), r[key]), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("mean KL(pi || q) per position (emitted vs verifier)")
    ax.set_ylabel("predicted " + ("request " if key == "request_speedup" else "") + "speedup over the verifier alone "
                  "(best m)")  # fmt: skip
    ax.set_title(title or f"Predicted speedup ({plan.cost.source.get('kind', 'cost model')})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
