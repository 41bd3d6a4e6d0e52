"""The exact probability that speculative decoding emits a given answer (``answer_log_prob``).

Speculative decoding with a token rule R and draft length m emits a token sequence through hidden block states:
k, how many drafts of the current block have been accepted (0..m). From state k < m, the next token y is either
the drafted token, drafted from p (``draft_probs``) and accepted by R at slot k (probability p(y) a_k(y), to state
k + 1), or the token after a rejection (to state 0): sum_x p(x) (1 - a_k(x)) r_k^x(y), where r_k^x is R's
correction after rejecting x. From state m the bonus token is drawn (q, the verifier's row, under the
``"verifier"`` bonus policy; the rule's emitted law at slot m under ``"relaxed"``) and a new block starts.

The rejected draft x sums out, and the two terms from state k add up to R's emitted law at slot k:
pi_k(y) = p(y) a_k(y) + sum_x p(x) (1 - a_k(x)) r_k^x(y). So the whole recursion needs only both models' rows at
the answer's own prefixes (the accepted drafts are the answer's tokens): an answer decoded once, by any method,
has its exact probability under every token rule and every m from those rows alone. The forward recursion runs
over the m + 1 block states, rescaled at each token (its log kept), so answers of thousands of tokens neither
underflow nor lose precision: the result is exact up to float64 rounding (tested against ``sequence_law``'s
enumeration of every draft, accepted length and token, to 1e-12).

An answer's end is a prefix of what the engine would emit next: its probability is the sum over the block
states (an end-of-sequence token or the token limit stops decoding wherever the block stands; an engine that
drafts fewer than m tokens when fewer remain emits the same law of the kept tokens).

Assumptions, as ``speculative_generate`` decodes: drafts are sampled from ``draft_probs`` (not argmax: greedy
drafting is another proposal), one draft per position (block and multi-draft rules are refused), no gate or
drafting policy.
"""

from __future__ import annotations

import numpy as np

from .._math._validation import check_distribution, check_int

__all__ = ["answer_log_prob", "answer_step_factors"]

#: Position rows processed at once: positions x vocabulary at most about this many float64 values a chunk.
_CHUNK_VALUES = 1 << 22


def _rule_of(rule):
    from .._rules._protocol import judgement_of
    from .._rules._registry import as_rule

    rule = as_rule(rule)
    if not judgement_of(rule).per_token:
        raise ValueError(
            f"rule {rule.describe()!r} judges whole blocks or several drafts: answer_log_prob needs a token rule "
            "(its law is a recursion over one draft per position); pass a token rule"
        )
    return rule


def _inputs(draft_probs, target_probs, tokens, logits):
    q = np.asarray(target_probs, dtype=np.float64)
    if q.ndim < 2:
        raise ValueError(f"target_probs must be rows (..., T, V): one row per answer position; got shape {q.shape}")
    q = check_distribution(q, "target_probs")
    p = None
    if draft_probs is not None:
        p = np.asarray(draft_probs, dtype=np.float64)
        if p.shape != q.shape:
            raise ValueError(f"draft_probs must have target_probs' shape {q.shape}; got {p.shape}")
        p = check_distribution(p, "draft_probs")
    y = np.asarray(tokens)
    if y.shape != q.shape[:-1]:
        raise ValueError(
            f"tokens must be one id per row of target_probs (shape {q.shape[:-1]}); got shape {y.shape}: row t is "
            "the law of token t given the prompt and tokens[:t]"
        )
    if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= q.shape[-1]):
        raise ValueError(f"tokens must be integer ids in [0, {q.shape[-1]}) (the rows' vocabulary)")
    if logits is not None and logits.temperature is None:
        raise ValueError("logits: give the temperature the rows were processed with (RuleLogits(temperature=...))")
    return p, q, y.astype(np.int64), logits


def _flat_logits(logits, lead):
    """``logits`` with the leading axes ``lead`` (the answers and their positions) made one."""
    if logits is None:
        return None

    def flat(value):
        value = np.asarray(value)
        rest = value.shape[len(lead) :]
        return np.broadcast_to(value, (*lead, *rest)).reshape(-1, *rest)

    return logits.apply(flat)


def _ms(m):
    many = isinstance(m, (list, tuple, range, np.ndarray))
    ms = [check_int(v, "m", 1, what="drafted tokens per verification") for v in (m if many else [m])]
    if not ms:
        raise ValueError("m: give at least one draft length")
    return ms, many


def answer_step_factors(rule, draft_probs, target_probs, tokens, m, *, bonus_policy="verifier", logits=None):
    """The per-position factors of ``answer_log_prob``, float64 arrays over the answers' positions (..., T):
    "accept" (m, ..., T): p_t(y_t) a_k(y_t), the drafted token accepted at slot k; "reject" (m, ..., T): the token
    after a rejection at slot k, pi_k(y_t) - p_t(y_t) a_k(y_t) (never below 0); "bonus" (m + 1, ..., T): the
    bonus token's probability after k accepted drafts (q_t(y_t) under the verifier's policy, pi_k(y_t) under the
    relaxed one). A rule that is not ``slot_dependent`` has the same factors at every slot. ``m``: the largest
    draft length needed. Exact up to float64 rounding."""
    from .._rules._protocol import BONUS_POLICIES, judgement_of

    rule = _rule_of(rule)
    per_slot = judgement_of(rule).slot_dependent
    if bonus_policy not in BONUS_POLICIES:
        raise ValueError(f"bonus_policy must be one of {BONUS_POLICIES}; got {bonus_policy!r}")
    p, q, y, logits = _inputs(draft_probs, target_probs, tokens, logits)
    if p is None:
        raise ValueError("draft_probs: give the drafter's rows (the law each draft is sampled from)")
    if rule.needs_logits and logits is None:
        raise ValueError(
            f"rule {rule.describe()!r} reads raw logits ({', '.join(rule.needs_logits)}): pass logits=RuleLogits(...) "
            "with a row per answer position"
        )
    m = check_int(m, "m", 1, what="drafted tokens per verification")
    lead = y.shape
    p, q, y = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1]), y.reshape(-1)
    logits = _flat_logits(logits, lead)
    count = y.size
    at = np.arange(count)
    step = max(1, _CHUNK_VALUES // max(1, q.shape[1]))
    done = {}

    def slot(j):
        """(p(y) a_j(y), pi_j(y)) over the positions, the rule at slot j (slot 0 for every slot of a rule that
        is not slot dependent)."""
        j = j if per_slot else 0
        if j not in done:
            judge = rule.at_slot(j)
            a_y, pi_y = np.empty(count), np.empty(count)
            for lo in range(0, count, step):
                part = slice(lo, min(lo + step, count))
                lg = None if logits is None else logits.rows(part)
                with np.errstate(all="ignore"):
                    pi, a = judge.emitted_and_acceptance_all(p[part], q[part], logits=lg)
                pi, a = np.asarray(pi, dtype=np.float64), np.asarray(a, dtype=np.float64)
                a_y[part] = a[at[part] - lo, y[part]]
                pi_y[part] = pi[at[part] - lo, y[part]]
            done[j] = (p[at, y] * a_y, pi_y)
        return done[j]

    accept = np.stack([slot(k)[0] for k in range(m)])
    reject = np.stack([np.maximum(slot(k)[1] - slot(k)[0], 0.0) for k in range(m)])
    if bonus_policy == "verifier":
        bonus = np.broadcast_to(q[at, y], (m + 1, count)).copy()
    else:
        bonus = np.stack([slot(k)[1] for k in range(m + 1)])
    return {
        "accept": accept.reshape(m, *lead),
        "reject": reject.reshape(m, *lead),
        "bonus": bonus.reshape(m + 1, *lead),
    }


def _forward(accept, reject, bonus, m):
    """log P(answer) by the forward recursion over the block states 0..m, rescaled at each token: factors
    (m, ..., T) and (m + 1, ..., T) give (...)."""
    lead = bonus.shape[1:-1]
    alpha = np.zeros((*lead, m + 1))
    alpha[..., 0] = 1.0
    log_scale = np.zeros(lead)
    for t in range(bonus.shape[-1]):
        new = np.empty_like(alpha)
        new[..., 1:] = alpha[..., :m] * np.moveaxis(accept[:m, ..., t], 0, -1)
        new[..., 0] = np.einsum("...k,k...->...", alpha[..., :m], reject[:m, ..., t]) + alpha[..., m] * bonus[m, ..., t]
        total = new.sum(-1)
        alive = total > 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            alpha = np.where(alive[..., None], new / np.where(alive, total, 1.0)[..., None], 0.0)
            log_scale = log_scale + np.log(total)
    return np.where(np.isnan(log_scale), -np.inf, log_scale)


def answer_log_prob(rule, draft_probs, target_probs, tokens, m, *, bonus_policy="verifier", logits=None):
    """The natural log of the exact probability that speculative decoding with ``rule`` at draft length ``m``
    emits ``tokens`` (an answer, or the first tokens of one) after the prompt the rows were computed from.

    Parameters
    ----------
    rule : str, Rule or None
        A token rule (spec or object); None for the verifier alone (sum_t log q_t(y_t), no drafter involved).
    draft_probs, target_probs : array (..., T, V)
        The drafter's and the verifier's processed rows (after the sampling chain) at each answer position:
        row t is the law of token t given the prompt and ``tokens[:t]`` (leading axes: several answers at
        once). V may be a compact support (both rows' kept tokens and the answer's, in the same order in both)
        where the chain confines each law to it.
    tokens : int array (..., T)
        The answer's token ids (indices into the rows' vocabulary).
    m : int or sequence of ints
        Drafted tokens per verification; a sequence gives one log-probability per m (the per-position work
        done once).
    bonus_policy : "verifier" or "relaxed"
        The law of the bonus token after m accepted drafts (``Rule.bonus_distribution``).
    logits : RuleLogits, optional
        Raw logits rows (T, V) for the rules that read them (``Rule.needs_logits``), with the temperature.

    Returns
    -------
    float or array
        log P(tokens), shape (...) (a float for one answer), with a last axis over ``m`` when a sequence of
        draft lengths is given; -inf where the answer cannot be emitted. A lossless rule gives sum_t log q_t(y_t) at
        every m. Exact up to float64 rounding (see the module docstring for the recursion).
    """
    ms, many = _ms(m)
    if rule is None:
        _, q, y, _ = _inputs(draft_probs, target_probs, tokens, None)
        with np.errstate(divide="ignore"):
            value = np.log(np.take_along_axis(q, y[..., None], -1)[..., 0]).sum(-1)
        values = [value] * len(ms)
    else:
        factors = answer_step_factors(
            rule, draft_probs, target_probs, tokens, max(ms), bonus_policy=bonus_policy, logits=logits
        )
        values = [_forward(factors["accept"], factors["reject"], factors["bonus"], k) for k in ms]
    out = np.stack(values, axis=-1) if many else values[0]
    return float(out) if np.ndim(out) == 0 else out
