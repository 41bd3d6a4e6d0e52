"""The exact quality referee at power: on ARC-Challenge's 1,172 test questions, asked at the answer position as
lm-evaluation-harness asks MMLU, each method's expected accuracy from its exact law of the answer token (no
sampling), paired with the verifier alone's, beside the drift each spends there; then, on the first problems, the
same methods decoded and graded by sampling, so the exact value is seen inside the sampled interval.

Usage:
    python experiments/fetch_models.py       # once: the Qwen2.5-Coder 0.5B / 1.5B GGUF files
    python experiments/fetch_benchmark.py    # once: ARC-Challenge's test file, checked, into the data directory
    python experiments/quality_exact.py --data DIR [--limit N] [--sampled-problems 40] [--samples 3]
        [--rules 'sps,cactus(delta=1),cactus(delta=4),lossy(alpha=0.5),always-accept'] [--out docs/results]

Qwen2.5-Coder-0.5B-Instruct drafts for 1.5B (Q4_K_M, llama.cpp), the paper's sampling (temperature 0.6, top-k
20, top-p 0.95). Resumable (the records in the user cache); the page is rewritten from the records alone, and
the records are written beside it, compressed (docs/results/quality_exact_records.jsonl.gz and
quality_exact_sampled_records.jsonl.gz): `cactus-theory evaluate --summarize` on them gives the page's tables.

Writes OUT/NAME.md and OUT/NAME.json (NAME: --name, default quality_exact) and the records beside them.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

# the sampled quality referee's pair, rules and sampling: the two referees judge the same methods the same way
from quality_referee import CACHE, DRAFT, RULES, SETTINGS, VERIFIER

from cactus_theory import evaluate_rules, exact_choice_referee, load_model
from cactus_theory.io import machine_description, run_seconds, write_records, write_results
from cactus_theory.quality import load_problems, paired_difference, summarize_exact
from cactus_theory.rules import make_rules

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sampled_rows(sampled, exact, methods):
    """Per method, on the sampled problems: the sampled accuracy with its 95% interval (the paired bootstrap's
    percentile interval of the mean over problems, each problem's share of its samples), and the exact mean
    accuracy of the same problems, and whether it lies inside."""
    ids = sorted({r["id"] for r in sampled})
    rows = []
    for method in methods:
        shares = np.array(
            [np.mean([r["correct"] for r in sampled if r["id"] == i and r["method"] == method]) for i in ids]
        )
        exact_mean = float(np.mean([r["accuracy"] for r in exact if r["id"] in ids and r["method"] == method]))
        # the paired bootstrap against zero: the percentile interval of the mean share over problems
        interval = paired_difference(ids, shares, np.zeros_like(shares), n_boot=2000, seed=0)
        low, high = interval.low, interval.high
        rows.append(
            {
                "method": method,
                "problems": len(ids),
                "samples": round(len([r for r in sampled if r["method"] == method]) / len(ids)),
                "sampled": float(shares.mean()),
                "low": low,
                "high": high,
                "exact": exact_mean,
                "inside": bool(low <= exact_mean <= high),
            }
        )
    return rows


def sampled_table(rows):
    lines = [
        "| method | problems x samples | sampled accuracy % [95%] | exact accuracy % (the same problems) | inside |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        inside = "yes" if r["inside"] else "no"
        lines.append(
            f"| {r['method']} | {r['problems']} x {r['samples']} | {100 * r['sampled']:.1f} "
            f"[{100 * r['low']:.1f}, {100 * r['high']:.1f}] | {100 * r['exact']:.2f} | {inside} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=os.path.join(CACHE, "models"))
    parser.add_argument("--data", default=None, help="the benchmark directory (arc_challenge/test.jsonl)")
    parser.add_argument("--benchmark", default="arc_challenge")
    parser.add_argument("--rules", default=RULES)
    parser.add_argument("--limit", type=int, default=None, help="at most this many problems (default: all)")
    parser.add_argument("--sampled-problems", type=int, default=40, help="problems of the sampled check (0: none)")
    parser.add_argument("--samples", type=int, default=3, help="samples per problem and method of the sampled check")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument(
        "--context",
        type=int,
        default=512,
        help="tokens each model's cache holds (a prompt must fit; smaller is faster)",
    )
    parser.add_argument("--records", default=os.path.join(CACHE, "quality", "exact_records.jsonl"))
    parser.add_argument("--name", default="quality_exact", help="the stem of the files written to --out")
    parser.add_argument("--out", default=os.path.join(HERE, "docs", "results"))
    args = parser.parse_args(argv)
    problems = load_problems(args.benchmark, args.data, limit=args.limit)
    rules = [r.describe() for r in make_rules(args.rules)]
    methods = ["verifier alone", *rules]
    os.makedirs(os.path.dirname(os.path.abspath(args.records)), exist_ok=True)
    pair = [os.path.join(args.models, name) for name in (VERIFIER, DRAFT)]
    verifier, draft = (load_model(path, engine="llama.cpp", sequences=1, context=args.context) for path in pair)
    exact = exact_choice_referee(verifier, draft, problems, rules, settings=SETTINGS, out=args.records, progress=True)
    sampled = []
    if args.sampled_problems > 0:
        sampled = evaluate_rules(
            verifier,
            draft,
            problems[: args.sampled_problems],
            rules,
            m=8,
            settings=SETTINGS,
            max_new_tokens=1,
            samples=args.samples,
            drift=True,
            out=args.records.replace(".jsonl", "_sampled.jsonl"),
            progress=True,
        )
    # the time spent, over every run that made the records (each record keeps its share of its unit's time)
    clock = {"exact": run_seconds(exact), "sampled": run_seconds(sampled)}
    summary = summarize_exact(exact, n_boot=args.bootstrap)
    checked = sampled_rows(sampled, exact, methods) if sampled else []
    records_path = write_records(exact, os.path.join(args.out, f"{args.name}_records.jsonl.gz"))
    if sampled:  # token ids and per-token drift kept; the answers' texts are their token ids again
        write_records(sampled, os.path.join(args.out, f"{args.name}_sampled_records.jsonl.gz"), drop=("text",))
    per_1000 = clock["exact"] / len(problems) * 1000 / 60
    command = (
        f"python experiments/quality_exact.py --data DATA --sampled-problems {args.sampled_problems} "
        f"--samples {args.samples}"
        + (f" --limit {args.limit}" if args.limit else "")
        + (f" --rules '{args.rules}'" if args.rules != RULES else "")
        + (f" --name {args.name}" if args.name != "quality_exact" else "")
    )
    rows = {r["method"]: r for r in summary.rows if r["benchmark"] == args.benchmark}
    lines = [
        "# The exact quality referee on ARC-Challenge",
        "",
        f"Command: `{command}` ({machine_description()}; Qwen2.5-Coder-0.5B-Instruct drafting for 1.5B, Q4_K_M, "
        f"llama.cpp built with {verifier[0].kernels.replace(',', ', ')}, temperature 0.6, top-k 20, top-p 0.95). "
        f"{len(problems):,} problems of ARC-Challenge's test "
        f"set, every method's exact expected accuracy at the answer position in {clock['exact'] / 60:.1f} minutes "
        f"of one prompt pass per model per problem ({per_1000:.1f} minutes a thousand problems); the records are "
        f"`{args.name}_records.jsonl.gz` beside this page, and `cactus-theory evaluate --summarize` on them gives "
        "the table below.",
        "",
        'Accuracy: each method\'s probability of emitting the correct letter as the token after "Answer:" (the '
        "first position of a block: the draft there judged by the rule, its correction on a rejection), averaged "
        "over the problems; the verifier alone's is the mass q puts on it. Differences: per problem exact, their "
        "mean with the paired bootstrap's 95% interval over problems (2,000 resamples). The problems a ±0.5 and ±1 "
        "point interval would need: at this pair's spread of per-problem differences, at its accuracy on this "
        "benchmark; not the paper's 14B model at 92% on GSM8K. KL and TV: what each rule's law of the answer token "
        "spends against the verifier's, averaged over the problems (infinite where the rule emits a token the "
        "verifier's top-k / top-p excludes).",
        "",
        summary.table(),
    ]
    if checked:
        lines += [
            "",
            "## The same methods by sampling",
            "",
            f"The first {args.sampled_problems} problems, {args.samples} samples each per method, one token decoded at "
            f"the answer position by real speculative decoding (m = 8: the block's first token) and graded, in "
            f"{clock['sampled'] / 60:.1f} minutes; the interval: the bootstrap over those problems of each problem's "
            f"share of correct samples. The records: `{args.name}_sampled_records.jsonl.gz`.",
            "",
            sampled_table(checked),
        ]
    data = {
        "command": command,
        "machine": machine_description(),
        "minutes": {k: v / 60 for k, v in clock.items()},
        "minutes_per_1000": per_1000,
        "problems": summary.problems,
        "rows": summary.rows,
        "sampled": checked,
        "rules": rules,
        "records": os.path.basename(records_path),
        "lossless_difference": rows.get("sps", {}).get("difference"),
    }
    for path in write_results(args.out, args.name, markdown="\n".join(lines) + "\n", data=data):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
