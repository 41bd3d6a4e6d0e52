"""Batched speculative decoding from a trace, with the batch's requests ending at their own times,
and a verify budget shared by the batch.

**Requests leaving the batch.** B requests (trace sequences) advance in synchronous steps; each
drafts m tokens and verifies its block, accepting its own length; a request that has emitted all
its tokens leaves, and the next steps run with the requests still in flight. Under the analysis's
model of independent positions each request's progress is a Markov chain over its positions
(from position t a step accepts i drafts with P(tau = i | t) = a_t ... a_{t+i-1} (1 - a_{t+i}) and
emits i + 1 tokens), so the law of the number of steps each request needs is exact (a dynamic
programme over positions and steps), and so is, by independence across requests, the law of how
many are in flight at each step (a Poisson-binomial). From it, exactly:

- the batch's expected time, sum over steps of E[step_time(B_alive)], and its throughput, the
  tokens over the batch divided by it;
- each request's expected latency, sum over steps of P(it is in flight) E[step_time(1 + the others
  in flight)].

The verifier alone decodes the same requests in the same static batch (one token per request per
step, the batch shrinking as they end). Step times come from the cost model at each batch size
(``CostModel.at_batch``; between two timed sizes of a calibration, linear interpolation).

**A verify budget.** In a full batch (continuous batching: a finished request is replaced), each
step chooses how many of each request's m drafts to verify: the marginal drafts of all requests
ranked by the drafter's own survival estimate (the product of its top-1 probabilities), the
number N taken that maximises (B + sum of the N estimates) / (m t_draft + t_verify(1 + N / B)),
the verifier's block at the mean verified length. The tokens each request then gains are exact
given its position (the rule's acceptances); the batch's positions are drawn from the trace as
decoding visits them (``renewal_visits``: the steps of blocks of m start at a position that often;
Monte Carlo over steps, with its standard error). Where even the best share does not beat the
verifier alone, the budget drafts nothing (1.0x). Neither full-batch column charges the extra
draft forward after a fully accepted block (a batched drafter reads the last draft with the next
block's first token).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._math._validation import check_int, seeded_rng
from .._util._results import Result

__all__ = ["MAX_BATCH", "BatchResult", "batch_parts", "batch_requests", "simulate_batch", "steps_law", "verify_budget"]


def batch_parts(cost, size):
    """(seconds of one drafted token, the verify curve k -> seconds) of ``cost`` with ``size``
    sequences in flight: ``cost.at_batch`` where it knows the size (a timed size, a measured GPU
    profile through its fitted roofline, a roofline profile's sizes), else linear interpolation
    between the two nearest sizes it knows (a calibration's timed sizes; 1 is always known)."""
    try:
        at = cost.at_batch(size)
        return at.draft_time(), at.verify
    except ValueError:
        pass
    known = sorted({1, *cost.batch_sizes})
    lo = max(b for b in known if b <= size)
    hi = min((b for b in known if b >= size), default=None)
    if hi is None:
        raise ValueError(
            f"batch size {size} is beyond the cost model's largest ({known[-1]}): calibrate --batch with it"
        )
    a, b = cost.at_batch(lo), cost.at_batch(hi)
    share = (size - lo) / (hi - lo)
    return (
        (1 - share) * a.draft_time() + share * b.draft_time(),
        lambda k: (1 - share) * a.verify(k) + share * b.verify(k),
    )


def _step_law(accept, m):
    """P(a step from position t accepts i drafts), i = 0..m, for every t of one request's per-position
    acceptances ``accept`` (N,), positions past the end counting as rejections: (N, m + 1)."""
    n = accept.shape[0]
    index = np.arange(n)[:, None] + np.arange(m)[None, :]
    a = np.where(index < n, accept[np.minimum(index, n - 1)], 0.0)
    reach = np.concatenate([np.ones((n, 1)), np.cumprod(a, axis=-1)], axis=-1)
    law = reach.copy()
    law[:, :m] *= 1.0 - a
    return law


def steps_law(accept, m, max_steps=None):
    """P(a request of N = len(accept) tokens needs more than s steps), s = 0..S-1 (S = N: a step emits
    at least one token), exactly under independent positions: a dynamic programme over (position,
    steps)."""
    return _step_profile(accept, m, max_steps)[0]


def _step_profile(accept, m, max_steps=None):
    """Per step s = 0..S-1 of one request: (P(still running), P(running and accepting every one of its m
    drafts: its drafter then reads its last draft in one more forward), E[drafts accepted, 0 when done]),
    exactly under independent positions (``steps_law``'s dynamic programme)."""
    accept = np.asarray(accept, dtype=np.float64)
    running, full, accepted = _step_profiles([accept], m, max_steps, floor=0.0)
    return running[0], full[0], accepted[0]


#: Below this chance of a request still running, a profile's later steps are zero (their time is under
#: 1e-16 of a step's): the dynamic programme stops there rather than run to the request's length.
_NEGLIGIBLE = 1e-16


def _step_profiles(accepts, m, max_steps=None, *, floor=_NEGLIGIBLE):
    """``_step_profile`` of every request at once, (R, S) arrays each: the chain over positions advanced
    for all requests together, one step a time, each step's move the m + 1 shifts of the positions (a
    banded transition, O(R N m) a step, not a dense N x N product). Rows are zero past a request's
    length; the steps stop where no request still runs with chance over ``floor`` (or at ``max_steps``)."""
    lengths = np.array([a.shape[0] for a in accepts])
    n = int(lengths.max())
    steps = n if max_steps is None else min(n, int(max_steps))
    law = np.zeros((len(accepts), n, m + 1))  # each request's step law (``_step_law``), zero past its length
    for i, a in enumerate(accepts):
        law[i, : a.shape[0]] = _step_law(np.asarray(a, dtype=np.float64), m)
    inside = np.arange(n)[None, :] < lengths[:, None]
    mean = law @ np.arange(m + 1.0)
    at = np.zeros((len(accepts), n + m + 1))  # P(at position t after s steps); t >= the request's length: done
    at[:, 0] = 1.0
    running, full, accepted = (np.zeros((len(accepts), steps)) for _ in range(3))
    for s in range(steps):
        here = at[:, :n] * inside
        running[:, s] = here.sum(-1)
        if running[:, s].max() <= floor:
            running[:, s] = 0.0
            break
        full[:, s] = (here * law[..., m]).sum(-1)
        accepted[:, s] = (here * mean).sum(-1)
        at = np.zeros_like(at)
        for i in range(m + 1):
            at[:, i + 1 : i + 1 + n] += here * law[..., i]
    return np.clip(running, 0.0, 1.0), np.clip(full, 0.0, 1.0), accepted


def _poisson_binomial(probs):
    """The law of the number of successes of independent trials with success chances ``probs`` (..., n):
    (..., n + 1), one law per leading index."""
    return _counts(1.0 - np.asarray(probs, dtype=np.float64), probs)


def _counts(p_out, p_in):
    """sum over the subsets S of independent trials of prod_{i in S} p_in[i] prod_{i not in S} p_out[i], by |S|:
    the law of the number of trials "in" when each trial is out, in, or (with the rest of its chance) neither,
    restricted to no trial being neither. Arrays (..., n), one law (..., n + 1) per leading index."""
    p_out, p_in = np.asarray(p_out, dtype=np.float64), np.asarray(p_in, dtype=np.float64)
    n = p_out.shape[-1]
    law = np.zeros((*p_out.shape[:-1], n + 1))
    law[..., 0] = 1.0
    for i in range(n):
        head = law[..., : i + 2].copy()
        law[..., : i + 1] = head[..., : i + 1] * p_out[..., i : i + 1]
        law[..., 1 : i + 2] += head[..., : i + 1] * p_in[..., i : i + 1]
    return law


def _mean_without(law, probs, values):
    """Per trial i, E[values[the other trials' successes]], (..., R): from the law of all n trials'
    successes (..., n + 1) and each one's chance ``probs`` (..., R), the law of the others' successes is
    the convolution with Bernoulli(p_i) undone from its stable end (forwards where p_i <= 1/2, backwards
    otherwise), its terms clipped at 0 and normalised; ``values`` (n,) is read as it is built, so the
    (..., R, n) laws are never held."""
    law = np.asarray(law, dtype=np.float64)
    n = law.shape[-1] - 1
    p = np.asarray(probs, dtype=np.float64)
    forward, backward = np.zeros((2, *p.shape)), np.zeros((2, *p.shape))  # (E numerator, total) each
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        prev = np.zeros(p.shape)
        for k in range(n):
            prev = np.maximum((law[..., k, None] - p * prev) / (1.0 - p), 0.0)
            forward[0] += prev * values[k]
            forward[1] += prev
        nxt = np.zeros(p.shape)
        for k in range(n, 0, -1):
            nxt = np.maximum((law[..., k, None] - (1.0 - p) * nxt) / p, 0.0)
            backward[0] += nxt * values[k - 1]
            backward[1] += nxt
        mean, total = np.where(p <= 0.5, forward, backward)
        out = np.where(np.isfinite(total) & (total > 0), mean / total, 0.0)
    return np.nan_to_num(out, nan=0.0, posinf=0.0)


@dataclass(frozen=True)
class BatchResult(Result):
    """One static batch of requests: expected time and tokens of speculative decoding and of the
    verifier alone, and each request's expected latency under both; a result as every other (``records``:
    one row per request; ``table``)."""

    tokens: int
    time: float
    time_alone: float
    latency: np.ndarray
    latency_alone: np.ndarray

    @property
    def throughput_speedup(self) -> float:
        return self.time_alone / self.time

    @property
    def latency_speedup(self) -> float:
        """The mean over the requests of the ratio of their expected latencies."""
        return float(np.mean(self.latency_alone / self.latency))

    name = "batch"

    def records(self) -> list:
        """One row per request: its expected latency speculative and alone, and their ratio."""
        return [
            {"request": i, "latency": float(a), "latency_alone": float(b), "speedup": float(b / a)}
            for i, (a, b) in enumerate(zip(np.ravel(self.latency), np.ravel(self.latency_alone), strict=True))
        ]

    def table(self) -> str:
        head = (
            f"{self.tokens} tokens in {self.time:.6g} s ({self.time_alone:.6g} s alone): throughput speedup "
            f"{self.throughput_speedup:.3f}x, latency speedup {self.latency_speedup:.3f}x"
        )
        rows = [
            f"{r['request']:>7} {r['latency']:>12.6g} {r['latency_alone']:>13.6g} {r['speedup']:>8.3f}x"
            for r in self.records()
        ]
        return "\n".join([head, f"{'request':>7} {'latency, s':>12} {'alone, s':>13} {'speedup':>9}", *rows])


#: The largest batch the batch planner takes: the roofline's range (``_roofline``), and what the exact
#: static-batch law holds in bounded memory (its Poisson-binomial laws are B x B).
MAX_BATCH = 1024


def checked_batch_size(size, name="size"):
    """``size`` as an int batch size in 1..``MAX_BATCH``, else a ValueError naming ``name``."""
    if isinstance(size, (bool, np.bool_)) or not isinstance(size, (int, np.integer, float, np.floating)):
        raise ValueError(f"{name} must be a whole number of requests in flight, 1 to {MAX_BATCH}; got {size!r}")
    if not np.isfinite(size) or size != int(size) or not 1 <= size <= MAX_BATCH:
        raise ValueError(f"{name} must be a whole number of requests in flight, 1 to {MAX_BATCH}; got {size!r}")
    return int(size)


def _checked_draft_length(m, name="m"):
    return check_int(m, name, 1, what="drafts a step")


def _checked_acceptances(values, name):
    """A non-empty list of 1-D float64 arrays of probabilities in [0, 1], one per request."""
    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype != object:
        raise ValueError(f"{name} must be a list of per-position arrays, one per request; got one array")
    try:
        out = [np.asarray(a, dtype=np.float64) for a in values]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a list of per-position arrays of probabilities, one per request") from None
    if not out:
        raise ValueError(f"{name} is empty: give at least one request's per-position array")
    for i, a in enumerate(out):
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"{name}[{i}] must be a non-empty 1-D array (one value per position); got shape {a.shape}")
        if not np.all((a >= 0) & (a <= 1)):  # NaN fails too
            bad = a[~((a >= 0) & (a <= 1))][0]
            raise ValueError(f"{name}[{i}] must hold probabilities in [0, 1]; got {float(bad)!r}")
    return out


def simulate_batch(accepts, m, cost, *, width=1):
    """``BatchResult`` of one static batch: ``accepts`` a list of each request's per-position
    acceptance (the rule's; over the k drafts for a tree of width ``width``), m drafts a step, the
    cost model's step at the number of requests in flight (``batch_parts``): the terms of
    ``CostModel.step_time``, one step's cost for the planner and this module alike: m draft
    forwards of the requests in flight and one verification of their blocks of width m + 1, one more
    draft forward when a request accepted its whole block (its drafter reads its last draft:
    ``step_time``'s ``all_accepted``; charged at the batch in flight, which llama.cpp's batch decoder
    runs for those that lack it alone, at most that), the step's overhead and each token's judging.
    At one request it is ``step_time`` step by step. Exact under independent positions (see the
    module docstring). At most ``MAX_BATCH`` requests."""
    accepts = _checked_acceptances(accepts, "accepts")
    m = _checked_draft_length(m)
    width = _checked_draft_length(width, "width")
    checked_batch_size(len(accepts), "the number of requests (len(accepts))")
    lengths = np.array([[a.size for a in accepts]])
    profiles = tuple(a[None] for a in _step_profiles(accepts, m))
    return _simulate(profiles, lengths, m, cost, width, _StepCosts(cost))[0]


class _StepCosts:
    """The cost model's step parts at each number of requests in flight (``batch_parts``), each size asked
    once: a sweep over batch sizes and groups reads the same sizes again and again."""

    def __init__(self, cost):
        self.cost, self._parts, self._arrays = cost, {}, {}

    def parts(self, size):
        if size not in self._parts:
            self._parts[size] = batch_parts(self.cost, size)
        return self._parts[size]

    def arrays(self, size, m, width):
        """(step seconds, draft seconds, the verifier alone's seconds), each indexed by the requests in
        flight 0..size."""
        known = self._arrays.get((m, width))
        if known is None or known[0].size <= size:
            parts = [self.parts(b) for b in range(1, size + 1)]
            step = np.array([0.0] + [m * d + v(width * m + 1) for d, v in parts])
            drafts = np.array([0.0] + [d for d, _ in parts])
            alone = np.array([0.0] + [v(1) for _, v in parts])
            known = self._arrays[(m, width)] = (step, drafts, alone)
        return tuple(a[: size + 1] for a in known)


def _simulate(profiles, lengths, m, cost, width, costs):
    """``simulate_batch`` of G batches of B requests at once: their step profiles ((G, B, S) arrays of
    ``_step_profiles``), their lengths (G, B) and the cost model's parts (``_StepCosts``); every step of
    every batch together, the laws of the requests in flight as arrays over (batch, step). A list of G
    ``BatchResult``."""
    alive, full, accepted = (np.swapaxes(a, 1, 2) for a in profiles)  # (G, S, B)
    groups, _, size = alive.shape
    step, drafts, alone = costs.arrays(size, m, width)
    law = _poisson_binomial(alive)  # (G, S, B + 1): P(b requests in flight at step s)
    busy = 1.0 - law[..., 0]
    # one more draft forward, of the batch in flight, when any request accepted its whole block: P(b in flight
    # and one of them accepted all) = P(b in flight) - P(b in flight, none of them accepting all)
    catch_up = (law - _counts(1.0 - alive, alive - full)) @ drafts
    extra = catch_up + cost.step_overhead * busy + cost.judge_token * (alive + accepted).sum(-1)
    total = (law @ step).sum(-1) + extra.sum(-1)
    per_busy = extra / np.maximum(busy, 1e-300)
    # per request, its step's expected time given it is in flight: the others in flight with it, each step
    others = _mean_without(law, alive, step[1 : size + 1])
    latency = (alive * (others + per_busy[..., None])).sum(1)
    results = []
    for g in range(groups):
        # the verifier alone: one token per request a step, the batch shrinking as its requests end
        ends = np.sort(lengths[g])
        in_flight = size - np.searchsorted(ends, np.arange(ends[-1]), side="right")
        elapsed = np.cumsum(alone[in_flight])
        results.append(
            BatchResult(int(ends.sum()), float(total[g]), float(elapsed[-1]), latency[g], elapsed[lengths[g] - 1])
        )
    return results


def verify_budget(accepts, top1s, m, cost, size, *, steps=2000, seed=0, visits=None):
    """A full batch of ``size`` requests (continuous batching) with a verify budget against verifying
    every draft: (throughput speedup with the budget, with every draft verified, standard errors
    of both, mean drafts verified per request) against the verifier alone at the same batch size,
    from ``steps`` seeded batch states (each request at a position drawn from the trace: uniformly,
    or weighted by ``visits``, one array per request of the expected steps decoding starts at each
    position, ``renewal_visits``). Per state the budget and the tokens gained are exact (module
    docstring); a speedup is the expected
    tokens over the expected seconds of a step (a throughput), its standard error the ratio
    estimator's. The budget may also draft nothing: where drafting and verifying its best share
    is slower than the verifier alone on these states, it decodes without drafts (1.0x, 0
    verified), so it is never below the verifier alone; verifying every draft has no such choice."""
    accepts = _checked_acceptances(accepts, "accepts")
    top1s = _checked_acceptances(top1s, "top1s")
    if len(top1s) != len(accepts) or any(a.shape != c.shape for a, c in zip(accepts, top1s, strict=False)):
        raise ValueError(
            "top1s must have one array per request of accepts, each of the same length; got "
            f"{[a.size for a in accepts][:4]} and {[c.size for c in top1s][:4]} positions"
        )
    m = _checked_draft_length(m)
    size = checked_batch_size(size)
    check_int(steps, "steps", 2, what="seeded batch states")
    rng = seeded_rng(seed)
    draft, verify = batch_parts(cost, size)
    # every position of every request: the drafter's survival estimate and the rule's reach
    survival, reach = [], []
    for a, c in zip(accepts, top1s, strict=True):
        n = a.shape[0]
        index = np.arange(n)[:, None] + np.arange(m)[None, :]
        inside = index < n
        at = np.minimum(index, n - 1)
        survival.append(np.cumprod(np.where(inside, c[at], 0.0), axis=-1))
        reach.append(np.cumprod(np.where(inside, a[at], 0.0), axis=-1))
    survival, reach = np.concatenate(survival), np.concatenate(reach)
    if visits is None:
        picks = rng.integers(0, survival.shape[0], size=(steps, size))
    else:
        weights = np.concatenate([np.asarray(v, dtype=np.float64) for v in visits])
        if (
            weights.shape != (survival.shape[0],)
            or not np.all(np.isfinite(weights) & (weights >= 0))
            or not (weights.sum() > 0)
        ):
            raise ValueError("visits must hold one array of expected visits >= 0 per request, as long as its accepts")
        picks = rng.choice(weights.size, size=(steps, size), p=weights / weights.sum())
    est, gain = survival[picks], reach[picks]  # (steps, B, m)
    flat = est.reshape(steps, -1)
    ranked = np.sort(flat, axis=-1)[:, ::-1]  # the marginal drafts, most likely to survive first
    counts = np.arange(size * m + 1)
    seconds = m * draft + np.asarray(verify(1 + counts / size), dtype=np.float64)
    value = (size + np.concatenate([np.zeros((steps, 1)), np.cumsum(ranked, -1)], -1)) / seconds[None, :]
    best = np.argmax(value, -1)
    # the best N drafts, ties taken in the order of the requests (a stable ranking): those above the N-th
    # largest, then as many of those equal to it as N still wants, first come first taken
    threshold = np.where(best > 0, ranked[np.arange(steps), np.maximum(best - 1, 0)], np.inf)[:, None]
    chosen = flat > threshold
    tied = flat == threshold
    wanted = best - chosen.sum(-1)
    split = np.flatnonzero(wanted < tied.sum(-1))  # states where only some of the tied drafts are taken
    chosen |= tied
    if split.size:
        chosen[split] = (flat[split] > threshold[split]) | (
            tied[split] & (np.cumsum(tied[split], -1) <= wanted[split, None])
        )
    # a request's drafts are verified as a prefix (its estimates never rise along its block): its chosen count
    verified = chosen.reshape(steps, size, m).sum(-1)
    tokens = size + np.where(np.arange(m)[None, None, :] < verified[..., None], gain, 0.0).sum((-1, -2))
    # the rest of a step's cost (``simulate_batch``): the drafters of the requests that accepted their whole
    # block read their last draft in one more forward (a forward of the batch's size, however many lack it),
    # the step's overhead, and each emitted token's judging
    whole = np.where(verified == m, gain[..., m - 1], 0.0)
    tokens_fixed = size + gain.sum((-1, -2))
    extra_budget = draft * (1.0 - np.prod(1.0 - whole, -1)) + cost.step_overhead + cost.judge_token * tokens
    extra_fixed = (
        draft * (1.0 - np.prod(1.0 - gain[..., m - 1], -1)) + cost.step_overhead + (cost.judge_token * tokens_fixed)
    )
    seconds_budget = m * draft + np.asarray(verify(1 + verified.sum(-1) / size), dtype=np.float64) + extra_budget
    seconds_fixed = m * draft + verify(m + 1) + extra_fixed
    baseline = size / verify(1)

    def throughput(tok, sec):
        """(E[tokens] / E[seconds] over the verifier alone's rate, its ratio-estimator standard error)."""
        ratio = tok.mean() / sec.mean()
        error = (tok - ratio * sec).std(ddof=1) / np.sqrt(steps) / sec.mean()
        return float(ratio / baseline), float(error / baseline)

    budget, budget_se = throughput(tokens, seconds_budget)
    fixed, fixed_se = throughput(tokens_fixed, seconds_fixed)
    verified_mean = float(verified.mean())
    if budget < 1.0:  # drafting does not pay on this trace at this batch: the budget decodes without drafts
        budget, budget_se, verified_mean = 1.0, 0.0, 0.0
    return budget, fixed, budget_se, fixed_se, verified_mean


def batch_requests(
    traces,
    settings,
    cost,
    sizes,
    *,
    n_groups=None,
    budget_steps=2000,
    seed=0,
    progress=False,
    tasks=None,
    draft_mode="sampled",
    gate=None,
):
    """Per rule setting and batch size: the static batch of the trace's requests ending at their own
    times (``simulate_batch``) and the verify budget in a full batch (``verify_budget``), at the
    setting's m. ``settings``: {(rule spec, B): m} (a token or tree rule; block rules judge whole
    blocks and are left out). Requests: the trace's sequences of ``tasks`` (default: all), in
    ``n_groups`` seeded batches of B per size (drawn without replacement while they last, the pool
    reshuffled when B exceeds it; default: enough batches for every request to be in one, and at
    least 4). ``draft_mode`` and ``gate`` as in ``analyze_trace``: the rule's
    acceptance is the one the rest of a plan answers for (the drafter's survival estimate of the
    budget reads its own p, before greedy drafting, as the drafting policies do).
    Returns rows: rule, batch, m, throughput_speedup and latency_speedup (pooled over the groups;
    their range over the groups in ``_lo`` / ``_hi``), budget_speedup and fixed_speedup (full batch,
    each with its Monte Carlo standard error) and verified (mean drafts verified per request)."""
    from .._laws._policies import renewal_visits
    from .._rules import judgement_of, make_rule
    from ._analyze import analyze_trace

    rules = sorted({spec for spec, _ in settings})
    judged = {r: judgement_of(make_rule(r)) for r in rules}
    token_rules = [r for r, judgement in judged.items() if not judgement.block and not judgement.slot_dependent]
    if not token_rules:
        return []
    result = analyze_trace(
        traces,
        token_rules,
        ms=(1,),
        n_boot=0,
        position_acceptance=True,
        progress=progress,
        tasks=tasks,
        draft_mode=draft_mode,
        gate=gate,
    )
    labels = {r: make_rule(r).describe() for r in token_rules}
    sequences = sorted(result.sequences, key=lambda s: (s.trace, s.id))
    several = len(traces.traces) > 1
    top1 = {}
    for name, trace in zip(traces.names, traces.traces, strict=True):
        for seq in trace:
            if seq.n_positions:
                p, _ = seq.distributions(traces.sampling)
                top1[(name, seq.id) if several else seq.id] = np.asarray(p, dtype=np.float64).max(-1)
    rows = []
    rng = seeded_rng(seed)
    costs, profiles = _StepCosts(cost), {}
    for (spec, size), m in sorted(settings.items()):
        if spec not in labels:
            continue
        checked_batch_size(size)
        rule = make_rule(spec)
        width = rule.draft_count
        accepts = [s.rules[labels[spec]].position_acceptance for s in sequences]
        tops = [top1[(s.trace, s.id) if several else s.id] for s in sequences]
        lengths = np.array([a.size for a in accepts])
        if (spec, m) not in profiles:  # every request's step profile, once per rule and m for every batch size
            profiles[(spec, m)] = _step_profiles(accepts, m)
        alive, full, accepted = profiles[(spec, m)]
        groups = n_groups if n_groups is not None else max(4, -(-len(accepts) // size))
        order = np.concatenate([rng.permutation(len(accepts)) for _ in range(-(-groups * size // len(accepts)))])
        chosen = order[: groups * size].reshape(groups, size)
        steps = int(np.flatnonzero(alive[chosen].max((0, 1)) > 0).max(initial=0)) + 1  # past it, nobody runs
        group = (alive[chosen, :steps], full[chosen, :steps], accepted[chosen, :steps])
        results = _simulate(group, lengths[chosen], m, cost, width, costs)
        throughput = [r.throughput_speedup for r in results]
        latency = [r.latency_speedup for r in results]
        # the batch's requests sit where decoding visits them: the steps of fixed blocks of m start there
        visits = []
        for a in accepts:
            first = 1 if a.size - m >= 1 else 0
            visits.append(renewal_visits(a, m, start=first, stop=max(a.size - m, first)))
        budget, fixed, budget_se, fixed_se, verified = verify_budget(
            accepts, tops, m, cost, size, steps=budget_steps, seed=seed, visits=visits
        )
        rows.append(
            {
                "rule": labels[spec],
                "batch": size,
                "m": m,
                "throughput_speedup": sum(r.time_alone for r in results) / sum(r.time for r in results),
                "throughput_speedup_lo": min(throughput),
                "throughput_speedup_hi": max(throughput),
                "latency_speedup": float(np.mean(np.concatenate([r.latency_alone / r.latency for r in results]))),
                "latency_speedup_lo": min(latency),
                "latency_speedup_hi": max(latency),
                "budget_speedup": budget,
                "budget_speedup_se": budget_se,
                "fixed_speedup": fixed,
                "fixed_speedup_se": fixed_se,
                "verified": verified,
            }
        )
    return rows
