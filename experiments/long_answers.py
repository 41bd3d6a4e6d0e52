"""Long answers at power: any rule's accuracy on GSM8K from one pool of answers, weighted by exact sequence
likelihoods, beside the sampled referee's estimate from each method's own answers.

Usage:
    python experiments/fetch_models.py       # once: the Qwen2.5-Coder 0.5B / 1.5B GGUF files
    python experiments/long_answers.py --data DIR [--minutes 60] [--decode 'sps,cactus(delta=1)'] [--batch 4]
        [--rescore RULES] [--records ~/.cache/cactus_theory/long_answers/records.jsonl] [--out docs/results]

The verifier alone and each rule of --decode answer GSM8K's test problems from the first, in groups of --batch,
every method on a group before the next starts, until --minutes of decoding are spent (counted across resumed runs
from the records' own time; rerun the command to continue, --minutes 0 to rewrite the page from the records alone).
Each answer keeps both models' top-20 raw logits at every position (``evaluate_rules(rows=20)``: teacher-forced
after the answer), so every rule of --rescore (default: SpS, Cactus over its grid, relaxed-topk, the lossy rule,
TAS and MARS) is estimated at m from all decoded answers at once (``pooled_from_records``), with its effective
sample size and mean weight, and refused or flagged where the pool is too thin. Check: each decoded rule is also
estimated from the pool without its own answers, against its own answers (``--decode`` rules, as the sampled
referee grades them). Qwen2.5-Coder-0.5B-Instruct drafts for 1.5B-Instruct (Q4_K_M, llama.cpp), the paper's sampling
(temperature 0.6, top-k 20, top-p 0.95), m = 8, at most 512 new tokens.

Writes OUT/long_answers.md and OUT/long_answers.json, and the records beside them (long_answers_records.jsonl.gz,
the answers' texts dropped): ``cactus-theory evaluate --rescore`` on them gives the pooled table.
"""

from __future__ import annotations

import argparse
import os
import sys

from common import CACHE, DRAFT, RESULTS, SETTINGS, VERIFIER, count, number

from cactus_theory import evaluate_rules, load_model
from cactus_theory.io import machine_description, run_seconds, write_records, write_results
from cactus_theory.quality import load_problems, pooled_from_records, pooled_table, read_records, summarize_records
from cactus_theory.rules import make_rules

DECODE = "sps,cactus(delta=1)"
RESCORE = (
    "sps,cactus(delta=0.25),cactus(delta=0.5),cactus(delta=1),cactus(delta=2),cactus(delta=4),"
    "relaxed-topk(top_n=10,delta=0.3),lossy(alpha=0.5),tas,mars"
)
ROWS = 20


def decode(args, problems, rules):
    """Groups of ``--batch`` problems, every method on a group, until ``--minutes`` of decoding are spent."""
    spent = run_seconds(read_records(args.records)) if os.path.exists(args.records) else 0.0
    upto, pair = 0, None
    while spent < 60 * args.minutes and upto < len(problems):
        upto = min(len(problems), upto + args.batch)
        if pair is None:
            pair = [
                load_model(os.path.join(args.models, n), engine="llama.cpp", sequences=args.batch)
                for n in (VERIFIER, DRAFT)
            ]
        options = {"m": args.m, "settings": SETTINGS, "max_new_tokens": args.max_new_tokens, "batch": args.batch}
        evaluate_rules(*pair, problems[:upto], rules, out=args.records, progress=False, rows=ROWS, **options)
        spent = run_seconds(read_records(args.records))
        print(f"{upto} problems, {spent / 60:.1f} of {args.minutes:g} minutes", file=sys.stderr, flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=os.path.join(CACHE, "models"))
    parser.add_argument("--data", required=True, help="the benchmark directory (gsm8k/test.jsonl)")
    parser.add_argument("--decode", default=DECODE, help="the rules decoded beside the verifier alone")
    parser.add_argument("--rescore", default=RESCORE, help="the rules estimated from the pool")
    parser.add_argument("--minutes", type=number(0), default=60.0, help="decoding time to spend (0: the page only)")
    parser.add_argument("--batch", type=count(), default=4)
    parser.add_argument("-m", type=count(), default=8)
    parser.add_argument("--max-new-tokens", type=count(), default=512)
    parser.add_argument("--bootstrap", type=count(100), default=2000)
    parser.add_argument("--records", default=os.path.join(CACHE, "long_answers", "records.jsonl"))
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)
    decoded = [r.describe() for r in make_rules(args.decode)]
    rescored = [r.describe() for r in make_rules(args.rescore)]
    problems = load_problems("gsm8k", args.data)
    os.makedirs(os.path.dirname(os.path.abspath(args.records)), exist_ok=True)
    if args.minutes > 0:
        decode(args, problems, decoded)
    if not os.path.exists(args.records):
        raise SystemExit(f"no records in {args.records}: run with --minutes > 0 first")
    held = read_records(args.records)
    page(args, held, decoded, rescored)
    return 0


def page(args, held, decoded, rescored):
    """The page from the records alone."""
    own = summarize_records(held, n_boot=args.bootstrap)
    pooled = pooled_from_records(held, rescored, n_boot=args.bootstrap)
    checks = []
    for rule in decoded:  # the pool without the rule's own answers, against its own answers
        others = [r for r in held if r["method"] != rule]
        row = next(r for r in pooled_from_records(others, [rule], n_boot=args.bootstrap) if r["method"] == rule)
        mine = next(r for r in own.rows if r["method"] == rule and r["benchmark"] == "gsm8k")
        checks.append({"rule": rule, "pooled_without_own": row, "own_answers": mine})
    minutes = run_seconds(held) / 60
    rows_seconds = sum(r.get("rows_seconds", 0.0) for r in held)
    answers = len(held)
    problems = len({r["id"] for r in held})
    write_records(held, os.path.join(args.out, "long_answers_records.jsonl.gz"), drop=("text",))
    command = (
        f"python experiments/long_answers.py --data DATA --minutes {args.minutes:g} --decode '{args.decode}' "
        f"--batch {args.batch}"
    )
    lines = [
        "# Long answers from one pool, weighted by exact likelihoods",
        "",
        f"Command: `{command}` ({machine_description()}; Qwen2.5-Coder-0.5B-Instruct drafting for 1.5B, Q4_K_M, "
        f"llama.cpp, batch {args.batch}, m = {args.m}, temperature 0.6, top-k 20, top-p 0.95, at most "
        f"{args.max_new_tokens} new tokens). {answers} graded answers to the first {problems} GSM8K test problems "
        f"(the verifier alone and {', '.join(decoded)}, one answer each) in {minutes:.0f} minutes of the units' wall "
        "time, of which "
        f"{rows_seconds / 60:.1f} minutes teacher-forced both models after each answer to keep their top-{ROWS} "
        f"logits at every position. {pooled[0]['dropped']} answers whose teacher-forced rows give one of their own "
        "tokens probability 0 under their own method (the batched decoding and the teacher-forced pass round "
        "differently, and a token at the edge of top-p falls out) are left out of the pool, never of the sampled "
        "quality referee's table. The records are `long_answers_records.jsonl.gz` beside this page; "
        "`cactus-theory evaluate --rescore` on them gives the pooled table, `--summarize` the sampled one.",
        "",
        "## Each method's own answers (the sampled referee)",
        "",
        own.table(),
        "",
        "## Every rule from the pool",
        "",
        "Each rule's accuracy from all the answers at once (multiple importance sampling, balance heuristic, with "
        "the weights' known mean as a control variate; `pooled_accuracy`), its difference from the verifier alone "
        "paired on the same answers, 95% bootstrap intervals over problems; effective answers a problem (Kish) and "
        "the mean weight (near 1 where the pool covers the rule's answers). Below 1 effective answer a problem (as "
        "much as decoding the rule once) "
        "a rule falls back to its own answers where it was decoded and is refused where it was not.",
        "",
        pooled_table(pooled),
        "",
        "## A decoded rule rescored from the others' answers",
        "",
        "| rule | pooled without its own answers: difference, points [95%] | effective answers / problem | "
        "its own answers: difference, points [95%] |",
        "|---|---|---|---|",
    ]
    for c in checks:
        p, o = c["pooled_without_own"], c["own_answers"]
        pooled_cell = (
            f"{100 * p['difference']:+.1f} [{100 * p['difference_lo']:+.1f}, {100 * p['difference_hi']:+.1f}] "
            f"({p['estimate']})"
            if p["estimate"] != "refused"
            else "refused: too few effective answers"
        )
        lines.append(
            f"| {c['rule']} | {pooled_cell} | {p['ess_per_problem']:.2f} | "
            f"{100 * o['difference']:+.1f} [{100 * o['low']:+.1f}, {100 * o['high']:+.1f}] |"
        )
    data = {
        "command": command,
        "machine": machine_description(),
        "minutes": minutes,
        "rows_minutes": rows_seconds / 60,
        "answers": answers,
        "problems": problems,
        "own": own.rows,
        "pooled": pooled,
        "checks": checks,
    }
    for path in write_results(args.out, "long_answers", markdown="\n".join(lines) + "\n", data=data):
        print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
