"""Block verification: the whole drafted block judged at once (Sun, Mendlovic, Leviathan, Aharoni,
Beirami, Ro and Suresh, "Block Verification Accelerates Speculative Decoding", ICLR 2025,
arXiv 2403.10444, Algorithm 2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._math._kernels import block_weights_exact
from .._math._validation import seeded_rng
from ._helpers import SpSOneDraft, block_inputs, inverse_cdf_draws
from ._protocol import BlockLaw, Rule

__all__ = ["BlockVerification"]


def drafted_ratios(px, qx):
    """q(x)/p(x) of drafted tokens from their probabilities, with the limit convention for p(x) = 0
    (1 if q(x) > 0, else 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(px > 0, qx / np.where(px > 0, px, 1.0), np.where(qx > 0, 1.0, 0.0))


def lindley_weights(r):
    """The block weights w_0 = 1, w_i = min(w_{i-1} r_i, 1) of ratios r (..., m): (..., m + 1) (the
    joint ratio over its running maximum)."""
    w = np.ones((*r.shape[:-1], r.shape[-1] + 1))
    for i in range(r.shape[-1]):
        w[..., i + 1] = np.minimum(w[..., i] * r[..., i], 1.0)
    return w


def _ratios(p, q, tokens):
    """q(x)/p(x) of the drafted tokens, with the limit convention for p(x) = 0 (1 if q(x) > 0)."""
    qx = np.take_along_axis(q, tokens[..., None], -1)[..., 0]
    px = np.take_along_axis(p, tokens[..., None], -1)[..., 0]
    return drafted_ratios(px, qx)


def block_weights(p, q, tokens):
    """The weights w_0 = 1, w_i = min(w_{i-1} q_i(x_i) / p_i(x_i), 1), shape (..., m + 1)."""
    return lindley_weights(_ratios(p, q[..., : tokens.shape[-1], :], tokens))


def pass_law(w, z, whole):
    """P(tau = i), i = 0..m, of a block whose places 0 < i < m pass with h_i = Z_i / (Z_i + 1 - w_i)
    (1 where the denominator vanishes) and whose whole block passes with ``whole``; tau is the last
    place that passes (place 0 always does). ``w`` (..., m + 1) the weights, ``z`` (..., >= m) the
    residual masses Z_i = sum_x (w_i q_{i+1}(x) - p_{i+1}(x))+ at index i (index 0 not read)."""
    m = w.shape[-1] - 1
    h = np.ones(w.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        denominator = z[..., 1:m] + 1.0 - w[..., 1:m]
        h[..., 1:m] = np.where(denominator > 0, z[..., 1:m] / np.where(denominator > 0, denominator, 1.0), 1.0)
    h[..., m] = whole
    after = np.ones(w.shape)  # P(tau = i) = h_i prod_{j > i} (1 - h_j)
    for i in range(m - 1, -1, -1):
        after[..., i] = after[..., i + 1] * (1.0 - h[..., i + 1])
    return h * after


def residual_block(p, q, w):
    """(Z (..., m), the law emitted after i accepted drafts (..., m + 1, V)): the residual
    norm((w_i q_{i+1} - p_{i+1})+) after i < m (q there where it has no mass), the bonus row q_{m+1}
    after m."""
    m = w.shape[-1] - 1
    excess = np.maximum(w[..., :m, None] * q[..., :m, :] - p, 0.0)  # row i: after i accepted drafts
    z = excess.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        corrections = np.where(z[..., None] > 0, excess / np.where(z > 0, z, 1.0)[..., None], q[..., :m, :])
    return z, np.concatenate([corrections, q[..., m:, :]], axis=-2)


def _exact_expected_weights(p, q, m, max_support):
    """[E w_1, ..., E w_j] for one block start (rows (m, V)) by enumerating the weights' law, equal
    weights merged (most are 1: min(w r, 1)); j = m, or fewer where the law of w_{j+1} would hold
    more than ``max_support`` values (the caller takes Monte Carlo from there)."""
    weights, probs = np.ones(1), np.ones(1)
    out = []
    for i in range(m):
        support = np.flatnonzero(p[i] > 0)
        if weights.size * support.size > max_support:
            break
        ps = p[i, support]
        with np.errstate(divide="ignore", invalid="ignore"):
            r = q[i, support] / ps
        values = np.minimum(weights[:, None] * r[None, :], 1.0).ravel()
        mass = (probs[:, None] * ps[None, :]).ravel()
        weights, inverse = np.unique(values, return_inverse=True)
        probs = np.bincount(inverse, weights=mass, minlength=weights.size)
        out.append(float(weights @ probs))
    return out


@dataclass(frozen=True)
class BlockVerification(SpSOneDraft, Rule):
    """Block verification: accept the longest prefix of the drafted block that a joint coupling
    of the whole block allows (lossless, and never below token-wise SpS in expectation).

    For drafts x_1..x_m with weights w_0 = 1, w_i = min(w_{i-1} q_i(x_i) / p_i(x_i), 1) and
    residual masses Z_{i+1} = sum_x (w_i q_{i+1}(x) - p_{i+1}(x))+, each place i draws one coin
    and passes with h_i = Z_{i+1} / (Z_{i+1} + 1 - w_i) (h_m = w_m); tau is the last place that
    passes (0 if none). It emits x_1..x_tau and then a token from norm((w_tau q_{tau+1} -
    p_{tau+1})+), or the bonus token from q_{m+1} when tau = m. ``block_law`` gives the exact law
    of tau and of that token. A block of one draft is SpS, so the per-token methods
    (``acceptance``, ``correction``, ``emitted`` = q) are SpS's. Lossless: the emitted sequence
    follows the verifier (checked by enumeration in the conformance suite). Under independent
    positions E[tau] = sum_i E[w_i] (checked against the algorithm by enumeration); the
    analysis uses it (``block_accepted_length``). Sun et al., ICLR 2025, Algorithm 2; the bonus
    policy is the verifier's (there is no relaxed bonus for a block rule).
    """

    name: ClassVar[str] = "block"
    reference: ClassVar[str] = (
        'Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro & Suresh, "Block Verification Accelerates Speculative '
        'Decoding", ICLR 2025 (Algorithm 2); vLLM rejection_sample_method="block"'
    )
    table: ClassVar[dict] = {
        "acceptance": "the block's tau: last place i with coin ≤ Z_{i+1} / (Z_{i+1} + 1 − w_i)",
        "correction": "norm((w_τ q − p)+) at τ + 1",
        "emitted": "q (the sequence law)",
        "lossless": "yes",
    }
    comparison: ClassVar[tuple] = (("", {}, "verifier"),)
    lossless: ClassVar[bool] = True
    kind: ClassVar[str] = "block"
    #: one draft at a time it is SpS (the per-token view the conformance checks see)
    same_law_as: ClassVar[tuple] = ("sps",)

    def block_law(self, draft_probs, target_probs, drafted_tokens, *, logits=None) -> BlockLaw:
        """The exact law of tau and of the token emitted after it (Algorithm 2), float64."""
        p, q, tokens, _ = block_inputs(self, draft_probs, target_probs, drafted_tokens, logits)
        w = block_weights(p, q, tokens)  # (..., m + 1)
        z, emitted = residual_block(p, q, w)
        return BlockLaw(accepted=pass_law(w, z, w[..., -1]), emitted=emitted)

    def expected_block_lengths(self, p, q, m, *, method="auto", n_paths=1024, seed=0, max_support=1_000_000):
        """E[tau] of a block of m drafts started at each position of validated float64 rows
        (T, V) whose windows fit (T - m + 1 values), under independent positions, with its
        standard error and the method used: ("exact" or "monte-carlo", values, standard errors).

        ``method="exact"`` enumerates the law of the weights w_i (equal values merged; an error
        when a start needs more than ``max_support`` values); ``"monte-carlo"`` averages
        sum_i w_i over ``n_paths`` drafted paths per start (each the exact E[tau | drafts]
        given the coins, so the only noise is the drafts'; paths are shared between
        overlapping starts, independent across paths); ``"auto"`` is exact when every start
        fits ``max_support``, else Monte Carlo.
        """
        return self.expected_block_lengths_for(
            p, q, (m,), method=method, n_paths=n_paths, seed=seed, max_support=max_support
        )[m]

    def expected_block_lengths_for(self, p, q, ms, *, method="auto", n_paths=1024, seed=0, max_support=1_000_000):
        """``expected_block_lengths`` for several m at once, {m: (method, values, errors)}; the
        Monte Carlo paths are drawn once and serve every m."""
        found = self.block_survival_for(p, q, ms, method=method, n_paths=n_paths, seed=seed, max_support=max_support)
        return {m: found[m][:3] for m in ms}

    def block_survival_for(self, p, q, ms, *, method="auto", n_paths=1024, seed=0, max_support=1_000_000):
        """{m: (method, E[tau] per block start, standard errors, P(tau >= j) per start (starts, m))}:
        the accepted length's law per block start. P(tau >= j) = E[w_j] (the weights' identity; it
        does not depend on m), exact by enumeration or Monte Carlo over ``n_paths`` drafted blocks,
        as ``expected_block_lengths_for``."""
        out, todo = {}, []
        positions = p.shape[0]
        exact = []
        if method in ("auto", "exact"):  # one enumeration per start serves every m (E w_i are cumulative)
            top, first = max(ms), positions - min(ms) + 1
            compiled = block_weights_exact(p, q, first, top, max_support)
            if compiled is not None:
                table, counts = compiled
                exact = [table[t, : counts[t]].tolist() for t in range(first)]
            else:
                exact = [
                    _exact_expected_weights(p[t : t + top], q[t : t + top], min(top, positions - t), max_support)
                    for t in range(first)
                ]
        for m in ms:
            starts = positions - m + 1
            if method in ("auto", "exact"):
                short = next((t for t in range(starts) if len(exact[t]) < m), None)
                if short is None:
                    values = np.array([sum(exact[t][:m]) for t in range(starts)], dtype=np.float64)
                    survival = np.array([exact[t][:m] for t in range(starts)], dtype=np.float64).reshape(starts, m)
                    out[m] = ("exact", values, np.zeros(starts), survival)
                    continue
                if method == "exact":
                    raise ValueError(
                        f"exact block lengths need more than max_support={max_support} weight values at start "
                        f"{short}: use method='monte-carlo'"
                    )
            todo.append(m)
        if todo:
            rng = seeded_rng(seed)
            tokens = inverse_cdf_draws(rng, p, n_paths)  # (T, n_paths)
            rows = np.arange(p.shape[0])[:, None]
            px, qx = p[rows, tokens], q[rows, tokens]
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.where(px > 0, qx / np.where(px > 0, px, 1.0), np.where(qx > 0, 1.0, 0.0))
            for m in todo:
                starts = p.shape[0] - m + 1
                w = np.ones((starts, n_paths))
                total = np.zeros((starts, n_paths))
                survival = np.empty((starts, m))
                for i in range(m):
                    np.minimum(w * r[i : i + starts], 1.0, out=w)
                    total += w
                    survival[:, i] = w.mean(axis=1)
                error = total.std(axis=1, ddof=1) / np.sqrt(n_paths)
                out[m] = ("monte-carlo", total.mean(axis=1), error, survival)
        return out
