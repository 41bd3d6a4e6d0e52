"""Multi-draft and tree verification against the optimum on a trace: each method's acceptance and
tree AL for k = 1..8 drafts per position, where the deployed methods lose most, and sampled
against top-k children."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._analysis._analyze import analyze_trace
from .._math._bootstrap import check_resamples
from .._math._validation import check_int, is_integer
from .._rules import judgement_of, make_rule
from .._util._results import Result, interval

__all__ = ["MULTI_DRAFT_METHODS", "MultiDraftComparison", "compare_multi_draft", "multi_draft_methods"]


def multi_draft_methods(plugins=True) -> tuple:
    """The tree study's methods, from the registry (plugins included unless ``plugins=False``):
    each multi-draft rule's ``tree_comparison`` entries, (label, spec template in k, how the
    children are drawn), in the registry's order (rrs before spectr ...), the yardsticks (optima)
    last."""
    from .._rules._protocol import judgement_of
    from .._rules._registry import rule_classes

    methods, yardsticks = [], []
    for cls, fixed in rule_classes(plugins).values():
        if not judgement_of(cls).multi_draft or fixed:
            continue  # aliases share their class's entries
        (yardsticks if getattr(cls, "yardstick", False) else methods).extend(getattr(cls, "tree_comparison", ()))
    return tuple(dict.fromkeys(methods + yardsticks))


#: The package's own methods of the tree study (``multi_draft_methods()`` adds plugins' and is the default).
MULTI_DRAFT_METHODS = multi_draft_methods(plugins=False)
#: Bins of the verifier's entropy (nats) and of its top-1 mass for "where the methods lose".
ENTROPY_BINS = (0.0, 0.1, 0.5, 1.0, 2.0, np.inf)
TOP1_BINS = (0.0, 0.5, 0.8, 0.95, 0.99, 1.0 + 1e-12)


@dataclass
class MultiDraftComparison(Result):
    """``compare_multi_draft``'s result.

    Attributes
    ----------
    rows : list of dict
        One per method x k x m (over all tasks): ``method``, ``rule`` (spec), ``children``, ``k``,
        ``m``, ``acceptance``, ``optimal_acceptance`` (the optimum of the method's own drafting
        scheme at the same k: i.i.d., without replacement or the top-k of p),
        ``acceptance_of_optimum`` (with ``_lo`` / ``_hi``), ``al`` (with ``al_lo`` / ``al_hi``),
        ``verified_tokens`` (k m + 1).
    by_entropy, by_top1 : list of dict
        At ``k_bins``: per bin of the verifier's entropy / top-1 mass, the positions in it and
        each method's mean acceptance there with the optimum's.
    """

    rows: list
    by_entropy: list
    by_top1: list
    ks: tuple
    ms: tuple
    k_bins: int
    positions: int
    sequences: int
    seconds: float
    name: ClassVar[str] = "multi_draft"

    def records(self) -> list:
        """One row per method x k x m."""
        return [dict(r) for r in self.rows]

    def table(self, m=None) -> str:
        """Acceptance (fraction of the optimum) and tree AL per method and k, at one m."""
        m = self.ms[-1] if m is None else m
        rows = {(r["method"], r["k"]): r for r in self.rows if r["m"] == m}
        methods = list(dict.fromkeys(r["method"] for r in self.rows))
        width = max(24, *(len(n) for n in methods))
        head = f"{'k':>2} " + " ".join(f"{name:>{width}}" for name in methods)
        lines = [f"acceptance (of the optimum of its own drafting scheme) and tree AL at m = {m}", head]
        for k in self.ks:
            cells = []
            for name in methods:
                r = rows[(name, k)]
                cells.append(f"{r['acceptance']:.3f} ({r['acceptance_of_optimum']:.3f}) {r['al']:5.2f}".rjust(width))
            lines.append(f"{k:>2} " + " ".join(cells))
        return "\n".join(lines)

    def markdown(self) -> str:
        """The tables of the results page and the report's section."""
        lines = []
        methods = list(dict.fromkeys(r["method"] for r in self.rows))
        for m in self.ms:
            rows = {(r["method"], r["k"]): r for r in self.rows if r["m"] == m}
            lines += [
                f"Tree AL at m = {m} (bootstrap 95% intervals over sequences); in brackets the acceptance per "
                "position as a fraction of the optimum of the method's own drafting scheme at the same k (i.i.d. "
                "drafts for rrs and spectr, drafts without replacement for rrs without replacement, the top-k of p "
                "for eagle-tree and sglang-tree; each optimum is 1.000 of itself):",
                "",
                "| k | " + " | ".join(methods) + " |",
                "|---|" + "---|" * len(methods),
            ]
            for k in self.ks:
                cells = [
                    f"{rows[(n, k)]['al']:.2f} {interval(rows[(n, k)]['al_lo'], rows[(n, k)]['al_hi'], '.2f')} "
                    f"({rows[(n, k)]['acceptance_of_optimum']:.3f})"
                    for n in methods
                ]
                lines.append(f"| {k} | " + " | ".join(cells) + " |")
            lines.append("")
        for title, bins, unit in (
            ("the verifier's entropy H(q)", self.by_entropy, "nats"),
            ("the verifier's top-1 mass", self.by_top1, ""),
        ):
            lines += [
                f"Mean acceptance per position at k = {self.k_bins} by {title} (an optimum per drafting scheme):",
                "",
                f"| {title} | positions | " + " | ".join(methods) + " |",
                "|---|---|" + "---|" * len(methods),
            ]
            for i, b in enumerate(bins):
                closed = "]" if i == len(bins) - 1 and np.isfinite(b["hi"]) else ")"  # the last top-1 bin holds 1
                span = f"[{b['lo']:g}, {b['hi']:g}{closed}" + (f" {unit}" if unit else "")
                cells = [f"{b['acceptance'][n]:.3f}" if b["positions"] else "n/a" for n in methods]
                lines.append(f"| {span} | {b['positions']} | " + " | ".join(cells) + " |")
            lines.append("")
        return "\n".join(lines)

    def figure(self):
        """Acceptance against k (left) and tree AL at the largest m against k (right), per method."""
        import matplotlib.pyplot as plt

        from .._analysis._plotting import rule_colours

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        m = self.ms[-1]
        names = list(dict.fromkeys(r["method"] for r in self.rows))
        colours = rule_colours(n for n in names if not n.startswith("optimum"))
        optima = [n for n in names if n.startswith("optimum")]
        greys = (("black", "--"), ("dimgray", ":"), ("darkgray", "-."))  # one per drafting scheme
        for name in names:
            rs = sorted((r for r in self.rows if r["method"] == name and r["m"] == m), key=lambda r: r["k"])
            if name in optima:
                colour, dash = greys[optima.index(name) % len(greys)]
                style = {"color": colour, "ls": dash}
            else:
                style = {"color": colours[name]}
            ks = [r["k"] for r in rs]
            spread = [
                [r["acceptance"] - r["acceptance_lo"] for r in rs],
                [r["acceptance_hi"] - r["acceptance"] for r in rs],
            ]
            axes[0].errorbar(
                ks, [r["acceptance"] for r in rs], yerr=spread, marker="o", ms=3, capsize=2, label=name, **style
            )
            errors = [[r["al"] - r["al_lo"] for r in rs], [r["al_hi"] - r["al"] for r in rs]]
            axes[1].errorbar(ks, [r["al"] for r in rs], yerr=errors, marker="o", ms=3, capsize=2, label=name, **style)
        axes[0].set_ylabel("acceptance per position (some draft accepted)")
        axes[1].set_ylabel(f"tree AL at m = {m}")
        for ax in axes:
            ax.set_xlabel("k (drafts per position)")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        return fig


def _bins(values, edges, per_method):
    out = []
    for lo, hi in itertools.pairwise(edges):
        inside = (values >= lo) & (values < hi)
        out.append(
            {
                "lo": float(lo),
                "hi": float(min(hi, 1.0) if edges is TOP1_BINS else hi),
                "positions": int(inside.sum()),
                "acceptance": {
                    n: float(a[inside].mean()) if inside.any() else float("nan") for n, a in per_method.items()
                },
            }
        )
    return out


def _positive_ints(values, name, what):
    try:
        out = tuple(values)
    except TypeError:
        raise ValueError(f"{name} must be a list of {what} (integers >= 1); got {values!r}") from None
    if not out or any(not is_integer(v) or v < 1 for v in out):
        raise ValueError(f"{name} must be a non-empty list of {what} (integers >= 1); got {values!r}")
    return tuple(int(v) for v in out)


def compare_multi_draft(
    trace, ks=tuple(range(1, 9)), ms=(4, 8), *, k_bins=4, n_boot=1000, methods=None, progress=None
) -> MultiDraftComparison:
    """Each multi-draft method's acceptance and tree AL on ``trace`` for each k in ``ks`` and depth
    m in ``ms``, against the optimum of its own drafting scheme (k i.i.d. drafts, k drafts without
    replacement, the top-k of p), with bootstrap intervals over sequences
    (``analyze_trace``); and, at ``k_bins`` drafts, each method's mean acceptance per bin of the
    verifier's entropy and top-1 mass (where the deployed methods lose most). ``methods``: (label,
    spec template in k, children) tuples, default ``MULTI_DRAFT_METHODS``. The tree AL is under
    the independent-positions model of the analysis (docs: "Multi-draft and tree verification").
    """
    from .._data._trace import load_trace
    from .._data._traceset import open_traces

    start = time.perf_counter()
    check_int(k_bins, "k_bins (drafts per position of the per-bin tables)", 1)
    check_resamples(n_boot)
    ks = _positive_ints(ks, "ks", "drafts per position")
    ms = _positive_ints(ms, "ms", "tree depths m")
    methods = multi_draft_methods() if methods is None else tuple(methods)
    if not methods:
        raise ValueError("methods is empty: give (label, spec template in k, children) tuples, or None for the default")
    for method in methods:
        if not (isinstance(method, (tuple, list)) and len(method) == 3 and all(isinstance(x, str) for x in method)):
            raise ValueError(
                "methods must be (label, spec template in k, children) tuples of strings, e.g. "
                f"('rrs', 'rrs(k={{k}})', 'sampled i.i.d.'); got {method!r}"
            )
        try:
            rule = make_rule(method[1].format(k=1))
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"methods: {method[0]!r} has the template {method[1]!r}, which gives no rule: {exc}"
            ) from None
        if "{k}" not in method[1] or not judgement_of(rule).multi_draft:
            raise ValueError(
                f"methods: {method[0]!r} must be a multi-draft rule's spec with {{k}} for its width; got {method[1]!r}"
            )
    traces = open_traces(trace if trace is not None else load_trace())
    specs = {(name, k): make_rule(template.format(k=k)).describe() for name, template, _ in methods for k in ks}
    binned = {name: make_rule(template.format(k=k_bins)).describe() for name, template, _ in methods}
    # one pass: the table's rules and the bins' (at k_bins), each position's acceptance kept for the bins
    result = analyze_trace(
        traces,
        list(dict.fromkeys([*specs.values(), *binned.values()])),
        ms=tuple(ms),
        n_boot=n_boot,
        progress=progress,
        position_acceptance=True,
    )
    by_rule = {(r["rule"], r["m"]): r for r in result.rows if r["task"] == "all"}
    ms = result.ms  # an m longer than every sequence is analysed as the longest
    rows = []
    for name, _, children in methods:
        for k in ks:
            for m in ms:
                r = by_rule[(specs[(name, k)], m)]
                rows.append(
                    {
                        "method": name,
                        "rule": r["rule"],
                        "children": children,
                        "k": k,
                        "m": m,
                        "acceptance": r["acceptance"],
                        "acceptance_lo": r["acceptance_lo"],
                        "acceptance_hi": r["acceptance_hi"],
                        "optimal_acceptance": r["optimal_acceptance"],
                        "acceptance_of_optimum": r["acceptance_of_optimum"],
                        "acceptance_of_optimum_lo": r["acceptance_of_optimum_lo"],
                        "acceptance_of_optimum_hi": r["acceptance_of_optimum_hi"],
                        "al": r["al"],
                        "al_lo": r["al_lo"],
                        "al_hi": r["al_hi"],
                        "verified_tokens": r["verified_tokens"],
                    }
                )
    settings = traces.sampling
    order = {s.id: s for s in result.sequences}  # one trace here (a set's ids may repeat: by trace too)
    per_method = {name: [] for name, _, _ in methods}
    entropy, top1 = [], []
    for name_of_trace, trace in zip(traces.names, traces.traces, strict=True):
        keyed = {s.id: s for s in result.sequences if s.trace == name_of_trace} if len(traces.traces) > 1 else order
        for seq in trace:
            if seq.n_positions == 0:
                continue
            _, q = seq.distributions(settings)
            q64 = np.asarray(q, dtype=np.float64)
            with np.errstate(divide="ignore", invalid="ignore"):
                entropy.append(-np.sum(np.where(q64 > 0, q64 * np.log(q64), 0.0), axis=-1))
            top1.append(q64.max(-1))
            for name, _, _ in methods:
                per_method[name].append(keyed[seq.id].rules[binned[name]].position_acceptance)
    per_method = {n: np.concatenate(v) for n, v in per_method.items()}
    entropy, top1 = np.concatenate(entropy), np.concatenate(top1)
    return MultiDraftComparison(
        rows=rows,
        by_entropy=_bins(entropy, ENTROPY_BINS, per_method),
        by_top1=_bins(top1, TOP1_BINS, per_method),
        ks=tuple(ks),
        ms=tuple(ms),
        k_bins=k_bins,
        positions=int(entropy.size),
        sequences=len(result.sequences),
        seconds=time.perf_counter() - start,
    )
