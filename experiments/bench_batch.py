"""Benchmark of ``plan --batch``: the exact batch analysis per batch size against the Monte Carlo a user
writes for the same quantity, measured in the same run.

Usage:
    python experiments/bench_batch.py [--sizes 100] [--runs 200] [--rule "cactus(delta=1)"] [--m 4 8]

Ours: ``batch_requests`` (what ``plan --batch`` prints: each static batch's throughput and latency,
exact under independent positions, and the full-batch verify budget) on the embedded trace, at batch
sizes 1..``--sizes``, each at the rule's m, with the default cost profile; its time per batch size.

The baseline: a plain NumPy Monte Carlo of the same static batches, as a user would write it: ``--runs``
decodings of each batch, every step each request in flight draws its accepted drafts from the
trace's per-position acceptances (a uniform per draft, the first failure ends the block) and the
step costs the cost model's step at the number in flight; its time per batch size, and how far its
throughput lands from ours (in its own standard errors: the two measure one quantity).

Prints per batch size both times and their ratio, the totals, and whether 100 sizes took under 10 s.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from cactus_theory import CostModel, analyze_trace, make_rule
from cactus_theory.plan import DEFAULT_COST_PROFILE, batch_requests, simulate_batch
from cactus_theory.traces import embedded_traces


def monte_carlo_batch(accepts, m, cost, runs, rng):
    """Throughput of a static batch (tokens / seconds of speculative decoding over the verifier alone's),
    by ``runs`` simulated decodings, as a user writes it; (mean, standard error)."""
    size = len(accepts)
    parts = [(cost.at_batch(b).draft_time(), cost.at_batch(b).verify) for b in range(1, size + 1)]
    lengths = np.array([a.size for a in accepts])
    tokens_alone, spent = [], []
    for _ in range(runs):
        position = np.zeros(size, dtype=int)
        seconds = 0.0
        while (position < lengths).any():
            live = np.flatnonzero(position < lengths)
            draft, verify = parts[live.size - 1]
            all_accepted, emitted = False, 0
            for r in live:
                took = 0
                while took < m and position[r] + took < lengths[r] and rng.random() < accepts[r][position[r] + took]:
                    took += 1
                all_accepted |= took == m
                position[r] += took + 1
                emitted += took + 1
            seconds += m * draft + verify(m + 1) + (draft if all_accepted else 0.0) + cost.step_overhead
            seconds += cost.judge_token * emitted  # each emitted token judged
        tokens_alone.append(sum(parts[int((lengths > s).sum()) - 1][1](1) for s in range(lengths.max())))
        spent.append(seconds)
    # the throughput ratio is E[the verifier alone's time] / E[speculative time] (a ratio of expectations)
    alone, spent = np.array(tokens_alone), np.array(spent)
    ratio = alone.mean() / spent.mean()
    return float(ratio), float((alone - ratio * spent).std(ddof=1) / np.sqrt(runs) / spent.mean())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, default=100, help="batch sizes 1..N")
    parser.add_argument("--runs", type=int, default=200, help="Monte Carlo decodings of each batch (the baseline)")
    parser.add_argument("--rule", default="cactus(delta=1)")
    parser.add_argument("--m", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--baseline-sizes", type=int, nargs="+", default=[1, 8, 32, 100])
    args = parser.parse_args(argv)
    cost = CostModel.from_profile(DEFAULT_COST_PROFILE)
    traces = embedded_traces()
    sizes = list(range(1, args.sizes + 1))
    label = make_rule(args.rule).describe()
    print(f"plan --batch: {args.rule}, m in {args.m}, batch sizes 1..{args.sizes}, cost {DEFAULT_COST_PROFILE}")
    totals = {}
    for m in args.m:  # as plan --batch calls it: once for every size (the trace analysed once)
        start = time.perf_counter()
        batch_requests(traces, {(args.rule, b): m for b in sizes}, cost, sizes, seed=0)
        totals[m] = time.perf_counter() - start
    result = analyze_trace(traces, [args.rule], ms=(1,), n_boot=0, position_acceptance=True)
    accepts = [s.rules[label].position_acceptance for s in sorted(result.sequences, key=lambda s: s.id)]
    rng = np.random.default_rng(0)
    print(f"\n{'m':>3} {'B':>4} {'ours s':>8} {'Monte Carlo s':>14} {'ratio':>8} {'ours x':>8} {'MC x':>16}")
    for m in args.m:
        for b in args.baseline_sizes:
            if b > args.sizes:
                continue
            chosen = accepts[:b] if b <= len(accepts) else [accepts[i % len(accepts)] for i in range(b)]
            t = time.perf_counter()
            mc, se = monte_carlo_batch(chosen, m, cost, args.runs, rng)
            mc_time = time.perf_counter() - t
            t = time.perf_counter()
            exact = simulate_batch(chosen, m, cost).throughput_speedup
            ours = time.perf_counter() - t
            print(
                f"{m:>3} {b:>4} {ours:>8.4f} {mc_time:>14.3f} {mc_time / ours:>7.0f}x {exact:>8.4f} "
                f"{mc:>8.4f}+-{se:.4f}"
            )
    for m, total in totals.items():
        print(
            f"\nbatch_requests at m = {m}, {args.sizes} batch sizes: {total:.2f} s, {total / args.sizes:.3f} s per "
            f"size ({'under' if total < 10 else 'over'} the 10 s target for 100 sizes)"
        )


if __name__ == "__main__":
    main()
