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
given its position (the rule's acceptances); the batch's positions are drawn from the trace
(Monte Carlo over steps, with its standard error).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["BatchResult", "batch_parts", "batch_requests", "simulate_batch", "steps_law", "verify_budget"]


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
    return ((1 - share) * a.draft_time() + share * b.draft_time(),
            lambda k: (1 - share) * a.verify(k) + share * b.verify(k))  # fmt: skip


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
    n = accept.shape[0]
    law = _step_law(np.asarray(accept, dtype=np.float64), m)
    steps = n if max_steps is None else min(n, max_steps)
    move = np.zeros((n + 1, n + 1))  # one step's transition between positions (n: done, absorbing)
    move[n, n] = 1.0
    for i in range(m + 1):
        np.add.at(move, (np.arange(n), np.minimum(np.arange(n) + i + 1, n)), law[:, i])
    at = np.zeros(n + 1)  # P(at position t after s steps)
    at[0] = 1.0
    running = np.zeros(steps)
    for s in range(steps):
        running[s] = 1.0 - at[n]
        at = at @ move
    return np.clip(running, 0.0, 1.0)


def _poisson_binomial(probs):
    """The law of the number of successes of independent trials with success chances ``probs``."""
    law = np.array([1.0])
    for p in probs:
        law = np.convolve(law, [1.0 - p, p])
    return law


def _without(law, probs):
    """Per trial i, the law of the other trials' successes, (R, n), from the law of all n of them and
    each one's chance ``probs`` (R,): the convolution with Bernoulli(p_i) undone from its stable end
    (forwards where p_i <= 1/2, backwards otherwise)."""
    n = law.size - 1
    p = np.asarray(probs, dtype=np.float64)[:, None]
    forward = np.zeros((p.shape[0], n))
    backward = np.zeros((p.shape[0], n))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        prev = np.zeros((p.shape[0], 1))
        for k in range(n):
            prev = forward[:, k : k + 1] = np.maximum((law[k] - p * prev) / (1.0 - p), 0.0)
        nxt = np.zeros((p.shape[0], 1))
        for k in range(n, 0, -1):
            nxt = backward[:, k - 1 : k] = np.maximum((law[k] - (1.0 - p) * nxt) / p, 0.0)
    out = np.where(p <= 0.5, forward, backward)
    out = np.nan_to_num(out, nan=0.0, posinf=0.0)
    total = out.sum(-1, keepdims=True)
    return np.where(total > 0, out / np.where(total > 0, total, 1.0), out)


@dataclass(frozen=True)
class BatchResult:
    """One static batch of requests: expected time and tokens of speculative decoding and of the
    verifier alone, and each request's expected latency under both."""

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


def simulate_batch(accepts, m, cost, *, width=1):
    """``BatchResult`` of one static batch: ``accepts`` a list of each request's per-position
    acceptance (the rule's; over the k drafts for a tree of width ``width``), m drafts a step, the
    cost model's step at the number of requests in flight (``batch_parts``; a step costs m draft
    forwards of the requests in flight and one verification of their blocks of width m + 1).
    Exact under independent positions (see the module docstring)."""
    accepts = [np.asarray(a, dtype=np.float64) for a in accepts]
    size = len(accepts)
    if size < 1:
        raise ValueError("a batch needs at least one request")
    parts = {b: batch_parts(cost, b) for b in range(1, size + 1)}
    step = np.array([0.0] + [m * parts[b][0] + parts[b][1](width * m + 1) for b in range(1, size + 1)])
    alone = np.array([0.0] + [parts[b][1](1) for b in range(1, size + 1)])
    running = [steps_law(a, m) for a in accepts]
    horizon = max(r.size for r in running)
    alive = np.zeros((size, horizon))
    for i, r in enumerate(running):
        alive[i, : r.size] = r
    total, latency = 0.0, np.zeros(size)
    for s in range(horizon):
        law = _poisson_binomial(alive[:, s])  # P(b requests in flight at step s)
        total += float(law @ step[: law.size])
        live = np.flatnonzero(alive[:, s] > 0)
        others = _without(law, alive[live, s])  # per request, the law of the others in flight
        latency[live] += alive[live, s] * (others @ step[1 : others.shape[1] + 1])
    lengths = np.array([a.size for a in accepts])
    in_flight = np.array([(lengths > s).sum() for s in range(lengths.max())])
    time_alone = float(alone[in_flight].sum())
    latency_alone = np.array([alone[in_flight[:n]].sum() for n in lengths])
    return BatchResult(int(lengths.sum()), total, time_alone, latency, latency_alone)


def verify_budget(accepts, top1s, m, cost, size, *, steps=2000, seed=0):
    """A full batch of ``size`` requests (continuous batching) with a verify budget against verifying
    every draft: (throughput speedup with the budget, with every draft verified, standard errors
    of both, mean drafts verified per request) against the verifier alone at the same batch size,
    from ``steps`` seeded batch states (each request at a position drawn from the trace). Per
    state the budget and the tokens gained are exact (module docstring)."""
    rng = np.random.default_rng(seed)
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
    picks = rng.integers(0, survival.shape[0], size=(steps, size))
    est, gain = survival[picks], reach[picks]  # (steps, B, m)
    order = np.argsort(-est.reshape(steps, -1), axis=-1, kind="stable")
    ranked = np.take_along_axis(est.reshape(steps, -1), order, -1)
    counts = np.arange(size * m + 1)
    seconds = m * draft + np.array([verify(1 + n / size) for n in counts])
    value = (size + np.concatenate([np.zeros((steps, 1)), np.cumsum(ranked, -1)], -1)) / seconds[None, :]
    best = np.argmax(value, -1)
    chosen = np.zeros((steps, size * m), dtype=bool)
    np.put_along_axis(chosen, order, counts[1:][None, :] <= best[:, None], -1)
    # a request's drafts are verified as a prefix: its chosen count, taken from the front
    verified = chosen.reshape(steps, size, m).sum(-1)
    tokens = size + np.where(np.arange(m)[None, None, :] < verified[..., None], gain, 0.0).sum((-1, -2))
    rate_budget = tokens / (m * draft + np.array([verify(1 + n / size) for n in verified.sum(-1) / 1.0]))
    rate_fixed = (size + gain.sum((-1, -2))) / (m * draft + verify(m + 1))
    baseline = size / verify(1)

    def error(rate):
        return float(rate.std(ddof=1) / np.sqrt(steps) / baseline)

    return (float(rate_budget.mean() / baseline), float(rate_fixed.mean() / baseline), error(rate_budget),
            error(rate_fixed), float(verified.mean()))  # fmt: skip


def batch_requests(traces, settings, cost, sizes, *, n_groups=4, budget_steps=2000, seed=0, progress=False):
    """Per rule setting and batch size: the static batch of the trace's requests ending at their own
    times (``simulate_batch``) and the verify budget in a full batch (``verify_budget``), at the
    setting's m. ``settings``: {(rule spec, B): m} (a token or tree rule; block rules judge whole
    blocks and are left out). Requests: the trace's sequences, in ``n_groups`` seeded batches of B
    per size (drawn without replacement while they last, the pool reshuffled when B exceeds it).
    Returns rows: rule, batch, m, throughput_speedup and latency_speedup (pooled over the groups;
    their range over the groups in ``_lo`` / ``_hi``), budget_speedup and fixed_speedup (full batch,
    each with its Monte Carlo standard error) and verified (mean drafts verified per request)."""
    from .._rules import kind_of, make_rule
    from ._analyze import analyze_trace

    rules = sorted({spec for spec, _ in settings})
    token_rules = [r for r in rules if kind_of(make_rule(r)) != "block" and not make_rule(r).slot_dependent]
    if not token_rules:
        return []
    result = analyze_trace(traces, token_rules, ms=(1,), n_boot=0, position_acceptance=True, progress=progress)
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
    rng = np.random.default_rng(seed)
    for (spec, size), m in sorted(settings.items()):
        if spec not in labels:
            continue
        rule = make_rule(spec)
        width = rule.draft_count
        accepts = [s.rules[labels[spec]].position_acceptance for s in sequences]
        tops = [top1[(s.trace, s.id) if several else s.id] for s in sequences]
        order = np.concatenate([rng.permutation(len(accepts)) for _ in range(-(-n_groups * size // len(accepts)))])
        results = [simulate_batch([accepts[i] for i in order[g * size : (g + 1) * size]], m, cost, width=width)
                   for g in range(n_groups)]  # fmt: skip
        throughput = [r.throughput_speedup for r in results]
        latency = [r.latency_speedup for r in results]
        budget, fixed, budget_se, fixed_se, verified = verify_budget(accepts, tops, m, cost, size, steps=budget_steps,
                                                                     seed=seed)  # fmt: skip
        rows.append({
            "rule": labels[spec], "batch": size, "m": m,
            "throughput_speedup": sum(r.time_alone for r in results) / sum(r.time for r in results),
            "throughput_speedup_lo": min(throughput), "throughput_speedup_hi": max(throughput),
            "latency_speedup": float(np.mean(np.concatenate([r.latency_alone / r.latency for r in results]))),
            "latency_speedup_lo": min(latency), "latency_speedup_hi": max(latency),
            "budget_speedup": budget, "budget_speedup_se": budget_se, "fixed_speedup": fixed,
            "fixed_speedup_se": fixed_se, "verified": verified,
        })  # fmt: skip
    return rows
