"""Simulation against reality: the AL each rule reached in real decoding vs what the trace predicts.

Usage:
    python experiments/decoding_vs_simulation.py [--cache ~/.cache/cactus_theory/decoding] [--m 8]
        [--runs 400] [--trace DIR] [--out docs/results/decoding_vs_simulation.md]

Reads the per-problem results of experiments/real_decoding_table.py and a trace of the same pair
with the same sampling settings: by default the embedded one (its GSM8K and HumanEval prompts are
the first 22 problems of each, 128 generated tokens each), or --trace, e.g. the full-length trace
of the verifier-alone outputs written by experiments/dump_output_trace.py. The comparison uses
the problems present in both. Two predictions per rule and task:

- position-average: AL(m) of a block started at every position, averaged over positions
  (``block_statistics``; what ``cactus-theory analyze`` reports);
- renewal: ``simulate`` walks each trace sequence block by block as real decoding does (the next
  block starts after the accepted drafts and the correction), pooled as real decoding pools
  (total accepted / total verification steps).

Relative error = prediction / measured - 1, per task and over both tasks pooled.
"""

from __future__ import annotations

import argparse
import json
import os

from cactus_theory import SamplingSettings, load_trace, simulate, step_metrics
from cactus_theory.io import atomic_write
from cactus_theory.laws import block_statistics
from cactus_theory.traces import parse_rules

RULES = {rule.family: rule for rule in parse_rules("sps,tas,cactus,cactus-exact,mentored", (1.0,))}
TASKS = ("gsm8k", "humaneval")


def measured(cache, method, keys, horizon=None):
    """(pooled real AL (accepted drafts per verification step), steps, problems, longest output in
    tokens) over the given problem keys; with ``horizon``, only the steps that start within the
    first ``horizon`` generated tokens."""
    acc, steps, n, longest = 0, 0, 0, 0
    for key in keys:
        path = os.path.join(cache, method, f"{key}.json")
        if not os.path.exists(path):
            continue
        rec = json.load(open(path))
        start = 0
        for a in rec["accepted"]:
            if horizon is not None and start >= horizon:
                break
            acc += a
            steps += 1
            start += a + 1  # accepted drafts, then a correction or bonus token
        n += 1
        longest = max(longest, rec["tokens"])
    return (acc / steps if steps else float("nan")), steps, n, longest


def _relative(prediction, measured):
    """prediction / measured - 1 as a percentage; n/a where nothing was accepted (no ratio)."""
    return f"{prediction / measured - 1:+.1%}" if measured > 0 else "n/a"


def predicted(trace_seqs, rule, m, settings, runs, seed=0):
    """(position-average AL(m), renewal-simulation AL) pooled over the sequences."""
    pos_sum, pos_n, sim_acc, sim_blocks = 0.0, 0, 0, 0
    for i, seq in enumerate(trace_seqs):
        draft_probs, target_probs = seq.distributions(settings)
        beta = step_metrics(rule, draft_probs, target_probs).acceptance
        stats = block_statistics(beta, m)
        pos_sum += float(stats["accepted_length"]) * stats["starts"]
        pos_n += stats["starts"]
        sim = simulate(rule, draft_probs, target_probs, m=m, n_runs=runs, seed=seed + i)
        sim_acc += int(sim.accepted.sum())
        sim_blocks += int(sim.accepted.size)
    return pos_sum / pos_n, sim_acc / sim_blocks


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/cactus_theory/decoding"))
    parser.add_argument("--m", type=int, default=8)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--trace", default=None, help="trace directory (default: the embedded trace)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    trace = load_trace(args.trace)
    settings = SamplingSettings(**trace.metadata["sampling"])
    seqs = {seq.id: seq for seq in trace if seq.task in TASKS}
    horizon = int(trace.metadata["max_new_tokens"])  # the trace covers the first `horizon` generated tokens
    name = "embedded trace" if args.trace is None else f"trace `{os.path.basename(os.path.normpath(args.trace))}`"
    forced = " (teacher-forced on given outputs)" if trace.metadata.get("teacher_forced") else ""
    out = []
    for method, rule in RULES.items():
        for task in (*TASKS, "both"):
            tasks = TASKS if task == "both" else (task,)
            keys = [
                k
                for k in seqs
                if seqs[k].task in tasks and os.path.exists(os.path.join(args.cache, method, f"{k}.json"))
            ]
            if not keys:
                continue
            real, steps, n, longest = measured(args.cache, method, keys)
            early, _, _, _ = measured(args.cache, method, keys, horizon)
            pos, sim = predicted([seqs[k] for k in keys], rule, args.m, settings, args.runs)
            out.append(
                {
                    "rule": method,
                    "describe": rule.describe(),
                    "task": task,
                    "problems": n,
                    "steps": steps,
                    "longest_output": longest,
                    "real": real,
                    f"real_first_{horizon}": early,
                    "position": pos,
                    "renewal": sim,
                }
            )
    # the horizon columns only when the trace stops before some real output does
    short = any(r["longest_output"] > horizon for r in out)
    cols = ["rule", "task", "problems", "real steps", "real AL"]
    cols += [f"real AL, first {horizon} tokens"] if short else []
    for kind in ("position-average AL", "renewal AL"):
        cols += [kind, "error"] + ([f"error vs first {horizon}"] if short else [])
    lines = [
        f"m = {args.m}; real decoding results from `{args.cache}` (problems present in both the run and the "
        f"{name}{forced}, whose sequences stop at {horizon} generated tokens); renewal simulation with "
        f"{args.runs} runs per sequence.",
        "",
        "| " + " | ".join(cols) + " |",
        "|---" * len(cols) + "|",
    ]
    for r in out:
        early = r[f"real_first_{horizon}"]
        cells = [r["describe"], r["task"], str(r["problems"]), str(r["steps"]), f"{r['real']:.2f}"]
        cells += [f"{early:.2f}"] if short else []
        for pred in (r["position"], r["renewal"]):
            cells += [f"{pred:.2f}", _relative(pred, r["real"])]
            cells += [_relative(pred, early)] if short else []
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        atomic_write(args.out, text + "\n")
        atomic_write(os.path.splitext(args.out)[0] + ".json", json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
