"""Monte Carlo speculative sampling over a sequence of (draft, verifier) positions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._math._validation import check_int, seeded_rng
from .._rules._protocol import BONUS_POLICIES, judgement_of
from .._rules._registry import as_rule
from .._util._results import Result
from ._gate import fallback_for

__all__ = ["SimulationResult", "simulate"]


@dataclass(frozen=True)
class SimulationResult(Result):
    """What ``simulate`` observed; a result as every other (``records``: one row per position; ``table``).

    Attributes
    ----------
    accepted : int array (blocks,)
        Accepted draft tokens per verification (0..m).
    block_start : int array (blocks,)
        Position at which each block started.
    drafts, accepts : int arrays (T,)
        Drafts verified and drafts accepted at each position.
    emitted_counts : int array (T, V)
        Tokens emitted by the rule at each position (accepted drafts and corrections).
    bonus_counts : int array (T, V)
        Bonus tokens (after m accepted drafts) at each position: from q under the verifier bonus
        policy, from one more step of the rule under the relaxed one.
    m : int
    """

    accepted: np.ndarray
    block_start: np.ndarray
    drafts: np.ndarray
    accepts: np.ndarray
    emitted_counts: np.ndarray
    bonus_counts: np.ndarray
    m: int

    @property
    def accepted_length(self) -> float:
        """Mean accepted draft tokens per verification (AL)."""
        return float(self.accepted.mean()) if self.accepted.size else float("nan")

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's mean acceptance length: 1 + AL."""
        return 1.0 + self.accepted_length

    name = "simulation"

    def records(self) -> list:
        """One row per position: drafts verified there, drafts accepted, the observed acceptance."""
        rate = self.acceptance_rate
        return [
            {
                "position": t,
                "drafts": int(self.drafts[t]),
                "accepts": int(self.accepts[t]),
                "acceptance": float(rate[t]),
            }
            for t in range(self.drafts.shape[0])
        ]

    def table(self) -> str:
        head = (
            f"m = {self.m}: {self.accepted.size} verifications, AL {self.accepted_length:.4f} "
            f"(vLLM's mean acceptance length {self.mean_acceptance_length:.4f})"
        )
        rows = [
            f"{r['position']:>8} {r['drafts']:>7} {r['accepts']:>8} {r['acceptance']:>11.4f}" for r in self.records()
        ]
        return "\n".join([head, f"{'position':>8} {'drafts':>7} {'accepts':>8} {'acceptance':>11}", *rows])

    @property
    def acceptance_rate(self) -> np.ndarray:
        """Observed acceptance per position (NaN where nothing was drafted)."""
        with np.errstate(all="ignore"):
            return np.where(self.drafts > 0, self.accepts / np.maximum(self.drafts, 1), np.nan)


def _sample_rows(rng, probs):
    """One categorical sample per row (inverse CDF)."""
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random(probs.shape[0]) * cdf[:, -1]
    return np.minimum((cdf < u[:, None]).sum(axis=-1), probs.shape[-1] - 1)


def simulate(
    rule,
    draft_probs,
    target_probs,
    m: int,
    n_runs: int = 1000,
    seed=0,
    *,
    logits=None,
    bonus_policy: str = "verifier",
    region=None,
    fallback="sps",
) -> SimulationResult:
    """Seeded Monte Carlo of speculative decoding along fixed positions, vectorised over runs.

    Each of ``n_runs`` independent runs walks the sequence of positions 0..T-1: at position t
    it drafts m tokens (n ~ p at t, t+1, ...), verifies them in order with ``rule`` (accept with
    the rule's probability, else emit a correction token and end the block), and after m
    acceptances emits a bonus token at t+m: from q (``bonus_policy="verifier"``) or by one more
    step of the rule there (``"relaxed"``: draft n ~ p, accept or correct; its law is the rule's
    emitted law). The draft at slot j of a block is judged by ``rule.at_slot(j)`` (the bonus
    by ``rule.at_slot(m)``). The (p, q) of a position do not depend on
    what was emitted before (trace-driven, teacher-forced), which is also what makes the exact
    ``block_statistics`` and ``emitted_distribution`` apply. A run stops when a block would need
    a position past T - 1. Acceptance probabilities come from ``rule.acceptance_all`` (once per
    position) and corrections from ``rule.correction`` (once per distinct rejected token), so
    the cost is dominated by sampling: O(runs x positions x V).

    Parameters
    ----------
    rule : Rule
    draft_probs, target_probs : arrays (T, V)
    m : int >= 1, drafted tokens per verification
    n_runs : int >= 1
    seed : int or numpy Generator
    logits : RuleLogits with (T, V) rows, for the rules that need raw logits
    bonus_policy : "verifier" or "relaxed"
    region : bool array (T,) or None
        Gated relaxation (``RegionGate.mask`` of the positions' tokens): the rule judges the
        positions where it is True and ``fallback`` (a lossless token rule) the others; a
        lossless rule is not gated.
    """
    rule = as_rule(rule)
    if bonus_policy not in BONUS_POLICIES:
        raise ValueError(f"bonus_policy must be one of {BONUS_POLICIES}; got {bonus_policy!r}")
    p, q, lg = rule._host(draft_probs, target_probs, logits)
    if p.ndim != 2:
        raise ValueError(f"draft_probs and target_probs must be (positions, vocabulary); got shape {p.shape}")
    check_int(m, "m", 1)
    check_int(n_runs, "n_runs", 1)
    n_positions, vocab = p.shape
    if n_positions < m + 1:
        raise ValueError(f"a block of m = {m} drafts needs m + 1 = {m + 1} positions; got {n_positions}")
    base, open_ = None, None
    if region is not None:  # gated relaxation: the fallback where the region is closed
        open_ = np.asarray(region, dtype=bool).reshape(-1)
        if open_.shape != (n_positions,):
            raise ValueError(f"region must be one bool per position, shape ({n_positions},); got {np.shape(region)}")
        base = fallback_for(rule, fallback)
    rng = seeded_rng(seed)
    judgement = judgement_of(rule)
    if judgement.block:
        if bonus_policy != "verifier":
            raise ValueError(f"{rule.describe()} judges whole blocks: its bonus token comes from the verifier only")
        return _simulate_blocks(rule, p, q, lg, int(m), int(n_runs), rng)
    if judgement.multi_draft:
        return _simulate_tree(rule, p, q, int(m), int(n_runs), rng, bonus_policy)
    # Acceptance of every (slot, position, token) once; corrections per distinct rejected pair.
    n_slots = m + 1 if judgement.slot_dependent else 1
    slot_rules = [rule.at_slot(j) for j in range(n_slots)]
    accept_tables = [
        np.clip(np.asarray(r.acceptance_all(p, q, logits=lg), dtype=np.float64), 0.0, 1.0) for r in slot_rules
    ]
    if base is not None:  # the fallback's acceptance where the gate is closed
        closed = np.clip(np.asarray(base.acceptance_all(p, q), dtype=np.float64), 0.0, 1.0)
        accept_tables = [np.where(open_[:, None], table, closed) for table in accept_tables]
    corrections: dict[tuple, np.ndarray] = {}

    def slot_of(j):
        return min(j, n_slots - 1)

    def correction_rows(j, t, token):
        keys = (t * vocab + token).tolist()
        missing = sorted({k for k in keys if (slot_of(j), k) not in corrections})
        if missing:
            missing = np.asarray(missing, dtype=np.int64)
            rows_t = missing // vocab
            part = lg.rows(rows_t) if lg is not None else None
            rows = np.asarray(slot_rules[slot_of(j)].correction(p[rows_t], q[rows_t], missing % vocab, logits=part))
            if base is not None:
                shut = ~open_[rows_t]
                if shut.any():
                    rows[shut] = np.asarray(base.correction(p[rows_t[shut]], q[rows_t[shut]], (missing % vocab)[shut]))
            corrections.update(zip([(slot_of(j), k) for k in missing.tolist()], rows, strict=True))
        return np.stack([corrections[slot_of(j), k] for k in keys])

    def rule_step(j, t):
        """One draft at slot j on positions t: (token, accepted, emitted token)."""
        token = _sample_rows(rng, p[t])
        ok = rng.random(t.size) < accept_tables[slot_of(j)][t, token]
        out = token.copy()
        bad = ~ok
        if bad.any():
            out[bad] = _sample_rows(rng, correction_rows(j, t[bad], token[bad]))
        return token, ok, out

    def step(j, t):
        _, ok, out = rule_step(j, t)
        return ok, out

    def bonus(t):
        return _sample_rows(rng, q[t]) if bonus_policy == "verifier" else rule_step(m, t)[2]

    return _walk_chains(step, bonus, m, n_runs, n_positions, vocab)


def _counters(n_runs, n_positions, vocab):
    """A walk's counters, zero: each run's position, and per position the drafts, the accepted drafts, the tokens
    emitted and the bonus tokens."""
    return (
        np.zeros(n_runs, dtype=np.int64),
        np.zeros(n_positions, dtype=np.int64),
        np.zeros(n_positions, dtype=np.int64),
        np.zeros((n_positions, vocab), dtype=np.int64),
        np.zeros((n_positions, vocab), dtype=np.int64),
    )


def _walk_chains(step, bonus_token, m, n_runs, n_positions, vocab):
    """The walk ``simulate`` makes for per-token and tree rules: each run drafts at most m
    positions a block, ``step(j, t)`` gives (accepted, emitted token) at slot j of the blocks at
    positions t, a rejection ends a block, and ``bonus_token(t)`` the token after a full one."""
    position, drafts, accepts, emitted, bonus = _counters(n_runs, n_positions, vocab)
    accepted_blocks, starts = [], []
    while True:
        runs = np.flatnonzero(position + m <= n_positions - 1)
        if runs.size == 0:
            break
        start = position[runs]
        in_block = np.ones(runs.size, dtype=bool)
        count = np.zeros(runs.size, dtype=np.int64)
        for j in range(m):
            live = np.flatnonzero(in_block)
            if live.size == 0:
                break
            t = start[live] + j
            ok, out = step(j, t)
            np.add.at(drafts, t, 1)
            np.add.at(accepts, t[ok], 1)
            np.add.at(emitted, (t, out), 1)
            count[live[ok]] += 1
            in_block[live[~ok]] = False
        full = np.flatnonzero(in_block)
        if full.size:
            t = start[full] + m
            np.add.at(bonus, (t, bonus_token(t)), 1)
        accepted_blocks.append(count)
        starts.append(start)
        position[runs] = start + count + 1
    return _result(accepted_blocks, starts, drafts, accepts, emitted, bonus, m)


def _result(accepted_blocks, starts, drafts, accepts, emitted, bonus, m):
    return SimulationResult(
        accepted=np.concatenate(accepted_blocks) if accepted_blocks else np.zeros(0, dtype=np.int64),
        block_start=np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64),
        drafts=drafts,
        accepts=accepts,
        emitted_counts=emitted,
        bonus_counts=bonus,
        m=int(m),
    )


def _simulate_blocks(rule, p, q, lg, m, n_runs, rng):
    """``simulate`` for a block rule: each step drafts all m tokens, draws tau from the rule's
    ``block_law`` and the token emitted after it (the bonus when tau = m)."""
    n_positions, vocab = p.shape
    position, drafts, accepts, emitted, bonus = _counters(n_runs, n_positions, vocab)
    accepted_blocks, starts = [], []
    offsets = np.arange(m)
    while True:
        runs = np.flatnonzero(position + m <= n_positions - 1)
        if runs.size == 0:
            break
        start = position[runs]
        t = start[:, None] + offsets  # (runs, m)
        tokens = _sample_rows(rng, p[t].reshape(-1, vocab)).reshape(t.shape)
        rows = start[:, None] + np.arange(m + 1)
        part = lg.rows(rows) if lg is not None else None
        law = rule.block_law(p[t], q[rows], tokens, logits=part)
        tau = _sample_rows(rng, law.accepted)
        out = _sample_rows(rng, law.emitted[np.arange(runs.size), tau])
        np.add.at(drafts, t.ravel(), 1)
        kept = offsets[None, :] < tau[:, None]
        np.add.at(accepts, t[kept], 1)
        np.add.at(emitted, (t[kept], tokens[kept]), 1)
        full = tau == m
        np.add.at(emitted, (start[~full] + tau[~full], out[~full]), 1)
        np.add.at(bonus, (start[full] + m, out[full]), 1)
        accepted_blocks.append(tau)
        starts.append(start)
        position[runs] = start + tau + 1
    return _result(accepted_blocks, starts, drafts, accepts, emitted, bonus, m)


def _simulate_tree(rule, p, q, m, n_runs, rng, bonus_policy):
    """``simulate`` for a multi-draft rule: a tree of depth m, k drafts verified per level."""
    n_positions, vocab = p.shape
    k = rule.draft_count
    laws: dict[bytes, tuple] = {}  # (position, drafts) -> (P(draft i accepted; none), residual law)

    def level(t):
        """One level at positions t: (accepted, emitted token)."""
        drafts = np.asarray(rule.sample_drafts(rng, p[t]), dtype=np.int64).reshape(t.size, k)
        keys = np.concatenate([t[:, None], drafts], axis=1)
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        accept_law, rest = np.empty((len(unique), k + 1)), np.empty((len(unique), vocab))
        for u, key in enumerate(unique):
            tag = key.tobytes()
            if tag not in laws:
                law = rule.verify(p[key[0]], q[key[0]], key[1:])
                left = law.emitted.copy()
                for i, x in enumerate(key[1:].tolist()):
                    if x >= 0:
                        left[x] -= law.accepted[i]
                left = np.maximum(left, 0.0)
                laws[tag] = (law.accepted, left / left.sum() if left.sum() > 1e-300 else q[key[0]])
            accept_law[u], rest[u] = laws[tag]
        inverse = inverse.reshape(-1)
        choice = _sample_rows(rng, accept_law[inverse])
        ok = choice < k
        out = np.where(ok, drafts[np.arange(t.size), np.minimum(choice, k - 1)], 0)
        bad = np.flatnonzero(~ok)
        if bad.size:
            out[bad] = _sample_rows(rng, rest[inverse[bad]])
        return ok, out

    def bonus(t):
        return _sample_rows(rng, q[t]) if bonus_policy == "verifier" else level(t)[1]

    return _walk_chains(lambda j, t: level(t), bonus, m, n_runs, n_positions, vocab)
