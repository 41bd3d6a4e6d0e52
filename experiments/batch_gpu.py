"""Speculative decoding at serving concurrency on GPUs, predicted from a trace: the roofline cost
model fitted to the shipped measured vLLM profiles (each measured point against its modelled
value), the throughput speedup against batch size with the break-even batch for the shipped
GB200 profile pair (measured at batch 1, larger batches modelled) and for a roofline pair on
H100, beside this machine's measured batched decoding (docs/results/batch_vs_reality.json), and,
for the GB200 pair, static batches whose requests end at their own times and a verify budget.

Usage:
    python experiments/batch_gpu.py [--trace DIR] [--out docs/results] [--bootstrap 1000]

Writes batch_gpu.md / .json / .png into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from cactus_theory import CostModel, analyze_trace, load_trace, open_traces
from cactus_theory.compare import rule_colours
from cactus_theory.io import machine_description, write_results
from cactus_theory.plan import DEFAULT_COST_PROFILE, batch_plan, batch_requests, break_even, fit_to_profiles
from cactus_theory.studies import figure_png

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = ("sps", "cactus(delta=1)", "block")
MS = (1, 2, 3, 4, 6, 8, 12, 16, 20)
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
ROOFLINE = "roofline:qwen3-32b:qwen3-0.6b:h100"
REQUEST_SIZES = (1, 8, 32, 128)


def curves(result, cost, sizes, n_boot):
    plans = batch_plan(result, cost, sizes)
    out = []
    for row in break_even(plans):
        if row["draft_policy"]:
            continue
        per = row["per_batch"]
        out.append(
            {
                "rule": row["rule"],
                "break_even": row["break_even"],
                "verdict": row["verdict"],
                "points": [
                    {
                        "batch": b,
                        "m": per[b]["m"],
                        "speedup": per[b]["speedup"],
                        "lo": per[b]["speedup_lo"],
                        "hi": per[b]["speedup_hi"],
                    }
                    for b in sorted(per)
                ],
            }
        )
    return out


def figure(pairs, measured):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(pairs) + 1, figsize=(5 * (len(pairs) + 1), 4.2))
    from cactus_theory import make_rule

    rules = sorted({c["rule"] for _, cs in pairs for c in cs} | {r["rule"] for r in measured})
    families = rule_colours({make_rule(r).family for r in rules})  # a rule's colour by its family
    colours = {r: families[make_rule(r).family] for r in rules}
    for ax, (title, cs) in zip(axes, pairs, strict=False):
        for c in cs:
            xs = [p["batch"] for p in c["points"]]
            ax.plot(
                xs, [p["speedup"] for p in c["points"]], marker="o", ms=3, color=colours[c["rule"]], label=c["rule"]
            )
            ax.fill_between(
                xs,
                [p["lo"] for p in c["points"]],
                [p["hi"] for p in c["points"]],
                color=colours[c["rule"]],
                alpha=0.15,
                lw=0,
            )
            if c["break_even"] is not None:
                ax.axvline(c["break_even"], color=colours[c["rule"]], ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_title(title, fontsize=9)
    ax = axes[-1]
    for rule in sorted({r["rule"] for r in measured}):
        for m in sorted({r["m"] for r in measured if r["rule"] == rule}):
            pts = sorted((r for r in measured if r["rule"] == rule and r["m"] == m), key=lambda r: r["batch"])
            xs = [r["batch"] for r in pts]
            ax.errorbar(
                xs,
                [r["measured"] for r in pts],
                yerr=[[r["measured"] - r["measured_lo"] for r in pts], [r["measured_hi"] - r["measured"] for r in pts]],
                marker="o",
                ms=3,
                capsize=2,
                color=colours[rule],
                ls="-" if m == max(r["m"] for r in measured) else "--",
                label=f"{rule}, m = {m} (measured)",
            )
            ax.plot(
                xs,
                [r["predicted"] for r in pts],
                marker="x",
                ms=5,
                color=colours[rule],
                ls="none",
                label=f"{rule}, m = {m} (predicted)",
            )
    ax.set_title("this machine, llama.cpp (measured and predicted)", fontsize=9)
    ax.legend(fontsize=6, loc="center", ncol=2)
    for ax in axes:
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("batch size B")
        ax.grid(alpha=0.3)
    for ax in axes[:-1]:
        ax.legend(fontsize=7)
    axes[0].set_ylabel("throughput speedup at the best m")
    fig.suptitle("Throughput speedup against batch size (dotted: the break-even batch)", fontsize=10)
    fig.tight_layout()
    return fig


def markdown(data, trace, seconds):
    lines = [
        "# Speculative decoding at serving concurrency: GPUs from a roofline, this machine measured",
        "",
        f"Command: `{data['command']}` ({machine_description()}; {seconds:.0f} s). Trace: "
        f"{os.path.basename(os.path.normpath(trace.directory))} ({len(trace)} sequences, {trace.n_positions} "
        "positions).",
        "",
        "## The roofline fitted to the shipped measured profiles",
        "",
        f"t = max(bytes / bandwidth, FLOPs / peak) / efficiency + overhead + verify overhead [tokens > 1], fitted "
        f"(least squares on log time) to every timed part of the two shipped GB200 vLLM profiles: efficiency "
        f"{data['fit']['efficiency']:.2f}, overhead {1e3 * data['fit']['overhead']:.2f} ms per forward, verify "
        f"overhead {1e3 * data['fit']['verify_overhead']:.2f} ms per multi-token pass. Modelled, not measured.",
        "",
        "| measured point | measured (ms) | modelled (ms) | error |",
        "|---|---|---|---|",
    ]
    for r in data["fit"]["rows"]:
        lines.append(
            f"| {r['point']} | {1e3 * r['measured']:.2f} | {1e3 * r['modelled']:.2f} | {100 * r['error']:+.1f}% |"
        )
    within = sum(abs(r["error"]) <= 0.10 for r in data["fit"]["rows"])
    lines += ["", f"Within 10%: {within} of {len(data['fit']['rows'])} points.", ""]
    for title, cs in data["pairs"]:
        lines += [
            f"## {title}",
            "",
            "Throughput speedup over the batch at the best m (per-step; 95% interval from "
            "the AL bootstrap); break-even B: the smallest size from which on the best m no longer beats the "
            "verifier alone.",
            "",
            "| rule | " + " | ".join(f"B = {b}" for b in SIZES) + " | break-even B |",
            "|---|" + "---|" * (len(SIZES) + 1),
        ]
        for c in cs:
            cells = [f"{p['speedup']:.2f}x (m = {p['m']})" for p in c["points"]]
            lines.append(f"| {c['rule']} | " + " | ".join(cells) + f" | {c['verdict']} |")
        lines.append("")
    lines += [
        "## Requests that end at their own times, and a verify budget (the GB200 pair)",
        "",
        "At each rule's best m per batch size: static batches of the trace's requests, each leaving when it has "
        "emitted its tokens (throughput over the batch and the mean per-request latency against the verifier alone "
        "in the same batch, exact under independent positions; [min, max] over seeded batches that hold every "
        "request once, at least 4), and a full batch (continuous batching) verifying every draft or a verify budget "
        "shared by the batch that may draft nothing (Monte Carlo over 2,000 batch states, the requests at the "
        "positions decoding visits, +- its standard error; neither charges the extra draft forward after a fully "
        "accepted block, which the table above does).",
        "",
        "| rule | B | m | static batch throughput | per-request latency | full batch, every draft | full batch, budget "
        "| drafts verified per request |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["requests"]:
        lines.append(
            f"| {r['rule']} | {r['batch']} | {r['m']} | {r['throughput_speedup']:.2f}x "
            f"[{r['throughput_speedup_lo']:.2f}, {r['throughput_speedup_hi']:.2f}] | {r['latency_speedup']:.2f}x "
            f"[{r['latency_speedup_lo']:.2f}, {r['latency_speedup_hi']:.2f}] | {r['fixed_speedup']:.3f}x +- "
            f"{r['fixed_speedup_se']:.3f} | {r['budget_speedup']:.3f}x +- {r['budget_speedup_se']:.3f} | "
            f"{r['verified']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=None, help="trace directory (default: the embedded trace)")
    parser.add_argument("--out", default=os.path.join(HERE, "..", "docs", "results"))
    parser.add_argument("--bootstrap", type=int, default=1000)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    trace = load_trace(args.trace)
    result = analyze_trace(trace, list(RULES), ms=MS, n_boot=args.bootstrap, progress=False)
    roofline, fit_rows = fit_to_profiles()
    profile = CostModel.from_profile(DEFAULT_COST_PROFILE)
    pairs = [
        (
            f"Shipped measured profile {DEFAULT_COST_PROFILE} (Qwen3-32B verifying, 0.6B drafting, GB200; batch 1 "
            "measured, larger batches modelled by the fitted roofline)",
            curves(result, profile, SIZES, args.bootstrap),
        ),
        (
            f"Roofline {ROOFLINE} (modelled: Qwen3-32B verifying, 0.6B drafting on one H100, 1,024 tokens of context)",
            curves(result, CostModel.from_profile(ROOFLINE), SIZES, args.bootstrap),
        ),
    ]
    settings = {}
    for c in pairs[0][1]:
        for p in c["points"]:
            if p["batch"] in REQUEST_SIZES and c["rule"] != "block":
                settings[(c["rule"], p["batch"])] = p["m"]
    requests = batch_requests(open_traces(trace), settings, profile, REQUEST_SIZES, seed=0)
    measured_path = os.path.join(HERE, "..", "docs", "results", "batch_vs_reality.json")
    with open(measured_path, encoding="utf-8") as fh:
        measured = json.load(fh)["rows"]
    command = "python experiments/batch_gpu.py" + (f" --trace {args.trace}" if args.trace else "")
    data = {
        "command": command,
        "fit": {
            "efficiency": roofline.efficiency,
            "overhead": roofline.overhead,
            "verify_overhead": roofline.verify_overhead,
            "rows": fit_rows,
        },
        "pairs": pairs,
        "requests": requests,
    }
    seconds = time.perf_counter() - start
    text = markdown(data, trace, seconds)
    short = [("GB200 profile pair (batch > 1 modelled)", pairs[0][1]), ("H100 roofline pair (modelled)", pairs[1][1])]
    write_results(args.out, "batch_gpu", markdown=text, data=data, png=figure_png(figure(short, measured)))
    print(text)


if __name__ == "__main__":
    main()
