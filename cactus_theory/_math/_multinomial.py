"""Whether counts were drawn from a given law: the likelihood-ratio (G) test with a Monte Carlo p-value, the
test's power as a total variation it detects, and the total variation between the counts and the law with its
interval. What the engine oracle (``conform``) reports per context and over all of them.

- ``g_test``: G = 2 sum_x c(x) log(c(x) / (n P(x))) over the categories of the law; a count where the law puts
  no mass makes G infinite (p = 0: the engine emitted what the law forbids). The p-value is Monte Carlo:
  (1 + #{G_b >= G}) / (B + 1) over B multinomial draws from the law itself (exact in the limit of B, valid at
  any B: a p-value of this form is never below its nominal level under the law; Davison & Hinkley 1997, 4.2).
- Contexts are combined by the sum of their G's, its null law simulated the same way from the per-context draws
  (``combined_test``): a defect present in every context adds up.
- ``detectable_tv``: the smallest total variation the test detects with probability ``power`` at level
  ``alpha`` with n draws, against the least favourable alternative of its kind: mass moved between the two most
  likely categories (the direction the G test is least sensitive to: noncentrality n eps^2 (1/P_1 + 1/P_2)), from
  the noncentral chi-square with K - 1 degrees of freedom (asymptotic; the tests compare it with simulation).
- ``tv_with_interval``: the total variation between the empirical law and the law, and a 95% interval for the
  total variation between the law the counts were drawn from and the law: the empirical one within
  TV(empirical, truth) of it (the triangle inequality), bounded by Weissman et al.'s L1 deviation inequality
  (P(|P_hat - P|_1 >= e) <= (2^K - 2) exp(-n e^2 / 2), HP Labs 2003): valid at every n and K, conservative.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "binomial_p_value",
    "combined_test",
    "detectable_tv",
    "draws_for_tv",
    "g_statistic",
    "g_test",
    "pooled_z_p_value",
    "tv_with_interval",
]


def _checked(counts, law):
    counts = np.asarray(counts, dtype=np.float64)
    law = np.asarray(law, dtype=np.float64)
    if counts.shape != law.shape or counts.ndim != 1:
        raise ValueError(f"counts and law must be two vectors of one length; got {counts.shape}, {law.shape}")
    if not (np.all(np.isfinite(law)) and np.all(law >= 0) and abs(law.sum() - 1) <= 1e-9):
        raise ValueError(f"law must be probabilities summing to 1; got a sum of {law.sum()!r}")
    if not (np.all(np.isfinite(counts)) and np.all(counts >= 0) and np.all(counts == np.round(counts))):
        raise ValueError("counts must be whole numbers >= 0")
    return counts, law


def g_statistic(counts, law) -> float:
    """G = 2 sum_x c(x) log(c(x) / (n P(x))) (0 log 0 = 0); infinite where a count falls where P = 0."""
    counts, law = _checked(counts, law)
    n = counts.sum()
    if np.any((counts > 0) & (law <= 0)):
        return float("inf")
    seen = counts > 0
    return float(2.0 * np.sum(counts[seen] * np.log(counts[seen] / (n * law[seen]))))


def _null_draws(law, n, sims, rng):
    """G of ``sims`` multinomial draws of n from ``law`` (its support only)."""
    support = law > 0
    p = law[support] / law[support].sum()
    draws = rng.multinomial(int(n), p, size=int(sims)).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(draws > 0, draws * np.log(draws / (n * p)), 0.0)
    return 2.0 * terms.sum(-1)


def g_test(counts, law, *, sims=2000, seed=0):
    """(G, its Monte Carlo p-value, the null draws of G) of ``counts`` against ``law`` (see the module docstring);
    ``seed`` fixes the draws, so the p-value is a function of the counts and the law."""
    counts, law = _checked(counts, law)
    stat = g_statistic(counts, law)
    null = _null_draws(law, counts.sum(), sims, np.random.default_rng(seed))
    if not np.isfinite(stat):  # a token the law forbids: no draw of the law reaches it
        return stat, 0.0, null
    # ties within rounding count as reaching the statistic (the p-value stays valid)
    return stat, float((1.0 + np.sum(null >= stat - 1e-9 * max(1.0, stat))) / (sims + 1.0)), null


def combined_test(stats, nulls):
    """(sum of G, its Monte Carlo p-value) over contexts: ``stats`` each context's G, ``nulls`` its null draws (the
    same number each; summed draw by draw, the contexts being independent)."""
    stats = np.asarray(stats, dtype=np.float64)
    total = float(stats.sum())
    if not np.isfinite(total):
        return total, 0.0
    null = np.sum(np.stack([np.asarray(x, dtype=np.float64) for x in nulls]), axis=0)
    return total, float((1.0 + np.sum(null >= total - 1e-9 * max(1.0, abs(total)))) / (null.size + 1.0))


def _noncentrality(df, alpha, power):
    """The noncentrality at which a chi-square test of ``df`` degrees of freedom at level ``alpha`` has ``power``."""
    from scipy import optimize, stats

    critical = stats.chi2.ppf(1 - alpha, df)
    return float(optimize.brentq(lambda lam: stats.ncx2.sf(critical, df, lam) - power, 1e-9, 1e6))


def _least_favourable(law) -> float:
    top = np.sort(np.asarray(law, dtype=np.float64)[np.asarray(law) > 0])[::-1]
    if top.size < 2:
        return float("inf")  # one category: no alternative moves mass inside the support
    return float(1.0 / top[0] + 1.0 / top[1])


def detectable_tv(law, n, *, alpha=0.01, power=0.8) -> float:
    """The smallest total variation the G test at level ``alpha`` detects with probability ``power`` from ``n``
    draws, mass moved between the two most likely categories (see the module docstring). NaN for a law of one
    category (nothing can move inside it)."""
    law = np.asarray(law, dtype=np.float64)
    k = int(np.sum(law > 0))
    if k < 2 or n <= 0:
        return float("nan")
    lam = _noncentrality(k - 1, alpha, power)
    return float(np.sqrt(lam / (n * _least_favourable(law))))


def draws_for_tv(law, tv, *, alpha=0.01, power=0.8) -> float:
    """The draws the G test needs to detect a total variation ``tv`` with probability ``power`` at level ``alpha``
    (``detectable_tv`` solved for n), and never fewer than 10 per category of the law (below that the chi-square
    law the power comes from does not hold: the counts are too few)."""
    law = np.asarray(law, dtype=np.float64)
    k = int(np.sum(law > 0))
    if k < 2:
        return float("nan")
    return float(max(np.ceil(_noncentrality(k - 1, alpha, power) / (tv**2 * _least_favourable(law))), 10 * k))


def tv_with_interval(counts, law, *, confidence=0.95):
    """(TV(empirical, law), a ``confidence`` interval for TV(the law the counts come from, law)): the empirical
    value give or take half of Weissman et al.'s bound on the L1 deviation of an empirical law over the K
    categories (see the module docstring), clipped to [0, 1]."""
    counts, law = _checked(counts, law)
    n = counts.sum()
    empirical = counts / n
    tv = 0.5 * float(np.abs(empirical - law).sum())
    k = max(int(np.sum((law > 0) | (counts > 0))), 2)
    # (2^K - 2) / delta in logarithms: K log 2 + log(1 - 2^(1 - K)) - log(delta)
    log_ratio = k * np.log(2.0) + np.log1p(-(2.0 ** (1 - k))) - np.log(1 - confidence)
    half = 0.5 * float(np.sqrt(2.0 * log_ratio / n))
    return tv, max(0.0, tv - half), min(1.0, tv + half)


def binomial_p_value(successes, trials, rate) -> float:
    """The two-sided exact binomial p-value of ``successes`` in ``trials`` at ``rate`` (clipped to [0, 1]; NaN where
    there is no trial): whether an engine's accepted count fits a candidate law's acceptance."""
    from scipy import stats

    if trials == 0:
        return float("nan")
    return float(stats.binomtest(int(successes), int(trials), min(max(float(rate), 0.0), 1.0)).pvalue)


def pooled_z_p_value(parts) -> float:
    """The two-sided p-value of the total successes of ``parts`` ([(successes, trials, rate)], independent
    binomials) against their expected total sum n r, with variance sum n r (1 - r), by the normal law (1 where the
    variance is 0 and the total is the expected one, 0 where it is not)."""
    from scipy import stats

    parts = list(parts)
    k = sum(float(a) for a, _, _ in parts)
    mean = sum(float(n) * float(r) for _, n, r in parts)
    var = sum(float(n) * float(r) * (1 - float(r)) for _, n, r in parts)
    if var <= 0:
        return 1.0 if k == mean else 0.0
    return float(2 * stats.norm.sf(abs(k - mean) / math.sqrt(var)))
