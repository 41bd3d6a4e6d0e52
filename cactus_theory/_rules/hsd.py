"""Hierarchical speculative decoding (HSD) for one sampled chain, as the authors' code runs it:
the block weights of Sun et al.'s block verification with the whole block accepted on the
uncapped joint ratio (Zhou et al., "Overcoming Joint Intractability with Lossless Hierarchical
Speculative Decoding", arXiv 2601.05724; ZhouYuxuanYX/Hierarchical-Speculative-Decoding,
``transformers/generation/utils.py`` ``_speculative_sampling(backward=True, clever=True)``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._math._validation import seeded_rng
from ._helpers import (
    SpSOneDraft,
    block_inputs,
    emitted_drift,
    enumerated_block_lengths,
    enumerated_block_survival,
    inverse_cdf_draws,
)
from ._protocol import BlockLaw, Rule
from .block import drafted_ratios, lindley_weights, pass_law, residual_block

__all__ = ["HierarchicalSpeculativeDecoding"]


class _ResidualMass:
    """Z(w) = sum_x (w q(x) - p(x))+ of each row (T, V), for many w in [0, 1] at once: the tokens
    with p(x) < w q(x) are a prefix of the row sorted by p/q, so Z(w) = w q(prefix) - p(prefix),
    the prefix found by one binary search over all rows (each row's ratios, clipped at 2 since w
    <= 1, shifted by 4 per row so that the rows follow each other in one sorted array). A ratio
    within a few ulp of 4 T of w may fall on either side; its term w q(x) - p(x) is then that
    small. One sort per row."""

    def __init__(self, p, q):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf)
        order = np.argsort(ratio, axis=-1, kind="stable")
        sorted_ratio = np.minimum(np.take_along_axis(ratio, order, -1), 2.0)
        self.vocab = p.shape[-1]
        self.keys = (sorted_ratio + 4.0 * np.arange(p.shape[0])[:, None]).ravel()
        zero = np.zeros((p.shape[0], 1))
        self.cq = np.concatenate([zero, np.cumsum(np.take_along_axis(q, order, -1), -1)], -1)
        self.cp = np.concatenate([zero, np.cumsum(np.take_along_axis(p, order, -1), -1)], -1)

    def __call__(self, rows, w):
        """Z at ``rows`` (int array) for weights ``w`` in [0, 1] (same shape)."""
        count = np.searchsorted(self.keys, w + 4.0 * rows, side="left") - rows * self.vocab
        return np.maximum(w * self.cq[rows, count] - self.cp[rows, count], 0.0)


@dataclass(frozen=True)
class HierarchicalSpeculativeDecoding(SpSOneDraft, Rule):
    """HSD on one sampled chain, as its authors' code runs it: with block weights w_0 = 1,
    w_i = min(w_{i-1} q_i(x_i) / p_i(x_i), 1) (the joint ratio over its running maximum) and
    residual masses Z_i = sum_x (w_i q_{i+1}(x) - p_{i+1}(x))+, place i < m passes with
    h_i = Z_i / (Z_i + 1 - w_i) (a "step back" otherwise) and the whole block with the uncapped
    joint ratio, min(1, prod_i q_i(x_i) / p_i(x_i)); tau is m if the block passes, else the last
    place that does. It emits x_1..x_tau, then a token from norm((w_tau q - p)+) at tau + 1, or
    the verifier's bonus token after m.

    The places 0 < i < m pass exactly as in Sun et al.'s block verification (``block``); only the
    whole block differs (``block`` accepts it with w_m <= min(1, prod q/p)). So HSD accepts at
    least as much as ``block`` everywhere, and equals it when the joint ratio never rises above 1
    on the way (greedy drafting: one-hot p, as in the authors' EAGLE-3 integration). **Not
    lossless** as written: decided exactly by enumerating every path on small vocabularies
    (``cactus_theory.testing.sequence_tv``: total variation up to 0.14 from the verifier's law
    of two tokens on three-token vocabularies; the tests keep cases). ``block_law`` is exact; on
    traces the accepted length and the per-slot drift are Monte Carlo over drafted blocks with
    each block's exact law (standard errors given). Zhou et al., arXiv 2601.05724; the authors'
    ``_speculative_sampling(backward=True, clever=True)`` with one draft.
    """

    name: ClassVar[str] = "hsd"
    kind: ClassVar[str] = "block"
    reference: ClassVar[str] = (
        'Zhou et al., "Overcoming Joint Intractability with Lossless Hierarchical Speculative Decoding", arXiv '
        "2601.05724; ZhouYuxuanYX/Hierarchical-Speculative-Decoding (transformers/generation/utils.py, "
        "_speculative_sampling, backward=True, clever=True, one draft)"
    )
    table: ClassVar[dict] = {
        "acceptance": "block verification's places, the whole block with min(1, Π q/p) (uncapped)",
        "correction": "norm((w_τ q − p)+) at τ + 1",
        "emitted": "not q (exact TV on small vocabularies)",
        "lossless": "no (as the authors' code runs it)",
    }
    #: not in the every-rule grid: its analysis is Monte Carlo; ``experiments/sequence_rules.py`` compares it
    comparison: ClassVar[tuple] = ()
    lossless: ClassVar[bool] = False
    #: one draft at a time it is SpS; under greedy drafting it is block verification
    same_law_as: ClassVar[tuple] = ("sps", "block", "fly", "magic-mtp", "traversal", "entropy-verify")

    def block_law(self, draft_probs, target_probs, drafted_tokens, *, logits=None) -> BlockLaw:
        """The exact law of tau and of the token emitted after it, given the drafts, float64."""
        p, q, tokens, _ = block_inputs(self, draft_probs, target_probs, drafted_tokens, logits)
        m = tokens.shape[-1]
        px = np.take_along_axis(p, tokens[..., None], -1)[..., 0]
        qx = np.take_along_axis(q[..., :m, :], tokens[..., None], -1)[..., 0]
        r = drafted_ratios(px, qx)
        w = lindley_weights(r)
        z, emitted = residual_block(p, q, w)
        return BlockLaw(accepted=pass_law(w, z, np.minimum(np.prod(r, axis=-1), 1.0)), emitted=emitted)

    # -- on traces ------------------------------------------------------------------------------
    def _paths(self, p, q, n_paths, seed):
        """Drafted tokens (T, n) shared by every start and m, their ratios, and Z's lookup."""
        rng = seeded_rng(seed)
        drawn = inverse_cdf_draws(rng, p, n_paths)
        rows = np.arange(p.shape[0])[:, None]
        return drawn, drafted_ratios(p[rows, drawn], q[rows, drawn]), _ResidualMass(p, q)

    def _window(self, r, mass, m):
        """Per start and path (starts, n): the weights w (.., m + 1) and P(tau = i | drafts) (.., m + 1)."""
        starts = r.shape[0] - m + 1
        index = np.arange(starts)[:, None] + np.arange(m)[None, :]
        ratios = np.moveaxis(r[index], 1, 2)  # (starts, n, m)
        w = lindley_weights(ratios)
        z = np.zeros(w.shape)
        for i in range(1, m):  # Z_i at position start + i with w_i
            rows = np.broadcast_to((np.arange(starts) + i)[:, None], w.shape[:2])
            z[..., i] = mass(rows, w[..., i])
        return w, pass_law(w, z, np.minimum(np.prod(ratios, axis=-1), 1.0))

    def expected_block_lengths_for(self, p, q, ms, *, method="auto", n_paths=1024, seed=0, max_support=1_000_000):
        """{m: (method, E[tau] per block start, standard errors)} on validated float64 rows (T, V),
        under independent positions. ``"monte-carlo"`` (and ``"auto"``): ``n_paths`` seeded drafted
        blocks per start (shared between overlapping starts), each contributing its exact
        E[tau | drafts]. ``"exact"``: every drafted block of a start enumerated (at most
        ``max_support``), each with its exact law (``block_law``): small vocabularies only."""
        if method == "exact":
            return {
                m: ("exact", enumerated_block_lengths(self, p, q, m, max_support), np.zeros(p.shape[0] - m + 1))
                for m in ms
            }
        found = self.block_survival_for(p, q, ms, method=method, n_paths=n_paths, seed=seed, max_support=max_support)
        return {m: found[m][:3] for m in ms}

    def block_survival_for(self, p, q, ms, *, method="auto", n_paths=1024, seed=0, max_support=1_000_000):
        """{m: (method, E[tau], standard errors, P(tau >= j) per start (starts, m))}: the accepted
        length's law per block start, from the same seeded drafted blocks as
        ``expected_block_lengths_for`` (or, ``"exact"``, every block enumerated)."""
        if method == "exact":
            out = {}
            for m in ms:
                survival = enumerated_block_survival(self, p, q, m, max_support)
                out[m] = ("exact", survival.sum(-1), np.zeros(survival.shape[0]), survival)
            return out
        found = self._monte_carlo(p, q, tuple(ms), n_paths, seed)
        return {m: ("monte-carlo", found[m][0], found[m][1], found[m][4]) for m in ms}

    def block_drift_for(self, p, q, ms, *, n_paths=1024, seed=0):
        """{m: (KL sums, TV sums)} per block start: for each slot j < m, P(tau >= j) times KL / TV
        of the law of the token emitted at slot j against q there, from the same seeded drafted
        blocks as ``expected_block_lengths_for`` (Monte Carlo: each block enters with its exact
        chances of passing and stopping at j; the accepted drafts' share is an empirical law,
        plug-in, so the KL is biased up by about (tokens - 1) / (2 n) per slot; the residual
        norm((w q - p)+) of every block enters exactly, summed over the blocks' weights in one
        sorted pass per slot)."""
        found = self._monte_carlo(p, q, tuple(ms), n_paths, seed)
        return {m: found[m][2:4] for m in ms}

    def _monte_carlo(self, p, q, ms, n_paths, seed):
        """{m: (E[tau], its standard error, KL sums, TV sums)} per block start of rows (T, V), from
        one set of seeded drafted blocks; the newest inputs' kept (the analysis asks for the
        lengths and then the drift of the same rows)."""
        import hashlib

        key = (hashlib.blake2b(p.tobytes() + q.tobytes(), digest_size=16).digest(), p.shape, ms, n_paths, seed)
        if key in _MC_CACHE:
            return _MC_CACHE[key]
        drawn, r, mass = self._paths(p, q, n_paths, seed)
        vocab = p.shape[-1]
        out = {}
        for m in ms:
            w, law = self._window(r, mass, m)
            values = law @ np.arange(m + 1, dtype=np.float64)  # E[tau | drafts], (starts, n)
            starts = law.shape[0]
            stop = law[..., :m]  # P(tau = j | drafts)
            beyond = np.flip(np.cumsum(np.flip(law, -1), -1), -1)  # P(tau >= j | drafts)
            # every slot of every start at once: row (start, j) is position start + j
            rows = (np.arange(starts)[:, None] + np.arange(m)[None, :]).ravel()
            passed, weights = _by_slot(beyond[..., 1 : m + 1]), _by_slot(w[..., :m])
            cell = np.arange(starts * m)[:, None] * vocab + drawn[rows]
            emitted = np.bincount(cell.ravel(), weights=passed.ravel(), minlength=starts * m * vocab)
            recovered = _residual_sum(p[rows], q[rows], weights, _by_slot(stop), mass, rows)
            emitted = emitted.reshape(starts * m, vocab) + recovered
            reached = _by_slot(beyond[..., :m]).sum(-1)
            slot_kl, slot_tv = emitted_drift(emitted, reached, q[rows], reached / n_paths, renormalise=True)
            kl, tv = slot_kl.reshape(starts, m).sum(-1), slot_tv.reshape(starts, m).sum(-1)
            out[m] = (values.mean(-1), values.std(-1, ddof=1) / np.sqrt(n_paths), kl, tv, beyond[..., 1:].mean(1))
        _MC_CACHE.clear()
        _MC_CACHE[key] = out
        return out


def _by_slot(values):
    """(starts, n, m) per start, path and slot as rows (starts m, n): row (start, j)."""
    starts, n, m = values.shape
    return np.moveaxis(values, -1, 1).reshape(starts * m, n)


#: The newest inputs' Monte Carlo (``HierarchicalSpeculativeDecoding._monte_carlo``).
_MC_CACHE: dict = {}


def _residual_sum(p, q, w, weight, mass, rows):
    """sum_n weight_n norm((w_n q - p)+) per row: rows p, q (S, V) (``rows`` their indices in
    ``mass``, the rows' ``_ResidualMass``), weights w in [0, 1] and ``weight`` (S, n). Token x is in
    the residual of w iff p(x) < w q(x); with the blocks sorted by w, the sum at x is
    q(x) A(w > t_x) - p(x) B(w > t_x), t_x = p(x) / q(x), A and B suffix sums of weight w / Z(w)
    and weight / Z(w). A block whose residual has no mass (w q <= p everywhere) emits q there."""
    count, n = p.shape[0], w.shape[-1]
    order = np.argsort(w, axis=-1)
    ws = np.take_along_axis(w, order, -1)
    weights = np.take_along_axis(weight, order, -1)
    zs = mass(np.broadcast_to(rows[:, None], ws.shape), ws)
    empty = zs <= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(empty, 0.0, weights * ws / np.where(empty, 1.0, zs))
        b = np.where(empty, 0.0, weights / np.where(empty, 1.0, zs))
    zero = np.zeros((count, 1))
    suffix_a = np.concatenate([np.flip(np.cumsum(np.flip(a, -1), -1), -1), zero], -1)
    suffix_b = np.concatenate([np.flip(np.cumsum(np.flip(b, -1), -1), -1), zero], -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        threshold = np.minimum(np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf), 2.0)  # (S, V)
    shift = 4.0 * np.arange(count)[:, None]
    first = np.searchsorted((ws + shift).ravel(), (threshold + shift).ravel(), side="right").reshape(threshold.shape)
    first -= np.arange(count)[:, None] * n  # per row: the first sorted block with w > t_x
    out = q * np.take_along_axis(suffix_a, first, -1) - p * np.take_along_axis(suffix_b, first, -1)
    out = np.maximum(out, 0.0)
    return out + np.sum(np.where(empty, weights, 0.0), -1)[:, None] * q
