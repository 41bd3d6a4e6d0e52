"""From a trace to a decision: the predicted wall-time speedup of every rule, delta and m, and the best
setting under a drift bound, from an analysis and a cost model (``_cost.CostModel``: the parts of one
step in seconds and ``CostModel.step_time``, the one step-cost formula; where the parts come from,
``_cost``). The speedup of a step of m drafts is the tokens it emits in expectation over its time,
against the verifier alone's one token per ``alone_token()`` (``verify(1)`` and its loop's own cost):

    speedup(m) = (AL(m) + 1) * alone_token() / step_time(m).

Per step means over the steps decoding takes (``renewal_steps``: a step at position t moves to
t + 1 + A, so where drafts fail decoding takes a step per token): AL(m), the drafted tokens, the
draft forwards and the verifier's block sizes are their expectations over that chain, exact under
independent positions, for fixed blocks and drafting policies alike (so a policy that never stops
is fixed blocks of m, to the last bit). The analysis's ``al`` (the paper's AL, a mean over block
starts) is printed beside; its bootstrap interval maps to an interval of the speedup. A step
whose m drafts were all accepted runs one more draft forward (the drafter's cache must see its
last draft), charged with its probability (``policy_blocks``). Rules that judge whole blocks or
trees (block verification, traversal trees) have their law per block start over whole blocks:
their steps are the mean over block starts, with no extra forward. Whole requests add both
models' prompt processing and the cost of a growing context (``request_times``). Not captured:
Python overhead outside the timed parts.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

import numpy as np

from .._laws._policies import make_draft_policy
from .._math._validation import check_int, seeded_rng
from .._util._files import csv_text
from .._util._results import Result, interval
from ._cost import CostModel, load_cost

__all__ = ["Plan", "Speed", "batch_plan", "break_even", "predict_speedup"]


class Speed(NamedTuple):
    """A setting's predicted speedup (per request where the cost model timed prompt processing, else per step)
    with its 95% interval, and its accepted length."""

    speedup: float
    lo: float
    hi: float
    al: float


@dataclass(frozen=True)
class Plan(Result):
    """``predict_speedup``'s result: one row per rule x m x task (x drafting policy) with the
    analysis's fields plus ``tokens_per_step``, ``step_time``, ``speedup`` and its interval
    ``speedup_lo`` / ``speedup_hi`` (``interval``: what it includes), ``verify_extrapolated`` (the
    step's verifier block is larger than any the cost model timed) and, when the cost model
    measured prompt processing, ``request_speedup`` (with its interval), ``prefill_share``,
    ``prompt_tokens``, ``output_tokens``, ``request_seconds`` and ``baseline_request_seconds``.
    Rankings use the request speedup when every row has one (what a user waits for), else the
    per-step one (``key``). ``warnings``: the cost model's problems, if it was used anyway."""

    rows: list
    cost: CostModel
    max_kl: float | None = None
    warnings: list = field(default_factory=list)
    name: ClassVar[str] = "plan"

    def records(self) -> list:
        """One row per rule x m x task (x drafting policy)."""
        return [dict(r) for r in self.rows]

    def figure(self):
        """The predicted speedups against the emitted drift (``plot_plan``)."""
        from ._plotting import plot_plan

        return plot_plan(self)

    @property
    def key(self) -> str:
        """The speedup the rankings use: "request_speedup" if every row has one, else "speedup"."""
        return "request_speedup" if self.rows and all("request_speedup" in r for r in self.rows) else "speedup"

    def speeds(self, task="all") -> dict:
        """{(rule, m): ``Speed``} of ``task``'s rows without a drafting policy: the speedup the rankings use
        (``key``) with its 95% interval and the accepted length, what the deployment frontier joins to each rule's
        accuracy."""
        lo, hi = f"{self.key}_lo", f"{self.key}_hi"
        return {
            (r["rule"], int(r["m"])): Speed(
                float(r[self.key]), float(r.get(lo, math.nan)), float(r.get(hi, math.nan)), float(r["al"])
            )
            for r in self.rows
            if r["task"] == task and not r.get("draft_policy")
        }

    def best_m(self, task="all") -> list:
        """Per rule (and drafting policy), the row with the largest speedup over m."""
        key, best = self.key, {}
        for r in self.rows:
            setting = (r["rule"], r.get("draft_policy"))
            if r["task"] == task and (setting not in best or r[key] > best[setting][key]):
                best[setting] = r
        return sorted(best.values(), key=lambda r: -r[key])

    def fastest(self, max_kl=None, task="all"):
        """The fastest row whose mean emitted KL(pi || q) per position is at most ``max_kl``
        (default: the plan's bound; None: no bound). None if no row qualifies."""
        bound = self.max_kl if max_kl is None else max_kl
        rows = [r for r in self.rows if r["task"] == task and (bound is None or r["kl_emitted_target"] <= bound)]
        return max(rows, key=lambda r: r[self.key]) if rows else None

    def table(self, task="all", *, every_m=False, warnings=True) -> str:
        """The best m of every rule, fastest first, with its interval; with ``every_m``, then the
        speedup at every m analysed (``grid``); then the verdict: the fastest setting within the
        bound, or, when nothing beats the verifier alone, that it should run alone. A best setting
        at the edge of the grid (the largest m or delta tried) is flagged. ``warnings``: the cost
        model's problems and notes (print them once when tabling several tasks)."""
        request = self.key == "request_speedup"
        policies = any(r.get("draft_policy") for r in self.rows)
        head = f"{'rule':<34} " + (f"{'drafting':<16} " if policies else "") + f"{'best m':>6} {'AL':>6} "
        head += f"{'tokens/step':>11} {'per step':>8} {'95% CI':>15} "
        head += f"{'request':>8} {'95% CI':>15} {'prefill':>7} " if request else ""
        lines = [head + f"{'KL(pi||q)':>9}"]
        for r in self.best_m(task):
            line = f"{r['rule']:<34} " + (f"{r.get('draft_policy') or 'fixed':<16} " if policies else "")
            line += f"{r['m']:>6} {r['al']:>6.2f} {r['tokens_per_step']:>11.2f} {r['speedup']:>7.2f}x "
            line += f"{interval(r['speedup_lo'], r['speedup_hi'], '>5.2f'):>15} "
            if request:
                req = interval(r["request_speedup_lo"], r["request_speedup_hi"], ">5.2f")
                line += f"{r['request_speedup']:>7.2f}x {req:>15} {r['prefill_share']:>7.0%} "
            lines.append(line + f"{r['kl_emitted_target']:>9.4f}")
        if request:
            r0 = next(r for r in self.rows if r["task"] == task)
            lines.append(
                f"(requests of {r0['prompt_tokens']:.0f} prompt and {r0['output_tokens']:.0f} output tokens; "
                "prefill: the part of the speculative request spent processing the prompt)"
            )
        far = sorted({r.get("verified_tokens", r["m"] + 1) for r in self.best_m(task) if r.get("verify_extrapolated")})
        if far:
            lines.append(
                f"(verifier blocks of {', '.join(map(str, far))} tokens extrapolated beyond the "
                f"{self.cost.largest_block} timed: calibrate with --max-block at least the largest)"
            )
        if self.cost.source.get("kind") == "ratio":
            lines.append("(a what-if: a cost ratio with a flat block cost, not a measurement)")
        if every_m and len({r["m"] for r in self.rows if r["task"] == task}) > 1:
            lines += ["", self.grid(task)]
        if warnings:
            lines += [f"note: {note}" for note in self.cost.notes()]
            lines += [f"warning: {warning}" for warning in self.warnings]
        lines.append(self.verdict(task))
        return "\n".join(lines)

    def grid(self, task="all") -> str:
        """The speedup (``key``: per request when every row has one, else per step) of every rule at
        every m analysed, rules in ``best_m``'s order, the best m of each marked ``*``."""
        ms = sorted({r["m"] for r in self.rows if r["task"] == task})
        policies = any(r.get("draft_policy") for r in self.rows)
        cells = {(r["rule"], r.get("draft_policy"), r["m"]): r for r in self.rows if r["task"] == task}
        per = "per request" if self.key == "request_speedup" else "per step"
        label = f"speedup {per} at m ="
        width = 34 + (17 if policies else 0)
        lines = [f"{label:<{width}}" + "".join(f"{m:>7}" for m in ms)]
        for best in self.best_m(task):
            setting = (best["rule"], best.get("draft_policy"))
            name = best["rule"] + (f" [{best.get('draft_policy') or 'fixed'}]" if policies else "")
            line = f"{name:<{width}}"
            for m in ms:
                r = cells.get((*setting, m))
                line += f"{'':>7}" if r is None else f"{r[self.key]:>6.2f}{'*' if r is best else ' '}"
            lines.append(line.rstrip())
        lines.append("(* the best m of each rule)")
        return "\n".join(lines)

    def scope(self) -> str:
        """One sentence: whether the speedups are per step or per whole request (prompt processing
        included), as the cost model allows."""
        if self.key == "request_speedup":
            return (
                "Speedups per whole request, prompt processing (prefill) included: the cost model timed it "
                "(`request` columns; `per step` is the generation alone)."
            )
        return (
            "Speedups per verification step (generation alone): the cost model timed no prompt processing, so "
            "the prompt's time is in none of them and a whole request gains less."
        )

    def verdict(self, task="all") -> str:
        """One line: the fastest setting within the bound and its speedup (per request when the
        rows have one, else per step), flagged when it sits at the edge of the grid tried; or "run
        the verifier alone" when no setting is faster than it."""
        best = self.fastest(task=task)
        bound = "no bound" if self.max_kl is None else f"KL(pi || q) <= {self.max_kl:g}"
        per = "per request, prompt processing included" if self.key == "request_speedup" else "per step"
        if best is None:
            return f"no setting within {bound}: run the verifier alone"
        policy = f" ({best['draft_policy']})" if best.get("draft_policy") else ""
        setting = f"{best['rule']}{policy} at m = {best['m']}: {best[self.key]:.2f}x ({per})"
        if best[self.key] <= 1.0:
            return (
                f"no setting within {bound} is faster than the verifier alone (the best, {setting}): run the "
                "verifier alone"
            )
        edges = []
        rows = [r for r in self.rows if r["task"] == task]
        if best["m"] == max(r["m"] for r in rows) and len({r["m"] for r in rows}) > 1:
            edges.append("the largest m tried: try larger --m")
        same = [r["delta"] for r in rows if r.get("family") == best.get("family") and r.get("delta") is not None]
        if best.get("delta") is not None and len(set(same)) > 1 and best["delta"] == max(same):
            edges.append("the largest delta tried: try larger --delta")
        return f"fastest with {bound}: {setting}" + (f" (at {'; '.join(edges)})" if edges else "")

    def to_csv(self) -> str:
        return csv_text(self.rows)

    def to_json(self) -> str:
        return json.dumps(
            {
                "cost": json.loads(self.cost.to_json()),
                "max_kl": self.max_kl,
                "warnings": self.warnings,
                "rows": self.rows,
            },
            indent=1,
            default=str,
        )


def _request_lengths(analysis, task):
    """(mean prompt tokens, mean output tokens) of the analysis's sequences of ``task``; None for
    a length the trace does not record."""
    seqs = [s for s in getattr(analysis, "sequences", []) if task in ("all", s.task)]
    prompts = [s.prompt_tokens for s in seqs if s.prompt_tokens is not None]
    outputs = [s.positions for s in seqs]
    return (float(np.mean(prompts)) if prompts else None, float(np.mean(outputs)) if outputs else None)


def _timing_factors(cost, key, rng, n):
    """``n`` draws of (one timed repeat / the median) of a cost part: the machine's spread."""
    if key == "draft_token":
        values = cost.samples.get("draft_token")
    else:
        blocks = cost.samples.get("verify_block", {})
        values = blocks[min(blocks, key=lambda k: abs(k - key))] if blocks else None
    if not values:
        return np.ones(n)
    values = np.asarray(values, dtype=float)
    return rng.choice(values / np.median(values), size=n)


def predict_speedup(
    analysis,
    cost,
    *,
    max_kl=None,
    prompt_tokens=None,
    output_tokens=None,
    allow_untrusted=False,
    n_draws=2000,
    seed=0,
) -> Plan:
    """Predicted wall-time speedups of every row of an analysis under a cost model.

    ``analysis``: an ``AnalysisResult`` (``analyze_trace`` with the rules, deltas and m values
    to compare; its AL intervals become speedup intervals). ``cost``: a CostModel, a path to a
    cost file, or a number (the draft/verifier cost ratio, ``CostModel.from_ratio``: a what-if,
    labelled so). Returns a Plan; ``max_kl`` bounds the mean emitted KL(pi || q) per position
    for ``Plan.fastest``.

    Per step: ``speedup`` = (AL + 1) alone_token() / step_time(m), exact given the cost model (the
    tokens per step are the trace's exact expectations). Per request, when the cost model
    measured prompt processing (``CostModel.prefill``): ``request_speedup`` = the verifier
    alone's time for the request over speculative decoding's, both prefills included, for
    requests of ``prompt_tokens`` and ``output_tokens`` tokens (default: the means of the
    trace's sequences of the row's task), and ``prefill_share``, the part of the speculative
    request spent processing the prompt.

    The intervals (``speedup_lo`` / ``_hi``, ``request_speedup_lo`` / ``_hi``) combine the AL's
    bootstrap interval (as a normal of that width) with the calibration's timing spread (each
    draw takes one timed repeat of the draft token and of the verifier blocks, over their
    medians), ``n_draws`` draws seeded by ``seed``, the same for every row (common random
    numbers: a setting's interval does not depend on the other rows); ``interval`` says which
    went in. A cost model
    with ``problems()`` (a non-monotone or noisy calibration, a busy machine) is refused unless
    ``allow_untrusted``; the plan keeps the problems (``Plan.warnings``).

    A multi-draft rule's row (``draft_count`` k > 1) is a tree of depth m and width k: m draft
    passes and one verifier pass over k m + 1 tokens. Its AL assumes the accepted child's own
    children are drafted too, as in a full tree (which costs k + ... + k^m tokens); a tree of
    k m tokens that expands one node per level reaches that AL only when the accepted child is
    the expanded one, so for it the prediction is an upper bound. A row with ``drafted`` (every
    row but those of rules judging whole blocks or trees: the mean drafted tokens, draft forwards
    and block sizes per step over the steps decoding takes, fixed blocks and drafting policies
    alike) is charged for those, and its tokens per step are ``al_step`` + 1.

    Examples
    --------
    >>> from cactus_theory import CostModel
    >>> cost = CostModel.from_ratio(0.1)            # drafting a token costs 10% of a verifier pass
    >>> round(float(cost.speedup(m=4, accepted_length=3.0)), 3)   # 4 tokens per 1.4 passes
    2.857
    """
    if isinstance(cost, (str, os.PathLike)):
        cost = load_cost(cost)
    elif not isinstance(cost, CostModel):
        cost = CostModel.from_ratio(cost)
    if max_kl is not None and not (np.isfinite(max_kl) and max_kl >= 0):
        raise ValueError(f"max_kl must be a number >= 0 (nats per position); got {max_kl!r}")
    for name, value in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        if value is not None and not (
            isinstance(value, (int, float, np.integer, np.floating)) and value >= 0 and np.isfinite(value)
        ):
            raise ValueError(f"{name} must be a number of tokens >= 0; got {value!r}")
    check_int(n_draws, "n_draws", 2)
    problems = cost.problems()
    if problems and not allow_untrusted:
        at = f" at batch {cost.source['batch']}" if "batch" in cost.source else ""
        raise ValueError(
            f"the cost model{at} cannot be trusted as it is: " + "; ".join(problems) + ". Recalibrate on an idle "
            "machine (cactus-theory calibrate), or plan anyway with allow_untrusted=True (--trust-cost)"
        )
    rng = seeded_rng(seed)
    timed = bool(cost.samples)
    f_one = _timing_factors(cost, 1, rng, n_draws)
    f_draft = _timing_factors(cost, "draft_token", rng, n_draws)
    lengths = {}
    rows = []
    for r in analysis.rows:
        m, width = r["m"], r.get("draft_count", 1)
        drafted, passes = r.get("drafted"), r.get("draft_forwards")
        full = 0.0  # a stepped row's draft forwards hold the extra forward of a fully accepted block
        policy = make_draft_policy(r.get("draft_policy")) if r.get("draft_policy") else None
        mirrors = policy is not None and policy.mirrors_verifier_block
        mix = r.get("verify_mix")
        analysed = r
        if mix is not None and r.get("al_step") is not None:  # over the steps decoding takes (renewal_steps)
            r = {**r, "al": r["al_step"], "al_lo": r["al_step_lo"], "al_hi": r["al_step_hi"]}
        reads = float(drafted) if mirrors else 0.0
        row = {**r, "al": analysed["al"], "al_lo": analysed.get("al_lo"), "al_hi": analysed.get("al_hi")}
        row["tokens_per_step"] = r["al"] + 1
        row["step_time"] = float(
            cost.step_time(
                m, r["al"], width, drafted=drafted, forwards=passes, all_accepted=full, reads=reads, verify_mix=mix
            )
        )
        row["speedup"] = float(
            cost.speedup(
                m, r["al"], width, drafted=drafted, forwards=passes, all_accepted=full, reads=reads, verify_mix=mix
            )
        )
        # draws: AL from its interval, the timed parts from their repeats
        has_interval = bool(np.isfinite(r.get("al_lo", np.nan)) and np.isfinite(r.get("al_hi", np.nan)))
        se = (r["al_hi"] - r["al_lo"]) / 3.92 if has_interval else 0.0
        # every row draws from the same seeded stream (common random numbers): rows of one setting get the
        # same interval whatever else the plan holds, and rows compare paired
        row_rng = np.random.default_rng((int(seed), 1))
        al = np.clip(r["al"] + se * row_rng.standard_normal(n_draws), 0.0, m * 1.0)
        size = m if drafted is None else drafted
        f_block = _timing_factors(cost, width * size + 1, row_rng, n_draws)
        step = cost.step_time(
            m,
            al,
            width,
            drafted=drafted,
            forwards=passes,
            all_accepted=full,
            draft_factor=f_draft,
            verify_factor=f_block,
            reads=reads,
            verify_mix=mix,
        )
        draws = (al + 1) * cost.alone_token() * f_one / step
        if has_interval or timed:
            row["speedup_lo"], row["speedup_hi"] = (float(x) for x in np.percentile(draws, [2.5, 97.5]))
        else:
            row["speedup_lo"] = row["speedup_hi"] = float("nan")
        row["interval"] = " + ".join(x for x, on in (("AL", has_interval), ("timing", timed)) if on) or "none"
        row["verify_extrapolated"] = bool(width * m + 1 > cost.largest_block and len(cost.verify_block) > 1)
        if cost.has_prefill:
            if r["task"] not in lengths:
                lengths[r["task"]] = _request_lengths(analysis, r["task"])
            prompt = prompt_tokens if prompt_tokens is not None else lengths[r["task"]][0]
            output = output_tokens if output_tokens is not None else lengths[r["task"]][1]
            if prompt is not None and output:
                t = cost.request_times(
                    prompt,
                    output,
                    m,
                    r["al"],
                    width,
                    drafted=drafted,
                    forwards=passes,
                    all_accepted=full,
                    reads=reads,
                    verify_mix=mix,
                )
                row.update(
                    prompt_tokens=float(prompt),
                    output_tokens=float(output),
                    request_seconds=float(t["total"]),
                    baseline_request_seconds=float(t["baseline_total"]),
                    request_speedup=float(t["baseline_total"] / t["total"]),
                    prefill_share=float(t["prefill"] / t["total"]),
                )
                steps = output / (al + 1)
                context = prompt + output / 2
                step_c = cost.step_time(
                    m,
                    al,
                    width,
                    drafted=drafted,
                    forwards=passes,
                    context=context,
                    all_accepted=full,
                    draft_factor=f_draft,
                    verify_factor=f_block,
                    reads=reads,
                    verify_mix=mix,
                )
                spec = t["prefill"] + steps * step_c
                base = t["baseline_prefill"] + output * cost.alone_token(context) * f_one
                row["request_speedup_lo"], row["request_speedup_hi"] = (
                    float(x) for x in np.percentile(base / spec, [2.5, 97.5])
                )
        rows.append(row)
    return Plan(rows=rows, cost=cost, max_kl=max_kl, warnings=problems)


def batch_plan(analysis, cost, sizes, **options) -> dict:
    """Predictions at several batch sizes: {B: ``predict_speedup(analysis, cost.at_batch(B))``}
    (``options`` as there). Each plan's speedups are throughput ratios over the batch against the
    verifier alone at the same batch size (``CostModel.at_batch``): B requests advance in
    synchronous steps, each accepting the trace's AL per step on average. Approximate where
    requests of one batch end at different times (the batch is taken as full throughout)."""
    from ._batch import MAX_BATCH, checked_batch_size

    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise ValueError(f"sizes must be a list of batch sizes, e.g. [1, 2, 4]; got {sizes!r}")
    sizes = list(sizes)
    if not sizes:
        raise ValueError(f"sizes is empty: give batch sizes, 1 to {MAX_BATCH}, e.g. [1, 2, 4]")
    sizes = sorted({checked_batch_size(b, "each of sizes") for b in sizes})
    return {b: predict_speedup(analysis, cost.at_batch(b), **options) for b in sizes}


def break_even(plans: dict, task="all") -> list:
    """Per rule (and drafting policy) over the batch plans of ``batch_plan``: its best m and
    speedup (with its interval) at each batch size, and the break-even batch: the smallest size
    from which on even its best m no longer beats the verifier alone at any size given (None: it
    pays at the largest size given). Rows of dicts ``rule``, ``draft_policy``, ``per_batch`` ({B:
    best row}), ``break_even``, ``pays_at`` (the sizes at which it pays) and ``verdict``: "> B"
    (it pays at every size given), "< B" (at none), the break-even size, or, when it pays at some
    sizes and not at others below the last, "B1,B2 only" (the sizes at which it pays)."""
    if not isinstance(plans, dict) or not plans:
        raise ValueError("plans must be batch_plan's answer: {batch size: Plan}, at least one")
    out = {}
    for size, plan in plans.items():
        for row in plan.best_m(task):
            setting = (row["rule"], row.get("draft_policy"))
            out.setdefault(setting, {})[size] = row
    key = next(iter(plans.values())).key
    rows = []
    for (rule, policy), per in out.items():
        given = sorted(per)
        pays = [b for b in given if per[b][key] >= 1]
        if not pays:
            even, verdict = given[0], f"< {given[0]}"
        elif pays[-1] == given[-1]:
            even = None
            verdict = f"> {given[-1]}" if len(pays) == len(given) else ",".join(map(str, pays)) + " only"
        else:
            even = min(b for b in given if b > pays[-1])  # it loses at this size and every larger one given
            verdict = str(even) if pays == given[: len(pays)] else ",".join(map(str, pays)) + " only"
        rows.append(
            {
                "rule": rule,
                "draft_policy": policy,
                "per_batch": per,
                "key": key,
                "break_even": even,
                "pays_at": pays,
                "verdict": verdict,
            }
        )
    return rows
