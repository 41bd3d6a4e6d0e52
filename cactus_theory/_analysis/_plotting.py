"""Figures for one step of a rule (matplotlib; used by the docs, notebooks and the report)."""

from __future__ import annotations

import textwrap

import numpy as np

__all__ = [
    "family_colour",
    "plot_al_vs_kl",
    "plot_delta_sweep",
    "plot_delta_sweep_by_task",
    "plot_plan",
    "plot_rule_front",
    "plot_step",
    "rule_colours",
]


#: Markers for the settings of one family (delta, parameters), in order.
SETTING_MARKERS = "osD^v<>ph*P"


#: 48 colours far apart in CIELAB (every pair at least 25 apart, CIE76; lightness 25-78 so none is
#: lost on white): a greedy farthest-point choice from matplotlib's C0 over a grid of sRGB.
PALETTE = (
    "#1f77b4",
    "#ff0000",
    "#00d200",
    "#0000ff",
    "#ff1eb4",
    "#695a00",
    "#00d2b4",
    "#ffa5b4",
    "#4b1e96",
    "#ffa500",
    "#87001e",
    "#004b3c",
    "#b4c300",
    "#d296ff",
    "#e100ff",
    "#00780f",
    "#c3c396",
    "#783c69",
    "#ff005a",
    "#f0784b",
    "#0078ff",
    "#87c3d2",
    "#87695a",
    "#87d278",
    "#784bff",
    "#d24b78",
    "#a52d96",
    "#d2a54b",
    "#b4b4f0",
    "#f069ff",
    "#873c00",
    "#3c3c4b",
    "#2d3c87",
    "#5a9678",
    "#b40f00",
    "#ff87d2",
    "#ff6900",
    "#3c7887",
    "#69b41e",
    "#00c3ff",
    "#96a53c",
    "#877896",
    "#2d4b0f",
    "#9600b4",
    "#692d2d",
    "#00d269",
    "#7878d2",
    "#b45a4b",
)
#: The built-in rules' colours (indices into PALETTE), fixed by name: the same in every figure,
#: whatever else is plotted or installed. A new built-in rule takes an unused index here
#: (tests/analysis/test_figures.py checks every built-in has one and no two share it).
BUILTIN_COLOURS = {
    "sps": 0,
    "cactus": 1,
    "tas": 2,
    "cactus-exact": 9,
    "mentored": 4,
    "block": 6,
    "strict": 5,
    "always-accept": 8,
    "lossy": 7,
    "topk": 10,
    "relaxed-topk": 11,
    "lenience": 12,
    "fsd": 13,
    "rfsd": 14,
    "interpolation": 15,
    "ensemble": 16,
    "scd": 17,
    "spec-cascade-opt": 18,
    "spec-cascade-tok3": 19,
    "synthetic": 20,
    "rrs": 21,
    "spectr": 22,
    "eagle-tree": 23,
    "sglang-tree": 24,
    "multi-draft-optimal": 25,
    "fly": 36,
    "magic-mtp": 34,
    "entropy-verify": 38,
    "hsd": 26,
    "traversal": 27,
    "traversal-tree": 28,
    "sglang-chain": 29,
    "tli": 31,
    "mars": 30,
    "relaxed-thinking": 32,
    "sampler-match": 33,
}


def _hex(colour) -> str:
    import matplotlib.colors

    return matplotlib.colors.to_hex(colour)


def family_colour(family) -> str:
    """The colour a rule family (or any label) asks for, derived from its name only, never from
    its place in a list: a built-in rule's fixed colour (``BUILTIN_COLOURS``), else the colour
    its class declares (``colour``, or ``alias_colours[name]`` for an alias), else a palette
    colour no built-in uses, chosen by a hash of the name. ``rule_colours`` makes the colours of
    one figure distinct."""
    import hashlib

    if family in BUILTIN_COLOURS:
        return PALETTE[BUILTIN_COLOURS[family]]
    from .._rules._registry import available_rules

    info = available_rules().get(family)
    if info is not None:
        declared = getattr(info.rule_class, "alias_colours", {}).get(family) or getattr(info.rule_class, "colour", None)
        if declared:
            return _hex(declared)
    free = [c for i, c in enumerate(PALETTE) if i not in BUILTIN_COLOURS.values()]
    return free[int(hashlib.sha256(str(family).encode()).hexdigest(), 16) % len(free)]


def rule_colours(families) -> dict:
    """{family: colour} for the families (or labels) of one figure, each ``family_colour`` unless
    two would share one: the built-ins keep theirs and any other moves to the next palette
    colour no family of the figure has, from the one it asked for. Deterministic in the set of
    names, not their order."""
    names = sorted(dict.fromkeys(families), key=lambda f: (f not in BUILTIN_COLOURS, str(f)))
    out, taken = {}, set()
    for name in names:
        colour = family_colour(name)
        if colour in taken:
            start = PALETTE.index(colour) if colour in PALETTE else 0
            colour = next(c for c in PALETTE[start:] + PALETTE[:start] if c not in taken)
        out[name] = colour
        taken.add(colour)
    return out


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
    colours = rule_colours(families)
    finite_kl = [r["kl_emitted_target"] for r in rows if np.isfinite(r["kl_emitted_target"])]
    edge = 1.6 * max(finite_kl, default=1.0)
    for ax, key, title in ((axes[0], "kl_emitted_target", "KL(pi || q)"), (axes[1], "tv", "TV(pi, q)")):
        xs = {r["rule"]: (r[key] if np.isfinite(r[key]) else edge) for r in rows}
        for family in families:
            fam = [r for r in rows if r["family"] == family]
            for j, r in enumerate(fam):  # a marker per setting of the family, its colour for the family
                ax.scatter(
                    xs[r["rule"]],
                    r["al"],
                    color=colours[family],
                    marker=SETTING_MARKERS[j % 11],
                    label=r["rule"],
                    s=28,
                    zorder=3,
                    edgecolors="k",
                    linewidths=0.3,
                )
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
    # one entry per setting (colour: the family, marker: the setting), below both panels
    handles, labels = axes[0].get_legend_handles_labels()
    rows_of_legend = -(-len(labels) // 3)
    fig.set_size_inches(fig.get_size_inches()[0], 4.8 + 0.16 * rows_of_legend)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, (0.16 * rows_of_legend + 0.2) / fig.get_size_inches()[1], 1, 1))
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
    colours = rule_colours(families)
    for family, rs in families.items():
        color = colours[family]
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
            lo, hi = rs[0].get(f"{key}_lo", np.nan), rs[0].get(f"{key}_hi", np.nan)
            if errors and np.isfinite(lo) and np.isfinite(hi):  # its interval as a band
                ax.axhspan(lo, hi, color=color, alpha=0.12, lw=0)._interval_band = True
                values += [lo, hi]
    _delta_axis(ax, deltas)
    _pad_y(ax, values)


def plot_delta_sweep(rows, settings=None, m=None):
    """Mean acceptance (left) and AL(m) (right) with their bootstrap 95% intervals against delta,
    per rule family, over all tasks (analysis rows, ``AnalysisResult.rows``); rules without a
    delta are dashed reference lines with their interval as a band. Returns the Figure."""
    import matplotlib.pyplot as plt

    m = m or _middle_m(rows)
    families = _by_family(rows, m)
    deltas = sorted({r["delta"] for r in rows if r["delta"] is not None})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    _sweep(axes[0], families, "acceptance", deltas, errors=True)
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
    families = _by_family(rows, m)
    colours = rule_colours(families)
    for family, rs in families.items():
        rs = sorted(rs, key=lambda r: r["kl_emitted_target"])
        ax.plot(
            [r["kl_emitted_target"] for r in rs],
            [r["al"] for r in rs],
            marker="o",
            ms=4,
            label=family,
            color=colours[family],
        )
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
        _, ax = plt.subplots(figsize=(10, 5.2))
    fig = ax.figure
    families = sorted({r["family"] for r in rows})
    colours = rule_colours(families)
    finite = [r["kl_emitted_target"] for r in rows if np.isfinite(r["kl_emitted_target"])]
    edge = 1.6 * max(finite, default=1.0)

    def x_of(r):
        return r["kl_emitted_target"] if np.isfinite(r["kl_emitted_target"]) else edge

    for family in families:
        fam = [r for r in rows if r["family"] == family]
        for j, r in enumerate(fam):  # colour: the family; marker: the setting
            label = r["rule"] + (f" [{r['draft_policy']}]" if r.get("draft_policy") else "")
            ax.errorbar(
                [x_of(r)],
                [r[key]],
                yerr=[[r[key] - r[f"{key}_lo"]], [r[f"{key}_hi"] - r[key]]],
                fmt=SETTING_MARKERS[j % 11],
                ms=5,
                capsize=2,
                color=colours[family],
                label=label,
                zorder=3,
            )
    front = pareto_front([(r["rule"], r[key], r["kl_emitted_target"]) for r in rows])
    pts = sorted((x_of(r), r[key]) for r in rows if r["rule"] in front)
    ax.step([x for x, _ in pts], [y for _, y in pts], where="post", color="k", lw=1, alpha=0.6, label="front")
    ax.axhline(1.0, color="grey", lw=1, ls="--", label="verifier alone")
    if plan.max_kl is not None:
        ax.axvline(plan.max_kl, color="C3", lw=1, ls=":", label=f"KL bound {plan.max_kl:g}")
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlim(left=-2.5e-4)  # KL = 0 (lossless rules) inside the frame, no negative tick
    ax.margins(y=0.08)
    ax.set_xlabel("mean KL(pi || q) per position (emitted vs verifier)")
    ax.set_ylabel(
        "predicted " + ("request " if key == "request_speedup" else "") + "speedup over the verifier alone (best m)"
    )
    ax.set_title(
        textwrap.fill(title or f"Predicted speedup ({plan.cost.source.get('kind', 'cost model')})", 95), fontsize=9
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    # m labels on the front only, each where its text overlaps no other text or marker, else left out
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    taken = [t.get_window_extent(renderer) for t in (ax.title, ax.xaxis.label, ax.yaxis.label)]
    frame = ax.get_window_extent(renderer)
    for r in sorted((r for r in rows if r["rule"] in front), key=lambda r: (x_of(r), r[key])):
        for offset in ((4, 4), (4, -11), (-24, 4), (-24, -11)):
            label = ax.annotate(f"m={r['m']}", (x_of(r), r[key]), fontsize=7, xytext=offset, textcoords="offset points")
            box = label.get_window_extent(renderer)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(other) for other in taken):
                taken.append(box)
                break
            label.remove()
    return fig


def _texts(fig):
    """(owner, Text) of every visible, non-empty text of ``fig``: figure texts, and per axes its
    titles, axis labels, tick labels and annotations (legends are checked as boxes)."""
    out = [("figure", t) for t in fig.texts]
    if getattr(fig, "_suptitle", None) is not None and fig._suptitle not in fig.texts:
        out.append(("figure", fig._suptitle))
    for i, ax in enumerate(fig.axes):
        owner = f"axes {i}"
        out += [(owner, t) for t in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label)]
        for name, axis, coord in (("x", ax.xaxis, 0), ("y", ax.yaxis, 1)):
            lo, hi = sorted(axis.get_view_interval())
            span = (hi - lo) * 1e-9
            drawn = [t for t in axis.get_ticklabels() if lo - span <= t.get_position()[coord] <= hi + span]
            out += [(f"{owner} {name} ticks", t) for t in drawn]  # the ticks matplotlib draws
        out += [(f"{owner} annotations", t) for t in ax.texts]
    return [(o, t) for o, t in out if t.get_visible() and t.get_text().strip()]


def _style(handle):
    """(colour, marker, line style) of a legend handle, the way a reader tells entries apart."""
    import matplotlib.colors

    artist = handle.lines[0] if hasattr(handle, "lines") and handle.lines else handle
    if isinstance(artist, (tuple, list)):
        artist = artist[0] if artist else None
    if hasattr(artist, "get_color") and hasattr(artist, "get_marker"):
        dashes = getattr(artist, "_unscaled_dash_pattern", None)  # a custom dash reads "--" as its style
        style = str(artist.get_linestyle()) + ("" if dashes is None or dashes[1] is None else str(dashes[1]))
        return (matplotlib.colors.to_hex(artist.get_color()), str(artist.get_marker()), style)
    if hasattr(artist, "get_facecolor"):
        colour = np.asarray(artist.get_facecolor(), dtype=float).reshape(-1, 4)
        if not len(colour) and hasattr(artist, "get_edgecolor"):
            colour = np.asarray(artist.get_edgecolor(), dtype=float).reshape(-1, 4)
        colour = tuple(colour[0]) if len(colour) else (0.0, 0.0, 0.0, 0.0)
        marker = ""
        if hasattr(artist, "get_paths") and artist.get_paths():
            marker = str(np.round(artist.get_paths()[0].vertices, 2).tolist())
        return (matplotlib.colors.to_hex(colour), marker, "")
    return (repr(artist), "", "")


def figure_problems(fig, caption=None, *, tolerance=1.0) -> list:
    """What a reader of ``fig`` would trip on, in words (empty: nothing found), from the
    renderer's window extent of every text and artist:

    - two texts that overlap (annotations of one axes, tick labels of one axis, titles and
      labels against each other), or a text or legend cut by the figure's edge;
    - a data point on or beyond the axes' limits (a marker cut in half at the frame);
    - two legend entries a reader cannot tell apart (same colour, marker and line style), and
      two entries with one label;
    - a ``caption`` that promises intervals on an axes that draws none (no error bars, bands
      or interval lines); ``caption`` is the figure's caption (one written "Left: ...
      Right: ..." is read panel by panel), or {axes index: the caption's words on that panel}.

    ``tolerance``: pixels of overlap or overhang forgiven (antialiasing)."""
    import matplotlib.collections
    import matplotlib.container
    import matplotlib.lines

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox
    problems = []
    per_axes = dict(caption) if isinstance(caption, dict) else None
    if isinstance(caption, str) and "Left:" in caption and "Right:" in caption and len(fig.axes) >= 2:
        left, right = caption.split("Right:", 1)  # a caption of two panels, each in its own words
        per_axes = {0: left.split("Left:", 1)[1], len(fig.axes) - 1: right}

    def inside(box):
        return (
            box.x0 >= frame.x0 - tolerance
            and box.y0 >= frame.y0 - tolerance
            and box.x1 <= frame.x1 + tolerance
            and box.y1 <= frame.y1 + tolerance
        )

    def overlap(a, b):
        return min(a.x1, b.x1) - max(a.x0, b.x0) > tolerance and min(a.y1, b.y1) - max(a.y0, b.y0) > tolerance

    texts = [(o, t, t.get_window_extent(renderer)) for o, t in _texts(fig)]
    for owner, t, box in texts:
        if not inside(box):
            problems.append(f"{owner}: the text {t.get_text()!r} is cut by the figure's edge")
    for i, (o1, t1, b1) in enumerate(texts):
        for o2, t2, b2 in texts[i + 1 :]:
            same_kind = o1 == o2 or ("ticks" not in o1 and "ticks" not in o2)
            if same_kind and overlap(b1, b2):
                problems.append(f"{o1} / {o2}: the texts {t1.get_text()!r} and {t2.get_text()!r} overlap")
    legends = [ax.get_legend() for ax in fig.axes] + list(fig.legends)
    labelled = {}  # label: the first artist drawn with it (what a legend entry stands for)
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            labelled.setdefault(label, handle)
    for legend in (lg for lg in legends if lg is not None):
        box = legend.get_window_extent(renderer)
        if not inside(box):
            problems.append("a legend is cut by the figure's edge")
        for _, t, tb in texts:
            if overlap(box, tb):
                problems.append(f"a legend covers the text {t.get_text()!r}")
        labels = [t.get_text() for t in legend.get_texts()]
        seen = {}
        for label in labels:
            if label not in labelled:
                continue
            style = _style(labelled[label])
            if style in seen:
                problems.append(f"the legend entries {seen[style]!r} and {label!r} look the same {style}")
            seen.setdefault(style, label)
        repeated = sorted({x for x in labels if labels.count(x) > 1})
        if repeated:
            problems.append(f"the legend names {repeated} more than once")
    legend_styles = set()
    for legend in (lg for lg in legends if lg is not None):
        legend_styles |= {_style(labelled[t.get_text()]) for t in legend.get_texts() if t.get_text() in labelled}
    for i, ax in enumerate(fig.axes):
        frame_px = ax.get_window_extent(renderer)
        unlisted = set()
        caps = {
            id(c)
            for bar in ax.containers
            if isinstance(bar, matplotlib.container.ErrorbarContainer)
            for c in bar.lines[1]
        }
        for line in ax.get_lines():
            if not line.get_visible() or line.get_marker() in (None, "None", "", " "):
                continue
            xs, ys = (np.asarray(v, dtype=float) for v in line.get_data())
            finite = np.isfinite(xs) & np.isfinite(ys)
            if not finite.any():
                continue
            at = ax.transData.transform(np.column_stack([xs[finite], ys[finite]]))
            half = line.get_markersize() * fig.dpi / 72 / 2  # the marker's half width in pixels
            cut = (
                (at[:, 0] < frame_px.x0 + half)
                | (at[:, 0] > frame_px.x1 - half)
                | (at[:, 1] < frame_px.y0 + half)
                | (at[:, 1] > frame_px.y1 - half)
            )
            if cut.any():
                first = np.column_stack([xs[finite], ys[finite]])[cut][0]
                problems.append(
                    f"axes {i}: {int(cut.sum())} marker(s) of {line.get_label()!r} cut by the axes' "
                    f"frame (first at ({first[0]:.4g}, {first[1]:.4g}))"
                )
            if legend_styles and id(line) not in caps and _style(line) not in legend_styles:
                unlisted.add(_style(line))
        for collection in ax.collections:
            if isinstance(collection, matplotlib.collections.PathCollection) and legend_styles:
                if _style(collection) not in legend_styles:
                    unlisted.add(_style(collection))
        if unlisted:
            problems.append(
                f"axes {i}: {len(unlisted)} marker style(s) drawn that no legend explains (e.g. {sorted(unlisted)[0]})"
            )
        words = per_axes.get(i, "") if per_axes is not None else (caption or "")
        if "interval" in words.lower():
            draws = any(isinstance(c, matplotlib.container.ErrorbarContainer) for c in ax.containers) or any(
                isinstance(c, (matplotlib.collections.PolyCollection, matplotlib.collections.LineCollection))
                for c in ax.collections
            )
            series = [a for a in ax.get_lines() if isinstance(a, matplotlib.lines.Line2D) and len(a.get_xdata()) > 1]
            draws = draws or any(getattr(patch, "_interval_band", False) for patch in ax.patches)
            if (series or ax.collections or ax.containers) and not draws:
                problems.append(f"axes {i}: the caption promises intervals, the axes draws none")
    return problems
