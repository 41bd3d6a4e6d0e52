"""Benchmarks as ratios against fair baselines measured in the same process (medians over repeats).

Usage:
    python experiments/bench.py [--repeats 5] [--quick] [--cuda-only] [--sandbox-only]

Every ratio divides our time by the time of what a user or a serving engine would write, run on
the same arrays in the same process:

- rules: SpS and Cactus acceptance + correction at 256 x 151,936 (torch CPU float32, NumPy
  float64; cuda float32 and bfloat16 when a GPU is present) against the plain formula written
  directly in torch / NumPy without checks (gather p(n), q(n); min(1, ratio); residual
  max(h - p, 0) normalised), ours with validation on and off;
- exact gamma (KL) on 10^6 pairs, q in (1e-6, 1 - 1e-6) uniform, delta in (1e-4, 10) log-uniform,
  against the Taylor closed form as a user writes it in NumPy (``np.minimum(q + np.sqrt(2 * d *
  q * (1 - q)), 1)``, no checks) and against the loop a user writes for the exact value:
  scipy.optimize.brentq on a math.log expression with xtol = 1e-14 (timed on 20,000 pairs,
  scaled); numba's first-call compile time (fresh cache) and cached load time;
- trace statistics: SpS / Cactus acceptance and AL(8) for every block start from q(n), p(n)
  against one plain NumPy pass over the same arrays (the embedded trace's values, tiled);
- the emitted distribution of Cactus at V = 151,936 against one np.sort (and np.argsort) of V
  floats, and batched over 7,577 rows of 100 tokens;
- the sampling step (temperature, top-k, top-p) on 1 and 9 rows of 151,936 logits in torch
  against the sort-based processing an engine writes (vLLM's ``apply_top_k_top_p``);
- a HumanEval-sized program graded isolated by the operating system (``run_sandboxed``) against a
  bare ``subprocess.run([python, "-c", program])``, what a harness without isolation runs;
- analysis throughput: positions per second per core for the default rule set on the embedded
  trace, against only reading and processing the shards, with 1 and 2 processes, and where the
  time goes (reading, rules, bootstrap).

The machine's load while it ran (the share of the cores other processes kept busy, from
/proc/stat and this process's own CPU time) is printed with the table, and a last table puts
each target beside what was measured.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from scipy import optimize

from cactus_theory import Cactus, SamplingSettings, SpS, analyze_trace, approx_gamma, exact_gamma, load_trace
from cactus_theory.kernels import HAVE_NUMBA, windowed_accepted_length_of_ratio
from cactus_theory.traces import TraceSequence, parse_rules

ROWS, VOCAB = 256, 151_936
#: What each row measured against its target (filled by the benchmarks that have one).
TARGETS = {}
#: {key: (the target in words, the limit, whether higher is better)}.
TARGET_LIMITS = {
    "gamma": ("exact KL gamma <= 10x the plain NumPy Taylor expression", 10.0, False),
    "emitted": ("emitted Cactus <= 5x one np.sort at V = 151,936", 5.0, False),
    "rules numpy": ("validated NumPy rules <= 1.2x the plain formula", 1.2, False),
    "unvalidated rules cuda": ("CUDA rules with validate=False <= 1.1x the plain formula", 1.1, False),
    "rules cuda": ("validated CUDA rules <= 1.3x the plain formula", 1.3, False),
    "fused rules cuda": ("CUDA rules fused by torch.compile (FusedRule) <= 1.1x the plain formula", 1.1, False),
    "analysis": ("analysis >= 50% of reading speed (1 process, 1,000 resamples)", 0.5, True),
}


def machine_sample():
    """(wall seconds, CPU seconds busy on the machine, CPU seconds of this process), from /proc; None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            cpu = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    busy = sum(cpu[:8]) - cpu[3] - (cpu[4] if len(cpu) > 4 else 0)
    own = os.times()
    return time.perf_counter(), busy / tick, own.user + own.system + own.children_user + own.children_system


def other_load(start, end):
    """The share of the cores other processes kept busy between two samples."""
    if start is None or end is None or end[0] <= start[0]:
        return None
    other = (end[1] - start[1]) - (end[2] - start[2])
    return max(other, 0.0) / ((end[0] - start[0]) * (os.cpu_count() or 1))


def median_time(fn, repeats):
    fn()  # warm-up: first-touch page faults, lazy imports, compiled kernels
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def paired_times(baseline, ours, repeats):
    """Median times of ``baseline`` and ``ours`` run alternately, and the median of the ratios
    of adjacent runs: load that changes during the benchmark (a shared machine) moves both
    sides of each ratio alike."""
    baseline()
    ours()
    base, mine, ratios = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        baseline()
        base.append(time.perf_counter() - start)
        start = time.perf_counter()
        ours()
        mine.append(time.perf_counter() - start)
        ratios.append(mine[-1] / base[-1])
    return statistics.median(base), statistics.median(mine), statistics.median(ratios)


# --- rules ---------------------------------------------------------------------------------------


def plain_torch(rule, delta=1.0):
    """The plain formula as a serving engine writes it in torch (MANGA-UOFA/Cactus style), no checks."""
    import torch

    def run(p, q, n):
        pn, qn = p.gather(-1, n[:, None])[:, 0], q.gather(-1, n[:, None])[:, 0]
        if rule == "sps":
            a = torch.clamp(qn / pn, max=1.0)
            r = torch.clamp(q - p, min=0.0)
        else:
            g = torch.clamp(qn + torch.sqrt(2 * delta * qn * (1 - qn)), max=1.0)
            a = torch.clamp(g / pn, max=1.0)
            h = q * ((1 - g) / (1 - qn))[:, None]
            h.scatter_(-1, n[:, None], g[:, None])
            r = torch.clamp(h - p, min=0.0)
        return a, r / r.sum(-1, keepdim=True)

    return run


def plain_numpy(rule, delta=1.0):
    def run(p, q, n):
        pn = np.take_along_axis(p, n[:, None], -1)[:, 0]
        qn = np.take_along_axis(q, n[:, None], -1)[:, 0]
        if rule == "sps":
            a = np.minimum(qn / pn, 1.0)
            r = np.maximum(q - p, 0.0)
        else:
            g = np.minimum(qn + np.sqrt(2 * delta * qn * (1 - qn)), 1.0)
            a = np.minimum(g / pn, 1.0)
            h = q * ((1 - g) / (1 - qn))[:, None]
            np.put_along_axis(h, n[:, None], g[:, None], -1)
            r = np.maximum(h - p, 0.0)
        r /= r.sum(-1, keepdims=True)
        return a, r

    return run


def rule_inputs(device="cpu", dtype="float32", rows=ROWS, vocab=VOCAB):
    import torch

    gen = torch.Generator().manual_seed(0)
    zq = torch.randn(rows, vocab, generator=gen) * 3
    zp = zq + torch.randn(rows, vocab, generator=gen)
    p, q = torch.softmax(zp, -1), torch.softmax(zq, -1)
    n = torch.multinomial(p, 1, generator=gen)[:, 0]
    if dtype == "numpy":
        p64, q64 = p.double().numpy(), q.double().numpy()
        return p64 / p64.sum(-1, keepdims=True), q64 / q64.sum(-1, keepdims=True), n.numpy()
    tdtype = getattr(torch, dtype)
    return p.to(device=device, dtype=tdtype), q.to(device=device, dtype=tdtype), n.to(device)


def bench_rules(repeats, devices=(("cpu", "float32"), ("numpy", "float64")), rows=ROWS, vocab=VOCAB, fused=False):
    """One row per rule and device: ours (validated, and not) against the plain formula; ``fused``: also the
    rule compiled (``FusedRule``, torch devices; its compile is the first, untimed call)."""
    out = []
    for device, dtype in devices:
        if device == "numpy":
            p, q, n = rule_inputs(dtype="numpy", rows=rows, vocab=vocab)
            label = "NumPy float64"
        else:
            p, q, n = rule_inputs(device, dtype, rows, vocab)
            label = f"torch {device} {dtype}"
        out += [
            _rule_row(name, rule, p, q, n, device, label, repeats, rows, vocab, fused and device != "numpy")
            for name, rule in RULES
        ]
    return out


RULES = (("sps", SpS()), ("cactus", Cactus(1.0)))


def _rule_row(name, rule, p, q, n, device, label, repeats, rows, vocab, fused=False):
    sync = _sync(device)
    plain = (plain_numpy if device == "numpy" else plain_torch)(name)
    base = median_time(lambda: sync(plain(p, q, n)), repeats)
    ours = median_time(lambda: sync(rule.acceptance_and_correction(p, q, n)), repeats)
    fast = median_time(lambda: sync(rule.acceptance_and_correction(p, q, n, validate=False)), repeats)
    two = median_time(lambda: sync((rule.acceptance(p, q, n), rule.correction(p, q, n))), repeats)
    note = ""
    if fused:
        from cactus_theory.rules import FusedRule

        compiled = FusedRule(rule)
        sync(compiled.acceptance_and_correction(p, q, n))  # the compile
        fuse = median_time(lambda: sync(compiled.acceptance_and_correction(p, q, n)), repeats)
        note = f"; fused (torch.compile) {fuse / base:.2f}x"
        if device == "cuda":
            TARGETS[f"fused rules cuda {dtype_of(p)} {name}"] = fuse / base
    if device == "cuda":
        TARGETS[f"rules cuda {dtype_of(p)} {name}"] = ours / base
        TARGETS[f"unvalidated rules cuda {dtype_of(p)} {name}"] = fast / base
    if device == "numpy":
        TARGETS[f"rules numpy {name}"] = ours / base
    return (
        f"{rule.describe()} acceptance + correction, {rows} x {vocab:,}, {label}",
        f"{ours / base:.2f}x the plain formula (validated)",
        f"{fast / base:.2f}x with validate=False",
        f"plain {base * 1e3:.2f} ms; as two calls (each validated) {two / base:.2f}x{note}",
    )


def dtype_of(x):
    return str(x.dtype).replace("torch.", "")


def _sync(device):
    if device == "cuda":
        import torch

        def sync(result):
            torch.cuda.synchronize()
            return result

        return sync
    return lambda result: result


# --- exact gamma ---------------------------------------------------------------------------------


def user_brentq_loop(q, delta):
    """What a user writes: scipy's brentq on the KL expression, math.log, xtol = 1e-14."""
    out = np.empty(q.size)
    for i in range(q.size):
        qi, di = float(q[i]), float(delta[i])
        if -math.log(qi) <= di:
            out[i] = 1.0
            continue

        def f(g, qi=qi, di=di):
            if g >= 1.0:
                return -math.log(qi) - di
            return g * math.log(g / qi) + (1 - g) * math.log((1 - g) / (1 - qi)) - di

        out[i] = optimize.brentq(f, qi, 1.0, xtol=1e-14)
    return out


def compile_times():
    """numba's first-call compile time with an empty cache, then the load time from the cache."""
    if not HAVE_NUMBA:
        return "numba not installed"
    code = (
        "import time, numpy as np; t = time.perf_counter(); "
        "from cactus_theory.kernels import exact_kl_gamma, windowed_accepted_length; "
        "exact_kl_gamma(np.array([0.3]), np.array([1.0])); windowed_accepted_length(np.ones((1, 9)), 8); "
        "print(time.perf_counter() - t)"
    )
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        first = float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)
        second = float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)
    return f"numba kernels: first call {first:.1f} s (compiling), then {second:.2f} s (on-disk cache)"


def plain_taylor(q, delta):
    """The Taylor bonus as a user writes it in NumPy: no checks, no edge cases."""
    return np.minimum(q + np.sqrt(2 * delta * q * (1 - q)), 1)


def bench_gamma(repeats, n):
    rng = np.random.default_rng(0)
    q = rng.uniform(1e-6, 1 - 1e-6, n)
    delta = 10.0 ** rng.uniform(-4, 1, n)
    taylor, tight, tight_ratio = paired_times(lambda: plain_taylor(q, delta), lambda: exact_gamma(q, delta), repeats)
    _, fast, fast_ratio = paired_times(
        lambda: plain_taylor(q, delta), lambda: exact_gamma(q, delta, tight=False), repeats
    )
    _, _, ours_taylor = paired_times(lambda: plain_taylor(q, delta), lambda: approx_gamma(q, delta), repeats)
    TARGETS["gamma"] = tight_ratio
    sample = min(20_000, n)
    loop = median_time(lambda: user_brentq_loop(q[:sample], delta[:sample]), 3) * n / sample
    _, info = exact_gamma(q, delta, full_output=True)
    ref = user_brentq_loop(q[:2000], delta[:2000])
    diff = np.max(np.abs(exact_gamma(q[:2000], delta[:2000]) / ref - 1))
    rows = [
        (
            f"exact_gamma KL, {n:,} pairs (default: never over delta, within 2 ulp)",
            f"{tight_ratio:,.1f}x the plain NumPy Taylor expression",
            f"{loop / tight:,.1f}x faster than the user's brentq loop",
            f"{info.method}; {info.iterations.mean():.2f} float64 evaluations of B_f per pair in the search, then "
            f"one to 2^-60; max rel. diff vs the loop {diff:.1e} (the loop's xtol)",
        ),
        (
            f"exact_gamma KL, {n:,} pairs, tight=False (never over delta, a few ulp below at most)",
            f"{fast_ratio:,.1f}x the plain NumPy Taylor expression",
            f"{loop / fast:,.1f}x faster than the user's brentq loop",
            f"plain Taylor {taylor * 1e3:.1f} ms, brentq loop {loop:.1f} s per {n:,} pairs; our validated "
            f"approx_gamma {ours_taylor:.2f}x the plain expression; {compile_times()}",
        ),
    ]
    for name in ("chi2", "hellinger"):
        _, _, ratio = paired_times(
            lambda name=name: approx_gamma(q, delta, name), lambda name=name: exact_gamma(q, delta, name), repeats
        )
        rows.append((f"exact_gamma {name}, {n:,} pairs", f"{ratio:,.1f}x our approx_gamma (its Taylor form)", "", ""))
    return rows


# --- statistics ----------------------------------------------------------------------------------


def trace_token_probs():
    """q(n) and p(n) of the token the verifier sampled, at every position of the embedded trace."""
    trace = load_trace()
    settings = SamplingSettings(**trace.metadata["sampling"])
    q_n, p_n = [], []
    for seq in trace:
        draft_probs, target_probs = seq.distributions(settings)
        col = np.argmax(seq.topk_ids["target"] == seq.tokens[:, None], axis=-1)
        rows = np.arange(target_probs.shape[0])
        q_n.append(target_probs[rows, col])
        p_n.append(draft_probs[rows, col])
    return np.concatenate(q_n), np.concatenate(p_n)


def bench_trace_stats(repeats, positions):
    q_n, p_n = trace_token_probs()
    reps = -(-positions // q_n.size)
    target_prob = np.tile(q_n, reps)[:positions]
    draft_prob = np.maximum(np.tile(p_n, reps)[:positions], 1e-300)

    def plain():  # one NumPy pass reading the same arrays
        return np.minimum(target_prob / draft_prob, 1.0).mean()

    def sps():
        beta, al = windowed_accepted_length_of_ratio(target_prob, draft_prob, 8)
        return beta.mean(), al[: positions - 7].mean()

    def cactus():
        beta, al = windowed_accepted_length_of_ratio(target_prob, draft_prob, 8, delta=1.0)
        return beta.mean(), al[: positions - 7].mean()

    base = median_time(plain, repeats)
    return [
        (
            f"acceptance + AL(8) for every block start, {positions:,} positions (the embedded trace's q(n), p(n))",
            f"SpS at {base / median_time(sps, repeats):.0%} of a plain NumPy pass",
            f"Cactus (Taylor) at {base / median_time(cactus, repeats):.0%}",
            f"one fused compiled pass; plain pass {base * 1e3:.1f} ms",
        )
    ]


# --- emitted distribution ------------------------------------------------------------------------


def bench_emitted(repeats, vocab):
    rng = np.random.default_rng(1)
    z = rng.normal(size=vocab) * 3
    q = np.exp(z - z.max())
    q /= q.sum()
    z2 = z + rng.normal(size=vocab)
    p = np.exp(z2 - z2.max())
    p /= p.sum()
    rule = Cactus(1.0)
    t = median_time(lambda: rule.emitted(p, q), repeats)
    sort = median_time(lambda: np.sort(p), repeats)
    argsort = median_time(lambda: np.argsort(p), repeats)
    P, Q = rng.dirichlet(np.ones(100), size=7577), rng.dirichlet(np.ones(100), size=7577)
    t_rows = median_time(lambda: rule.emitted(P, Q), repeats)
    TARGETS["emitted"] = t / sort
    return [
        (
            f"emitted Cactus V={vocab:,} (softmax of Gaussian logits)",
            f"{t / sort:,.1f}x one np.sort of V floats",
            f"{t / argsort:,.1f}x one np.argsort",
            f"np.sort {sort * 1e3:.2f} ms; 7,577 rows of 100 tokens at once: {t_rows * 1e3:.0f} ms",
        )
    ]


# --- the sampling step ----------------------------------------------------------------------------


def plain_top_k_top_p(logits, temperature, top_k, top_p):
    """What an engine writes (vLLM's ``apply_top_k_top_p``): temperature, mask below the k-th
    logit, one sort of the whole row for top-p, softmax."""
    import torch

    x = logits / temperature
    x = x.masked_fill(x < torch.topk(x, top_k, dim=-1).values[..., -1:], -float("inf"))
    ordered, idx = torch.sort(x, dim=-1, descending=False)
    cum = ordered.softmax(-1).cumsum(-1)
    cut = cum <= 1 - top_p
    cut[..., -1] = False
    ordered = ordered.masked_fill(cut, -float("inf"))
    return ordered.scatter(-1, idx, ordered).softmax(-1)


def bench_sampling(repeats, vocab):
    """processed_probs (temperature 0.6, top-k 20, top-p 0.95) on 1 and 9 rows of V logits in
    torch, against the engine's sort-based processing of the same rows."""
    import torch

    from cactus_theory import SamplingSettings, processed_probs

    settings = SamplingSettings()
    rows = []
    for n in (1, 9):
        x = torch.as_tensor(np.random.default_rng(n).normal(size=(n, vocab)) * 3, dtype=torch.float32)
        ours = processed_probs(x, settings)
        theirs = plain_top_k_top_p(x, settings.temperature, settings.top_k, settings.top_p)
        gap = float((ours - theirs).abs().max())
        base, mine, ratio = paired_times(
            lambda x=x: plain_top_k_top_p(x, 0.6, 20, 0.95), lambda x=x: processed_probs(x, settings), repeats
        )
        rows.append(
            (
                f"sampling step: {n} row(s) of V={vocab:,}, temperature 0.6, top-k 20, top-p 0.95",
                f"{ratio:.2f}x the engine's sort-based top-k / top-p",
                f"ours {mine * 1e3:.2f} ms",
                f"engine {base * 1e3:.2f} ms; largest difference of a probability {gap:.1e}",
            )
        )
    return rows


# --- model-written code, isolated ----------------------------------------------------------------

#: A HumanEval-sized program: the completion, its tests, the check call.
GRADED_PROGRAM = """
def add_even(numbers):
    return sum(n for n in numbers if n % 2 == 0)


def check(candidate):
    assert candidate([1, 2, 3, 4]) == 6
    assert candidate([]) == 0
    assert candidate([7, 9]) == 0


check(add_even)
"""


def bench_sandbox(repeats):
    """One graded program run isolated by the operating system (``run_sandboxed``: namespaces, a root of
    its own, limits, Landlock and seccomp where present) against what a harness without isolation runs:
    ``subprocess.run([python, "-c", program])`` with a timeout."""
    from cactus_theory.benchmarks import run_sandboxed

    def plain():
        done = subprocess.run([sys.executable, "-c", GRADED_PROGRAM], capture_output=True, timeout=10)
        assert done.returncode == 0, done.stderr

    def ours():
        result = run_sandboxed(GRADED_PROGRAM, timeout=10)
        assert result.passed and result.isolated, result

    base, mine, ratio = paired_times(plain, ours, repeats)
    return [
        (
            "one graded program (HumanEval-sized), isolated: namespaces, own root, limits",
            f"{ratio:.2f}x a bare subprocess.run(python -c)",
            f"ours {mine:.3f} s a program",
            f"bare {base:.3f} s",
        )
    ]


# --- analysis throughput -------------------------------------------------------------------------


def bench_analysis(repeats):
    trace = load_trace()
    settings = SamplingSettings(**trace.metadata["sampling"])
    rules = parse_rules("sps,tas,cactus,cactus-exact,mentored", (0.25, 0.5, 1.0, 2.0))
    positions = trace.n_positions

    def read_only():
        TraceSequence.forget_distributions()  # a first read, as one command makes it
        for seq in trace:
            seq.distributions(settings)

    def analysis(which, processes, n_boot=1000):
        TraceSequence.forget_distributions()
        return analyze_trace(which, rules, ms=(4, 8, 20), n_boot=n_boot, processes=processes, progress=False)

    t_read = median_time(read_only, repeats)
    t1 = median_time(lambda: analysis(trace, 1), 3)
    t2 = median_time(lambda: analysis(trace, 2), 1)
    t_noboot = median_time(lambda: analysis(trace, 1, n_boot=0), 3)
    TARGETS["analysis"] = t_read / t1
    boot = max(t1 - t_noboot, 0.0)
    rules_time = max(t_noboot - t_read, 0.0)
    # A fresh interpreter's fixed cost: what each spawned worker pays before its first shard.
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import cactus_theory, cactus_theory.kernels as k; k.warm_up()"],
        check=True,
    )
    t_start = time.perf_counter() - start
    return [
        (
            f"analyze_trace, embedded trace ({positions:,} positions, {trace.n_shards} shards), 5 rule families x 4 "
            "deltas, m = 4, 8, 20, 1,000 bootstrap draws",
            f"{positions / t1:,.0f} positions/s with 1 process ({positions / t_read:,.0f}/s only reading: "
            f"{t_read / t1:.0%} of reading speed)",
            f"{t1 / t2:.2f}x speedup with 2 processes",
            f"time: reading {t_read / t1:.0%}, rules {rules_time / t1:.0%}, bootstrap {boot / t1:.0%}; a worker's "
            f"start (interpreter, imports, cached kernels) {t_start:.1f} s",
        ),
    ]


def main(argv=None):
    from bench_scaling import bench_scaling  # a sibling script: the processes / Dask scaling rows

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--cuda-only", action="store_true", help="only the cuda rows (for a GPU machine)")
    parser.add_argument("--scaling-only", action="store_true", help="only the processes / Dask scaling rows")
    parser.add_argument("--gamma-only", action="store_true", help="only the exact-gamma rows")
    parser.add_argument("--sampling-only", action="store_true", help="only the sampling-step rows")
    parser.add_argument("--analysis-only", action="store_true", help="only the embedded trace's analysis row")
    parser.add_argument("--sandbox-only", action="store_true", help="only the isolated program's row")
    parser.add_argument("--positions", type=int, default=100_000, help="positions of the scaling rows' synthetic trace")
    args = parser.parse_args(argv)
    import torch

    started = machine_sample()
    TARGETS.clear()

    print(
        f"machine: {os.cpu_count()} cores, {platform.machine()}, {platform.processor() or 'cpu'}; numpy "
        f"{np.__version__}, torch {torch.__version__}, numba {'yes' if HAVE_NUMBA else 'no'}; "
        f"cuda: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}"
    )
    rows = []
    if torch.cuda.is_available():
        rows += bench_rules(args.repeats, devices=(("cuda", "float32"), ("cuda", "bfloat16")))
    if args.scaling_only:
        rows += bench_scaling(args.positions)
    elif args.gamma_only:
        rows += bench_gamma(args.repeats, 20_000 if args.quick else 1_000_000)
    elif args.sampling_only:
        rows += bench_sampling(args.repeats, 20_000 if args.quick else VOCAB)
    elif args.analysis_only:
        rows += bench_analysis(args.repeats)
    elif args.sandbox_only:
        rows += bench_sandbox(args.repeats)
    elif not args.cuda_only:
        if args.quick:
            rows += bench_rules(1, rows=8, vocab=4096) + bench_gamma(1, 20_000) + bench_trace_stats(1, 100_000)
            rows += bench_emitted(1, 20_000) + bench_sampling(1, 20_000)
        else:
            rows += bench_rules(args.repeats) + bench_gamma(args.repeats, 1_000_000)
            rows += bench_trace_stats(args.repeats, 1_000_000) + bench_emitted(args.repeats, VOCAB)
            rows += bench_sampling(args.repeats, VOCAB)
            rows += bench_analysis(3) + bench_scaling(args.positions) + bench_sandbox(args.repeats)
    load = other_load(started, machine_sample())
    print("| what | ratio | ratio | note |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(
        f"\nload: other processes kept {load:.0%} of the cores busy while this ran"
        if load is not None
        else "\nload: unknown (no /proc/stat)"
    )
    if TARGETS:
        print("\n| target | measured | status |")
        print("|---|---|---|")
        for key, (what, limit, higher) in TARGET_LIMITS.items():
            for name, value in TARGETS.items():
                if name == key or name.startswith(key + " "):
                    met = value >= limit if higher else value <= limit
                    shown = f"{value:.0%}" if higher else f"{value:.2f}x"
                    label = what + (f" ({name[len(key) + 1 :]})" if name != key else "")
                    gap = "" if met else (f": {limit / value:.2f}x short" if higher else f": {value / limit:.2f}x over")
                    print(f"| {label} | {shown} | {'met' if met else 'not met' + gap} |")


if __name__ == "__main__":
    main()
