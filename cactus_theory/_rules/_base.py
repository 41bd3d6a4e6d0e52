"""The acceptance-rule protocol and the generalised speculative sampling family.

A rule acts at one position, batched over leading axes. Given the draft distribution p
(``draft_probs``, or None for a drafter without probabilities: one-hot on the drafted token),
the verifier distribution q (``target_probs``) and the drafted token n, it gives

- ``acceptance``: the probability of accepting n,
- ``correction``: the distribution sampled after a rejection,
- ``bonus``: the distribution sampled after all m drafts are accepted (q, for every rule here),
- ``emitted``: the exact distribution of the token emitted at this position, marginalised over
  n ~ p (PAPER.md section 3; ``emitted_distribution``).

Generalised speculative sampling (PAPER.md section 1) covers most rules: a target h (which may
depend on n, and need not be normalised) gives acceptance min(1, h(n)/p(n)) and correction
norm(max(0, h - p)). Rules are frozen dataclasses: hashable, comparable, checked when built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._backend import NumpyBackend, namespace
from .._validation import NORMALISATION_ATOL, check_distribution, check_token

__all__ = ["GeneralizedRule", "Rule", "as_rule", "prepare"]

_NUMPY = NumpyBackend()


def prepare(draft_probs, target_probs, drafted_token=None, *, atol=NORMALISATION_ATOL):
    """Validate and align inputs: returns (backend, p, q, n, reference for the output dtype).

    p and q are promoted (float16 / bfloat16 -> float32); p = one-hot(n) when draft_probs is None.
    """
    b = namespace(draft_probs, target_probs, drafted_token if not isinstance(drafted_token, int) else None)
    q_in = check_distribution(target_probs, "target_probs", atol, backend=b)
    shape = b.shape(q_in)
    vocab = shape[-1]
    q = b.promote(q_in)
    n = None
    if drafted_token is not None:
        n = check_token(drafted_token, vocab, "drafted_token", b)
        try:
            n = b.broadcast_to(n, shape[:-1])
        except (ValueError, RuntimeError):
            raise ValueError(
                f"drafted_token with shape {b.shape(n)} does not match the batch shape {shape[:-1]} of target_probs"
            ) from None
    if draft_probs is None:
        if n is None:
            raise ValueError("draft_probs is None (a drafter without probabilities) needs drafted_token")
        p = b.put_last(q * 0.0, n, 1.0)
    else:
        p_in = check_distribution(draft_probs, "draft_probs", atol, backend=b)
        if b.shape(p_in)[-1] != vocab:
            raise ValueError(
                f"draft_probs and target_probs must share one vocabulary (last axis); "
                f"got {b.shape(p_in)[-1]} and {vocab}: map the draft vocabulary onto the verifier's first"
            )
        if b.shape(p_in) != shape:
            raise ValueError(f"draft_probs with shape {b.shape(p_in)} and target_probs with shape {shape} differ")
        p = b.asarray(b.promote(p_in), like=q)
    return b, p, q, n, q_in


def residual(b, h, p):
    """norm(max(0, h - p)) over the last axis; where h <= p everywhere (never sampled), h normalised."""
    r = b.maximum(h - p, 0.0)
    z = b.sum_last(r, keepdims=True)
    hz = b.sum_last(h, keepdims=True)
    fallback = h / b.where(hz > 0, hz, 1.0)
    return b.where(z > 0, r / b.where(z > 0, z, 1.0), fallback)


@dataclass(frozen=True)
class Rule:
    """Base of every acceptance rule (see the module docstring for the protocol)."""

    #: The emitted distribution equals q exactly, for every p.
    lossless: ClassVar[bool] = False
    #: Acceptance is 0 or 1 given (p, q, n): no coin is flipped.
    deterministic: ClassVar[bool] = False
    #: Short name used by the CLI and in reports.
    name: ClassVar[str] = "rule"

    def acceptance(self, draft_probs, target_probs, drafted_token):
        """Probability of accepting the drafted token, shape (...)."""
        b, p, q, n, ref = prepare(draft_probs, target_probs, drafted_token)
        return b.cast(self._acceptance(b, p, q, n), ref)

    def correction(self, draft_probs, target_probs, drafted_token):
        """Distribution sampled after rejecting the drafted token, shape (..., V)."""
        b, p, q, n, ref = prepare(draft_probs, target_probs, drafted_token)
        return b.cast(self._correction(b, p, q, n), ref)

    def bonus(self, target_probs):
        """Distribution of the bonus token after m accepted drafts: q itself, shape (..., V)."""
        b = namespace(target_probs)
        return check_distribution(target_probs, "target_probs", backend=b)

    def emitted(self, draft_probs, target_probs):
        """Exact distribution of the token emitted at one position, n ~ p marginalised (NumPy, float64).

        Generic O(V^2) evaluation through the per-token interface; rules with structure
        override it with an O(V) or O(V log V) algorithm.
        """
        return emitted_bruteforce(self, draft_probs, target_probs)

    def acceptance_all(self, draft_probs, target_probs):
        """a_n for every token n as the drafted one, shape (..., V) (NumPy, float64).

        ``(draft_probs * acceptance_all).sum(-1)`` is the expected acceptance of one draft.
        Generic loop over tokens; rules with structure override it in O(V).
        """
        p, q = _host_pair(draft_probs, target_probs)
        out = np.empty(np.broadcast_shapes(p.shape, q.shape))
        for token in range(q.shape[-1]):
            n = np.full(out.shape[:-1], token)
            out[..., token] = self.acceptance(p, q, n)
        return out

    # -- to implement ------------------------------------------------------------------------
    def _acceptance(self, b, p, q, n):  # pragma: no cover - abstract
        raise NotImplementedError

    def _correction(self, b, p, q, n):  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class GeneralizedRule(Rule):
    """Generalised speculative sampling with a target h: accept with min(1, h(n)/p(n)), correct
    from norm(max(0, h - p)). Subclasses give ``_target(b, p, q, n)``; ``target_depends_on_token``
    says whether h changes with n (Cactus) or not (SpS, interpolation, lenience, mentored, top-k).
    """

    target_depends_on_token: ClassVar[bool] = False

    def target(self, draft_probs, target_probs, drafted_token=None):
        """The target h this rule plugs into generalised speculative sampling, shape (..., V)."""
        b, p, q, n, ref = prepare(draft_probs, target_probs, drafted_token)
        if n is None and self.target_depends_on_token:
            raise ValueError(f"{self.name}: the target depends on the drafted token; pass drafted_token")
        return b.cast(self._target(b, p, q, n), ref)

    def _target(self, b, p, q, n):  # pragma: no cover - abstract
        raise NotImplementedError

    def _acceptance(self, b, p, q, n):
        h_n = b.take_last(self._target(b, p, q, n), n)
        p_n = b.take_last(p, n)
        return b.where(p_n > 0, b.minimum(h_n / b.where(p_n > 0, p_n, 1.0), 1.0), 1.0)

    def _correction(self, b, p, q, n):
        return residual(b, self._target(b, p, q, n), p)

    def acceptance_all(self, draft_probs, target_probs):
        if self.target_depends_on_token:
            return super().acceptance_all(draft_probs, target_probs)
        p, q = _host_pair(draft_probs, target_probs)
        return _ratio_acceptance(self._target(_NUMPY, p, q, None), p)

    def emitted(self, draft_probs, target_probs):
        """Exact emitted distribution: h does not depend on n, so pi = p a + (1 - sum p a) r. O(V)."""
        if self.target_depends_on_token:
            return super().emitted(draft_probs, target_probs)
        p, q = _host_pair(draft_probs, target_probs)
        h = self._target(_NUMPY, p, q, None)
        accept = _ratio_acceptance(h, p)
        rejected = np.sum(p * (1.0 - accept), axis=-1, keepdims=True)
        return p * accept + rejected * residual(_NUMPY, h, p)


def _ratio_acceptance(h, p):
    with np.errstate(all="ignore"):
        return np.where(p > 0, np.minimum(h / np.where(p > 0, p, 1.0), 1.0), 1.0)


def _host_pair(draft_probs, target_probs):
    """(p, q) as float64 NumPy arrays, validated; torch tensors are copied to the host."""
    b, p, q, _, _ = prepare(draft_probs, target_probs, None)
    return np.asarray(b.to_numpy(p), dtype=np.float64), np.asarray(b.to_numpy(q), dtype=np.float64)


def emitted_bruteforce(rule: Rule, draft_probs, target_probs):
    """pi(x) = sum_n p(n) [a_n 1{x = n} + (1 - a_n) r_n(x)] by looping over every drafted token n.

    O(V^2) time: the independent reference for the fast algorithms (tests, small V).
    """
    p, q = _host_pair(draft_probs, target_probs)
    vocab = q.shape[-1]
    out = np.zeros(np.broadcast_shapes(p.shape, q.shape))
    for token in range(vocab):
        n = np.full(out.shape[:-1], token)
        a = np.asarray(rule.acceptance(p, q, n), dtype=np.float64)
        r = np.asarray(rule.correction(p, q, n), dtype=np.float64)
        w = p[..., token]
        out[..., token] += w * a
        out += (w * (1.0 - a))[..., None] * r
    return out


def as_rule(rule) -> Rule:
    """Check that ``rule`` implements the protocol."""
    if isinstance(rule, Rule):
        return rule
    missing = [m for m in ("acceptance", "correction", "bonus", "emitted") if not callable(getattr(rule, m, None))]
    if missing:
        raise ValueError(f"rule must implement acceptance, correction, bonus and emitted; {rule!r} lacks {missing}")
    return rule
