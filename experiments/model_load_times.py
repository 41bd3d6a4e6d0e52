"""How long loading the GGUF pair takes: the first time (dequantise, then cache) and the second
(read the cached safetensors).

Usage:
    python experiments/fetch_models.py            # once: the Qwen2.5-Coder 0.5B / 1.5B GGUF files
    python experiments/model_load_times.py [--dtype float32] [--cache DIR]

For each model: the load without the cache (transformers dequantises the GGUF), the first load
with an empty cache entry (dequantise and write the cache), and the second load (from the
cache); then checks that both give the same logits on one prompt. The cache entry of each model
is rebuilt by this script (it lives in DIR/dequantised/<sha256>, default the user cache).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import time

from common import DRAFT, VERIFIER

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = (DRAFT, VERIFIER)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--cache", default=None, help="cache root (default: $CACTUS_THEORY_CACHE or ~/.cache/cactus_theory)"
    )
    parser.add_argument("--models", default=os.path.expanduser("~/.cache/cactus_theory/models"))
    args = parser.parse_args(argv)
    if args.cache:
        os.environ["CACTUS_THEORY_CACHE"] = args.cache
    import torch

    from cactus_theory.hf import cache_root, encode_chat, file_sha256, load_model

    rows = []
    for name in MODELS:
        path = os.path.join(args.models, name)
        entry = os.path.join(cache_root(), "dequantised", file_sha256(path))
        shutil.rmtree(entry, ignore_errors=True)
        times = {}
        for label, cache in (("no cache", False), ("first (dequantise + cache)", True), ("second (cached)", True)):
            start = time.perf_counter()
            model, tok, _ = load_model(path, dtype=args.dtype, cache=cache)
            times[label] = time.perf_counter() - start
            ids = torch.tensor([encode_chat(tok, "def add(a, b):")])
            with torch.no_grad():
                times[label + " logits"] = model(input_ids=ids).logits[0, -1].float()
            del model
        same = torch.equal(times["no cache logits"], times["second (cached) logits"])
        size = sum(os.path.getsize(os.path.join(entry, f)) for f in os.listdir(entry)) / 2**30
        first, second = times["first (dequantise + cache)"], times["second (cached)"]
        rows.append((name, times["no cache"], first, second, same, size))
    print(f"dtype {args.dtype}, {os.cpu_count()} cores, {platform.machine()}, torch {torch.__version__}")
    print(
        "| model | load, no cache | first load (dequantise + cache) | second load (cached) | same logits | cache size |"
    )
    print("|---|---|---|---|---|---|")
    for name, plain, first, second, same, size in rows:
        same = "yes" if same else "NO"
        print(f"| {name} | {plain:.1f} s | {first:.1f} s | {second:.1f} s | {same} | {size:.1f} GiB |")


if __name__ == "__main__":
    main()
