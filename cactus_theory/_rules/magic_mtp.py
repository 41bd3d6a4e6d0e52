"""MagicMTP: vllm-ascend's first block verification (PRs 4443, 5542): the last place whose
block weight beats the product of the uniforms drawn so far. Not lossless (decided exactly here:
``sequence_tv``); vllm-ascend PRs 7807 / 7808 replaced it with Sun et al.'s rule (``block``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._math._validation import seeded_rng
from ._helpers import (
    NUMPY,
    SpSOneDraft,
    block_inputs,
    emitted_drift,
    enumerated_block_survival,
    inverse_cdf_draws,
    residual,
)
from ._protocol import BlockLaw, Rule
from .block import drafted_ratios, lindley_weights

__all__ = ["MagicMTP"]

#: The newest Monte Carlo samples per rule (``MagicMTP._monte_carlo``).
_MC_CACHE: dict = {}

RECOVERIES = ("block", "residual")


def _weights(px, qx):
    """w_0 = 1, w_j = min(w_{j-1} q_j(x_j) / p_j(x_j), 1), shape (..., m + 1) (p(x) = 0: ratio 1
    if q(x) > 0, else 0)."""
    return lindley_weights(drafted_ratios(px, qx))


def _poisson_step(state, delta, cap):
    """The count law of a rate-1 Poisson process after ``delta`` more time, counts capped at ``cap``
    (state (B, cap + 1), delta (B,))."""
    out = np.zeros_like(state)
    log_delta = np.log(np.where(delta > 0, delta, 1.0))
    for d in range(cap + 1):
        weight = np.where(delta > 0, np.exp(d * log_delta - delta - math.lgamma(d + 1)), 1.0 if d == 0 else 0.0)
        out[:, d:] += state[:, : cap + 1 - d] * weight[:, None]
    out[:, cap] += np.maximum(state.sum(-1) - out.sum(-1), 0.0)  # what passed the cap stays there
    return out


def _tau_law(w, can_pass):
    """P(tau = k), k = 0..m, of tau = max{j : w_j >= u_1 ... u_j} (0 if none) for weights w
    (B, m + 1) and slots that may pass at all (B, m), exactly. With S_j = -log(u_1 ... u_j), the
    j-th arrival of a rate-1 Poisson process N, slot j passes iff N(c_j) <= j - 1 at c_j = -log w_j;
    so P(tau <= k) = P(N(c_j) >= j for every j > k), a pass over the constraint times in order."""
    rows, m = can_pass.shape
    with np.errstate(divide="ignore"):
        c = np.where(can_pass & (w[:, 1:] > 0), -np.log(np.where(w[:, 1:] > 0, w[:, 1:], 1.0)), np.inf)
    level = np.arange(1, m + 1)
    below = np.zeros((rows, m + 1))  # below[:, k] = P(tau <= k)
    below[:, m] = 1.0
    for k in range(m - 1, -1, -1):
        times = c[:, k:]
        need = np.broadcast_to(level[k:], times.shape)
        order = np.argsort(times, axis=1, kind="stable")
        times = np.take_along_axis(times, order, 1)
        need = np.take_along_axis(need, order, 1)
        state = np.zeros((rows, m + 1))
        state[:, 0] = 1.0
        now = np.zeros(rows)
        for i in range(times.shape[1]):
            finite = np.isfinite(times[:, i])  # an infinite time is no constraint (the slot never passes)
            step = np.where(finite, times[:, i] - now, 0.0)
            state = _poisson_step(state, step, m)
            now = np.where(finite, times[:, i], now)
            low = np.arange(m + 1)[None, :] < np.where(finite, need[:, i], 0)[:, None]
            state[low] = 0.0
        below[:, k] = state.sum(-1)
    law = np.diff(np.concatenate([np.zeros((rows, 1)), below], axis=1), axis=1)
    return np.clip(law, 0.0, 1.0)


@dataclass(frozen=True)
class MagicMTP(SpSOneDraft, Rule):
    """MagicMTP (vllm-ascend's block verify before PRs 7807 / 7808): with block weights w_0 = 1,
    w_j = min(w_{j-1} q_j(x_j) / p_j(x_j), 1) and one uniform u_j per slot, slot j passes when
    p_j(x_j) > 0 and w_j >= u_1 u_2 ... u_j; tau is the last slot that passes (0 if none). It emits
    x_1..x_tau and then, after a rejection, a token from ``recovery``: "block", norm((w_tau q - p)+)
    at tau + 1 (Sun et al.'s residual, vllm-ascend's ``BLOCK_VERIFY`` recovery), or "residual", the
    native norm((q - p)+); the verifier's bonus after m.

    Not lossless: the product of uniforms is not Sun et al.'s h_j = Z_{j+1} / (Z_{j+1} + 1 - w_j),
    so the emitted sequence leaves the verifier's law (``sequence_tv`` gives the exact total
    variation on small vocabularies; the tests show cases above 0.01). ``block_law`` is exact
    (the uniforms' products are the arrival times of a Poisson process); accepted lengths and the
    per-slot drift on traces are Monte Carlo over drafted blocks and uniforms, seeded, with their
    standard error. A block of one draft is SpS.
    """

    recovery: str = "block"
    name: ClassVar[str] = "magic-mtp"
    kind: ClassVar[str] = "block"
    reference: ClassVar[str] = (
        "vllm-ascend PRs 4443 / 5542 (MagicMTP, rejection_random_sample_block_verify_kernel); replaced by Sun et "
        "al.'s block verification in PRs 7807 / 7808"
    )
    table: ClassVar[dict] = {
        "acceptance": "τ = last j with w_j ≥ u_1⋯u_j",
        "correction": "norm((w_τ q − p)+) at τ + 1 (recovery=block) or norm((q − p)+)",
        "emitted": "not q (exact TV on small vocabularies)",
        "lossless": "no",
    }
    #: not in the every-rule grid: its analysis is Monte Carlo (about 8 s on the embedded trace at m = 4, 8, 20);
    #: ``experiments/engine_rules.py`` compares it
    comparison: ClassVar[tuple] = ()
    examples: ClassVar[tuple] = ({"recovery": "residual"},)
    same_law_as: ClassVar[tuple] = ("sps", "block", "fly")

    def __post_init__(self):
        if self.recovery not in RECOVERIES:
            raise ValueError(f"magic-mtp recovery must be one of {', '.join(RECOVERIES)}; got {self.recovery!r}")

    # -- the block ------------------------------------------------------------------------------
    def _recovered(self, w, p, q):
        """The law after tau = i accepted drafts, i < m, per row: (..., m, V)."""
        if self.recovery == "residual":
            return residual(NUMPY, q, p)
        return residual(NUMPY, w[..., :-1, None] * q, p)

    def block_law(self, draft_probs, target_probs, drafted_tokens, *, logits=None) -> BlockLaw:
        """The exact law of tau and of the token emitted after it, given the drafts, float64."""
        p, q, tokens, _ = block_inputs(self, draft_probs, target_probs, drafted_tokens, logits)
        m = tokens.shape[-1]
        px = np.take_along_axis(p, tokens[..., None], -1)[..., 0]
        qx = np.take_along_axis(q[..., :m, :], tokens[..., None], -1)[..., 0]
        w = _weights(px, qx)
        flat = _tau_law(w.reshape(-1, m + 1), (px > 0).reshape(-1, m))
        emitted = np.concatenate([self._recovered(w, p, q[..., :m, :]), q[..., m:, :]], axis=-2)
        return BlockLaw(accepted=flat.reshape(*tokens.shape[:-1], m + 1), emitted=emitted)

    #: Block starts sampled at once (memory: starts x paths x m floats per array).
    CHUNK: ClassVar[int] = 32

    def _monte_carlo(self, p, q, ms, n_paths, seed):
        """{m: (E[tau], its standard error, KL sums, TV sums)} per block start of rows (T, V), from
        seeded drafted tokens and uniforms drawn once per position and path and shared by every
        start and m that covers it (each start's estimate is unbiased; starts are correlated).
        Cached for the last few inputs (``expected_block_lengths_for`` and ``block_drift_for``
        read the same samples)."""
        import hashlib

        key = (hashlib.blake2b(p.tobytes() + q.tobytes(), digest_size=16).digest(), p.shape, tuple(ms), n_paths, seed)
        cache = _MC_CACHE.setdefault(self, {})
        if key in cache:
            return cache[key]
        rng = seeded_rng(seed)
        positions = p.shape[0]
        top = max(ms)
        drawn = inverse_cdf_draws(rng, p, n_paths)
        rows = np.arange(positions)[:, None]
        r_px, r_qx = p[rows, drawn], q[rows, drawn]
        log_u = np.log(rng.random((positions, n_paths)))
        prefix = np.concatenate([np.zeros((1, n_paths)), np.cumsum(log_u, 0)])  # sums of log u over positions
        rest = residual(NUMPY, q, p)
        found = {
            m: (
                np.zeros(positions - m + 1),
                np.zeros(positions - m + 1),
                np.zeros(positions - m + 1),
                np.zeros(positions - m + 1),
                np.zeros((positions - m + 1, m)),
            )
            for m in ms
        }
        for first in range(0, positions - min(ms) + 1, self.CHUNK):
            block = np.arange(first, min(first + self.CHUNK, positions - min(ms) + 1))
            index = np.minimum(block[:, None] + np.arange(top)[None, :], positions - 1)  # (B, top)
            valid = (block[:, None] + np.arange(top)[None, :]) < positions
            px = np.moveaxis(r_px[index], 1, 2)  # (B, n, top)
            qx = np.moveaxis(r_qx[index], 1, 2)
            tokens = np.moveaxis(drawn[index], 1, 2)
            w = _weights(px, qx)
            sums = np.moveaxis(prefix[index + 1] - prefix[block][:, None, :], 1, 2)  # log(u_1 ... u_j) per window
            with np.errstate(divide="ignore"):
                passes = (px > 0) & valid[:, None, :] & (np.log(np.where(w[..., 1:] > 0, w[..., 1:], 0.0)) >= sums)
            for m in ms:
                keep = block < positions - m + 1
                if not keep.any():
                    continue
                sel = block[keep]
                hit = passes[keep][..., :m]
                tau = np.where(hit.any(-1), m - np.argmax(hit[..., ::-1], -1), 0)  # (b, n)
                mean, error, kl, tv, survival = found[m]
                mean[sel] = tau.mean(-1)
                survival[sel] = (tau[..., None] > np.arange(m)[None, None, :]).mean(1)  # P(tau >= j + 1)
                error[sel] = tau.std(-1, ddof=1) / np.sqrt(n_paths)
                kl[sel], tv[sel] = self._drift(tau, tokens[keep], w[keep], p, q, rest, sel, m, n_paths)
        cache.clear()  # keep the newest only: the analysis asks twice for the same rows
        cache[key] = found
        return found

    def _drift(self, tau, tokens, w, p, q, rest, sel, m, n_paths):
        """KL and TV sums over the slots of the blocks started at ``sel`` (see ``block_drift_for``)."""
        b, vocab = sel.size, p.shape[-1]
        kl, tv = np.zeros(b), np.zeros(b)
        for j in range(m):
            rows = sel + j
            passed = tau > j
            cell = np.arange(b)[:, None] * vocab + tokens[..., j]
            law = np.bincount(cell[passed], minlength=b * vocab).reshape(b, vocab).astype(np.float64)
            stop = tau == j
            if self.recovery == "residual":
                law += stop.sum(-1)[:, None] * rest[rows]
            else:
                stop_s, stop_n = np.nonzero(stop)
                if stop_s.size:  # the recovered law depends on the weight: one row per (start, weight)
                    weight = w[stop_s, stop_n, j]
                    order = np.lexsort((weight, stop_s))
                    s_sorted, w_sorted = stop_s[order], weight[order]
                    head = np.concatenate([[True], (np.diff(s_sorted) != 0) | (np.diff(w_sorted) != 0)])
                    owner, value = s_sorted[head], w_sorted[head]
                    count = np.diff(np.concatenate([np.flatnonzero(head), [head.size]]))
                    rec = residual(NUMPY, value[:, None] * q[rows[owner]], p[rows[owner]])
                    np.add.at(law, owner, count[:, None] * rec)
            reached = (tau >= j).sum(-1)
            slot_kl, slot_tv = emitted_drift(law, reached, q[rows], reached / n_paths)
            kl += slot_kl
            tv += slot_tv
        return kl, tv

    def expected_block_lengths_for(self, p, q, ms, *, method="auto", n_paths=1024, seed=0, max_support=1_000_000):
        """{m: (method, E[tau] per block start, standard errors)} on validated float64 rows (T, V),
        under independent positions. ``"monte-carlo"`` (and ``"auto"``): ``n_paths`` seeded drafted
        blocks and uniforms per start. ``"exact"``: every drafted block of a start enumerated
        (at most ``max_support`` of them, else an error), each with its exact law of tau
        (``block_law``): small vocabularies only (the law of tau needs the whole weight path)."""
        found = self.block_survival_for(p, q, ms, method=method, n_paths=n_paths, seed=seed, max_support=max_support)
        return {m: found[m][:3] for m in ms}

    def block_survival_for(self, p, q, ms, *, method="auto", n_paths=1024, seed=0, max_support=1_000_000):
        """{m: (method, E[tau], standard errors, P(tau >= j) per start (starts, m))}: the accepted
        length's law per block start, from the same samples as ``expected_block_lengths_for`` (or,
        ``"exact"``, every block enumerated)."""
        out = {}
        for m in ms:
            if method == "exact":
                survival = enumerated_block_survival(self, p, q, m, max_support)
                out[m] = ("exact", survival.sum(-1), np.zeros(survival.shape[0]), survival)
                continue
            mean, error, _, _, survival = self._monte_carlo(p, q, tuple(ms), n_paths, seed)[m]
            out[m] = ("monte-carlo", mean, error, survival)
        return out

    def block_drift_for(self, p, q, ms, *, n_paths=1024, seed=0):
        """{m: (KL sums, TV sums)} per block start: for each slot j < m, P(tau >= j) times KL / TV
        of the law of the token emitted at slot j against q there, from the same seeded samples
        as ``expected_block_lengths_for`` (Monte Carlo: the accepted drafts' share is an empirical
        law, plug-in, so the KL is biased up by about (tokens - 1) / (2 n) per slot; the recovered
        token's law enters exactly per sample)."""
        found = self._monte_carlo(p, q, tuple(ms), n_paths, seed)
        return {m: found[m][2:4] for m in ms}
