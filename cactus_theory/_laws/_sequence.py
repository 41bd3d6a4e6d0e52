"""The exact law of the first tokens speculative decoding with a rule emits, in a context-free world of
given rows: every drafted block, accepted length and next token enumerated through the rule's
``block_law`` (small vocabularies only), and its total variation from the verifier's law. What the
sequence-level conformance checks and the results pages' sequence tables compute."""

from __future__ import annotations

import numpy as np

from .._rules import make_rule

__all__ = ["sequence_law", "sequence_tv", "sequence_tv_rows", "small_cases"]


def sequence_law(rule, draft_probs, target_probs, m, length):
    """{tokens: probability} of the first ``length`` tokens that speculative decoding with ``rule``
    emits in a context-free world with rows p (``draft_probs``, (T, V)) and q (``target_probs``,
    (T, V)) at positions 0..T-1 (blocks of m drafts, each started after the last emitted token;
    T >= length + m), exactly: every draft, tau and the token after it enumerated at every step
    through ``block_law`` (V^m drafted blocks a step: small vocabularies only). A lossless rule
    gives prod_i q_i(y_i)."""
    return _sequence_law(
        make_rule(rule) if isinstance(rule, str) else rule,
        np.asarray(draft_probs, dtype=np.float64),
        np.asarray(target_probs, dtype=np.float64),
        int(m),
        int(length),
    )


def small_cases(seeds=(1, 2, 3), positions=8):
    """The small vocabularies the exact sequence-level checks of the results pages use: [(label,
    draft_probs, target_probs)], Sun et al.'s toy pair (p = (2/3, 1/3), q = (1/3, 2/3) at every
    position) and, per seed, position-dependent 3-token rows drawn from a flat Dirichlet."""
    cases = [("toy pair (Sun et al.)", np.array([[2 / 3, 1 / 3]] * positions), np.array([[1 / 3, 2 / 3]] * positions))]
    for seed in seeds:
        rng = np.random.default_rng(seed)
        cases.append(
            (
                f"random, seed {seed}",
                rng.dirichlet(np.ones(3), size=positions),
                rng.dirichlet(np.ones(3), size=positions),
            )
        )
    return cases


def sequence_tv_rows(rules, *, ms=(2, 3), length=4, cases=None):
    """``sequence_tv`` of each rule on each of ``cases`` (default ``small_cases()``) at each m: rows
    {"case", "m", "length", "tv": {rule: total variation}}, what the results pages print."""
    rows = []
    for label, p, q in small_cases() if cases is None else cases:
        for m in ms:
            rows.append(
                {
                    "case": label,
                    "m": m,
                    "length": length,
                    "tv": {rule: sequence_tv(rule, p, q, m, length) for rule in rules},
                }
            )
    return rows


def sequence_tv(rule, draft_probs, target_probs, m, length):
    """The total variation between ``sequence_law`` and the verifier's law of the first ``length``
    tokens, prod_i q_i(y_i): 0 for a lossless rule (exact, by enumeration)."""
    import itertools

    q = np.asarray(target_probs, dtype=np.float64)
    law = sequence_law(rule, draft_probs, q, m, length)
    total = 0.0
    for seq in itertools.product(range(q.shape[-1]), repeat=int(length)):
        total += abs(law.get(seq, 0.0) - float(np.prod([q[i, y] for i, y in enumerate(seq)])))
    return 0.5 * total


def _sequence_law(rule, p, q, m, length):
    """``sequence_law`` of a rule object and float64 rows."""
    import itertools

    vocab = q.shape[-1]
    memo = {}

    def law_from(s):
        if s >= length:
            return {(): 1.0}
        if s in memo:
            return memo[s]
        out = {}
        for drafts in itertools.product(range(vocab), repeat=m):
            weight = float(np.prod([p[s + j, x] for j, x in enumerate(drafts)]))
            if weight == 0.0:
                continue
            block = rule.block_law(p[s : s + m][None], q[s : s + m + 1][None], np.array([drafts]))
            for tau in range(m + 1):
                p_tau = weight * block.accepted[0, tau]
                if p_tau == 0.0:
                    continue
                for y in np.flatnonzero(block.emitted[0, tau] > 0).tolist():
                    head = (*drafts[:tau], y)
                    for tail, p_tail in law_from(s + tau + 1).items():
                        key = (head + tail)[: length - s]
                        out[key] = out.get(key, 0.0) + p_tau * block.emitted[0, tau, y] * p_tail
        memo[s] = out
        return out

    return law_from(0)
