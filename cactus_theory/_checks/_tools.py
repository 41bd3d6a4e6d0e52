"""What the conformance checks (``testing``) are made of: random cases of raw logits processed with
random sampling settings (``make_case``), position-dependent rows, and the comparisons that fail
naming the check, the value and the input (``_close``, ``_true``; NaN never passes)."""

from __future__ import annotations

import importlib.util

import numpy as np

from .._math._logits import RuleLogits
from .._math._sampling import SamplingSettings, processed_probs

__all__ = ["make_case"]


def make_case(seed: int, vocab: int, batch=()):
    """(draft_probs, target_probs, RuleLogits): Gaussian raw logits of both models processed with
    random sampling settings (temperature 0.6 / 1 / 1.7, top-k off / 1 / V/2 / V, top-p 1 /
    0.9 / 0.6), a tie at the verifier's maximum one time in five. Deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    shape = (*batch, vocab)
    scale = rng.choice([0.5, 2.0, 6.0])
    zq = rng.normal(size=shape) * scale
    zp = zq * rng.uniform(0, 1) + rng.normal(size=shape) * scale
    if rng.random() < 0.2:
        zq[..., 1] = zq.max(axis=-1)
    settings = SamplingSettings(
        temperature=float(rng.choice([0.6, 1.0, 1.7])),
        top_k=int(rng.choice([0, 1, max(1, vocab // 2), vocab])),
        top_p=float(rng.choice([1.0, 0.9, 0.6])),
    )
    p, q = processed_probs(zp, settings), processed_probs(zq, settings)
    return p, q, RuleLogits(target=zq, draft=zp, temperature=settings.temperature)


class _Failed(AssertionError):
    """A check failed on one input (the message says where)."""


def _describe_input(**arrays) -> str:
    with np.printoptions(precision=6, suppress=True, threshold=64, linewidth=200):
        return "; ".join(f"{k} = {np.asarray(v)!r}".replace("\n", " ") for k, v in arrays.items())


def _close(actual, desired, what, rtol=1e-10, atol=1e-13, **inputs):
    """``actual`` equals ``desired`` within the tolerances; NaN never equals NaN (a rule whose
    numbers are all NaN fails every comparison)."""
    try:
        np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol, equal_nan=False)
    except AssertionError as exc:
        detail = " ".join(str(exc).split())[:600]
        raise _Failed(f"{what}: {detail}; input {_describe_input(**inputs)}") from None


def _true(condition, what, **inputs):
    if not bool(np.all(condition)):
        raise _Failed(f"{what}; input {_describe_input(**inputs)}")


def _logits_for(rule, lg):
    return lg if rule.needs_logits else None


def _finite_probabilities(values, what, **inputs):
    """Finite and in [0, 1] up to rounding (1e-12): the sanity guard; the checks test precision."""
    arr = np.asarray(values, dtype=np.float64)
    _true(np.all(np.isfinite(arr)), f"{what} is not finite (NaN or inf)", **inputs)
    _true(np.all((arr >= -1e-12) & (arr <= 1 + 1e-12)), f"{what} lies outside [0, 1]", **inputs)


def _chi_square_p_value(counts, probs, min_expected=5.0):
    """Pooled chi-square goodness of fit over positions (cells expecting < 5 lumped together);
    None when no position has 100 draws."""
    from scipy import stats

    stat, dof = 0.0, 0
    for obs, pr in zip(counts, probs, strict=True):
        total = obs.sum()
        if total < 100:
            continue
        expected = total * pr
        big = expected >= min_expected
        o = np.append(obs[big], obs[~big].sum())
        e = np.append(expected[big], expected[~big].sum())
        keep = e > 0
        if np.any(o[~keep] > 0):
            return 0.0  # a token of exact probability 0 was emitted
        o, e = o[keep], e[keep]
        stat += np.sum((o - e) ** 2 / e)
        dof += len(o) - 1
    return stats.chi2.sf(stat, max(dof, 1))


def _torch():
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch


def _position_rows(seed, positions, vocab):
    """Position-dependent (p, q) rows with exact zeros and a one-hot row: a context-free world."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, 0.6), size=positions)
    q = rng.dirichlet(np.full(vocab, 0.6), size=positions)
    p[rng.random(p.shape) < 0.15] = 0.0
    q[rng.random(q.shape) < 0.15] = 0.0
    p[:, 0] += 1e-3 * (p.sum(-1) == 0)
    q[:, 1] += 1e-3 * (q.sum(-1) == 0)
    q[positions // 2] = np.eye(vocab)[rng.integers(vocab)]
    return p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
