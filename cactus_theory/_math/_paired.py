"""Paired comparisons of two methods graded on the same problems: the accuracy difference with a paired
bootstrap interval over problems, McNemar's exact test, and the problems a given precision needs.

Each problem i has a score per method in [0, 1] (the share of its K samples graded correct). The
difference is D = mean_i (a_i - b_i); its interval resamples problems, the pairs kept together (the
bootstrap of ``_bootstrap``: ids and seed decide the resamples, so the same problems give the same
interval in every table). McNemar's exact test (one sample per problem): under "no difference" the
discordant problems (one method right, the other wrong) split as Binomial(n01 + n10, 1/2); the
two-sided p-value is 2 P(X <= min(n01, n10)), at most 1, computed by scipy's binomial distribution (the
regularised incomplete beta function: no 2^n, accurate to a few ulps at any n, 10^5 discordant problems
included; ``tests/math/test_paired.py`` checks it against mpmath's exact sums). The problems for a 95%
interval of half-width h at the observed spread: (1.959964 s / h)^2, s the standard deviation of the
per-problem differences (a normal approximation, said so).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._bootstrap import percentile_interval, resample_counts, resampled_sums
from ._validation import check_int

__all__ = ["PairedComparison", "mcnemar_exact", "paired_difference", "problems_needed"]

_Z = 1.959963984540054


@dataclass(frozen=True)
class PairedComparison:
    """A method against a reference on the same problems: accuracies, their difference with a 95%
    paired bootstrap interval, McNemar's p-value (None when a problem has other than one sample), and
    the problems a +-1 and +-2 point interval would need at the observed spread."""

    problems: int
    accuracy: float
    reference_accuracy: float
    difference: float
    low: float
    high: float
    mcnemar_p: float | None
    discordant: tuple
    needed_1: float
    needed_2: float

    @property
    def shown(self) -> bool:
        """Whether the interval excludes 0 (a difference is shown)."""
        return bool(np.isfinite(self.low) and (self.low > 0 or self.high < 0))

    @property
    def verdict(self) -> str:
        if not np.isfinite(self.low):
            return "no interval (fewer than two problems)" if self.problems < 2 else "no interval (no resamples)"
        if not self.shown:
            return "no difference shown"
        return "better" if self.low > 0 else "worse"


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """McNemar's exact two-sided p-value from the discordant counts (problems only the first method got
    right, only the second did): 2 P(X <= min) for X ~ Binomial(n, 1/2), at most 1; 1 when n = 0."""
    for name, v in (("only_first", only_first), ("only_second", only_second)):
        check_int(v, name, 0, what="a count")
    n, k = int(only_first) + int(only_second), min(int(only_first), int(only_second))
    if n == 0:
        return 1.0
    from scipy.stats import binom

    return float(min(1.0, 2.0 * binom.cdf(k, n, 0.5)))


def problems_needed(differences, half_width) -> float:
    """Problems a 95% interval of ``half_width`` (a share: 0.01 is one point) needs at the spread of the
    per-problem ``differences`` (normal approximation): (1.96 s / h)^2; NaN with fewer than two."""
    d = np.asarray(differences, dtype=np.float64)
    if d.size < 2:
        return float("nan")
    return float((_Z * d.std(ddof=1) / half_width) ** 2)


def paired_difference(ids, scores, reference, *, n_boot=2000, seed=0, single_sample=None) -> PairedComparison:
    """``scores`` and ``reference`` (one value in [0, 1] per problem of ``ids``: the share of its samples
    graded correct) compared pairwise (see the module docstring). ``single_sample``: whether each problem
    had one sample (McNemar applies; default: every score is 0 or 1)."""
    a, b = (np.asarray(x, dtype=np.float64) for x in (scores, reference))
    ids = [str(i) for i in ids]
    if a.shape != b.shape or a.ndim != 1 or a.size != len(ids):
        raise ValueError(
            f"scores, reference and ids must be one value per problem; got {a.shape}, {b.shape} and {len(ids)} ids"
        )
    if a.size == 0:
        raise ValueError("no problems to compare")
    if not (np.all((a >= 0) & (a <= 1)) and np.all((b >= 0) & (b <= 1))):
        raise ValueError("scores must be shares of correct samples, in [0, 1]")
    d = a - b
    counts = resample_counts(ids, n_boot, seed)
    low = high = float("nan")
    if counts is not None:
        (sums,) = resampled_sums(counts, d)
        low, high = percentile_interval(sums / a.size)
    if single_sample is None:
        single_sample = bool(np.all(np.isin(a, (0.0, 1.0))) and np.all(np.isin(b, (0.0, 1.0))))
    only_a, only_b = int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1)))
    p = mcnemar_exact(only_a, only_b) if single_sample else None
    return PairedComparison(
        int(a.size),
        float(a.mean()),
        float(b.mean()),
        float(d.mean()),
        low,
        high,
        p,
        (only_a, only_b),
        problems_needed(d, 0.01),
        problems_needed(d, 0.02),
    )
