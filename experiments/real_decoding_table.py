"""The paper's kind of table on a real pair: Qwen2.5-Coder-0.5B-Instruct drafting for 1.5B.

Usage:
    python experiments/fetch_models.py
    python experiments/real_decoding_table.py [--gsm8k 30] [--humaneval 20] [--m 8] [--dtype bfloat16]
        [--cache ~/.cache/cactus_theory/decoding] [--out docs/results/real_decoding.md]

Methods: verifier alone, SpS, TAS, Cactus delta=1, exact Cactus delta=1, mentored delta=1, and on
HumanEval Cactus delta=1 with the n-gram (prompt lookup) drafter; temperature 0.6, top-p 0.95,
top-k 20, m = 8, batch size 1, seed = problem index. Resumable: every (method, problem) result is
a JSON file in --cache, written atomically; rerun the same command to continue. The table is
rebuilt from whatever is cached, so partial runs still report (with the counts they cover).

GSM8K: exact match of the number after '####' (else the last number) with the reference.
HumanEval: pass@1 by running prompt + completion + the official tests, only with --allow-code-execution, isolated by
the operating system (the package's sandbox: its own root, no network, limits on memory, time and processes; its
problems file is read from the data directory, --data).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import time

from common import CACHE, SETTINGS, pair_paths

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = ("verifier", "sps", "tas", "cactus", "cactus-exact", "mentored", "cactus-ngram")
#: Rule spec (``make_rule``) of each speculative method; cactus-ngram drafts with prompt lookup.
RULE_SPECS = {
    "sps": "sps",
    "tas": "tas",
    "cactus": "cactus(delta=1)",
    "cactus-exact": "cactus-exact(delta=1)",
    "mentored": "mentored(delta=1)",
    "cactus-ngram": "cactus(delta=1)",
}


def gsm8k_answer(text):
    m = re.search(r"####\s*([-\d,\.]+)", text)
    if m:
        raw = m.group(1)
    else:
        numbers = re.findall(r"-?\d[\d,]*\.?\d*", text)
        if not numbers:
            return None
        raw = numbers[-1]
    raw = raw.replace(",", "").rstrip(".")
    try:
        value = float(raw)
    except ValueError:
        return None
    return int(value) if value.is_integer() else value


def extract_code(completion, prompt):
    blocks = re.findall(r"```(?:python)?\n(.*?)```", completion, flags=re.S)
    code = blocks[0] if blocks else completion
    return code if "def " in code else prompt + code


def humaneval_passes(problem, code, timeout=10.0):
    """Whether prompt + completion passes HumanEval's own tests, run isolated by the operating system (the
    package's sandbox, ``run_sandboxed``: its own root, no network, limits on memory, time and processes)."""
    from cactus_theory.benchmarks import run_sandboxed

    program = f"{code}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"
    return run_sandboxed(program, timeout=timeout).passed


def _atomic_json(path, obj):
    from cactus_theory.io import atomic_write

    atomic_write(path, json.dumps(obj))


def problems(data, n_gsm8k, n_humaneval):
    from cactus_theory.traces import benchmark_file

    out = []
    with open(benchmark_file("gsm8k", data), encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i >= n_gsm8k:
                break
            rec = json.loads(line)
            out.append({"task": "gsm8k", "index": i, "rec": rec})
    with gzip.open(benchmark_file("humaneval", data), "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i >= n_humaneval:
                break
            out.append({"task": "humaneval", "index": i, "rec": json.loads(line)})
    # interleave the tasks so that a partial (resumed) run covers both
    gsm = [p for p in out if p["task"] == "gsm8k"]
    hum = [p for p in out if p["task"] == "humaneval"]
    mixed = [p for pair in zip(gsm, hum, strict=False) for p in pair]
    k = min(len(gsm), len(hum))
    return mixed + gsm[k:] + hum[k:]


def run(args):
    import torch

    from cactus_theory import make_rule, speculative_generate
    from cactus_theory.decode import NgramDrafter, autoregressive_generate
    from cactus_theory.hf import encode_chat, eos_ids, load_model
    from cactus_theory.traces import benchmark_prompt

    models = args.models
    verifier_path, draft_path = pair_paths(models)
    verifier, tok, _ = load_model(verifier_path, dtype=args.dtype)
    draft, _, _ = load_model(draft_path, dtype=args.dtype)
    settings = SETTINGS
    rules = {method: make_rule(spec) for method, spec in RULE_SPECS.items()}
    eos = eos_ids(verifier, tok)  # the one set of end-of-sequence ids (the committed run used the tokenizer's)
    todo = problems(args.data, args.gsm8k, args.humaneval)
    for k, prob in enumerate(todo, 1):
        text = benchmark_prompt(prob["task"], prob["rec"])
        ids = encode_chat(tok, text)
        for method in METHODS:
            if method == "cactus-ngram" and prob["task"] != "humaneval":
                continue
            path = os.path.join(args.cache, method, f"{prob['task']}-{prob['index']}.json")
            if os.path.exists(path):
                continue
            if method == "verifier":
                out = autoregressive_generate(verifier, ids, settings, args.max_new_tokens, prob["index"], eos)
            else:
                drafter = NgramDrafter() if method == "cactus-ngram" else draft
                out = speculative_generate(
                    verifier, drafter, rules[method], args.m, settings, args.max_new_tokens, prob["index"], ids, eos
                )
            completion = tok.decode(out.tokens, skip_special_tokens=True)
            if prob["task"] == "gsm8k":
                correct = gsm8k_answer(completion) == gsm8k_answer(prob["rec"]["answer"])
            else:
                correct = humaneval_passes(prob["rec"], extract_code(completion, prob["rec"]["prompt"]))
            _atomic_json(
                path,
                {
                    "tokens": len(out.tokens),
                    "accepted": out.accepted,
                    "drafted": out.drafted,
                    "seconds": out.total_seconds,
                    "draft_seconds": out.draft_seconds,
                    "verify_seconds": out.verify_seconds,
                    "dtype": args.dtype,
                    "threads": torch.get_num_threads(),
                    "correct": bool(correct),
                    "completion": completion,
                    "token_ids": [int(t) for t in out.tokens],
                },
            )
            print(
                f"[{k}/{len(todo)}] {method} {prob['task']}-{prob['index']}: correct={correct} "
                f"AL={out.accepted_length:.2f} {out.tokens_per_second:.2f} tok/s",
                flush=True,
            )


def wilson_interval(successes, n, z=1.959963984540054):
    """Wilson score interval (95% by default) for a binomial proportion, in percent."""
    if n == 0:
        return float("nan"), float("nan")
    phat = successes / n
    centre = (phat + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (phat * (1 - phat) / n + z * z / (4 * n * n)) ** 0.5
    return 100 * max(centre - half, 0.0), 100 * min(centre + half, 1.0)


def table(cache):
    """(Markdown table, rows as dicts) from whatever is cached; speedups against the verifier's
    tokens/s on the same task (summed tokens over summed seconds)."""
    rows, lines = [], []
    for task in ("gsm8k", "humaneval"):
        base = None
        for method in METHODS:
            folder = os.path.join(cache, method)
            files = sorted(f for f in os.listdir(folder) if f.startswith(task)) if os.path.isdir(folder) else []
            if not files:
                continue
            recs = [json.load(open(os.path.join(folder, f))) for f in files]
            tokens = sum(r["tokens"] for r in recs)
            seconds = sum(r["seconds"] for r in recs)
            steps = [a for r in recs for a in r["accepted"]]
            al = sum(steps) / len(steps) if steps else float("nan")
            rate = tokens / seconds
            if method == "verifier":
                base = rate
            solved = sum(r["correct"] for r in recs)
            row = {
                "task": task,
                "method": method,
                "problems": len(recs),
                "accuracy": 100 * solved / len(recs),
                "accuracy_ci95": wilson_interval(solved, len(recs)),
                "al": al,
                "mean_acceptance_length": 1 + al,
                "tokens_per_second": rate,
                "speedup": rate / base if base else float("nan"),
                "tokens": tokens,
            }
            rows.append(row)
            lines.append(
                f"| {task} | {method} | {row['problems']} | {row['accuracy']:.1f} "
                f"| {row['accuracy_ci95'][0]:.0f}–{row['accuracy_ci95'][1]:.0f} | {al:.2f} | {1 + al:.2f} "
                f"| {rate:.2f} | {row['speedup']:.2f} |"
            )
    head = [
        "| task | method | problems | accuracy % | 95% CI (Wilson) | AL | vLLM MAL | tok/s | speedup |",
        "|---" * 9 + "|",
    ]
    return "\n".join(head + lines), rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data", default=None, help="benchmark data directory (default: $CACTUS_THEORY_DATA, else the cache's)"
    )
    parser.add_argument("--cache", default=os.path.join(CACHE, "decoding"))
    parser.add_argument(
        "--models", default=os.path.join(CACHE, "models"), help="where fetch_models.py put the GGUF files"
    )
    parser.add_argument("--gsm8k", type=int, default=30)
    parser.add_argument("--humaneval", type=int, default=20)
    parser.add_argument("--m", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default=None)
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument(
        "--allow-code-execution",
        action="store_true",
        help="run the programs the models write (HumanEval), isolated by the operating system; without it, no "
        "HumanEval problem is decoded",
    )
    args = parser.parse_args(argv)
    if args.humaneval and not (args.allow_code_execution or args.table_only):
        parser.error("argument --humaneval: its answers are programs: give --allow-code-execution, or --humaneval 0")
    start = time.perf_counter()
    if not args.table_only:
        run(args)
    text, rows = table(args.cache)
    print(text)
    if args.out:
        _atomic_json(os.path.splitext(args.out)[0] + ".json", {"rows": rows, "seconds": time.perf_counter() - start})
        from cactus_theory.io import atomic_write

        atomic_write(args.out, text + "\n")


if __name__ == "__main__":
    main()
