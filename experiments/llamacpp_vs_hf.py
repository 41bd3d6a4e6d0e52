"""The llama.cpp engine against the Hugging Face path on this machine, in one run: agreement of
the verifier's distributions, AL from a trace made by each, speed and memory, and real
speculative decoding on each.

Usage:
    python experiments/fetch_models.py     # once: the Qwen2.5-Coder 0.5B / 1.5B GGUF files
    python experiments/llamacpp_vs_hf.py --data DIR [--prompts 8] [--max-new-tokens 64] [--out docs/results]

1. Speed and memory: each engine in its own child process (its peak resident memory is the
   child's): each model's load, the first time (HF: dequantise into a private cache; llama.cpp:
   read the file) and the second; the verifier's prefill of a 128-token prompt (tokens/s); one
   decode step at 128 tokens of context; a verifier block of m + 1 tokens for m = 1..16 (median of
   --repeats, as a ratio to one step: what decides whether speculation pays); the draft's step.
2. Traces: the same prompts (the first --prompts / 2 of GSM8K and of HumanEval, chat template,
   the paper's sampling: temperature 0.6, top-k 20, top-p 0.95, seed 0) dumped with each engine
   (HF: bfloat16, as the embedded trace), timed.
3. Agreement, on the same prompts and token prefix (the llama.cpp trace's tokens): the verifier's
   next-token distribution from the HF path in float32 and in bfloat16 and from llama.cpp
   (softmax at temperature 1), per position: KL(HF float32 || llama.cpp), KL(HF float32 || HF
   bfloat16) (the part that bfloat16 rounding alone gives) and the total variation of the
   processed distributions (the paper's sampling); mean, 99th percentile and max.
4. AL of SpS and Cactus(delta = 1) at m = 4 and 8 from each engine's trace, with bootstrap 95%
   intervals, and the paired difference (llama.cpp - HF, resampling prompts).
5. Real speculative decoding (``cactus-theory decode``) on --decode-prompts prompts with SpS and
   Cactus(delta = 1) at each --m, with the verifier alone as baseline, on each engine: tokens/s
   and speedup (the best m per engine), and on llama.cpp the same at --batch B.

Writes OUT/llamacpp.md and OUT/llamacpp.json. Children and CLI runs use the current Python.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from common import DRAFT, SETTINGS, VERIFIER

from cactus_theory.io import machine_description, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLING = ["--temperature", "0.6", "--top-k", "20", "--top-p", "0.95"]


def _median_seconds(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def child_speed(args):
    """Timings of one engine (run in a child process): JSON on stdout."""
    if args.engine == "hf":
        os.environ["CACTUS_THEORY_CACHE"] = args.private_cache  # a first load dequantises, into a private cache
    from cactus_theory.hf import cached_model, encode_chat, load_model

    out = {"engine": args.engine, "load": {}}
    models = {}
    for role, name in (("verifier", VERIFIER), ("draft", DRAFT)):
        path = os.path.join(args.models, name)
        options = {"engine": args.engine} if args.engine == "llama.cpp" else {}
        for attempt in ("first", "second"):
            start = time.perf_counter()
            model, tok, _ = load_model(path, dtype=args.dtype, progress=False, **options)
            out["load"][f"{role} {attempt}"] = time.perf_counter() - start
            if attempt == "first":
                del model
        models[role] = model
    text = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests. " * 8
    ids = encode_chat(tok, text)[:128]
    repeats = args.repeats

    def prefill():
        cached_model(models["verifier"]).feed(ids, want="last")

    prefill()  # warm-up
    out["prefill_tokens_per_second"] = len(ids) / _median_seconds(prefill, max(1, min(repeats, 3)))
    for role in ("verifier", "draft"):
        runner = cached_model(models[role])
        runner.feed(ids, want="last")

        def step(runner=runner):
            runner.feed([ids[-1]])
            runner.crop(len(ids))

        step()
        out[f"{role}_step"] = _median_seconds(step, repeats)
        if role == "verifier":
            blocks = {}
            for m in range(1, args.max_block + 1):

                def block(m=m, runner=runner):
                    runner.feed(ids[-(m + 1) :])
                    runner.crop(len(ids))

                blocks[m] = _median_seconds(block, repeats)
            out["verify_block"] = blocks
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps(out))


def child_agreement(args):
    """Per-position distances between the engines' verifier distributions on the llama.cpp
    trace's tokens (run in a child process): JSON on stdout."""
    os.environ["CACTUS_THEORY_CACHE"] = args.private_cache
    import torch

    from cactus_theory import processed_probs
    from cactus_theory.hf import encode_chat, load_model, teacher_forced_logits
    from cactus_theory.traces import Trace

    path = os.path.join(args.models, VERIFIER)
    trace = Trace(args.trace)
    texts = json.loads(args.texts)
    llama, tok, _ = load_model(path, engine="llama.cpp", progress=False)
    hf32 = load_model(path, dtype="float32", progress=False)[0]
    rows = {"llama": [], "f32": [], "bf16": []}
    inputs = []
    for seq in trace:
        ids = encode_chat(tok, texts[seq.id])
        tokens = [int(t) for t in seq.tokens]
        inputs.append((ids, tokens))
        rows["llama"].append(teacher_forced_logits(llama, ids, tokens))
        rows["f32"].append(teacher_forced_logits(hf32, ids, tokens))
    del llama
    hf16 = hf32.to(torch.bfloat16)
    for ids, tokens in inputs:
        rows["bf16"].append(teacher_forced_logits(hf16, ids, tokens))
    settings = SETTINGS

    def log_softmax(x):
        x = np.asarray(x, dtype=np.float64)
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    def kl(a, b):
        la, lb = log_softmax(a), log_softmax(b)
        return (np.exp(la) * (la - lb)).sum(axis=-1)

    def tv(a, b):
        pa = np.asarray(processed_probs(np.asarray(a, dtype=np.float64), settings))
        pb = np.asarray(processed_probs(np.asarray(b, dtype=np.float64), settings))
        return 0.5 * np.abs(pa - pb).sum(axis=-1)

    f32 = np.concatenate(rows["f32"])
    out = {}
    for name, other in (("llama.cpp", np.concatenate(rows["llama"])), ("bfloat16", np.concatenate(rows["bf16"]))):
        k, t = kl(f32, other), tv(f32, other)
        top = (np.argmax(f32, axis=-1) == np.argmax(other, axis=-1)).mean()
        out[name] = {
            "positions": int(k.size),
            "kl_mean": float(k.mean()),
            "kl_p99": float(np.quantile(k, 0.99)),
            "kl_max": float(k.max()),
            "tv_mean": float(t.mean()),
            "tv_p99": float(np.quantile(t, 0.99)),
            "tv_max": float(t.max()),
            "same_argmax": float(top),
        }
    print(json.dumps(out))


def _run(argv, what):
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"{what} failed (exit {done.returncode})")
    return done.stdout, time.perf_counter() - start


def _child(kind, args, extra=()):
    argv = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        kind,
        "--models",
        args.models,
        "--dtype",
        args.dtype,
        "--repeats",
        str(args.repeats),
        "--max-block",
        str(args.max_block),
        *extra,
    ]
    stdout, _ = _run(argv, f"the {kind} child")
    return json.loads(stdout.strip().splitlines()[-1])


def _cli(*argv):
    return [sys.executable, "-m", "cactus_theory", *argv]


def _bootstrap_al(sums, starts, ids, n_boot=1000, seed=0):
    """(AL, lo, hi) of sum(sums)/sum(starts), percentile bootstrap over prompts."""
    sums, starts = np.asarray(sums, float), np.asarray(starts, float)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(ids), size=(n_boot, len(ids)))
    values = sums[draws].sum(1) / starts[draws].sum(1)
    return float(sums.sum() / starts.sum()), *map(float, np.quantile(values, [0.025, 0.975]))


def _al_table(traces, ms, n_boot):
    """AL per engine, rule and m with intervals, and the paired difference over the shared prompts."""
    from cactus_theory import analyze_trace
    from cactus_theory.traces import Trace

    results = {
        e: analyze_trace(Trace(t), ["sps", "cactus(delta=1)"], ms=ms, n_boot=n_boot, progress=False)
        for e, t in traces.items()
    }
    shared = sorted(set.intersection(*({s.id for s in r.sequences} for r in results.values())))
    rows = []
    rng = np.random.default_rng(0)
    draws = rng.integers(0, len(shared), size=(n_boot, len(shared)))
    for rule in ("sps", "cactus(delta=1)"):
        for m in ms:
            row = {"rule": rule, "m": m}
            per = {}
            for engine, result in results.items():
                by_id = {s.id: s.rules[rule].block(result.m_used.get(m, m)) for s in result.sequences}
                sums = np.array([by_id[i].al_sum for i in shared], float)
                starts = np.array([by_id[i].starts for i in shared], float)
                per[engine] = (sums, starts)
                row[engine] = _bootstrap_al(sums, starts, shared, n_boot)
            (a_s, a_n), (b_s, b_n) = per["llama.cpp"], per["hf"]
            diff = a_s[draws].sum(1) / a_n[draws].sum(1) - b_s[draws].sum(1) / b_n[draws].sum(1)
            row["difference"] = (
                float(a_s.sum() / a_n.sum() - b_s.sum() / b_n.sum()),
                *map(float, np.quantile(diff, [0.025, 0.975])),
            )
            rows.append(row)
    return rows, len(shared)


def _decode_rows(records_path):
    """Per (engine, batch, rule, m): tokens/s over prompts (sum tokens / sum seconds), the verifier
    alone's, the speedup; at a batch > 1 the throughput over batches."""
    from cactus_theory.decode import batch_throughput

    records = [json.loads(line) for line in open(records_path)]
    out = []
    for key in sorted({(r["rule"], r["m"], r.get("batch", 1)) for r in records}, key=str):
        sel = [r for r in records if (r["rule"], r["m"], r.get("batch", 1)) == key]
        if key[2] > 1:
            got = batch_throughput(sel)
            rate, alone = got["tokens_per_second"], got["alone_tokens_per_second"]
        else:
            rate = sum(r["tokens"] for r in sel) / sum(r["seconds"] for r in sel)
            alone = sum(r["baseline"]["tokens"] for r in sel) / sum(r["baseline"]["seconds"] for r in sel)
        al = sum(sum(r["accepted"]) for r in sel) / sum(len(r["accepted"]) for r in sel)
        out.append(
            {
                "rule": key[0],
                "m": key[1],
                "batch": key[2],
                "prompts": len(sel),
                "al": al,
                "tokens_per_second": rate,
                "alone_tokens_per_second": alone,
                "speedup": rate / alone,
            }
        )
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=os.path.expanduser("~/.cache/cactus_theory/models"))
    parser.add_argument("--data", default=None, help="benchmark data directory (default: $CACTUS_THEORY_DATA)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts in each trace (half GSM8K, half HumanEval)")
    parser.add_argument("--decode-prompts", type=int, default=4, help="prompts decoded per engine")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--m", type=int, nargs="+", default=[2, 4, 8], help="block sizes decoded")
    parser.add_argument("--batch", type=int, default=4, help="llama.cpp batch size decoded (1: none)")
    parser.add_argument("--dtype", default="bfloat16", help="the HF path's dtype for traces and decoding")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-block", type=int, default=16, help="largest m whose verify block (m + 1) is timed")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--out", default=os.path.join(HERE, "..", "docs", "results"))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--engine", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--private-cache", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--trace", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--texts", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "speed":
        return child_speed(args)
    if args.child == "agreement":
        return child_agreement(args)

    from cactus_theory.traces import mixed_prompts

    work = tempfile.mkdtemp(prefix="llamacpp-vs-hf-")
    try:
        private = os.path.join(work, "cache")
        speed = {}
        for engine in ("hf", "llama.cpp"):
            print(f"timing {engine} ...", file=sys.stderr, flush=True)
            speed[engine] = _child("speed", args, ["--engine", engine, "--private-cache", private])
        half = max(args.prompts // 2, 1)
        prompts = mixed_prompts(args.data, {"gsm8k": half, "humaneval": half})
        prompt_file = os.path.join(work, "prompts.jsonl")
        with open(prompt_file, "w") as fh:
            for p in prompts:
                fh.write(json.dumps({"id": p.id, "text": p.text, "task": p.task}) + "\n")
        models = ["--verifier", os.path.join(args.models, VERIFIER), "--draft", os.path.join(args.models, DRAFT)]
        reads = ["--prompts", prompt_file, "--field", "text", "--quiet", "--max-new-tokens", str(args.max_new_tokens)]
        env_cache = {"CACTUS_THEORY_CACHE": private}
        os.environ.update(env_cache)  # the HF dequantised weights stay in the private cache
        traces, dump_seconds = {}, {}
        for engine in ("hf", "llama.cpp"):
            print(f"dumping a trace on {engine} ...", file=sys.stderr, flush=True)
            traces[engine] = os.path.join(work, f"trace-{engine}")
            extra = ["--dtype", args.dtype] if engine == "hf" else []
            _, dump_seconds[engine] = _run(
                _cli("dump", "--engine", engine, *models, *reads, *SAMPLING, *extra, "--out", traces[engine]),
                f"the {engine} dump",
            )
        print("agreement ...", file=sys.stderr, flush=True)
        texts = json.dumps({f"{p.task}-{p.id}": p.text for p in prompts})  # the ids the file's records get
        agreement = _child(
            "agreement", args, ["--private-cache", private, "--trace", traces["llama.cpp"], "--texts", texts]
        )
        al_rows, shared = _al_table(traces, (4, 8), args.bootstrap)
        decoding = []
        decode_reads = [
            "--prompts",
            prompt_file,
            "--field",
            "text",
            "--quiet",
            "--limit",
            str(args.decode_prompts),
            "--max-new-tokens",
            str(args.max_new_tokens),
        ]
        for engine in ("hf", "llama.cpp"):
            records = os.path.join(work, f"decode-{engine}.jsonl")
            extra = ["--dtype", args.dtype] if engine == "hf" else []
            for m in args.m:
                print(f"decoding on {engine}, m={m} ...", file=sys.stderr, flush=True)
                _run(
                    _cli(
                        "decode",
                        "--engine",
                        engine,
                        *models,
                        *decode_reads,
                        *SAMPLING,
                        *extra,
                        "--rule",
                        "sps,cactus",
                        "-m",
                        str(m),
                        "--baseline",
                        "--out",
                        records,
                    ),
                    f"decoding on {engine}",
                )
            if engine == "llama.cpp" and args.batch > 1:
                best = max(_decode_rows(records), key=lambda r: r["speedup"])["m"]
                print(f"decoding on {engine}, batch {args.batch} ...", file=sys.stderr, flush=True)
                _run(
                    _cli(
                        "decode",
                        "--engine",
                        engine,
                        *models,
                        *decode_reads,
                        *SAMPLING,
                        "--rule",
                        "sps,cactus",
                        "-m",
                        str(best),
                        "--batch",
                        str(args.batch),
                        "--baseline",
                        "--out",
                        records,
                    ),
                    "batched decoding",
                )
            decoding += [{"engine": engine, **row} for row in _decode_rows(records)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "machine": machine_description(),
        "settings": {
            "prompts": len(prompts),
            "decode_prompts": args.decode_prompts,
            "max_new_tokens": args.max_new_tokens,
            "hf_dtype": args.dtype,
            "repeats": args.repeats,
            "sampling": "temperature 0.6, top-k 20, top-p 0.95",
        },
        "speed": speed,
        "dump_seconds": dump_seconds,
        "agreement": agreement,
        "al": al_rows,
        "al_prompts": shared,
        "decoding": decoding,
    }
    page = markdown(result)
    write_results(args.out, "llamacpp", markdown=page, data=result)
    print(page)


def _ci(v):
    return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


def markdown(r) -> str:
    hf, ll = r["speed"]["hf"], r["speed"]["llama.cpp"]
    s = r["settings"]
    lines = [
        f"Measured by `python experiments/llamacpp_vs_hf.py` on {r['machine']} (HF path in {s['hf_dtype']}; "
        f"llama.cpp on the GGUF files as stored, Q4_K_M). Timings: medians of {s['repeats']} repeats.",
        "",
        "**Speed and memory** (each engine in its own process):",
        "",
        "| | HF | llama.cpp | HF / llama.cpp |",
        "|---|---|---|---|",
    ]
    for key in ("verifier first", "verifier second", "draft first", "draft second"):
        a, b = hf["load"][key], ll["load"][key]
        lines.append(f"| load, {key} | {a:.1f} s | {b:.1f} s | {a / b:.1f}x |")
    lines.append(
        f"| verifier prefill (128 tokens) | {hf['prefill_tokens_per_second']:.0f} tok/s | "
        f"{ll['prefill_tokens_per_second']:.0f} tok/s | "
        f"{ll['prefill_tokens_per_second'] / hf['prefill_tokens_per_second']:.1f}x |"
    )
    for role in ("verifier", "draft"):
        a, b = hf[f"{role}_step"], ll[f"{role}_step"]
        lines.append(f"| {role} decode step | {a * 1e3:.0f} ms | {b * 1e3:.0f} ms | {a / b:.1f}x |")
    lines.append(
        f"| peak resident memory (both models) | {hf['peak_rss_gib']:.1f} GiB | "
        f"{ll['peak_rss_gib']:.1f} GiB | "
        f"{hf['peak_rss_gib'] / ll['peak_rss_gib']:.1f}x |"
    )
    lines.append(
        f"| dump of {s['prompts']} prompts x {s['max_new_tokens']} tokens | {r['dump_seconds']['hf']:.0f} s | "
        f"{r['dump_seconds']['llama.cpp']:.0f} s | "
        f"{r['dump_seconds']['hf'] / r['dump_seconds']['llama.cpp']:.1f}x |"
    )
    lines += [
        "",
        "**A verify block of m + 1 tokens, as a ratio to one decode step** (verifier):",
        "",
        "| m | " + " | ".join(str(m) for m in hf["verify_block"]) + " |",
        "|---|" + "---|" * len(hf["verify_block"]),
    ]
    for name, d in (("HF", hf), ("llama.cpp", ll)):
        lines.append(
            f"| {name} | " + " | ".join(f"{v / d['verifier_step']:.2f}" for v in d["verify_block"].values()) + " |"
        )
    lines += [
        "",
        f"**Agreement** of the verifier's next-token distributions on the llama.cpp trace's "
        f"{r['agreement']['llama.cpp']['positions']} positions (the same prompts and token prefix), against "
        "the HF "
        "path in float32:",
        "",
        "| against HF float32 | KL mean | KL p99 | KL max | TV (sampled) mean | TV p99 | TV max | same argmax |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("bfloat16", "llama.cpp"):
        a = r["agreement"][name]
        label = "HF bfloat16 (rounding alone)" if name == "bfloat16" else "llama.cpp (quantised arithmetic)"
        lines.append(
            f"| {label} | {a['kl_mean']:.4f} | {a['kl_p99']:.4f} | {a['kl_max']:.4f} | {a['tv_mean']:.4f} | "
            f"{a['tv_p99']:.4f} | {a['tv_max']:.4f} | {a['same_argmax']:.1%} |"
        )
    lines += [
        "",
        f"**AL from a trace made by each engine** ({r['al_prompts']} prompts each, the same ones; 95% "
        "bootstrap intervals, the difference paired by prompt):",
        "",
        "| rule | m | HF | llama.cpp | llama.cpp - HF |",
        "|---|---|---|---|---|",
    ]
    for row in r["al"]:
        lines.append(
            f"| {row['rule']} | {row['m']} | {_ci(row['hf'])} | {_ci(row['llama.cpp'])} | {_ci(row['difference'])} |"
        )
    lines += [
        "",
        f"**Real speculative decoding** ({s['decode_prompts']} prompts x up to {s['max_new_tokens']} tokens, "
        "the verifier alone as baseline on the same engine and batch size):",
        "",
        "| engine | batch | rule | m | AL | tok/s | verifier alone tok/s | speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["decoding"]:
        lines.append(
            f"| {row['engine']} | {row['batch']} | {row['rule']} | {row['m']} | {row['al']:.2f} | "
            f"{row['tokens_per_second']:.2f} | {row['alone_tokens_per_second']:.2f} | "
            f"{row['speedup']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
