"""Block verification against token-wise SpS and strict verification, on a trace, and (optionally)
in real decoding.

Usage:
    python experiments/block_verification.py [--trace DIR] [--out docs/results] [--bootstrap 1000]
    python experiments/block_verification.py --decode --data DIR [--prompts 8] [--max-new-tokens 128]
    python experiments/block_verification.py --decoding docs/results/block_verification_decoding.json

1. On the trace (default: the embedded one): AL(m) of ``block``, ``sps`` and ``strict`` for m =
   1..20 with bootstrap intervals over sequences, under sampled drafting (n ~ p) and greedy
   drafting (n = argmax p, p one-hot: an MTP head or EAGLE drafter); the block rule's AL is exact
   for m <= 3 and Monte Carlo beyond (``block_accepted_length``, 1,024 paths per block start, its
   standard error reported). The gain of block over SpS is paired: both are analysed on the same
   sequences, and the interval of the gain comes from bootstrapping the sequences once for both.
2. With ``--decode``: real speculative decoding of the first ``--prompts`` GSM8K and HumanEval
   problems that the embedded trace holds, with the Qwen2.5-Coder pair (``fetch_models.py``),
   ``block`` and ``sps`` at m = 8, against the AL each is predicted on those prompts' trace
   sequences (the first 128 generated tokens of the same prompts). ``--decoding FILE`` reads the
   measured rows of such a run instead (docs/results/block_verification_decoding.json holds the
   page's), so the trace part can be redone without the models.

Writes block_verification.md / .json / .png into --out.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
from common import DRAFT, VERIFIER

from cactus_theory import analyze_trace, load_trace, open_traces
from cactus_theory.compare import compare_block_verification
from cactus_theory.io import machine_description, write_results
from cactus_theory.studies import figure_png

HERE = os.path.dirname(os.path.abspath(__file__))
MS = tuple(range(1, 21))
PAIR = (VERIFIER, DRAFT)


def trace_part(trace, n_boot):
    result = compare_block_verification(trace, MS, n_boot=n_boot, progress=False)
    part = {
        mode: {"rows": result.rows[mode], "gain": result.gain[mode], "seconds": result.seconds[mode]}
        for mode in ("sampled", "greedy")
    }
    return result, part


def monte_carlo_error(trace, m=20):
    """The block rule's Monte Carlo standard error of AL(m), averaged over block starts."""
    from cactus_theory import SamplingSettings
    from cactus_theory.laws import block_accepted_length

    settings = SamplingSettings(**trace.metadata["sampling"])
    errors, values = [], []
    for seq in trace:
        if seq.n_positions < m:
            continue
        p, q = seq.distributions(settings)
        res = block_accepted_length("block", p, q, m, method="monte-carlo", full_output=True)
        errors.append(res.standard_error)
        values.append(res.accepted_length)
    if not errors:
        return float("nan"), float("nan")
    return float(np.mean(np.concatenate(errors))), float(np.mean(np.concatenate(values)))


def decode_part(args, trace):
    """Real decoding with block and sps at m = 8 on prompts the trace holds, against the trace's prediction."""
    from cactus_theory import SamplingSettings, make_rule, speculative_generate
    from cactus_theory.hf import encode_chat, eos_ids, load_model
    from cactus_theory.traces import load_prompts

    models = args.models
    verifier, tok, _ = load_model(os.path.join(models, PAIR[0]), dtype=args.dtype, progress=True)
    draft, _, _ = load_model(os.path.join(models, PAIR[1]), dtype=args.dtype, progress=True)
    settings = SamplingSettings(**trace.metadata["sampling"])
    eos = eos_ids(verifier, tok)
    prompts = []
    for name, rel in (("gsm8k", "gsm8k/test.jsonl"), ("humaneval", "humaneval/HumanEval.jsonl.gz")):
        prompts += load_prompts(os.path.join(args.data, rel), dataset=name, limit=args.prompts // 2)
    in_trace = {s["id"] for s in trace.manifest["sequences"]}
    prompts = [p for p in prompts if p.id in in_trace]
    measured = {}
    for spec in ("sps", "block"):
        rule = make_rule(spec)
        accepted, steps = 0, 0
        for k, prompt in enumerate(prompts):
            ids = encode_chat(tok, prompt.text)
            res = speculative_generate(verifier, draft, rule, 8, settings, args.max_new_tokens, k, ids, eos)
            full = [a for a, d in zip(res.accepted, res.drafted, strict=True) if d == 8]  # whole blocks only
            accepted += sum(full)
            steps += len(full)
            print(f"{spec} {prompt.id}: AL {np.mean(full) if full else float('nan'):.2f} over {len(full)} steps")
        measured[spec] = {"al": accepted / steps if steps else float("nan"), "steps": steps}
    return predicted_part(
        {"prompts": [p.id for p in prompts], "max_new_tokens": args.max_new_tokens, "rules": measured}, trace
    )


def predicted_part(decoded, trace):
    """The measured rows of a decoding run, each with the AL the trace predicts on the same prompts."""
    ids = list(decoded["prompts"])
    rules = list(decoded["rules"])
    predicted = analyze_trace(open_traces(trace), rules, ms=(8,), n_boot=0, progress=False)
    out = {spec: dict(decoded["rules"][spec]) for spec in rules}
    for spec in rules:  # the trace's AL over the decoded prompts' sequences
        out[spec]["predicted"] = predicted.accepted_length(spec, 8, sequences=ids, n_boot=0)[0]
    return {**decoded, "rules": out}


def markdown(result, mc, decoded, command, trace):
    lines = [
        "# Block verification, SpS and strict verification",
        "",
        f"Command: `{command}` ({machine_description()}). Trace: {trace.directory.split('/')[-1]} "
        f"({len(trace)} sequences, {trace.n_positions} positions).",
        "",
        "AL(m) with bootstrap 95% intervals over sequences; gain = AL(block) / AL(sps) - 1 with a paired interval "
        f"(the same resampled sequences for both). The block rule's Monte Carlo standard error at m = 20 is "
        f"{mc[0]:.4f} per block start (AL {mc[1]:.3f}); m <= 3 is exact.",
        "",
    ]
    for mode in ("sampled", "greedy"):
        lines += [f"## {mode.capitalize()} drafting", "", result.markdown_table(mode), ""]
    if decoded:
        lines += [
            "## Real decoding (m = 8)",
            "",
            "| rule | measured AL | steps | predicted from the trace |",
            "|---|---|---|---|",
        ]
        for spec, r in decoded["rules"].items():
            lines.append(f"| {spec} | {r['al']:.3f} | {r['steps']} | {r['predicted']:.3f} |")
        lines.append("")
        lines.append(
            f"Prompts: {', '.join(decoded['prompts'])}; up to {decoded['max_new_tokens']} new tokens, steps with all 8 "
            "drafts (a shorter last block is left out); the prediction averages the trace's block starts on the same "
            "prompts."
        )
        if decoded.get("source"):
            lines.append(f"Measured rows read back from an earlier run: {decoded['source']}.")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=None, help="trace directory (default: the embedded trace)")
    parser.add_argument("--out", default=os.path.join(HERE, "..", "docs", "results"))
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--decode", action="store_true", help="also decode with the real pair (needs the models)")
    parser.add_argument("--data", default=None, help="benchmark data directory (for --decode)")
    parser.add_argument("--models", default=os.path.expanduser("~/.cache/cactus_theory/models"))
    parser.add_argument("--prompts", type=int, default=8, help="with --decode: GSM8K + HumanEval prompts, half each")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", help="with --decode: the models' dtype")
    parser.add_argument(
        "--decoding",
        default=None,
        help="instead of --decode: the measured rows of an earlier --decode run (a JSON file with prompts, "
        "max_new_tokens and rules: {name: {al, steps}}); the trace's predictions are recomputed",
    )
    args = parser.parse_args(argv)
    if args.decode and args.decoding:
        parser.error("--decode and --decoding exclude each other: decode again, or read an earlier run")
    if args.decoding and os.path.realpath(args.decoding) == os.path.realpath(
        os.path.join(args.out, "block_verification.json")
    ):
        parser.error("--decoding must not be the output's block_verification.json: keep the measured rows apart")
    trace = load_trace(args.trace)
    result, part = trace_part(trace, args.bootstrap)
    mc = monte_carlo_error(trace)
    if args.decode:
        decoded = decode_part(args, trace)
    elif args.decoding:
        with open(args.decoding, encoding="utf-8") as fh:
            decoded = predicted_part(json.load(fh), trace)
    else:
        decoded = None
    command = "python experiments/block_verification.py" + (" --decode" if args.decode else "")
    if args.decoding:
        command += f" --decoding {os.path.relpath(args.decoding)}"
    if args.trace:
        command += f" --trace {args.trace}"
    data = {"trace": part, "monte_carlo_error_m20": mc, "decoding": decoded}
    text = markdown(result, mc, decoded, command, trace)
    write_results(args.out, "block_verification", markdown=text, data=data, png=figure_png(result.figure()))
    print(text)


if __name__ == "__main__":
    main()
