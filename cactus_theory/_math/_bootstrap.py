"""The bootstrap over sequences (or prompts) behind every interval the package prints.

One resampling per set of units: the resamples depend only on the seed and on *which* units
(their ids), never on the order in which tables draw them, so the same quantity on the same
trace gets the same interval in every table (the analysis, the rules grid, the block and tree
studies, the docs), and the difference between two rules is paired (common random numbers).

An interval needs at least two units and ``MIN_RESAMPLES`` resamples (a percentile interval from
a handful of resamples is not a 95% interval); where it cannot be had it is NaN, never a number.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from ._validation import check_int

__all__ = [
    "MAX_RESAMPLES",
    "MIN_RESAMPLES",
    "check_resamples",
    "percentile_interval",
    "ratio_interval",
    "ratio_intervals",
    "resample_counts",
    "resampled_sums",
]

#: Fewest resamples of a percentile 95% interval (at least 2 resamples in each 2.5% tail).
MIN_RESAMPLES = 100
#: Most resamples (the counts are computed in chunks, so memory stays bounded; time grows with it).
MAX_RESAMPLES = 100_000
#: Resamples per chunk of the weighted sums.
_CHUNK = 4096


def check_resamples(n_boot, name: str = "n_boot") -> int:
    """``n_boot`` as an int: 0 (no intervals) or MIN_RESAMPLES..MAX_RESAMPLES, else a ValueError
    naming ``name``."""
    n_boot = check_int(n_boot, name, what="bootstrap resamples")
    if n_boot != 0 and not MIN_RESAMPLES <= n_boot <= MAX_RESAMPLES:
        raise ValueError(
            f"{name} must be 0 (no intervals) or between {MIN_RESAMPLES:,} and {MAX_RESAMPLES:,} resamples; got "
            f"{n_boot:,}: a 95% percentile interval needs resamples in both 2.5% tails"
        )
    return n_boot


def _seed_of(keys, seed) -> np.random.SeedSequence:
    digest = hashlib.sha256("\n".join(map(str, keys)).encode("utf-8")).digest()
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    return np.random.SeedSequence([int(seed), *words])


@functools.lru_cache(maxsize=64)
def _counts(keys: tuple, n_boot: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(_seed_of(keys, seed))
    n = len(keys)
    out = np.empty((n_boot, n), dtype=np.int32)
    for begin in range(0, n_boot, _CHUNK):
        rows = min(_CHUNK, n_boot - begin)
        draws = rng.integers(n, size=(rows, n)) + n * np.arange(rows)[:, None]
        out[begin : begin + rows] = np.bincount(draws.ravel(), minlength=rows * n).reshape(rows, n)
    out.setflags(write=False)
    return out


def resample_counts(keys, n_boot: int, seed: int = 0) -> np.ndarray | None:
    """(n_boot, n) read-only int32 counts: how often each of the n units ``keys`` (their ids, in
    the order the caller's arrays use) appears in each bootstrap resample. Deterministic in
    ``seed`` and the keys (as a set with their order: the same ids in the same order give the same
    counts). None when no interval can be had: n_boot = 0 or fewer than two units."""
    keys = tuple(str(k) for k in keys)
    n_boot = check_resamples(n_boot)
    if n_boot == 0 or len(keys) < 2:
        return None
    return _counts(keys, n_boot, int(seed))


def percentile_interval(values):
    """The 2.5% and 97.5% percentiles of bootstrap ``values`` (the finite ones), or NaN, NaN when
    fewer than ``MIN_RESAMPLES`` are finite."""
    values = np.asarray(values, dtype=np.float64)
    finite = values[np.isfinite(values)]
    if finite.size < MIN_RESAMPLES:
        return float("nan"), float("nan")
    lo, hi = np.percentile(finite, [2.5, 97.5])
    return float(lo), float(hi)


def resampled_sums(counts, *arrays):
    """Each of ``arrays`` (one value per unit) summed over every resample of ``counts``: arrays
    (n_boot,), in chunks (the counts matrix is never copied whole)."""
    out = [np.empty(counts.shape[0]) for _ in arrays]
    values = [np.asarray(a, dtype=np.float64) for a in arrays]
    for begin in range(0, counts.shape[0], _CHUNK):
        w = counts[begin : begin + _CHUNK].astype(np.float64)
        for o, v in zip(out, values, strict=True):
            o[begin : begin + len(w)] = w @ v
    return out


def ratio_interval(num, den, counts):
    """(sum num / sum den, and the percentile bootstrap 95% interval of that ratio under
    ``counts`` (``resample_counts``, or None: no interval, NaN)). The ratio is NaN when den sums
    to 0; an infinite ratio has itself for both ends."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    return ratio_intervals([(num, den)], counts)[0]


def ratio_intervals(pairs, counts) -> list:
    """``[ratio_interval(num, den, counts) for num, den in pairs]`` in one pass: every pair's
    resampled sums from one matrix product per chunk of ``counts`` and the percentiles of all
    pairs whose resampled ratios are all finite in one call (the others one by one, as
    ``percentile_interval`` does). The same values as pair by pair, to the rounding of the sums."""
    pairs = [(np.asarray(n, dtype=np.float64), np.asarray(d, dtype=np.float64)) for n, d in pairs]
    out, wanted = [], []
    for i, (num, den) in enumerate(pairs):
        if den.sum() == 0:
            out.append((float("nan"), float("nan"), float("nan")))
            continue
        value = float(num.sum() / den.sum())
        out.append((value, value, value) if not np.isfinite(value) else (value, float("nan"), float("nan")))
        if np.isfinite(value) and counts is not None:
            if counts.shape[1] != num.size or den.size != num.size:
                raise ValueError(f"counts cover {counts.shape[1]} units, the values {num.size}")
            wanted.append(i)
    if not wanted:
        return out
    stacked = np.stack([pairs[i][j] for i in wanted for j in (0, 1)], axis=1)  # (units, 2 k)
    sums = np.empty((counts.shape[0], stacked.shape[1]))
    for begin in range(0, counts.shape[0], _CHUNK):
        w = counts[begin : begin + _CHUNK].astype(np.float64)
        sums[begin : begin + len(w)] = w @ stacked
    with np.errstate(divide="ignore", invalid="ignore"):  # a resample whose denominator is 0
        ratios = sums[:, 0::2] / sums[:, 1::2]
    clean = np.isfinite(ratios).all(axis=0)
    if clean.any() and ratios.shape[0] >= MIN_RESAMPLES:
        lo, hi = np.percentile(ratios[:, clean], [2.5, 97.5], axis=0)
        for col, (a, b) in zip(np.flatnonzero(clean), zip(lo, hi, strict=True), strict=True):
            out[wanted[col]] = (out[wanted[col]][0], float(a), float(b))
    for col in np.flatnonzero(~clean | (ratios.shape[0] < MIN_RESAMPLES)):
        out[wanted[col]] = (out[wanted[col]][0], *percentile_interval(ratios[:, col]))
    return out
