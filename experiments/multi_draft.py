"""Multi-draft and tree verification against the optimal acceptance, on a trace.

Usage:
    python experiments/multi_draft.py [--trace DIR] [--out docs/results] [--bootstrap 1000]

For k = 1..8 drafts per position and trees of depth m = 4 and 8: the acceptance per position
(the chance that some draft is accepted) and the tree AL of recursive rejection sampling (drafts
i.i.d. from p, and without replacement), SpecTr's k-sequential selection, EAGLE-2/3's top-k
children (SGLang's lossless tree sampling has the same law) and the optimum of each drafting
scheme (k i.i.d. drafts, k without replacement, the top-k of p; Khisti et al., Hu et al., ICLR
2025), each method against its own scheme's, with bootstrap intervals over sequences; where the
deployed methods lose most (bins of the verifier's entropy and top-1 mass, at k = 4); sampled
(i.i.d. or distinct) against top-k children. The tree AL is under the analysis's
independent-positions model (the accepted child's own children are drafted).

Writes multi_draft.md / .json / .png into --out.
"""

from __future__ import annotations

import argparse
import os

from cactus_theory import load_trace
from cactus_theory.compare import compare_multi_draft
from cactus_theory.io import machine_description, write_results
from cactus_theory.studies import figure_png

HERE = os.path.dirname(os.path.abspath(__file__))


def markdown(result, command, trace):
    lines = [
        "# Multi-draft and tree verification against the optimum",
        "",
        f"Command: `{command}` ({machine_description()}; {result.seconds:.0f} s). Trace: "
        f"{os.path.basename(os.path.normpath(trace.directory))} ({result.sequences} sequences, {result.positions} "
        "positions).",
        "",
        result.markdown(),
    ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=None, help="trace directory (default: the embedded trace)")
    parser.add_argument("--out", default=os.path.join(HERE, "..", "docs", "results"))
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--k", type=int, nargs="+", default=list(range(1, 9)), help="drafts per position")
    parser.add_argument("--m", type=int, nargs="+", default=[4, 8], help="tree depths")
    args = parser.parse_args(argv)
    trace = load_trace(args.trace)
    result = compare_multi_draft(trace, ks=tuple(args.k), ms=tuple(args.m), n_boot=args.bootstrap, progress=False)
    command = "python experiments/multi_draft.py" + (f" --trace {args.trace}" if args.trace else "")
    if args.k != list(range(1, 9)):
        command += " --k " + " ".join(map(str, args.k))
    if args.m != [4, 8]:
        command += " --m " + " ".join(map(str, args.m))
    data = {
        "rows": result.rows,
        "by_entropy": result.by_entropy,
        "by_top1": result.by_top1,
        "k_bins": result.k_bins,
        "positions": result.positions,
        "sequences": result.sequences,
    }
    text = markdown(result, command, trace)
    write_results(args.out, "multi_draft", markdown=text, data=data, png=figure_png(result.figure()))
    print(text)


if __name__ == "__main__":
    main()
