"""What every rule family shares, by public names: the NumPy backend (``NUMPY``), input
preparation (``prepare``: validated, aligned, promoted), the generalised speculative sampling pieces
(``ratio_acceptance``, ``residual``, ``gss_emitted``), the raw logits' checks, and the block level's
inputs and prefix-product law."""

from __future__ import annotations

import dataclasses

import numpy as np

from .._math._backend import NumpyBackend, namespace
from .._math._logits import RuleLogits
from .._math._validation import (
    NORMALISATION_ATOL,
    Pending,
    _deferrable,
    check_distribution,
    check_token,
    host_probabilities,
    is_integer,
)

__all__ = [
    "NUMPY",
    "ROLES",
    "SpSOneDraft",
    "block_inputs",
    "checked_logits",
    "emitted_drift",
    "enumerated_block_lengths",
    "enumerated_block_survival",
    "gss_emitted",
    "inverse_cdf_draws",
    "prefix_product_law",
    "prepare",
    "prepare_logits",
    "ratio_acceptance",
    "ratio_acceptance_host",
    "residual",
    "slot_logits",
]


NUMPY = NumpyBackend()


ROLES = ("target", "draft")


def prepare_logits(b, logits, shape, required, owner):
    """Validate ``logits`` against the probabilities' shape; backend arrays, promoted."""
    if logits is not None and not isinstance(logits, RuleLogits):
        raise ValueError(f"logits must be a RuleLogits (raw logits before sampling); got {type(logits).__name__}")
    if not required:
        return None if logits is None else checked_logits(b, logits, shape)
    if logits is None:
        raise ValueError(
            f"{owner} needs the {' and '.join(required)} logits from before temperature / top-k / top-p: "
            f"pass logits=RuleLogits({', '.join(f'{r}=...' for r in required)}, temperature=...) "
            "(a trace gives them with TraceSequence.distributions(..., with_logits=True))"
        )
    missing = [r for r in required if getattr(logits, r) is None]
    if missing:
        raise ValueError(f"{owner} needs logits.{' and logits.'.join(missing)} (raw logits before sampling)")
    return checked_logits(b, logits, shape)


def checked_logits(b, logits, shape):
    changes = {}
    for role in ROLES:
        z = getattr(logits, role)
        if z is None:
            continue
        z = b.promote(b.asarray(z))
        if b.shape(z) != shape:
            raise ValueError(
                f"logits.{role} with shape {b.shape(z)} must have the shape {shape} of target_probs "
                "(one logit per token of the same vocabulary)"
            )
        if b.any(b.isnan(z)):
            raise ValueError(f"logits.{role} contains NaN: check the model's output (overflow in float16?)")
        changes[role] = z
        for extra in ("lse", "floor"):
            value = getattr(logits, f"{role}_{extra}")
            if value is not None:
                changes[f"{role}_{extra}"] = b.asarray(value, like=z)
        known = getattr(logits, f"{role}_known")
        if known is not None:
            changes[f"{role}_known"] = b.asarray(known, dtype=bool) if b.name == "numpy" else b.asarray(known).bool()
    return dataclasses.replace(logits, **changes)


def prepare(
    draft_probs, target_probs, drafted_token=None, *, atol=NORMALISATION_ATOL, validate=True, pending=None, promote=True
):
    """Validate and align inputs: returns (backend, p, q, n, reference for the output dtype).

    p and q are promoted (float16 / bfloat16 -> float32; ``promote=False`` keeps the input's dtype,
    for rules whose torch path computes the vocabulary-wide parts in it); p = one-hot(n) when
    draft_probs is None. ``validate=False`` skips the value checks (finite, non-negative,
    normalised, token range) for callers that have already made them; shapes are still aligned.
    ``pending`` (``_validation.Pending``): checks of tensors on an accelerator are read back when the
    caller settles it, at the end of its call.
    """
    b = namespace(draft_probs, target_probs, drafted_token if not is_integer(drafted_token) else None)
    q_in = (
        check_distribution(target_probs, "target_probs", atol, backend=b, pending=pending)
        if validate
        else b.asarray(target_probs)
    )
    shape = b.shape(q_in)
    vocab = shape[-1]
    q = b.promote(q_in) if promote else q_in
    n = None
    if drafted_token is not None:
        n = (
            check_token(drafted_token, vocab, "drafted_token", b, pending=pending)
            if validate
            else b.asarray(drafted_token)
        )
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
        p_in = (
            check_distribution(draft_probs, "draft_probs", atol, backend=b, pending=pending)
            if validate
            else b.asarray(draft_probs)
        )
        if b.shape(p_in)[-1] != vocab:
            raise ValueError(
                f"draft_probs and target_probs must share one vocabulary (last axis); "
                f"got {b.shape(p_in)[-1]} and {vocab}: map the draft vocabulary onto the verifier's first"
            )
        if b.shape(p_in) != shape:
            raise ValueError(f"draft_probs with shape {b.shape(p_in)} and target_probs with shape {shape} differ")
        p = b.asarray(b.promote(p_in) if promote else p_in, like=q)
    return b, p, q, n, q_in


def residual(b, h, p):
    """norm(max(0, h - p)) over the last axis; where h <= p everywhere (never sampled), h normalised.

    Three passes (difference and clip in place, row sums, division in place) in the common case;
    half precision rows are summed in float32 and divided in place (each entry rounded once). On an
    accelerator, inside a rule's call, rows with no residual mass are repaired when the call
    settles its checks (``Pending``): nothing is read back here.
    """
    r = b.positive_part_of_difference(h, p)
    if b.name == "torch" and b.eps(r) > np.finfo(np.float32).eps:
        z = r.sum(dim=-1, keepdim=True, dtype=b.torch.float32)
    else:
        z = b.sum_last(r, keepdims=True)
    empty = z <= 0
    out = b.divide_rows_(r, b.where(empty, 1.0, z))

    def repair():  # a row with no residual mass: never sampled; h normalised there
        hz = b.sum_last(h, keepdims=True)
        fallback = b.asarray(h / b.where(hz > 0, hz, 1.0), like=out)
        if b.name == "torch":
            out.copy_(b.where(empty, fallback, out))
            return out
        return b.where(empty, fallback, out)

    if b.name == "torch" and b.torch.compiler.is_compiling():  # a fused rule (``FusedRule``): no branch
        hz = b.sum_last(h, keepdims=True)
        return b.where(empty, b.asarray(h / b.where(hz > 0, hz, 1.0), like=out), out)
    pending = Pending.active()
    if pending is not None and _deferrable(out, b):
        pending.add_repair(empty.any(), repair)
        return out
    return repair() if b.any(empty) else out


def ratio_acceptance(b, h_n, p_n):
    """min(1, h(n)/p(n)) for p(n) > 0; 1{h(n) > 0} for p(n) = 0 (the limit)."""
    positive = p_n > 0
    ratio = b.minimum(h_n / b.where(positive, p_n, 1.0), 1.0)
    return b.where(positive, ratio, b.where(h_n > 0, 1.0, 0.0) + 0.0 * h_n)


def ratio_acceptance_host(h, p):
    with np.errstate(all="ignore"):
        return ratio_acceptance(NUMPY, h, p)


def gss_emitted(h, p):
    """pi = min(p, h) + (1 - sum min(p, h)) norm((h - p)+): generalised SpS with an n-independent h."""
    accept = ratio_acceptance_host(h, p)
    rejected = np.sum(p * (1.0 - accept), axis=-1, keepdims=True)
    return p * accept + rejected * residual(NUMPY, h, p)


def prefix_product_law(accept):
    """P(tau = i), i = 0..m, of token-by-token verification with acceptances ``accept`` (..., m):
    a_1 ... a_i (1 - a_{i+1}), and a_1 ... a_m for i = m."""
    m = accept.shape[-1]
    reach = np.concatenate([np.ones((*accept.shape[:-1], 1)), np.cumprod(accept, axis=-1)], axis=-1)
    law = reach.copy()
    law[..., :m] *= 1.0 - accept
    return law


def block_inputs(rule, draft_probs, target_probs, drafted_tokens, logits):
    """(p (..., m, V), q (..., m + 1, V), tokens (..., m), logits) as float64 host arrays, checked
    (distributions, shapes, token range) with the rule's per-position checks."""
    tokens = np.asarray(drafted_tokens)
    if tokens.ndim < 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(
            f"drafted_tokens must be integer token ids of shape (..., m); got dtype {tokens.dtype}, "
            f"shape {tokens.shape}"
        )
    m = tokens.shape[-1]
    q = host_probabilities(target_probs, "target_probs")  # checked within its own dtype's tolerance
    if q.ndim < 2 or q.shape[-2] != m + 1 or q.shape[:-2] != tokens.shape[:-1]:
        raise ValueError(
            f"target_probs with shape {q.shape} must be (..., m + 1, V) for drafted_tokens of shape {tokens.shape}: "
            "the verifier's rows at the m drafted positions and at the bonus position"
        )
    vocab = q.shape[-1]
    if ((tokens < 0) | (tokens >= vocab)).any():
        raise ValueError(f"drafted_tokens must lie in [0, {vocab})")
    if draft_probs is None:  # a drafter without probabilities: one-hot on its drafts
        p = np.zeros((*tokens.shape, vocab))
        np.put_along_axis(p, tokens[..., None], 1.0, axis=-1)
    else:
        p = host_probabilities(draft_probs, "draft_probs")
        if p.shape != (*tokens.shape, vocab):
            raise ValueError(
                f"draft_probs with shape {p.shape} must be (..., m, V) = {(*tokens.shape, vocab)}: the drafter's rows "
                "at the drafted positions"
            )
    # the bonus position has no draft row: a placeholder (never read) so that both check as (..., m + 1, V)
    p_pad = np.concatenate([p, np.full((*tokens.shape[:-1], 1, vocab), 1.0 / vocab)], axis=-2)
    p_host, q_host, lg = rule._host(p_pad, q, logits, validate=False)  # checked above
    return p_host[..., :m, :], q_host, tokens.astype(np.int64), lg


def slot_logits(lg, j, ndim):
    """``lg`` (rows (..., m + 1, V)) at block place j: rows (..., V), per-row values (...)."""
    if lg is None:
        return None
    return lg.apply(lambda value: np.asarray(value)[..., j, :] if np.ndim(value) == ndim else np.asarray(value)[..., j])


class SpSOneDraft:
    """The per-token methods of a block rule whose block of one draft is SpS (block verification,
    FLy, MagicMTP): accept with min(1, q(n)/p(n)), correct from norm((q - p)+), emit q. Put it
    before ``Rule`` among the bases."""

    def _acceptance(self, b, p, q, n, lg):
        return ratio_acceptance(b, b.take_last(q, n), b.take_last(p, n))

    def _correction(self, b, p, q, n, lg):
        return residual(b, q, p)

    def _acceptance_all(self, p, q, lg):
        return ratio_acceptance(NUMPY, q, p)

    def emitted(self, draft_probs, target_probs, *, logits=None):
        """q: a block of one draft is SpS, lossless (exact)."""
        _, q, _ = self._host(draft_probs, target_probs, logits)
        return q


def enumerated_block_lengths(rule, p, q, m, max_support):
    """E[tau] of a block rule per block start of rows (T, V) (T - m + 1 values), exactly: every
    drafted block of a start enumerated (at most ``max_support`` of them, else an error naming
    the start), each weighted by its probability under p and averaged through its exact law
    (``rule.block_law``). Small vocabularies only (V^m blocks a start)."""
    return enumerated_block_survival(rule, p, q, m, max_support).sum(-1)


def enumerated_block_survival(rule, p, q, m, max_support):
    """P(tau >= j) of a block rule per block start of rows (T, V) and j = 1..m, (T - m + 1, m), exactly
    (``enumerated_block_lengths``: every drafted block enumerated, each through ``rule.block_law``)."""
    import itertools

    out = []
    for t in range(p.shape[0] - m + 1):
        supports = [np.flatnonzero(p[t + j] > 0) for j in range(m)]
        count = int(np.prod([s.size for s in supports]))
        if count > max_support:
            raise ValueError(
                f"{rule.describe()}'s exact block length at start {t} needs {count} drafted blocks (more than "
                f"max_support={max_support}): use method='monte-carlo'"
            )
        paths = np.array(list(itertools.product(*supports)), dtype=np.int64).reshape(count, m)
        weight = np.prod(p[t + np.arange(m)[None, :], paths], axis=1)
        rows = q[t : t + m + 1]
        if rows.shape[0] == m:  # the last start has no bonus row: tau does not read it
            rows = np.concatenate([rows, rows[-1:]])
        law = rule.block_law(
            np.broadcast_to(p[t : t + m], (count, m, p.shape[1])),
            np.broadcast_to(rows, (count, m + 1, q.shape[1])),
            paths,
        )
        beyond = np.flip(np.cumsum(np.flip(np.asarray(law.accepted, dtype=np.float64), -1), -1), -1)
        out.append(weight @ beyond[:, 1:])
    return np.array(out, dtype=np.float64).reshape(-1, m)


def emitted_drift(law, count, target, weight, *, renormalise=False):
    """(KL, TV) per row of the token a block slot emits against the verifier's row there, weighted:
    ``law`` (R, V) the unnormalised law of the emitted token, ``count`` (R,) its total (the slot's
    reach: a probability, or a number of sampled blocks), ``target`` (R, V) q, ``weight`` (R,) what
    each row's divergence counts for. pi = law / count (q where count is 0: the slot adds 0);
    ``renormalise`` divides pi by its sum once more (a plug-in law from samples). KL is infinite
    where pi puts mass on a token q excludes. The one formula the lossy block rules' drift goes
    through (FLy exactly, HSD and MagicMTP from their samples)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        pi = np.where(count[:, None] > 0, law / np.where(count > 0, count, 1.0)[:, None], target)
        if renormalise:
            pi = pi / pi.sum(-1, keepdims=True)
        log = np.where(pi > 0, np.log(np.where(pi > 0, pi, 1.0) / np.where(target > 0, target, 1.0)), 0.0)
    kl = weight * np.where((pi > 0) & (target <= 0), np.inf, pi * log).sum(-1)
    tv = weight * 0.5 * np.abs(pi - target).sum(-1)
    return kl, tv


def inverse_cdf_draws(rng, probs, n):
    """``n`` draws from each row of ``probs`` (T, V), (T, n) int64, by the inverse CDF: u ~ U[0, 1)
    (``rng.random((T, n))``, rows in order), the token whose cumulative probability first exceeds u
    (the row's CDF normalised to end at 1). The one sampler of the rules' Monte Carlo over drafted
    blocks (block verification, HSD, MagicMTP)."""
    cdf = np.cumsum(probs, axis=-1)
    cdf /= cdf[:, -1:]
    u = rng.random((probs.shape[0], n))
    out = np.empty(u.shape, dtype=np.int64)
    for t in range(probs.shape[0]):
        out[t] = np.searchsorted(cdf[t], u[t], side="right")
    return np.minimum(out, probs.shape[1] - 1)
