"""Predicted against measured whole-request speedups on prompts the planner never saw, and the
published GPU regime.

Usage:
    cactus-theory calibrate --verifier MODELS/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --draft MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --dtype bfloat16 --context 256 --max-block 13
    python experiments/plan_vs_reality.py --data DATA [--cost FILE] [--records FILE] [--out docs/results]
    python experiments/plan_vs_reality.py --prompts FILE [--task NAME] ...     (any prompt file)

1. Held-out prompts: by default, from the benchmark data directory ``--data``, MT-Bench
   questions the embedded trace does not hold (``--mt-bench`` of them) and Spec-Bench
   translation and question-answering questions (``--translation``, ``--qa``): tasks no part of
   this package was tuned on. Or any prompt file (``--prompts``).
2. The prediction, before decoding anything, two ways: (a) what a user has before collecting
   anything, the embedded trace's AL for each rule and m (the task's own rows where the trace
   has the task, else all tasks) for requests of each prompt's own length and
   ``--max-new-tokens`` output tokens; (b) what a user has after dumping a trace of their own
   prompts (``--heldout-trace``: the verifier samples each prompt once with another seed than
   the measured runs, the drafter is teacher-forced), its AL and lengths per task. Both with
   this machine's calibration (``--cost``; refused if it has problems, unless
   ``--trust-cost``); each rule runs at the m the planner finds best for the whole request
   from (a). The intervals combine AL's bootstrap and the timing spread.
3. The measurement: each prompt decoded by the verifier alone and by each rule (Qwen2.5-Coder
   0.5B drafting for 1.5B, bfloat16, seeded), the records kept in ``--records`` (a rerun skips
   what is done). Speedup per task = sum over prompts of the verifier alone's time over
   speculative decoding's, prefill included, both up to the same number of tokens per prompt
   (the shorter output's): like for like. Beside it, the prediction from the measured AL (the
   cost model alone), which splits the error into AL and cost.
4. The GPU regime: the embedded trace's AL under the measured vLLM profile of Qwen3-32B with a
   Qwen3-0.6B drafter on a GB200 (graphcore-research/relaxed-spec-dec-repro,
   ``profiles/paper/qwen3_32b_0p6b_b200_profile.json``; ``CostModel.from_profile``).

Writes plan_vs_reality.md / .json into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

import numpy as np

from cactus_theory import CostModel, analyze_trace, predict_speedup
from cactus_theory.io import machine_description, write_results
from cactus_theory.plan import default_cost_path, load_cost
from cactus_theory.studies import figure_png
from cactus_theory.traces import benchmark_file, embedded_traces, load_prompts, parse_rules

HERE = os.path.dirname(os.path.abspath(__file__))
PAIR = ("qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m")
MS = (1, 2, 3, 4, 6, 8)
PROFILE = "qwen3-32b-0.6b-gb200-vllm"


def heldout_prompts(args, trace):
    """The held-out prompts, each with its task, none of them in the trace."""
    held = {s["id"] for t in trace.traces for s in t.manifest["sequences"]}  # a trace set
    if args.prompts:
        prompts = []
        for path in args.prompts:
            prompts += load_prompts(path, task=args.task)
        return [p for p in prompts if p.id not in held][: args.limit]
    if not args.data:
        sys.exit("give --data (the benchmark directory) or --prompts FILE")
    mt = [p for p in load_prompts(benchmark_file("mt_bench", args.data), dataset="mt_bench") if p.id not in held]
    spec = load_prompts(benchmark_file("spec_bench", args.data), dataset="spec_bench")
    with open(benchmark_file("spec_bench", args.data), encoding="utf-8") as fh:
        categories = [json.loads(line)["category"] for line in fh if line.strip()]
    out = mt[: args.mt_bench]
    counts = (
        [(c, args.per_category) for c in args.categories]
        if args.categories
        else [("translation", args.translation), ("qa", args.qa)]
    )
    for category, count in counts:
        chosen = [p for p, c in zip(spec, categories, strict=True) if c == category and p.id not in held][:count]
        out += [type(p)(id=p.id, task=category, text=p.text, index=p.index, dataset="spec_bench") for p in chosen]
    return out


def predict_own(trace_dir, cost, rules, best, n_boot, trust):
    """Per (rule, m, task): the prediction from a trace of the held-out prompts themselves."""
    result = analyze_trace(trace_dir, rules, ms=tuple(sorted(set(best.values()))), n_boot=n_boot, progress=False)
    plan = predict_speedup(result, cost, allow_untrusted=trust)
    # keyed by the m asked for (an m longer than every held-out sequence is analysed as the longest)
    return {(r["rule"], m, r["task"]): r for m, used in result.m_used.items() for r in plan.rows if r["m"] == used}


def dump_heldout(args, prompts, settings):
    """A trace of the held-out prompts (seed 1: not the measured runs' samples); resumable."""
    from cactus_theory.traces import dump_trace

    dump_trace(
        os.path.join(args.models, PAIR[0] + ".gguf"),
        os.path.join(args.models, PAIR[1] + ".gguf"),
        prompts,
        args.heldout_trace,
        settings=settings,
        max_new_tokens=args.max_new_tokens,
        dtype=args.dtype,
        seed=1,
        progress=True,
        engine=args.engine,
    )
    return args.heldout_trace


def predict(trace, cost, rules, prompts, lengths, max_new_tokens, n_boot, trust):
    """Per rule: the best m for the whole request (all tasks), and per task the prediction there."""
    result = analyze_trace(trace, rules, ms=MS, n_boot=n_boot, progress=False)
    have = {r["task"] for r in result.rows}
    tasks = sorted({p.task for p in prompts})
    out = {}
    for task in tasks:
        mean_prompt = float(np.mean([lengths[p.id] for p in prompts if p.task == task]))
        plan = predict_speedup(
            result, cost, prompt_tokens=mean_prompt, output_tokens=max_new_tokens, allow_untrusted=trust
        )
        source = task if task in have else "all"
        for r in plan.rows:
            if r["task"] == source:
                out[(r["rule"], r["m"], task)] = dict(r, al_source=source)
    best = {}
    everything = predict_speedup(
        result,
        cost,
        prompt_tokens=float(np.mean(list(lengths.values()))),
        output_tokens=max_new_tokens,
        allow_untrusted=trust,
    )
    for r in everything.best_m("all"):
        best[r["rule"]] = r["m"]
    return out, best, result


def measure(args, prompts, rules, best, settings):
    from cactus_theory import decode_prompts
    from cactus_theory.hf import load_model

    models = args.models
    engine = {"engine": "llama.cpp", "sequences": 2} if args.engine == "llama.cpp" else {}
    verifier = load_model(os.path.join(models, PAIR[0] + ".gguf"), dtype=args.dtype, progress=True, **engine)
    draft = load_model(os.path.join(models, PAIR[1] + ".gguf"), dtype=args.dtype, progress=True, **engine)[0]
    records = {}
    first = True
    for rule in rules:
        label = rule.describe()
        recs = decode_prompts(
            verifier,
            draft,
            rule,
            prompts,
            m=best[label],
            settings=settings,
            max_new_tokens=args.max_new_tokens,
            seed=0,
            baseline=first,
            out=args.records,
            progress=True,
        )
        if first:
            baselines = {r["id"]: r["baseline"] for r in recs}
        for r in recs:
            r["baseline"] = baselines[r["id"]]  # one verifier-alone run per prompt serves every rule
        records[label] = recs
        first = False
    return records, verifier[1]


def compare(cost, predicted, own, records, best, prompts, n_boot=2000):
    from cactus_theory.decode import decoding_flags, matched_times

    rng = np.random.default_rng(0)
    rows = []
    for label, recs in records.items():
        m = best[label]
        for task in sorted({p.task for p in prompts}):
            sel = [r for r in recs if r["task"] == task]
            times = [matched_times(r) for r in sel]
            spec = np.array([t[1][0] + t[1][1] for t in times])
            base = np.array([t[2][0] + t[2][1] for t in times])
            measured = base.sum() / spec.sum()
            idx = rng.integers(len(sel), size=(n_boot, len(sel)))
            lo, hi = np.percentile(base[idx].sum(1) / spec[idx].sum(1), [2.5, 97.5])
            steps = sum(len(r["accepted"]) for r in sel)
            al = sum(sum(r["accepted"]) for r in sel) / max(steps, 1)
            full = sum(a == d == m for r in sel for a, d in zip(r["accepted"], r["drafted"], strict=True)) / max(
                steps, 1
            )
            n_out = float(np.mean([t[0] for t in times]))
            n_prompt = float(np.mean([r["prompt_tokens"] for r in sel]))
            t = cost.request_times(n_prompt, n_out, m, al, all_accepted=full)
            pred = predicted[(label, m, task)]
            mine = own.get((label, m, task), {}) if own else {}
            prefill = float(np.sum([t_[1][0] for t_ in times]) / spec.sum())
            rows.append(
                {
                    "rule": label,
                    "task": task,
                    "m": m,
                    "prompts": len(sel),
                    "measured": float(measured),
                    "measured_lo": float(lo),
                    "measured_hi": float(hi),
                    "measured_al": al,
                    "trace_al": pred["al"],
                    "al_source": pred["al_source"],
                    "predicted": pred["request_speedup"],
                    "predicted_lo": pred["request_speedup_lo"],
                    "predicted_hi": pred["request_speedup_hi"],
                    "error": pred["request_speedup"] / measured - 1,
                    "own_trace_al": mine.get("al", float("nan")),
                    "own_predicted": mine.get("request_speedup", float("nan")),
                    "own_predicted_lo": mine.get("request_speedup_lo", float("nan")),
                    "own_predicted_hi": mine.get("request_speedup_hi", float("nan")),
                    "own_error": mine.get("request_speedup", float("nan")) / measured - 1,
                    "predicted_from_measured_al": float(t["baseline_total"] / t["total"]),
                    "error_cost_only": float(t["baseline_total"] / t["total"] / measured - 1),
                    "measured_prefill_share": prefill,
                    "predicted_prefill_share": pred["prefill_share"],
                    "matched_tokens": n_out,
                    "length_mismatch": sum(decoding_flags(r)["length_mismatch"] for r in sel),
                    "busy": sum(decoding_flags(r)["busy"] for r in sel),
                }
            )
    return rows


def gpu_regime(trace, n_boot):
    cost = CostModel.from_profile(PROFILE)
    rules = parse_rules("sps,tas,cactus", (1.0,))
    result = analyze_trace(trace, rules, ms=(3, 5, 10, 20), n_boot=n_boot, progress=False)
    plan = predict_speedup(result, cost)
    return cost, [r for r in plan.rows if r["task"] == "all"]


def command_line(args, parser) -> str:
    """This run's command: the options given that differ from their defaults (paths as their names)."""
    words = ["python experiments/plan_vs_reality.py", "--data DATA" if not args.prompts else "--prompts ..."]
    words += ["--cost COST.json"] if args.cost_given else []
    paths = {"help", "cost", "records", "out", "models", "data", "prompts"}  # named above, or this machine's own
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if action.dest in paths or not action.option_strings or value is None or value == action.default:
            continue
        text = ",".join(value) if isinstance(value, list) else str(value)
        words += [action.option_strings[0]] + ([shlex.quote(text)] if action.nargs != 0 else [])
    return " ".join(words)


def markdown(cost, rows, gpu_cost, gpu_rows, command, prompts, engine="hf", given_cost=False):
    v = cost.verify_block
    pre = cost.prefill.get("verifier", {})
    calibration = (
        "with the calibration it is given (its figures below)"
        if given_cost
        else f"after `cactus-theory calibrate --verifier MODELS/{PAIR[0]}.gguf --draft MODELS/{PAIR[1]}.gguf "
        f"{'--dtype bfloat16' if engine == 'hf' else '--engine llama.cpp'} --context 256 --max-block 13`"
    )
    lines = [
        "# Predicted against measured speedups on held-out prompts",
        "",
        f"Command: `{command}` {calibration} (MODELS: "
        "`~/.cache/cactus_theory/models`, from `experiments/fetch_models.py`; DATA: the benchmark directory).",
        "",
        f"Calibration ({cost.source.get('machine', '?')}, {cost.source.get('dtype', '?')}, context "
        f"{cost.source.get('context', '?')}): a drafted token {cost.draft_token * 1e3:.0f} ms, a verifier block of 1 "
        f"token {v[1] * 1e3:.0f} ms, of {max(v)} tokens {v[max(v)] * 1e3:.0f} ms; verifier prefill "
        + ", ".join(f"{n} tokens {s:.2f} s" for n, s in pre.items())
        + f"; other processes used {cost.load.get('other', float('nan')):.0%} of the cores while it ran; problems: "
        + ("; ".join(cost.problems()) or "none")
        + ".",
        "",
        f"Held-out prompts: {', '.join(p.id + ' (' + p.task + ')' for p in prompts)}.",
        "",
        "Predicted (a): from the embedded trace, before collecting anything; (b): from a trace of these prompts "
        "(another seed than the measured runs); and from the measured AL (the cost model alone).",
        "",
        "| rule | task | m | measured request speedup [95% CI] | (a) embedded trace [95% CI] | error | (b) own trace "
        "[95% CI] | error | AL measured / embedded (source) / own | from the measured AL | error | prefill share "
        "measured / (a) | flags |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        inside = r["predicted_lo"] <= r["measured"] <= r["predicted_hi"]
        inside_own = r["own_predicted_lo"] <= r["measured"] <= r["own_predicted_hi"]
        flags = []
        if r["length_mismatch"]:
            flags.append(f"{r['length_mismatch']} length mismatch")
        if r["busy"]:
            flags.append(f"{r['busy']} busy")
        lines.append(
            f"| {r['rule']} | {r['task']} | {r['m']} | {r['measured']:.2f}x [{r['measured_lo']:.2f}, "
            f"{r['measured_hi']:.2f}] | {r['predicted']:.2f}x [{r['predicted_lo']:.2f}, {r['predicted_hi']:.2f}]"
            f"{'' if inside else ' (outside)'} | {r['error']:+.1%} | {r['own_predicted']:.2f}x "
            f"[{r['own_predicted_lo']:.2f}, {r['own_predicted_hi']:.2f}]{'' if inside_own else ' (outside)'} | "
            f"{r['own_error']:+.1%} | {r['measured_al']:.2f} / {r['trace_al']:.2f} ({r['al_source']}) / "
            f"{r['own_trace_al']:.2f} | {r['predicted_from_measured_al']:.2f}x | {r['error_cost_only']:+.1%} | "
            f"{r['measured_prefill_share']:.0%} / {r['predicted_prefill_share']:.0%} | {', '.join(flags) or '-'} |"
        )

    def tally(key, lo, hi):
        within = sum(1 for r in rows if abs(r[key]) <= 0.15)
        covered = sum(1 for r in rows if r[lo] <= r["measured"] <= r[hi])
        return within, covered, max(abs(r[key]) for r in rows)

    a, b = tally("error", "predicted_lo", "predicted_hi"), tally("own_error", "own_predicted_lo", "own_predicted_hi")
    lines += [
        "",
        f"Within 15% of the measurement, of {len(rows)} rule x task cells: (a) {a[0]}, (b) {b[0]}; the measurement "
        f"inside the predicted interval: (a) {a[1]}, (b) {b[1]}. Largest error: (a) {a[2]:.1%}, (b) {b[2]:.1%}, from "
        f"the measured AL (the cost model alone) {max(abs(r['error_cost_only']) for r in rows):.1%}.",
        "",
        f"## The GPU regime: a measured vLLM profile ({gpu_cost.source['hardware']}, {gpu_cost.source['engine']})",
        "",
        f"`{PROFILE}`: {gpu_cost.source['verifier']} verifying, {gpu_cost.source['draft']} drafting, batch size 1, "
        f"from {gpu_cost.source['repository']}@{gpu_cost.source['commit'][:7]} `{gpu_cost.source['path']}`: a drafted "
        f"token {gpu_cost.draft_token * 1e3:.2f} ms, one verifier token {gpu_cost.verify_block[1] * 1e3:.2f} ms, a "
        f"block of 4 tokens {gpu_cost.verify_block[4] * 1e3:.2f} ms "
        f"({gpu_cost.verify_block[4] / gpu_cost.verify_block[1]:.2f}x "
        "one token), no prefill measured (per-step speedups). With the embedded trace's AL (a different, smaller "
        "pair: the regime is compared, not the models):",
        "",
        "| rule | m | AL | predicted per-step speedup [95% CI] |",
        "|---|---|---|---|",
    ]
    for r in gpu_rows:
        lines.append(
            f"| {r['rule']} | {r['m']} | {r['al']:.2f} | {r['speedup']:.2f}x [{r['speedup_lo']:.2f}, "
            f"{r['speedup_hi']:.2f}] |"
        )
    lines += [
        "",
        "Hao & Mou report wall-time gains of up to about 1.9x at m = 10 (Qwen3-14B with a 0.6B drafter, vLLM, "
        "A100). The profile's verifier block costs about 2.5x one token even at 4 tokens, which the flat-block "
        "what-if (`CostModel.from_ratio`) leaves out.",
    ]
    return "\n".join(lines) + "\n"


def figure(rows):
    """Predicted (with its interval) against measured (with its interval) request speedup."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for i, r in enumerate(rows):
        ax.errorbar(
            r["measured"],
            r["predicted"],
            xerr=[[r["measured"] - r["measured_lo"]], [r["measured_hi"] - r["measured"]]],
            yerr=[[r["predicted"] - r["predicted_lo"]], [r["predicted_hi"] - r["predicted"]]],
            marker="o",
            capsize=3,
            color=f"C{i % 10}",
            label=f"{r['rule']}, {r['task']}",
        )
        if np.isfinite(r.get("own_predicted", np.nan)):
            ax.errorbar(
                r["measured"],
                r["own_predicted"],
                yerr=[[r["own_predicted"] - r["own_predicted_lo"]], [r["own_predicted_hi"] - r["own_predicted"]]],
                marker="s",
                mfc="none",
                capsize=3,
                color=f"C{i % 10}",
            )
    keys = ("measured_lo", "measured_hi", "predicted_lo", "predicted_hi", "own_predicted_lo", "own_predicted_hi")
    values = [r[k] for r in rows for k in keys if np.isfinite(r.get(k, np.nan))]
    lo, hi = min(values) * 0.95, max(values) * 1.05
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax.fill_between(
        [lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="grey", alpha=0.15, label="within 15%"
    )
    ax.set_xlabel("measured request speedup (matched lengths)")
    ax.set_ylabel("predicted request speedup (o: embedded trace, □: own trace)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cost", default=None, help="the calibration (default: calibrate's file for the engine)")
    parser.add_argument("--engine", default="hf", choices=("hf", "llama.cpp"), help="the engine decoding runs on")
    parser.add_argument(
        "--categories",
        default=None,
        type=lambda text: [c for c in text.split(",") if c],
        help="Spec-Bench categories held out, --per-category questions each, the first ones not in the embedded "
        "trace set (instead of --translation / --qa)",
    )
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--name", default="plan_vs_reality", help="the stem of the files written to --out")
    parser.add_argument("--trust-cost", action="store_true", help="use a calibration with problems anyway")
    parser.add_argument("--data", default=None, help="benchmark data directory (the default held-out set)")
    parser.add_argument("--prompts", action="append", default=None, help="any prompt file instead (repeatable)")
    parser.add_argument("--task", default=None, help="with --prompts: the task label")
    parser.add_argument("--limit", type=int, default=None, help="with --prompts: at most this many")
    parser.add_argument("--mt-bench", type=int, default=4)
    parser.add_argument("--translation", type=int, default=3)
    parser.add_argument("--qa", type=int, default=3)
    parser.add_argument("--rules", default="sps,cactus(delta=1)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--models", default=os.path.expanduser("~/.cache/cactus_theory/models"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--records", default=None, help="decoding records (JSON Lines; a rerun skips the prompts done; default: cache)"
    )
    parser.add_argument(
        "--heldout-trace",
        default=None,
        help="dump a trace of the held-out prompts here (seed 1) and predict from it too (default: in the user "
        "cache; '' to skip)",
    )
    parser.add_argument("--out", default=os.path.join(HERE, "..", "docs", "results"))
    parser.add_argument("--bootstrap", type=int, default=1000)
    args = parser.parse_args(argv)
    from cactus_theory.hf import cache_root

    runs = os.path.join(cache_root(), "runs")
    args.records = args.records or os.path.join(runs, "plan_vs_reality.jsonl")
    args.heldout_trace = os.path.join(runs, "heldout_trace") if args.heldout_trace is None else args.heldout_trace
    args.cost_given = args.cost is not None
    args.cost = args.cost or default_cost_path(*PAIR, "bfloat16" if args.engine == "hf" else "llamacpp", "cpu")
    if not os.path.isfile(args.cost):
        sys.exit(f"no calibration at {args.cost}: run the calibrate command in this script's docstring first")
    cost = load_cost(args.cost)
    if cost.problems() and not args.trust_cost:
        sys.exit("the calibration has problems: " + "; ".join(cost.problems()) + " (recalibrate, or --trust-cost)")
    from cactus_theory import SamplingSettings
    from cactus_theory.hf import encode_chat, load_model

    # the embedded trace set: the default trace, and with Spec-Bench categories the Spec-Bench trace
    trace = embedded_traces(args.categories)
    settings = SamplingSettings(**trace.metadata["sampling"])
    prompts = heldout_prompts(args, trace)
    rules = parse_rules(args.rules, (1.0,))
    tokenizer = load_model(os.path.join(args.models, PAIR[0] + ".gguf"), dtype=args.dtype)[1]
    lengths = {p.id: len(encode_chat(tokenizer, p.text)) for p in prompts}
    predicted, best, _ = predict(
        trace, cost, rules, prompts, lengths, args.max_new_tokens, args.bootstrap, args.trust_cost
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.records)), exist_ok=True)
    own = None
    if args.heldout_trace:
        own = predict_own(dump_heldout(args, prompts, settings), cost, rules, best, args.bootstrap, args.trust_cost)
    records, _ = measure(args, prompts, rules, best, settings)
    rows = compare(cost, predicted, own, records, best, prompts)
    gpu_cost, gpu_rows = gpu_regime(trace, args.bootstrap)
    text = markdown(cost, rows, gpu_cost, gpu_rows, command_line(args, parser), prompts, args.engine, args.cost_given)
    data = {
        "cost": json.loads(cost.to_json()),
        "rows": rows,
        "gpu_profile": PROFILE,
        "gpu_rows": gpu_rows,
        "prompts": [p.id for p in prompts],
        "machine": machine_description(),
    }
    write_results(args.out, args.name, markdown=text, data=data, png=figure_png(figure(rows)))
    print(text)


if __name__ == "__main__":
    main()
