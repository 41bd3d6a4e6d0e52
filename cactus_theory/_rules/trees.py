"""Tree verification as EAGLE and SGLang run it: the children of each node are the top-k of the
drafter, tried in order with the top-child rule (accept with min(1, q(x) / threshold_acc), or at
once when q(x) >= threshold_single), the first accepted descended into. Lossless at EAGLE's
thresholds (1, 1), measured against the optimum of top-k drafting (q of the top-k set)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._multidraft_protocol import MultiDraftLaw, MultiDraftRule, TopChildVerification, _normalised, _top
from ._protocol import Rule

__all__ = ["EagleTree", "SGLangTree"]


@dataclass(frozen=True)
class EagleTree(MultiDraftRule):
    """EAGLE-2/3's verification of a node's children: the k most likely tokens of p (ties: the
    lower id), tried in order; a child x is accepted with probability q'(x), else q'(x) is set to
    0 and q' renormalised; after all fail, sample from q'. A deterministic proposal accepted with
    q'(x) / 1, so **lossless**, with acceptance sum_{x in top-k(p)} q(x): exact, O(V log V).
    k = 1 is SpS with a greedy (one-hot) draft. Li, Wei, Zhang and Zhang, "EAGLE-2", EMNLP 2024;
    "EAGLE-3", 2025 (``evaluate_posterior``, sampling branch).
    """

    drafting: ClassVar[str] = "top"
    name: ClassVar[str] = "eagle-tree"
    reference: ClassVar[str] = (
        'Li, Wei, Zhang & Zhang, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees", EMNLP 2024;'
        ' "EAGLE-3", 2025 (SafeAILab/EAGLE, evaluate_posterior)'
    )
    table: ClassVar[dict] = {
        "acceptance": "Σ q over the top-k tokens of p",
        "correction": "q without the tried children",
        "emitted": "q",
        "lossless": "yes",
    }
    comparison: ClassVar[tuple] = (("", {"k": 4}, "verifier"),)
    tree_comparison: ClassVar[tuple] = (("eagle-tree", "eagle-tree(k={k})", "top-k of p"),)
    examples: ClassVar[tuple] = ({"k": 3}, {"k": 1})
    lossless: ClassVar[bool] = True
    same_law_as: ClassVar[tuple] = ("sglang-tree", "rrs")

    def single(self) -> Rule:
        """Accept the drafted token with probability q(n), else sample q without it (lossless)."""
        return TopChildVerification()

    def _verify(self, p, target_probs, drafts) -> MultiDraftLaw:
        q = target_probs.copy()
        reach, law = 1.0, np.zeros(self.k + 1)
        emitted = np.zeros(q.shape)
        for i, x in enumerate(drafts):
            a = q[x] / q.sum() if q.sum() > 0 else 0.0
            law[i] = reach * a
            emitted[x] += reach * a
            reach *= 1.0 - a
            q[x] = 0.0
        law[-1] = reach
        emitted += reach * (_normalised(q) if q.sum() > 0 else target_probs)
        return MultiDraftLaw(law, emitted)

    def multi_acceptance(self, draft_probs, target_probs):
        p, q, _ = self._host(draft_probs, target_probs)
        return np.clip(np.take_along_axis(q, _top(p, self.k), -1).sum(-1), 0.0, 1.0)

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """q: lossless (exact)."""
        _, q, _ = self._host(draft_probs, target_probs, logits)
        return np.array(q)


@dataclass(frozen=True)
class SGLangTree(MultiDraftRule):
    """SGLang's target-only tree verification of a node's children (the k most likely tokens of
    p, ties to the lower id): one coin u for the node; child i is accepted if
    u <= (q(x_1) + ... + q(x_i)) / threshold_acc or q(x_i) >= threshold_single, the first child
    that passes wins; if none does, sample from q with the tried children removed. At
    ``threshold_single = threshold_acc = 1`` it samples y ~ q and accepts iff y is a child:
    **lossless**, the law of ``eagle-tree``; below 1 it accepts more and is not lossless.
    Exact, O(V log V). sgl-project/sglang, sgl-kernel ``speculative_sampling.cuh``
    (``TreeSpeculativeSamplingTargetOnly``), flags ``--speculative-accept-threshold-single`` /
    ``-acc``.
    """

    threshold_single: float = 1.0
    threshold_acc: float = 1.0
    drafting: ClassVar[str] = "top"
    name: ClassVar[str] = "sglang-tree"
    reference: ClassVar[str] = (
        "sgl-project/sglang, sgl-kernel csrc/speculative/speculative_sampling.cuh (TreeSpeculativeSamplingTargetOnly)"
    )
    table: ClassVar[dict] = {
        "acceptance": "first child i with u ≤ Σ_{j≤i} q(x_j)/t_acc or q(x_i) ≥ t_single",
        "correction": "q without the tried children",
        "emitted": "q at t = 1, 1; else the accepted mix",
        "lossless": "only t_single = t_acc = 1",
    }
    comparison: ClassVar[tuple] = (
        ("", {"k": 4}, "verifier"),
        ("", {"k": 4, "threshold_single": 0.6, "threshold_acc": 0.8}, "verifier"),
    )
    examples: ClassVar[tuple] = ({"k": 3}, {"k": 3, "threshold_single": 0.5, "threshold_acc": 0.7}, {"k": 1})
    label_fields: ClassVar[tuple] = ("k",)
    same_law_as: ClassVar[tuple] = ("eagle-tree", "rrs")

    def __post_init__(self):
        super().__post_init__()
        for name in ("threshold_single", "threshold_acc"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float, np.floating)) and 0 < value <= 1):
                raise ValueError(f"sglang-tree {name} must lie in (0, 1]; got {value!r}")

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.threshold_single == 1 and self.threshold_acc == 1

    def single(self) -> Rule:
        """One child: accept with min(1, q(n) / threshold_acc), or 1 when q(n) >= threshold_single."""
        return TopChildVerification(float(self.threshold_single), float(self.threshold_acc))

    def _first_accepted(self, q, drafts):
        """P(child i is the first to pass), (..., k), and P(none), (...)."""
        qd = np.take_along_axis(q, drafts, -1)
        cum = np.minimum(np.cumsum(qd, axis=-1) / self.threshold_acc, 1.0)
        single = qd >= self.threshold_single
        # reached i: u > cum_{i-1} and no earlier single pass
        before = np.concatenate([np.zeros((*cum.shape[:-1], 1)), cum[..., :-1]], axis=-1)
        blocked = np.cumsum(single, axis=-1) - single > 0  # an earlier child passed on its own
        law = np.where(single, 1.0 - before, cum - before)
        law = np.where(blocked, 0.0, law)
        return law, np.clip(1.0 - law.sum(-1), 0.0, 1.0)

    def _residual(self, q, drafts):
        rest = q.copy()
        np.put_along_axis(rest, drafts, 0.0, axis=-1)
        z = rest.sum(-1, keepdims=True)
        return np.where(z > 0, rest / np.where(z > 0, z, 1.0), q)

    def _verify(self, p, q, drafts) -> MultiDraftLaw:
        law, none = self._first_accepted(q[None], np.asarray(drafts)[None])
        emitted = none[0] * self._residual(q[None], np.asarray(drafts)[None])[0]
        np.add.at(emitted, np.asarray(drafts), law[0])
        return MultiDraftLaw(np.append(law[0], none[0]), emitted)

    def multi_acceptance(self, draft_probs, target_probs):
        p, q, _ = self._host(draft_probs, target_probs)
        law, _ = self._first_accepted(q, _top(p, self.k))
        return np.clip(law.sum(-1), 0.0, 1.0)

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """The accepted children's law plus the residual's (exact, O(V log V))."""
        p, q, _ = self._host(draft_probs, target_probs, logits)
        drafts = _top(p, self.k)
        law, none = self._first_accepted(q, drafts)
        out = none[..., None] * self._residual(q, drafts)
        flat = out.reshape(-1, q.shape[-1])
        np.add.at(flat, (np.arange(len(flat))[:, None], drafts.reshape(len(flat), -1)), law.reshape(len(flat), -1))
        return flat.reshape(q.shape)

    def multi_outside_support(self, draft_probs, target_probs):
        p, q, _ = self._host(draft_probs, target_probs)
        drafts = _top(p, self.k)
        law, _ = self._first_accepted(q, drafts)
        return np.sum(np.where(np.take_along_axis(q, drafts, -1) > 0, 0.0, law), axis=-1)
