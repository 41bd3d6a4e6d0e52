"""Gamma(delta): the worst drift of a rule's emitted distribution from the verifier, by search.

For a rule with a budget delta (Cactus, exact Cactus, mentored, ...), one step emits pi (Hao & Mou, ICLR 2026,
section 3), and Gamma(delta) = sup over (p, q) of D(pi || q) / delta. No closed form is known;
``worst_case_drift`` returns a lower bound on it found by random search over (p, q) from several
families followed by L-BFGS-B on the logits of the best starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from .._math._divergences import divergence as _divergence
from .._math._divergences import get_divergence
from .._math._synthetic import _softmax
from .._math._validation import check_int, seeded_rng
from .._rules._registry import as_rule

__all__ = ["WorstCase", "worst_case_drift", "worst_case_sweep"]

#: scipy's default finite-difference step for L-BFGS-B (``eps``), and float64's epsilon.
_FD_STEP = 1e-8
_EPS_F64 = float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class WorstCase:
    """Result of ``worst_case_drift``: a search lower bound, not a proof.

    Attributes
    ----------
    worst_divergence : float
        The largest D(pi || q) found.
    worst_ratio : float
        worst_divergence / delta (NaN for a rule without a budget).
    worst_random : float
        The best ratio (or divergence) among the random starts alone, before L-BFGS-B.
    draft_probs, target_probs : ndarray (V,)
        The pair that attains it.
    evaluations : int
    """

    rule: str
    vocab: int
    worst_divergence: float
    worst_ratio: float
    worst_random: float
    draft_probs: np.ndarray
    target_probs: np.ndarray
    evaluations: int


def random_pairs(rng, n, vocab):
    """n (p, q) pairs of size vocab: Dirichlet at concentrations 0.05, 0.3, 1 and scaled Gaussian logits."""
    out_p, out_q = [], []
    per = n // 4
    for alpha in (0.05, 0.3, 1.0):
        out_p.append(rng.dirichlet(np.full(vocab, alpha), size=per))
        out_q.append(rng.dirichlet(np.full(vocab, alpha), size=per))
    scale = rng.uniform(0.5, 8.0, size=(n - 3 * per, 1))
    out_p.append(_softmax(rng.normal(size=(n - 3 * per, vocab)) * scale))
    out_q.append(_softmax(rng.normal(size=(n - 3 * per, vocab)) * scale))
    p, q = np.concatenate(out_p), np.concatenate(out_q)
    p = np.maximum(p, 1e-300)
    q = np.maximum(q, 1e-300)
    return p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)


def worst_case_drift(rule, vocab, *, divergence="kl", n_random=4000, n_starts=2, maxiter=40, seed=0):
    """Search for the (p, q) of size ``vocab`` where one step of ``rule`` drifts most from q.

    Maximises D(pi || q), pi = ``rule.emitted(p, q)`` (exact), over ``n_random`` random pairs,
    then runs L-BFGS-B (``maxiter`` iterations) on the logits of the ``n_starts`` best. Its
    gradients are scipy's own forward differences (absolute step 1e-8, the step it would take),
    with the 2V + 1 points of each gradient evaluated in one batched call of the emitted law:
    the same iterates as L-BFGS-B's internal finite differences, at a fraction of the calls.
    Every value is a lower bound on sup D(pi || q) (a search, not a proof);
    ``worst_ratio`` divides by the rule's ``delta``. Deterministic for a given ``seed`` (anything
    ``numpy.random.default_rng`` accepts).

    Examples
    --------
    >>> from cactus_theory import SpS
    >>> worst_case_drift(SpS(), 4, n_random=40, n_starts=1, maxiter=5).worst_divergence < 1e-12  # lossless
    True
    """
    rule = as_rule(rule)
    check_int(vocab, "vocab", 2)
    check_int(n_random, "n_random", 4)
    delta = getattr(rule, "delta", None)
    scale = float(delta) if delta else float("nan")

    kl = get_divergence(divergence).name == "kl"

    def drift(p, q):
        pi = np.asarray(rule.emitted(p, q), dtype=np.float64)
        if kl:  # sum of x log(x/y): no -x + y terms, whose rounding noise would steer L-BFGS-B's differences
            return np.sum(special.rel_entr(pi, q), axis=-1)
        return np.asarray(_divergence(pi, q, divergence, atol=1e-6), dtype=np.float64)

    rng = seeded_rng(seed)
    p, q = random_pairs(rng, n_random, vocab)
    values = drift(p, q)
    best_i = int(np.argmax(values))
    best, best_p, best_q = float(values[best_i]), p[best_i], q[best_i]
    best_random = best
    evaluations = n_random

    counted = [0]

    def objective_and_gradient(z):
        # scipy's 2-point differences with its default absolute step: x_i = z + h e_i, and
        # df / dx with dx = (z_i + h) - z_i as representable; the 2V + 1 rows in one call
        h = np.full(z.size, _FD_STEP)
        dx = (z + h) - z
        h = np.where(dx == 0, np.sqrt(_EPS_F64) * np.where(z >= 0, 1.0, -1.0) * np.maximum(1.0, np.abs(z)), h)
        points = np.repeat(z[None], z.size + 1, axis=0)
        points[np.arange(1, z.size + 1), np.arange(z.size)] += h
        values_ = drift(_softmax(points[:, :vocab]), _softmax(points[:, vocab:]))
        counted[0] += points.shape[0]
        f0 = -float(values_[0])
        step = (z + h) - z
        return f0, (-values_[1:] - f0) / step

    for i in np.argsort(values)[::-1][:n_starts]:
        z0 = np.concatenate([np.log(p[i]), np.log(q[i])])
        z0 = np.clip(z0 - z0.max(), -60, 0)
        res = optimize.minimize(objective_and_gradient, z0, jac=True, method="L-BFGS-B", options={"maxiter": maxiter})
        if -float(res.fun) > best:
            best, best_p, best_q = -float(res.fun), _softmax(res.x[:vocab]), _softmax(res.x[vocab:])
    evaluations += counted[0]
    return WorstCase(
        rule=rule.describe(),
        vocab=int(vocab),
        worst_divergence=best,
        worst_ratio=best / scale,
        worst_random=best_random / scale if delta else best_random,
        draft_probs=best_p,
        target_probs=best_q,
        evaluations=int(evaluations),
    )


def _sweep_one(job):
    """One setting of ``worst_case_sweep`` (runs in a worker process)."""
    from .._rules import make_rule

    name, delta, vocab, seeds, n_random, n_starts, maxiter = job
    start = time.perf_counter()
    res = worst_case_drift(
        make_rule(f"{name}(delta={delta!r})"), vocab, n_random=n_random, n_starts=n_starts, maxiter=maxiter, seed=seeds
    )
    return {
        "rule": name,
        "delta": float(delta),
        "vocab": int(vocab),
        "worst_ratio_random": res.worst_random,
        "worst_ratio": res.worst_ratio,
        "worst_kl": res.worst_divergence,
        "evaluations": res.evaluations,
        "seconds": time.perf_counter() - start,
    }


def worst_case_sweep(
    rules=("cactus", "cactus-exact"),
    deltas=(0.001, 0.01, 0.1, 0.5, 1.0, 2.0),
    vocabs=(2, 4, 8, 16, 32, 64),
    *,
    seed=0,
    n_random=4000,
    n_starts=2,
    maxiter=40,
    processes=1,
    progress=None,
):
    """Gamma(delta) lower bounds (``worst_case_drift``) for every rule x delta x vocabulary size.

    ``rules`` are registered spec names that take a ``delta`` (e.g. ``"cactus"``,
    ``"cactus-exact"``, ``"mentored"``). Setting (i, j, vocab) -- the i-th rule, j-th delta --
    is searched with the seed ``[seed, i, j, vocab]``, so the rows do not depend on the order
    of the settings or on ``processes`` (worker processes, spawned). Returns one dict per
    setting, in rule, delta, vocab order: rule, delta, vocab, worst_ratio_random, worst_ratio,
    worst_kl, evaluations, seconds. The report and ``experiments/gamma_worst_case.py`` both
    call this.
    """
    from .._util._progress import progress_bar

    rules, deltas, vocabs = [str(r) for r in rules], [float(d) for d in deltas], [int(v) for v in vocabs]
    check_int(processes, "processes", 1)
    jobs = [
        (name, delta, vocab, [seed, i, j, vocab], n_random, n_starts, maxiter)
        for i, name in enumerate(rules)
        for j, delta in enumerate(deltas)
        for vocab in vocabs
    ]
    pool = None
    if processes > 1 and len(jobs) > 1:
        from multiprocessing import get_context

        pool = get_context("spawn").Pool(processes)
    try:
        results = pool.imap(_sweep_one, jobs) if pool else map(_sweep_one, jobs)
        with progress_bar(total=len(jobs), desc="Gamma(delta)", unit="setting", enabled=progress) as bar:
            rows = []
            for row in results:
                rows.append(row)
                bar.update(1)
                bar.set_postfix(rule=row["rule"], delta=row["delta"], V=row["vocab"], ratio=f"{row['worst_ratio']:.3f}")
    finally:
        if pool:
            pool.close()
            pool.join()
    return rows
