"""Which rule should I deploy? The exact quality referee on four public multiple-choice benchmarks (5,269
problems) with the real pair, then every rule's predicted speedup against its exact accuracy cost on one
frontier, and the fastest setting within an accuracy budget: with this machine's speed under two sampler chains,
and with a GPU's.

Usage:
    python experiments/fetch_models.py       # once: the Qwen2.5-Coder 0.5B / 1.5B GGUF files
    python experiments/fetch_benchmark.py    # once: ARC-Challenge, ARC-Easy, CommonsenseQA, OpenBookQA, checked
    cactus-theory calibrate --engine llama.cpp --verifier MODELS/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --draft MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --context 256 --max-block 11 --repeats 3 \\
        --prompt-lengths 32,128 --out COST.json                                  # once: this machine's costs
    python experiments/deployment_decision.py --data DIR --referee-only      # the referee alone (resumable)
    python experiments/deployment_decision.py --data DIR --cost COST.json [--max-loss 0.5] [--out docs/results] \\
        [--other-build RECORDS]

1. The exact referee (``exact_choice_referee``): Qwen2.5-Coder-0.5B-Instruct drafting for 1.5B (Q4_K_M,
   llama.cpp), one prompt pass per model per problem, every problem's answer rows kept (the top 64 raw logits of
   each model at the answer position), the records resumable in the user cache and written beside the page,
   compressed (``deployment_records.jsonl.gz``), with the calibration (``deployment_cost.json``).
2. The frontier (``deployment_frontier``) from those records alone: every registered token rule over its
   declared grid, SpS and the verifier alone, m in 2..10, the planner's predicted speedup from the embedded trace
   (the same pair) and the calibration, and the pooled paired accuracy difference from the verifier alone; with
   the package's (vLLM's) chain, the records' own, and with llama.cpp's default chain (top-k, top-p, min-p 0.05,
   temperature last), each rescored from the rows; and with a GPU's measured costs (``--gpu-profile``).
3. The time: the quality referee's seconds a problem against llama.cpp's own reading of the same prompts (``--timing``
   problems, measured in this run), and rescoring's problem-settings a second.
4. With ``--other-build``, records of the same problems from another build of llama.cpp (other kernels): how far
   the per-problem values and the paired differences move.

Writes OUT/deployment_decision.md, .json, .png (this machine, the package's chain), deployment_decision_llama.png,
deployment_decision_gpu.png, deployment_records.jsonl.gz and deployment_cost.json.
"""

from __future__ import annotations

import os
import sys
import time

from common import CACHE, DRAFT, SETTINGS, VERIFIER, Parser, count, existing, names, number
from quality_referee import RULES

from cactus_theory import CostModel, SamplingSettings, deployment_frontier, exact_choice_referee, load_model
from cactus_theory.io import atomic_write, check_output, machine_description, write_records, write_results
from cactus_theory.plan import cost_profiles, frontier_rules, load_cost
from cactus_theory.quality import load_problems, read_exact_records, rescore_exact, summarize_exact
from cactus_theory.rules import make_rules
from cactus_theory.studies import figure_png
from cactus_theory.traces import embedded_traces

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The four benchmarks of one provenance (llm-foundry's gauntlet at one commit; fetch_benchmark.py).
BENCHMARKS = ("arc_challenge", "arc_easy", "commonsense_qa", "openbook_qa")
#: A GPU's speed beside this machine's: vLLM's measured profile of Qwen3-32B verifying, Qwen3-0.6B drafting.
GPU_PROFILE = "qwen3-32b-0.6b-gb200-vllm"
#: llama.cpp's default chain at the paper's temperature, top-k and top-p (its min-p 0.05, temperature last).
LLAMA_SETTINGS = SamplingSettings(temperature=0.6, top_k=20, top_p=0.95, min_p=0.05, chain="llama.cpp")


def referee(args):
    """The exact referee's records on every problem of ``args.benchmarks`` (resumed from ``args.records``)."""
    problems = []
    for bench in args.benchmarks.split(","):
        problems += load_problems(bench, args.data, limit=args.limit)
    rules = [r.describe() for r in make_rules(RULES)]
    os.makedirs(os.path.dirname(os.path.abspath(args.records)), exist_ok=True)
    pair = [os.path.join(args.models, name) for name in (VERIFIER, DRAFT)]
    verifier, draft = (
        load_model(path, engine="llama.cpp", sequences=1, context=args.context, threads=args.threads) for path in pair
    )
    records = exact_choice_referee(
        verifier, draft, problems, rules, settings=SETTINGS, out=args.records, progress=True, threads=args.threads
    )
    return records, problems, (verifier, draft), rules


def measure_time(args, problems, pair, rules) -> dict:
    """The referee's seconds a problem against the prompt-reading floor, measured in this run: ``args.timing``
    problems spread over the benchmarks, the referee run afresh on them (no records file), and llama.cpp's own
    prompt evaluation of the same tokens (each model's sequence emptied and fed the prompt, the last row's logits
    read: what a problem cannot do without) once before and once after it, the two averaged; each after one
    untimed problem."""
    chosen = problems[:: max(1, len(problems) // args.timing)][: args.timing]
    if not chosen:
        return {}
    verifier, draft = pair
    prompts = [list(verifier[1](problem.prompt.text)["input_ids"]) for problem in chosen]

    def floor_seconds(batch):
        sequences = [model[0].sequence() for model in pair]  # each model's one sequence, closed after
        try:  # the first prompt twice: a sequence's first pass allocates, untimed
            times = [feed_seconds(seq, ids) for ids in [batch[0], *batch] for seq in sequences]
        finally:
            for seq in sequences:
                seq.close()
        return sum(times[len(sequences) :])

    def referee_seconds(batch):
        t0 = time.perf_counter()
        exact_choice_referee(verifier, draft, batch, rules, settings=SETTINGS, threads=args.threads)
        return time.perf_counter() - t0

    referee_seconds(chosen[:1])  # untimed: caches and threads warmed
    before = floor_seconds(prompts)
    seconds = referee_seconds(chosen)
    floor = (before + floor_seconds(prompts)) / 2
    return {
        "problems": len(chosen),
        "referee_s": seconds / len(chosen),
        "floor_s": floor / len(chosen),
        "floor_ratio": floor / seconds,
        "threads": verifier[0].threads,
    }


def feed_seconds(sequence, ids) -> float:
    """Seconds llama.cpp takes to read ``ids`` into the emptied ``sequence`` and give the last row's logits."""
    sequence.crop(0)
    t0 = time.perf_counter()
    sequence.feed(ids, want="last")
    return time.perf_counter() - t0


def rescoring_speed(records, settings) -> dict:
    """Problem-settings a second rescored from the records alone (every frontier rule and SpS, one chain)."""
    rules = frontier_rules()
    t0 = time.perf_counter()
    rescore_exact(records, rules, settings=settings)
    seconds = time.perf_counter() - t0
    problems = len({(r["benchmark"], r["id"]) for r in records})
    return {"settings": len(rules), "problems": problems, "seconds": seconds, "per_s": problems * len(rules) / seconds}


def build_drift(records, other_path) -> dict:
    """How far the records of another llama.cpp build (``other_path``: the same problems, another set of kernels)
    move: per problem, the largest change of a method's exact accuracy and of its paired difference from the
    verifier alone, over the problems both hold; and each method's mean paired difference (points) over them,
    under either build."""
    other = read_exact_records(other_path)
    kernels = [
        (r["setting"].get("arithmetic") or {}).get("verifier", {}).get("kernels") for r in (records[0], other[0])
    ]

    def table(rs):
        out = {}
        for r in rs:
            out.setdefault((r["benchmark"], r["id"]), {})[r["method"]] = r["accuracy"]
        return out

    a, b = table(records), table(other)
    common = sorted(set(a) & set(b))
    if not common:
        sys.exit(f"--other-build: {other_path} holds none of the records' problems")
    value = paired = 0.0
    means = {}  # method: the mean paired difference (points) over the common problems, this build and the other
    for key in common:
        alone = a[key]["verifier alone"] - b[key]["verifier alone"]
        for method in set(a[key]) & set(b[key]):
            change = a[key][method] - b[key][method]
            value = max(value, abs(change))
            paired = max(paired, abs(change - alone))
            mine = means.setdefault(method, [0.0, 0.0])
            mine[0] += 100 * (a[key][method] - a[key]["verifier alone"]) / len(common)
            mine[1] += 100 * (b[key][method] - b[key]["verifier alone"]) / len(common)
    means.pop("verifier alone", None)
    return {
        "problems": len(common),
        "kernels": kernels,
        "max_value": value,
        "max_paired": paired,
        "mean_differences": means,
        "max_mean_change": max((abs(x - y) for x, y in means.values()), default=0.0),
    }


def main(argv=None):
    parser = Parser(description=__doc__)
    parser.add_argument("--models", type=existing("--models"), default=os.path.join(CACHE, "models"))
    parser.add_argument("--data", default=None, help="the benchmark directory (<benchmark>/test.jsonl)")
    parser.add_argument(
        "--benchmarks", type=names(BENCHMARKS, "benchmarks of one answer token"), default=",".join(BENCHMARKS)
    )
    parser.add_argument("--limit", type=count(1), default=None, help="at most this many problems a benchmark")
    parser.add_argument("--context", type=count(16), default=512, help="tokens each model's cache holds")
    parser.add_argument("--threads", type=count(1), default=None, help="CPU threads of the forwards (default: all)")
    parser.add_argument("--records", default=os.path.join(CACHE, "deployment", "exact_records.jsonl"))
    parser.add_argument("--referee-only", action="store_true", help="run (or resume) the referee and stop")
    parser.add_argument(
        "--cost", default=None, help="the calibration (calibrate --engine llama.cpp), or a draft / verifier cost ratio"
    )
    parser.add_argument(
        "--trace", type=existing("--trace"), default=None, help="the pair's logit trace (default: embedded)"
    )
    parser.add_argument("--max-loss", type=number(0, 100), default=0.5, help="the accuracy budget, points")
    parser.add_argument(
        "--bootstrap", type=count(1), default=2000, help="resamples of every interval (the quality referee's 2,000)"
    )
    parser.add_argument(
        "--timing", type=count(0), default=24, help="problems the quality referee is timed on (0: none)"
    )
    parser.add_argument(
        "--gpu-profile",
        type=lambda text: text if text == "" else names(cost_profiles, "cost profiles")(text)[0],
        default=GPU_PROFILE,
        help="a measured cost profile for a GPU's frontier too ('': none)",
    )
    parser.add_argument("--other-build", type=existing("--other-build"), default=None, help="another build's records")
    parser.add_argument("--out", default=os.path.join(HERE, "docs", "results"))
    args = parser.parse_args(argv)  # every flag checked here, before any model loads
    args.benchmarks = ",".join(args.benchmarks)
    cost = None if args.referee_only else _cost(args.cost, parser)  # a bad --cost refused before the referee runs
    try:
        check_output(args.out, what="--out")
    except ValueError as exc:
        parser.error(str(exc))
    records, problems, pair, rules = referee(args)
    print(f"{len(problems)} problems, {len(records)} records")
    if args.referee_only:
        return 0
    clock = measure_time(args, problems, pair, rules) if args.timing > 0 else {}
    print(f"time: {clock}")
    drift = build_drift(records, args.other_build) if args.other_build else {}
    trace = args.trace or embedded_traces()
    views = {
        "package": ("this machine's speed, the package's (vLLM's) chain", SETTINGS, cost),
        "llama.cpp": ("this machine's speed, llama.cpp's chain", LLAMA_SETTINGS, cost),
    }
    if args.gpu_profile:
        gpu = CostModel.from_profile(args.gpu_profile)
        title = f"a GPU's speed ({gpu.source['hardware']}, {gpu.source['engine']}), vLLM's chain"
        views["gpu"] = (title, SETTINGS, gpu)
    frontiers = {}
    for name, (_, settings, speed) in views.items():
        frontiers[name] = deployment_frontier(
            trace, records, speed, settings=settings, max_loss=args.max_loss, n_boot=args.bootstrap, progress=True
        )
        print(frontiers[name].recommendation_line())
    rescoring = rescoring_speed(records, LLAMA_SETTINGS)
    print(f"rescoring: {rescoring['per_s']:,.0f} problem-settings a second")
    records_path = write_records(records, os.path.join(args.out, "deployment_records.jsonl.gz"))
    cost_name = keep_cost(args.cost, args.out)
    figures = {
        name: f"deployment_decision{'' if name == 'package' else '_' + name.split('.')[0]}.png" for name in views
    }
    for name, fig in figures.items():
        atomic_write(os.path.join(args.out, fig), figure_png(frontiers[name].figure()))
    summary = summarize_exact(records, n_boot=args.bootstrap)
    build = {
        "kernels": pair[0][0].kernels,
        "flash_attention": pair[0][0].flash_attention,
    }
    titles = {name: view[0] for name, view in views.items()}
    markdown = page(
        args,
        problems,
        clock,
        summary,
        frontiers,
        titles,
        figures,
        build,
        os.path.basename(records_path),
        rescoring,
        drift,
    )
    data = {
        "command": command_line(args),
        "machine": machine_description(),
        "time": clock,
        "rescoring": rescoring,
        "build_drift": drift,
        "problems": summary.problems,
        "build": build,
        "records": os.path.basename(records_path),
        "cost": cost_name,
        "max_loss": args.max_loss,
        "bootstrap": args.bootstrap,
        "chains": {
            name: {
                "title": titles[name],
                "settings": f.settings.describe(),
                "recommendation": f.recommendation,
                "line": f.recommendation_line(),
                "rows": f.rows,
                "benchmarks": f.benchmarks,
                "notes": f.notes,
                "speed": f.speed,
                "half_widths": half_widths(f),
            }
            for name, f in frontiers.items()
        },
        "rows": summary.rows,
    }
    for path in write_results(args.out, "deployment_decision", markdown=markdown, data=data):
        print(f"wrote {path}")
    return 0


def _cost(given, parser):
    """The calibration file, or a draft / verifier cost ratio (a number: the speedup per step), checked before any
    work (a refusal is argparse's: one line naming --cost, exit 2)."""
    try:
        ratio = float(given)
    except (TypeError, ValueError):
        pass
    else:
        try:
            return CostModel.from_ratio(ratio)
        except ValueError as exc:
            parser.error(f"argument --cost: {exc}")
    if not given or not os.path.exists(given):
        parser.error(f"argument --cost: no calibration at {given!r}: run the calibrate command in the docstring first")
    try:
        return load_cost(given)
    except ValueError as exc:
        parser.error(f"argument --cost: {exc}")


def keep_cost(given, out) -> str | None:
    """The calibration copied beside the page (``deployment_cost.json``: ``plan --quality`` reruns the frontier from
    it and the records), unless it is a bare ratio or already that file; returns its name there."""
    if not os.path.isfile(str(given)):
        return None
    target = os.path.join(out, "deployment_cost.json")
    if not (os.path.exists(target) and os.path.samefile(given, target)):
        with open(given, encoding="utf-8") as fh:
            atomic_write(target, fh.read())
    return os.path.basename(target)


def command_line(args) -> str:
    line = f"python experiments/deployment_decision.py --data DATA --cost COST.json --max-loss {args.max_loss:g}"
    if args.other_build:
        inside = os.path.abspath(args.other_build).startswith(HERE + os.sep)
        line += f" --other-build {os.path.relpath(args.other_build, HERE) if inside else 'RECORDS'}"
    return line + (f" --limit {args.limit}" if args.limit else "")


def half_widths(frontier) -> dict:
    """The largest half-width (points) of the accuracy interval over the front's settings: pooled and per
    benchmark (the lossless ones' are 0)."""
    front = {r["rule"] for r in frontier.rows if r["front"]}
    out = {}
    for b in frontier.benchmarks:
        if b["method"] in front:
            half = 100 * (b["high"] - b["low"]) / 2
            out[b["benchmark"]] = max(out.get(b["benchmark"], 0.0), half)
    return out


def page(args, problems, clock, summary, frontiers, titles, figures, build, records_name, rescoring, drift) -> str:
    """The page: the recommendations, each view's front and figure, the time, the build's drift, the power per
    benchmark."""
    n = len(problems)
    benches = sorted({p.benchmark for p in problems})
    lines = [
        "# Which rule should I deploy? The frontier on four multiple-choice benchmarks",
        "",
        f"Command: `{command_line(args)}` ({machine_description()}; Qwen2.5-Coder-0.5B-Instruct drafting for 1.5B, "
        f"Q4_K_M, llama.cpp built with {build['kernels'].replace(',', ', ')}, "
        f"flash attention {build['flash_attention']}). {n:,} problems ({', '.join(benches)}), each model's exact "
        "law at the answer position from one prompt pass per model per problem; the records, with each problem's "
        f"answer rows (the top 64 raw logits of each model), are `{records_name}` beside this page.",
        "",
        "Speed: the planner's predicted speedup with its 95% interval from the embedded trace (the same pair's code, "
        "maths and MT-Bench prompts), with this machine's calibration (`COST.json`, kept beside this page as "
        "`deployment_cost.json`: per request, prompt included)"
        + (
            f", and with {args.gpu_profile}, a measured vLLM profile of another pair (per step: this pair's "
            "acceptance where a draft costs what a GPU's does)"
            if args.gpu_profile
            else ""
        )
        + ". Accuracy: each setting's exact accuracy difference from the verifier alone, pooled over the four "
        "benchmarks, with the paired bootstrap's 95% interval over problems, every setting scored again from the "
        "records' answer rows (no model). The speed and the accuracy come from different prompts: two samples of "
        "the pair's behaviour.",
        "",
        "## The recommendations",
        "",
    ]
    for name, f in frontiers.items():
        lines.append(f"- {titles[name]} ({f.settings.describe()}): **{f.recommendation_line()}**")
    for name, f in frontiers.items():
        widths = half_widths(f)
        pooled = widths.get("all", max(widths.values(), default=0.0))
        lines += [
            "",
            f"## The frontier: {titles[name]}",
            "",
            f"Sampling: {f.settings.describe()}; speed: {f.speed}. Each rule at its fastest m, and every setting on "
            f"the front; the front's largest accuracy half-interval: {pooled:.2f} points pooled, "
            + ", ".join(f"{b} {w:.2f}" for b, w in sorted(widths.items()) if b != "all")
            + " per benchmark.",
            "",
            f.markdown(),
            "",
            f"![The frontier: {titles[name]}]({figures[name]})",
        ]
    lines += ["", "## Time", ""]
    if clock:
        lines.append(
            f"The exact quality referee: {clock['referee_s']:.2f} s a problem ({clock['problems']} problems spread "
            f"over the benchmarks, run afresh in this run, {clock['threads']} threads), against llama.cpp's own "
            f"evaluation of the same prompts by the two models, {clock['floor_s']:.2f} s: the prompt-reading "
            f"floor's share {clock['floor_ratio']:.2f} (all {n:,} problems: about "
            f"{n * clock['referee_s'] / 60:.0f} minutes)."
        )
    lines.append(
        f"Rescoring from the records alone (no model): {rescoring['problems']:,} problems x {rescoring['settings']} "
        f"settings in {rescoring['seconds']:.1f} s, {rescoring['per_s']:,.0f} problem-settings a second (llama.cpp's "
        "chain)."
    )
    if drift:
        lines += [
            "",
            "## Another build of llama.cpp",
            "",
            f"The same problems refereed with llama.cpp built with {drift['kernels'][1]} ({drift['problems']} "
            f"problems in common) against this page's build ({drift['kernels'][0]}): a method's exact accuracy on a "
            f"problem moves by up to {drift['max_value']:.3f}, its paired difference from the verifier alone by up to "
            f"{drift['max_paired']:.3f} (a letter whose probability sits at the edge of top-k or top-p: a nudge "
            "of the logits moves it in or out, and a relaxed rule then takes the draft's letter or not); averaged "
            f"over those problems, a method's paired difference moves by up to {drift['max_mean_change']:.2f} "
            "points. Records of different kernels are never mixed (a resumed run with another build is refused).",
            "",
            "| method | paired difference, points: this build | the other build |",
            "|---|---|---|",
            *(f"| {m} | {x:+.2f} | {y:+.2f} |" for m, (x, y) in sorted(drift["mean_differences"].items())),
        ]
    lines += [
        "",
        "## Every method the quality referee ran, per benchmark (the package's chain)",
        "",
        summary.table(),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
