"""The report's figures: the Cactus bonus and its overspend, the emitted drift against delta beside the
worst case, the entropy change (each a (PNG bytes, caption) pair)."""

from __future__ import annotations

import numpy as np

from .._analysis._plotting import _delta_axis, rule_colours
from .._util._results import figure_png as _png

__all__ = ["gamma_figure_divergences", "worst_case_curve"]


def gamma_figure_divergences() -> tuple:
    """The built-in divergences whose closed forms differ from the exact bonus, for the gamma
    figure: those with a SymPy generator and a third derivative at 1 that is not 0 (not chi2, whose Taylor form
    is exact, nor TV's kinked f)."""
    from .._math._divergences import _BUILTINS

    # the package's own divergences: one a user registers does not reshape the report's figure
    return tuple(d.name for d in _BUILTINS if d.sympy_generator is not None and d.f_third_at_one not in (None, 0.0))


def _fig_gamma():
    import matplotlib.pyplot as plt

    from .._math._gamma import APPROX_METHODS, approx_gamma, exact_gamma

    q = np.linspace(0.001, 0.999, 400)
    names = gamma_figure_divergences()
    fig, axes = plt.subplots(1, len(names), figsize=(15, 3.6), sharey=True)
    for ax, name in zip(axes, names, strict=True):
        for i, delta in enumerate((0.01, 0.1, 1.0)):
            ax.plot(q, exact_gamma(q, delta, name), color=f"C{i}", lw=2, label=f"exact, delta={delta:g}")
            for method, ls in zip(APPROX_METHODS, (":", "--", "-.", (0, (1, 4))), strict=True):
                ax.plot(
                    q,
                    approx_gamma(q, delta, name, method=method),
                    color=f"C{i}",
                    ls=ls,
                    lw=1,
                    label=method if i == 0 else None,
                )
        ax.set_title(name)
        ax.set_xlabel("q(n)")
    axes[0].set_ylabel("bonus gamma")
    axes[-1].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    caption = (
        "Exact Cactus bonus gamma* (thick) against the closed forms (thin: taylor = Corollary 5, "
        "taylor3, one Newton step, provably safe) across q(n), for delta = 0.01, 0.1, 1 and four divergences."
    )
    return _png(fig), caption


def _fig_overspend():
    import matplotlib.pyplot as plt

    from .._math._divergences import binary_divergence
    from .._math._gamma import approx_gamma

    q = np.linspace(0.001, 0.999, 300)
    delta = np.logspace(-4, 1, 300)
    qq, dd = np.meshgrid(q, delta, indexing="ij")
    ratio = binary_divergence(approx_gamma(qq, dd), qq) / dd
    fig, ax = plt.subplots(figsize=(6, 4.2))
    mesh = ax.pcolormesh(dd, qq, ratio, shading="auto", cmap="RdBu_r", vmin=0, vmax=2)
    ax.contour(dd, qq, ratio, levels=[1.0], colors="k", linewidths=1)
    ax.set_xscale("log")
    ax.set_xlabel("delta")
    ax.set_ylabel("q(n)")
    fig.colorbar(mesh, label="KL(h || q) / delta with the Taylor gamma")
    fig.tight_layout()
    share = float(np.mean(ratio > 1 + 1e-9))
    caption = (
        f"Where the paper's Taylor gamma overspends the KL budget: ratio KL(h||q)/delta on a 300x300 grid, q "
        f"uniform in [0.001, 0.999] x delta log-spaced in [1e-4, 10] (black line: ratio 1). Above 1 on "
        f"{100 * share:.1f}% of this grid; max {ratio.max():.2f}. The share depends on the grid: "
        "experiments/approx_gamma_errors.py's (q log-spaced to 1e-6 from both ends, delta from 1e-6; "
        "docs/explanation/gamma.md) holds more points where the Taylor form is safe, so its share is smaller."
    )
    return _png(fig), caption


def _family_rows(result, m=None):
    rows = [r for r in result.rows if r["task"] == "all"]
    m = m or sorted({r["m"] for r in rows})[0]
    return [r for r in rows if r["m"] == m]


def worst_case_curve(deltas, vocabs=(8, 32), n_random=1500, n_starts=1, maxiter=15, seed=0):
    """Gamma(delta) lower bounds for Cactus (Taylor) and exact Cactus: (deltas, {(rule, vocab): [ratio per delta]})."""
    from .._laws._worst_case import worst_case_sweep

    rows = worst_case_sweep(
        ("cactus", "cactus-exact"), deltas, vocabs, seed=seed, n_random=n_random, n_starts=n_starts, maxiter=maxiter
    )
    out = {}
    for row in rows:
        out.setdefault((row["rule"], row["vocab"]), []).append(row["worst_ratio"])
    return [float(d) for d in deltas], out


def _fig_emitted_kl(result, worst=None):
    import matplotlib.pyplot as plt

    rows = _family_rows(result)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    families = {}
    for r in rows:
        families.setdefault(r["family"], []).append(r)
    colours = rule_colours(families)
    deltas = sorted({r["delta"] for r in rows if r["delta"] is not None})
    for family, rs in families.items():
        if rs[0]["delta"] is None:
            ax.axhline(rs[0]["kl_emitted_target"], ls="--", lw=1, color=colours[family], label=family)
            continue
        rs = sorted(rs, key=lambda r: r["delta"])
        ax.errorbar(
            [r["delta"] for r in rs],
            [r["kl_emitted_target"] for r in rs],
            yerr=[
                [r["kl_emitted_target"] - r["kl_emitted_target_lo"] for r in rs],
                [r["kl_emitted_target_hi"] - r["kl_emitted_target"] for r in rs],
            ],
            marker="o",
            capsize=3,
            color=colours[family],
            label=family,
        )
    if deltas:
        ax.plot(deltas, deltas, color="grey", lw=1, label="KL = delta")
    _delta_axis(ax, deltas)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("mean KL(pi || q) per position (nats)")
    ax.legend(fontsize=7)
    ax.set_title("real positions: mean drift")
    worst_deltas, worst = worst or ((), {})
    for (name, vocab), ratios in worst.items():
        ls = "-" if name == "cactus" else "--"
        ax2.plot(worst_deltas, ratios, marker="o", ls=ls, label=f"{name}, V={vocab}")
    ax2.axhline(1.0, color="grey", lw=1)
    _delta_axis(ax2, list(worst_deltas))
    ax2.set_yscale("log")
    ax2.set_ylabel("Gamma(delta) >= worst KL(pi || q) / delta found")
    ax2.set_title("worst case over (p, q): Gamma(delta)")
    if worst:
        ax2.legend(fontsize=7)
    fig.tight_layout()
    top = max((max(r) for r in worst.values()), default=float("nan"))
    caption = (
        "Left: mean KL(pi || q) of what each rule emits, per position of the trace, against delta (bootstrap "
        "95% intervals); grey line KL = delta. Right: Gamma(delta), the worst KL(pi || q) / delta of one "
        "Cactus step over (p, q), as a search lower bound (random search over synthetic Dirichlet and "
        f"Gaussian-logit pairs, then L-BFGS-B; worst found here {top:.1f}; a longer search with V up to 64: "
        "experiments/gamma_worst_case.py). Real positions drift far less than delta; the worst case far more."
    )
    return _png(fig), caption


def _fig_entropy(result):
    import matplotlib.pyplot as plt

    rows = [r for r in result.rows if r["m"] == sorted({x["m"] for x in result.rows})[0]]
    tasks = sorted({r["task"] for r in rows})
    rules = [r["rule"] for r in rows if r["task"] == "all"]
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(rules) * len(tasks) / 2), 4))
    width = 0.8 / len(tasks)
    for i, task in enumerate(tasks):
        values = [next(r["entropy_change"] for r in rows if r["rule"] == rule and r["task"] == task) for rule in rules]
        ax.bar(np.arange(len(rules)) + i * width, values, width=width, label=task)
    ax.set_xticks(np.arange(len(rules)) + 0.4 - width / 2, rules, rotation=60, ha="right", fontsize=7)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_ylabel("H(pi) - H(q) per position (nats)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    caption = (
        "Entropy change of the emitted distribution per rule and task: negative values mean the rule emits "
        "a sharper distribution than the verifier (the paper's argument against TAS)."
    )
    return _png(fig), caption
