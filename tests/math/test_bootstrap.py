"""The bootstrap: every ratio interval of one resampling pass equals the bootstrap written out resample by
resample."""

import numpy as np


def test_intervals_in_one_pass_equal_the_bootstrap_written_out():
    from cactus_theory._math._bootstrap import ratio_intervals, resample_counts

    rng = np.random.default_rng(3)
    units = 12
    keys = [f"seq-{i}" for i in range(units)]
    counts = resample_counts(keys, 400, 0)
    pairs = [(rng.uniform(0, 5, units), rng.uniform(1, 2, units)) for _ in range(5)]
    pairs.append((rng.uniform(0, 5, units), np.r_[np.zeros(units - 1), 1.0]))  # resamples with a zero denominator
    pairs.append((np.ones(units), np.zeros(units)))  # no denominator at all
    got = ratio_intervals(pairs, counts)
    for (num, den), (value, lo, hi) in zip(pairs, got, strict=True):
        if den.sum() == 0:
            assert np.isnan(value) and np.isnan(lo) and np.isnan(hi)
            continue
        assert value == num.sum() / den.sum()
        ratios = []
        for row in counts:  # each resample written out: the units it draws, with their multiplicity
            top = sum(c * x for c, x in zip(row, num, strict=True))
            bottom = sum(c * x for c, x in zip(row, den, strict=True))
            if bottom > 0:
                ratios.append(top / bottom)
        want = np.percentile(ratios, [2.5, 97.5]) if len(ratios) >= 100 else (np.nan, np.nan)
        np.testing.assert_allclose([lo, hi], want, rtol=1e-12, equal_nan=True)
