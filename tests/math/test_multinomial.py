"""The engine oracle's statistics: the G statistic against its definition, the Monte Carlo p-value's calibration
(false alarms at the nominal rate, p-values uniform), the power formula against simulation, the draws it says a
total variation needs, and the TV interval's coverage."""

import math

import numpy as np
import pytest
from scipy import stats

from cactus_theory._math._multinomial import (
    combined_test,
    detectable_tv,
    draws_for_tv,
    g_statistic,
    g_test,
    tv_with_interval,
)

LAW = np.array([0.45, 0.3, 0.15, 0.07, 0.03])


def test_g_is_its_definition_and_infinite_where_the_law_forbids():
    counts = np.array([40, 35, 15, 7, 3])
    want = 2 * sum(c * math.log(c / (100 * p)) for c, p in zip(counts, LAW, strict=True))
    assert g_statistic(counts, LAW) == pytest.approx(want, rel=1e-12)
    assert g_statistic([5, 0, 0], [0.5, 0.5, 0.0]) == pytest.approx(2 * 5 * math.log(2), rel=1e-12)
    assert g_statistic([1, 1, 1], [0.5, 0.5, 0.0]) == math.inf
    assert g_test([1, 1, 1], [0.5, 0.5, 0.0])[1] == 0.0
    for bad, match in (
        (([1, 2], [0.5, 0.2]), "summing to 1"),
        (([1, 2, 3], [0.5, 0.5]), "one length"),
        (([1.5, 2], [0.5, 0.5]), "whole numbers"),
        (([1, 2], [float("nan"), 0.5]), "summing to 1"),
    ):
        with pytest.raises(ValueError, match=match):
            g_statistic(*bad)


def test_false_alarms_are_at_the_nominal_rate_and_p_values_uniform():
    rng = np.random.default_rng(1)
    p_values = np.array([g_test(rng.multinomial(200, LAW), LAW, sims=400, seed=i)[1] for i in range(400)])
    low, high = stats.binom.interval(0.99, 400, 0.05)
    assert low <= np.sum(p_values < 0.05) <= high
    assert stats.kstest(p_values, "uniform").pvalue > 0.001


def test_the_power_formula_agrees_with_simulation():
    """At the TV it says the test detects at 80% (mass moved between the two most likely outcomes), the test
    detects it about 80% of the time."""
    n = 600
    eps = detectable_tv(LAW, n, alpha=0.01)
    alternative = LAW.copy()
    alternative[0] -= eps
    alternative[1] += eps
    rng = np.random.default_rng(2)
    hits = sum(g_test(rng.multinomial(n, alternative), LAW, sims=500, seed=i)[1] < 0.01 for i in range(300))
    assert 0.68 <= hits / 300 <= 0.92
    assert draws_for_tv(LAW, eps, alpha=0.01) == pytest.approx(n, rel=0.01)
    assert detectable_tv(LAW, 4 * n) == pytest.approx(eps / 2, rel=1e-6)  # 1 / sqrt(n)
    assert math.isnan(detectable_tv([1.0, 0.0], 100))


def test_the_combined_test_adds_the_contexts():
    rng = np.random.default_rng(3)
    nulls, stats_ = [], []
    for i in range(5):
        g, _, null = g_test(rng.multinomial(150, LAW), LAW, sims=500, seed=i)
        stats_.append(g)
        nulls.append(null)
    total, p = combined_test(stats_, nulls)
    assert total == pytest.approx(sum(stats_))
    assert p == (1 + np.sum(np.sum(nulls, axis=0) >= total - 1e-9 * total)) / 501
    assert combined_test([1.0, math.inf], nulls[:2]) == (math.inf, 0.0)


def test_the_tv_interval_covers_the_true_total_variation():
    rng = np.random.default_rng(4)
    truth = LAW.copy()
    truth[0] -= 0.04
    truth[2] += 0.04
    true_tv = 0.04
    covered = 0
    for _ in range(200):
        tv, low, high = tv_with_interval(rng.multinomial(300, truth), LAW)
        covered += low <= true_tv <= high
        assert 0 <= low <= tv <= high <= 1
    assert covered / 200 >= 0.95
