"""Analyse a trace at scale: per rule and setting, acceptance, accepted length and the drift of
what the rule emits, with bootstrap confidence intervals over sequences and a per-task breakdown."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from typing import ClassVar, TypedDict

import numpy as np

from .._laws._block import DRAFT_MODES
from .._laws._gate import gated_rule, make_gate
from .._laws._lengths import stated_law
from .._laws._policies import make_draft_policy
from .._math._bootstrap import check_resamples, ratio_interval, ratio_intervals, resample_counts
from .._math._validation import check_int, is_integer
from .._rules import BONUS_POLICIES, judgement_of, make_rules
from .._util._files import csv_text
from .._util._options import merged_options
from .._util._progress import progress_bar
from .._util._results import Result
from ._engines import run_dask, run_local
from ._options import AnalysisOptions
from ._shards import ShardJob, _rule_label, shard_statistics

__all__ = ["METRICS", "AnalysisResult", "AnalysisRow", "analyze_trace", "parse_rules"]

#: Per-position metrics (means over positions); ``logits_exact`` is the share of positions whose
#: result the stored logits determine exactly (1 unless a rule needs logits a trace lacks);
#: ``optimal_acceptance`` the largest acceptance a lossless verification of the rule's k drafts
#: reaches there, for the rule's own drafting scheme (i.i.d. from p, without replacement, or the
#: top-k of p; 1 - TV for one sampled draft; ``optimal_multi_draft_acceptance``). For a lossy block
#: rule (one with ``block_drift_for``: FLy, MagicMTP) ``kl_emitted_target`` and ``tv`` are the drift
#: per token its blocks of m emit (``kl_per_token``, ``tv_per_token``): its law depends on the slot.
METRICS = (
    "acceptance",
    "acceptance_outside_support",
    "kl_emitted_target",
    "tv",
    "entropy_change",
    "logits_exact",
    "optimal_acceptance",
)
#: What each column of ``AnalysisResult.table`` is (``AnalysisResult.legend``).
TABLE_COLUMNS = (
    ("m", "drafted tokens per verification step"),
    ("accept", "mean acceptance of one drafted token, over positions"),
    (
        "/opt",
        "accept as a fraction of the largest acceptance a lossless verification of the same drafts reaches "
        "(1 - TV(p, q) for one draft): above 1 only for a rule that is not lossless",
    ),
    ("outside", "acceptance of tokens the verifier gives probability 0 (q(n) = 0)"),
    (
        "AL",
        "accepted drafts per verification step (independent positions), with its bootstrap 95% interval over sequences",
    ),
    ("vLLM MAL", "1 + AL: tokens emitted per step, vLLM's mean acceptance length"),
    (
        "KL(pi||q)",
        "mean KL(pi || q) per position of what the rule emits (pi) from the verifier (q); inf where it "
        "emits tokens q excludes",
    ),
    ("KL/token", "KL(pi || q) of a block of m per token it emits (positions weighted by the chance of reaching them)"),
    ("TV", "mean TV(pi, q) per position"),
    ("dH", "mean entropy change H(pi) - H(q) per position, in nats"),
)
#: Per-m block metrics: drift per emitted token (bonus position included under the relaxed policy).
BLOCK_METRICS = ("kl", "tv")


def parse_rules(specs, deltas=(1.0,)):
    """Rules from spec strings (``make_rules``), each rule with a ``delta`` it does not set built
    once per value of ``deltas``: ``parse_rules("sps,cactus,mentored", (0.25, 1))``."""
    return make_rules(specs, {"delta": [float(d) for d in deltas]} if deltas is not None else None)


@dataclass
class AnalysisResult(Result):
    """Rows of statistics (``AnalysisRow``: one per rule x m x task, task 'all' included, over
    all traces), per-trace rows when several traces were analysed (``trace_rows``, task 'all'),
    and the per-sequence sums (``sequences``, in id order, each with its trace's name)."""

    rows: list
    sequences: list
    settings: dict
    seconds: float
    trace_rows: list = field(default_factory=list)
    traces: list = field(default_factory=list)
    #: Sequences without positions, left out (they hold no data).
    empty_sequences: int = 0
    #: What a reader must know about how the analysis ran (an m longer than every sequence, ...).
    notes: list = field(default_factory=list)
    #: The block sizes analysed (an m longer than the longest sequence is analysed as that length).
    ms: tuple = ()
    #: {m asked for: m analysed} (they differ only for an m longer than the longest sequence).
    m_used: dict = field(default_factory=dict)
    name: ClassVar[str] = "analysis"

    def records(self) -> list:
        """The rows (``AnalysisRow``), then the per-trace rows."""
        return [dict(r) for r in self.rows + self.trace_rows]

    def markdown(self) -> str:
        """The text table of every task (all first) in code blocks."""
        tasks = sorted({r["task"] for r in self.rows} - {"all"})
        tables = "\n\n".join(
            f"{'all tasks' if t == 'all' else 'task ' + t}:\n\n```\n{self.table(t)}\n```"
            for t in ["all", *tasks]
            if any(r["task"] == t for r in self.rows)
        )
        return tables + f"\n\nThe columns:\n\n```\n{self.legend()}\n```"

    def figure(self):
        """Acceptance and AL against delta per rule family (``plot_delta_sweep``)."""
        from ._plotting import plot_delta_sweep

        return plot_delta_sweep(self.rows, self.settings)

    def to_csv(self) -> str:
        return csv_text(self.rows + self.trace_rows)  # delta None and a missing interval are empty cells

    def to_json(self) -> str:
        """The settings and rows as JSON; a missing interval (fewer than two sequences) is null."""
        return json.dumps(
            _nan_to_none(
                {
                    "settings": self.settings,
                    "seconds": self.seconds,
                    "traces": self.traces,
                    "empty_sequences": self.empty_sequences,
                    "rows": self.rows,
                    "trace_rows": self.trace_rows,
                }
            ),
            indent=1,
        )

    def _select(self, task="all", sequences=None):
        ids = None if sequences is None else set(sequences)
        return [s for s in self.sequences if task in ("all", s.task) and (ids is None or s.id in ids)]

    def accepted_length(self, rule, m, *, task="all", policy=None, sequences=None, n_boot=1000, seed=0):
        """(AL(m) of ``rule``, and its bootstrap 95% interval): accepted drafts per verification,
        over the block starts of the sequences of ``task`` (or of the ids ``sequences``), under
        drafting ``policy`` (its spec string) or fixed blocks of m. ``rule`` by its spec string, as
        in ``rows``; ``m`` as asked (an m longer than every sequence reads the longest)."""
        m = self.m_used.get(m, m)
        seqs = self._select(task, sequences)
        blocks = [s.rules[rule].block(m, policy) for s in seqs]
        counts = resample_counts(_keys(seqs), n_boot, seed)
        return ratio_interval([b.al_sum for b in blocks], [b.starts for b in blocks], counts)

    def drafted_acceptance(self, rule, m, policy, *, task="all", sequences=None, n_boot=1000, seed=0):
        """(accepted drafts over drafted tokens under drafting ``policy``, and its bootstrap 95% interval):
        llama-server's ``draft_n_accepted / draft_n``, over the steps decoding the sequences of ``task`` (or
        of the ids ``sequences``) takes (``renewal_steps``); ``rule`` and ``policy`` by their spec strings,
        as in ``rows``."""
        m = self.m_used.get(m, m)
        seqs = self._select(task, sequences)
        blocks = [s.rules[rule].block(m, policy) for s in seqs]
        counts = resample_counts(_keys(seqs), n_boot, seed)
        return ratio_interval([b.steps_accepted_sum for b in blocks], [b.steps_drafted_sum for b in blocks], counts)

    def al_ratio(self, rule, baseline, m, n_boot=1000, seed=0, task="all"):
        """(AL(rule) / AL(baseline) - 1, and its percentile bootstrap 95% interval) at m, over the
        sequences of ``task``, paired: each resample takes the same sequences for both rules, so the
        interval is of the gain, not of two separate ALs. Rules by their spec strings, as in ``rows``."""
        m = self.m_used.get(m, m)
        seqs = self._select(task)
        a = [s.rules[rule].block(m).al_sum for s in seqs]
        b = [s.rules[baseline].block(m).al_sum for s in seqs]
        # NaN throughout where the baseline accepts nothing
        return tuple(float(x - 1) for x in ratio_interval(a, b, resample_counts(_keys(seqs), n_boot, seed)))

    def figures(self) -> dict:
        """{file name: PNG bytes} of the analysis figures (acceptance and AL against delta, AL
        against emitted KL, AL against delta per task when there are several)."""
        from ._outputs import analysis_figures

        return analysis_figures(self)

    def write(self, out_dir, figures: bool = True, command: str | None = None) -> list:
        """Write analysis.csv, analysis.json, analysis.md (the tables, headed by ``command``) and
        (with ``figures``) the figures into ``out_dir``, atomically; returns the paths."""
        from .._util._files import atomic_write
        from ._outputs import write_outputs

        head = f"Command: `{command}`\n\n" if command else ""
        written = write_outputs(self, out_dir, figures=figures)
        return [*written, atomic_write(os.path.join(out_dir, "analysis.md"), head + self.markdown() + "\n")]

    @staticmethod
    def legend() -> str:
        """What each column of ``table`` is, one line each (``TABLE_COLUMNS``)."""
        return "\n".join(f"{name:>9}  {what}" for name, what in TABLE_COLUMNS)

    def table(self, task="all", trace="all") -> str:
        """The rows of one task (or of one trace, over all its tasks) as a fixed-width text table;
        ``legend`` says what its columns are."""
        lines = [
            f"{'rule':<34} {'m':>3} {'accept':>7} {'/opt':>6} {'outside':>7} {'AL':>7} {'AL 95% CI':>15} "
            f"{'vLLM MAL':>8} "
            f"{'KL(pi||q)':>9} {'KL/token':>9} {'TV':>6} {'dH':>7}"
        ]
        for r in self.rows if trace == "all" else self.trace_rows:
            if r["task"] != task or r.get("trace", "all") != trace:
                continue
            label = r["rule"] if not r.get("draft_policy") else f"{r['rule']} [{r['draft_policy']}]"
            if r["al_lo"] == r["al_lo"]:
                interval = f"[{r['al_lo']:>6.3f},{r['al_hi']:>6.3f}]"
            else:  # no interval: one sequence, or no bootstrap
                interval = "n/a (1 seq)" if r["sequences"] < 2 else "n/a"
            lines.append(
                f"{label:<34} {r['m']:>3} {r['acceptance']:>7.4f} {r['acceptance_of_optimum']:>6.3f} "
                f"{r['acceptance_outside_support']:>7.4f} "
                f"{r['al']:>7.3f} {interval:>15} {r['mean_acceptance_length']:>8.3f} "
                f"{r['kl_emitted_target']:>9.5f} {r['kl_per_token']:>9.5f} {r['tv']:>6.4f} {r['entropy_change']:>7.4f}"
            )
        return "\n".join(lines)


def _nan_to_none(value):
    """``value`` with every float NaN replaced by None (JSON has no NaN)."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_to_none(v) for v in value]
    return value


def _check_ms(ms) -> tuple:
    """The block sizes m: a non-empty list of distinct integers >= 1, in the order given."""
    if is_integer(ms):
        ms = (ms,)
    try:
        values = list(ms)
    except TypeError:
        raise ValueError(f"ms must be a list of block sizes m (integers >= 1); got {ms!r}") from None
    if not values:
        raise ValueError("ms is empty: give at least one block size m (drafted tokens per verification), e.g. (4, 8)")
    bad = [m for m in values if not is_integer(m) or m < 1]
    if bad:
        raise ValueError(f"ms must be integers >= 1 (drafted tokens per verification); got {bad[0]!r}")
    return tuple(dict.fromkeys(int(m) for m in values))


def _cap_ms(ms, longest):
    """(the block sizes analysed, notes): an m longer than the longest sequence drafts past every
    sequence's end, so it gives exactly the numbers of m = ``longest``; it is analysed as that
    (each size once) and said so."""
    notes, out = [], []
    for m in ms:
        if m > longest:
            notes.append(
                f"m = {m} is longer than the longest sequence ({longest} positions): a block cannot draft past a "
                f"sequence's end, so it is analysed as m = {longest} (the same numbers)"
            )
        out.append(min(m, longest))
    return tuple(dict.fromkeys(out)), notes


def _keys(sequences):
    """The bootstrap's unit ids of analysed sequences: the sequence ids, or trace name and id where
    an id repeats across the traces of a set (so a merged trace and its parts, or a trace and its
    copy, resample alike)."""
    ids = [s.id for s in sequences]
    if len(set(ids)) == len(ids):
        return ids
    return [f"{s.trace}/{s.id}" for s in sequences]


class AnalysisRow(TypedDict, total=False):
    """One row of ``AnalysisResult.rows`` / ``trace_rows``: a rule at one m, over one task and
    one trace ("all" for all of them). Each metric ``x`` comes with ``x_lo`` and ``x_hi``, its
    bootstrap 95% interval over sequences."""

    rule: str  # the rule's spec string, e.g. "cactus(delta=1.0)"
    family: str  # its registered name, e.g. "cactus"
    delta: float | None  # its budget, None for a rule without one
    bonus_policy: str
    draft_mode: str  # "sampled" (n ~ p) or "greedy" (n = argmax p, p one-hot for the rule)
    m: int
    draft_count: int  # drafts verified per position: 1 for a chain, k for a tree of width k
    draft_policy: str  # a drafting policy that stops blocks early (absent: always m drafts)
    # over the steps decoding takes (``renewal_steps``), for fixed blocks and under a policy; absent for rules
    # that judge whole blocks or trees (their law per block start is over whole blocks):
    drafted: float  # drafted tokens per step (m but where a block is cut at a sequence's end, or a policy stops)
    draft_forwards: float  # draft forwards per step (a stop reads p at one more place; a full accepted block one)
    verify_mix: list  # the share of steps that draft L tokens, L = 0..m (verifier blocks of k L + 1)
    al_step: float  # accepted drafts per step (``al``: the mean over block starts, the paper's AL)
    al_step_lo: float
    al_step_hi: float
    acceptance_by_position: list  # P(draft j accepted), j = 1..m: vLLM's num_accepted_tokens_per_pos / drafts
    verified_tokens: int  # rows the verifier scores per step: k m + 1 (drafts and the bonus position)
    task: str
    trace: str
    sequences: int
    positions: int
    al: float
    mean_acceptance_length: float
    acceptance: float
    acceptance_outside_support: float
    kl_emitted_target: float
    tv: float
    entropy_change: float
    logits_exact: float
    optimal_acceptance: float
    acceptance_of_optimum: float  # acceptance / optimal_acceptance (ratio of the sums over positions)
    kl_per_token: float
    tv_per_token: float


def analyze_trace(
    trace,
    rules,
    ms=(4, 8, 20),
    settings=None,
    n_boot=1000,
    seed=0,
    processes=1,
    progress=None,
    bonus_policy="verifier",
    tasks=None,
    client=None,
    draft_mode="sampled",
    block_paths=1024,
    draft_policies=None,
    cost=None,
    position_acceptance=False,
    gate=None,
    *,
    options=None,
):
    """Statistics of ``rules`` (Rule objects or spec strings) on ``trace``: a Trace, a directory,
    a glob pattern, a TraceSet or a list of them (several traces are one dataset, checked for
    compatibility: ``TraceSet``).

    Per rule, m and task (plus 'all'): mean acceptance (per position) and the part of it from
    tokens the verifier excludes, AL(m) (expected accepted drafts per verification, averaged over
    block starts; exact for the recorded positions), vLLM's mean acceptance length 1 + AL, the
    per-position means of KL(pi || q), TV(pi, q) and H(pi) - H(q) of the exact emitted
    distribution, and per m the drift per emitted token of a block, ``kl_per_token`` and
    ``tv_per_token`` (the block's drafted positions weighted by the chance of reaching them, per
    token emitted; under ``bonus_policy="relaxed"`` the bonus position counts with the rule's
    emitted law, under "verifier" it emits q and adds nothing); each with a bootstrap 95%
    interval over sequences. ``logits_exact`` is the share of positions whose result the stored
    logits determine exactly (below 1 only for rules that need logits a top-K trace lacks).
    Rows are ``AnalysisRow`` records; with several traces, ``trace_rows`` holds the same per
    trace (task 'all').

    ``draft_mode="greedy"`` analyses a drafter that drafts greedily (multi-token prediction,
    EAGLE): the drafted token is argmax p and the rule sees p one-hot (``greedy_draft``).
    Block rules (``block``) have their AL from ``block_accepted_length``'s identity E[tau] =
    sum_i E[w_i]: exact by enumeration where the blocks' support is small, else Monte Carlo
    with ``block_paths`` drafted paths per block start, seeded by the sequence id (so every
    engine gives the same rows); the Monte Carlo noise is part of what the bootstrap over
    sequences sees.

    Where the work runs: shards are processed in this process, in ``processes`` spawned worker
    processes, or as tasks on a Dask cluster (``client``: a ``distributed.Client``; the trace
    directories must be readable at the same paths on the workers). The per-sequence sums do
    not depend on where they ran, and the reduction (sequences in id order, then the bootstrap
    with ``seed``) runs once here: every engine gives the same rows, bit for bit. ``tasks``
    restricts the analysis to the sequences of those tasks. ``progress``: a bar on stderr
    (True, False, or None: only on a terminal). ``position_acceptance=True`` keeps each
    sequence's per-position acceptance (``RuleStats.position_acceptance``) for studies that bin
    positions.

    ``gate`` (a ``RegionGate``, ``FunctionGate``, a callable of the tokens before a position, or
    "OPEN:CLOSE" token ids): gated relaxation, the relaxed rules judge only the positions where
    the gate is open (from the sequence's own generated tokens before each position) and the
    gate's lossless fallback (SpS) the others; lossless rules are not gated, block and
    multi-draft rules are refused. Exact per position, so every number above is the gated
    rule's. The result's ``notes`` say which gate and the share of positions it held open.

    ``options``: an ``AnalysisOptions`` holding every setting above at once (then none of them as a
    keyword): what the command line passes.
    """
    from .._data._traceset import open_traces

    given = {
        "ms": ms,
        "settings": settings,
        "n_boot": n_boot,
        "seed": seed,
        "processes": processes,
        "bonus_policy": bonus_policy,
        "tasks": tasks,
        "draft_mode": draft_mode,
        "block_paths": block_paths,
        "draft_policies": draft_policies,
        "cost": cost,
        "position_acceptance": position_acceptance,
        "gate": gate,
    }
    if options is not None:
        chosen = merged_options(AnalysisOptions, options, given)
        (
            ms,
            settings,
            n_boot,
            seed,
            processes,
            bonus_policy,
            tasks,
            draft_mode,
            block_paths,
            draft_policies,
            cost,
            position_acceptance,
            gate,
        ) = (chosen[k] for k in given)
    if bonus_policy not in BONUS_POLICIES:
        raise ValueError(f"bonus_policy must be one of {BONUS_POLICIES}; got {bonus_policy!r}")
    if draft_mode not in DRAFT_MODES:
        raise ValueError(f"draft_mode must be one of {DRAFT_MODES}; got {draft_mode!r}")
    check_int(block_paths, "block_paths", 2)
    check_int(processes, "processes", 1)
    if client is not None and processes > 1:
        raise ValueError("give either client= (a Dask cluster) or processes > 1 (local workers), not both")
    n_boot = check_resamples(n_boot)
    check_int(seed, "seed", 0)
    ms = _check_ms(ms)
    rules = make_rules(list(rules)) if not isinstance(rules, str) else make_rules(rules)
    gate = make_gate(gate)
    for rule in rules:
        gated_rule(gate, rule)  # a block, multi-draft or slot rule under a gate is refused here
        check_depths = stated_law(rule, "check_depths")
        if check_depths is not None:  # a whole-tree rule whose trees at some m are too big: refused up front
            check_depths(ms)
    if isinstance(draft_policies, str):
        draft_policies = [draft_policies]
    policies = []
    for spec in draft_policies or ():
        policy = make_draft_policy(spec)
        if policy is not None and policy not in policies:
            policies.append(policy)
    if any(p.needs_cost for p in policies) and cost is None:
        costly = ", ".join(p.kind for p in policies if p.needs_cost)
        raise ValueError(f"draft policy {costly} needs cost= (a CostModel: the planner passes its own)")
    wholes = [r.describe() for r in rules if judgement_of(r).block or judgement_of(r).tree]
    if policies and wholes:
        raise ValueError(f"{', '.join(wholes)} judge whole blocks: drafting policies are for token rules and trees")
    blocks = [r.describe() for r in rules if judgement_of(r).block]
    if bonus_policy == "relaxed" and blocks:
        raise ValueError(
            f"{', '.join(blocks)} judge whole blocks: their bonus token is the verifier's only; "
            "analyse them with bonus_policy='verifier'"
        )
    labels = [_rule_label(r) for r in rules]
    if len(set(labels)) != len(labels):
        raise ValueError(f"rules must be distinct; got {labels}")
    start = time.perf_counter()
    traces = open_traces(trace)
    if settings is None:
        settings = traces.sampling
    outside = sorted(
        i for i in (*getattr(gate, "open_ids", ()), *getattr(gate, "close_ids", ())) if not 0 <= i < traces.vocab_size
    )
    if outside:
        raise ValueError(
            f"gate: token id(s) {', '.join(map(str, outside[:4]))} are outside the trace's vocabulary "
            f"(0 to {traces.vocab_size - 1}): the gate would never open or close; give ids of the "
            "trace's tokenizer (e.g. those of <think> and </think>)"
        )
    for policy in policies:  # a stop that reads the drafter's top-k needs that many logits stored
        if (
            policy.reads is not None
            and 0 < policy.reads.top_k
            and (traces.top_k < policy.reads.top_k and not all(t.manifest.get("store_full") for t in traces.traces))
        ):
            raise ValueError(
                f"draft policy {policy.describe()} reads the drafter's top-{policy.reads.top_k}, and trace "
                f"{traces.directory!r} stores K = {traces.top_k} logits a position: dump it with --top-logits "
                f"{policy.reads.top_k} or more (the default 64 will do)"
            )
    records = [(name, t, t.records()) for name, t in zip(traces.names, traces.traces, strict=True)]
    known = sorted({r.task for _, _, recs in records for r in recs})
    if not known:
        raise ValueError(f"trace {traces.directory!r} holds no sequences: nothing to analyse")
    if traces.n_positions == 0:
        raise ValueError(f"trace {traces.directory!r} holds {len(traces)} sequence(s), all empty: nothing to analyse")
    empty = sum(1 for _, _, recs in records for r in recs if r.positions == 0)
    if tasks is not None:
        tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        unknown = sorted(set(tasks) - set(known))
        if unknown:
            raise ValueError(f"task(s) {unknown} are not in the trace; its tasks: {', '.join(known)}")
    wanted = None if tasks is None else tuple(tasks)
    longest = max(r.positions for _, _, recs in records for r in recs if wanted is None or r.task in wanted)
    asked = ms
    ms, notes = _cap_ms(ms, longest)
    jobs, names, total = [], [], 0
    for name, t, recs in records:
        for i in sorted({r.shard for r in recs if wanted is None or r.task in wanted}):
            jobs.append(
                ShardJob(
                    os.path.abspath(t.directory),
                    i,
                    tuple(rules),
                    tuple(ms),
                    settings,
                    bonus_policy,
                    wanted,
                    draft_mode,
                    int(block_paths),
                    tuple(policies),
                    cost,
                    bool(position_acceptance),
                    gate,
                )
            )
            names.append(name)
            total += t.shard_positions(i)
    with progress_bar(total=total, desc="analyse", unit="pos", enabled=progress) as bar:

        def done(part):
            bar.update(sum(s.positions for s in part))

        if client is not None:
            parts = run_dask(shard_statistics, jobs, client, done)
        else:
            parts = run_local(shard_statistics, jobs, processes, done)
    sequences = [dataclasses.replace(seq, trace=name) for name, part in zip(names, parts, strict=True) for seq in part]
    # one order whatever the engine, the shard layout or the order the traces were given in
    sequences.sort(key=lambda s: (s.id, s.trace))
    rows = []
    task_names = ["all", *sorted({s.task for s in sequences})]
    # one resampling per set of sequences, shared by every rule and m (paired, and the same
    # interval for the same quantity in every table of this trace: ``_bootstrap``)
    selections = {task: [s for s in sequences if task in ("all", s.task)] for task in task_names}
    counts = {task: resample_counts(_keys(sel), n_boot, seed) for task, sel in selections.items()}
    for rule in rules:
        for m in ms:
            for task in task_names:
                sel = selections[task]
                if sel:
                    rows.append(_row(rule, m, task, "all", sel, counts[task], bonus_policy, draft_mode))
                    for policy in policies:
                        rows.append(_row(rule, m, task, "all", sel, counts[task], bonus_policy, draft_mode, policy))
    trace_rows = []
    if len(traces.traces) > 1:
        per_trace = {name: [s for s in sequences if s.trace == name] for name in traces.names}
        trace_counts = {name: resample_counts(_keys(sel), n_boot, seed) for name, sel in per_trace.items()}
        for rule in rules:
            for m in ms:
                for name in traces.names:
                    sel = per_trace[name]
                    if sel:
                        trace_rows.append(_row(rule, m, "all", name, sel, trace_counts[name], bonus_policy, draft_mode))
    if gate is not None:
        held = sum(s.gated for s in sequences)
        positions = sum(s.positions for s in sequences)
        relaxed = [r.describe() for r in rules if not r.lossless]
        notes = [
            *notes,
            f"gated by {gate.describe()}: {', '.join(relaxed) or 'no relaxed rule'} judge(s) only the "
            f"{held} of {positions} positions ({held / max(positions, 1):.1%}) where it is open, "
            f"{gate.fallback} the others",
        ]
    return AnalysisResult(
        rows=rows,
        sequences=sequences,
        settings=settings.as_dict(),
        seconds=time.perf_counter() - start,
        trace_rows=trace_rows,
        traces=list(traces.names),
        empty_sequences=empty,
        notes=notes,
        ms=ms,
        m_used={m: min(m, longest) for m in asked},
    )


def _row(rule, m, task, trace, sel, counts, bonus_policy, draft_mode="sampled", policy=None) -> AnalysisRow:
    """The statistics of one rule at one m (under a drafting policy) over the sequences ``sel``,
    with intervals from the bootstrap ``counts`` of ``sel`` (``resample_counts``; None: none)."""
    label = _rule_label(rule)
    per = [s.rules[label] for s in sel]
    pos = [s.positions for s in sel]
    tag = None if policy is None else policy.describe()
    fixed = [r.block(m) for r in per]
    blocks = [r.block(m, tag) for r in per]
    starts = [b.starts for b in fixed]
    tokens = [b.tokens_sum for b in fixed]
    # every interval of the row from one resampling pass (the same counts for all)
    pairs = {name: ([getattr(r, name) for r in per], pos) for name in METRICS}
    pairs["al"] = ([b.al_sum for b in blocks], starts)
    stepped = all(b.steps_sum is not None for b in blocks)
    if stepped:  # accepted drafts per step over the steps decoding takes (renewal_steps)
        pairs["al_step"] = ([b.steps_accepted_sum for b in blocks], [b.steps_sum for b in blocks])
    pairs["acceptance_of_optimum"] = ([r.acceptance for r in per], [r.optimal_acceptance for r in per])
    for name in BLOCK_METRICS:
        pairs[f"{name}_per_token"] = ([getattr(b, f"{name}_sum") for b in fixed], tokens)
    stats = dict(zip(pairs, ratio_intervals(list(pairs.values()), counts), strict=True))
    al = stats.pop("al")
    delta = getattr(rule, "delta", None)
    row = AnalysisRow(
        rule=label,
        family=rule.family,
        delta=None if delta is None else float(delta),
        bonus_policy=bonus_policy,
        draft_mode=draft_mode,
        m=m,
        draft_count=getattr(rule, "draft_count", 1),
        verified_tokens=getattr(rule, "draft_count", 1) * m + 1,
        task=task,
        trace=trace,
        sequences=len(sel),
        positions=int(sum(pos)),
        al=al[0],
        al_lo=al[1],
        al_hi=al[2],
        mean_acceptance_length=1 + al[0],
    )
    if policy is not None:
        row["draft_policy"] = tag
    if stepped:  # drafts, draft forwards and verified blocks per step, over the steps decoding takes
        steps = max(sum(b.steps_sum for b in blocks), 1e-300)
        row["drafted"] = float(sum(b.steps_drafted_sum for b in blocks) / steps)
        row["draft_forwards"] = float(sum(b.steps_forwards_sum for b in blocks) / steps)
        row["verify_mix"] = [float(x) for x in np.sum([b.steps_by_drafted for b in blocks], axis=0) / steps]
    if policy is None and fixed[0].accept_by_position is not None:  # vLLM's num_accepted_tokens_per_pos / num_drafts
        sums = np.sum([b.accept_by_position for b in fixed], axis=0)
        row["acceptance_by_position"] = [float(x) for x in sums / max(sum(starts), 1)]
    for name, (v, lo, hi) in stats.items():
        row[name], row[f"{name}_lo"], row[f"{name}_hi"] = v, lo, hi
    if judgement_of(rule).block and stated_law(rule, "block_drift_for") is not None:
        # a lossy block rule's law depends on the slot, not the position: its drift per position is
        # that of the tokens its blocks of m emit (the per-position metrics are its one-draft form's)
        for name, key in (("kl", "kl_emitted_target"), ("tv", "tv")):
            for end in ("", "_lo", "_hi"):
                row[f"{key}{end}"] = row[f"{name}_per_token{end}"]
    if policy is not None:  # the per-token drift above is of fixed blocks of m, not of this policy's
        for name in BLOCK_METRICS:
            row[f"{name}_per_token"] = row[f"{name}_per_token_lo"] = row[f"{name}_per_token_hi"] = float("nan")
    return row
