"""Dump the embedded Spec-Bench trace: Qwen2.5-Coder-0.5B-Instruct drafting for 1.5B-Instruct on
Spec-Bench's categories the default trace lacks, on the llama.cpp engine.

Usage:
    python experiments/fetch_models.py                 # once: GGUF files into ~/.cache/cactus_theory/models
    python experiments/dump_spec_bench_trace.py --data DIR [--per-category 10] [--out DIR]
    python experiments/embed_trace.py --trace DIR --target cactus_theory/data/spec_bench_trace

Prompts: the first --per-category questions of each of Spec-Bench's translation, summarization,
qa, math_reasoning and rag categories (first turn; ``spec_bench/question.jsonl`` in the data
directory --data or $CACTUS_THEORY_DATA), each labelled by its category, chat template
applied; the verifier samples with the paper's settings (temperature 0.6, top-k 20, top-p
0.95), seed 0, at most --max-new-tokens tokens, as the default trace was; the GGUF files as
stored on llama.cpp (``--engine llama.cpp``: about 2.4 times faster than the HF path's
bfloat16 on 2 cores, docs/results/llama-cpp-against-hugging-face.md, and within its rounding). The held-out check
(``experiments/plan_vs_reality.py --categories ...``) decodes the questions after these.
Resumable: rerun the same command after an interruption.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from common import CACHE, DRAFT, SETTINGS, VERIFIER

from cactus_theory.traces import benchmark_file, dump_trace, load_prompts

#: Spec-Bench's categories of 80 questions each that the default trace does not cover.
CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")


def spec_bench_prompts(data, per_category, skip=0, categories=CATEGORIES):
    """Questions ``skip`` .. ``skip + per_category`` of each category, each labelled by it, interleaved."""
    path = benchmark_file("spec_bench", data)
    prompts = load_prompts(path, dataset="spec_bench")
    with open(path, encoding="utf-8") as fh:
        labels = [json.loads(line)["category"] for line in fh if line.strip()]
    chosen = {
        c: [p for p, label in zip(prompts, labels, strict=True) if label == c][skip : skip + per_category]
        for c in categories
    }
    out = []
    for group in zip(*chosen.values(), strict=False):
        out += [
            type(p)(id=p.id, task=c, text=p.text, index=p.index, dataset="spec_bench")
            for c, p in zip(chosen, group, strict=True)
        ]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(CACHE, "traces", "spec-bench-qwen2.5-coder-0.5b-for-1.5b"))
    parser.add_argument("--data", default=None, help="benchmark data directory (default: $CACTUS_THEORY_DATA)")
    parser.add_argument("--models", default=os.path.join(CACHE, "models"))
    parser.add_argument("--per-category", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--engine", default="llama.cpp", choices=("hf", "llama.cpp"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    prompts = spec_bench_prompts(args.data, args.per_category)
    start = time.perf_counter()
    n = dump_trace(
        os.path.join(args.models, VERIFIER),
        os.path.join(args.models, DRAFT),
        prompts,
        args.out,
        settings=SETTINGS,
        max_new_tokens=args.max_new_tokens,
        dtype="bfloat16",
        seed=args.seed,
        shard_positions=1024,
        engine=args.engine,
    )
    print(f"{n.written_positions} positions in {time.perf_counter() - start:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
