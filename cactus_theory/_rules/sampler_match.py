"""Sampler-match verification: the verifier samples its own token at each drafted position with the request's
own sampler, and a draft is accepted exactly when it equals that sample (the engines of 2026 that verify "by
agreement")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .strict import Strict

__all__ = ["SamplerMatch"]


@dataclass(frozen=True)
class SamplerMatch(Strict):
    """Sampler-match verification, as its engines describe it: at every verified position draw y with the
    server's own sampler (the same state, penalties and grammar), accept the draft n iff n = y, and emit y
    either way; the walk stops at the first disagreement (lablup/mlxcel #992; antonellof/ferrox #305 and #307,
    "verify by agreement"; Luce-Org/lucebox #374 and pegainfer #670, "sampled-verify"). **Lossless by
    construction**: every emitted token is the sampler's. Its law is ``strict``'s exactly (the tests check it):
    acceptance q(n), a sampled draft accepted with sum_x p(x) q(x) on average, below SpS's sum_x min(p, q);
    registered under the engines' name so a comparison can say which engine runs which law."""

    name: ClassVar[str] = "sampler-match"
    reference: ClassVar[str] = (
        "lablup/mlxcel #992; antonellof/ferrox #305 and #307 (verify by agreement); Luce-Org/lucebox #374 and "
        "pegainfer-project/pegainfer #670 (sampled-verify)"
    )
    same_law_as: ClassVar[tuple] = ("strict",)
    frontier: ClassVar[tuple] = ({},)  # one setting: lossless, slower than SpS (the frontier shows by how much)
