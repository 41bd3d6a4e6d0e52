"""Several drafts per position: multi-draft verification (recursive rejection sampling, SpecTr,
EAGLE's and SGLang's tree verification) and the optimal acceptance of each drafting scheme (k
i.i.d. drafts, k drafts without replacement, the top-k of p).

A multi-draft rule verifies k candidate tokens for one position: the drafts are drawn i.i.d.
from p (``drafting="iid"``), without replacement (``"without-replacement"``) or are the k most
likely tokens of p (``"top"``: EAGLE-2/3 and SGLang trees). At most one is accepted; if none is,
a token is drawn from the rule's residual. Its laws at one position:

- ``verify(draft_probs, target_probs, drafts)``: given the drafted tuple, the probability that
  draft i is the one accepted and the law of the emitted token (``MultiDraftLaw``);
- ``multi_acceptance(p, q)``: the chance that some draft is accepted, over the drafts; and
  ``emitted(p, q)``: the law of the emitted token (q for the lossless rules).

A tree of depth m and width k verifies k children of each accepted node; under independent
positions its accepted length is the prefix product of ``multi_acceptance`` (the analysis does
this), and it costs the verifier k m + 1 tokens. The per-token protocol (``acceptance``,
``correction``) is the rule's one-draft form (``single``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._math._kernels import rrs_without_replacement_rows
from ._helpers import NUMPY, ratio_acceptance, residual
from ._multidraft_protocol import (
    MultiDraftLaw,
    MultiDraftRule,
    TopChildVerification,
    _check_drafting,
    _normalised,
    _sample_rows,
    top_drafts,
)
from ._optima import optimal_acceptances, optimal_multi_draft_acceptance, optimal_multi_draft_exactness
from ._protocol import Rule

__all__ = [
    "MultiDraftLaw",
    "MultiDraftOptimal",
    "MultiDraftRule",
    "RecursiveRejectionSampling",
    "SpecTr",
    "TopChildVerification",
    "optimal_acceptances",
    "optimal_multi_draft_acceptance",
    "optimal_multi_draft_exactness",
    "top_drafts",
]


def _rrs_without_replacement(rule, p, q, rows):
    """P(some draft accepted) of rows ``rows`` of (p, q) (R, V), recursive rejection sampling
    without replacement, exactly: the drafted prefixes that can still be rejected are enumerated
    level by level (a draft x is rejected with probability prop(x) - min(prop(x), target(x)),
    so only the tokens the proposal over-weights branch), and the last level is summed in
    closed form. A batch whose prefixes times V pass ``rule.MAX_CELLS`` is split; a row that
    alone passes it gets NaN (the caller estimates it by Monte Carlo)."""
    acc = np.zeros(len(rows))
    owner = np.arange(len(rows))
    used = np.flatnonzero((p[rows] > 0).any(0) | (q[rows] > 0).any(0))  # this batch's tokens
    target, left, reach = q[rows][:, used], p[rows][:, used], np.ones(len(rows))
    for level in range(rule.k):
        z = left.sum(-1, keepdims=True)
        prop = np.where(z > 0, left / np.where(z > 0, z, 1.0), 0.0)
        kept = np.minimum(prop, target)
        np.add.at(acc, owner, reach * kept.sum(-1))
        if level == rule.k - 1:
            break
        reject = reach[:, None] * (prop - kept)  # P(reach, draft x, reject x)
        state, token = np.nonzero(reject > 0)
        if state.size * used.size > rule.MAX_CELLS:
            if len(rows) > 1:
                half = len(rows) // 2
                return np.concatenate(
                    [
                        _rrs_without_replacement(rule, p, q, rows[:half]),
                        _rrs_without_replacement(rule, p, q, rows[half:]),
                    ]
                )
            return np.array([np.nan])
        if state.size == 0:
            break
        rest = residual(NUMPY, target, prop)
        owner, reach, target = owner[state], reject[state, token], rest[state]
        left = left[state]
        left[np.arange(state.size), token] = 0.0
    return np.clip(acc, 0.0, 1.0)


def _rrs_steps(p_rows, q, drafts):
    """Recursive rejection sampling of ``drafts`` with proposal rows p_rows[i] (one per draft):
    (P(draft i accepted) (k,), P(none), the residual after all)."""
    target = q.copy()
    reach = 1.0
    accepted = []
    for i, x in enumerate(drafts):
        if x < 0:
            break
        a = float(ratio_acceptance(NUMPY, target[x], p_rows[i][x]))
        accepted.append(reach * a)
        reach *= 1.0 - a
        target = residual(NUMPY, target, p_rows[i])
    return accepted, reach, target


@dataclass(frozen=True)
class RecursiveRejectionSampling(MultiDraftRule):
    """Recursive rejection sampling: verify the drafts in turn, each by speculative sampling
    against the residual the previous rejections left, q_i = norm((q_{i-1} - p_i)+); if all k
    are rejected, sample from q_k. **Lossless** (each step is SpS of the current residual).

    ``replacement=True``: the drafts are i.i.d. from p (p_i = p); the residuals do not depend
    on the drafts, so P(none accepted) = prod_i (1 - sum_x min(p(x), q_{i-1}(x))): exact,
    O(k V). ``replacement=False``: draft i comes from p without the tokens drafted before
    (renormalised), and the test uses that p_i; the residuals depend on the drafts tried. The
    acceptance is exact by enumerating the drafted prefixes that can be rejected (only tokens
    with p_i(x) > q_{i-1}(x) branch: a few per level on real logits; the last level in closed
    form); a position whose prefixes times V pass ``MAX_CELLS`` is estimated by Monte Carlo over
    512 paths of rejected drafts, only which draft was rejected sampled (unbiased, seeded; on
    the embedded trace about 1 position in 200 at k = 4, 3 in 100 at k = 8). SpecInfer (Miao
    et al., ASPLOS 2024); EAGLE-1; Jeon et al., "Recursive Speculative Decoding", 2024 (without
    replacement).
    """

    replacement: bool = True
    MAX_CELLS: ClassVar[int] = 200_000
    name: ClassVar[str] = "rrs"
    reference: ClassVar[str] = (
        'Miao et al., "SpecInfer", ASPLOS 2024; Li et al., "EAGLE", ICML 2024; Jeon et al., "Recursive Speculative '
        'Decoding", 2024 (without replacement)'
    )
    table: ClassVar[dict] = {
        "acceptance": "1 − prod_i (1 − Σ min(p_i, q_{i−1})) over k drafts",
        "correction": "q_k = the residual after k rejections",
        "emitted": "q",
        "lossless": "yes",
    }
    comparison: ClassVar[tuple] = (("", {"k": 4}, "verifier"), ("", {"k": 4, "replacement": False}, "verifier"))
    tree_comparison: ClassVar[tuple] = (
        ("rrs", "rrs(k={k})", "sampled i.i.d."),
        ("rrs without replacement", "rrs(k={k}, replacement=false)", "sampled distinct"),
    )
    examples: ClassVar[tuple] = ({"k": 3}, {"k": 3, "replacement": False}, {"k": 1})
    label_fields: ClassVar[tuple] = ("k",)
    lossless: ClassVar[bool] = True
    same_law_as: ClassVar[tuple] = ("sps", "spectr", "multi-draft-optimal", "eagle-tree", "sglang-tree", "block")

    @property
    def drafting(self) -> str:  # type: ignore[override]
        return "iid" if self.replacement else "without-replacement"

    def _verify(self, p, q, drafts) -> MultiDraftLaw:
        rows = []
        left = p.copy()
        for x in drafts:
            rows.append(_normalised(left) if not self.replacement else p)
            if x >= 0 and not self.replacement:
                left[x] = 0.0
        accepted, none, rest = _rrs_steps(rows, q, drafts)
        law = np.zeros(self.k + 1)
        law[: len(accepted)] = accepted
        law[-1] = none
        emitted = none * rest
        for i, x in enumerate(drafts[: len(accepted)]):
            emitted[x] += accepted[i]
        return MultiDraftLaw(law, emitted)

    def multi_acceptance(self, draft_probs, target_probs):
        p, q, _ = self._host(draft_probs, target_probs)
        if self.replacement:
            none = np.ones(q.shape[:-1])
            target = q
            for _ in range(self.k):
                none = none * (1.0 - np.minimum(p, target).sum(-1))
                target = residual(NUMPY, target, p)
            return np.clip(1.0 - none, 0.0, 1.0)
        flat_p, flat_q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
        used = np.flatnonzero((flat_p > 0).any(0) | (flat_q > 0).any(0))  # tokens neither model has play no part
        if used.size < flat_p.shape[-1]:
            flat_p, flat_q = flat_p[:, used], flat_q[:, used]
        acc = rrs_without_replacement_rows(flat_p, flat_q, self.k, self.MAX_CELLS)  # compiled, else NumPy
        if acc is None:
            acc = _rrs_without_replacement(self, flat_p, flat_q, np.arange(len(flat_p)))
        sampled = np.isnan(acc)
        if sampled.any():
            acc[sampled] = self._monte_carlo_acceptance(flat_p[sampled], flat_q[sampled])
        return acc.reshape(q.shape[:-1])

    def _monte_carlo_acceptance(self, p, q, draws=512, seed=0):
        """P(some draft accepted) without replacement, estimated per row from ``draws`` paths of
        rejected drafts: each level adds the exact chance of acceptance there times the exact
        chance of having been rejected so far, and only which draft was rejected is sampled
        (from its conditional law, prop(x) - min(prop(x), target(x)), normalised). Unbiased;
        seeded; all rows' paths batched (``MAX_CELLS`` floats at a time). Run only for positions
        whose exact enumeration passes ``MAX_CELLS``."""
        rng = np.random.default_rng(seed)
        flat_p, flat_q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
        used = np.flatnonzero((flat_p > 0).any(0) | (flat_q > 0).any(0))
        flat_p, flat_q = flat_p[:, used], flat_q[:, used]
        vocab = flat_p.shape[-1]
        owner_all = np.repeat(np.arange(len(flat_p)), draws)
        chunk = max(1, self.MAX_CELLS // vocab)
        out = np.zeros(len(flat_p))
        levels = min(self.k, int((flat_p > 0).sum(-1).max(initial=1)))  # a row of s tokens drafts at most s
        for begin in range(0, owner_all.size, chunk):
            owner = owner_all[begin : begin + chunk]
            target, left, reach = flat_q[owner], flat_p[owner], np.ones(owner.size)
            for level in range(levels):
                z = left.sum(-1, keepdims=True)
                prop = np.where(z > 0, left / np.where(z > 0, z, 1.0), 0.0)
                kept = np.minimum(prop, target)
                accept = kept.sum(-1)
                np.add.at(out, owner, reach * accept / draws)
                if level == levels - 1:
                    break
                rejected = prop - kept
                live = rejected.sum(-1) > 0
                x = _sample_rows(rng, np.where(live[:, None], rejected, 1.0))
                target = residual(NUMPY, target, prop)
                reach = np.where(live, reach * (1.0 - accept), 0.0)
                left[np.arange(owner.size), x] = 0.0
        return np.clip(out, 0.0, 1.0).reshape(q.shape[:-1])

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """q: lossless (exact)."""
        _, q, _ = self._host(draft_probs, target_probs, logits)
        return np.array(q)


def _spectr_rho(p, q, k, iterations=60):
    """The smallest rho in [1, k] for which k-sequential selection's residual is a distribution:
    rho >= c(rho) = (1 - (1 - beta)^k) / beta, beta(rho) = sum_x min(p(x), q(x) / rho). c(rho) / rho
    decreases in rho (1 - (1 - beta)^k decreases and rho beta = sum min(rho p, q) increases), so
    the feasible rho form an interval [rho*, k] and bisection finds rho* (60 halvings of [1, k]: to
    rounding)."""

    def excess(rho):
        beta = np.minimum(p, q / np.asarray(rho)[..., None]).sum(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            c = np.where(beta > 0, (1.0 - (1.0 - beta) ** k) / np.where(beta > 0, beta, 1.0), k)
        return c - rho

    lo, hi = np.ones(p.shape[:-1]), np.full(p.shape[:-1], float(k))
    ok = excess(lo) <= 0
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        bad = excess(mid) > 0
        lo, hi = np.where(bad, mid, lo), np.where(bad, hi, mid)
    return np.where(ok, 1.0, hi)


@functools.lru_cache(maxsize=256)
def _spectr_row(k, p_bytes, q_bytes):
    """(rho, p_res) of one position (cached: simulation verifies many tuples at one position)."""
    p, q = np.frombuffer(p_bytes), np.frombuffer(q_bytes)
    rho = float(_spectr_rho(p, q, k))
    kept = np.minimum(p, q / rho)
    beta = kept.sum()
    scale = (1.0 - (1.0 - beta) ** k) / beta if beta > 0 else 0.0
    res = np.maximum(q - kept * scale, 0.0)
    return rho, (_normalised(res) if res.sum() > 0 else q)


@dataclass(frozen=True)
class SpecTr(MultiDraftRule):
    """SpecTr's k-sequential selection: accept the first of the k i.i.d. drafts that passes
    u <= min(1, q(x) / (rho p(x))); if none does, sample from the residual

        p_res(x) = [q(x) - min(p(x), q(x)/rho) (1 - (1 - beta)^k) / beta] / (1 - beta)^k,

    beta = sum_x min(p(x), q(x)/rho). rho is the smallest value in [1, k] for which p_res is a
    distribution (rho >= (1 - (1 - beta)^k) / beta; bisection, 60 halvings). **Lossless**;
    acceptance 1 - (1 - beta)^k, exact in O(V) per bisection step. k = 1 is SpS. Sun, Suresh, Ro,
    Beirami, Jain and Yu, "SpecTr: Fast Speculative Decoding via Optimal Transport", NeurIPS 2023.
    """

    name: ClassVar[str] = "spectr"
    reference: ClassVar[str] = (
        'Sun, Suresh, Ro, Beirami, Jain & Yu, "SpecTr: Fast Speculative Decoding via Optimal Transport", NeurIPS 2023 '
        "(k-sequential selection)"
    )
    table: ClassVar[dict] = {
        "acceptance": "1 − (1 − β(ρ))^k, β = Σ min(p, q/ρ)",
        "correction": "p_res",
        "emitted": "q",
        "lossless": "yes",
    }
    comparison: ClassVar[tuple] = (("", {"k": 4}, "verifier"),)
    tree_comparison: ClassVar[tuple] = (("spectr", "spectr(k={k})", "sampled i.i.d."),)
    examples: ClassVar[tuple] = ({"k": 3}, {"k": 1})
    lossless: ClassVar[bool] = True
    same_law_as: ClassVar[tuple] = ("sps", "rrs", "multi-draft-optimal", "block")

    def _parts(self, p, q):
        rho = _spectr_rho(p, q, self.k)
        kept = np.minimum(p, q / rho[..., None])
        beta = kept.sum(-1)
        return rho, kept, beta

    def _verify(self, p, q, drafts) -> MultiDraftLaw:
        rho, res = _spectr_row(self.k, np.ascontiguousarray(p).tobytes(), np.ascontiguousarray(q).tobytes())
        reach, law = 1.0, np.zeros(self.k + 1)
        emitted = np.zeros(q.shape)
        for i, x in enumerate(drafts):
            a = float(ratio_acceptance(NUMPY, q[x] / rho, p[x]))
            law[i] = reach * a
            emitted[x] += reach * a
            reach *= 1.0 - a
        law[-1] = reach
        emitted += reach * res
        return MultiDraftLaw(law, emitted)

    def multi_acceptance(self, draft_probs, target_probs):
        p, q, _ = self._host(draft_probs, target_probs)
        _, _, beta = self._parts(p, q)
        return np.clip(1.0 - (1.0 - beta) ** self.k, 0.0, 1.0)

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """q: lossless (exact)."""
        _, q, _ = self._host(draft_probs, target_probs, logits)
        return np.array(q)


@dataclass(frozen=True)
class MultiDraftOptimal(MultiDraftRule):
    """The optimal lossless verification of k drafts drawn as ``drafting`` says ("iid": i.i.d.
    from p; "without-replacement": k distinct tokens, each from p without those drawn before;
    "top": the k most likely tokens of p): the maximal coupling of the drafted tuple and Y ~ q
    with Y among the drafts. Its acceptance, alpha* = 1 - max_C [P(every draft in C) - q(C)]
    (``optimal_multi_draft_acceptance``: exact in O(V log V) for "iid" and "top"; without
    replacement exact by enumerating the drafted sets, Monte Carlo past a size), is what no
    lossless rule of the same drafting scheme beats; it emits q. A yardstick, one per scheme:
    each tree rule is measured against the optimum of its own scheme. ``verify`` builds the
    coupling by a linear program over the drafted tuples (small vocabularies only, for
    simulation and the checks). Khisti, Ebrahimi, Dbouk, Behboodi, Louizos and Soatto,
    "Multi-draft speculative sampling: canonical architectures and theoretical limits", ICLR
    2025; Hu, Zheng, Viswanathan, Chen, Rossi, Wu, Manocha and Huang, "Towards Optimal
    Multi-draft Speculative Decoding", ICLR 2025 (without replacement).
    """

    drafting: str = "iid"
    MAX_TUPLES: ClassVar[int] = 4096
    name: ClassVar[str] = "multi-draft-optimal"
    reference: ClassVar[str] = (
        'Khisti et al., "Multi-draft speculative sampling: canonical architectures and theoretical limits", ICLR 2025;'
        ' Hu et al., "Towards Optimal Multi-draft Speculative Decoding", ICLR 2025'
    )
    table: ClassVar[dict] = {
        "acceptance": "α* = 1 − max_C [P(drafts ⊆ C) − q(C)]; i.i.d.: P = p(C)^k; top-k: α* = q(top-k(p))",
        "correction": "the optimal coupling's",
        "emitted": "q",
        "lossless": "yes",
    }
    comparison: ClassVar[tuple] = (("", {"k": 4}, "verifier"),)
    tree_comparison: ClassVar[tuple] = (
        ("optimum (i.i.d.)", "multi-draft-optimal(k={k})", "sampled i.i.d."),
        (
            "optimum (without replacement)",
            "multi-draft-optimal(k={k}, drafting=without-replacement)",
            "sampled distinct",
        ),
        ("optimum (top-k)", "multi-draft-optimal(k={k}, drafting=top)", "top-k of p"),
    )
    yardstick: ClassVar[bool] = True
    examples: ClassVar[tuple] = (
        {"k": 3},
        {"k": 1},
        {"k": 3, "drafting": "without-replacement"},
        {"k": 2, "drafting": "top"},
    )
    lossless: ClassVar[bool] = True
    same_law_as: ClassVar[tuple] = ("sps", "rrs", "spectr", "block", "eagle-tree", "sglang-tree")

    def __post_init__(self):
        super().__post_init__()
        _check_drafting(self.drafting)

    def single(self) -> Rule:
        """SpS for drafts from p; for the top-k scheme the one-draft form of EAGLE's verification."""
        return TopChildVerification() if self.drafting == "top" else super().single()

    def multi_acceptance(self, draft_probs, target_probs):
        p, q, _ = self._host(draft_probs, target_probs)
        return optimal_acceptances(p, q, (self.k,), self.drafting)[self.k][0]

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """q: lossless (exact)."""
        _, q, _ = self._host(draft_probs, target_probs, logits)
        return np.array(q)

    def coupling(self, draft_probs, target_probs):
        """The optimal coupling of one position, by a linear program over the drafted tuples
        (maximise the matched mass; HiGHS at 1e-10 feasibility, then scaled back to be feasible
        exactly, so the law it gives is exactly q and its acceptance within the solver's
        tolerance of alpha*): ({tuple: {token: P(accept that token | tuple)}}, the residual law
        sampled when no draft is accepted). At most ``MAX_TUPLES`` tuples; cached for the last
        256 positions."""
        p, q, _ = self._host(draft_probs, target_probs)
        support = int((p > 0).sum())
        count = {"iid": support**self.k, "top": 1}.get(self.drafting, math.perm(support, min(self.k, support)))
        if count > self.MAX_TUPLES:
            raise ValueError(
                f"the optimal coupling of {count} drafted tuples is a linear program too large to build here "
                f"(at most {self.MAX_TUPLES}); its acceptance is exact for any size (multi_acceptance)"
            )
        return _optimal_coupling(self, np.ascontiguousarray(p).tobytes(), np.ascontiguousarray(q).tobytes())

    def _verify(self, p, q, drafts) -> MultiDraftLaw:
        plan, rest = _optimal_coupling(self, np.ascontiguousarray(p).tobytes(), np.ascontiguousarray(q).tobytes())
        per = plan.get(tuple(int(x) for x in drafts if x >= 0), {})
        law = np.zeros(self.k + 1)
        emitted = np.zeros(q.shape)
        for y, share in per.items():
            i = [int(x) for x in drafts].index(y)  # credited to the first draft that holds y
            law[i] += share
            emitted[y] += share
        law[-1] = max(1.0 - law[:-1].sum(), 0.0)
        emitted += law[-1] * rest
        return MultiDraftLaw(law, emitted)


@functools.lru_cache(maxsize=256)
def _optimal_coupling(rule, p_bytes, q_bytes):
    from scipy.optimize import linprog

    p, q = np.frombuffer(p_bytes), np.frombuffer(q_bytes)
    drafted = rule.draft_tuples(p)  # the drafting scheme's tuples and their probabilities
    tuples = [t for t, _ in drafted]
    probs = np.array([w for _, w in drafted])
    edges = [(i, y) for i, t in enumerate(tuples) for y in sorted(set(t))]
    a_ub = np.zeros((len(tuples) + len(q), len(edges)))
    for e, (i, y) in enumerate(edges):
        a_ub[i, e] = 1.0
        a_ub[len(tuples) + y, e] = 1.0
    tight = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
    res = linprog(
        -np.ones(len(edges)),
        A_ub=a_ub,
        b_ub=np.concatenate([probs, q]),
        bounds=(0, None),
        method="highs",
        options=tight,
    )
    if res.status != 0:  # pragma: no cover - HiGHS solves these bounded problems
        raise RuntimeError(f"the optimal coupling's linear program failed: {res.message}")
    flow = np.maximum(res.x, 0.0)
    # the solver's tolerance may overfill a tuple or a token slightly: scale back so that the
    # coupling is feasible exactly (then the law below is exactly q)
    owner = np.array([i for i, _ in edges])
    token = np.array([y for _, y in edges])
    per_tuple = np.bincount(owner, flow, minlength=len(tuples))
    flow *= np.minimum(1.0, probs / np.where(per_tuple > 0, per_tuple, 1.0))[owner]
    matched = np.bincount(token, flow, minlength=len(q))
    flow *= np.minimum(1.0, q / np.where(matched > 0, matched, 1.0))[token]
    matched = np.bincount(token, flow, minlength=len(q))
    plan = {t: {} for t in tuples}
    for e, (i, y) in enumerate(edges):
        if flow[e] > 0:
            plan[tuples[i]][y] = min(flow[e] / probs[i], 1.0)
    leftover = np.maximum(q - matched, 0.0)
    return plan, (_normalised(leftover) if leftover.sum() > 1e-15 else q)
