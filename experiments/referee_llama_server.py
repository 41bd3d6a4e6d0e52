"""The referee: llama-server's own speculative decoding against what the planner predicts for it.

Usage:
    python experiments/fetch_models.py                      # once: the Qwen2.5-Coder GGUF pair
    python scripts/build_llama_server.py                    # once: llama-server (cached)
    python experiments/referee_llama_server.py --data DATA [--models DIR] [--out docs/results]

On prompts of tasks the embedded traces do not hold (MBPP's programming problems, MT-Bench's writing
and STEM questions; from the benchmark directory ``--data``), for each ``--parallel`` B in 1, 2, 4:

1. three llama-servers start on 127.0.0.1, each with ``--parallel B``: the verifier alone
   (Qwen2.5-Coder-1.5B), the drafter alone (0.5B), and the verifier with the drafter as its draft
   model (``--spec-type draft-simple --spec-draft-n-max M --spec-draft-p-min P``);
2. a calibration from the first two servers' own timings (``calibrate_server`` at batch 1 and B, on
   filler text, not on these prompts); and, once before the loop, a trace over HTTP from the
   verifier and the drafter alone, one slot each (``dump_server_trace``: the verifier samples each
   prompt with seed 1, the drafter is teacher-forced);
3. the prediction, before anything is measured: ``analyze_trace`` with llama-server's rule (strict
   verification of greedy drafts under the ``llama.cpp(p_min=P)`` drafting policy, m = M), then
   ``predict_speedup`` with the calibration at batch B: the acceptance rate (draft_n_accepted /
   draft_n), the accepted drafts per step and the speedup over the verifier alone at B requests in
   flight, with their intervals (the AL's bootstrap over prompts and the timings' spread);
4. the measurement: every prompt sent to the speculative server and to the verifier alone with
   B requests in flight and seed 2 (other samples than the trace's), the servers' own timings
   (``drive_server``): acceptance = sum accepted / sum drafted, accepted drafts per step = sum
   accepted / sum decoding steps, speedup = the generation rate (tokens over the server's own
   generation seconds, summed over requests) with the draft over that without; intervals by
   resampling prompts (paired, 2,000 resamples).

Writes referee_llama_server.md / .json into --out. The machine should be otherwise idle.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
from common import (
    MODELS,
    RESULTS,
    SETTINGS,
    Parser,
    count,
    counts,
    existing,
    number,
    pair_paths,
    scratch,
    server_itself,
    writable_out,
)

from cactus_theory import analyze_trace, load_trace, predict_speedup
from cactus_theory.io import write_results
from cactus_theory.servers import local_llama_server
from cactus_theory.traces import benchmark_file, load_prompts

HERE = os.path.dirname(os.path.abspath(__file__))


def pair_arguments(parser):
    """The arguments of a script that runs the Qwen pair on llama-server: --data, --models, --server-binary, --out
    (each checked as parsed, before a server starts)."""
    parser.add_argument("--data", default=os.environ.get("CACTUS_THEORY_DATA"), help="benchmark data directory")
    parser.add_argument("--models", type=existing("--models"), default=MODELS)
    parser.add_argument(
        "--server-binary",
        type=server_itself,
        default=os.environ.get("CACTUS_LLAMA_SERVER"),
        help="llama-server itself (not a shell launcher); default: $CACTUS_LLAMA_SERVER, else the one "
        "scripts/build_llama_server.py builds",
    )
    parser.add_argument("--out", default=RESULTS)


def server_binary(given=None):
    """llama-server's path: ``given``, else the one scripts/build_llama_server.py builds (once; cached)."""
    if given:
        return given
    return subprocess.run(
        [sys.executable, os.path.join(HERE, "..", "scripts", "build_llama_server.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def server(binary, args, log):
    """A llama-server on 127.0.0.1 and a free port for the block (``args``: "-m MODEL" and its flags); its URL.
    Stopped however the script ends: its own process group, on a normal end, an error, Ctrl-C, SIGTERM or
    SIGHUP, and killed by the kernel should this script die without a clean-up (``local_llama_server``)."""
    assert args[0] == "-m", args
    return local_llama_server(binary, args[1], *args[2:], "--metrics", log=log)


def held_out_prompts(data, mbpp, mt_bench):
    """MBPP problems and MT-Bench writing / STEM questions (tasks the embedded traces do not hold)."""
    from cactus_theory.traces import embedded_traces

    held = {s.id for s in embedded_traces()}
    out = load_prompts(benchmark_file("mbpp", data), dataset="mbpp")[:mbpp]
    mt = [p for p in load_prompts(benchmark_file("mt_bench", data), dataset="mt_bench") if p.id not in held]
    categories = _mt_categories(benchmark_file("mt_bench", data))
    mt = [p for p in mt if categories.get(p.index) in ("writing", "stem")]
    return out + mt[:mt_bench]


def _mt_categories(path):
    with open(path, encoding="utf-8") as fh:
        return {i: json.loads(line)["category"] for i, line in enumerate(fh) if line.strip()}


def bootstrap(values, statistic, n=2000, seed=0):
    """Percentile 95% interval of ``statistic(indices)`` over resampled prompt indices."""
    rng = np.random.default_rng(seed)
    k = len(values)
    draws = [statistic(rng.integers(0, k, k)) for _ in range(n)]
    return tuple(float(x) for x in np.percentile(draws, [2.5, 97.5]))


def measure(spec, base, B):
    """Measured acceptance, accepted drafts per step and speedup (each (value, lo, hi)) from the records."""
    idx = np.arange(len(spec))
    acc = np.array([r.accepted for r in spec], float)
    drafted = np.array([r.drafted for r in spec], float)
    steps = np.array([r.steps for r in spec], float)
    tok_s = np.array([r.tokens for r in spec], float)
    sec_s = np.array([r.generation_seconds for r in spec], float)
    tok_b = np.array([r.tokens for r in base], float)
    sec_b = np.array([r.generation_seconds for r in base], float)

    def rate(i):
        return acc[i].sum() / max(drafted[i].sum(), 1)

    def per_step(i):
        return acc[i].sum() / max(steps[i].sum(), 1)

    def speed(i):
        return (tok_s[i].sum() / sec_s[i].sum()) / (tok_b[i].sum() / sec_b[i].sum())

    return {
        name: (float(f(idx)), *bootstrap(idx, f, seed=B))
        for name, f in (("acceptance", rate), ("al_per_step", per_step), ("speedup", speed))
    }


def main(argv=None) -> int:
    from cactus_theory.plan import calibrate_server, drive_server
    from cactus_theory.traces import dump_server_trace, open_server

    parser = Parser(description=__doc__)
    pair_arguments(parser)
    parser.add_argument("--parallel", type=counts(1), default=[1, 2, 4], help="slots, comma-separated")
    parser.add_argument("--mbpp", type=count(0), default=6)
    parser.add_argument("--mt-bench", type=count(0), default=6)
    parser.add_argument("--max-new-tokens", type=count(1), default=96)
    parser.add_argument("--n-max", type=count(1), default=4, help="--spec-draft-n-max")
    parser.add_argument("--p-min", type=number(0, 1), default=0.5, help="--spec-draft-p-min")
    parser.add_argument("--threads", type=count(1), default=os.cpu_count() or 2)
    parser.add_argument("--context", type=count(16), default=256, help="tokens of context while the servers are timed")
    args = parser.parse_args(argv)  # every flag checked, before any server starts
    writable_out(parser, args.out)
    if args.mbpp + args.mt_bench == 0:
        parser.error("argument --mbpp / --mt-bench: give at least one prompt")
    args.server_binary = server_binary(args.server_binary)
    verifier, draft = pair_paths(args.models)
    prompts = held_out_prompts(args.data, args.mbpp, args.mt_bench)
    sizes = args.parallel
    policy = f"llama.cpp(p_min={args.p_min:g})"
    common = ["-c", str(4096 * max(sizes)), "-t", str(args.threads), "-tb", str(args.threads)]
    spec_flags = [
        "-md",
        draft,
        "--spec-type",
        "draft-simple",
        "--spec-draft-n-max",
        str(args.n_max),
        "--spec-draft-n-min",
        "0",
        "--spec-draft-p-min",
        str(args.p_min),
    ]
    with scratch("referee-") as work:  # the servers' log and the trace, removed however the run ends
        log = os.path.join(work, "servers.log")
        cells, started = [], time.time()
        # the trace, once, from the verifier and the drafter alone (one slot each: the servers' decoding, deterministic)
        trace_dir = os.path.join(work, "trace")
        with (
            server(args.server_binary, ["-m", verifier, *common, "-np", "1"], log) as base_url,
            server(args.server_binary, ["-m", draft, *common, "-np", "1"], log) as draft_url,
        ):
            t0 = time.perf_counter()
            dump_server_trace(
                base_url,
                draft_url,
                prompts,
                trace_dir,
                settings=SETTINGS,
                seed=1,
                top_k=32,
                max_new_tokens=args.max_new_tokens,
            )
            t_dump = time.perf_counter() - t0
        trace = load_trace(trace_dir)
        for B in sizes:
            par = ["-np", str(B)]
            with (
                server(args.server_binary, ["-m", verifier, *common, *par], log) as base_url,
                server(args.server_binary, ["-m", draft, *common, *par], log) as draft_url,
                server(args.server_binary, ["-m", verifier, *spec_flags, *common, *par], log) as spec_url,
            ):
                cost = calibrate_server(
                    base_url,
                    draft_url,
                    batches=sorted({1, B}),
                    max_block=args.n_max + 1,
                    repeats=3,
                    prompt_lengths=(64,),
                    context=args.context,
                )
                at = cost.at_batch(B)
                res = analyze_trace(
                    trace,
                    rules=["strict"],
                    ms=[args.n_max],
                    settings=SETTINGS,
                    draft_mode="greedy",
                    draft_policies=[policy],
                )
                plan = predict_speedup(res, at, allow_untrusted=True)
                key = make_policy_label(policy)
                row = next(r for r in plan.rows if r["task"] == "all" and r.get("draft_policy") == key)
                acceptance = res.drafted_acceptance("strict", args.n_max, key)
                predicted = {
                    "al_per_block_start": (float(row["al"]), float(row["al_lo"]), float(row["al_hi"])),
                    "acceptance": tuple(float(x) for x in acceptance),
                    "al_per_step": (float(row["al_step"]), float(row["al_step_lo"]), float(row["al_step_hi"])),
                    "speedup": (float(row["speedup"]), float(row["speedup_lo"]), float(row["speedup_hi"])),
                }
                _, speaker = open_server(base_url)
                ids = [speaker.prompt_ids(p.text, chat=True) for p in prompts]
                _, spec_speaker = open_server(spec_url)
                spec, wall_s, before, after = drive_server(
                    spec_speaker, ids, SETTINGS, args.max_new_tokens, concurrency=B, seed=2
                )
                base, wall_b, _, _ = drive_server(speaker, ids, SETTINGS, args.max_new_tokens, concurrency=B, seed=2)
                measured = measure(spec, base, B)
                steps = after.get("spec_decode_num_drafts_total", 0) - before.get("spec_decode_num_drafts_total", 0)
                accepted = sum(r.accepted for r in spec)
                same = sum(a.token_ids == b.token_ids for a, b in zip(spec, base, strict=True))
                cells.append(
                    {
                        "parallel": B,
                        "predicted": predicted,
                        "measured": measured,
                        "server_mean_acceptance_length": 1 + accepted / steps if steps else None,
                        "verification_steps": steps,
                        "requests": len(prompts),
                        "tokens": {"spec": sum(r.tokens for r in spec), "base": sum(r.tokens for r in base)},
                        "same_tokens_with_and_without_draft": int(same),
                        "wall_seconds": {"spec": wall_s, "base": wall_b, "dump": t_dump},
                        "cost": {
                            "draft_token": at.draft_token,
                            "draft_read_token": at.draft_read_token,
                            "verify_block": at.verify_block,
                        },
                        "trace_positions": trace.n_positions,
                    }
                )
                print(f"B={B}: predicted {predicted}, measured {measured}", flush=True)
    write(args, cells, prompts, policy, time.time() - started)
    return 0


def make_policy_label(spec):
    from cactus_theory.laws import make_draft_policy

    return make_draft_policy(spec).describe()


def _within(pred, meas, tol=0.15):
    return abs(pred - meas) <= tol * abs(meas)


def write(args, cells, prompts, policy, seconds):
    os.makedirs(args.out, exist_ok=True)
    command = (
        f"python experiments/referee_llama_server.py --data DATA --parallel {','.join(map(str, args.parallel))} "
        f"--mbpp {args.mbpp} "
        f"--mt-bench {args.mt_bench} --max-new-tokens {args.max_new_tokens} --n-max {args.n_max} "
        f"--p-min {args.p_min:g}"
    )
    lines = [
        "# The planner's referee: llama-server's own speculative decoding against the planner",
        "",
        f"Command: `{command}` ({seconds / 60:.1f} minutes on {platform.machine()}, {os.cpu_count()} cores,"
        f" {args.threads} threads per server). Generated by the script; do not edit by hand.",
        "",
        f"Qwen2.5-Coder-0.5B-Instruct drafting for 1.5B (Q4_K_M), llama-server built from llama-cpp-python's"
        f" llama.cpp, `--spec-type draft-simple --spec-draft-n-max {args.n_max} --spec-draft-p-min {args.p_min:g}`;"
        f" temperature {SETTINGS.temperature}, top-k {SETTINGS.top_k}, top-p {SETTINGS.top_p};"
        f" {len(prompts)} held-out prompts ({args.mbpp} MBPP, {args.mt_bench} MT-Bench writing / STEM), at most"
        f" {args.max_new_tokens} tokens each. The planner's rule: `strict` under greedy drafts with the"
        f" `{make_policy_label(policy)}` drafting policy; its trace taken over HTTP from the same servers (seed 1),"
        " its costs from the servers' own timings (`calibrate_server`); the measurement with seed 2.",
        "",
        "| --parallel | quantity | predicted (95% interval) | measured (95% interval) | within 15% | interval covers |",
        "|---|---|---|---|---|---|",
    ]
    within = covers = total = 0
    start = cells[0]["predicted"]["al_per_block_start"]
    for cell in cells:
        for name, label in (
            ("acceptance", "acceptance rate"),
            ("al_per_step", "accepted drafts per step"),
            ("speedup", "speedup over the verifier alone"),
        ):
            p, m = cell["predicted"][name], cell["measured"][name]
            ok = _within(p[0], m[0])
            cover = p[1] <= m[0] <= p[2]
            within += ok
            covers += cover
            total += 1
            lines.append(
                f"| {cell['parallel']} | {label} | {p[0]:.3f} ({p[1]:.3f}-{p[2]:.3f}) | {m[0]:.3f} "
                f"({m[1]:.3f}-{m[2]:.3f}) | {'yes' if ok else 'no'} | {'yes' if cover else 'no'} |"
            )
    lines += [
        "",
        f"Within 15%: {within} of {total} cells; the predicted interval covers the measured value in {covers} of"
        f" {total}. The accepted drafts per step are predicted over the steps decoding takes (`renewal_steps`);"
        f" averaged over block starts instead they would be {start[0]:.3f} ({start[1]:.3f}-{start[2]:.3f}).",
        "",
        "Per cell: llama-server's own mean acceptance length per verification step (1 + accepted / verification"
        " steps, from its /metrics counters), and how many requests gave the same tokens with and without the"
        " draft (strict verification is lossless; batched forwards round differently):",
        "",
        "| --parallel | server mean acceptance length | requests with the same tokens | positions in the trace |",
        "|---|---|---|---|",
    ]
    for cell in cells:
        mal = cell["server_mean_acceptance_length"]
        lines.append(
            f"| {cell['parallel']} | {mal:.3f} | {cell['same_tokens_with_and_without_draft']} of "
            f"{cell['requests']} | {cell['trace_positions']} |"
        )
    text = "\n".join(lines) + "\n"
    write_results(args.out, "referee_llama_server", markdown=text, data={"command": command, "cells": cells})
    print(text)


if __name__ == "__main__":
    raise SystemExit(main())
