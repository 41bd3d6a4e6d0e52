"""Dump the real trace: Qwen2.5-Coder-0.5B-Instruct drafting for Qwen2.5-Coder-1.5B-Instruct.

Usage:
    python experiments/fetch_models.py                 # once: GGUF files into ~/.cache/cactus_theory/models
    python experiments/dump_real_trace.py [--out DIR] [--per-task 22] [--max-new-tokens 128]

Prompts: the first --per-task problems of GSM8K (test), HumanEval and MT-Bench (first turn)
from the benchmark data directory (--data, $CACTUS_THEORY_DATA or ~/.cache/cactus_theory/data), chat
template applied; the verifier samples with the paper's
settings (temperature 0.6, top-p 0.95, top-k 20), bf16 on the CPU, seed 0. Resumable: rerun the
same command after an interruption. Then `python experiments/embed_trace.py` copies it into
the package as the embedded default.
"""

from __future__ import annotations

import argparse
import os
import time

from common import CACHE, SETTINGS, pair_paths

from cactus_theory.traces import dump_trace, mixed_prompts

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(CACHE, "traces", "qwen2.5-coder-0.5b-for-1.5b"))
    parser.add_argument(
        "--data", default=None, help="benchmark data directory (default: $CACTUS_THEORY_DATA, else the cache's)"
    )
    parser.add_argument("--models", default=os.path.join(CACHE, "models"))
    parser.add_argument("--per-task", type=int, default=22)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    prompts = mixed_prompts(args.data, {"gsm8k": args.per_task, "humaneval": args.per_task, "mt_bench": args.per_task})
    start = time.perf_counter()
    n = dump_trace(
        *pair_paths(args.models),
        prompts,
        args.out,
        settings=SETTINGS,
        max_new_tokens=args.max_new_tokens,
        dtype=args.dtype,
        seed=args.seed,
        shard_positions=1024,
    )
    print(f"{n.written_positions} positions in {time.perf_counter() - start:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
