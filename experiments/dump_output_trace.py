"""A full-length trace of the verifier-alone outputs of experiments/real_decoding_table.py.

Usage:
    python experiments/dump_output_trace.py [--cache ~/.cache/cactus_theory/decoding]
        [--out ~/.cache/cactus_theory/traces/verifier-outputs] [--gsm8k 30] [--humaneval 20]

The embedded trace holds the first 128 generated tokens of each prompt; real outputs run to 512.
This trace teacher-forces both models (bfloat16, as in the run) on the whole output the verifier
alone produced for each problem of the table (``dump_trace(..., completions=...)``: one forward
pass per model and problem, nothing sampled), so that experiments/decoding_vs_simulation.py
--trace can predict each rule's AL over the same problems and the same output lengths as the real
runs. The outputs are samples of the verifier's distribution, as a dumped trace is; the
speculative runs are other samples of it (or, for lossy rules, of something close).

Token ids come from each record's ``token_ids`` when it has them; older records hold only the
decoded text, which is re-tokenized with the verifier's tokenizer (the end-of-sequence token
appended when the record's token count says the output ended with it); the number of records
whose re-tokenized length differs from the generated length is printed. Resumable.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from common import CACHE, DRAFT, SETTINGS, VERIFIER

from cactus_theory.traces import dump_trace, mixed_prompts

HERE = os.path.dirname(os.path.abspath(__file__))


def completions_from_cache(cache, prompts, tokenizer, max_new_tokens):
    """({prompt id: token ids}, number of re-tokenized records whose length differs)."""
    out, mismatched = {}, 0
    for prompt in prompts:
        path = os.path.join(cache, "verifier", f"{prompt.id}.json")
        if not os.path.exists(path):
            continue
        with open(path) as fh:
            rec = json.load(fh)
        if "token_ids" in rec:
            out[prompt.id] = rec["token_ids"]
            continue
        ids = tokenizer(rec["completion"], add_special_tokens=False)["input_ids"]
        if rec["tokens"] < max_new_tokens and rec["tokens"] == len(ids) + 1:  # stopped by the end token
            ids = [*ids, tokenizer.eos_token_id]
        mismatched += len(ids) != rec["tokens"]
        if ids:
            out[prompt.id] = ids
    return out, mismatched


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default=os.path.join(CACHE, "decoding"))
    parser.add_argument("--out", default=os.path.join(CACHE, "traces", "verifier-outputs"))
    parser.add_argument(
        "--data", default=None, help="benchmark data directory (default: $CACTUS_THEORY_DATA, else the cache's)"
    )
    parser.add_argument("--models", default=os.path.join(CACHE, "models"))
    parser.add_argument("--gsm8k", type=int, default=30)
    parser.add_argument("--humaneval", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=512, help="the limit the run generated with")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)
    prompts = mixed_prompts(args.data, {"gsm8k": args.gsm8k, "humaneval": args.humaneval})
    from transformers import AutoTokenizer

    verifier = os.path.join(args.models, VERIFIER)
    tokenizer = AutoTokenizer.from_pretrained(args.models, gguf_file=VERIFIER)
    completions, mismatched = completions_from_cache(args.cache, prompts, tokenizer, args.max_new_tokens)
    prompts = [p for p in prompts if p.id in completions]
    print(f"{len(prompts)} verifier-alone outputs; {mismatched} re-tokenized to a different length")
    start = time.perf_counter()
    n = dump_trace(
        verifier,
        os.path.join(args.models, DRAFT),
        prompts,
        args.out,
        completions=completions,
        settings=SETTINGS,
        max_new_tokens=args.max_new_tokens,
        dtype=args.dtype,
        shard_positions=4096,
    )
    print(f"{n.written_positions} positions in {time.perf_counter() - start:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
