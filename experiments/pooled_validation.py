"""The pooled long-answer estimator checked where the truth is known, offline in about a minute.

Usage:
    python experiments/pooled_validation.py [--worlds 400] [--sizes 20,50,100,200] [--out docs/results]

1. Synthetic worlds (``AnswerWorld``): 60 Markov problems a world (3 tokens, answers of 4, each problem its own
   drafter, verifier and grader), every answer enumerable, so each rule's exact accuracy is known. N problems drawn
   with replacement, answered once by the verifier alone, SpS and Cactus δ = 1 at m = 2; every rule estimated from
   that pool (``pooled_accuracy``), decoded (SpS, Cactus δ = 1) or only rescored (Cactus δ = 4, the lossy rule,
   TAS). Per rule and N: how often the 95% interval of its difference from the verifier alone covers the exact one
   (over ``--worlds`` seeded worlds), the estimate's bias (mean error, with its standard error) and the effective
   answers a problem.
2. The exact referee's records (``docs/results/deployment_records.jsonl.gz``: 5,269 multiple-choice problems,
   each model's answer rows): one answer token a problem drawn from the verifier alone's, SpS's and Cactus δ = 1's
   exact laws, and every rule estimated from that pool against the exact referee on the same problems
   (``pooled_on_choice_records``).

Writes OUT/pooled_validation.md and OUT/pooled_validation.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from common import RESULTS, count, counts

from cactus_theory.io import machine_description, write_results
from cactus_theory.laws import AnswerWorld
from cactus_theory.quality import pooled_accuracy, pooled_on_choice_records

DECODED = {"verifier alone": None, "sps": "sps", "cactus(delta=1)": "cactus(delta=1)"}
ASKED = {"cactus(delta=4)": "cactus(delta=4)", "lossy(alpha=0.5)": "lossy(alpha=0.5)", "tas": "tas"}
M = 2


def worlds(count_, sizes, n_boot):
    """Coverage, bias and effective answers per rule and N over ``count_`` seeded worlds."""
    out = []
    for size in sizes:
        hits, errors, ess = {}, {}, {}
        for seed in range(count_):
            world = AnswerWorld(60, vocab=3, length=4, seed=seed)
            truth = {label: world.accuracy(method, M).mean() for label, method in {**DECODED, **ASKED}.items()}
            rng = np.random.default_rng(1_000_000 + 1_000 * size + seed)
            chosen = rng.integers(0, world.problems, size)
            problem, by, grade, log_probs = world.pool(chosen, DECODED, ASKED, M, rng)
            for r in pooled_accuracy(problem, by, grade, log_probs, list(log_probs), n_boot=n_boot, seed=seed):
                want = truth[r.method] - truth["verifier alone"]
                hits.setdefault(r.method, []).append(r.difference_lo - 1e-12 <= want <= r.difference_hi + 1e-12)
                errors.setdefault(r.method, []).append(r.difference - want)
                ess.setdefault(r.method, []).append(r.ess_per_problem)
        for method in hits:
            if method == "verifier alone":
                continue
            err = np.asarray(errors[method])
            out.append(
                {
                    "method": method,
                    "decoded": method in DECODED,
                    "problems": size,
                    "worlds": count_,
                    "coverage": float(np.mean(hits[method])),
                    "bias": float(err.mean()),
                    "bias_se": float(err.std(ddof=1) / np.sqrt(err.size)),
                    "rmse": float(np.sqrt(np.mean(err**2))),
                    "ess_per_problem": float(np.mean(ess[method])),
                }
            )
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=count(10), default=400)
    parser.add_argument("--sizes", type=counts(5), default=[20, 50, 100, 200])
    parser.add_argument("--bootstrap", type=count(100), default=1000)
    parser.add_argument("--records", default=os.path.join(RESULTS, "deployment_records.jsonl.gz"))
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    synthetic = worlds(args.worlds, args.sizes, args.bootstrap)
    choice = pooled_on_choice_records(
        args.records,
        [k for k in DECODED if k != "verifier alone"],
        ["cactus(delta=4)", "lossy(alpha=0.5)", "tas", "relaxed-topk(top_n=10,delta=0.3)", "mars"],
        n_boot=2000,
    )
    seconds = time.perf_counter() - start
    command = f"python experiments/pooled_validation.py --worlds {args.worlds} --sizes {','.join(map(str, args.sizes))}"
    lines = [
        "# The pooled long-answer estimator where the truth is known",
        "",
        f"Command: `{command}` ({machine_description()}; {seconds:.0f} s, no model).",
        "",
        f"## Synthetic worlds: coverage of the 95% interval over {args.worlds} seeded worlds",
        "",
        "Each world: 60 Markov problems (3 tokens, answers of 4 tokens, each problem its own drafter, verifier and "
        "grader); N of them drawn with replacement, answered once by the verifier alone, SpS and Cactus δ = 1 at "
        "m = 2; each rule's difference from the verifier alone estimated from that pool and compared with the exact "
        "mean difference over the 60. Bias: mean error in points (± its standard error); effective answers a problem "
        "out of the 3 drawn.",
        "",
        "| rule | decoded | N | coverage | bias, points (± s.e.) | RMSE, points | effective answers / problem |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in synthetic:
        lines.append(
            f"| {r['method']} | {'yes' if r['decoded'] else 'no'} | {r['problems']} | {r['coverage']:.3f} | "
            f"{100 * r['bias']:+.2f} (± {100 * r['bias_se']:.2f}) | {100 * r['rmse']:.2f} | "
            f"{r['ess_per_problem']:.2f} |"
        )
    lines += [
        "",
        "A lossless rule's difference is exactly 0 here (its weights are the verifier alone's), so its coverage is "
        "1 by construction.",
        "",
        "## The exact referee's records: one sampled answer token a problem against the exact law",
        "",
        f"`{os.path.basename(args.records)}` (every problem's answer rows): one answer token a problem drawn from "
        "the verifier alone's, SpS's and Cactus δ = 1's exact laws at the answer position, graded by the correct "
        "letter; every rule estimated from that pool of three answers a problem against the exact referee's "
        "difference on the same problems.",
        "",
        "| rule | pooled: difference, points [95%] | effective answers / problem | exact referee: difference, "
        "points [95%] | exact inside the pooled interval |",
        "|---|---|---|---|---|",
    ]
    for r in choice["pooled"][1:]:
        e = choice["exact"][r.method]
        lines.append(
            f"| {r.method} | {100 * r.difference:+.2f} [{100 * r.difference_lo:+.2f}, {100 * r.difference_hi:+.2f}]"
            f" | {r.ess_per_problem:.2f} | {100 * e['difference']:+.2f} [{100 * e['low']:+.2f}, "
            f"{100 * e['high']:+.2f}] | {'yes' if choice['agree'][r.method] else 'no'} |"
        )
    data = {
        "command": command,
        "machine": machine_description(),
        "seconds": seconds,
        "synthetic": synthetic,
        "choice": {
            "pooled": [r.as_dict() for r in choice["pooled"]],
            "exact": choice["exact"],
            "agree": choice["agree"],
        },
    }
    for path in write_results(args.out, "pooled_validation", markdown="\n".join(lines) + "\n", data=data):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
