"""Where the rejections come from: draft tokens outside the verifier's truncated support.

Usage:
    python experiments/rejection_sources.py [--delta 1.0] [--trace DIR]

On the embedded trace (or --trace; temperature 0.6, top-k 20, top-p 0.95 applied to both models), for each
rule: the expected rejection mass per position, sum_n p(n) (1 - a_n), and the share of it that
comes from drafted tokens with q(n) = 0 (outside the verifier's top-k / top-p support). No rule
whose target keeps D_f(h || q) finite (KL, and every budgeted rule here) can accept such a
token, so that share is a ceiling no budget can lift.
"""

from __future__ import annotations

import argparse

import numpy as np

from cactus_theory import SamplingSettings, load_trace
from cactus_theory.traces import parse_rules


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delta", type=float, default=1.0)
    parser.add_argument("--rules", default="sps,tas,cactus,cactus-exact,mentored", help="rule specs (make_rules)")
    parser.add_argument("--trace", default=None, help="trace directory (default: the embedded trace)")
    args = parser.parse_args(argv)
    trace = load_trace(args.trace)
    settings = SamplingSettings(**trace.metadata["sampling"])
    rules = parse_rules(args.rules, (args.delta,))
    outside, total = np.zeros(len(rules)), np.zeros(len(rules))
    for seq in trace:
        p, q = seq.distributions(settings)
        for i, rule in enumerate(rules):
            rejected = p * (1.0 - rule.acceptance_all(p, q))
            total[i] += rejected.sum()
            outside[i] += rejected[q == 0].sum()
    print(f"{trace.n_positions} positions; settings {settings}")
    print("| rule | rejection mass per position | share from q(n) = 0 |")
    print("|---|---|---|")
    for i, rule in enumerate(rules):
        print(f"| {rule.describe()} | {total[i] / trace.n_positions:.4f} | {outside[i] / total[i]:.1%} |")


if __name__ == "__main__":
    main()
