"""Benchmarks as ratios measured in one process (medians over repeats; never a lone absolute time).

Usage:
    python experiments/bench.py [--repeats 5] [--quick]

Prints a table of ratios:
- exact gamma (KL, chi2, Hellinger) on 1,000,000 (q, delta) pairs: vectorised `exact_gamma` vs a
  Python loop of `scipy.optimize.brentq` (timed on 10,000 pairs and scaled) vs the Taylor closed
  form on the same arrays, and the max relative difference from the scalar path;
- emitted distribution of a Cactus step: O(V log V) vs the O(V^2) brute force at V = 2,048, and at
  V = 151,936 vs one `np.sort` of V floats (brute force extrapolated as V^2);
- q(n)-only trace statistics (SpS / Cactus acceptance and AL over positions) vs one plain NumPy
  pass over the same arrays;
- the rules batched in torch vs NumPy on CPU (and cuda when present);
- peak memory (tracemalloc) of the V = 151,936 emitted-distribution step.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np
from scipy import optimize

from cactus_theory import Cactus, SpS, approx_gamma, binary_divergence, exact_gamma, expected_accepted_length
from cactus_theory._rules._base import emitted_bruteforce


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


SAMPLE = 10_000


def bench_gamma(repeats, n):
    rng = np.random.default_rng(0)
    q = rng.uniform(1e-6, 1 - 1e-6, n)
    delta = 10.0 ** rng.uniform(-4, 0.5, n)
    rows = []
    for name in ("kl", "chi2", "hellinger"):
        vec = median_time(lambda name=name: exact_gamma(q, delta, name), repeats)
        taylor = median_time(lambda name=name: approx_gamma(q, delta, name), repeats)
        sample = SAMPLE

        def loop(name=name, sample=SAMPLE):
            out = np.empty(sample)
            for i in range(sample):
                qi, di = q[i], delta[i]
                if float(binary_divergence(1.0, qi, name)) <= di:
                    out[i] = 1.0
                    continue
                out[i] = optimize.brentq(lambda g, qi=qi, di=di: float(binary_divergence(g, qi, name)) - di, qi, 1.0)
            return out

        loop_time = median_time(loop, 1) * n / sample
        err = np.max(
            np.abs(
                exact_gamma(q[:2000], delta[:2000], name) / exact_gamma(q[:2000], delta[:2000], name, method="brentq")
                - 1
            )
        )
        rows.append(
            (
                f"exact_gamma {name}, {n:,} pairs",
                f"{loop_time / vec:,.0f}x faster than a brentq loop",
                f"{vec / taylor:,.1f}x the Taylor closed form",
                f"max rel. diff vs scalar path {err:.1e}",
            )
        )
    return rows


def bench_emitted(repeats, big):
    rng = np.random.default_rng(1)
    rows = []
    v = 2048
    p, q = rng.dirichlet(np.full(v, 0.1)), rng.dirichlet(np.full(v, 0.1))
    fast = median_time(lambda: Cactus(1.0).emitted(p, q), repeats)
    small_v = 256  # the brute force is timed at a size it finishes, then scaled as V^2
    ps, qs = rng.dirichlet(np.full(small_v, 0.1)), rng.dirichlet(np.full(small_v, 0.1))
    brute_small = median_time(lambda: emitted_bruteforce(Cactus(1.0), ps, qs), 1)
    brute = brute_small * (v / small_v) ** 2
    rows.append((f"emitted Cactus V={v:,}", f"{brute / fast:,.0f}x faster than brute force (V^2-scaled)", "", ""))
    p, q = rng.dirichlet(np.full(big, 0.05)), rng.dirichlet(np.full(big, 0.05))
    fast_big = median_time(lambda: Cactus(1.0).emitted(p, q), repeats)
    sort = median_time(lambda: np.sort(p), repeats)
    brute_big = brute_small * (big / small_v) ** 2
    tracemalloc.start()
    Cactus(1.0).emitted(p, q)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rows.append(
        (
            f"emitted Cactus V={big:,}",
            f"{fast_big / sort:,.1f}x one np.sort",
            f"{brute_big / fast_big:,.0f}x faster than brute force (V^2-scaled)",
            f"peak {peak / 2**20:,.0f} MiB ({peak / (8 * big):,.0f} float64 rows)",
        )
    )
    return rows


def bench_trace_stats(repeats, positions):
    rng = np.random.default_rng(2)
    target_prob = rng.beta(0.5, 0.5, positions)
    draft_prob = rng.beta(0.5, 0.5, positions)

    def plain():  # one NumPy pass reading the same arrays
        return np.minimum(target_prob / draft_prob, 1.0).mean()

    def sps():
        a = np.minimum(target_prob / draft_prob, 1.0)
        return expected_accepted_length(a, 8).mean()

    def cactus():
        g = approx_gamma(target_prob, 1.0)
        a = np.minimum(g / draft_prob, 1.0)
        return expected_accepted_length(a, 8).mean()

    base = median_time(plain, repeats)
    return [
        (
            f"q(n)-only stats, {positions:,} positions",
            f"SpS AL(8) at {base / median_time(sps, repeats):.0%} of a plain NumPy pass",
            f"Cactus AL(8) at {base / median_time(cactus, repeats):.0%}",
            "",
        )
    ]


def bench_torch(repeats):
    import torch

    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(1024), size=256), rng.dirichlet(np.ones(1024), size=256)
    n = rng.integers(1024, size=256)
    rows = []
    for rule in (SpS(), Cactus(1.0)):
        t_np = median_time(lambda rule=rule: rule.correction(p, q, n), repeats)
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        for dev in devices:
            pt, qt, nt = (torch.as_tensor(x, device=dev) for x in (p, q, n))
            t_t = median_time(lambda rule=rule, pt=pt, qt=qt, nt=nt: rule.correction(pt, qt, nt), repeats)
            rows.append(
                (f"{rule.describe()} correction 256x1024", f"torch {dev} / NumPy time = {t_t / t_np:.2f}", "", "")
            )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    args = parser.parse_args(argv)
    n, big, positions = (20_000, 20_000, 100_000) if args.quick else (1_000_000, 151_936, 1_000_000)
    rows = bench_gamma(args.repeats, n) + bench_emitted(args.repeats, big) + bench_trace_stats(args.repeats, positions)
    rows += bench_torch(args.repeats)
    print("| what | ratio | ratio | note |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
