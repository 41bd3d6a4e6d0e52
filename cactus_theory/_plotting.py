"""Figures for one step of a rule (matplotlib; used by the docs, notebooks and the report)."""

from __future__ import annotations

import numpy as np

__all__ = ["plot_rule_front", "plot_step"]


def plot_step(rule, draft_probs, target_probs, ax=None, top=None, *, logits=None):
    """Bar chart of the draft p, the verifier q and what one step of ``rule`` emits, pi (exact).

    ``top`` keeps the ``top`` tokens with the largest q (default: all). The title gives the
    expected acceptance sum_n p(n) a_n and KL(pi || q). ``logits`` (a ``RuleLogits``) for the
    rules that need raw logits. Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt

    from ._emitted import step_metrics

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
    Returns the Figure.
    """
    import matplotlib.pyplot as plt

    from ._zoo import pareto_front

    rows = [r for r in comparison["rows"] if r["m"] == m]
    if not rows:
        raise ValueError(
            f"the comparison has no rows for m = {m}; it has m in {sorted({r['m'] for r in comparison['rows']})}"
        )
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    fig = axes[0].figure
    families = sorted({r["family"] for r in rows})
    colours = {f: f"C{i % 10}" for i, f in enumerate(families)}
    markers = {f: "osD^v<>ph*"[i // 10 % 10] for i, f in enumerate(families)}
    finite_kl = [r["kl_emitted_target"] for r in rows if np.isfinite(r["kl_emitted_target"])]
    edge = 1.6 * max(finite_kl, default=1.0)
    for ax, key, title in ((axes[0], "kl_emitted_target", "KL(pi || q)"), (axes[1], "tv", "TV(pi, q)")):
        xs = {r["rule"]: (r[key] if np.isfinite(r[key]) else edge) for r in rows}
        for family in families:
            fam = [r for r in rows if r["family"] == family]
            ax.scatter(
                [xs[r["rule"]] for r in fam], [r["al"] for r in fam], color=colours[family], marker=markers[family],
                label=family, s=28, zorder=3,
            )  # fmt: skip
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
