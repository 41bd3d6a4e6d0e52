"""Every acceptance rule on the embedded trace at the paper grid's parameters.

Usage:
    python experiments/rules_comparison.py [--out-dir docs/results] [--processes 2] [--bootstrap 1000] [--trace DIR]

The grid is the overlay's paper grid (graphcore-research/relaxed-spec-dec-repro @ c28353f,
scripts/run_paper_grid.py, with its bonus policy per rule), plus the rules of this package it
lacks: every registered rule at the settings it declares (``cactus_theory.compare.comparison_entries``).
Writes rules_comparison.md (the table, the fronts of AL against emitted KL and TV, and the rules that accept tokens the
verifier excludes), rules_comparison.json and rules_comparison.png into --out-dir, atomically.
"""

from __future__ import annotations

import argparse
import os
import time

from cactus_theory.compare import compare_rules, write_comparison

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=os.path.join(HERE, "..", "docs", "results"))
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--trace", nargs="*", default=None, help="trace directories or globs (default: the embedded)")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    start = time.perf_counter()
    comparison = compare_rules(args.trace or None, n_boot=args.bootstrap, processes=args.processes)
    command = f"python experiments/rules_comparison.py --processes {args.processes} --bootstrap {args.bootstrap}"
    if args.trace:
        command += " --trace " + " ".join(args.trace)
    for path in write_comparison(
        comparison,
        args.out_dir,
        command=command,
        seconds=time.perf_counter() - start,
        trace_label=", ".join(args.trace) if args.trace else None,
    ):
        print("wrote", path)


if __name__ == "__main__":
    main()
