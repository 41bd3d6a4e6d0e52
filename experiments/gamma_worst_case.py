"""Gamma(delta): how far one Cactus step's emitted distribution can drift, relative to delta.

For Cactus with the Taylor bonus and with the exact bonus (KL), estimate

    worst KL(pi || q) / delta   over (p, q) pairs,

where pi is the exact emitted distribution (Hao & Mou, ICLR 2026, Theorem 3), by random search over
(p, q) drawn from several families, followed by L-BFGS-B on the logits of the 2 best starts
(40 iterations each), settings spread over all cores.
Each number is a lower bound on sup KL(pi || q) / delta (a search, not a proof).

Usage:
    python experiments/gamma_worst_case.py [--out-dir docs/results] [--quick] [--seed 0]

Writes gamma_worst_case.csv, gamma_worst_case.md and gamma_worst_case.png into --out-dir
(atomically: temporary names, then rename).
"""

from __future__ import annotations

import argparse
import os
import time

from cactus_theory.io import atomic_write, csv_text
from cactus_theory.laws import worst_case_sweep
from cactus_theory.studies import figure_png

DELTAS = (0.001, 0.01, 0.1, 0.5, 1.0, 2.0)
VOCABS = (2, 4, 8, 16, 32, 64)
GAMMAS = ("cactus", "cactus-exact")  # registered spec names: Taylor and exact bonus


def run(deltas=DELTAS, vocabs=VOCABS, seed=0, n_random=4000, n_starts=2, maxiter=40, processes=None, progress=True):
    """All settings, spread over ``processes`` worker processes (default: all cores)."""
    return worst_case_sweep(
        GAMMAS,
        deltas,
        vocabs,
        seed=seed,
        n_random=n_random,
        n_starts=n_starts,
        maxiter=maxiter,
        processes=processes or os.cpu_count(),
        progress=progress,
    )


def to_markdown(rows, deltas, vocabs):
    lines = []
    for rule in GAMMAS:
        lines.append(f"**{rule}** (worst KL(pi || q) / delta found; rows: delta, columns: vocabulary size)")
        lines.append("")
        lines.append("| delta | " + " | ".join(f"V={v}" for v in vocabs) + " |")
        lines.append("|---" * (len(vocabs) + 1) + "|")
        for delta in deltas:
            cells = [r["worst_ratio"] for r in rows if r["rule"] == rule and r["delta"] == delta]
            lines.append(f"| {delta:g} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def figure(rows, deltas, vocabs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(GAMMAS), figsize=(10, 4), sharey=True)
    for ax, rule in zip(axes, GAMMAS, strict=True):
        for vocab in vocabs:
            ys = [r["worst_ratio"] for r in rows if r["rule"] == rule and r["vocab"] == vocab]
            ax.plot(deltas, ys, marker="o", label=f"V={vocab}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("delta (per-token KL budget)")
        ax.set_title(f"{rule}: worst KL(pi || q) / delta")
    axes[0].set_ylabel("KL(pi || q) / delta (search lower bound)")
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    return figure_png(fig, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default="docs/results")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small budgets (smoke test, ~10 s)")
    args = parser.parse_args(argv)
    deltas, vocabs = DELTAS, VOCABS
    kwargs = {}
    if args.quick:
        deltas, vocabs = (0.01, 1.0), (2, 8)
        kwargs = {"n_random": 400, "n_starts": 1, "maxiter": 10, "processes": 1}
    start = time.perf_counter()
    rows = run(deltas, vocabs, seed=args.seed, **kwargs)
    elapsed = time.perf_counter() - start
    atomic_write(os.path.join(args.out_dir, "gamma_worst_case.csv"), csv_text(rows).encode())
    md = to_markdown(rows, deltas, vocabs) + f"\nSeed {args.seed}; {elapsed:.0f} s.\n"
    atomic_write(os.path.join(args.out_dir, "gamma_worst_case.md"), md.encode())
    atomic_write(os.path.join(args.out_dir, "gamma_worst_case.png"), figure(rows, deltas, vocabs))
    print(md)


if __name__ == "__main__":
    main()
