"""Analyse a trace at scale: per rule and setting, acceptance, accepted length and the drift of
what the rule emits, with bootstrap confidence intervals over sequences and a per-task breakdown."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from .._data._prompts import prompt_seed
from .._data._trace import Trace
from .._laws._block import DRAFT_MODES, draft_rows
from .._laws._emitted import block_sums, expected_accepted_length, step_metrics
from .._laws._policies import make_draft_policy, policy_blocks
from .._math._bootstrap import check_resamples, ratio_interval, resample_counts
from .._rules import BONUS_POLICIES, make_rules, optimal_multi_draft_acceptance
from .._util._files import csv_text
from .._util._progress import progress_bar
from ._engines import run_dask, run_local

__all__ = ["METRICS", "AnalysisResult", "AnalysisRow", "analyze_trace", "parse_rules"]

#: Per-position metrics (means over positions); ``logits_exact`` is the share of positions whose
#: result the stored logits determine exactly (1 unless a rule needs logits a trace lacks);
#: ``optimal_acceptance`` the largest acceptance a lossless verification of the rule's k drafts
#: drawn i.i.d. from p reaches there (1 - TV for one draft; ``optimal_multi_draft_acceptance``).
METRICS = (
    "acceptance",
    "acceptance_outside_support",
    "kl_emitted_target",
    "tv",
    "entropy_change",
    "logits_exact",
    "optimal_acceptance",
)
#: A block rule's AL is enumerated exactly where each block start's weights take at most this many
#: values, else estimated by Monte Carlo (``block_accepted_length``).
BLOCK_EXACT_SUPPORT = 10_000
#: Per-m block metrics: drift per emitted token (bonus position included under the relaxed policy).
BLOCK_METRICS = ("kl", "tv")


def parse_rules(specs, deltas=(1.0,)):
    """Rules from spec strings (``make_rules``), each rule with a ``delta`` it does not set built
    once per value of ``deltas``: ``parse_rules("sps,cactus,mentored", (0.25, 1))``."""
    return make_rules(specs, {"delta": [float(d) for d in deltas]} if deltas is not None else None)


def _rule_label(rule):
    return rule.describe() if hasattr(rule, "describe") else type(rule).__name__


def _sequence_stats(rule, p, q, lg, ms, bonus_policy, seed=0, block_paths=1024, optimum=None, policies=(),
                    cost=None):  # fmt: skip
    """Per-sequence sums of one rule: per-position metrics, and per m the AL and block drift.
    A block rule's AL comes from ``expected_block_lengths_for`` (exact or Monte Carlo with
    ``block_paths`` paths seeded by ``seed``); its drift is its token-level one (0: lossless).
    A multi-draft rule's acceptance is over its k drafts, so its AL is that of a tree of width k.
    ``optimum``: a dict caching the optimal acceptance's sum per k over the rules of a sequence.
    ``policies``: drafting policies (``DraftPolicy``) whose AL, drafted tokens and draft forwards
    per block start are summed too (``policy_blocks``; ``cost`` for ``cost-optimal``)."""
    logits = lg if rule.needs_logits else None
    sm = step_metrics(rule, p, q, logits=logits)
    per = {
        name: float(np.sum(getattr(sm, name))) for name in METRICS if name not in ("logits_exact", "optimal_acceptance")
    }
    per["logits_exact"] = float(np.sum(rule.logits_exact(p, q, logits=logits))) if logits is not None else p.shape[0]
    k = getattr(rule, "draft_count", 1)
    optimum = {} if optimum is None else optimum
    if k not in optimum:
        optimum[k] = float(np.sum(optimal_multi_draft_acceptance(p, q, k)))
    per["optimal_acceptance"] = optimum[k]
    top = max(ms)
    if rule.slot_dependent:  # acceptance and drift per slot of the block (the bonus at slot m)
        slots = [step_metrics(rule.at_slot(j), p, q, logits=logits) for j in range(top + 1)]
        beta = np.stack([x.acceptance for x in slots])
        drift = {"kl": np.stack([x.kl_emitted_target for x in slots]), "tv": np.stack([x.tv for x in slots])}
    else:
        beta, drift = sm.acceptance, {"kl": sm.kl_emitted_target, "tv": sm.tv}
    block = None
    if getattr(rule, "block_level", False):  # a window longer than the sequence is the whole sequence
        p_host, q_host, _ = rule._host(p, q, None, validate=False)
        lengths = sorted({min(m, p.shape[0]) for m in ms})
        # exact where a start's weights take at most 10,000 values (m <= 3 on a top-20 trace), else Monte Carlo
        block = rule.expected_block_lengths_for(
            p_host, q_host, lengths, n_paths=block_paths, seed=seed, max_support=BLOCK_EXACT_SUPPORT
        )
    for m in ms:
        starts = max(p.shape[0] - m + 1, 1)
        if block is not None:
            al = block[min(m, p.shape[0])][1]
        elif rule.slot_dependent:
            al = block_sums(beta[:m], beta[:m], m, per_slot=True)
        else:
            al = expected_accepted_length(beta, m)
        per[f"al_sum_{m}"] = float(np.sum(al[:starts]))
        per[f"al_n_{m}"] = starts
        if block is None:  # vLLM's per-position acceptance: P(the first j + 1 drafts accepted), j < m
            reach, sums = np.ones(starts), []
            for j in range(m):
                idx = np.arange(starts) + j
                b = beta[min(j, beta.shape[0] - 1)] if rule.slot_dependent else beta
                reach = reach * np.where(idx < p.shape[0], b[np.minimum(idx, p.shape[0] - 1)], 0.0)
                sums.append(float(reach.sum()))
            per[f"accept_pos_sum_{m}"] = sums
        for policy in policies:
            al_p, drafted, forwards = policy_blocks(policy, p, beta[:m] if rule.slot_dependent else beta, m, cost)
            tag = f"{m}@{policy.describe()}"
            per[f"al_sum_{tag}"] = float(np.sum(al_p[:starts]))
            per[f"drafted_sum_{tag}"] = float(np.sum(drafted[:starts]))
            per[f"forwards_sum_{tag}"] = float(np.sum(forwards[:starts]))
        for name, values in drift.items():
            bonus = None
            if bonus_policy == "relaxed":
                bonus = values[m] if rule.slot_dependent else values
            sums = block_sums(
                beta[:m] if rule.slot_dependent else beta,
                values[:m] if rule.slot_dependent else values,
                m,
                bonus,
                per_slot=rule.slot_dependent,
            )
            per[f"{name}_block_{m}"] = float(np.sum(sums[:starts]))
    return per


def _shard_stats(args, threads=None):
    """Per-sequence sums for one shard (runs in a worker process). ``threads``: the compiled
    kernels' threads in the calling thread, or {Dask worker address: threads}."""
    directory, index, rules, ms, settings, bonus_policy, tasks, draft_mode, block_paths, *rest = args
    policies, cost = rest if rest else ((), None)  # drafting policies and their cost model (none: fixed m)
    if isinstance(threads, dict):
        from distributed import get_worker

        threads = threads.get(get_worker().address)
    if threads is not None:
        from .._math import _kernels

        _kernels.set_threads(threads)  # numba's setting is per thread: set where the task runs
    trace = Trace(directory, verify=False)
    need_logits = any(rule.needs_logits for rule in rules)
    out = []
    for seq in trace.shard(index):
        if (tasks is not None and seq.task not in tasks) or seq.n_positions == 0:
            continue  # a sequence without positions holds no data: counted as nothing, not as a zero AL
        if need_logits:
            p, q, lg = seq.distributions(settings, with_logits=True)
        else:
            (p, q), lg = seq.distributions(settings), None
        p = draft_rows(p, draft_mode)
        seed = prompt_seed(0, seq.id)  # the block rules' Monte Carlo paths: the same whatever the engine
        rec = {"id": seq.id, "task": seq.task, "positions": seq.n_positions, "rules": {}}
        if isinstance(seq.meta.get("prompt_tokens"), int):
            rec["prompt_tokens"] = seq.meta["prompt_tokens"]  # for the planner's whole-request cost
        optimum = {}
        for rule in rules:
            rec["rules"][_rule_label(rule)] = _sequence_stats(rule, p, q, lg, ms, bonus_policy, seed, block_paths,
                                                              optimum, policies, cost)  # fmt: skip
        out.append(rec)
    return out


@dataclass
class AnalysisResult:
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

    def al_ratio(self, rule, baseline, m, n_boot=1000, seed=0, task="all"):
        """(AL(rule) / AL(baseline) - 1, and its percentile bootstrap 95% interval) at m, over the
        sequences of ``task``, paired: each resample takes the same sequences for both rules, so the
        interval is of the gain, not of two separate ALs. Rules by their spec strings, as in ``rows``."""
        seqs = [s for s in self.sequences if task in ("all", s["task"])]
        a = [s["rules"][rule][f"al_sum_{m}"] for s in seqs]
        b = [s["rules"][baseline][f"al_sum_{m}"] for s in seqs]
        # NaN throughout where the baseline accepts nothing
        return tuple(float(x - 1) for x in ratio_interval(a, b, resample_counts(_keys(seqs), n_boot, seed)))

    def figures(self) -> dict:
        """{file name: PNG bytes} of the analysis figures (acceptance and AL against delta, AL
        against emitted KL, AL against delta per task when there are several)."""
        from ._outputs import analysis_figures

        return analysis_figures(self)

    def write(self, out_dir, figures: bool = True) -> list:
        """Write analysis.csv, analysis.json and (with ``figures``) the figures into ``out_dir``,
        atomically; returns the paths."""
        from ._outputs import write_outputs

        return write_outputs(self, out_dir, figures=figures)

    def table(self, task="all", trace="all") -> str:
        """The rows of one task (or of one trace, over all its tasks) as a fixed-width text table."""
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
    if isinstance(ms, (int, np.integer)) and not isinstance(ms, bool):
        ms = (ms,)
    try:
        values = list(ms)
    except TypeError:
        raise ValueError(f"ms must be a list of block sizes m (integers >= 1); got {ms!r}") from None
    if not values:
        raise ValueError("ms is empty: give at least one block size m (drafted tokens per verification), e.g. (4, 8)")
    bad = [m for m in values if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1]
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
    ids = [s["id"] for s in sequences]
    if len(set(ids)) == len(ids):
        return ids
    return [f"{s.get('trace', '')}/{s['id']}" for s in sequences]


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
    drafted: float  # with a policy: drafted tokens per step (mean over block starts)
    draft_forwards: float  # with a policy: draft forwards per step (a stop reads p at one more place)
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
    (True, False, or None: only on a terminal).
    """
    from .._data._traceset import open_traces

    if bonus_policy not in BONUS_POLICIES:
        raise ValueError(f"bonus_policy must be one of {BONUS_POLICIES}; got {bonus_policy!r}")
    if draft_mode not in DRAFT_MODES:
        raise ValueError(f"draft_mode must be one of {DRAFT_MODES}; got {draft_mode!r}")
    if not (isinstance(block_paths, (int, np.integer)) and block_paths >= 2):
        raise ValueError(f"block_paths must be an integer >= 2; got {block_paths!r}")
    if not (isinstance(processes, (int, np.integer)) and processes >= 1):
        raise ValueError(f"processes must be an integer >= 1; got {processes!r}")
    if client is not None and processes > 1:
        raise ValueError("give either client= (a Dask cluster) or processes > 1 (local workers), not both")
    n_boot = check_resamples(n_boot)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0; got {seed!r}")
    ms = _check_ms(ms)
    rules = make_rules(list(rules)) if not isinstance(rules, str) else make_rules(rules)
    if isinstance(draft_policies, str):
        draft_policies = [draft_policies]
    policies = []
    for spec in draft_policies or ():
        policy = make_draft_policy(spec)
        if policy is not None and policy not in policies:
            policies.append(policy)
    if any(p.needs_cost for p in policies) and cost is None:
        raise ValueError("draft policy cost-optimal needs cost= (a CostModel: the planner passes its own)")
    blocks = [r.describe() for r in rules if getattr(r, "block_level", False)]
    if policies and blocks:
        raise ValueError(f"{', '.join(blocks)} judge whole blocks: drafting policies are for token rules and trees")
    if bonus_policy == "relaxed" and blocks:
        raise ValueError(f"{', '.join(blocks)} judge whole blocks: their bonus token is the verifier's only; "
                         "analyse them with bonus_policy='verifier'")  # fmt: skip
    labels = [_rule_label(r) for r in rules]
    if len(set(labels)) != len(labels):
        raise ValueError(f"rules must be distinct; got {labels}")
    start = time.perf_counter()
    traces = open_traces(trace)
    if settings is None:
        settings = traces.sampling
    known = sorted({s["task"] for t in traces.traces for s in t.manifest["sequences"]})
    if not known:
        raise ValueError(f"trace {traces.directory!r} holds no sequences: nothing to analyse")
    if traces.n_positions == 0:
        raise ValueError(f"trace {traces.directory!r} holds {len(traces)} sequence(s), all empty: nothing to analyse")
    empty = sum(1 for t in traces.traces for s in t.manifest["sequences"] if s["positions"] == 0)
    if tasks is not None:
        tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        unknown = sorted(set(tasks) - set(known))
        if unknown:
            raise ValueError(f"task(s) {unknown} are not in the trace; its tasks: {', '.join(known)}")
    wanted = None if tasks is None else tuple(tasks)
    longest = max(s["positions"] for t in traces.traces for s in t.manifest["sequences"]
                  if wanted is None or s["task"] in wanted)  # fmt: skip
    asked = ms
    ms, notes = _cap_ms(ms, longest)
    jobs, names, total = [], [], 0
    for name, t in zip(traces.names, traces.traces, strict=True):
        for i in sorted({s["shard"] for s in t.manifest["sequences"] if wanted is None or s["task"] in wanted}):
            # absolute: a worker of a remote cluster does not run in this directory
            jobs.append((os.path.abspath(t.directory), i, list(rules), tuple(ms), settings, bonus_policy, wanted,
                         draft_mode, int(block_paths), policies, cost))  # fmt: skip
            names.append(name)
            total += t.manifest["shards"][i]["positions"]
    with progress_bar(total=total, desc="analyse", unit="pos", enabled=progress) as bar:

        def done(part):
            bar.update(sum(s["positions"] for s in part))

        if client is not None:
            parts = run_dask(_shard_stats, jobs, client, done)
        else:
            parts = run_local(_shard_stats, jobs, processes, done)
    sequences = [{**seq, "trace": name} for name, part in zip(names, parts, strict=True) for seq in part]
    # one order whatever the engine, the shard layout or the order the traces were given in
    sequences.sort(key=lambda s: (s["id"], s["trace"]))
    rows = []
    task_names = ["all", *sorted({s["task"] for s in sequences})]
    # one resampling per set of sequences, shared by every rule and m (paired, and the same
    # interval for the same quantity in every table of this trace: ``_bootstrap``)
    selections = {task: [s for s in sequences if task in ("all", s["task"])] for task in task_names}
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
        per_trace = {name: [s for s in sequences if s["trace"] == name] for name in traces.names}
        trace_counts = {name: resample_counts(_keys(sel), n_boot, seed) for name, sel in per_trace.items()}
        for rule in rules:
            for m in ms:
                for name in traces.names:
                    sel = per_trace[name]
                    if sel:
                        trace_rows.append(_row(rule, m, "all", name, sel, trace_counts[name], bonus_policy,
                                               draft_mode))  # fmt: skip
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
    pos = [s["positions"] for s in sel]
    stats = {name: ratio_interval([s["rules"][label][name] for s in sel], pos, counts) for name in METRICS}
    tag = m if policy is None else f"{m}@{policy.describe()}"
    starts = [s["rules"][label][f"al_n_{m}"] for s in sel]
    al = ratio_interval([s["rules"][label][f"al_sum_{tag}"] for s in sel], starts, counts)
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
    if policy is not None:  # drafts and draft forwards per step (means over block starts)
        row["draft_policy"] = policy.describe()
        row["drafted"] = float(sum(s["rules"][label][f"drafted_sum_{tag}"] for s in sel) / max(sum(starts), 1))
        row["draft_forwards"] = float(sum(s["rules"][label][f"forwards_sum_{tag}"] for s in sel) / max(sum(starts), 1))
    elif f"accept_pos_sum_{m}" in sel[0]["rules"][label]:  # vLLM's num_accepted_tokens_per_pos / num_drafts
        sums = np.sum([s["rules"][label][f"accept_pos_sum_{m}"] for s in sel], axis=0)
        row["acceptance_by_position"] = [float(x) for x in sums / max(sum(starts), 1)]
    tokens = [s["rules"][label][f"al_sum_{m}"] + s["rules"][label][f"al_n_{m}"] for s in sel]
    stats["acceptance_of_optimum"] = ratio_interval(
        [s["rules"][label]["acceptance"] for s in sel], [s["rules"][label]["optimal_acceptance"] for s in sel], counts
    )
    for name in BLOCK_METRICS:
        stats[f"{name}_per_token"] = ratio_interval([s["rules"][label][f"{name}_block_{m}"] for s in sel], tokens,
                                                    counts)  # fmt: skip
    for name, (v, lo, hi) in stats.items():
        row[name], row[f"{name}_lo"], row[f"{name}_hi"] = v, lo, hi
    if policy is not None:  # the per-token drift above is of fixed blocks of m, not of this policy's
        for name in BLOCK_METRICS:
            row[f"{name}_per_token"] = row[f"{name}_per_token_lo"] = row[f"{name}_per_token_hi"] = float("nan")
    return row
