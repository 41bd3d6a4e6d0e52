"""The engine oracle on llama-server: does its speculative sampling emit the law its rule says?

Usage:
    python experiments/fetch_models.py                      # once: the Qwen2.5-Coder GGUF pair
    python scripts/build_llama_server.py                    # once: llama-server (cached)
    python experiments/conform_llama_server.py --data DATA [--contexts 20] [--samples 400] [--out docs/results]

Two llama-servers start on 127.0.0.1 (``local_llama_server``: stopped however this script ends): the
verifier (Qwen2.5-Coder-1.5B) with the drafter (0.5B) as its draft model (``--spec-type draft-simple``,
``--spec-draft-n-max --m``, ``--spec-draft-p-min 0``), and the drafter alone, whose rows are the draft's
law. Contexts: MT-Bench's first-turn questions (``--data``: mt_bench/question.jsonl), as chat prompts,
each kept where the oracle can test it (``cactus-theory conform``'s choice). Sampling: llama.cpp's
chain (top-k 20, top-p 0.95, min-p 0.05, temperature 0.6 last), the server's default samplers.

Then ``cactus-theory conform``: per context, the exact law of the first drafted token that the rule
llama-server claims implies (``sampler-match``: the draft accepted exactly when it is the verifier's own
sample, lossless: the verifier's processed law), ``--samples`` speculative samples with their seeds,
the G test with its Monte Carlo p-value, TV with its interval, the power (the TV detectable at 80%),
combined over contexts. The page ``conform_llama_server.md`` (and .json) in --out gives the command,
the time, N and contexts, the verdict, the power, and the per-context table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

# the planner's referee's pair, its arguments and its way to llama-server (a sibling script)
from common import Parser, count, pair_paths, scratch, writable_out
from referee_llama_server import pair_arguments, server_binary

from cactus_theory.io import machine_description, write_results
from cactus_theory.servers import local_llama_server
from cactus_theory.traces import benchmark_file, load_prompts

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLING = ["--temperature", "0.6", "--top-k", "20", "--top-p", "0.95", "--min-p", "0.05", "--chain", "llama.cpp"]


def main(argv=None) -> int:
    parser = Parser(description=__doc__)
    pair_arguments(parser)
    parser.add_argument("--contexts", type=count(1), default=20)
    parser.add_argument("--samples", type=count(1), default=400, help="speculative samples per context")
    parser.add_argument("--m", type=count(1), default=4, help="--spec-draft-n-max")
    parser.add_argument("--threads", type=count(1), default=os.cpu_count() or 2)
    parser.add_argument(
        "--ubatch",
        type=count(1),
        default=1,
        help="the servers' -ub: 1 evaluates every token alone, so a row is computed alike in a sample's verification "
        "batch and in the row asked for (llama.cpp's batched kernels round otherwise: the oracle's row_drift)",
    )
    parser.add_argument("--prompts", type=count(1), default=80, help="MT-Bench questions the contexts are chosen from")
    parser.add_argument("--records", default=None, help="the oracle's records (default: a temporary folder)")
    args = parser.parse_args(argv)  # every flag checked, before any server starts
    writable_out(parser, args.out)
    args.server_binary = server_binary(args.server_binary)
    verifier, draft = pair_paths(args.models)
    prompts = load_prompts(benchmark_file("mt_bench", args.data), dataset="mt_bench")[: args.prompts]
    with scratch("conform-") as work:  # prompts, records, report and the servers' log: removed however it ends
        return _run(args, parser, verifier, draft, prompts, work)


def _run(args, parser, verifier, draft, prompts, work) -> int:
    """The servers, the oracle through the command line, and the page, in the scratch directory ``work``."""
    prompt_file = os.path.join(work, "prompts.jsonl")
    with open(prompt_file, "w", encoding="utf-8") as fh:
        for p in prompts:
            fh.write(json.dumps({"id": p.id, "text": p.text}) + "\n")
    records = args.records or os.path.join(work, "records.jsonl")
    common = ["-c", "4096", "-np", "1", "-t", str(args.threads), "-tb", str(args.threads), "-ub", str(args.ubatch)]
    spec = ["-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", str(args.m)]
    spec += ["--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
    log = os.path.join(work, "servers.log")
    report = os.path.join(work, "report")
    started = time.perf_counter()
    sampling = 0.0
    with (
        local_llama_server(args.server_binary, verifier, *spec, *common, log=log) as spec_url,
        local_llama_server(args.server_binary, draft, *common, log=log) as draft_url,
    ):
        argv_ = [
            sys.executable,
            "-m",
            "cactus_theory",
            "conform",
            "--server",
            spec_url,
            "--draft-server",
            draft_url,
            "--prompts",
            prompt_file,
        ]
        argv_ += ["--contexts", str(args.contexts), "--samples", str(args.samples), *SAMPLING]
        argv_ += ["--out", records, "--report", report, "--quiet"]
        t0 = time.perf_counter()
        code = subprocess.run(argv_, check=False).returncode  # 0: no departure found, 1: a departure, 2: bad input
        if code not in (0, 1):
            raise SystemExit(f"cactus-theory conform failed with exit code {code} (the servers' log above)")
        sampling = time.perf_counter() - t0
    seconds = time.perf_counter() - started
    with open(os.path.join(report, "conform.json"), encoding="utf-8") as fh:
        result = json.load(fh)
    with open(os.path.join(report, "conform.md"), encoding="utf-8") as fh:
        table = fh.read().split("\n", 1)[1].strip()  # its own title dropped: this page has one
    overall = result.get("overall", {})
    command = (
        f"python experiments/conform_llama_server.py --data DATA --contexts {args.contexts} --samples {args.samples}"
        f" --m {args.m} --ubatch {args.ubatch}"
    )
    rows = result.get("rows", [])
    samples_taken = sum(r["kept"] + r["set_aside"] for r in rows)
    with open(records, encoding="utf-8") as fh:  # the oracle's records: each context's row drift
        drifts = [json.loads(line).get("row_drift", float("nan")) for line in fh if '"context"' in line]
    max_drift = max(drifts, default=float("nan"))
    n_for_005 = float(np.median([r["n_for_002"] for r in rows])) * (0.02 / 0.05) ** 2 if rows else float("nan")
    lines = [
        "# Does llama-server's speculative sampling emit its rule's law?",
        "",
        f"Command: `{command}` ({machine_description()}; {seconds / 60:.1f} minutes, the servers' start "
        "included). Qwen2.5-Coder-1.5B-Instruct verifying with 0.5B drafting (Q4_K_M) in llama-server, "
        f"`--spec-type draft-simple --spec-draft-n-max {args.m}`, `-ub {args.ubatch}`; llama.cpp's sampler chain "
        "(top-k 20, top-p 0.95, min-p 0.05, temperature 0.6 last). Contexts: MT-Bench's first-turn questions as "
        "chat prompts, "
        f"{len(rows)} kept (`cactus-theory conform` keeps a context whose tested token is not nearly certain); "
        f"{args.samples} speculative samples each, the first generated token tested (the first block's first "
        "draft decides it).",
        "",
        f"**Verdict**: combined p-value {overall.get('p_value', float('nan')):.3g} at level "
        f"{result.get('alpha', 0.01):g}: "
        + (
            "no evidence that llama-server's speculative sampling departs from the verifier's law (its rule, "
            "sampler-match verification, is lossless)"
            if overall.get("p_value", 0) > result.get("alpha", 0.01)
            else "llama-server's speculative sampling departs from the law its rule implies"
        )
        + f"; the test detects a TV of {overall.get('median_detectable_tv', float('nan')):.3f} per context with "
        "80% power (median over contexts).",
        "",
        table,
        "",
        f"**Time and power.** {samples_taken:,} speculative samples in {sampling / 60:.1f} minutes "
        f"({sampling / max(samples_taken, 1):.2f} s a sample, the contexts' choice and their rows included: a "
        "request re-reads the prompt's last token, samples the first token, drafts and verifies the second). A total "
        f"variation of 0.05 per context needs about {n_for_005:,.0f} samples a context (the median over contexts; "
        "the N for 0.02 scaled by (0.02 / 0.05)^2), "
        f"{n_for_005 * len(rows) * sampling / max(samples_taken, 1) / 60:,.0f} minutes for these {len(rows)} "
        "contexts at this rate: the goal of that power in 15 minutes on two cores is not reached with a 1.5B "
        "verifier on a CPU; the run above states the power it had.",
        "",
        f"**Rows computed alike.** `-ub {args.ubatch}`: "
        + (
            "every token evaluated alone, so the row the oracle asks for is computed as the row a sample is drawn "
            "from; the largest difference between a context's rows asked before and after its samples (row_drift) "
            f"is {max_drift:.3g}. With llama-server's default micro-batch the same rows differed by a total "
            "variation of up to 0.085 on these contexts (a 3-context run of this script with --ubatch 512): "
            "llama.cpp's batched kernels round a row differently from its one-token path, a floor the oracle flags "
            "(its verdict not to be trusted) rather than reads as a departure of the algorithm."
            if args.ubatch == 1
            else f"the largest row_drift is {max_drift:.3g} (see --ubatch)."
        ),
    ]
    data = {"command": command, "machine": machine_description(), "seconds": seconds, **result}
    for path in write_results(args.out, "conform_llama_server", markdown="\n".join(lines) + "\n", data=data):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
