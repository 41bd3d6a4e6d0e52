"""Predicted speedups against the measured ones, and the paper's regime.

Usage:
    cactus-theory calibrate --verifier MODELS/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --draft MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --dtype bfloat16 --context 384
    python experiments/plan_vs_reality.py [--cost FILE] [--out docs/results]

1. Reality. ``docs/results/real_decoding.json`` holds the speedups measured on this machine
   (Qwen2.5-Coder 0.5B drafting for 1.5B, bfloat16, m = 8, up to 512 new tokens; 30 GSM8K and
   20 HumanEval problems). The prediction uses the embedded trace (the same pair and sampling
   settings) and the calibration of this machine (``--cost``, by default the file that
   ``calibrate`` writes for that pair in bfloat16 on the CPU). Two predictions per rule and
   task: from the trace's AL (what a user has before decoding anything) and from the measured
   AL (the cost model alone). Error = prediction / measured - 1.
2. The paper's regime: a 0.6B drafter for a 14B verifier on one A100 at batch size 1, where a
   forward pass is bound by reading the weights, so a token's cost scales with the parameter
   count: cost ratio 0.6 / 14 = 0.043, block cost flat in m. With it, m = 10 and the embedded
   trace: the predicted speedups of SpS, TAS and Cactus beside the paper's "up to ~1.9x"; and at
   m = 20 the AL beside its Table 1 (a different model pair: the comparison is of the regime).

Writes plan_vs_reality.md / .json and plan_this_machine.png / plan_ratio_0.05.png into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from cactus_theory import (
    analyze_trace,
    default_cost_path,
    figure_png,
    load_cost,
    load_trace,
    parse_rules,
    plot_plan,
    predict_speedup,
)
from cactus_theory.io import atomic_write

HERE = os.path.dirname(os.path.abspath(__file__))
PAIR = ("qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m")
#: real_decoding.json's methods and the rule each ran (experiments/real_decoding_table.py)
METHODS = {
    "sps": "sps",
    "tas": "tas",
    "cactus": "cactus(delta=1)",
    "cactus-exact": "cactus-exact(delta=1)",
    "mentored": "mentored(delta=1)",
}
PAPER_RATIO = 0.6 / 14
PAPER_TABLE1 = {  # Hao & Mou, ICLR 2026, Table 1 (Qwen3-14B + 0.6B, m = 20): AL on GSM8K, GPQA
    "sps": (5.11, 3.84),
    "tas": (6.78, 6.41),
    "cactus(delta=0.75)": (7.15, 6.46),
    "cactus(delta=1)": (7.00, 6.74),
}


def reality(cost, m=8, real_path=None, trace=None, n_boot=1000):
    real_path = real_path or os.path.join(HERE, "..", "docs", "results", "real_decoding.json")
    with open(real_path, encoding="utf-8") as fh:
        real = json.load(fh)["rows"]
    result = analyze_trace(load_trace(trace), list(METHODS.values()), ms=(m,), n_boot=n_boot, progress=False)
    plan = predict_speedup(result, cost)
    by = {(r["rule"], r["task"]): r for r in plan.rows}
    rows = []
    for rec in real:
        if rec["method"] not in METHODS:
            continue
        rule, task = METHODS[rec["method"]], rec["task"]
        pred = by[rule, task]
        from_real_al = float(cost.speedup(m, rec["al"]))
        rows.append(
            {
                "rule": rule,
                "task": task,
                "measured_speedup": rec["speedup"],
                "measured_al": rec["al"],
                "trace_al": pred["al"],
                "predicted_speedup": pred["speedup"],
                "predicted_lo": pred["speedup_lo"],
                "predicted_hi": pred["speedup_hi"],
                "error": pred["speedup"] / rec["speedup"] - 1,
                "speedup_from_measured_al": from_real_al,
                "error_cost_model_only": from_real_al / rec["speedup"] - 1,
            }
        )
    baseline = {rec["task"]: rec["tokens_per_second"] for rec in real if rec["method"] == "verifier"}
    return rows, baseline


def paper_regime(trace=None, n_boot=1000):
    rules = parse_rules("sps,tas,cactus,cactus-exact", (0.75, 1.0))
    result = analyze_trace(load_trace(trace), rules, ms=(10, 20), n_boot=n_boot, progress=False)
    plan = predict_speedup(result, PAPER_RATIO)
    return [r for r in plan.rows if r["task"] in ("all", "gsm8k")]


def markdown(cost, rows, baseline, paper):
    v = cost.verify_block
    lines = [
        "# Predicted against measured speedups",
        "",
        "Command: `python experiments/plan_vs_reality.py` after `cactus-theory calibrate --verifier "
        "MODELS/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --draft MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf "
        "--dtype bfloat16 --context 384` (MODELS: `~/.cache/cactus_theory/models`, from "
        "`experiments/fetch_models.py`).",
        "",
        f"Calibration ({cost.source.get('machine', '?')}, {cost.source.get('dtype', '?')}, torch threads "
        f"{cost.source.get('threads', '?')}, context {cost.source.get('context', '?')} tokens): a drafted token "
        f"{cost.draft_token * 1e3:.0f} ms, a verifier block of 1 token {v[1] * 1e3:.0f} ms, of 9 tokens "
        f"{float(cost.verify(9)) * 1e3:.0f} ms, of {max(v)} tokens {v[max(v)] * 1e3:.0f} ms; overhead "
        f"{cost.step_overhead * 1e3:.2f} ms per step and {cost.judge_token * 1e3:.2f} ms per judged token. Draft / "
        f"verifier cost ratio {cost.draft_token / v[1]:.2f}. The verifier alone is predicted at "
        f"{1 / v[1]:.2f} tokens/s; it measured {baseline.get('gsm8k', float('nan')):.2f} (GSM8K) and "
        f"{baseline.get('humaneval', float('nan')):.2f} (HumanEval).",
        "",
        "## This machine: m = 8, the measured runs of `docs/results/real_decoding.md`",
        "",
        "| rule | task | measured speedup | predicted (trace AL) [95% CI] | error | predicted from the measured AL "
        "| error (cost model only) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['rule']} | {r['task']} | {r['measured_speedup']:.2f}x | {r['predicted_speedup']:.2f}x "
            f"[{r['predicted_lo']:.2f}, {r['predicted_hi']:.2f}] | {r['error']:+.1%} | "
            f"{r['speedup_from_measured_al']:.2f}x | {r['error_cost_model_only']:+.1%} |"
        )
    worst = max(abs(r["error"]) for r in rows)
    worst_cost = max(abs(r["error_cost_model_only"]) for r in rows)
    lines += [
        "",
        f"Largest error: {worst:.1%} from the trace, {worst_cost:.1%} from the measured AL (target: 10%).",
        "",
        "What the model does not capture: the extra draft forward after a fully accepted block (the "
        "draft's cache must see the last draft); the prompt's prefill, paid once per problem by both; "
        "the context growing to 512 + prompt tokens while the calibration holds 384; end-of-sequence "
        "truncation of the last step; and the trace's AL, which comes from the first 128 tokens of 22 "
        "problems per task (`docs/results/decoding_vs_simulation.md`: within ±8% of the real AL). The "
        "n-gram drafter (`cactus-ngram`, 1.98x measured) has no draft model to calibrate and no "
        "distribution in the trace: not predicted.",
        "",
        "## The paper's regime (cost ratio 0.6 / 14 = 0.043, flat block cost)",
        "",
        "Qwen3-0.6B drafting for Qwen3-14B on one A100 at batch size 1: a forward pass reads all the "
        "weights, so its time scales with the parameter count (our assumption: 0.6 / 14), and "
        "verifying 11 tokens costs what verifying one does. Predictions from the embedded trace "
        "(Qwen2.5-Coder 0.5B / 1.5B: a different pair; the regime, not the models, is compared):",
        "",
        "| rule | task | m = 10: AL | predicted speedup [95% CI] | m = 20: AL | Table 1 AL (GSM8K, GPQA) |",
        "|---|---|---|---|---|---|",
    ]
    by = {(r["rule"], r["task"], r["m"]): r for r in paper}
    for rule in dict.fromkeys(r["rule"] for r in paper):
        for task in ("all", "gsm8k"):
            ten, twenty = by.get((rule, task, 10)), by.get((rule, task, 20))
            if ten is None:
                continue
            ref = PAPER_TABLE1.get(rule)
            lines.append(
                f"| {rule} | {task} | {ten['al']:.2f} | {ten['speedup']:.2f}x [{ten['speedup_lo']:.2f}, "
                f"{ten['speedup_hi']:.2f}] | {twenty['al']:.2f} | {f'{ref[0]:.2f}, {ref[1]:.2f}' if ref else '-'} |"
            )
    lines += [
        "",
        "The paper reports wall-time gains of up to about 1.9x at m = 10 (vLLM, A100). With the "
        "flat-block assumption the cost model predicts more for the same AL, because it charges "
        "nothing for what vLLM spends beyond the forward passes (scheduling, sampling kernels, the "
        "verifier's attention over a longer block) and takes the ratio of parameter counts as the "
        "ratio of costs; the gap says how much of a step those costs are on the real system.",
        "",
        "Figures: `plan_this_machine.png` (this machine's calibration) and `plan_ratio_0.05.png` (a "
        "GPU-like ratio of 0.05): predicted speedup at the best m against the emitted drift.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cost", default=default_cost_path(*PAIR, "bfloat16", "cpu"))
    parser.add_argument("--out", default=os.path.join(HERE, "..", "docs", "results"))
    parser.add_argument("--real", default=None, help="measured runs (default: docs/results/real_decoding.json)")
    parser.add_argument("--trace", default=None, help="trace directory (default: the embedded trace)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.cost):
        sys.exit(f"no calibration at {args.cost}: run the calibrate command in this script's docstring first")
    cost = load_cost(args.cost)
    rows, baseline = reality(cost, real_path=args.real, trace=args.trace, n_boot=args.bootstrap)
    paper = paper_regime(args.trace, args.bootstrap)
    atomic_write(os.path.join(args.out, "plan_vs_reality.md"), markdown(cost, rows, baseline, paper).encode())
    atomic_write(
        os.path.join(args.out, "plan_vs_reality.json"),
        json.dumps({"cost": json.loads(cost.to_json()), "reality": rows, "paper_regime": paper}, indent=1).encode(),
    )
    rules = parse_rules("sps,tas,cactus,cactus-exact,mentored", (0.25, 0.5, 1.0, 2.0))
    result = analyze_trace(
        load_trace(args.trace), rules, ms=(1, 2, 4, 6, 8, 10, 12, 16, 20), n_boot=args.bootstrap, progress=False
    )
    for name, c, title in (
        ("plan_this_machine.png", cost, "This CPU (calibrated, bfloat16)"),
        ("plan_ratio_0.05.png", 0.05, "GPU-like: draft / verifier cost 0.05, flat block cost"),
    ):
        atomic_write(os.path.join(args.out, name), figure_png(plot_plan(predict_speedup(result, c), title=title)))
    print(open(os.path.join(args.out, "plan_vs_reality.md")).read())


if __name__ == "__main__":
    main()
