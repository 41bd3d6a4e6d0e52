"""The batched dump on this machine's CPU cores: positions per second of the real Qwen2.5-Coder pair on
the Hugging Face engine at each batch size, on the same prompts, and whether the traces agree.

Usage:
    python experiments/fetch_models.py     # once: the Qwen2.5-Coder 0.5B / 1.5B GGUF files
    python experiments/dump_batch_cpu.py --data DIR [--batch 1,4] [--prompts 8] [--max-new-tokens 48]
        [--out docs/results]

The prompts: the first --prompts / 2 of GSM8K and of HumanEval (chat template, the paper's sampling:
temperature 0.6, top-k 20, top-p 0.95, seed 0). Each batch size dumps them into a fresh trace
(``dump_trace(..., batch=B)``, float32; the dequantised weights cached by the first load, so loading is
not timed: ``DumpSummary.seconds`` counts the dump alone). Agreement: the share of prompts whose tokens
equal the batch of one's, and the largest difference of their verifier top-K logits.

Writes OUT/dump_batch_cpu.md and OUT/dump_batch_cpu.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
from common import DRAFT, SETTINGS, VERIFIER

from cactus_theory.io import machine_description, write_results
from cactus_theory.traces import Trace, benchmark_file, dump_trace, load_prompts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=os.path.join(os.path.expanduser("~"), ".cache", "cactus_theory", "models"))
    parser.add_argument("--data", required=True, help="the benchmark directory (gsm8k, humaneval)")
    parser.add_argument("--batch", default="1,4")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "results")
    )
    args = parser.parse_args(argv)
    sizes = [int(b) for b in args.batch.split(",")]
    half = max(1, args.prompts // 2)
    prompts = [
        *load_prompts(benchmark_file("gsm8k", args.data), dataset="gsm8k")[:half],
        *load_prompts(benchmark_file("humaneval", args.data), dataset="humaneval")[:half],
    ]
    settings = SETTINGS
    pair = [os.path.join(args.models, name) for name in (VERIFIER, DRAFT)]
    rows, traces = [], {}
    with tempfile.TemporaryDirectory() as work:
        for size in sizes:
            out = os.path.join(work, f"b{size}")
            summary = dump_trace(
                *pair,
                prompts,
                out,
                settings=settings,
                max_new_tokens=args.max_new_tokens,
                dtype=args.dtype,
                seed=0,
                batch=size,
                progress=False,
            )
            traces[size] = {s.id: s for s in Trace(out)}
            rows.append(
                {
                    "batch": size,
                    "prompts": summary.written_prompts,
                    "positions": summary.written_positions,
                    "seconds": summary.seconds,
                    "positions_per_second": summary.positions_per_second,
                }
            )
            print(f"batch {size}: {summary.positions_per_second:.2f} positions/s", file=sys.stderr, flush=True)
    first = traces[sizes[0]]
    for row in rows:
        other = traces[row["batch"]]
        same = [k for k in first if np.array_equal(first[k].tokens, other[k].tokens)]
        row["same_tokens"] = len(same) / len(first)
        aligned = [k for k in same if np.array_equal(first[k].topk_ids["target"], other[k].topk_ids["target"])]
        gaps = [float(np.max(np.abs(first[k].topk_logits["target"] - other[k].topk_logits["target"]))) for k in aligned]
        row["max_logit_difference"] = max(gaps, default=float("nan"))
        row["speedup"] = row["positions_per_second"] / rows[0]["positions_per_second"]
    command = (
        f"python experiments/dump_batch_cpu.py --data DATA --batch {args.batch} --prompts {args.prompts} "
        f"--max-new-tokens {args.max_new_tokens}"
    )
    lines = [
        "# The batched dump on the CPU",
        "",
        f"Command: `{command}` ({machine_description()}; the Qwen2.5-Coder pair, 0.5B drafting for 1.5B, Hugging "
        f"Face engine, {args.dtype}; {len(prompts)} prompts, GSM8K and HumanEval, the paper's sampling).",
        "",
        f"| batch | positions | seconds | positions/s | against batch {sizes[0]} | prompts with the same tokens | "
        "largest top-K logit difference |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['positions']} | {r['seconds']:.1f} | {r['positions_per_second']:.2f} | "
            f"{r['speedup']:.2f}x | {r['same_tokens']:.0%} | {r['max_logit_difference']:.1e} |"
        )
    lines += [
        "",
        "The logits of a batch differ from the batch of one's by float32 rounding (the products' shapes "
        "change their order of summation); a token differs only where a sampling draw falls that close to a "
        "boundary of the cumulative distribution, and the rest of that prompt's output with it.",
    ]
    write_results(
        args.out,
        "dump_batch_cpu",
        markdown="\n".join(lines) + "\n",
        data={"command": command, "machine": machine_description(), "rows": rows},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
