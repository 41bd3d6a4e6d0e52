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

from cactus_theory import (
    Cactus,
    SamplingSettings,
    SpS,
    approx_gamma,
    binary_divergence,
    exact_gamma,
    expected_accepted_length,
    get_divergence,
    load_trace,
    parse_rules,
)
from cactus_theory._analysis import _shard_stats
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
        _, info = exact_gamma(q, delta, name, full_output=True)
        div = get_divergence(name)
        inc = approx_gamma(q, delta, name) - q
        one_b = median_time(lambda div=div, inc=inc: div.binary_increment(inc, q), repeats)
        rows.append(
            (
                f"exact_gamma {name}, {n:,} pairs",
                f"{loop_time / vec:,.0f}x faster than a brentq loop",
                f"{vec / taylor:,.1f}x the Taylor closed form",
                f"max rel. diff vs scalar path {err:.1e}; {info.method}: {info.iterations.mean():.2f} iterations "
                f"per pair; one B_f evaluation = {one_b / taylor:.1f}x the Taylor form",
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


def trace_token_probs():
    """q(n) and p(n) of the token the verifier sampled, at every position of the embedded trace."""
    trace = load_trace()
    settings = trace.metadata["sampling"]
    q_n, p_n = [], []
    for seq in trace:
        draft_probs, target_probs = seq.distributions(SamplingSettings(**settings))
        # the support's columns are the target's stored ids, then the draft's: the sampled token
        # (inside the verifier's top-20) is found among the target's
        col = np.argmax(seq.topk_ids["target"] == seq.tokens[:, None], axis=-1)
        rows = np.arange(target_probs.shape[0])
        q_n.append(target_probs[rows, col])
        p_n.append(draft_probs[rows, col])
    return np.concatenate(q_n), np.concatenate(p_n), trace


def bench_trace_stats(repeats, positions):
    q_n, p_n, trace = trace_token_probs()
    reps = -(-positions // q_n.size)
    target_prob = np.tile(q_n, reps)[:positions]
    draft_prob = np.maximum(np.tile(p_n, reps)[:positions], 1e-300)

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
    rows = [
        (
            f"q(n)-only stats, {positions:,} positions (the embedded trace's q(n), p(n), tiled)",
            f"SpS acceptance + AL(8) at {base / median_time(sps, repeats):.0%} of a plain NumPy pass",
            f"Cactus at {base / median_time(cactus, repeats):.0%}",
            "",
        )
    ]
    shard = trace.shard(0)
    n_pos = sum(seq.n_positions for seq in shard)
    rules = parse_rules("sps,cactus,cactus-exact,mentored", (1.0,))
    settings = SamplingSettings(**trace.metadata["sampling"])
    tracemalloc.start()
    _shard_stats((trace.directory, 0, rules, (8,), settings, "verifier"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rows.append(
        (
            f"analyse one trace shard ({len(shard)} sequences, {n_pos:,} positions), 4 rules",
            f"peak {peak / 2**20:,.0f} MiB",
            "",
            "tracemalloc (NumPy allocations)",
        )
    )
    return rows


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
