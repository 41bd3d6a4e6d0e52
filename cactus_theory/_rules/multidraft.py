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
import hashlib
import itertools
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._math._kernels import rrs_without_replacement_rows
from .._math._validation import host_probabilities
from ._helpers import NUMPY, ratio_acceptance, residual
from ._protocol import Rule

__all__ = [
    "EagleTree",
    "MultiDraftLaw",
    "MultiDraftOptimal",
    "MultiDraftRule",
    "RecursiveRejectionSampling",
    "SGLangTree",
    "SpecTr",
    "TopChildVerification",
    "optimal_acceptances",
    "optimal_multi_draft_acceptance",
    "optimal_multi_draft_exactness",
    "top_drafts",
]

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
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k (drafts per position) must be an integer >= 1; got {k!r}")
    return _top(host_probabilities(draft_probs, "draft_probs"), k)


def _top(p, k):
    """``top_drafts`` of checked float64 rows."""
    order = np.argsort(-p, axis=-1, kind="stable")
    return order[..., :k]


def _check_k(k):
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k (drafts per position) must be an integer >= 1; got {k!r}")


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


#: The most subsets (of at most k of a row's drafted tokens) the exact optimum without replacement
#: enumerates per row; a row past it is estimated by Monte Carlo (``WITHOUT_REPLACEMENT_PATHS``).
WITHOUT_REPLACEMENT_STATES = 2_000_000
WITHOUT_REPLACEMENT_PATHS = 20_000


def _subset_laws(pr, k):
    """For one row's drafted tokens (probabilities ``pr``, s of them), the law of the *set* of the
    first j draws without replacement, j = 1..min(k, s): [(masks, probabilities)] per j, masks as
    bit sets over the s tokens; None when the sets pass ``WITHOUT_REPLACEMENT_STATES``. Exact: the
    set J is reached from each J - {x} with probability p(x) / (1 - p(J - {x}))."""
    s = pr.size
    if s > 62:
        return None
    bits = np.left_shift(np.int64(1), np.arange(s, dtype=np.int64))
    masks, probs = np.zeros(1, dtype=np.int64), np.ones(1)
    out = []
    for _ in range(min(k, s)):
        free = (masks[:, None] & bits[None, :]) == 0
        if free.size > WITHOUT_REPLACEMENT_STATES:
            return None
        row, token = np.nonzero(free)
        left = (free @ pr)[row]  # the mass not yet drawn, summed (no cancellation)
        step = probs[row] * pr[token] / np.where(left > 0, left, 1.0)
        new = masks[row] | bits[token]
        masks, inverse = np.unique(new, return_inverse=True)
        probs = np.bincount(inverse, weights=step, minlength=masks.size)
        out.append((masks, probs))
    return out


def _without_replacement_gains(p, q, ks, seed=0):
    """max_C [P(the k drafts without replacement all lie in C) - q(C)] per row of (p, q) (R, V),
    for each k in ``ks``: {k: (gains (R,), exact (R,) bool)}. The maximum is over the prefixes of
    ``_cut_order``; P(drafts in C) by the exact law of the drafted set (``_subset_laws``), or for
    a row whose sets are too many, from ``WITHOUT_REPLACEMENT_PATHS`` seeded drafted tuples."""
    rows = p.shape[0]
    top = max(ks)
    gains = {k: np.zeros(rows) for k in ks}
    exact = np.ones(rows, dtype=bool)
    order = _cut_order(p, q)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(p.shape[-1])[None, :].repeat(rows, 0), -1)
    cq = np.cumsum(np.take_along_axis(q, order, -1), -1)
    rng = np.random.default_rng(seed)
    single = (p > 0).sum(-1) == 1  # one drafted token: every draft is it, P(drafts in C) = p(C)
    cp = np.minimum(np.cumsum(np.take_along_axis(p, order, -1), -1), 1.0)
    for k in ks:
        gains[k][single] = np.maximum(np.max(cp[single] - cq[single], axis=-1), 0.0)
    for r in np.flatnonzero(~single):
        support = np.flatnonzero(p[r] > 0)
        ranks = rank[r, support]
        laws = _subset_laws(p[r, support], top)
        if laws is None:
            exact[r] = False
            contained = _sampled_last_ranks(rng, p[r, support], ranks, top, p.shape[-1])
        for k in ks:
            if laws is not None:
                masks, probs = laws[min(k, support.size) - 1]
                members = (masks[:, None] >> np.arange(support.size)[None, :]) & 1
                last = np.max(np.where(members == 1, ranks[None, :], -1), axis=1)
                within = np.cumsum(np.bincount(last, weights=probs, minlength=p.shape[-1]))
            else:
                within = contained[min(k, support.size) - 1]
            gains[k][r] = max(float(np.max(np.minimum(within, 1.0) - cq[r])), 0.0)
    return {k: (gains[k], exact) for k in ks}


def _sampled_last_ranks(rng, pr, ranks, k, vocab):
    """For j = 1..min(k, s): per prefix of the cut order, the share of seeded drafted tuples
    without replacement whose first j draws all lie in it (the exponential race: the j tokens
    with the smallest Exp(1) / p(x) are the first j draws)."""
    n, s = WITHOUT_REPLACEMENT_PATHS, pr.size
    keys = rng.exponential(size=(n, s)) / pr[None, :]
    first = np.argsort(keys, axis=1)[:, : min(k, s)]
    last = np.maximum.accumulate(ranks[first], axis=1)
    return [np.cumsum(np.bincount(last[:, j], minlength=vocab)) / n for j in range(first.shape[1])]


def optimal_multi_draft_acceptance(draft_probs, target_probs, k, drafting="iid"):
    """The largest acceptance any lossless verification of k drafts reaches, for each way of
    drawing them (``drafting``), by max-flow min-cut over token sets C (the cut costs q(C) +
    P(some draft outside C)):

        alpha*(p, q, k) = 1 - max_C [ P(every draft in C) - q(C) ].

    - ``"iid"``: k drafts drawn i.i.d. from p; P(every draft in C) = p(C)^k; for k = 1 it is
      1 - TV(p, q). Khisti et al., ICLR 2025; Hu et al., ICLR 2025.
    - ``"without-replacement"``: k distinct drafts, each from p without the tokens drawn before
      (a row with fewer than k tokens drafts them all). P(every draft in C) from the exact law of
      the drafted *set* (enumerated over sets of at most k of the row's tokens; a row needing more
      than ``WITHOUT_REPLACEMENT_STATES`` is estimated from seeded drafted tuples, and
      ``optimal_multi_draft_exactness`` says which). Hu et al., ICLR 2025, arXiv 2502.18779.
    - ``"top"``: the k most likely tokens of p (ties: the lower id), a fixed set S: alpha* = q(S)
      (EAGLE's and SGLang's lossless tree verification reach it).

    The maximising C is a prefix of the tokens sorted by p(x) / q(x) (tokens with q(x) = 0
    first): one sort per row, O(V log V) for ``"iid"`` and ``"top"`` (checked against a linear
    program over the drafted tuples and, for every scheme, against the brute force over all 2^V
    sets C). Every lossless rule of a scheme accepts at most its scheme's optimum; the schemes'
    optima differ, so a tree rule is measured against its own.

    Examples
    --------
    >>> import numpy as np
    >>> p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.5, 0.3])
    >>> round(float(optimal_multi_draft_acceptance(p, q, 1)), 6)   # 1 - TV
    0.6
    >>> round(float(optimal_multi_draft_acceptance(p, q, 2, drafting="top")), 6)   # q({0, 1})
    0.7
    """
    return _optimum(draft_probs, target_probs, k, drafting)[0]


def optimal_multi_draft_exactness(draft_probs, target_probs, k, drafting="iid"):
    """Per row, True where ``optimal_multi_draft_acceptance`` is exact (every row for ``"iid"``
    and ``"top"``; without replacement, a row whose drafted sets were enumerated)."""
    return _optimum(draft_probs, target_probs, k, drafting)[1]


def _optimum(draft_probs, target_probs, k, drafting):
    _check_k(k)
    _check_drafting(drafting)
    p = host_probabilities(draft_probs, "draft_probs")
    q = host_probabilities(target_probs, "target_probs")
    if p.shape != q.shape:
        raise ValueError(f"draft_probs with shape {p.shape} and target_probs with shape {q.shape} differ")
    return optimal_acceptances(p, q, (k,), drafting)[k]


def optimal_acceptances(p, q, ks, drafting):
    """``optimal_multi_draft_acceptance`` of checked float64 rows (..., V) for several k at once:
    {k: (acceptance (...), exact (...) bool)} (without replacement, one enumeration serves every k)."""
    shape = q.shape[:-1]
    flat_p, flat_q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
    out = {}
    if drafting == "top":
        ranked = _top(flat_p, max(ks))
        taken = np.cumsum(np.take_along_axis(flat_q, ranked, -1), -1)
        for k in ks:
            value = np.clip(taken[:, min(k, ranked.shape[-1]) - 1], 0.0, 1.0)
            out[k] = (value.reshape(shape), np.ones(shape, dtype=bool))
        return out
    if drafting == "iid":
        order = _cut_order(flat_p, flat_q)
        cp = np.minimum(np.cumsum(np.take_along_axis(flat_p, order, -1), -1), 1.0)
        cq = np.cumsum(np.take_along_axis(flat_q, order, -1), -1)
        for k in ks:
            gain = np.maximum(np.max(cp**k - cq, axis=-1), 0.0)  # C = {} gives 0
            out[k] = (np.clip(1.0 - gain, 0.0, 1.0).reshape(shape), np.ones(shape, dtype=bool))
        return out
    # a row of s tokens drafts them all once k >= s: k beyond the widest row's support changes nothing
    support = max(int((flat_p > 0).sum(-1).max(initial=1)), 1)
    effective = {k: min(int(k), support) for k in ks}
    # one enumeration serves every k up to the widest asked: the newest rows' results are kept (the
    # analysis asks for the widest first, then each yardstick rule for its own k on the same rows)
    digest = hashlib.blake2b(flat_p.tobytes() + flat_q.tobytes(), digest_size=16).digest()
    key = (digest, flat_p.shape, WITHOUT_REPLACEMENT_STATES, WITHOUT_REPLACEMENT_PATHS)
    known = _WITHOUT_REPLACEMENT_CACHE.get(key, {})
    if not all(k in known for k in effective.values()):
        widest = max(max(effective.values()), max(known, default=0))
        known = _without_replacement_gains(flat_p, flat_q, tuple(range(1, widest + 1)))
        _WITHOUT_REPLACEMENT_CACHE.clear()
        _WITHOUT_REPLACEMENT_CACHE[key] = known
    for k in ks:
        gain, exact = known[effective[k]]
        out[k] = (np.clip(1.0 - gain, 0.0, 1.0).reshape(shape), exact.reshape(shape))
    return out


#: The newest rows' optimum without replacement, {key: {k: (gains, exact)}}.
_WITHOUT_REPLACEMENT_CACHE: dict = {}


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
        if isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer)) or self.k < 1:
            raise ValueError(f"{type(self).__name__} k (drafts per position) must be an integer >= 1; got {self.k!r}")
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
                return np.concatenate([
                    _rrs_without_replacement(rule, p, q, rows[:half]),
                    _rrs_without_replacement(rule, p, q, rows[half:]),
                ])  # fmt: skip
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
    res = linprog(-np.ones(len(edges)), A_ub=a_ub, b_ub=np.concatenate([probs, q]), bounds=(0, None), method="highs",
                  options=tight)  # fmt: skip
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
