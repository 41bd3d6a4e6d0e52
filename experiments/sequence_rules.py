"""Sequence-level verification and the engines' chain rules, on a trace and exactly on small
vocabularies: Traversal Verification (chains and trees), HSD as its authors' code runs it,
SGLang's chain kernel, vLLM's verification without draft probabilities, TLI, and the adaptive
verify length, against SpS, block verification and the optimum of each drafting scheme.

Usage:
    python experiments/sequence_rules.py [--trace DIR] [--out docs/results] [--bootstrap 1000]
        [--m 4 8 20] [--tree-paths 16]

1. Chains on the trace (default: the embedded one), sampled and greedy drafting: AL(m) with
   bootstrap 95% intervals over sequences, the gains over SpS and over block verification with
   paired intervals (the same resampled sequences), KL and TV per emitted token. Exact where the
   rule allows (SpS and the token rules; block verification and traversal for m <= 3), else Monte
   Carlo over 1,024 seeded drafted blocks per start (HSD, block for m > 3).
2. Trees on the trace: Traversal Verification against token-level recursive rejection sampling
   without replacement on the same full trees of width k and depth m (each node's k children
   drawn without replacement; ``--tree-paths`` seeded trees per root, each with both rules' exact
   laws given the tree), the gain with a paired bootstrap interval over sequences, and the
   per-position acceptance of both as a fraction of the optimum for drafts without replacement.
3. Exactly, on small vocabularies: the total variation between the law of the first 4 tokens a
   rule emits and the verifier's (every draft, coin and token enumerated).
4. The adaptive verify length against fixed m under the default measured GPU profile
   (``plan --draft-policy adaptive-verify``).

Writes sequence_rules.md / .json / .png into --out.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from cactus_theory import SamplingSettings, analyze_trace, load_trace, predict_speedup
from cactus_theory.compare import rule_colours
from cactus_theory.io import machine_description, write_results
from cactus_theory.plan import DEFAULT_COST_PROFILE, cost_profiles, load_cost
from cactus_theory.rules import full_tree, sample_tree, token_level_tree, traverse
from cactus_theory.studies import figure_png
from cactus_theory.testing import sequence_tv_rows

HERE = os.path.dirname(os.path.abspath(__file__))
CHAIN_RULES = ("sps", "block", "traversal", "hsd", "sglang-chain", "strict", "tli")
GREEDY_RULES = ("sps", "block", "traversal", "hsd", "strict")
EXACT_RULES = ("block", "traversal", "hsd", "magic-mtp")
TREES = ((2, 2), (3, 2), (4, 2), (2, 3), (3, 3))
#: What the papers report for the same comparison (their models, trees and tasks, not ours).
PAPER_GAINS = (
    (
        "traversal (trees) over token-level tree verification",
        "+2.2% to +5.7% AL",
        "Weng et al., NeurIPS 2025 (arXiv 2505.12398): their models, tree shapes and tasks",
    ),
    (
        "HSD over token-wise, one sampled chain",
        "+3.3% to +5.4% tokens per step",
        "the authors' README: Qwen2.5-0.5B drafting for 14B / 32B / 72B, GSM8K, temperature 1",
    ),
    (
        "block verification over token-wise, one chain",
        "+1.4% to +2.3% tokens per step",
        "the same README's blockwise row",
    ),
    (
        "HSD in EAGLE-3 (EAGLE-3H) over EAGLE-3",
        "+12.1% tokens per step",
        "the README: EAGLE-3-LLaMA3.1-8B, its token-level tree verification replaced by HSD over the tree's paths",
    ),
)


def chain_part(trace, ms, n_boot, draft_mode):
    rules = CHAIN_RULES if draft_mode == "sampled" else GREEDY_RULES
    result = analyze_trace(trace, list(rules), ms=ms, n_boot=n_boot, progress=False, draft_mode=draft_mode)
    rows = []
    for r in result.rows:
        if r["task"] != "all":
            continue
        row = {k: r[k] for k in ("rule", "m", "al", "al_lo", "al_hi", "kl_per_token", "tv_per_token")}
        row["draft_mode"] = draft_mode
        for base in ("sps", "block"):
            if r["rule"] != base:
                gain = result.al_ratio(r["rule"], base, r["m"], n_boot=n_boot)
                row.update({f"gain_{base}": gain[0], f"gain_{base}_lo": gain[1], f"gain_{base}_hi": gain[2]})
        rows.append(row)
    return rows


def tree_part(trace, n_paths, n_boot, seed=0):
    """Per (k, m): the traversal's and token-level verification's tree AL on the same trees, the
    paired gain with a bootstrap interval over sequences, and the per-position acceptance as a
    fraction of the optimum for drafts without replacement."""
    settings = SamplingSettings(**trace.metadata["sampling"])
    sequences = []
    for seq in trace:
        if seq.n_positions == 0:
            continue
        p, q = seq.distributions(settings)
        p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
        sequences.append((p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)))
    ks = sorted({k for k, _ in TREES})
    acceptance = analyze_trace(
        trace, [f"rrs(k={k}, replacement=false)" for k in ks], ms=(1,), n_boot=n_boot, progress=False
    )
    of_optimum = {r["rule"]: r["acceptance_of_optimum"] for r in acceptance.rows if r["task"] == "all"}
    rng = np.random.default_rng(seed)
    rows = []
    for k, m in TREES:
        tree = full_tree(k, m)
        depth = tree[1].astype(np.float64)
        sums = np.zeros((len(sequences), 3))  # per sequence: starts, traversal AL sum, token-level AL sum
        for i, (p, q) in enumerate(sequences):
            starts = p.shape[0] - m + 1
            if starts < 1:
                continue
            index = np.minimum(np.arange(starts)[:, None] + np.arange(m + 1)[None, :], p.shape[0] - 1)
            draft = np.repeat(p[index[:, :m]], n_paths, axis=0)
            target = np.repeat(q[index], n_paths, axis=0)
            tokens = sample_tree(rng, tree, draft)
            ours = traverse(tree, tokens, draft, target) @ depth
            theirs = token_level_tree(tree, tokens, draft, target) @ depth
            sums[i] = (starts, ours.sum() / n_paths, theirs.sum() / n_paths)
        keep = sums[:, 0] > 0
        sums = sums[keep]
        al_t, al_r = sums[:, 1].sum() / sums[:, 0].sum(), sums[:, 2].sum() / sums[:, 0].sum()
        boot = np.random.default_rng(seed + 1).integers(0, len(sums), size=(n_boot, len(sums)))
        ratio = sums[boot, 1].sum(1) / sums[boot, 2].sum(1)
        rows.append(
            {
                "k": k,
                "m": m,
                "nodes": int(tree[0].size - 1),
                "traversal_al": al_t,
                "token_level_al": al_r,
                "gain": al_t / al_r - 1,
                "gain_lo": float(np.quantile(ratio, 0.025)) - 1,
                "gain_hi": float(np.quantile(ratio, 0.975)) - 1,
                "acceptance_of_optimum": of_optimum[f"rrs(k={k}, replacement=false)"],
            }
        )
    return rows


def exact_part(length=4):
    return sequence_tv_rows(EXACT_RULES, length=length)


def adaptive_part(trace, ms, n_boot):
    """Per-step speedups of SpS and Cactus(delta=1) at fixed m and with the adaptive verify length,
    under the shipped measured GPU profile (the planner's default)."""
    cost = load_cost(cost_profiles()[DEFAULT_COST_PROFILE])
    result = analyze_trace(
        trace,
        ["sps", "cactus(delta=1)"],
        ms=ms,
        n_boot=n_boot,
        progress=False,
        draft_policies=["adaptive-verify"],
        cost=cost,
    )
    plan = predict_speedup(result, cost)
    rows = []
    for r in plan.rows:
        if r["task"] != "all":
            continue
        rows.append(
            {k: r.get(k) for k in ("rule", "m", "draft_policy", "al", "drafted", "speedup", "speedup_lo", "speedup_hi")}
        )
    return rows, DEFAULT_COST_PROFILE


def figure(chain_rows, tree_rows, ms):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    sampled = [r for r in chain_rows if r["draft_mode"] == "sampled" and r["rule"] != "sps"]
    rules = list(dict.fromkeys(r["rule"] for r in sampled))
    colours = rule_colours(rules)
    places = {m: i for i, m in enumerate(sorted(set(ms)))}
    for j, rule in enumerate(rules):
        mine = sorted((r for r in sampled if r["rule"] == rule), key=lambda r: r["m"])
        x = [places[r["m"]] + 0.08 * (j - (len(rules) - 1) / 2) for r in mine]
        y = [100 * r["gain_sps"] for r in mine]
        err = [
            [100 * (r["gain_sps"] - r["gain_sps_lo"]) for r in mine],
            [100 * (r["gain_sps_hi"] - r["gain_sps"]) for r in mine],
        ]
        axes[0].errorbar(x, y, yerr=err, color=colours[rule], marker="o", ms=4, capsize=2, lw=1, label=rule)
    axes[0].axhline(0, color="grey", lw=0.8)
    axes[0].set_xticks(list(places.values()), [f"m = {m}" for m in places])
    axes[0].set_ylabel("AL gain over SpS, % (paired 95% intervals)")
    axes[0].set_title("chains, sampled drafts", fontsize=9)
    axes[0].legend(fontsize=8)
    labels = [f"k={r['k']}, m={r['m']}" for r in tree_rows]
    y = [100 * r["gain"] for r in tree_rows]
    err = [[100 * (r["gain"] - r["gain_lo"]) for r in tree_rows], [100 * (r["gain_hi"] - r["gain"]) for r in tree_rows]]
    axes[1].errorbar(
        range(len(tree_rows)),
        y,
        yerr=err,
        color=colours.get("traversal", "C0"),
        marker="o",
        ms=4,
        capsize=2,
        lw=0,
        elinewidth=1,
        label="traversal-tree over rrs without replacement",
    )
    axes[1].axhline(0, color="grey", lw=0.8)
    axes[1].set_xticks(range(len(tree_rows)), labels, fontsize=8)
    axes[1].set_ylabel("tree AL gain, % (paired 95% intervals)")
    axes[1].set_title("full trees drafted without replacement", fontsize=9)
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _interval(value, lo, hi):
    return f"{100 * value:+.1f}% [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def markdown(data, trace, seconds):
    lines = [
        "# Sequence-level verification and the engines' chain rules",
        "",
        f"Command: `{data['command']}` ({machine_description()}; {seconds:.0f} s). Trace: "
        f"{os.path.basename(os.path.normpath(trace.directory))} ({len(trace)} sequences, {trace.n_positions} "
        "positions).",
        "",
        "## Chains",
        "",
        "AL(m) with bootstrap 95% intervals over sequences; gains = AL / AL(base) - 1 with paired intervals; KL and "
        "TV per emitted token. Exact for the token rules and for block / traversal at m <= 3; Monte Carlo over 1,024 "
        "seeded drafted blocks per start for HSD and for block / traversal at m > 3 (the Monte Carlo noise is inside "
        "the intervals).",
        "",
        "| drafting | rule | m | AL | over sps | over block | KL/token | TV/token |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["chains"]:
        over = [
            _interval(r[f"gain_{b}"], r[f"gain_{b}_lo"], r[f"gain_{b}_hi"]) if f"gain_{b}" in r else ""
            for b in ("sps", "block")
        ]
        lines.append(
            f"| {r['draft_mode']} | {r['rule']} | {r['m']} | {r['al']:.3f} [{r['al_lo']:.3f}, "
            f"{r['al_hi']:.3f}] | {over[0]} | {over[1]} | {r['kl_per_token']:.4f} | "
            f"{r['tv_per_token']:.4f} |"
        )
    lines += [
        "",
        "## Trees",
        "",
        f"Full trees of width k and depth m (k + ... + k^m drafted nodes), each node's children drawn without "
        f"replacement; {data['tree_paths']} seeded trees per root, each judged by both rules exactly. Gain = "
        "traversal's tree AL over token-level recursive rejection sampling without replacement on the same trees, "
        "with a paired bootstrap interval over sequences. The per-position acceptance (a tree of depth 1) is the same "
        "for both and is given as a fraction of the optimum for k drafts without replacement.",
        "",
        "| k | m | nodes | traversal tree AL | token-level tree AL | gain | per-position acceptance / optimum |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["trees"]:
        gain = _interval(r["gain"], r["gain_lo"], r["gain_hi"])
        lines.append(
            f"| {r['k']} | {r['m']} | {r['nodes']} | {r['traversal_al']:.3f} | {r['token_level_al']:.3f} | "
            f"{gain} | {r['acceptance_of_optimum']:.3f} |"
        )
    lines += [
        "",
        "## The papers' gains beside these",
        "",
        "| comparison | reported | where |",
        "|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in PAPER_GAINS]
    lines += [
        "",
        f"## Exact total variation of the first {data['exact'][0]['length']} tokens from the verifier's law",
        "",
        "Every draft, coin and token enumerated (blocks of m drafts): 0 for a lossless rule.",
        "",
        "| case | m | " + " | ".join(EXACT_RULES) + " |",
        "|---|---|" + "---|" * len(EXACT_RULES),
    ]
    for r in data["exact"]:
        lines.append(f"| {r['case']} | {r['m']} | " + " | ".join(f"{r['tv'][rule]:.4f}" for rule in EXACT_RULES) + " |")
    lines += [
        "",
        f"## The adaptive verify length (per step, profile {data['profile']})",
        "",
        "| rule | m | policy | AL | drafts verified | speedup [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["adaptive"]:
        verified = r["m"] if r.get("drafted") is None else r["drafted"]
        speedup = f"{r['speedup']:.3f}x [{r['speedup_lo']:.3f}, {r['speedup_hi']:.3f}]"
        lines.append(
            f"| {r['rule']} | {r['m']} | {r.get('draft_policy') or 'fixed'} | {r['al']:.3f} | "
            f"{verified:.2f} | {speedup} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=None, help="trace directory (default: the embedded trace)")
    parser.add_argument("--out", default=os.path.join(HERE, "..", "docs", "results"))
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--m", type=int, nargs="+", default=[4, 8, 20], help="drafted tokens per block")
    parser.add_argument("--tree-paths", type=int, default=16, help="drafted trees per root for the tree comparison")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    trace = load_trace(args.trace)
    ms = tuple(args.m)
    chains = chain_part(trace, ms, args.bootstrap, "sampled") + chain_part(trace, ms, args.bootstrap, "greedy")
    trees = tree_part(trace, args.tree_paths, args.bootstrap)
    adaptive, profile = adaptive_part(trace, ms, args.bootstrap)
    command = "python experiments/sequence_rules.py" + (f" --trace {args.trace}" if args.trace else "")
    if list(ms) != [4, 8, 20]:
        command += " --m " + " ".join(map(str, ms))
    if args.tree_paths != 16:
        command += f" --tree-paths {args.tree_paths}"
    data = {
        "chains": chains,
        "trees": trees,
        "exact": exact_part(),
        "adaptive": adaptive,
        "profile": profile,
        "tree_paths": args.tree_paths,
        "command": command,
        "paper_gains": PAPER_GAINS,
    }
    seconds = time.perf_counter() - start
    text = markdown(data, trace, seconds)
    write_results(args.out, "sequence_rules", markdown=text, data=data, png=figure_png(figure(chains, trees, ms)))
    print(text)


if __name__ == "__main__":
    main()
