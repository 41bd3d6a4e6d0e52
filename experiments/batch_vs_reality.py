"""Predicted against measured throughput of batched speculative decoding on this machine.

Usage:
    cactus-theory calibrate --engine llama.cpp --verifier MODELS/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --draft MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --batch 1,2,4 --max-block 9
    python experiments/batch_vs_reality.py --data DATA [--cost FILE] [--out docs/results]

1. Held-out prompts: GSM8K and HumanEval problems the embedded trace does not hold (the next
   --prompts / 2 of each after those it holds): the tasks of the trace the prediction reads,
   none of its prompts.
2. The prediction, before decoding: the embedded trace's AL of each rule at each m (the rows of
   the prompts' tasks), the calibration at each batch size (``CostModel.at_batch``), for
   requests of the held-out prompts' mean length and --max-new-tokens output tokens: the
   throughput speedup over the batch against the verifier alone at the same batch size
   (``batch_plan``), with its interval (AL's bootstrap and the timing spread).
3. The measurement: ``cactus-theory decode --engine llama.cpp --batch B`` of the held-out
   prompts, B at a time, with each rule and m, and the verifier alone at the same batch size
   (``--baseline``; a prompt's runs alternate in chunks): the throughput speedup (the batches'
   tokens over their wall times, against the verifier alone's) with a bootstrap 95% interval
   over batches (``batch_throughput``).

Writes OUT/batch_vs_reality.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from cactus_theory import analyze_trace, load_trace
from cactus_theory.decode import batch_throughput
from cactus_theory.io import machine_description, write_results
from cactus_theory.plan import batch_plan, default_cost_path, load_cost
from cactus_theory.traces import mixed_prompts, parse_rules

HERE = os.path.dirname(os.path.abspath(__file__))
PAIR = ("qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m")
SAMPLING = ["--temperature", "0.6", "--top-k", "20", "--top-p", "0.95"]


def heldout(args, trace):
    held = {s["id"] for s in trace.manifest["sequences"]}
    many = mixed_prompts(args.data, {"gsm8k": 200, "humaneval": 160})
    out = {"gsm8k": [], "humaneval": []}
    for p in many:
        if p.id not in held and len(out[p.task]) < args.prompts // 2:
            out[p.task].append(p)
    chosen = [p for pair in zip(out["gsm8k"], out["humaneval"], strict=False) for p in pair]
    return chosen


def _singletons(records):
    """Records decoded one at a time as batches of one (each its own wall time), for ``batch_throughput``."""
    return [
        dict(
            r,
            batch=2,
            batch_ids=[r["id"]],
            batch_seconds=r["seconds"],
            baseline=dict(r["baseline"], batch_seconds=r["baseline"]["seconds"]),
        )
        for r in records
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="benchmark data directory (default: $CACTUS_THEORY_DATA)")
    parser.add_argument("--models", default=os.path.expanduser("~/.cache/cactus_theory/models"))
    parser.add_argument("--cost", default=None, help="a calibration with --batch (default: calibrate's file)")
    parser.add_argument("--trust-cost", action="store_true")
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts (half GSM8K, half HumanEval)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--m", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rules", default="sps,cactus(delta=1)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--trace", default=None, help="the trace the prediction reads (default: the embedded one)")
    parser.add_argument("--out", default=os.path.join(HERE, "..", "docs", "results"))
    args = parser.parse_args(argv)
    cost_path = args.cost or default_cost_path(*PAIR, "llamacpp", "cpu")
    cost = load_cost(cost_path)
    if cost.problems() and not args.trust_cost:
        sys.exit("the calibration has problems: " + "; ".join(cost.problems()) + " (recalibrate, or --trust-cost)")
    trace = load_trace(args.trace)
    prompts = heldout(args, trace)
    rules = parse_rules(args.rules, (1.0,))
    from cactus_theory.hf import encode_chat, load_model

    verifier = os.path.join(args.models, PAIR[0] + ".gguf")
    draft = os.path.join(args.models, PAIR[1] + ".gguf")
    tokenizer = load_model(verifier, engine="llama.cpp", progress=False, sequences=1)[1]
    prompt_tokens = float(np.mean([len(encode_chat(tokenizer, p.text)) for p in prompts]))
    tasks = sorted({p.task for p in prompts})
    result = analyze_trace(trace, rules, ms=tuple(args.m), n_boot=args.bootstrap, progress=False, tasks=tasks)
    plans = batch_plan(
        result,
        cost,
        args.batch,
        prompt_tokens=prompt_tokens,
        output_tokens=args.max_new_tokens,
        allow_untrusted=args.trust_cost,
    )
    work = tempfile.mkdtemp(prefix="batch-vs-reality-")
    prompt_file = os.path.join(work, "prompts.jsonl")
    with open(prompt_file, "w") as fh:
        for p in prompts:
            fh.write(json.dumps({"id": p.id, "text": p.text, "task": p.task}) + "\n")
    records = os.path.join(work, "records.jsonl")
    rows = []
    for size in args.batch:
        for m in args.m:
            print(f"decoding at batch {size}, m={m} ...", file=sys.stderr, flush=True)
            argv_ = [
                sys.executable,
                "-m",
                "cactus_theory",
                "decode",
                "--engine",
                "llama.cpp",
                "--verifier",
                verifier,
                "--draft",
                draft,
                "--prompts",
                prompt_file,
                "--field",
                "text",
                "--rule",
                args.rules,
                "-m",
                str(m),
                "--batch",
                str(size),
                "--baseline",
                "--max-new-tokens",
                str(args.max_new_tokens),
                *SAMPLING,
                "--quiet",
                "--out",
                records,
            ]
            done = subprocess.run(argv_, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"decoding failed: {done.stderr[-2000:]}")
    recs = [json.loads(line) for line in open(records)]
    for size in args.batch:
        for rule in rules:
            label = rule.describe()
            for m in args.m:
                sel = [r for r in recs if r["rule"] == label and r["m"] == m and r.get("batch", 1) == size]
                got = batch_throughput(sel if size > 1 else _singletons(sel), n_boot=args.bootstrap)
                pred = next(r for r in plans[size].rows if r["rule"] == label and r["m"] == m and r["task"] == "all")
                al = sum(sum(r["accepted"]) for r in sel) / sum(len(r["accepted"]) for r in sel)
                rows.append(
                    {
                        "batch": size,
                        "rule": label,
                        "m": m,
                        "measured": got["speedup"],
                        "measured_lo": got["speedup_lo"],
                        "measured_hi": got["speedup_hi"],
                        "measured_tokens_per_second": got["tokens_per_second"],
                        "alone_tokens_per_second": got["alone_tokens_per_second"],
                        "measured_al": al,
                        "trace_al": pred["al"],
                        "predicted": pred["request_speedup"],
                        "predicted_lo": pred["request_speedup_lo"],
                        "predicted_hi": pred["request_speedup_hi"],
                        "error": pred["request_speedup"] / got["speedup"] - 1,
                        "batches": got["batches"],
                    }
                )
    result_json = {
        "cost": cost_path,
        "machine": machine_description(),
        "prompts": [p.id for p in prompts],
        "prompt_tokens": prompt_tokens,
        "rows": rows,
    }
    text = markdown(result_json, cost, args)
    write_results(args.out, "batch_vs_reality", markdown=text, data=result_json)
    print(text)


def markdown(r, cost, args):
    lines = [
        f"Measured by `python experiments/batch_vs_reality.py --data DATA{' --trust-cost' if args.trust_cost else ''}` "
        f"on {r['machine']} (llama.cpp, Qwen2.5-Coder "
        f"0.5B drafting for 1.5B; {len(r['prompts'])} held-out prompts of the embedded trace's tasks, mean prompt "
        f"{r['prompt_tokens']:.0f} tokens, up to {args.max_new_tokens} output tokens), predicted from the embedded "
        "trace "
        "and a calibration at the same batch sizes made before (`calibrate --engine llama.cpp --batch "
        f"{','.join(map(str, args.batch))}`).",
        "",
        "| batch | rule | m | measured throughput speedup [95% CI] | predicted [95% CI] | error | AL measured / "
        "trace | tok/s speculative / alone |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        inside = row["predicted_lo"] <= row["measured"] <= row["predicted_hi"]
        lines.append(
            f"| {row['batch']} | {row['rule']} | {row['m']} | {row['measured']:.2f}x [{row['measured_lo']:.2f}, "
            f"{row['measured_hi']:.2f}] | {row['predicted']:.2f}x [{row['predicted_lo']:.2f}, "
            f"{row['predicted_hi']:.2f}]{'' if inside else ' (outside)'} | {row['error']:+.1%} | "
            f"{row['measured_al']:.2f} / {row['trace_al']:.2f} | {row['measured_tokens_per_second']:.2f} / "
            f"{row['alone_tokens_per_second']:.2f} |"
        )
    within = sum(abs(x["error"]) <= 0.15 for x in r["rows"])
    covered = sum(x["predicted_lo"] <= x["measured"] <= x["predicted_hi"] for x in r["rows"])
    lines += [
        "",
        f"Within 15% of the measurement: {within} of {len(r['rows'])} cells; the measurement inside the "
        f"predicted interval: {covered} of {len(r['rows'])}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
