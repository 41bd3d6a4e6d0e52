"""Drafting policies: when to stop drafting a block early, from the drafter's own distribution.

A policy looks at the drafter's processed distribution p at each place of the block before it
drafts there, and stops the block when the drafter is unsure. The drafter's distribution at
every position is in a trace, so a policy's accepted length, drafted tokens and draft forwards
per step are exact under the analysis's model of independent positions (``policy_blocks``).

- ``fixed``: always m drafts.
- ``p-min(threshold)``: llama.cpp's ``--draft-p-min`` (common/speculative.cpp): stop when the
  drafter's top-1 probability falls below ``threshold``.
- ``entropy(threshold)``: stop when the entropy of p exceeds ``threshold`` nats.
- ``accept-prob(threshold)``: stop when the drafter's estimate that every draft so far is
  accepted, the product of its top-1 probabilities (EAGLE-2 uses the drafter's confidence as
  its acceptance estimate), falls below ``threshold``.
- ``cost-optimal``: the myopic cost-optimal length under a cost model: draft one more token
  while the tokens it is expected to add (the acceptance estimate above) per second it costs
  (a draft forward and the verifier block's growth) exceed the step's tokens per second so far.
  Needs a cost model (the planner's): not for real decoding.
- ``llama.cpp(p_min=P, n_min=N)``: llama-server's own drafting (``draft-simple`` in
  common/speculative.cpp of the llama.cpp that llama-cpp-python 0.3.36 ships): the drafter drafts
  its argmax (greedy: analyse with draft mode "greedy"), stops before a place where the top-1
  probability of its top-10 at temperature 1 (its sampler chain there: top-k 10, then the
  softmax) falls below P, drafts at most m (``--spec-draft-n-max``), and a block of fewer than N
  drafts is dropped (``--spec-draft-n-min``: the step decodes one token alone). The drafter
  also processes every batch the verifier does (draft-simple's ``process``: the verifier's block
  of the sampled token and the L drafts, one output row), so a step's draft forwards are its own
  (L + 1, or m) plus that one, and the L other tokens of the block are charged at the cost of a
  token in a forward of several (``mirrors_verifier_block``, ``CostModel.draft_read_token``).
  Exact under independent positions, like every policy here; its stop reads ``LLAMA_DRAFT_READS``
  of the trace (the top-10 must be stored: K >= 10).
- ``adaptive-verify``: draft m tokens, then verify only the first L of them, the L in 0..m that
  maximises the expected tokens of the step per second of it: (1 + sum_{j<=L} prod_{i<=j} c_i) /
  (m t_draft + t_verify(L + 1)), with c_i the drafter's top-1 probability at place i as the
  acceptance estimate (the survival of TensorRT-LLM's DSpark planner and vLLM's adaptive
  verification, PRs 47808 / 52228). The drafts past L are discarded: the step pays m draft
  forwards and a verifier block of L + 1. Needs a cost model, like ``cost-optimal``.

The stop decision at place j reads p at that place, which costs a draft forward: a block that
stops early after L drafts ran L + 1 draft forwards, one that reaches m ran m, plus one more when
every draft is accepted (the drafter's cache has not seen its last draft: it reads it with the
bonus token before the next block), charged with that chance: so a policy that never stops costs
exactly what fixed blocks of m cost (``policy_blocks(None, ...)``). For ``adaptive-verify`` the
block's "drafted" tokens are the drafts it verifies (L) and its draft forwards are m, plus the
chance that all L are accepted. ``llama.cpp``'s drafter reads the verifier's block every step (one
forward, counted), so it has no such extra forward.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from .._math._kernels import renewal_rows
from .._math._sampling import SamplingSettings
from .._math._validation import check_int, host_probabilities
from ._emitted import _entropy

__all__ = [
    "AUTO_POLICIES",
    "DRAFT_POLICIES",
    "LLAMA_DRAFT_READS",
    "DraftPolicy",
    "fixed_blocks",
    "make_draft_policy",
    "policy_blocks",
    "renewal_steps",
    "renewal_steps_many",
    "renewal_visits",
]

DRAFT_POLICIES = ("fixed", "p-min", "entropy", "accept-prob", "cost-optimal", "adaptive-verify", "llama.cpp")
#: What llama.cpp's draft-simple reads to stop a block: the drafter's top-10 at temperature 1.
LLAMA_DRAFT_READS = SamplingSettings(temperature=1.0, top_k=10, top_p=1.0)
#: The sweep ``plan --draft-policy auto`` compares (each policy at a few thresholds).
AUTO_POLICIES = (
    "p-min(0.2)",
    "p-min(0.4)",
    "p-min(0.6)",
    "p-min(0.8)",
    "entropy(0.5)",
    "entropy(1)",
    "entropy(2)",
    "accept-prob(0.1)",
    "accept-prob(0.3)",
    "accept-prob(0.5)",
    "cost-optimal",
    "adaptive-verify",
)


@dataclass(frozen=True)
class DraftPolicy:
    """One drafting policy (``make_draft_policy`` builds it from a spec string).

    Attributes
    ----------
    kind : str
        One of ``DRAFT_POLICIES``.
    threshold : float or None
        The policy's threshold (``p-min``, ``entropy``, ``accept-prob``; ``llama.cpp``'s p_min).
    min_drafts : int
        ``llama.cpp``'s n_min: a block of fewer drafts is dropped (0: never).
    """

    kind: str = "fixed"
    threshold: float | None = None
    min_drafts: int = 0

    def __post_init__(self):
        if self.kind not in DRAFT_POLICIES:
            raise ValueError(f"draft policy must be one of {', '.join(DRAFT_POLICIES)}; got {self.kind!r}")
        if self.kind == "llama.cpp" and self.threshold is None:
            object.__setattr__(self, "threshold", 0.0)  # llama-server's default p_min
        n = self.min_drafts
        check_int(n, f"draft policy {self.kind}: n_min", 0)
        if n and self.kind != "llama.cpp":
            raise ValueError(f"draft policy {self.kind} takes no n_min (only llama.cpp's does)")
        needs = self.kind in ("p-min", "entropy", "accept-prob", "llama.cpp")
        if needs and self.threshold is None:
            raise ValueError(f"draft policy {self.kind} needs a threshold, e.g. {self.kind}(0.4)")
        if not needs and self.threshold is not None:
            raise ValueError(f"draft policy {self.kind} takes no threshold")
        if needs:
            value = self.threshold
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
                raise ValueError(f"draft policy {self.kind}: threshold must be a finite number >= 0; got {value!r}")
            if self.kind in ("p-min", "accept-prob", "llama.cpp") and value > 1:
                raise ValueError(f"draft policy {self.kind}: threshold is a probability in [0, 1]; got {value!r}")

    def describe(self) -> str:
        """The spec string (``make_draft_policy(policy.describe()) == policy``)."""
        if self.kind == "llama.cpp":
            return f"llama.cpp(p_min={self.threshold:g}" + (f", n_min={self.min_drafts})" if self.min_drafts else ")")
        return self.kind if self.threshold is None else f"{self.kind}({self.threshold:g})"

    @property
    def needs_cost(self) -> bool:
        return self.kind in ("cost-optimal", "adaptive-verify")

    @property
    def mirrors_verifier_block(self) -> bool:
        """Whether the drafter also processes the verifier's block every step (llama-server's draft-simple:
        one more draft forward, counted in ``policy_blocks``'s forwards, and the block's L drafts read in it,
        charged by the planner at ``CostModel.draft_read_token`` each)."""
        return self.kind == "llama.cpp"

    @property
    def reads(self) -> SamplingSettings | None:
        """The settings of the drafter's distribution the stop reads, when they are not the trace's
        (``llama.cpp``: ``LLAMA_DRAFT_READS``); None: the drafter's own p (before greedy drafting)."""
        return LLAMA_DRAFT_READS if self.kind == "llama.cpp" else None

    def stop(self, top1, entropy, confidence):
        """Whether to stop before drafting at a place whose p has top-1 probability ``top1`` and
        entropy ``entropy`` (arrays), with ``confidence`` the product of the top-1 probabilities
        of the drafts already made (for ``accept-prob``). ``cost-optimal`` is not decided here."""
        if self.kind in ("p-min", "llama.cpp"):
            return top1 < self.threshold
        if self.kind == "entropy":
            return entropy > self.threshold
        if self.kind == "accept-prob":
            return confidence * top1 < self.threshold
        return np.zeros(np.shape(top1), dtype=bool)


#: The largest n_min a llama.cpp policy takes (llama-server's blocks are at most its --draft-max, an int).
MAX_N_MIN = 4096


def text_of(x: float) -> str:
    """A number as a short string (``%g``): a huge value is not printed in full."""
    return f"{x:g}"


def make_draft_policy(spec) -> DraftPolicy | None:
    """A DraftPolicy from ``"p-min(0.4)"``, ``"entropy(threshold=1.5)"``, ``"accept-prob(0.3)"``,
    ``"cost-optimal"``, ``"adaptive-verify"``, ``"llama.cpp(p_min=0.5, n_min=2)"`` (or ``"llama.cpp(0.5)"``)
    or ``"fixed"`` (None and "fixed" give None: always m drafts)."""
    if spec is None or isinstance(spec, DraftPolicy):
        return None if spec is None or spec.kind == "fixed" else spec
    if not isinstance(spec, str):
        raise ValueError(f"draft policy must be a spec string such as 'p-min(0.4)'; got {spec!r}")
    match = re.fullmatch(r"\s*([a-z.-]+)\s*(?:\(([^()]*)\))?\s*", spec.lower())
    if not match:
        raise ValueError(f"draft policy {spec!r} is not of the form name or name(threshold)")
    kind, raw = match.group(1), match.group(2)
    if kind not in DRAFT_POLICIES:
        raise ValueError(f"draft policy {spec!r}: unknown policy {kind!r}; the policies: {', '.join(DRAFT_POLICIES)}")
    names = ("p_min", "n_min") if kind == "llama.cpp" else ("threshold",)
    values = {}
    parts = [p.strip() for p in (raw or "").split(",") if p.strip()]
    for i, part in enumerate(parts):
        key, sep, text = part.partition("=")
        if not sep and i >= len(names):
            raise ValueError(
                f"draft policy {spec!r}: {kind} takes at most {len(names)} value(s) ({', '.join(names)}); "
                f"got {len(parts)}"
            )
        key, text = (key.strip(), text.strip()) if sep else (names[i], part)
        if key not in names:
            raise ValueError(f"draft policy {spec!r}: {key!r} is not a parameter of {kind} (its: {', '.join(names)})")
        if key in values:
            raise ValueError(f"draft policy {spec!r}: {key} is given twice; give it once")
        try:
            values[key] = float(text)
        except ValueError:
            raise ValueError(f"draft policy {spec!r}: {key} = {text!r} is not a number") from None
        if not math.isfinite(values[key]):
            raise ValueError(f"draft policy {spec!r}: {key} = {text!r} must be a finite number")
    if kind == "llama.cpp":
        n_min = values.get("n_min", 0.0)
        if n_min != int(n_min) or not 0 <= n_min <= MAX_N_MIN:
            raise ValueError(
                f"draft policy {spec!r}: n_min must be a whole number of drafts in [0, {MAX_N_MIN}] (a "
                f"block shorter than it is dropped); got {text_of(n_min)}"
            )
        policy = DraftPolicy(kind, values.get("p_min", 0.0), int(n_min))
    else:
        policy = DraftPolicy(kind, values.get("threshold"))
    return None if policy.kind == "fixed" else policy


def draft_features(p):
    """(top-1 probability, entropy in nats) of each row of the drafter's distributions (T, V)."""
    p = np.asarray(p, dtype=np.float64)
    return p.max(axis=-1), _entropy(p)


def policy_blocks(policy, draft_probs, beta, m, cost=None, features=None):
    """Per block start t of a sequence, under ``policy``: (AL_t, drafted tokens L_t, draft
    forwards). ``beta``: the rule's acceptance per position (T,) or per slot (slots, T); ``m``
    the largest block. Exact under independent positions: the policy reads only p, so L_t is
    fixed by the trace and AL_t = sum_{j=1}^{L_t} prod_{i<j} beta_{t+i}. Positions past the end
    count as rejections (the block is cut there). ``cost`` (a CostModel) for ``cost-optimal``.
    ``features``: (top-1 probability, entropy) per position of the distribution the stop reads
    (``DraftPolicy.reads``; default: those of ``draft_probs``). ``policy`` None: fixed blocks of m
    (``draft_probs`` only gives the length). The draft forwards are expected values (floats): a
    block that drafts all m runs one more forward when every draft is accepted (module docstring)."""
    if features is not None:
        top1, entropy = (np.asarray(x, dtype=np.float64) for x in features)
    elif policy is None:  # fixed blocks read nothing of p
        top1 = entropy = np.zeros(np.shape(draft_probs)[0])
    else:
        top1, entropy = draft_features(host_probabilities(draft_probs, "draft_probs"))
    beta = np.asarray(beta, dtype=np.float64)
    if beta.shape[-1:] != top1.shape or beta.ndim not in (1, 2) or not np.all((beta >= 0) & (beta <= 1)):
        raise ValueError(
            f"beta must be acceptance probabilities in [0, 1] per position, shape ({top1.shape[0]},) or (slots, "
            f"{top1.shape[0]}); got shape {beta.shape}" + (" with values outside [0, 1] or NaN" if beta.size else "")
        )
    per_slot = beta.ndim == 2
    n = top1.shape[0]
    if policy is not None and policy.needs_cost and cost is None:
        raise ValueError(f"draft policy {policy.kind} needs a cost model (plan with --cost or --cost-ratio)")
    if policy is not None and policy.kind == "adaptive-verify":
        return _adaptive_verify(top1, beta, per_slot, m, cost)
    starts = np.arange(n)
    al = np.zeros(n)
    drafted = np.zeros(n, dtype=np.int64)
    forwards = np.zeros(n)
    live = np.ones(n, dtype=bool)
    reach = np.ones(n)  # P(every draft so far accepted)
    confidence = np.ones(n)  # the drafter's estimate of it
    expected, seconds = np.ones(n), None
    if policy is not None and policy.needs_cost:
        seconds = np.full(n, float(cost.verify(1)))
    for j in range(m):
        pos = starts + j
        inside = pos < n
        at = np.minimum(pos, n - 1)
        live &= inside
        forwards += live  # reading p at this place takes the draft forward there
        if policy is not None:
            if policy.needs_cost:
                gain = confidence * top1[at]
                extra = cost.draft_time() + cost.verify(j + 2) - cost.verify(j + 1)
                go = gain * seconds > expected * extra  # gain / extra > expected / seconds, without dividing
                expected = np.where(live & go, expected + gain, expected)
                seconds = np.where(live & go, seconds + extra, seconds)
            else:
                go = ~policy.stop(top1[at], entropy[at], confidence)
            live &= go
        b = beta[min(j, beta.shape[0] - 1), at] if per_slot else beta[at]
        reach = np.where(live, reach * b, reach)
        al += np.where(live, reach, 0.0)
        drafted += live
        confidence = np.where(live, confidence * top1[at], confidence)
    if policy is not None and policy.kind == "llama.cpp":
        dropped = drafted < policy.min_drafts  # n_min: the block is thrown away, one token decoded alone
        al = np.where(dropped, 0.0, al)
        drafted = np.where(dropped, 0, drafted)
        return al, drafted, forwards + 1.0  # the drafter processes the verifier's block too (its one output row)
    # a block that drafted all m never read p past its last draft: when every draft is accepted the drafter
    # runs one more forward (its cache must see the last draft before the next block), with that chance
    return al, drafted, forwards + np.where(live, reach, 0.0)


def _step_laws(beta, drafted, rows, survival=None):
    """P(a step at position t accepts a drafts), a = 0..max(drafted), for t = 0..rows - 1: (rows, M + 1), a step
    at t drafting min(drafted[t], N - t) tokens (a block cannot draft past the sequence's end) and accepting the
    first j of them with prod_{i<j} beta_{t+i} (per slot: ``beta[j]``), or with ``survival[t, j - 1]`` (a
    block rule's own P(A >= j) per start)."""
    n = drafted.shape[0]
    top = int(drafted[:rows].max(initial=0))
    length = np.minimum(drafted[:rows], n - np.arange(rows))
    inside = np.arange(top)[None, :] < length[:, None]
    if survival is not None:
        found = np.zeros((rows, top))
        width = min(top, survival.shape[1])
        found[:, :width] = survival[:rows, :width]
        reach = np.concatenate([np.ones((rows, 1)), np.where(inside, found, 0.0)], axis=-1)
    else:
        at = np.minimum(np.arange(rows)[:, None] + np.arange(top)[None, :], n - 1)
        if beta.ndim == 2:
            b = beta[np.minimum(np.arange(top), beta.shape[0] - 1)[None, :], at]
        else:
            b = beta[at]
        reach = np.concatenate([np.ones((rows, 1)), np.cumprod(np.where(inside, b, 0.0), axis=-1)], axis=-1)
    law = reach.copy()
    law[:, :-1] -= reach[:, 1:]
    return law, length


def renewal_steps(beta, drafted, forwards, m, start=1, stop=None, survival=None):
    """The steps decoding a sequence takes under a drafting policy (or fixed blocks), exact under independent positions.

    A step at position t drafts ``drafted[t]`` tokens (``policy_blocks``; cut at the sequence's end),
    accepts A of them (P(A >= j) = prod_{i<j} beta_{t+i}, or ``survival[t, j - 1]``: a block rule's law
    per block start) and emits A + 1 tokens, so the next step starts at t + 1 + A. Decoding visits the
    positions by this chain, not each once: where drafts fail it takes a step per token. The steps
    counted are those starting at ``start`` (1: position 0 comes from the prompt's processing) to
    ``stop`` (default: the last position; the planner stops where a whole block no longer fits, as the
    start average does, so a trace cut short does not count its cut blocks); each quantity x solves
    x_t = c_t + sum_a P(A_t = a) x_{t+1+a} (x = 0 past ``stop``): one unit upper-triangular banded system
    (LAPACK's ``tbtrs``) with a right-hand side per quantity: (expected steps, accepted drafts, drafted
    tokens and draft forwards summed over them, expected steps with L drafts for L = 0..m).
    ``beta``: acceptance per position (T,) or per slot (slots, T)."""
    from scipy.linalg import lapack

    drafted = np.asarray(drafted, dtype=np.int64)
    forwards = np.asarray(forwards, dtype=np.float64)
    n, m = drafted.shape[0], int(m)
    stop = n - 1 if stop is None else min(int(stop), n - 1)
    if stop < start:
        return 0.0, 0.0, 0.0, 0.0, np.zeros(m + 1)
    rows = stop + 1  # positions past stop count nothing: the system ends there
    beta = None if beta is None else np.asarray(beta, dtype=np.float64)
    survival = None if survival is None else np.asarray(survival, dtype=np.float64)
    law, length = _step_laws(beta, drafted, rows, survival)
    width = law.shape[1]  # a step moves 1 .. width positions on
    # (I - P) in LAPACK's upper band storage: row width - j holds the diagonal + j; the unit diagonal is implied
    band = np.zeros((width + 1, rows))
    for a in range(min(width, rows - 1)):
        j = a + 1
        band[width - j, j:] = -law[: rows - j, a]
    rhs = np.zeros((rows, 4 + m + 1))
    rhs[:, 0] = 1.0
    rhs[:, 1] = law @ np.arange(width)
    rhs[:, 2] = length
    rhs[:, 3] = forwards[:rows]
    rhs[np.arange(rows), 4 + np.minimum(length, m)] = 1.0
    x, info = lapack.dtbtrs(band, rhs, uplo="U", trans="N", diag="U")
    if info != 0:  # pragma: no cover - a unit triangular system always solves
        raise RuntimeError(f"renewal_steps: LAPACK tbtrs failed (info {info})")
    out = x[start]
    return float(out[0]), float(out[1]), float(out[2]), float(out[3]), np.array(out[4:])


def fixed_blocks(beta, offsets, m, *, survival=None):
    """``policy_blocks(None, ...)`` of every sequence of a batch at once: (drafted tokens L_t, draft forwards)
    per position of the stacked sequences (``offsets``: each sequence's first position, N at the end), a block at
    t drafting min(m, its sequence's end - t) and, when it drafts all m, one more forward with the chance that
    all m are accepted (the same products, in the same order, as ``policy_blocks``: the same bits). With
    ``survival`` (N, m), a whole-block rule's P(A >= j) per start, that chance is its last column (``beta`` is
    then not read)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n, m = int(offsets[-1]), int(m)
    ends = np.repeat(offsets[1:], np.diff(offsets))  # each position's sequence end
    drafted = np.minimum(m, ends - np.arange(n))
    if survival is not None:
        return drafted, drafted + np.where(drafted == m, survival[:, m - 1], 0.0)
    beta = np.asarray(beta, dtype=np.float64)
    index = np.arange(n)[:, None] + np.arange(m)[None, :]
    at = np.minimum(index, n - 1)
    b = beta[np.minimum(np.arange(m), beta.shape[0] - 1)[None, :], at] if beta.ndim == 2 else beta[at]
    reach = np.ones(n)
    for j in range(m):  # as policy_blocks multiplies: one place at a time
        reach = reach * b[:, j]
    return drafted, drafted + np.where(drafted == m, reach, 0.0)


def renewal_steps_many(beta, offsets, drafted, forwards, m, *, survival=None):
    """``renewal_steps`` of every sequence of a batch at once (one compiled walk with numba, else one banded
    solve; the two agree to rounding): (S, 4 + m + 1) per sequence (steps,
    accepted drafts, drafted tokens, draft forwards, steps by drafted length), counting the steps from its
    position 1 (0 when it is no longer than m) to its last start where a whole block fits, as the analysis
    does. ``beta``, ``drafted``, ``forwards`` per stacked position (``offsets`` as in ``fixed_blocks``);
    ``survival`` (N, m): a whole-block rule's P(A >= j) per start in place of the prefix products of beta.
    The sequences are one system with two rows of nothing between them (a step past a sequence's end lands
    there), so each answer is its sequence's own. Both walk forwards (the expected steps starting at each
    position, one right-hand side), so their sums run in another order than ``renewal_steps``'s: the same
    values to rounding (``tests/math/test_kernels.py`` checks all three)."""
    from scipy.linalg import lapack

    offsets = np.asarray(offsets, dtype=np.int64)
    drafted = np.asarray(drafted, dtype=np.int64)
    forwards = np.asarray(forwards, dtype=np.float64)
    m = int(m)
    compiled = renewal_rows(beta, survival, drafted, forwards, offsets, m)  # the same walk, compiled
    if compiled is not None:
        return compiled
    count, n = len(offsets) - 1, int(offsets[-1])
    lengths = np.diff(offsets)
    # position t of sequence i sits at row offsets[i] + 2 i + t; the two rows after each sequence hold nothing (a
    # step from t accepting all of its min(L, n - t) drafts lands at most at n + 1)
    rows_of = np.arange(n) + 2 * np.repeat(np.arange(count), lengths)
    total = n + 2 * count
    ends = np.repeat(offsets[1:], lengths)
    local = np.arange(n) - np.repeat(offsets[:-1], lengths)
    length = np.minimum(drafted, ends - np.arange(n))
    top = int(length.max(initial=0))
    inside = np.arange(top)[None, :] < length[:, None]
    if survival is not None:
        found = np.zeros((n, top))
        found[:, : min(top, survival.shape[1])] = survival[:, :top]
        reach = np.concatenate([np.ones((n, 1)), np.where(inside, found, 0.0)], axis=-1)
    else:
        beta = np.asarray(beta, dtype=np.float64)
        at = np.minimum(np.arange(n)[:, None] + np.arange(top)[None, :], n - 1)
        b = beta[np.minimum(np.arange(top), beta.shape[0] - 1)[None, :], at] if beta.ndim == 2 else beta[at]
        reach = np.concatenate([np.ones((n, 1)), np.cumprod(np.where(inside, b, 0.0), axis=-1)], axis=-1)
    law = reach.copy()
    law[:, :-1] -= reach[:, 1:]
    width = law.shape[1]
    first = np.where(lengths - m >= 1, 1, 0)
    last = np.maximum(lengths - m, first)
    counted = (local >= np.repeat(first, lengths)) & (local <= np.repeat(last, lengths))
    # the expected number of steps that start at each row (v = e_first + P^T v: one banded solve, the
    # transposed system), then every quantity is a sum over the rows a sequence's steps start at
    band = np.zeros((width + 1, total), order="F")  # LAPACK's layout: no copy on the way in
    full_law = np.zeros((total, width))
    full_law[rows_of] = law
    for a in range(min(width, total - 1)):
        j = a + 1
        band[width - j, j:] = -full_law[: total - j, a]
    start_rows = offsets[:-1] + 2 * np.arange(count) + first
    unit = np.zeros((total, 1), order="F")
    unit[start_rows, 0] = 1.0
    x, info = lapack.dtbtrs(band, unit, uplo="U", trans="T", diag="U", overwrite_b=1)
    if info != 0:  # pragma: no cover - a unit triangular system always solves
        raise RuntimeError(f"renewal_steps_many: LAPACK tbtrs failed (info {info})")
    weight = x[rows_of, 0] * counted  # expected steps starting at each position that count
    per = np.zeros((n, 4 + m + 1))
    per[:, 0] = weight
    per[:, 1] = weight * (law @ np.arange(width))
    per[:, 2] = weight * length
    per[:, 3] = weight * forwards
    per[np.arange(n), 4 + np.minimum(length, m)] = weight
    nonempty = lengths > 0
    out = np.zeros((count, 4 + m + 1))
    out[nonempty] = np.add.reduceat(per, offsets[:-1][nonempty], axis=0)
    return out


def renewal_visits(beta, m, start=1, stop=None):
    """The expected number of steps of fixed blocks of m that start at each position of a sequence (N,), the
    chain of ``renewal_steps`` (acceptance ``beta`` per position, blocks cut at the end; steps counted from
    ``start`` to ``stop``, default the last position): v solves v_u = [u = start] + sum_t P(t -> u) v_t, one
    banded triangular solve. Their sum is ``renewal_steps``'s expected steps; the positions a batch's
    requests sit at, weighted as decoding visits them."""
    from scipy.linalg import lapack

    beta = np.asarray(beta, dtype=np.float64)
    n, m = beta.shape[-1], int(m)
    stop = n - 1 if stop is None else min(int(stop), n - 1)
    out = np.zeros(n)
    if stop < start:
        return out
    rows = stop + 1
    law, _ = _step_laws(beta, np.full(n, m, dtype=np.int64), rows)
    width = law.shape[1]
    band = np.zeros((width + 1, rows))
    for a in range(min(width, rows - 1)):
        band[width - a - 1, a + 1 :] = -law[: rows - a - 1, a]
    unit = np.zeros((rows, 1))
    unit[start] = 1.0
    x, info = lapack.dtbtrs(band, unit, uplo="U", trans="T", diag="U")
    if info != 0:  # pragma: no cover - a unit triangular system always solves
        raise RuntimeError(f"renewal_visits: LAPACK tbtrs failed (info {info})")
    out[:rows] = x[:, 0]
    return out


def _adaptive_verify(top1, beta, per_slot, m, cost):
    """``policy_blocks`` for ``adaptive-verify``: per start, the verified length L* in 0..m that
    maximises (1 + sum_{j<=L} prod_{i<=j} top1_i) / (m' t_draft + t_verify(L + 1)) (m' = the drafts
    that fit before the end of the sequence; ties to the shorter L), and AL_t = sum_{j=1}^{L*}
    prod_{i<j} beta_{t+i} (exact: L* reads only p). Its draft forwards: the m' drafts, plus the
    chance that every verified draft is accepted (the extra forward over the bonus token that a
    fixed block is charged too)."""
    n = top1.shape[0]
    index = np.arange(n)[:, None] + np.arange(m)[None, :]
    inside = index < n
    at = np.minimum(index, n - 1)
    fit = inside.sum(-1)  # drafts the drafter makes before the sequence ends
    survival = np.cumprod(np.where(inside, top1[at], 0.0), axis=-1)
    expected = 1.0 + np.concatenate([np.zeros((n, 1)), np.cumsum(survival, -1)], -1)  # L = 0..m
    lengths = np.arange(m + 1)
    verify = np.array([float(cost.verify(int(length) + 1)) for length in lengths])
    seconds = fit[:, None] * float(cost.draft_time()) + verify[None, :]
    rate = np.where(lengths[None, :] <= fit[:, None], expected / seconds, -np.inf)
    best = np.argmax(rate, axis=-1)  # the first maximum: the shorter L on ties
    if per_slot:
        b = np.stack([beta[min(j, beta.shape[0] - 1), at[:, j]] for j in range(m)], axis=-1)
    else:
        b = beta[at]
    reach = np.cumprod(np.where(inside, b, 0.0), axis=-1)
    al = np.where(lengths[None, 1:] <= best[:, None], reach, 0.0).sum(-1)
    # as a fixed block of L* drafts: one more draft forward when every verified draft is accepted (the
    # drafter then has the bonus token to read), with its probability
    every = np.where(best > 0, np.take_along_axis(reach, np.maximum(best - 1, 0)[:, None], -1)[:, 0], 1.0)
    return al, best.astype(np.int64), fit + every
