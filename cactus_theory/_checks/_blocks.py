"""The conformance checks of rules that judge more than one draft at a time: block rules (lossless by
enumeration, never below token-wise SpS, their law per block start, their Monte Carlo) and
multi-draft rules (verify, enumeration, the optimum of their drafting scheme, the one-draft form),
against the exact law of the first tokens a rule emits (``_laws._sequence``). Registered in
``CHECKS`` (``_conformance``)."""

from __future__ import annotations

import dataclasses

import numpy as np

from .._laws._lengths import stated_law
from .._laws._sequence import _sequence_law
from .._laws._simulate import simulate
from .._rules._protocol import judgement_of
from ._tools import _close, _position_rows, _true, make_case

#: The tolerance of a law against its enumeration: float64 sums over many terms.
_EXACT = {"rtol": 1e-9, "atol": 1e-12}


def check_block_lossless(rule, seed):
    """A lossless rule emits the verifier's sequence law block after block (enumerated over a
    tiny vocabulary, m = 2, position-dependent distributions): P(y_1..y_4) = q_1(y_1)...q_4(y_4)."""
    if not rule.lossless:
        return "not lossless"
    if rule.needs_logits:
        return "needs logits"
    if _multi(rule):
        return "a multi-draft rule: lossless and multi_enumeration check its law at a position"
    p, q = _position_rows(seed, 8, 3)
    law = _sequence_law(rule, p, q, 2, 4)
    for seq, prob in law.items():
        want = float(np.prod([q[i, y] for i, y in enumerate(seq)]))
        _close(prob, want, f"P{seq} of the emitted sequence is not the verifier's", **_EXACT, p=p, q=q)
    _close(sum(law.values()), 1.0, "the sequence law does not sum to 1", rtol=1e-12, atol=0, p=p, q=q)
    return None


def check_block_at_least_token(rule, seed):
    """A block rule accepts at least as many drafts as token-wise SpS, at every block start (exact)."""
    if not judgement_of(rule).block:
        return "not a block rule"
    from .._laws._block import block_accepted_length

    p, q = _position_rows(seed, 6, 3)
    for m in (1, 2, 3):
        ours = block_accepted_length(rule, p, q, m, method="exact")
        sps = block_accepted_length("sps", p, q, m)
        _true(ours >= sps - 1e-12, f"AL({m}) {ours} below SpS's {sps}", p=p, q=q)
    return None


def check_block_survival(rule, seed):
    """A block rule's law of tau per block start (``block_survival_for``: what the planner walks, the steps
    decoding takes) is the one its ``block_law`` gives, every drafted block enumerated here, non-increasing in
    j, and sums to its ``expected_block_lengths_for``."""
    if not judgement_of(rule).block:
        return "not a block rule"
    if stated_law(rule, "block_survival_for") is None:
        return "states no law per start (block_survival_for): planned over block starts"
    import itertools

    p, q = _position_rows(seed, 6, 3)
    for m in (1, 2, 3):
        _, values, _, survival = rule.block_survival_for(p, q, [m], method="exact")[m]
        want = np.zeros((p.shape[0] - m + 1, m))
        for t in range(p.shape[0] - m + 1):
            rows = q[t : t + m + 1] if t + m < p.shape[0] else np.concatenate([q[t : t + m], q[-1:]])
            for drafts in itertools.product(*[np.flatnonzero(p[t + j] > 0) for j in range(m)]):
                weight = np.prod([p[t + j, x] for j, x in enumerate(drafts)])
                law = np.asarray(rule.block_law(p[t : t + m], rows, np.array(drafts)).accepted, dtype=np.float64)
                want[t] += weight * np.array([law[j:].sum() for j in range(1, m + 1)])
        _close(
            np.asarray(survival),
            want,
            f"P(tau >= j) per start at m = {m} against the enumerated block_law",
            **_EXACT,
            p=p,
            q=q,
        )
        _true(np.diff(survival, axis=-1) <= 1e-12, f"P(tau >= j) increases in j at m = {m}", p=p, q=q)
        means = rule.expected_block_lengths_for(p, q, [m], method="exact")[m][1]
        _close(values, means, f"the law's mean against expected_block_lengths_for, m = {m}", rtol=1e-9, p=p, q=q)
        _close(np.asarray(survival).sum(-1), means, f"sum_j P(tau >= j) against E[tau], m = {m}", rtol=1e-9, p=p, q=q)
    return None


def check_block_monte_carlo(rule, seed):
    """Sampling a block rule (``simulate``) gives its exact accepted length (``block_accepted_length``)."""
    if not judgement_of(rule).block:
        return "not a block rule"
    from .._laws._block import block_accepted_length

    p, q = _position_rows(seed, 9, 4)
    m = 3
    sim = simulate(rule, p, q, m=m, n_runs=6000, seed=seed + 5)
    exact = np.concatenate([block_accepted_length(rule, p, q, m, method="exact"), np.zeros(m)])
    diff = sim.accepted - exact[sim.block_start]
    bound = 4.5 * diff.std() / np.sqrt(diff.size) + 1e-12
    _true(abs(diff.mean()) < bound, f"simulated accepted lengths average {diff.mean():+.4f} off the exact", p=p, q=q)
    return None


def _multi(rule):
    return judgement_of(rule).multi_draft


def _small_multi(rule):
    """The rule at k <= 3 (enumeration over V^k tuples stays small)."""
    return dataclasses.replace(rule, k=min(rule.k, 3)) if rule.k > 3 else rule


def check_multi_verify(rule, seed):
    """A multi-draft rule's ``verify``: P(draft i accepted) and P(none) form a distribution, the
    emitted law is one, and it puts at least the acceptance's mass on each accepted draft."""
    if not _multi(rule):
        return "not a multi-draft rule"
    rng = np.random.default_rng(seed)
    p, q, _ = make_case(seed, int(rng.integers(2, 8)))
    for tokens, _weight in rule.draft_tuples(p)[:50]:
        drafts = np.array(list(tokens) + [-1] * (rule.k - len(tokens)))
        law = rule.verify(p, q, drafts)
        ok = law.accepted.shape == (rule.k + 1,) and (law.accepted >= -1e-15).all()
        _true(ok, f"verify's acceptance law {law.accepted} is not k + 1 probabilities", p=p, q=q, drafts=drafts)
        _close(law.accepted.sum(), 1.0, "verify's acceptance law does not sum to 1", rtol=0, atol=1e-12, p=p, q=q)
        _true(law.emitted >= -1e-15, "verify's emitted law has a negative entry", p=p, q=q, drafts=drafts)
        _close(law.emitted.sum(), 1.0, "verify's emitted law does not sum to 1", rtol=0, atol=1e-12, p=p, q=q)
        for i, x in enumerate(drafts.tolist()):
            if x >= 0:
                _true(
                    law.emitted[x] >= law.accepted[i] - 1e-12,
                    f"draft {i} accepted more often than emitted",
                    p=p,
                    q=q,
                    drafts=drafts,
                )
    return None


def check_multi_enumeration(rule, seed):
    """``multi_acceptance``, ``emitted`` and ``multi_outside_support`` (the rule's fast forms) equal
    the enumeration over every drafted tuple of ``verify`` (k <= 3, V <= 6)."""
    if not _multi(rule):
        return "not a multi-draft rule"
    small = _small_multi(rule)
    p, q, _ = make_case(seed, int(np.random.default_rng(seed).integers(2, 7)), batch=(2,))
    acc, pi, outside = small._enumerate(p, q)
    for fast, enumerated, what in (
        (small.multi_acceptance, acc, "multi_acceptance differs from the enumeration over the drafts"),
        (small.emitted, pi, "the emitted law differs from the enumeration over the drafts"),
        (small.multi_outside_support, outside, "multi_outside_support differs from the enumeration"),
    ):
        _close(fast(p, q), enumerated, what, **_EXACT, p=p, q=q)
    return None


def _best_lossless_acceptance(rule, p, q):
    """1 - max_C [P(every draft in C) - q(C)] over every token set C (max-flow min-cut): what no
    lossless verification of this drafting law can beat (brute force over 2^V sets)."""
    import itertools

    tuples = rule.draft_tuples(p)
    best = 0.0
    vocab = len(q)
    for size in range(vocab + 1):
        for subset in itertools.combinations(range(vocab), size):
            inside = set(subset)
            mass = sum(w for t, w in tuples if set(t) <= inside)
            best = max(best, mass - float(q[list(subset)].sum()))
    return 1.0 - best


def check_multi_below_optimum(rule, seed):
    """A lossless multi-draft rule accepts no more than the maximal coupling of its drafts and q
    allows (brute force over token sets); ``optimal_multi_draft_acceptance`` of the rule's drafting
    scheme equals that brute force."""
    if not _multi(rule):
        return "not a multi-draft rule"
    if not rule.lossless:
        return "not lossless"
    from .._rules import optimal_multi_draft_acceptance

    small = _small_multi(rule)
    p, q, _ = make_case(seed, int(np.random.default_rng(seed).integers(2, 7)))
    bound = _best_lossless_acceptance(small, p, q)
    ours = float(small.multi_acceptance(p, q))
    _true(ours <= bound + 1e-12, f"acceptance {ours} above the lossless optimum {bound}", p=p, q=q)
    closed = float(optimal_multi_draft_acceptance(p, q, small.k, drafting=small.drafting))
    _close(
        closed,
        bound,
        f"optimal_multi_draft_acceptance (drafting={small.drafting}) differs from the brute force",
        rtol=0,
        atol=1e-11,
        p=p,
        q=q,
    )
    return None


def check_multi_single_draft(rule, seed):
    """At k = 1 the rule is its one-draft form (``single()``): the same acceptance, averaged over
    the drafted token, and the same emitted law."""
    if not _multi(rule):
        return "not a multi-draft rule"
    one = dataclasses.replace(rule, k=1)
    single = one.single()
    p, q, _ = make_case(seed, int(np.random.default_rng(seed).integers(2, 9)))
    acc, pi = 0.0, np.zeros(len(q))
    for (token,), weight in one.draft_tuples(p):
        a = float(single.acceptance(p, q, token))
        acc += weight * a
        pi += weight * (a * np.eye(len(q))[token] + (1 - a) * np.asarray(single.correction(p, q, token)))
    _close(
        one.multi_acceptance(p, q),
        acc,
        f"k = 1 differs from {single.describe()}'s acceptance",
        **_EXACT,
        p=p,
        q=q,
    )
    _close(one.emitted(p, q), pi, f"k = 1 differs from {single.describe()}'s emitted law", **_EXACT, p=p, q=q)
    return None
