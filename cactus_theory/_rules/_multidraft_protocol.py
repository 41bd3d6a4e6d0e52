"""The protocol of rules that verify several drafts per position: what a rule does with one drafted
tuple (``MultiDraftLaw``), the base class (``MultiDraftRule``: ``verify``, ``multi_acceptance``,
``emitted`` and the one-draft form), the drafting schemes (``DRAFTINGS``) and the top-child
verification that EAGLE's and SGLang's trees run per token. The rule families live in their own
modules (``multidraft``, ``trees``, ``traversal``); the optima of each scheme in ``_optima``."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._math._validation import check_int, host_probabilities
from ._protocol import Rule

__all__ = ["DRAFTINGS", "MultiDraftLaw", "MultiDraftRule", "TopChildVerification", "top_drafts"]

DRAFTINGS = ("iid", "without-replacement", "top")


@dataclass(frozen=True)
class MultiDraftLaw:
    """What a multi-draft rule does with one drafted tuple (``MultiDraftRule.verify``).

    Attributes
    ----------
    accepted : array (..., k + 1)
        P(draft i is the one accepted), i < k; the last entry: P(none is).
    emitted : array (..., V)
        The law of the emitted token given the drafts (an accepted draft or the residual).
    """

    accepted: np.ndarray
    emitted: np.ndarray


def _normalised(x):
    z = x.sum(axis=-1, keepdims=True)
    return np.where(z > 0, x / np.where(z > 0, z, 1.0), 0.0)


def top_drafts(draft_probs, k):
    """The k most likely tokens of each row of p (ties: the lower token id first), shape (..., k)."""
    check_int(k, "k (drafts per position)", 1)
    return _top(host_probabilities(draft_probs, "draft_probs"), k)


def _top(p, k):
    """``top_drafts`` of checked float64 rows."""
    order = np.argsort(-p, axis=-1, kind="stable")
    return order[..., :k]


def _check_k(k):
    check_int(k, "k (drafts per position)", 1)


def _check_drafting(drafting):
    if drafting not in DRAFTINGS:
        raise ValueError(
            f"drafting must be one of {', '.join(DRAFTINGS)} (how the k drafts are drawn); got {drafting!r}"
        )


def _cut_order(p, q):
    """Tokens sorted by p(x) / q(x), largest first (q(x) = 0 < p(x) first, p(x) = 0 last; ties by id):
    the optimal cut C of every drafting scheme here is a prefix of this order."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.where(p > 0, np.inf, 0.0))
    return np.argsort(-ratio, axis=-1, kind="stable")


@dataclass(frozen=True)
class TopChildVerification(Rule):
    """The one-draft form of EAGLE's and SGLang's tree verification, per drafted token n: accept n
    with probability min(1, q(n) / threshold_acc), or 1 when q(n) >= threshold_single; after a
    rejection sample from q without n (renormalised). At thresholds 1, 1 (EAGLE) it is lossless
    for any draft law: pi(y) = p(y) q(y) + q(y) (1 - p(y)) = q(y). Not registered: it is what
    ``EagleTree.single()`` and ``SGLangTree.single()`` return, the per-token protocol of those
    rules (exact)."""

    threshold_single: float = 1.0
    threshold_acc: float = 1.0

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.threshold_single == 1 and self.threshold_acc == 1

    def describe(self) -> str:
        if self.lossless:
            return "top-child verification"
        return f"top-child verification(threshold_single={self.threshold_single}, threshold_acc={self.threshold_acc})"

    def _acceptance(self, b, p, q, n, lg):
        qn = b.take_last(q, n)
        return b.where(qn >= self.threshold_single, 1.0 + 0.0 * qn, b.minimum(qn / self.threshold_acc, 1.0))

    def _correction(self, b, p, q, n, lg):
        rest = b.put_last(q, n, 0.0)
        z = b.sum_last(rest, keepdims=True)
        return b.where(z > 0, rest / b.where(z > 0, z, 1.0), q)


@dataclass(frozen=True)
class MultiDraftRule(Rule):
    """Base of the multi-draft rules: k candidates per position, at most one accepted."""

    k: int = 2
    kind: ClassVar[str] = "multi-draft"
    #: How the k drafts are drawn: "iid" (from p), "without-replacement" or "top" (the top-k of p).
    drafting: ClassVar[str] = "iid"
    #: The entries of the tree study (``compare_multi_draft``): (label, spec template in k, how the
    #: children are drawn); () leaves the rule out (e.g. a rule with another's law at its defaults).
    tree_comparison: ClassVar[tuple] = ()
    #: The rule is a yardstick (an optimum), drawn dashed and listed after the methods.
    yardstick: ClassVar[bool] = False
    #: The widest tree verified here: the verifier scores k m + 1 tokens a step, and engines' trees
    #: are at most a few dozen wide (EAGLE top-k 10, SGLang's topk 8); the recursive rules cost O(k V).
    MAX_K: ClassVar[int] = 1024

    def __post_init__(self):
        check_int(self.k, f"{type(self).__name__} k (drafts per position)", 1)
        if self.k > self.MAX_K:
            raise ValueError(
                f"{type(self).__name__} k = {self.k} drafts per position is more than the {self.MAX_K} supported: a "
                f"step verifies k m + 1 tokens, and the recursive rules cost O(k V) per position"
            )

    @property
    def draft_count(self) -> int:
        return int(self.k)

    def single(self) -> Rule:
        """The one-draft form: what the per-token protocol (``acceptance``, ``correction``) runs, and
        what k = 1 equals (``multi_acceptance`` of k = 1 is its acceptance averaged over the draft).
        SpS for the rules with drafts from p."""
        from .sps import SpS

        return SpS()

    def _acceptance(self, b, p, q, n, lg):
        return self.single()._acceptance(b, p, q, n, lg)

    def _correction(self, b, p, q, n, lg):
        return self.single()._correction(b, p, q, n, lg)

    def _acceptance_all(self, p, q, lg):
        return self.single()._acceptance_all(p, q, lg)

    # -- the drafts --------------------------------------------------------------------------
    def draft_tuples(self, p):
        """Every drafted tuple of one row p (V,) with its probability: [(tokens, probability)]; a
        tuple without replacement is shorter than k when p has fewer tokens. For enumeration."""
        p = host_probabilities(p, "draft_probs")
        if p.ndim != 1:
            raise ValueError(f"draft_tuples takes one position's draft_probs, shape (V,); got shape {p.shape}")
        support = [int(x) for x in np.flatnonzero(p > 0)]
        if self.drafting == "top":
            return [(tuple(int(x) for x in _top(p, self.k)), 1.0)]
        if self.drafting == "iid":
            return [(t, float(np.prod([p[x] for x in t]))) for t in itertools.product(support, repeat=self.k)]
        out = []
        for t in itertools.permutations(support, min(self.k, len(support))):
            prob = 1.0
            for i, x in enumerate(t):
                prob *= p[x] / sum(p[y] for y in support if y not in t[:i])  # the mass left, summed
            out.append((t, prob))
        return out

    def sample_drafts(self, rng, p):
        """k drafts per row of p (R, V): (R, k) token ids (-1 where a draw without replacement ran
        out of tokens)."""
        p = host_probabilities(p, "draft_probs")
        if p.ndim != 2:
            raise ValueError(f"sample_drafts takes draft_probs rows of shape (R, V); got shape {p.shape}")
        rows, vocab = p.shape
        if self.drafting == "top":
            return _top(p, self.k)
        if self.drafting == "iid":
            cdf = np.cumsum(p, axis=-1)
            u = rng.random((rows, self.k)) * cdf[:, -1:]
            return np.minimum((cdf[:, None, :] < u[..., None]).sum(-1), vocab - 1)
        out = np.full((rows, self.k), -1)
        left = p.copy()
        for i in range(self.k):
            mass = left.sum(-1)
            live = mass > 1e-300
            cdf = np.cumsum(left, axis=-1)
            u = rng.random(rows) * mass
            draw = np.minimum((cdf < u[:, None]).sum(-1), vocab - 1)
            out[live, i] = draw[live]
            left[np.flatnonzero(live), draw[live]] = 0.0
        return out

    # -- the laws -----------------------------------------------------------------------------
    def verify(self, draft_probs, target_probs, drafted_tokens) -> MultiDraftLaw:
        """What the rule does with one drafted tuple: P(draft i is the one accepted) and the law of
        the emitted token (exact, float64).

        Parameters
        ----------
        draft_probs, target_probs : arrays (V,)
            One position's rows.
        drafted_tokens : int array (k,)
            The drafts in the order they are tried (-1 pads a tuple drawn without replacement
            from fewer than k tokens).
        """
        p, q, _ = self._host(draft_probs, target_probs)
        if p.ndim != 1:
            raise ValueError(f"verify takes one position: draft_probs and target_probs of shape (V,); got {p.shape}")
        drafts = np.asarray(drafted_tokens)
        if drafts.shape != (self.k,) or not np.issubdtype(drafts.dtype, np.integer):
            raise ValueError(
                f"drafted_tokens must be {self.k} integer token ids (k = {self.k}); got shape {drafts.shape}, "
                f"dtype {drafts.dtype}"
            )
        if ((drafts < -1) | (drafts >= p.shape[-1])).any():
            raise ValueError(f"drafted_tokens must lie in [0, {p.shape[-1]}) (-1: no draft)")
        return self._verify(p, q, drafts)

    def _verify(self, p, q, drafts) -> MultiDraftLaw:  # pragma: no cover - abstract
        raise NotImplementedError

    def multi_acceptance(self, draft_probs, target_probs):
        """P(some draft is accepted), over the drafts, shape (...). Generic: enumeration over the
        drafted tuples (``draft_tuples``); rules override it with their closed forms."""
        return self._enumerate(draft_probs, target_probs)[0]

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """The law of the emitted token at one position, over the drafts (exact)."""
        return self._enumerate(draft_probs, target_probs)[1]

    def multi_outside_support(self, draft_probs, target_probs):
        """P(a draft the verifier excludes, q(x) = 0, is accepted), shape (...): 0 for a lossless rule."""
        p, q, _ = self._host(draft_probs, target_probs)
        if self.lossless:
            return np.zeros(q.shape[:-1])
        return self._enumerate(p, q)[2]

    def _enumerate(self, draft_probs, target_probs):
        """(acceptance, emitted law, acceptance of tokens q excludes) by enumerating the drafts."""
        p, q, _ = self._host(draft_probs, target_probs)
        flat_p, flat_q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
        acc, out, outside = np.zeros(len(flat_p)), np.zeros(flat_p.shape), np.zeros(len(flat_p))
        for r, (pr, qr) in enumerate(zip(flat_p, flat_q, strict=True)):
            for tokens, prob in self.draft_tuples(pr):
                law = self._verify(pr, qr, np.array(tokens))
                acc[r] += prob * (1.0 - law.accepted[-1])
                out[r] += prob * law.emitted
                for i, x in enumerate(tokens):
                    if qr[x] <= 0:
                        outside[r] += prob * law.accepted[i]
        shape = q.shape[:-1]
        return acc.reshape(shape), out.reshape(q.shape), outside.reshape(shape)


def _sample_rows(rng, weights):
    """One index per row of ``weights`` (R, V), with probability proportional to the row."""
    cdf = np.cumsum(weights, axis=-1)
    u = rng.random(len(weights)) * cdf[:, -1]
    return np.minimum((cdf < u[:, None]).sum(-1), weights.shape[-1] - 1)
