"""FLy: entropy-gated deferred verification (arXiv 2511.22972, ICLR 2026; vLLM PR 53987's
``rejection_sample_method="fly"``). Lossy: a native rejection at an uncertain position is
overridden when the next drafts would all pass natively."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._math._validation import check_int
from ._helpers import NUMPY, SpSOneDraft, block_inputs, emitted_drift, ratio_acceptance, residual
from ._protocol import BlockLaw, Rule

__all__ = ["FLy", "top_entropy"]


def top_entropy(target_probs, top_k=3):
    """FLy's gate: -sum q(x) log q(x) over the ``top_k`` largest entries of each row of q (not
    renormalised; natural log), shape (...). vLLM's ``compute_fly_entropy`` on processed target
    probabilities (``VLLM_FLY_ENTROPY_TOP_K``, default 3)."""
    q = np.asarray(target_probs, dtype=np.float64)
    k = min(int(top_k), q.shape[-1])
    top = -np.partition(-q, k - 1, axis=-1)[..., :k]
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.sum(np.where(top > 0, top * np.log(np.where(top > 0, top, 1.0)), 0.0), axis=-1)


def _pass_dp(native, override, window):
    """The law of FLy's accepted length from per-slot probabilities (..., m): ``native`` = P(the
    slot's draft passes natively), ``override`` = P(it fails natively and may be overridden: its
    gate is open and a full window fits). A slot passes natively, or by override when the next
    ``window`` slots all pass natively; tau is the first slot that passes neither way. The slots
    are independent, so a forward pass over (slot, pending native passes owed to an override)
    is exact. Returns (reach (..., m + 1) = P(tau >= j), owed (..., m, window + 1) = the mass at
    slot j with c passes owed, before slot j is judged)."""
    m = native.shape[-1]
    f = np.zeros((*native.shape[:-1], window + 1))
    f[..., 0] = 1.0
    reach = np.zeros((*native.shape[:-1], m + 1))
    owed = np.zeros((*native.shape, window + 1))
    for j in range(m):
        owed[..., j, :] = f
        # P(tau >= j): every pass so far, and the owed native passes from slot j on
        keep = np.ones(native.shape[:-1])
        total = f[..., 0].copy()
        for c in range(1, window + 1):
            keep = keep * native[..., j + c - 1] if j + c - 1 < m else keep * 0.0
            total += f[..., c] * keep
        reach[..., j] = total
        g = np.zeros_like(f)
        g[..., :window] += f[..., 1:] * native[..., j, None]  # an owed slot must pass natively
        g[..., 0] += f[..., 0] * native[..., j]
        g[..., window] += f[..., 0] * override[..., j]
        f = g
    reach[..., m] = f[..., 0]  # every obligation ends inside the block (a window must fit)
    return reach, owed


@dataclass(frozen=True)
class FLy(SpSOneDraft, Rule):
    """FLy (entropy-gated deferred verification), lossy: judge each draft natively (accept with
    min(1, q/p)); a native rejection at slot i is overridden (the draft accepted) when q(x_i) > 0,
    the verifier's top-3 entropy there is at least ``threshold``, a full window fits (i +
    ``window`` < m) and the next ``window`` drafts all pass natively (their own coins). tau is the
    first slot neither passes nor is overridden; it emits the drafts before it and then a token
    from the native residual norm((q - p)+) at tau, or the verifier's bonus after m.

    Exact: given the drafts (``block_law``) and over them (``expected_block_lengths_for``, and the
    per-slot emitted law of ``block_drift_for``) by a forward pass over the slots, which are
    independent under the analysis's model. A block of one draft (or any block with m <=
    ``window``) is SpS. vLLM PR 53987 (``apply_fly_random_acceptance_kernel``: the override is a
    pre-pass on the uniforms, so it sees the next slots' native decisions, not their overrides);
    arXiv 2511.22972.
    """

    threshold: float = 0.3
    window: int = 6
    entropy_top_k: int = 3
    name: ClassVar[str] = "fly"
    kind: ClassVar[str] = "block"
    reference: ClassVar[str] = (
        'FLy, "entropy-gated deferred verification", arXiv 2511.22972 (ICLR 2026); vLLM PR 53987 '
        '(rejection_sample_method="fly", fly_entropy_threshold, fly_window_size, VLLM_FLY_ENTROPY_TOP_K)'
    )
    table: ClassVar[dict] = {
        "acceptance": "native min(1, q/p), or overridden at H3(q) ≥ θ when the next W pass natively",
        "correction": "norm((q − p)+) at τ",
        "emitted": "exact per slot (forward pass)",
        "lossless": "no",
    }
    comparison: ClassVar[tuple] = (("", {}, "verifier"), ("", {"window": 2}, "verifier"))
    examples: ClassVar[tuple] = ({"window": 1, "threshold": 0.0}, {"window": 2, "threshold": 0.2, "entropy_top_k": 2})
    #: one draft at a time (no window fits) it is SpS
    same_law_as: ClassVar[tuple] = ("sps", "block")

    def __post_init__(self):
        if not (
            isinstance(self.threshold, (int, float, np.floating))
            and np.isfinite(self.threshold)
            and self.threshold >= 0
        ):
            raise ValueError(
                f"fly threshold (top-k entropy, nats) must be a finite number >= 0; got {self.threshold!r}"
            )
        for field, value in (("window", self.window), ("entropy_top_k", self.entropy_top_k)):
            check_int(value, f"fly {field}", 1)

    # -- the block ------------------------------------------------------------------------------
    def _gate(self, q, m):
        """(..., m) bool: the slot's entropy gate is open and a full window fits after it."""
        open_ = top_entropy(q[..., :m, :], self.entropy_top_k) >= self.threshold
        fits = np.arange(m) + self.window < m
        return open_ & fits

    def block_law(self, draft_probs, target_probs, drafted_tokens, *, logits=None) -> BlockLaw:
        """The exact law of tau and of the token emitted after it, given the drafts, float64."""
        p, q, tokens, _ = block_inputs(self, draft_probs, target_probs, drafted_tokens, logits)
        m = tokens.shape[-1]
        px = np.take_along_axis(p, tokens[..., None], -1)[..., 0]
        qx = np.take_along_axis(q[..., :m, :], tokens[..., None], -1)[..., 0]
        native = ratio_acceptance(NUMPY, qx, px)
        override = np.where(self._gate(q, m) & (px > 0) & (qx > 0), 1.0 - native, 0.0)
        reach, _ = _pass_dp(native, override, self.window)
        accepted = reach.copy()
        accepted[..., :m] -= reach[..., 1:]
        emitted = np.concatenate([residual(NUMPY, q[..., :m, :], p), q[..., m:, :]], axis=-2)
        return BlockLaw(accepted=np.clip(accepted, 0.0, 1.0), emitted=emitted)

    @staticmethod
    def _parts(p, q):
        """Per row (T, V): the native passes' law min(p, q) and the overridable native rejections',
        p - min(p, q) where q > 0."""
        kept = np.minimum(p, q)
        return kept, np.where(q > 0, p - kept, 0.0)

    def _marginal(self, p, q, m, parts=None):
        """Per block start (rows (T, V), T - m + 1 starts): the slots' native-pass and override
        probabilities over x ~ p, (starts, m) each, and each slot's row (``parts``: ``_parts``)."""
        starts = p.shape[0] - m + 1
        kept, over = self._parts(p, q) if parts is None else parts
        native_row = kept.sum(-1)
        over_row = over.sum(-1)
        gate_row = top_entropy(q, self.entropy_top_k) >= self.threshold
        index = np.arange(starts)[:, None] + np.arange(m)[None, :]
        fits = (np.arange(m) + self.window < m)[None, :]
        native = native_row[index]
        override = np.where(gate_row[index] & fits, over_row[index], 0.0)
        return native, override, index

    def expected_block_lengths_for(self, p, q, ms, *, method="auto", n_paths=1024, seed=0, max_support=1_000_000):
        """{m: ("exact", E[tau] per block start, zeros)} on validated float64 rows (T, V), under
        independent positions: exact for every m (the forward pass needs only each slot's native
        and override probabilities over x ~ p). ``method="monte-carlo"`` is refused (there is no
        need); the other arguments are those of the block-rule protocol."""
        found = self.block_survival_for(p, q, ms, method=method, n_paths=n_paths, seed=seed, max_support=max_support)
        return {m: found[m][:3] for m in ms}

    def block_survival_for(self, p, q, ms, *, method="auto", n_paths=1024, seed=0, max_support=1_000_000):
        """{m: ("exact", E[tau], zeros, P(tau >= j) per start (starts, m))}: the accepted length's
        law per block start, exactly (``expected_block_lengths_for``)."""
        if method == "monte-carlo":
            raise ValueError("fly's block lengths are exact for any m: use method='auto' or 'exact'")
        out = {}
        for m in ms:
            native, override, _ = self._marginal(p, q, m)
            reach, _ = _pass_dp(native, override, self.window)
            values = reach[:, 1:].sum(-1)
            out[m] = ("exact", values, np.zeros(values.shape), reach[:, 1:])
        return out

    def block_drift_for(self, p, q, ms, *, n_paths=1024, seed=0):
        """{m: (KL sums, TV sums)} per block start of rows (T, V) (exact: ``n_paths`` and ``seed``,
        the block-rule protocol's Monte Carlo arguments, are not used): for each slot j < m,
        P(tau >= j) times KL / TV of the law of the token emitted at slot j (given it is emitted)
        against q there; the verifier's bonus adds 0. Exact, under independent positions: at
        slot j with c native passes owed, the token is a native pass, min(p, q) normalised; with
        none owed it is a native pass, an override (the native rejection p - min(p, q) where q >
        0, when the next ``window`` slots pass natively) or the residual norm((q - p)+)."""
        kept, over = parts = self._parts(p, q)
        rest = residual(NUMPY, q, p)
        out = {}
        for m in ms:
            native, override, index = self._marginal(p, q, m, parts)
            reach, owed = _pass_dp(native, override, self.window)
            starts = native.shape[0]
            kl, tv = np.zeros(starts), np.zeros(starts)
            for j in range(m):
                # slot j emitted as a native pass owed to an override: the mass owed c passes there times
                # the later owed slots' native passes, j + 1 .. j + c - 1 (slot j's own is in kept)
                under = np.zeros(starts)
                later = np.ones(starts)
                for c in range(1, self.window + 1):
                    if c > 1:
                        later = later * (native[:, j + c - 1] if j + c - 1 < m else 0.0)
                    under += owed[:, j, c] * later
                free = owed[:, j, 0]
                ahead = np.ones(starts)
                for c in range(1, self.window + 1):
                    ahead = ahead * (native[:, j + c] if j + c < m else 0.0)
                gated = override[:, j] > 0
                rows = index[:, j]
                law = (under + free)[:, None] * kept[rows]
                law += np.where(gated, free * ahead, 0.0)[:, None] * over[rows]
                failing = 1.0 - native[:, j] - override[:, j] * ahead
                law += (free * np.maximum(failing, 0.0))[:, None] * rest[rows]
                mass = reach[:, j]
                slot_kl, slot_tv = emitted_drift(law, mass, q[rows], mass)
                kl += slot_kl
                tv += slot_tv
            out[m] = (kl, tv)
        return out
