"""Paired comparisons: McNemar's exact test against scipy and a hand computation, the paired bootstrap
against scipy's bootstrap, the problems needed against the normal formula, coverage of a known
difference."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from cactus_theory._math._paired import mcnemar_exact, paired_difference, problems_needed


def test_mcnemar_by_hand():
    # 1 problem only the first method solved, 5 only the second: n = 6, P(X <= 1) = 7/64
    assert mcnemar_exact(1, 5) == pytest.approx(14 / 64, abs=1e-15)
    assert mcnemar_exact(5, 1) == mcnemar_exact(1, 5)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0  # 2 P(X <= 3) > 1 for n = 6: capped
    assert mcnemar_exact(0, 10) == pytest.approx(2 / 1024, abs=1e-15)


@given(st.integers(0, 60), st.integers(0, 60))
def test_mcnemar_is_scipys_two_sided_binomial_test(a, b):
    expected = 1.0 if a + b == 0 else stats.binomtest(a, a + b, 0.5, alternative="two-sided").pvalue
    assert mcnemar_exact(a, b) == pytest.approx(expected, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("only_first, only_second", [(500, 524), (480, 640), (0, 1500), (49_800, 50_200), (1, 99_999)])
def test_mcnemar_at_the_scale_a_one_point_claim_needs(only_first, only_second):
    """Past 1,023 discordant problems 2^n overflows a float: the p-value there against the binomial tail
    summed term by term in mpmath at 60 digits (C(n, 0) / 2^n, then each term from the last by (n - i) /
    (i + 1): no float ever holds 2^n), and against exact integer sums where n is small enough to add them."""
    import mpmath

    n, k = only_first + only_second, min(only_first, only_second)
    with mpmath.workdps(60):
        term = mpmath.mpf(2) ** -n
        tail = term
        for i in range(k):
            term = term * (n - i) / (i + 1)
            tail += term
        expected = float(min(1, 2 * tail))
    if n <= 2000:
        from fractions import Fraction

        exact = Fraction(sum(math.comb(n, i) for i in range(k + 1)), 2**n)
        assert float(min(1, 2 * exact)) == pytest.approx(expected, rel=1e-12, abs=0)
    got = mcnemar_exact(only_first, only_second)
    assert math.isfinite(got) and 0 <= got <= 1
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_mcnemar_refuses_what_is_not_a_count(bad):
    with pytest.raises(ValueError, match=r"must be an integer >= 0 \(a count\)"):
        mcnemar_exact(bad, 2)


def _table():
    """A hand-made table of 12 problems at one sample each."""
    a = np.array([1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1], dtype=float)
    b = np.array([1, 0, 1, 0, 1, 0, 0, 1, 0, 1, 1, 1], dtype=float)
    return [f"p{i}" for i in range(12)], a, b


def test_a_small_table_by_hand():
    ids, a, b = _table()
    c = paired_difference(ids, a, b)
    assert (c.accuracy, c.reference_accuracy) == (9 / 12, 7 / 12)
    assert c.difference == pytest.approx(2 / 12, abs=1e-15)
    assert c.discordant == (3, 1)  # p1, p5, p8 only the method; p10 only the reference
    assert c.mcnemar_p == pytest.approx(2 * 5 / 16, abs=1e-15)  # n = 4, P(X <= 1) = 5/16
    d = a - b
    s = math.sqrt(sum((x - d.mean()) ** 2 for x in d) / 11)
    assert c.needed_1 == pytest.approx((1.959963984540054 * s / 0.01) ** 2, rel=1e-12)
    assert c.needed_2 == pytest.approx(c.needed_1 / 4, rel=1e-12)
    assert c.low <= c.difference <= c.high
    assert not c.shown and c.verdict == "no difference shown"


def test_the_interval_is_scipys_paired_percentile_bootstrap():
    rng = np.random.default_rng(7)
    n = 80
    b = (rng.random(n) < 0.6).astype(float)
    a = np.where(rng.random(n) < 0.15, 1 - b, b)  # the method flips 15% of the answers
    ids = [f"q{i}" for i in range(n)]
    ours = paired_difference(ids, a, b, n_boot=20000, seed=3)
    theirs = stats.bootstrap(
        (a - b,), np.mean, n_resamples=20000, method="percentile", random_state=11, confidence_level=0.95
    ).confidence_interval
    # two Monte Carlo estimates of the same percentiles: they agree to the resampling error
    assert ours.low == pytest.approx(theirs.low, abs=0.012)
    assert ours.high == pytest.approx(theirs.high, abs=0.012)


def test_samples_within_a_problem_are_averaged_and_mcnemar_is_left_out():
    ids = ["a", "b", "c"]
    c = paired_difference(ids, [0.5, 1.0, 0.0], [0.5, 0.5, 0.5], n_boot=200)
    assert c.difference == pytest.approx((0 + 0.5 - 0.5) / 3, abs=1e-15)
    assert c.mcnemar_p is None
    one = paired_difference(ids, [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], n_boot=200, single_sample=False)
    assert one.mcnemar_p is None


def test_equal_methods_show_no_difference():
    ids, a, _ = _table()
    c = paired_difference(ids, a, a)
    assert (c.difference, c.low, c.high, c.mcnemar_p, c.discordant) == (0.0, 0.0, 0.0, 1.0, (0, 0))
    assert c.verdict == "no difference shown"


def test_one_problem_has_no_interval():
    c = paired_difference(["only"], [1.0], [0.0])
    assert math.isnan(c.low) and math.isnan(c.high) and math.isnan(c.needed_1)
    assert c.verdict.startswith("no interval")


def test_a_known_flip_share_is_covered():
    """Problems the reference gets right with probability 0.7; the method loses each right answer with
    probability 0.2: the true difference is -0.14. Over 200 seeded tables of 150 problems, the 95%
    interval covers -0.14 in about 95% of them (binomial tolerance)."""
    rng = np.random.default_rng(2026)
    truth, covered, tables = -0.7 * 0.2, 0, 200
    ids = [f"p{i}" for i in range(150)]
    for t in range(tables):
        ref = (rng.random(150) < 0.7).astype(float)
        method = np.where((ref == 1) & (rng.random(150) < 0.2), 0.0, ref)
        c = paired_difference(ids, method, ref, n_boot=1000, seed=t)
        covered += c.low <= truth <= c.high
    assert 0.89 <= covered / tables <= 0.99, covered


@pytest.mark.parametrize(
    "args, message",
    [
        ((["a", "b"], [1.0], [1.0, 0.0]), "one value per problem"),
        (([], [], []), "no problems"),
        ((["a"], [1.5], [1.0]), "in \\[0, 1\\]"),
        ((["a"], [float("nan")], [1.0]), "in \\[0, 1\\]"),
    ],
)
def test_bad_input_is_named(args, message):
    with pytest.raises(ValueError, match=message):
        paired_difference(*args)


def test_problems_needed_needs_two():
    assert math.isnan(problems_needed([0.5], 0.01))
    assert problems_needed([0.0, 0.0, 0.0], 0.01) == 0.0
