"""The page of ``gpu_check.py``'s results (``gpu.md``): its parts' numbers, each beside its baseline.

Usage: imported by ``experiments/gpu_check.py``, which writes the page as each part ends;
``python experiments/gpu_page.py RESULTS.json`` writes it again from a run's ``gpu.json``.
"""

from __future__ import annotations

import json
import sys


def page(results, ctx):
    from cactus_theory.io import machine_description

    env = results["environment"]
    lines = [
        "# The GPU check: batched dumping, decoding and calibration on the device",
        "",
        f"Command: `{results['command']}` ({env['device_name']}; torch {env['torch']}, transformers "
        f"{env['transformers']}, numpy {env['numpy']}; {machine_description()}). The model pair is built on the device "
        f"with random weights: a verifier of {ctx.shape_name}, {ctx.dtype}, and a self-draft of its first "
        f"{ctx.draft_layers} layers (every layer's output projections scaled by {ctx.scale}); random prompts of "
        f"24-48 tokens, {ctx.new_tokens} new tokens each, the paper's sampling (temperature 0.6, top-k 20, top-p "
        "0.95). Every ratio is against a baseline measured in the same run.",
        "",
    ]
    if not env["gpu"]:
        lines += [
            "**No GPU was lent to the session that wrote this page: these are the CPU smoke run's figures "
            "(tiny shapes), not a GPU's.**",
            "",
        ]
    parts = results["parts"]
    if "dump" in parts:
        lines += [
            "## The dump",
            "",
            "| batch | prompts | positions | ours, positions/s | HF generate(output_logits) + "
            "draft forward, positions/s | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for r in parts["dump"]:
            lines.append(
                f"| {r['batch']} | {r['prompts']} | {r['positions']:,} | {r['positions_per_second']:,.0f} | "
                f"{r['hf_positions_per_second']:,.0f} | {r['ratio']:.2f}x |"
            )
        lines.append("")
    if "alone" in parts:
        r = parts["alone"][0]
        lines += [
            "## The verifier alone",
            "",
            f"`decode`'s verifier alone (batch 1, on the device) against Hugging Face's on the same prompts and "
            f"lengths ({r['tokens']} tokens, {r['prompts']} prompts, each path warmed up on one prompt first); "
            f"ours emit the same tokens on every path: {'yes' if r['same_tokens'] else 'NO'}.",
            "",
            "| path | tokens/s |",
            "|---|---|",
        ]
        lines += [
            f"| {k.replace(' tokens_per_second', '')} | {v:.1f} |"
            for k, v in sorted(r.items())  # in name order: the same page from the run and from gpu.json
            if k.endswith("tokens_per_second")
        ]
        lines += [""] + [
            f"Ours (the fastest path) {k}: **{v:.2f}x**." for k, v in sorted(r.items()) if k.startswith("ratio")
        ]
        lines += [f"{k}: `{v}`." for k, v in r.items() if k.endswith("error")] + [""]
    if "checks" in parts:
        r = parts["checks"][0]
        lines += [
            "## The device's arithmetic",
            "",
            "Random streams (`row_uniforms`) on the device equal the CPU's "
            f"bit for bit: {'yes' if r['uniforms_bitwise_equal'] else 'NO'}; rows processed on the device "
            f"(`process_rows`, with ties at every rank) against `processed_probs` in float64: at most "
            f"{r['processing_max_abs_difference']:.1e} apart.",
            "",
        ]
    if "bench" in parts:
        lines += [
            "## The rules (`bench.py --cuda-only` rows)",
            "",
            "| what | validated | with validate=False | note |",
            "|---|---|---|---|",
        ]
        bench = parts["bench"]
        lines += [f"| {r['what']} | {r['validated']} | {r['unvalidated']} | {r['note']} |" for r in bench["rows"]]
        if bench["targets"]:
            lines += ["", "| target | measured | met |", "|---|---|---|"]
            lines += [
                f"| {t['target']} | {t['measured']:.2f}x | {'yes' if t['met'] else 'no'} |" for t in bench["targets"]
            ]
        lines.append("")
    if "plan" in parts:
        cal = parts["plan"]["calibration"]
        lines += [
            "## The planner against decoding",
            "",
            f"Calibration ({cal['calibrate_seconds']:.0f} s): a drafted token {cal['draft_token_ms']:.1f} ms, a "
            f"verifier block of 1 token {cal['verify_ms']['1']:.1f} ms; the largest spread of one block's timed "
            f"repeats (max / min) {cal['largest_spread']:.2f} (every shape warmed up first, the device "
            f"synchronised around each timing); problems: {'; '.join(cal['problems']) or 'none'}.",
            "",
            "Predicted from the largest batch's trace; measured by `decode_prompts` on other prompts (another "
            "seed), each rule's runs alternating with the verifier alone's; request speedups, prompt processing "
            "included, 95% intervals.",
            "",
            "| rule | m | predicted [95%] | measured [95%] | error | covered | AL measured / trace | ms a step |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in parts["plan"]["rows"]:
            lines.append(
                f"| {r['rule']} | {r['m']} | {r['predicted']:.2f}x [{r['predicted_lo']:.2f}, "
                f"{r['predicted_hi']:.2f}] | {r['measured']:.2f}x [{r['measured_lo']:.2f}, "
                f"{r['measured_hi']:.2f}] | {r['error']:+.1%} | {'yes' if r['covered'] else 'no'} | "
                f"{r['measured_al']:.2f} / {r['trace_al']:.2f} | {r.get('step_ms', float('nan')):.1f} |"
            )
        lines += [
            "",
            f"The loop's own cost in the calibration (whole steps timed as the decoder runs them): "
            f"{cal.get('step_overhead_ms', 0.0):.2f} ms a step beyond its forwards, "
            f"{cal.get('alone_overhead_ms', 0.0):.2f} ms a token of the verifier alone beyond its forward. "
            "Every (rule, m) is warmed up untimed before the timed runs, and the rules' order alternates with m, "
            "so no rule pays for another's first steps at a new shape (the first GPU round timed SpS first at "
            "every m; its steps cost about 1.45x Cactus's there).",
        ]
        lines.append("")
    if "evaluate" in parts:
        lines += [
            "## The quality referee's throughput",
            "",
            f"`evaluate_rules` (the verifier alone, SpS and Cactus(delta = 1), m = 4, {ctx.new_tokens} tokens an "
            "answer, no drift record: the device decoder) on random multiple-choice questions over the pair's "
            "vocabulary; each batch size warmed up first.",
            "",
            "| batch | answers | seconds | answers an hour |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['batch']} | {r['answers']} | {r['seconds']:.1f} | {r['answers_per_hour']:,.0f} |"
            for r in parts["evaluate"]
        ]
        lines += [
            "",
            "The CPU's figures beside these (two cores, the Qwen2.5-Coder pair on llama.cpp): "
            "the sampled quality referee's answers and minutes in `quality.md`, "
            "the exact quality referee's minutes a thousand problems in `quality_exact.md`.",
            "",
        ]
    if "oracle" in parts:
        lines += [
            "## The engine oracle through the device decoder",
            "",
            "`conform` on this package's own decoder as the oracle's engine (`DecoderEngine`, the chooser's path): "
            "the law of the first two tokens of random contexts against each rule's exact law, m = 4.",
            "",
            "| rule | decoder | contexts | samples | p-value | detects TV | samples a second |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['rule']} | {r['decoder']} | {r['contexts']} | {r['samples']} | {r['p_value']:.3g} | "
            f"{r['detectable_tv']:.3f} | {r['samples_per_second']:,.1f} |"
            for r in parts["oracle"]
        ]
        lines.append("")
    if "frontier" in parts:
        f = parts["frontier"]
        lines += [
            "## The exact quality referee and the frontier",
            "",
            f"`exact_choice_referee` on {f['problems']} random multiple-choice questions: "
            f"{f['problems_per_second']:.1f} problems a second (one problem at a time; the goal of 100 a second "
            f"asks for a batched referee); `deployment_frontier` from its records, the dump's trace and the plan "
            f"part's calibration, {f['points']} settings: {f['recommendation']}",
            "",
        ]
    for name, error in results["errors"].items():
        lines += [f"Part {name} failed: `{error}`", ""]
    return "\n".join(lines)


def main(argv=None):
    from types import SimpleNamespace

    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as fh:
        results = json.load(fh)
    print(page(results, SimpleNamespace(**results.get("context", {}))))


if __name__ == "__main__":
    main()
