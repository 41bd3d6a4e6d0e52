"""The verification methods engines added lately, on a trace and exactly on small vocabularies:
FLy (vLLM PR 53987), MagicMTP (vllm-ascend PRs 4443 / 5542) and entropy verify (vllm-ascend PR
9772), against SpS and block verification.

Usage:
    python experiments/engine_rules.py [--trace DIR] [--out docs/results] [--bootstrap 1000] [--m 4 8 20]

1. On the trace (default: the embedded one): AL(m) with bootstrap 95% intervals over sequences,
   the gain over SpS with a paired interval (the same resampled sequences for both), and the
   drift of what the block emits (KL and TV per emitted token, each slot's law against the
   verifier's, weighted by the chance of reaching it). FLy's numbers are exact; MagicMTP's are
   Monte Carlo over 1,024 seeded drafted blocks and uniforms per block start (its AL's standard
   error is printed); block verification's AL is exact for m <= 3 and Monte Carlo beyond.
2. Exactly, on small vocabularies: the total variation between the law of the first L tokens a
   rule emits (blocks of m drafts, every draft, coin and recovered token enumerated) and the
   verifier's, for Sun et al.'s toy pair (p = (2/3, 1/3), q = (1/3, 2/3)) and three seeded
   random pairs of 3 tokens: 0 for a lossless rule, what the rule moves otherwise.

Writes engine_rules.md / .json / .png into --out.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from cactus_theory import analyze_trace, load_trace
from cactus_theory.compare import rule_colours
from cactus_theory.io import machine_description, write_results
from cactus_theory.studies import figure_png
from cactus_theory.testing import sequence_tv_rows

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = (
    "sps",
    "block",
    "fly",
    "fly(window=2)",
    "magic-mtp",
    "magic-mtp(recovery=residual)",
    "entropy-verify",
    "entropy-verify(alpha=0.4)",
)
EXACT_RULES = (
    "block",
    "fly(window=1, threshold=0)",
    "fly(window=2, threshold=0)",
    "magic-mtp",
    "magic-mtp(recovery=residual)",
)


def exact_part(length=4):
    return sequence_tv_rows(EXACT_RULES, length=length)


def trace_part(trace, ms, n_boot):
    start = time.perf_counter()
    result = analyze_trace(trace, list(RULES), ms=ms, n_boot=n_boot, progress=False)
    seconds = time.perf_counter() - start
    rows = []
    for r in result.rows:
        if r["task"] != "all":
            continue
        row = {k: r[k] for k in ("rule", "m", "al", "al_lo", "al_hi", "kl_per_token", "tv_per_token")}
        if r["rule"] != "sps":
            gain = result.al_ratio(r["rule"], "sps", r["m"], n_boot=n_boot)
            row.update(gain=gain[0], gain_lo=gain[1], gain_hi=gain[2])
        rows.append(row)
    return result, rows, seconds


def monte_carlo_errors(trace, ms):
    """MagicMTP's mean Monte Carlo standard error of AL(m) per block start, per m."""
    from cactus_theory import SamplingSettings
    from cactus_theory.laws import block_accepted_length

    settings = SamplingSettings(**trace.metadata["sampling"])
    out = {}
    for m in ms:
        errors = []
        for seq in trace:
            if seq.n_positions < m:
                continue
            p, q = seq.distributions(settings)
            errors.append(block_accepted_length("magic-mtp", p, q, m, full_output=True).standard_error)
        out[m] = float(np.mean(np.concatenate(errors))) if errors else float("nan")
    return out


def figure(rows, ms):
    """AL(m) / m with its interval (left) and TV per emitted token (right) against m, per rule
    (each rule's points set a little apart so that intervals do not hide each other)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    rules = list(dict.fromkeys(r["rule"] for r in rows))
    colours = rule_colours(rules)
    places = {m: i for i, m in enumerate(sorted(set(ms)))}
    for k, rule in enumerate(rules):
        mine = sorted((r for r in rows if r["rule"] == rule), key=lambda r: r["m"])
        x = [places[r["m"]] + 0.07 * (k - (len(rules) - 1) / 2) for r in mine]
        share = [r["al"] / r["m"] for r in mine]
        spread = [[(r["al"] - r["al_lo"]) / r["m"] for r in mine], [(r["al_hi"] - r["al"]) / r["m"] for r in mine]]
        axes[0].errorbar(x, share, yerr=spread, color=colours[rule], marker="o", ms=4, capsize=2, lw=1, label=rule)
        axes[1].plot(x, [r["tv_per_token"] for r in mine], color=colours[rule], marker="o", ms=4, lw=1, label=rule)
    for ax in axes:
        ax.set_xticks(list(places.values()), [f"m = {m}" for m in places])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("AL / m (share of the drafts accepted; 95% intervals)")
    axes[1].set_ylabel("TV from the verifier per emitted token")
    axes[1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle("FLy, MagicMTP and entropy verify against SpS and block verification on the trace", fontsize=10)
    fig.tight_layout()
    return fig


def markdown(rows, exact, errors, command, trace, seconds):
    lines = [
        "# FLy, MagicMTP and entropy verify against SpS and block verification",
        "",
        f"Command: `{command}` ({machine_description()}; the analysis {seconds:.0f} s). Trace: "
        f"{os.path.basename(os.path.normpath(trace.directory))} ({len(trace)} sequences, "
        f"{trace.n_positions} positions).",
        "",
        "AL(m) with bootstrap 95% intervals over sequences; gain = AL / AL(sps) - 1 with a paired interval; KL and TV "
        "per emitted token (each slot's law against the verifier's, weighted by the chance of reaching it). FLy: "
        "exact; entropy verify (a token rule): exact, its entropy from the stored logits. MagicMTP: Monte Carlo, "
        "mean standard error of AL per block start "
        + ", ".join(f"{errors[m]:.4f} at m = {m}" for m in sorted(errors))
        + ". Block: exact for m <= 3, Monte Carlo beyond.",
        "",
        "| rule | m | AL | gain over sps | KL/token | TV/token |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        gain = (
            "" if "gain" not in r else f"{100 * r['gain']:+.1f}% [{100 * r['gain_lo']:+.1f}, {100 * r['gain_hi']:+.1f}]"
        )
        lines.append(
            f"| {r['rule']} | {r['m']} | {r['al']:.3f} [{r['al_lo']:.3f}, {r['al_hi']:.3f}] | {gain} | "
            f"{r['kl_per_token']:.4f} | {r['tv_per_token']:.4f} |"
        )
    lines += [
        "",
        f"## Exact total variation of the first {exact[0]['length']} tokens from the verifier's law",
        "",
        "Every draft, coin and recovered token enumerated (blocks of m drafts, the rows the same at every position "
        "for the toy pair, position-dependent for the random ones): 0 for a lossless rule.",
        "",
        "| case | m | " + " | ".join(EXACT_RULES) + " |",
        "|---|---|" + "---|" * len(EXACT_RULES),
    ]
    for r in exact:
        lines.append(f"| {r['case']} | {r['m']} | " + " | ".join(f"{r['tv'][rule]:.4f}" for rule in EXACT_RULES) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=None, help="trace directory (default: the embedded trace)")
    parser.add_argument("--out", default=os.path.join(HERE, "..", "docs", "results"))
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--m", type=int, nargs="+", default=[4, 8, 20], help="drafted tokens per block")
    args = parser.parse_args(argv)
    trace = load_trace(args.trace)
    ms = tuple(args.m)
    _, rows, seconds = trace_part(trace, ms, args.bootstrap)
    exact = exact_part()
    errors = monte_carlo_errors(trace, ms)
    command = "python experiments/engine_rules.py" + (f" --trace {args.trace}" if args.trace else "")
    if list(ms) != [4, 8, 20]:
        command += " --m " + " ".join(map(str, ms))
    data = {"rows": rows, "exact": exact, "monte_carlo_errors": errors, "command": command}
    write_results(
        args.out,
        "engine_rules",
        markdown=markdown(rows, exact, errors, command, trace, seconds),
        data=data,
        png=figure_png(figure(rows, ms)),
    )
    print(markdown(rows, exact, errors, command, trace, seconds))


if __name__ == "__main__":
    main()
