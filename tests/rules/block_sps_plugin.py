"""A block-judging rule in one file: the worked example of ``docs/contributing/house.md``, and the test that
adding one needs nothing else (``test_block_rule_plugin``: the conformance checks, the analysis, the
simulator, the planner's laws and real decoding all take it from this file alone).

"block-sps" is token-wise speculative sampling stated as a block rule: the whole drafted block's law at
once. tau >= i exactly when the first i drafts each pass their own coin, u_j <= q_j(x_j) / p_j(x_j), so
P(tau = i) = prod_{j <= i} a_j (1 - a_{i+1}) with a_j = min(1, q_j(x_j) / p_j(x_j)) (a_{m+1} = 0); after
i < m accepted drafts it emits from norm((q - p)+) at i + 1, after m the bonus from q. Lossless; under
independent positions P(tau >= j) = prod_{i <= j} beta_i with beta_i = sum_x min(p_i(x), q_i(x))."""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cactus_theory import Rule
from cactus_theory.rules import BlockLaw, SpSOneDraft, block_inputs  # the helpers a block rule shares


@dataclass(frozen=True)
class BlockSpS(SpSOneDraft, Rule):
    """Token-wise SpS judged as a block (a worked example)."""

    name: ClassVar[str] = "block-sps"
    kind: ClassVar[str] = "block"
    lossless: ClassVar[bool] = True
    same_law_as: ClassVar[tuple] = ("sps",)

    def block_law(self, draft_probs, target_probs, drafted_tokens, *, logits=None) -> BlockLaw:
        p, q, tokens, _ = block_inputs(self, draft_probs, target_probs, drafted_tokens, logits)
        m = tokens.shape[-1]
        px = np.take_along_axis(p, tokens[..., None], -1)[..., 0]
        qx = np.take_along_axis(q[..., :m, :], tokens[..., None], -1)[..., 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(px > 0, np.minimum(1.0, qx / np.where(px > 0, px, 1.0)), (qx > 0) * 1.0)
        survive = np.concatenate([np.ones((*a.shape[:-1], 1)), np.cumprod(a, axis=-1)], axis=-1)  # P(tau >= i)
        accepted = survive * np.concatenate([1.0 - a, np.ones((*a.shape[:-1], 1))], axis=-1)  # P(tau = i)
        excess = np.maximum(q[..., :m, :] - p, 0.0)
        mass = excess.sum(-1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            residual = np.where(mass > 0, excess / np.where(mass > 0, mass, 1.0), q[..., :m, :])
        return BlockLaw(accepted=accepted, emitted=np.concatenate([residual, q[..., m:, :]], axis=-2))

    def block_survival_for(self, p, q, ms, *, method="auto", n_paths=1024, seed=0, max_support=1_000_000):
        beta = np.minimum(p, q).sum(-1)
        out = {}
        for m in ms:
            starts = p.shape[0] - m + 1
            survival = np.stack([np.cumprod(beta[t : t + m]) for t in range(starts)])
            out[m] = ("exact", survival.sum(-1), np.zeros(starts), survival)
        return out

    def expected_block_lengths_for(self, p, q, ms, *, method="auto", n_paths=1024, seed=0, max_support=1_000_000):
        found = self.block_survival_for(p, q, ms)
        return {m: found[m][:3] for m in ms}
