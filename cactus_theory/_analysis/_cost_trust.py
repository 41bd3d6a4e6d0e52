"""Whether a cost model's timings can be trusted: how much each part's repeats spread, blocks timed out
of order beyond their noise, a machine busy while it was timed (``CostModel.spread``, ``monotonicity``,
``notes``, ``problems`` ask here)."""

from __future__ import annotations

import numpy as np

from ._cost_fields import _relative_spread

__all__ = [
    "BUSY_LOAD",
    "NOISY_SPREAD",
    "NON_MONOTONE_DROP",
    "timing_monotonicity",
    "timing_notes",
    "timing_problems",
    "timing_spread",
]

#: A calibration is flagged when a repeated timing spreads more than this (relative MAD), ...
NOISY_SPREAD = 0.15
#: ... when a bigger verifier block is timed this much below a smaller one (beyond the noise),
NON_MONOTONE_DROP = 0.05
#: ... or when other processes kept more than this share of the machine's cores busy while it ran.
BUSY_LOAD = 0.25


def timing_spread(cost) -> dict:
    """Relative spread (median absolute deviation / median) of each timed part's repeats."""
    out = {}
    if "draft_token" in cost.samples:
        out["draft_token"] = _relative_spread(cost.samples["draft_token"])
    for k, values in cost.samples.get("verify_block", {}).items():
        out[f"verify_block[{k}]"] = _relative_spread(values)
    for model, per in cost.samples.get("prefill", {}).items():
        for length, values in per.items():
            out[f"prefill[{model}][{length}]"] = _relative_spread(values)
    return out


def _beyond_noise(cost, small, big) -> bool:
    """Whether the bigger block ``big`` timed below the smaller ``small`` beyond the timings' own
    noise: with repeats, every repeat of ``big`` below every repeat of ``small`` (the two sets
    do not overlap); without, a drop of more than ``NON_MONOTONE_DROP``."""
    repeats = cost.samples.get("verify_block", {})
    if small in repeats and big in repeats:
        return max(repeats[big]) < min(repeats[small])
    return cost.verify_block[big] < cost.verify_block[small] * (1 - NON_MONOTONE_DROP)


def timing_monotonicity(cost) -> tuple:
    """(block sizes timed below a smaller block within the repeats' noise, those beyond it): the
    isotonic fit (``verify_fit``) pools both; only the second make a problem (``problems``)."""
    within, beyond = [], []
    best_k, best_t = None, -np.inf
    for k, t in cost.verify_block.items():
        if best_k is not None and t < best_t:
            (beyond if _beyond_noise(cost, best_k, k) else within).append((k, best_k))
        if t > best_t:
            best_k, best_t = k, t
    return within, beyond


def timing_notes(cost) -> list:
    """What a reader of a plan should know about the timings that is not a problem: blocks timed
    slightly out of order, within their repeats' noise (the isotonic fit pools them)."""
    within, _ = timing_monotonicity(cost)
    if not within:
        return []
    pairs = ", ".join(f"{k} below {k0}" for k, k0 in within[:4]) + (" and more" if len(within) > 4 else "")
    return [
        f"verifier blocks timed out of order within the repeats' noise ({pairs} tokens): the model uses the "
        "non-decreasing (isotonic) fit of the timings"
    ]


def timing_problems(cost) -> list:
    """Why this cost model's predictions may not hold, in words (empty: none found): a bigger
    verifier block timed below a smaller one beyond the repeats' noise (``monotonicity``),
    repeats spreading more than ``NOISY_SPREAD``, a machine busier than ``BUSY_LOAD`` per core
    while it was timed."""
    found = []
    spread = timing_spread(cost)
    for k, k0 in timing_monotonicity(cost)[1]:
        t, t0 = cost.verify_block[k], cost.verify_block[k0]
        found.append(
            f"non-monotone: a verifier block of {k} tokens timed {t:.4g} s, {1 - t / t0:.0%} below the block of "
            f"{k0} ({t0:.4g} s), beyond the repeats' noise; the model uses the isotonic fit, but the timing is "
            "suspect"
        )
    noisy = [f"{name} ({value:.0%})" for name, value in spread.items() if value > NOISY_SPREAD]
    if noisy:
        found.append(
            f"noisy: repeats spread more than {NOISY_SPREAD:.0%} (median absolute deviation / median) "
            f"for {', '.join(noisy[:6])}{' and more' if len(noisy) > 6 else ''}"
        )
    if cost.load.get("other", 0.0) > BUSY_LOAD:
        found.append(
            f"busy machine: other processes kept {cost.load['other']:.0%} of the cores busy while it was timed "
            f"(above {BUSY_LOAD:.0%}); rerun the calibration on an idle machine"
        )
    return found
