"""The quality referee on the real pair: what relaxing verification costs in answers, paired against the
verifier alone, beside the drift each rule spent, and the paper's Table 1 with the intervals its rows
would have had.

Usage:
    python experiments/fetch_models.py     # once: the Qwen2.5-Coder 0.5B / 1.5B GGUF files
    python experiments/quality_referee.py --data DIR [--minutes 60] [--batch 4] [--max-new-tokens 512]
        [--benchmarks gsm8k,humaneval] [--rules 'sps,cactus(delta=1),cactus(delta=4),lossy(alpha=0.5),always-accept']
        [--records ~/.cache/cactus_theory/quality/records.jsonl] [--out docs/results] [--allow-code-execution]

Qwen2.5-Coder-0.5B-Instruct drafts for 1.5B (Q4_K_M, llama.cpp), m = 8, the paper's sampling (temperature
0.6, top-k 20, top-p 0.95), one sample per problem and method, each seeded by the problem, the method and
the sample. The problems go in groups of --batch, alternating between the benchmarks (the first of each,
in file order), every method decoding a group before the next group starts, until --minutes of decoding
are spent (counted across resumed runs). The records file keeps every graded answer: rerun the same
command to continue, or with --minutes 0 to rewrite the page from the records alone. The lossy controls
(lossy(alpha=0.5): acceptance doubled; always-accept: the drafter's own tokens) must show a loss for the
referee to be believed. HumanEval's and MBPP's answers are programs: they run (isolated by the operating
system) only with --allow-code-execution.

Writes OUT/quality.md and OUT/quality.json.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from common import CACHE, DRAFT, SETTINGS, VERIFIER
from scipy import stats

from cactus_theory import evaluate_rules, load_model
from cactus_theory.io import machine_description, run_seconds, write_records, write_results
from cactus_theory.quality import load_problems, read_records, summarize_records
from cactus_theory.rules import make_rules

RULES = "sps,cactus(delta=1),cactus(delta=4),lossy(alpha=0.5),always-accept"
#: The paper's sampling.
#: The paper's Table 1 (Qwen3-14B verifier, Qwen3-0.6B draft, m = 20): accuracy in %, on GSM8K's 1,319 test
#: problems and GPQA-Diamond's 198 questions, one seeded run each.
PAPER = {
    "GSM8K": (
        1319,
        {"verifier alone": 91.71, "SpS": 91.89, "TAS": 92.87, "Cactus δ=0.75": 92.15, "Cactus δ=1.0": 92.87},
    ),
    "GPQA": (198, {"verifier alone": 40.07, "SpS": 40.91, "TAS": 40.40, "Cactus δ=0.75": 45.46, "Cactus δ=1.0": 45.46}),
}
_Z = 1.959963984540054


def interleaved(groups, batch):
    """The problems of several benchmarks in groups of ``batch``, one group of each in turn."""
    out, start = [], 0
    while any(start < len(g) for g in groups):
        for g in groups:
            out.extend(g[start : start + batch])
        start += batch
    return out


def wilson(correct, n):
    """The 95% Wilson score interval of a proportion, in % (scipy's ``binomtest``)."""
    ci = stats.binomtest(int(correct), int(n)).proportion_ci(confidence_level=0.95, method="wilson")
    return 100 * ci.low, 100 * ci.high


def paper_rows():
    """Each row of the paper's Table 1: its accuracy's 95% interval; for a method, the difference from the
    verifier alone with the unpaired 95% interval (Newcombe's hybrid score, from the two Wilson
    intervals), and the most problems whose verdict could have changed for a paired interval to show it
    (a paired interval is ±1.96 sqrt(D) / n with D discordant problems, at least |difference| n)."""
    rows = []
    for bench, (n, accs) in PAPER.items():
        base = accs["verifier alone"]
        b_lo, b_hi = wilson(round(base * n / 100), n)
        for method, acc in accs.items():
            k = round(acc * n / 100)
            lo, hi = wilson(k, n)
            row = {"benchmark": bench, "method": method, "n": n, "accuracy": acc, "low": lo, "high": hi}
            if method != "verifier alone":
                d = acc - base
                row["difference"] = d
                row["unpaired_low"] = d - math.sqrt((acc - lo) ** 2 + (b_hi - base) ** 2)
                row["unpaired_high"] = d + math.sqrt((hi - acc) ** 2 + (base - b_lo) ** 2)
                moved = abs(d) * n / 100
                row["min_discordant"] = math.ceil(moved - 1e-9)
                row["max_discordant_to_show"] = math.floor((moved / _Z) ** 2)
            rows.append(row)
    return rows


def paper_table(rows):
    lines = [
        "| benchmark | method | problems | accuracy % [95%] | difference, points | unpaired 95% interval | "
        "shown by a paired interval only if at most ... problems changed verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        acc = f"{r['accuracy']:.2f} [{r['low']:.1f}, {r['high']:.1f}]"
        if "difference" not in r:
            lines.append(f"| {r['benchmark']} | {r['method']} | {r['n']:,} | {acc} | - | - | - |")
            continue
        need = r["max_discordant_to_show"]
        shown = (
            f"{need} ({100 * need / r['n']:.1f}% of problems; at least {r['min_discordant']} did)"
            if need >= r["min_discordant"]
            else "never"
        )
        lines.append(
            f"| {r['benchmark']} | {r['method']} | {r['n']:,} | {acc} | {r['difference']:+.2f} | "
            f"[{r['unpaired_low']:+.1f}, {r['unpaired_high']:+.1f}] | {shown} |"
        )
    return "\n".join(lines)


def _clock(path, main):
    """Seconds of decoding spent so far, per phase ({"main": ..., "control": ...}), over every run that made the
    records at ``path`` (each record keeps its share of its unit's time, ``run_seconds``): "main" the records of
    ``main`` ({(benchmark, problem id, method)}), "control" the rest."""
    if not os.path.exists(path):
        return {"main": 0.0, "control": 0.0}
    held = read_records(path)
    mine = [r for r in held if (r["benchmark"], r["id"], r["method"]) in main]
    return {"main": run_seconds(mine), "control": run_seconds(held) - run_seconds(mine)}


class _Pair:
    """The model pair, loaded on first use (a rerun that only writes the page loads nothing)."""

    def __init__(self, args):
        self.args, self.models = args, None

    def get(self):
        if self.models is None:
            pair = [os.path.join(self.args.models, name) for name in (VERIFIER, DRAFT)]
            self.models = [load_model(path, engine="llama.cpp", sequences=self.args.batch) for path in pair]
        return self.models


def decode(args, pair, problems, rules, per_round, phase, minutes, main):
    """Groups of ``per_round`` problems, every method on a group, until ``minutes`` of this phase's decoding
    are spent (counted across resumed runs from the records' own time; ``evaluate_rules`` skips what the records
    hold)."""
    upto, spent = 0, _clock(args.records, main)[phase]
    while spent < 60 * minutes and upto < len(problems):
        upto = min(len(problems), upto + per_round)
        verifier, draft = pair.get()
        options = {
            "m": args.m,
            "settings": SETTINGS,
            "max_new_tokens": args.max_new_tokens,
            "batch": args.batch,
            "allow_code_execution": args.allow_code_execution,
            "benchmarks": args.all_benchmarks,  # one records file for both phases
        }
        evaluate_rules(verifier, draft, problems[:upto], rules, out=args.records, progress=False, **options)
        spent = _clock(args.records, main)[phase]
        print(f"{phase}: {upto} problems, {spent / 60:.1f} of {minutes:g} minutes", file=sys.stderr, flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=os.path.join(CACHE, "models"))
    parser.add_argument("--data", required=True, help="the benchmark directory (gsm8k, humaneval, mbpp)")
    parser.add_argument("--benchmarks", default="gsm8k,humaneval")
    parser.add_argument("--rules", default=RULES)
    parser.add_argument("--minutes", type=float, default=60.0, help="decoding time to spend (0: the page only)")
    parser.add_argument("--control", default="always-accept", help="the positive control, decoded on more problems")
    parser.add_argument("--control-benchmark", default="gsm8k")
    parser.add_argument("--control-minutes", type=float, default=30.0, help="its extra decoding time (0: none)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many problems per benchmark")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("-m", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--records", default=os.path.join(CACHE, "quality", "records.jsonl"))
    parser.add_argument(
        "--allow-code-execution",
        action="store_true",
        help="run the programs the models write (HumanEval, MBPP), isolated by the operating system",
    )
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "results")
    )
    args = parser.parse_args(argv)
    benches = args.benchmarks.split(",")
    args.all_benchmarks = sorted({*benches, *([args.control_benchmark] if args.control else [])})
    groups = [load_problems(b, args.data, limit=args.limit) for b in benches]
    problems = interleaved(groups, args.batch)
    rules = [r.describe() for r in make_rules(args.rules)]
    control = make_rules(args.control)[0].describe() if args.control else None
    os.makedirs(os.path.dirname(os.path.abspath(args.records)), exist_ok=True)
    pair = _Pair(args)
    main = {(p.benchmark, p.id, m) for p in problems for m in ["verifier alone", *rules]}
    if args.minutes > 0:
        per_round = args.batch * len(benches)
        decode(args, pair, problems, rules, per_round, "main", args.minutes, main)
    if control and args.control_minutes > 0:  # the control and the verifier alone on further problems
        more = load_problems(args.control_benchmark, args.data)
        decode(args, pair, more, [control], args.batch, "control", args.control_minutes, main)
    if not os.path.exists(args.records):
        raise SystemExit(f"no records in {args.records}: run with --minutes > 0 first")
    clock = _clock(args.records, main)
    summary = summarize_records(args.records, n_boot=args.bootstrap)
    records_count = sum(1 for line in open(args.records, encoding="utf-8") if line.strip())
    # the records beside the page, compressed: token ids and per-token drift kept, the answers' texts not
    held = read_records(args.records)
    write_records(held, os.path.join(args.out, "quality_records.jsonl.gz"), drop=("text",))
    kernels = held[0].get("setting", {}).get("arithmetic", {}).get("verifier", {}).get("kernels") if held else None
    built = f" built with {kernels.replace(',', ', ')}" if kernels else ""
    paper = paper_rows()
    command = (
        f"python experiments/quality_referee.py --data DATA --minutes {args.minutes:g} --batch {args.batch} "
        f"--max-new-tokens {args.max_new_tokens} --benchmarks {args.benchmarks} --control {args.control} "
        f"--control-minutes {args.control_minutes:g}" + (" --allow-code-execution" if args.allow_code_execution else "")
    )
    counts = ", ".join(f"{b}: {n}" for b, n in summary.problems.items() if b != "all")
    per_method = {}
    for r in summary.rows:
        if r["benchmark"] != "all":
            per_method.setdefault(r["method"], []).append(f"{r['benchmark']} {r['problems']}")
    lines = [
        "# The quality referee on the real pair",
        "",
        f"Command: `{command}` ({machine_description()}; Qwen2.5-Coder-0.5B-Instruct drafting for 1.5B, Q4_K_M, "
        f"llama.cpp{built}, batch {args.batch}, m = {args.m}, temperature 0.6, top-k 20, top-p 0.95, at most "
        f"{args.max_new_tokens} new tokens, one sample per problem and method). {records_count} graded answers in "
        f"{clock['main'] / 60:.0f} minutes of decoding every method on the first problems of each benchmark, "
        f"alternating between them, then {clock['control'] / 60:.0f} minutes of the positive control "
        f"({control}) and the verifier alone on further {args.control_benchmark} problems; the problems the "
        f"verifier alone decoded: {counts}; each method's: "
        + "; ".join(f"{m}: {', '.join(v)}" for m, v in per_method.items())
        + ". The records are `quality_records.jsonl.gz` beside this page (token ids and per-token drift kept, the "
        "answers' texts not); `cactus-theory evaluate --summarize` on them gives the table below. The problems a ±1 "
        "and ±2 point interval would need are this pair's spread at its accuracy on these benchmarks, not the "
        "paper's 14B model at 92%.",
        "",
        "Differences are the method's accuracy minus the verifier alone's on the same problems, in points, with "
        "the 95% paired bootstrap interval over problems; McNemar's exact p-value; the problems a ±1 and ±2 "
        "point interval would need at the observed spread. GSM8K: strict (grade-school-math's `####` "
        "extraction) / flexible (lm-evaluation-harness's last number). KL / token and KL / answer: the drift each "
        "rule spent on these answers (per emitted token, KL(law it was emitted from || verifier's); summed along "
        "each answer: `answer_drift`'s quantity).",
        "",
        summary.table(),
        "",
        "## The paper's Table 1, with the intervals its rows would have had",
        "",
        "One seeded run per row, so each accuracy has its binomial interval; the difference from the verifier "
        "alone is unpaired here (the paper gives no per-problem table): a paired interval is narrower when the "
        "methods agree on most problems, and the last column says how few problems could have changed verdict "
        "for it to show the difference.",
        "",
        paper_table(paper),
    ]
    data = {
        "command": command,
        "machine": machine_description(),
        "minutes": {k: v / 60 for k, v in clock.items()},
        "control": control,
        "answers": records_count,
        "problems": summary.problems,
        "rows": summary.rows,
        "paper": paper,
        "rules": rules,
        "batch": args.batch,
        "m": args.m,
        "max_new_tokens": args.max_new_tokens,
    }
    for path in write_results(args.out, "quality", markdown="\n".join(lines) + "\n", data=data):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
