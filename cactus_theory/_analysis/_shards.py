"""The work of one shard of a trace: per sequence and rule, the sums the analysis resamples
(``SequenceStats``: per-position metrics, per m and drafting policy the blocks' accepted length,
drift and the steps decoding takes). What is summed is decided here; how shards are spread over
processes or a Dask cluster in ``_engines``; the rows, intervals and tables in ``_analyze``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from .._data._prompts import prompt_seed
from .._data._trace import Trace
from .._laws._block import draft_rows
from .._laws._emitted import block_sums, step_metrics
from .._laws._gate import gated_rule
from .._laws._lengths import accepted_lengths, stated_law
from .._laws._policies import draft_features, fixed_blocks, policy_blocks, renewal_steps_many
from .._math._kernels import block_pass
from .._math._sampling import SamplingSettings
from .._math._validation import is_integer
from .._rules import judgement_of, optimal_acceptances
from .._rules._helpers import prepare

#: The metrics ``step_metrics`` gives per position, summed per sequence.
__all__ = ["BlockStats", "RuleStats", "SequenceStats", "ShardJob", "shard_statistics"]

_POSITION_METRICS = ("acceptance", "acceptance_outside_support", "kl_emitted_target", "tv", "entropy_change")


#: A block rule's AL is enumerated exactly where each block start's weights take at most this many
#: values, else estimated by Monte Carlo (``block_accepted_length``).
BLOCK_EXACT_SUPPORT = 10_000


@dataclass(frozen=True)
class ShardJob:
    """One task of the analysis: the statistics of ``rules`` over one shard of one trace (what a
    worker process or a Dask worker runs, ``shard_statistics``)."""

    directory: str  # absolute: a worker of a remote cluster does not run in this directory
    shard: int
    rules: tuple
    ms: tuple
    settings: SamplingSettings
    bonus_policy: str = "verifier"
    tasks: tuple | None = None  # only the sequences of these tasks
    draft_mode: str = "sampled"
    block_paths: int = 1024
    policies: tuple = ()  # drafting policies (``DraftPolicy``) analysed besides fixed blocks
    cost: object = None  # a CostModel, for the cost-optimal drafting policy
    position_acceptance: bool = False  # keep each sequence's per-position acceptance
    gate: object = None  # a gate (``RegionGate``, ``FunctionGate``): relaxed rules only where it is open


@dataclass
class BlockStats:
    """One rule at one m (fixed blocks, or under one drafting policy) over one sequence: sums over
    its block starts."""

    starts: int  # block starts whose window fits (T - m + 1; 1 for m > T)
    al_sum: float  # the expected accepted drafts, summed over the starts
    kl_sum: float = float("nan")  # the expected KL(pi || q) of the tokens a block emits (fixed blocks only)
    tv_sum: float = float("nan")
    accept_by_position: tuple | None = None  # P(the first j + 1 drafts accepted), summed over starts, j < m
    drafted_sum: float | None = None  # under a drafting policy: tokens drafted, ...
    forwards_sum: float | None = None  # ... and draft forwards, summed over the starts
    #: under a drafting policy, over the steps decoding the sequence takes (``renewal_steps``): expected
    #: steps, accepted drafts, drafted tokens and draft forwards summed over them, steps with L drafts
    steps_sum: float | None = None
    steps_accepted_sum: float | None = None
    steps_drafted_sum: float | None = None
    steps_forwards_sum: float | None = None
    steps_by_drafted: tuple | None = None

    @property
    def tokens_sum(self) -> float:
        """Tokens the blocks emit (accepted drafts plus one), summed over the starts."""
        return self.al_sum + self.starts


@dataclass
class RuleStats:
    """One rule over one sequence: per-position metrics summed over its positions, and its blocks
    by (m, drafting policy or None)."""

    acceptance: float
    acceptance_outside_support: float
    kl_emitted_target: float
    tv: float
    entropy_change: float
    logits_exact: float
    optimal_acceptance: float
    blocks: dict = field(default_factory=dict)
    #: The acceptance at each position (``analyze_trace(position_acceptance=True)``), else None.
    position_acceptance: np.ndarray | None = None

    def block(self, m, policy=None) -> BlockStats:
        """The sums of blocks of m drafts (under drafting ``policy``, its spec string, or fixed)."""
        return self.blocks[(int(m), policy)]


@dataclass
class SequenceStats:
    """The per-sequence sums the analysis reduces (``AnalysisResult.sequences``)."""

    id: str
    task: str
    positions: int
    rules: dict  # {rule spec string: RuleStats}
    prompt_tokens: int | None = None
    trace: str = ""
    gated: int | None = None  # under a gate: the positions where it is open

    def as_dict(self) -> dict:
        """The record as plain data (JSON-ready: tuples of block keys written "m" or "m@policy")."""
        out = dataclasses.asdict(self)
        for stats in out["rules"].values():
            stats["blocks"] = {(f"{m}" if pol is None else f"{m}@{pol}"): b for (m, pol), b in stats["blocks"].items()}
        return out


def _rule_label(rule):
    return rule.describe() if hasattr(rule, "describe") else type(rule).__name__


@dataclass
class _Rows:
    """The rows of a batch of sequences, stacked: (N, W) draft and verifier rows (each sequence's
    own support, padded with tokens both models exclude, p = q = 0, which no rule accepts or emits),
    the raw logits when a rule needs them (then a batch is one sequence: no padding), each
    sequence's first row (``offsets``, N at the end) and its Monte Carlo seed."""

    p: np.ndarray
    q: np.ndarray
    lg: object
    offsets: np.ndarray
    seeds: list
    region: np.ndarray | None = None  # under a gate: (N,) True where the relaxed rule judges
    #: per drafting policy (its spec string): (top-1, entropy) (N,) of the drafter's distribution its stop
    #: reads: the drafter's own p before greedy drafting, or the trace under ``DraftPolicy.reads``
    features: dict = dataclasses.field(default_factory=dict)

    @property
    def sequences(self) -> int:
        return len(self.offsets) - 1

    def span(self, i) -> slice:
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))


def _stack(parts, single):
    """A ``_Rows`` of [(p, q, lg, seed, region, features)]: one sequence as it is (``single``), or several
    stacked (padded to one width; their logits are not kept)."""
    region = None if parts[0][4] is None else np.concatenate([part[4] for part in parts])
    features = {
        label: tuple(np.concatenate([part[5][label][i] for part in parts]) for i in range(2)) for label in parts[0][5]
    }
    if single:
        ((p, q, lg, seed, _, _),) = parts
        return _Rows(p, q, lg, np.array([0, p.shape[0]]), [seed], region, features)
    width = max(part[1].shape[-1] for part in parts)
    sizes = [part[1].shape[0] for part in parts]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    p_all, q_all = np.zeros((offsets[-1], width)), np.zeros((offsets[-1], width))
    for (p, q, *_), a, b in zip(parts, offsets[:-1], offsets[1:], strict=True):
        p_all[a:b, : p.shape[-1]] = p
        q_all[a:b, : q.shape[-1]] = q
    return _Rows(p_all, q_all, None, offsets, [part[3] for part in parts], region, features)


def _per_sequence(values, rows):
    """Sums of per-position ``values`` (N,) over each sequence of ``rows``."""
    return np.add.reduceat(np.asarray(values, dtype=np.float64), rows.offsets[:-1])


def _scheme(rule):
    """(k, drafting scheme) of the drafts a rule verifies at a position: (1, "iid") for a chain rule."""
    if judgement_of(rule).multi_draft:
        return rule.draft_count, rule.drafting
    return 1, "iid"


def _optima(rows, widths) -> dict:
    """{(k, drafting): per-sequence sums of the optimal acceptance} for ``widths`` {drafting: {k}}."""
    return {
        (k, drafting): _per_sequence(value, rows)
        for drafting, ks in widths.items()
        for k, (value, _) in optimal_acceptances(rows.p, rows.q, tuple(sorted(ks)), drafting).items()
    }


def _rule_stats(
    rule,
    rows,
    ms,
    bonus_policy,
    block_paths=1024,
    optimum=None,
    policies=(),
    cost=None,
    shared=None,
    keep=False,
    gate=None,
) -> list:
    """Per-sequence sums of one rule over a batch of sequences (``RuleStats`` each): per-position
    metrics, and per m the AL and block drift. The AL of every kind of rule comes from
    ``accepted_lengths`` (a block rule's exact or Monte Carlo with ``block_paths`` paths seeded by
    the sequence's seed; its drift is its token-level one, 0: lossless; a multi-draft rule's
    acceptance is over its k drafts, so its AL is that of a tree of width k). ``optimum``: a dict
    of the optimal acceptance per (k, drafting scheme) over the rules of the batch. ``policies``: drafting
    policies (``DraftPolicy``) whose AL, drafted tokens and draft forwards per block start are summed
    too (``policy_blocks``; ``cost`` for ``cost-optimal``). ``shared``: the work the rules of the
    batch share (``step_metrics``); the rows are checked once per batch, not once per rule."""
    p, q = rows.p, rows.q
    logits = rows.lg if rule.needs_logits else None
    sm = step_metrics(rule, p, q, logits=logits, validate=shared is None, shared=shared)
    fallback = gated_rule(gate, rule)
    if fallback is not None:  # the rule where the gate is open, the lossless fallback elsewhere
        base = step_metrics(fallback, p, q, validate=False, shared=shared)
        open_ = rows.region
        sm = dataclasses.replace(
            sm,
            **{
                f.name: np.where(
                    open_ if getattr(sm, f.name).ndim == 1 else open_[:, None],
                    getattr(sm, f.name),
                    getattr(base, f.name),
                )
                for f in dataclasses.fields(sm)
            },
        )
    sums = {name: _per_sequence(getattr(sm, name), rows) for name in _POSITION_METRICS}
    if logits is not None:
        exact = _per_sequence(rule.logits_exact(p, q, logits=logits), rows)
    else:
        exact = np.diff(rows.offsets).astype(np.float64)
    k, drafting = _scheme(rule)
    optimum = {} if optimum is None else optimum
    if (k, drafting) not in optimum:
        optimum.update(_optima(rows, {drafting: {k}}))
    top = max(ms)
    slots = judgement_of(rule).slot_dependent
    if slots:  # acceptance and drift per slot of the block (the bonus at slot m)
        per_slot = [
            step_metrics(rule.at_slot(j), p, q, logits=logits, validate=shared is None, shared=shared)
            for j in range(top + 1)
        ]
        beta_all = np.stack([x.acceptance for x in per_slot])
        drift_all = {"kl": np.stack([x.kl_emitted_target for x in per_slot]), "tv": np.stack([x.tv for x in per_slot])}
    else:
        beta_all, drift_all = sm.acceptance, {"kl": sm.kl_emitted_target, "tv": sm.tv}
    judgement = judgement_of(rule)
    # rules whose accepted length is their own law over whole blocks or trees, not the prefix product
    whole = judgement.block or judgement.tree
    out = []
    survival_all, policy_all = {}, {}  # per m (and policy): the batch's stacked inputs of the steps' solve
    for i in range(rows.sequences):
        span = rows.span(i)
        stats = RuleStats(
            **{name: float(v[i]) for name, v in sums.items()},
            logits_exact=float(exact[i]),
            optimal_acceptance=float(optimum[(k, drafting)][i]),
        )
        if keep:
            stats.position_acceptance = np.array(sm.acceptance[span])
        beta = beta_all[..., span]
        drift = {name: values[..., span] for name, values in drift_all.items()}
        seq_p, seq_q = p[span], q[span]
        positions = seq_p.shape[0]
        fused = None if slots else _fused_blocks(beta, drift, bonus_policy, ms)
        if whole or fused is None:
            host = rule._host(seq_p, seq_q, None, validate=False)[:2] if judgement.block else (seq_p, seq_q)
            # exact where a start's weights take at most 10,000 values (m <= 3 on a top-20 trace), else Monte Carlo
            lengths = accepted_lengths(
                rule, *host, ms, beta=beta, n_paths=block_paths, seed=rows.seeds[i], max_support=BLOCK_EXACT_SUPPORT
            )
        # a lossy block rule states its own drift per block (``block_drift_for``); a lossless one emits q
        block_drift = None
        drift_law = stated_law(rule, "block_drift_for") if judgement.block else None
        if drift_law is not None:
            found = drift_law(*host, sorted({min(m, positions) for m in ms}), n_paths=block_paths, seed=rows.seeds[i])
            block_drift = {m: found[min(m, positions)] for m in ms}
        for m in ms:
            starts = max(positions - m + 1, 1)
            if fused is not None:  # one compiled pass gave every m's sums
                al_sum, drift_sums, by_position = fused[m]
                if whole:
                    al_sum = float(np.sum(lengths[m].accepted_length))
                block = BlockStats(
                    starts=starts,
                    al_sum=al_sum,
                    kl_sum=drift_sums[0],
                    tv_sum=drift_sums[1],
                    accept_by_position=None if whole else by_position,
                )
            else:
                block = BlockStats(starts=starts, al_sum=float(np.sum(lengths[m].accepted_length)))
                if not whole:  # vLLM's per-position acceptance: P(the first j + 1 drafts accepted), j < m
                    reach, by_position = np.ones(starts), []
                    for j in range(m):
                        idx = np.arange(starts) + j
                        b = beta[min(j, beta.shape[0] - 1)] if slots else beta
                        reach = reach * np.where(idx < positions, b[np.minimum(idx, positions - 1)], 0.0)
                        by_position.append(float(reach.sum()))
                    block.accept_by_position = tuple(by_position)
                for name, values in drift.items():
                    bonus = None
                    if bonus_policy == "relaxed":
                        bonus = values[m] if slots else values
                    emitted = block_sums(
                        beta[:m] if slots else beta, values[:m] if slots else values, m, bonus, per_slot=slots
                    )
                    setattr(block, f"{name}_sum", float(np.sum(emitted[:starts])))
            if block_drift is not None:
                block.kl_sum, block.tv_sum = (float(np.sum(v[:starts])) for v in block_drift[m])
            b_m = beta[:m] if slots else beta
            # the steps decoding takes (the planner's one path for fixed blocks and policies alike): summed after
            # the loop for the whole batch at once (``renewal_steps_many``); here each sequence's own inputs
            if whole and lengths[m].survival is not None:  # a whole-block or whole-tree rule's law per start
                survival = lengths[m].survival
                law = survival_all.setdefault(m, np.zeros((beta_all.shape[-1], m)))
                law[span.start : span.start + survival.shape[0], : survival.shape[1]] = survival
            for policy in policies:
                found = rows.features.get(policy.describe())
                features = None if found is None else (found[0][span], found[1][span])
                al_p, drafted, forwards = policy_blocks(policy, seq_p, b_m, m, cost, features)
                drafted_all, forwards_all = policy_all.setdefault(
                    (m, policy.describe()), (np.zeros(beta_all.shape[-1], dtype=np.int64), np.zeros(beta_all.shape[-1]))
                )
                drafted_all[span], forwards_all[span] = drafted, forwards
                stats.blocks[(m, policy.describe())] = BlockStats(
                    starts=starts,
                    al_sum=float(np.sum(al_p[:starts])),
                    drafted_sum=float(np.sum(drafted[:starts])),
                    forwards_sum=float(np.sum(forwards[:starts])),
                )
            stats.blocks[(m, None)] = block
        out.append(stats)
    for m in ms:  # the steps decoding takes, every sequence of the batch in one solve per setting
        b_m = beta_all[:m] if slots else beta_all
        if not whole or m in survival_all:  # (a whole-block rule without its law per start has no steps)
            survival = survival_all.get(m)
            drafted, forwards = fixed_blocks(b_m, rows.offsets, m, survival=survival)
            steps = renewal_steps_many(
                None if survival is not None else b_m, rows.offsets, drafted, forwards, m, survival=survival
            )
            for stats, row in zip(out, steps, strict=True):
                _set_steps(stats.blocks[(m, None)], row, m)
        for policy in policies:
            drafted, forwards = policy_all[(m, policy.describe())]
            steps = renewal_steps_many(b_m, rows.offsets, drafted, forwards, m)
            for stats, row in zip(out, steps, strict=True):
                _set_steps(stats.blocks[(m, policy.describe())], row, m)
    return out


def _set_steps(block, row, m):
    """``block`` with the sums over the steps decoding takes set from a row of ``renewal_steps_many``."""
    block.steps_sum, block.steps_accepted_sum, block.steps_drafted_sum, block.steps_forwards_sum = (
        float(x) for x in row[:4]
    )
    block.steps_by_drafted = tuple(float(x) for x in row[4 : 4 + m + 1])
    return block


def _fused_blocks(beta, drift, bonus_policy, ms):
    """{m: (AL summed over the block starts, (KL, TV) of the emitted tokens summed, acceptance by
    position summed)} of a rule whose acceptance does not depend on the slot, for every m in one
    compiled pass over the sequence (``block_pass``); None without numba (the NumPy path then)."""
    values = np.stack([drift["kl"], drift["tv"]])
    sizes = sorted(set(ms))
    out = block_pass(beta, values, values if bonus_policy == "relaxed" else None, sizes)
    if out is None:
        return None
    al, vals, pos = out
    return {
        m: (float(al[i]), (float(vals[i, 0]), float(vals[i, 1])), tuple(float(x) for x in pos[i, :m]))
        for i, m in enumerate(sizes)
    }


def shard_statistics(job: ShardJob, threads=None) -> list:
    """The ``SequenceStats`` of one shard (runs in a worker process or on a Dask worker).
    ``threads``: the compiled kernels' threads in the calling thread, or {Dask worker address:
    threads}."""
    if isinstance(threads, dict):
        from distributed import get_worker

        threads = threads.get(get_worker().address)
    if threads is not None:
        from .._math import _jit

        _jit.set_threads(threads)  # numba's setting is per thread: set where the task runs
    trace = Trace(job.directory, verify=False)
    need_logits = any(rule.needs_logits for rule in job.rules)
    labels = [_rule_label(rule) for rule in job.rules]
    kept, parts = [], []
    for seq in trace.shard(job.shard):
        if (job.tasks is not None and seq.task not in job.tasks) or seq.n_positions == 0:
            continue  # a sequence without positions holds no data: counted as nothing, not as a zero AL
        if need_logits:
            p, q, lg = seq.distributions(job.settings, with_logits=True)
        else:
            (p, q), lg = seq.distributions(job.settings), None
        features = {}
        for policy in job.policies:  # what each policy's stop reads: the drafter's own p, before greedy drafting
            own = p if policy.reads is None else seq.distributions(policy.reads)[0]
            features[policy.describe()] = draft_features(own)
        p = draft_rows(p, job.draft_mode)
        _, p, q, _, _ = prepare(p, q)  # the rows are checked once here, for every rule
        # the block rules' Monte Carlo paths are seeded by the sequence: the same whatever the engine
        kept.append(seq)
        region = None if job.gate is None else np.asarray(job.gate.mask(seq.tokens), dtype=bool)
        parts.append((p, q, lg, prompt_seed(0, seq.id), region, features))
    # the sequences of the shard as one batch, for the rules that need no raw logits; those that do
    # see one sequence at a time (a batch of its own rows, no padding under the logits)
    plain = [i for i, rule in enumerate(job.rules) if not rule.needs_logits]
    raw = [i for i, rule in enumerate(job.rules) if rule.needs_logits]
    per_rule = {label: [] for label in labels}
    groups = []
    if plain and parts:
        groups.append((plain, [parts]))
    if raw:
        groups.append((raw, [[part] for part in parts]))
    for chosen, batches in groups:
        for batch in batches:
            rows = _stack(batch, len(batch) == 1)
            # the optimum of each drafting scheme at every width the batch's rules verify, asked for at
            # once (without replacement, one enumeration of the drafted sets serves every width)
            widths = {}
            for i in chosen:
                k, drafting = _scheme(job.rules[i])
                widths.setdefault(drafting, set()).add(k)
            optimum, shared = _optima(rows, widths), {}
            for i in chosen:
                per_rule[labels[i]] += _rule_stats(
                    job.rules[i],
                    rows,
                    job.ms,
                    job.bonus_policy,
                    job.block_paths,
                    optimum,
                    job.policies,
                    job.cost,
                    shared,
                    job.position_acceptance,
                    job.gate,
                )
    out = []
    for i, seq in enumerate(kept):
        prompt = seq.meta.get("prompt_tokens")
        out.append(
            SequenceStats(
                id=seq.id,
                task=seq.task,
                positions=seq.n_positions,
                rules={label: per_rule[label][i] for label in labels},
                prompt_tokens=prompt if is_integer(prompt) else None,
                gated=None if job.gate is None else int(parts[i][4].sum()),
            )
        )
    return out
