"""From a trace to a decision: a cost model of one speculative-decoding step, the predicted
wall-time speedup of every rule, delta and m, and the best setting under a drift bound.

Cost of one step with m drafted tokens (batch size 1, as in ``speculative_generate``)::

    time(m) = m * draft_token + verify(m + 1) + step_overhead + (AL(m) + 1) * judge_token

``draft_token``: one draft forward of one token with its KV cache, the processing of its row
(temperature, top-k, top-p) and the sampling; ``verify(k)``: one verifier forward of a block of
k tokens and the processing of its k rows (a function of k: flat on a GPU at batch size 1,
growing on a CPU); ``step_overhead``: cropping the caches; ``judge_token``: the rule judging one
drafted token (its acceptance, and the correction when it rejects). A step emits AL(m) + 1
tokens in expectation (the accepted drafts, then a correction or a bonus token), and the
verifier alone emits one token per ``verify(1)``, so

    speedup(m) = (AL(m) + 1) * verify(1) / time(m).

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

Cost sources: ``calibrate_cost`` (time the forward passes of a real model pair on this machine),
``CostModel.from_ratio`` (a draft/verifier cost ratio with a flat block cost: a GPU at batch 1),
or a JSON cost file written by hand from published profiles (``load_cost``; fields in
``CostModel``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import ClassVar

import numpy as np

from .._laws._policies import make_draft_policy
from .._math._validation import seeded_rng
from .._util._files import atomic_write, csv_text
from ._results import Result, interval

__all__ = ["CostModel", "Plan", "cost_profiles", "load_cost", "predict_speedup"]

COST_FORMAT = "cactus_theory.cost"
_COST_MAX_BYTES = 1 << 20


def _positive(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number of seconds; got {_short(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{name} must be finite and >= 0; got a number of {len(str(value))} digits") from None
    if not (np.isfinite(number) and number >= 0):
        raise ValueError(f"{name} must be finite and >= 0; got {_short(value)}")
    return number


def _short(value, limit=60) -> str:
    """repr(value) cut to ``limit`` characters, for error messages about a file's contents."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _isotonic(values):
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators)."""
    blocks = []  # [mean, count]
    for v in values:
        blocks.append([float(v), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, c2), (m1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return np.concatenate([np.full(c, m) for m, c in blocks])


def _monotone_curve(sizes, values, x):
    """The non-decreasing fit of ``values`` at ascending ``sizes`` (``_isotonic``), evaluated at
    ``x``: linear between sizes, extrapolated beyond the largest with the slope of the last two
    (never negative; constant for one size)."""
    sizes = np.asarray(sizes, dtype=float)
    times = _isotonic(values)
    x = np.asarray(x, dtype=float)
    if sizes.size == 1:
        return np.full(x.shape, times[0])
    slope = max((times[-1] - times[-2]) / (sizes[-1] - sizes[-2]), 0.0)
    return np.where(x > sizes[-1], times[-1] + slope * (x - sizes[-1]), np.interp(x, sizes, times))


def _size_map(value, name, what="sizes"):
    """{int size: value} from a dict with integer or digit-string keys (``what``: "block sizes",
    "prompt lengths"), checked and sorted."""
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{name} must map {what} (integers >= 1) to seconds, e.g. {{1: 0.2, 9: 0.3}}")
    out, spelled = {}, {}
    for k, v in value.items():
        if isinstance(k, bool) or not (
            isinstance(k, (int, np.integer)) or (isinstance(k, str) and k.isascii() and k.isdigit())
        ):
            raise ValueError(f"{name} keys must be {what} (integers >= 1); got {_short(k)}")
        size = int(k)
        if size < 1 or size > 1_000_000:
            raise ValueError(f"{name} keys must be {what} from 1 to 1,000,000; got {_short(k)}")
        if size in out:
            raise ValueError(f"{name} gives {what[:-1]} {size} twice ({spelled[size]!r} and {k!r})")
        out[size], spelled[size] = v, k
    return dict(sorted(out.items()))


def _per_model(value, name, check, shape):
    """{"verifier": {L: x}, "draft": {L: x}} (either may be left out), each x checked by
    ``check(x, its name)`` and the prompt lengths L by ``_size_map``."""
    if not isinstance(value, dict) or set(value) - {"verifier", "draft"}:
        raise ValueError(f"{name} must be {shape}")
    return {
        model: {L: check(x, f"{name}[{model!r}][{L}]")
                for L, x in _size_map(per, f"{name}[{model!r}]", "prompt lengths").items()}
        for model, per in value.items()
    }  # fmt: skip


def _checked_prefill(prefill):
    return _per_model(prefill, "prefill", _positive,
                      '{"verifier": {prompt tokens: s}, "draft": {...}} (either may be left out)')  # fmt: skip


def _checked_samples(samples):
    """The timed repeats: lists of seconds, in the shape of the fields they stand behind."""

    def times(value, name):
        if not isinstance(value, list) or not value or len(value) > 10_000:
            raise ValueError(f"{name} must be a list of 1 to 10,000 timings (seconds)")
        out = [_positive(v, name) for v in value]
        if min(out) <= 0:
            raise ValueError(f"{name} holds a timing of 0 seconds: a timed repeat takes some time (> 0)")
        return out

    if not isinstance(samples, dict) or set(samples) - {"draft_token", "verify_block", "prefill"}:
        raise ValueError('samples must be {"draft_token": [...], "verify_block": {k: [...]}, "prefill": {...}}')
    out = {}
    if "draft_token" in samples:
        out["draft_token"] = times(samples["draft_token"], "samples['draft_token']")
    if "verify_block" in samples:
        blocks = _size_map(samples["verify_block"], "samples['verify_block']", "block sizes")
        out["verify_block"] = {k: times(v, f"samples['verify_block'][{k}]") for k, v in blocks.items()}
    if "prefill" in samples:
        out["prefill"] = _per_model(samples["prefill"], "samples['prefill']", times,
                                    '{"verifier": {L: [...]}, "draft": {L: [...]}}')  # fmt: skip
    return out


def _relative_spread(values):
    """Median absolute deviation over the median: a robust relative spread of repeated timings."""
    values = np.asarray(values, dtype=float)
    centre = np.median(values)
    return float(np.median(np.abs(values - centre)) / centre) if centre > 0 else 0.0


#: A calibration is flagged when a repeated timing spreads more than this (relative MAD), ...
NOISY_SPREAD = 0.15
#: ... when a bigger verifier block is timed this much below a smaller one (beyond the noise),
NON_MONOTONE_DROP = 0.05
#: ... or when other processes kept more than this share of the machine's cores busy while it ran.
BUSY_LOAD = 0.25


@dataclass(frozen=True)
class CostModel:
    """Seconds (or any one unit) of the parts of a speculative-decoding step.

    Attributes
    ----------
    draft_token : float
        One drafted token (draft forward of one token with its cache, row processing, sampling).
    verify_block : dict {k: seconds}
        The verifier's forward of a block of k tokens and the processing of its k rows, at the
        measured or given block sizes (k = 1 is required: the verifier alone). A bigger block never
        takes less time, so the model uses the non-decreasing fit closest to these figures
        (``verify_fit``: isotonic least squares; noisy measurements and flat GPU profiles often
        dip), interpolated linearly between sizes and extrapolated beyond the largest with the
        slope of the last two fitted sizes (flat if one). So a step never takes less than the
        verifier's one token, and a predicted speedup never exceeds AL + 1.
    step_overhead : float
        Per step, outside the forward passes (cropping the caches).
    judge_token : float
        Per drafted token the rule judges (acceptance, and the correction when it rejects).
    source : dict
        Provenance: how the figures were obtained (calibration: models, dtype, device, versions;
        a published profile: its repository, file, hardware, engine).
    prefill : dict {"verifier": {L: s}, "draft": {L: s}}
        Processing a prompt of L tokens (one forward over the prompt), per model, at measured
        lengths; interpolated through (0, 0) and extrapolated linearly (``prefill_time``). Empty:
        prompts cost nothing (per-step predictions only).
    context : int or None
        The context length (tokens) ``draft_token`` and ``verify_block`` were timed at.
    context_slope : dict {"verify": s, "draft": s}
        Seconds one forward gains per token of context (attention over a longer cache), so the
        cost at context c is the timed one plus slope (c - context).
    samples : dict
        The timed repeats behind the medians: {"draft_token": [...], "verify_block": {k: [...]},
        "prefill": {"verifier": {L: [...]}, ...}}: the spread the intervals draw from and the
        trust checks read (``problems``).
    load : dict {"other", "cores"}
        The share of the machine's cores other processes kept busy while the calibration ran
        (``other_load``: from /proc on Linux), and the cores.
    batch : dict {B: {"draft_token": s, "verify_block": {k: s}, "samples": {...}}}
        The same step parts with B sequences in flight (B >= 2; ``calibrate --batch``): one draft
        forward of B sequences with their B rows processed, and the verifier scoring k tokens of
        each of B sequences in one evaluation. ``at_batch(B)`` is the cost model at that batch.
        An entry may carry its own ``draft_read_token``.
    draft_read_token : float or None
        Seconds per token the drafter reads in one forward of several tokens: llama-server's
        drafter processes the verifier's block of L + 1 tokens every step
        (``DraftPolicy.mirrors_verifier_block``), a batch whose L extra tokens cost what prompt
        processing costs a token. None: ``draft_token`` (an upper bound).
    """

    draft_token: float
    verify_block: dict
    step_overhead: float = 0.0
    judge_token: float = 0.0
    source: dict = field(default_factory=dict)
    prefill: dict = field(default_factory=dict)
    context: int | None = None
    context_slope: dict = field(default_factory=dict)
    samples: dict = field(default_factory=dict)
    load: dict = field(default_factory=dict)
    batch: dict = field(default_factory=dict)
    draft_read_token: float | None = None

    def __post_init__(self):
        _positive(self.draft_token, "draft_token")
        if self.draft_read_token is not None:
            _positive(self.draft_read_token, "draft_read_token")
        _positive(self.step_overhead, "step_overhead")
        _positive(self.judge_token, "judge_token")
        object.__setattr__(self, "prefill", _checked_prefill(self.prefill))
        if self.context is not None and (isinstance(self.context, bool) or not isinstance(self.context, int)
                                         or self.context < 0):  # fmt: skip
            raise ValueError(f"context must be the context length (tokens) the step costs were timed at; got "
                             f"{_short(self.context)}")  # fmt: skip
        if not isinstance(self.context_slope, dict) or set(self.context_slope) - {"verify", "draft"}:
            raise ValueError('context_slope must be {"verify": s, "draft": s} (seconds per context token per forward)')
        for key, value in self.context_slope.items():
            _positive(value, f"context_slope[{key!r}]")
        object.__setattr__(self, "samples", _checked_samples(self.samples))
        if not isinstance(self.load, dict) or set(self.load) - {"other", "cores"}:
            raise ValueError('load must be {"other": share of the cores busy with other work, "cores": n}')
        for key, value in self.load.items():
            _positive(value, f"load[{key!r}]")
        if not isinstance(self.source, dict):
            raise ValueError(f"source must be an object (provenance: kind, models, ...); got {_short(self.source)}")
        blocks = {k: _positive(v, f"verify_block[{k}]")
                  for k, v in _size_map(self.verify_block, "verify_block", "block sizes").items()}  # fmt: skip
        if 1 not in blocks:
            raise ValueError("verify_block needs k = 1 (one token: the verifier alone decoding)")
        if blocks[1] <= 0:
            raise ValueError("verify_block[1] must be > 0: it is the baseline's time per token")
        object.__setattr__(self, "verify_block", dict(sorted(blocks.items())))
        object.__setattr__(self, "batch", self._checked_batch(self.batch))

    def _checked_batch(self, batch):
        if not isinstance(batch, dict):
            raise ValueError('batch must be {B: {"draft_token": s, "verify_block": {k: s}, "samples": {...}}}')
        out = {}
        for key, entry in batch.items():
            size = _size_map({key: 0}, "batch", "batch sizes")
            (b,) = size
            if b < 2:
                raise ValueError(f"batch sizes are >= 2 (batch 1 is the model's own fields); got {key!r}")
            if not isinstance(entry, dict) or set(entry) - {
                "draft_token",
                "verify_block",
                "samples",
                "draft_read_token",
            }:
                raise ValueError(f'batch[{b}] must be {{"draft_token": s, "verify_block": {{k: s}}, "samples": ...}}')
            try:
                one = CostModel(
                    draft_token=entry.get("draft_token"),
                    verify_block=entry.get("verify_block"),
                    samples=entry.get("samples", {}),
                    draft_read_token=entry.get("draft_read_token"),
                )
            except (TypeError, ValueError) as exc:
                raise ValueError(f"batch[{b}]: {exc}") from None
            out[b] = {"draft_token": one.draft_token, "verify_block": one.verify_block, "samples": one.samples}
            if one.draft_read_token is not None:
                out[b]["draft_read_token"] = one.draft_read_token
        return dict(sorted(out.items()))

    @property
    def batch_sizes(self) -> tuple:
        """The batch sizes the model knows: 1 and those of ``batch``."""
        return (1, *self.batch)

    def at_batch(self, size):
        """The cost model with ``size`` sequences in flight: each step part is the measured one at
        that batch (``batch``), and a prompt costs ``size`` times one prompt's (the batch's
        prompts are processed in turn: the per-request prefill of a full batch). Its speedups
        are throughput ratios over the batch: (AL + 1) verify_B(1) / step_B, the verifier alone
        at the same batch size. Exact for the batch sizes measured; a size between two measured
        ones is refused (name it in ``calibrate --batch``). A shipped GPU profile (measured at batch 1)
        reaches any batch through the roofline fitted to the profiles (``_batch_scale``:
        each part times t(B) / t(1), modelled, said in its ``source``), and a roofline cost model
        (``roofline_cost``) any batch by its own model. ``size``: a whole number 1 to ``MAX_BATCH``
        (1,024), else a ValueError."""
        from ._batch import checked_batch_size

        size = checked_batch_size(size)
        if size == 1:
            return self
        if size not in self.batch and self.source.get("kind") == "roofline" and "shapes" in self.source:
            return _roofline_at(self, size)  # a roofline models any batch size: the same model at this one
        if size not in self.batch and self.source.get("kind") == "profile":
            # a measured GPU profile (batch 1): larger batches from the roofline fitted to it (modelled)
            from ._roofline import BATCH_CONTEXT

            entry = _batch_scale(self, size, BATCH_CONTEXT)
            how = f"roofline ratio t(B) / t(1) at {BATCH_CONTEXT} tokens of context, fitted to the shipped profiles"
            source = {**self.source, "batch": size, "batch_model": how + " (modelled)"}
            return replace(self, draft_token=entry["draft_token"], verify_block=entry["verify_block"], samples={},
                           batch={}, source=source)  # fmt: skip
        if size not in self.batch:
            raise ValueError(
                f"the cost model knows batch sizes {list(self.batch_sizes)}, not {size}: calibrate with "
                f"--batch {','.join(map(str, sorted({*self.batch_sizes, size})))} (the llama.cpp engine)"
            )
        entry = self.batch[size]
        samples = {**entry["samples"], **({"prefill": self.samples["prefill"]} if "prefill" in self.samples else {})}
        prefill = {role: {n: size * t for n, t in points.items()} for role, points in self.prefill.items()}
        if "prefill" in samples:
            samples["prefill"] = {role: {n: [size * t for t in ts] for n, ts in points.items()}
                                  for role, points in samples["prefill"].items()}  # fmt: skip
        return replace(self, draft_token=entry["draft_token"], verify_block=entry["verify_block"], samples=samples,
                       prefill=prefill, batch={}, source={**self.source, "batch": size},
                       draft_read_token=entry.get("draft_read_token"))  # fmt: skip

    @property
    def verify_fit(self) -> dict:
        """{k: seconds}: the non-decreasing fit of ``verify_block`` that the model uses."""
        return dict(zip(self.verify_block, _isotonic(list(self.verify_block.values())).tolist(), strict=True))

    @property
    def non_monotone(self) -> list:
        """Block sizes whose given time is below a smaller block's (the fit pools them)."""
        given = np.array(list(self.verify_block.values()))
        return [k for k, t, top in zip(self.verify_block, given, np.maximum.accumulate(given), strict=True) if t < top]

    @classmethod
    def from_profile(cls, name):
        """A published, measured cost profile shipped with the package (``cost_profiles()`` lists
        them with their hardware and engine): e.g. ``"qwen3-32b-0.6b-gb200-vllm"``, vLLM's forward
        passes of Qwen3-32B verifying and Qwen3-0.6B drafting on one GB200 at batch size 1, from
        graphcore-research/relaxed-spec-dec-repro's ``profiles/paper``. ``"roofline:VERIFIER:DRAFT:DEVICE"``
        (model presets of ``_roofline.MODEL_PRESETS``, a device of ``_roofline.DEVICES``, optionally
        ``:CONTEXT`` tokens, default 1024) is a modelled profile instead (``roofline_cost``) at batch
        sizes 1 to 1024."""
        profiles = cost_profiles()
        if isinstance(name, str) and name.startswith("roofline:"):
            return _roofline_profile(name)
        if name not in profiles:
            raise ValueError(
                f"unknown cost profile {name!r}; the profiles: {', '.join(sorted(profiles))}, or "
                "roofline:VERIFIER:DRAFT:DEVICE (modelled; e.g. roofline:qwen3-32b:qwen3-0.6b:h100)"
            )
        return load_cost(profiles[name])

    @classmethod
    def from_ratio(cls, ratio):
        """A what-if, not a measurement: draft token cost ``ratio`` (relative to one verifier
        token), block cost flat in its size (an idealised memory-bound verifier), no overhead.
        Units: one verifier forward. Measured GPU profiles (``from_profile``) are not flat: vLLM
        verifying 4 tokens of Qwen3-32B on a GB200 takes 2.5x one token."""
        ratio = _positive(ratio, "cost ratio")
        return cls(draft_token=ratio, verify_block={1: 1.0}, source={"kind": "ratio", "ratio": ratio})

    def _context_extra(self, role, context):
        if context is None or self.context is None:
            return 0.0
        return self.context_slope.get(role, 0.0) * (np.asarray(context, dtype=float) - self.context)

    def verify(self, k, context=None):
        """Seconds of a verifier block of k tokens (array-like k), from ``verify_fit``:
        non-decreasing in k, and at least ``verify(1) > 0``; at ``context`` tokens of context
        when the model has a context slope (never below half the timed cost)."""
        out = _monotone_curve(list(self.verify_block), list(self.verify_block.values()), k)
        return np.maximum(out + self._context_extra("verify", context), 0.5 * out)[()]

    def draft_time(self, context=None):
        """Seconds of one drafted token at ``context`` tokens of context (``draft_token`` if no slope)."""
        return float(np.maximum(self.draft_token + self._context_extra("draft", context), 0.5 * self.draft_token))

    def draft_read_time(self, context=None):
        """Seconds per token the drafter reads in a forward of several (``draft_read_token``, else
        ``draft_time``)."""
        return self.draft_time(context) if self.draft_read_token is None else float(self.draft_read_token)

    def step_time(self, m, accepted_length, width=1, *, drafted=None, forwards=None, context=None, all_accepted=0.0,
                  draft_factor=1.0, verify_factor=1.0, reads=0.0, verify_mix=None):  # fmt: skip
        """Expected seconds of one step drafting m levels that accepts ``accepted_length`` on average.

        ``width`` k > 1: a tree of depth m with k candidates per level (a multi-draft rule): the
        drafter runs once per level (m draft passes, each giving the k children of one node) and
        the verifier scores k m + 1 tokens at once (tree attention). ``drafted`` and ``forwards``:
        the mean drafted tokens and draft forwards per step when a drafting policy stops blocks
        early (default m each); the verifier then scores ``drafted`` + 1 tokens (a mean: the block
        cost is close to linear over the sizes a step spans). ``context``: the context length.
        ``all_accepted``: P(every draft of the block accepted); such a step runs one more draft
        forward (the drafter's cache must see its last draft before the next block).
        ``draft_factor`` and ``verify_factor``: draws of one timed repeat over the median of the
        draft and the verifier parts (arrays: the planner's intervals), 1 for the medians.
        ``reads``: tokens the drafter reads in one of its forwards beyond its output row
        (llama-server's drafts, when its drafter processes the verifier's block; ``draft_read_time``
        each). ``verify_mix``: the share of steps whose block holds L drafts, L = 0..m (a drafting
        policy's steps), for the verifier's expected block cost sum_L mix_L verify(k L + 1) in
        place of verify(k drafted + 1). The one formula of a step's cost: every
        prediction of the package goes through it."""
        m = np.asarray(m, dtype=float)
        drafted = m if drafted is None else np.asarray(drafted, dtype=float)
        forwards = drafted if forwards is None else np.asarray(forwards, dtype=float)
        if verify_mix is None:
            verifying = self.verify(width * drafted + 1, context)
        else:
            mix = np.asarray(verify_mix, dtype=float)
            verifying = float(mix @ self.verify(width * np.arange(mix.shape[0]) + 1, context))
        return (
            (forwards + np.asarray(all_accepted, dtype=float)) * self.draft_time(context) * draft_factor
            + np.asarray(reads, dtype=float) * self.draft_read_time(context) * draft_factor
            + verifying * verify_factor
            + self.step_overhead
            + (np.asarray(accepted_length) + 1) * self.judge_token
        )

    def speedup(self, m, accepted_length, width=1, *, drafted=None, forwards=None, context=None, all_accepted=0.0,
                reads=0.0, verify_mix=None):  # fmt: skip
        """Tokens per second against the verifier alone: (AL + 1) verify(1) / step_time(m).
        Finite, positive, and at most AL + 1 (a step costs at least one verifier token)."""
        step = self.step_time(m, accepted_length, width, drafted=drafted, forwards=forwards, context=context,
                              all_accepted=all_accepted, reads=reads, verify_mix=verify_mix)  # fmt: skip
        return (np.asarray(accepted_length) + 1) * self.verify(1, context) / step

    # -- whole requests ---------------------------------------------------------------------------
    @property
    def has_prefill(self) -> bool:
        """Whether prompt processing was measured (else requests are predicted without it)."""
        return bool(self.prefill.get("verifier"))

    def prefill_time(self, prompt_tokens, model="verifier"):
        """Seconds to process a prompt of ``prompt_tokens`` tokens with one model ("verifier" or
        "draft"): the measured lengths' non-decreasing fit, linear through (0, 0) below the
        smallest and extrapolated with the last two points' slope above the largest. 0 when not
        measured."""
        if model not in ("verifier", "draft"):
            raise ValueError(f"model must be 'verifier' or 'draft'; got {model!r}")
        points = self.prefill.get(model)
        if not points:
            return np.zeros(np.shape(prompt_tokens))[()]
        return _monotone_curve([0, *points], [0.0, *points.values()], prompt_tokens)[()]

    def request_times(self, prompt_tokens, output_tokens, m, accepted_length, width=1, *, drafted=None,
                      forwards=None, all_accepted=0.0, reads=0.0, verify_mix=None):  # fmt: skip
        """Seconds of one whole request, speculative and the verifier alone:
        {"prefill", "decode", "total", "baseline_prefill", "baseline_decode", "baseline_total"}.

        Speculative: both models process the prompt, then output / (AL + 1) steps; the verifier
        alone: its prefill and one ``verify(1)`` per token. Steps run at the mean context during
        decoding (prompt + output / 2) when the model has a context slope."""
        prompt, output = float(prompt_tokens), float(output_tokens)
        context = prompt + output / 2
        steps = output / (np.asarray(accepted_length, dtype=float) + 1)
        prefill = self.prefill_time(prompt, "verifier") + self.prefill_time(prompt, "draft")
        decode = steps * self.step_time(m, accepted_length, width, drafted=drafted, forwards=forwards, context=context,
                                        all_accepted=all_accepted, reads=reads, verify_mix=verify_mix)  # fmt: skip
        base_prefill = self.prefill_time(prompt, "verifier")
        base_decode = output * self.verify(1, context)
        return {
            "prefill": prefill, "decode": decode, "total": prefill + decode,
            "baseline_prefill": base_prefill, "baseline_decode": base_decode,
            "baseline_total": base_prefill + base_decode,
        }  # fmt: skip

    # -- trust --------------------------------------------------------------------------------------
    def spread(self) -> dict:
        """Relative spread (median absolute deviation / median) of each timed part's repeats."""
        out = {}
        if "draft_token" in self.samples:
            out["draft_token"] = _relative_spread(self.samples["draft_token"])
        for k, values in self.samples.get("verify_block", {}).items():
            out[f"verify_block[{k}]"] = _relative_spread(values)
        for model, per in self.samples.get("prefill", {}).items():
            for length, values in per.items():
                out[f"prefill[{model}][{length}]"] = _relative_spread(values)
        return out

    def _beyond_noise(self, small, big) -> bool:
        """Whether the bigger block ``big`` timed below the smaller ``small`` beyond the timings' own
        noise: with repeats, every repeat of ``big`` below every repeat of ``small`` (the two sets
        do not overlap); without, a drop of more than ``NON_MONOTONE_DROP``."""
        repeats = self.samples.get("verify_block", {})
        if small in repeats and big in repeats:
            return max(repeats[big]) < min(repeats[small])
        return self.verify_block[big] < self.verify_block[small] * (1 - NON_MONOTONE_DROP)

    def monotonicity(self) -> tuple:
        """(block sizes timed below a smaller block within the repeats' noise, those beyond it): the
        isotonic fit (``verify_fit``) pools both; only the second make a problem (``problems``)."""
        within, beyond = [], []
        best_k, best_t = None, -np.inf
        for k, t in self.verify_block.items():
            if best_k is not None and t < best_t:
                (beyond if self._beyond_noise(best_k, k) else within).append((k, best_k))
            if t > best_t:
                best_k, best_t = k, t
        return within, beyond

    def notes(self) -> list:
        """What a reader of a plan should know about the timings that is not a problem: blocks timed
        slightly out of order, within their repeats' noise (the isotonic fit pools them)."""
        within, _ = self.monotonicity()
        if not within:
            return []
        pairs = ", ".join(f"{k} below {k0}" for k, k0 in within[:4]) + (" and more" if len(within) > 4 else "")
        return [f"verifier blocks timed out of order within the repeats' noise ({pairs} tokens): the model uses the "
                "non-decreasing (isotonic) fit of the timings"]  # fmt: skip

    def problems(self) -> list:
        """Why this cost model's predictions may not hold, in words (empty: none found): a bigger
        verifier block timed below a smaller one beyond the repeats' noise (``monotonicity``),
        repeats spreading more than ``NOISY_SPREAD``, a machine busier than ``BUSY_LOAD`` per core
        while it was timed."""
        found = []
        spread = self.spread()
        for k, k0 in self.monotonicity()[1]:
            t, t0 = self.verify_block[k], self.verify_block[k0]
            found.append(
                f"non-monotone: a verifier block of {k} tokens timed {t:.4g} s, {1 - t / t0:.0%} below the block of "
                f"{k0} ({t0:.4g} s), beyond the repeats' noise; the model uses the isotonic fit, but the timing is "
                "suspect"
            )
        noisy = [f"{name} ({value:.0%})" for name, value in spread.items() if value > NOISY_SPREAD]
        if noisy:
            found.append(f"noisy: repeats spread more than {NOISY_SPREAD:.0%} (median absolute deviation / median) "
                         f"for {', '.join(noisy[:6])}{' and more' if len(noisy) > 6 else ''}")  # fmt: skip
        if self.load.get("other", 0.0) > BUSY_LOAD:
            found.append(
                f"busy machine: other processes kept {self.load['other']:.0%} of the cores busy while it was timed "
                f"(above {BUSY_LOAD:.0%}); rerun the calibration on an idle machine"
            )
        return found

    @property
    def largest_block(self) -> int:
        """The largest verifier block the cost model measured; larger ones are extrapolated."""
        return max(self.verify_block)

    def to_json(self) -> str:
        data = {"format": COST_FORMAT, "version": 1, **asdict(self)}
        data["verify_block"] = {str(k): v for k, v in self.verify_block.items()}
        return json.dumps(data, indent=1)

    def save(self, path) -> str:
        """Write the cost file (atomically)."""
        return atomic_write(str(path), self.to_json().encode())


def load_cost(path) -> CostModel:
    """A CostModel from a JSON cost file (``calibrate`` writes one; or write it by hand:
    ``{"draft_token": 0.012, "verify_block": {"1": 0.03, "11": 0.034}, "step_overhead": 0.001,
    "judge_token": 0.0}``, in seconds). Unknown or missing fields are refused by name."""
    path = str(path)
    if not os.path.isfile(path):
        if os.path.isdir(path):
            what = "is a directory"
        elif os.path.exists(path):
            what = "is not a regular file (a FIFO, socket or device)"
        else:
            what = "does not exist"
        raise ValueError(f"cost file {path!r} {what} (write one with 'cactus-theory calibrate')")
    size = os.path.getsize(path)
    if size > _COST_MAX_BYTES:
        raise ValueError(
            f"cost file {path!r} has {size} bytes; a cost file is a few kB (the output of 'cactus-theory calibrate')"
        )

    def no_repeats(pairs):
        keys = [k for k, _ in pairs]
        repeated = next((k for k in keys if keys.count(k) > 1), None)
        if repeated is not None:
            raise ValueError(f"cost file {path!r}: the key {_short(repeated)} appears twice in one object")
        return dict(pairs)

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh, object_pairs_hook=no_repeats)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"cost file {path!r} is not valid JSON ({_short(str(exc), 200)})") from None
    except RecursionError:
        raise ValueError(f"cost file {path!r} is nested too deeply to be a cost file") from None
    if not isinstance(data, dict):
        raise ValueError(f"cost file {path!r} must hold a JSON object")
    if data.get("format", COST_FORMAT) != COST_FORMAT:
        raise ValueError(f"cost file {path!r} has format {_short(data.get('format'))}, expected {COST_FORMAT!r}")
    data = {k: v for k, v in data.items() if k not in ("format", "version")}
    known = {f.name for f in fields(CostModel)}
    unknown = sorted(set(data) - known)
    if unknown:
        shown = ", ".join(_short(k, 40) for k in unknown[:5])
        shown += f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise ValueError(f"cost file {path!r}: unknown field(s) {shown}; the fields are {sorted(known)}")
    missing = [k for k in ("draft_token", "verify_block") if k not in data]
    if missing:
        raise ValueError(f"cost file {path!r} lacks {missing}")
    try:
        return CostModel(**data)
    except ValueError as exc:
        raise ValueError(f"cost file {path!r}: {exc}") from None


DEFAULT_COST_PROFILE = "qwen3-32b-0.6b-gb200-vllm"
"""The measured profile ``plan`` uses when given no cost (and the report's GPU section)."""


def cost_profiles() -> dict:
    """{name: path} of the measured cost profiles shipped with the package (``CostModel.from_profile``)."""
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "profiles")
    if not os.path.isdir(folder):
        return {}
    return {f[: -len(".json")]: os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".json")}


def cost_directory() -> str:
    """Where ``calibrate`` writes cost files by default (and the report looks for them)."""
    from .._util._paths import cache_root

    return os.path.join(cache_root(), "costs")


def default_cost_path(verifier_name, draft_name, dtype, device) -> str:
    """The default cost file of a model pair, dtype and device (in ``cost_directory()``)."""
    name = f"{verifier_name}__{draft_name}__{dtype}__{device}"
    return os.path.join(cost_directory(), "".join(c if c.isalnum() or c in "._-" else "_" for c in name) + ".json")


def find_calibration_path(trace):
    """The path of the newest cost file in the user cache (``calibrate``'s default place) whose
    verifier and draft are ``trace``'s (a trace set or trace; by file hashes), or None."""
    import glob

    from .._data._trace import model_hashes as files

    want = (files(trace.metadata.get("verifier")), files(trace.metadata.get("draft")))
    if None in want:
        return None
    found = []
    for path in glob.glob(os.path.join(cost_directory(), "*.json")):
        try:
            cost = load_cost(path)
        except (ValueError, OSError, json.JSONDecodeError):
            continue  # not a cost file: ignored
        src = cost.source
        if (files(src.get("verifier")), files(src.get("draft"))) == want:
            found.append((str(src.get("created", "")), path))
    return max(found)[1] if found else None


def find_calibration(trace):
    """The newest calibration of ``trace``'s model pair in the user cache
    (``find_calibration_path``), loaded, or None."""
    path = find_calibration_path(trace)
    return None if path is None else load_cost(path)


def _pair(source) -> tuple:
    """(verifier name, draft name) of a trace's metadata or a cost model's source (None: unknown)."""
    names = []
    for role in ("verifier", "draft"):
        entry = source.get(role)
        names.append(entry.get("name") if isinstance(entry, dict) else entry)
    return tuple(names)


#: The batch sizes a roofline profile is modelled at (``CostModel.from_profile("roofline:...")``).
ROOFLINE_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def _roofline_profile(name):
    from ._roofline import DEVICES, MODEL_PRESETS

    parts = name.split(":")[1:]
    if len(parts) not in (3, 4):
        raise ValueError(f"a roofline profile is roofline:VERIFIER:DRAFT:DEVICE[:CONTEXT]; got {name!r}")
    verifier, draft, device = (p.strip().lower() for p in parts[:3])
    for model in (verifier, draft):
        if model not in MODEL_PRESETS:
            presets = ", ".join(MODEL_PRESETS)
            raise ValueError(f"roofline profile {name!r}: no model preset {model!r}; the presets: {presets} (other "
                             "models: roofline_cost with their config.json)")  # fmt: skip
    if device not in DEVICES:
        raise ValueError(f"roofline profile {name!r}: unknown device {device!r}; the devices: {', '.join(DEVICES)}")
    context = 1024
    if len(parts) == 4:
        try:
            context = int(parts[3])
        except ValueError:
            raise ValueError(f"roofline profile {name!r}: the context {parts[3]!r} is not a number of tokens") from None
    cost = roofline_cost(verifier, draft, device, batches=ROOFLINE_BATCHES, context=context)
    return replace(cost, source={**cost.source, "name": name})


def _profile_points(profiles):
    """(model shape, tokens, measured seconds, label) of every timed part of measured profiles."""
    from ._roofline import ModelShape, preset_of

    points = []
    for name, path in sorted(profiles.items()):
        cost = load_cost(path)
        verifier = ModelShape.from_config(preset_of(cost.source.get("verifier")))
        draft = ModelShape.from_config(preset_of(cost.source.get("draft")))
        points.append((draft, 1, cost.draft_token, f"{name}: draft token ({draft.name})"))
        for k, seconds in cost.verify_block.items():
            points.append((verifier, k, seconds, f"{name}: verify {k} ({verifier.name})"))
    return tuple(points)


def fit_to_profiles(device="gb200", profiles=None):
    """The roofline fitted to the shipped measured profiles (their device: GB200) by least squares on
    the logarithms of the times over its efficiency (0.05-1), overhead and verify overhead: (the
    Roofline on ``device`` with the fitted efficiency and overheads, rows of each measured point
    with its modelled value and relative error). The fitted efficiency and overheads carry over to
    other devices as an assumption (said where they are used). Modelled, not measured."""
    from ._roofline import DEVICES, Roofline, fit

    points = _profile_points(cost_profiles() if profiles is None else profiles)
    efficiency, overhead, verify_overhead, rows = fit(points)
    on = DEVICES[device] if isinstance(device, str) else device
    return Roofline(on, efficiency, overhead, verify_overhead), [dict(r) for r in rows]


def roofline_cost(verifier, draft, device="gb200", *, dtype="bfloat16", batches=(1,), context=1024,
                  ks=(1, 2, 3, 4, 5, 6, 8, 11, 16, 21, 32), roofline=None) -> CostModel:  # fmt: skip
    """A CostModel from the roofline (modelled, not measured): the verifier's block of k tokens and
    one drafted token for each batch size in ``batches`` at ``context`` tokens of cache, on
    ``device`` (a key of ``DEVICES`` or a DeviceSpec), with the efficiency and overheads fitted to
    the shipped profiles (``fit_to_profiles``) unless ``roofline`` gives them. ``verifier`` /
    ``draft``: preset names (``MODEL_PRESETS``), config.json paths or ModelShapes."""
    from ._roofline import DEVICES, ModelShape, Roofline

    spec = DEVICES.get(device.lower()) if isinstance(device, str) else device
    if spec is None:
        raise ValueError(f"device must be one of {', '.join(DEVICES)} (or a DeviceSpec); got {device!r}")
    from ._batch import MAX_BATCH
    from ._roofline import MAX_CONTEXT

    if isinstance(context, bool) or not (isinstance(context, (int, np.integer)) and 0 <= context <= MAX_CONTEXT):
        raise ValueError(f"context must be a number of tokens, 0 to {MAX_CONTEXT:,}; got {context!r}")
    if not batches or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 1 <= b <= MAX_BATCH
                          for b in batches):  # fmt: skip
        raise ValueError(f"batches must be batch sizes, 1 to {MAX_BATCH}; got {batches!r}")
    shapes = [m if isinstance(m, ModelShape) else ModelShape.from_config(m, dtype) for m in (verifier, draft)]
    fitted = fit_to_profiles(spec)[0] if roofline is None else roofline
    model = Roofline(spec, fitted.efficiency, fitted.overhead, fitted.verify_overhead)

    def parts(batch):
        return {"draft_token": model.time(shapes[1], batch, 1, context),
                "verify_block": {k: model.time(shapes[0], batch, k, context) for k in ks}}  # fmt: skip

    base = parts(1)
    source = {
        "kind": "roofline", "modelled": True, "device": spec.name, "device_source": spec.source,
        "verifier": shapes[0].name, "draft": shapes[1].name, "dtype": dtype, "context": int(context),
        "efficiency": model.efficiency, "overhead": model.overhead, "verify_overhead": model.verify_overhead,
        "note": "modelled, not measured: max(bytes / bandwidth, FLOPs / peak) / efficiency + overheads, the "
                "efficiency and overheads fitted to the shipped GB200 vLLM profiles",
    }  # fmt: skip
    # what at_batch needs to model a batch size not listed here (plain data: the cost file stays JSON)
    source["shapes"] = {"verifier": asdict(shapes[0]), "draft": asdict(shapes[1])}
    source["device_spec"] = asdict(spec)
    source["ks"] = [int(k) for k in ks]
    batch = {int(b): {**parts(int(b)), "samples": {}} for b in sorted(set(batches)) if b > 1}
    return CostModel(draft_token=base["draft_token"], verify_block=base["verify_block"], source=source,
                     context=int(context), batch=batch)  # fmt: skip


def _roofline_at(cost, size):
    """A roofline cost model (``roofline_cost``) at a batch size it does not list: its own model there."""
    from ._roofline import DeviceSpec, ModelShape, Roofline

    src = cost.source
    try:
        verifier, draft = (ModelShape(**src["shapes"][role]) for role in ("verifier", "draft"))
        model = Roofline(DeviceSpec(**src["device_spec"]), src["efficiency"], src["overhead"], src["verify_overhead"])
        ks = src.get("ks") or sorted(cost.verify_block)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"the roofline cost model's source lacks {exc}: rebuild it with roofline_cost") from None
    context = int(src.get("context", 1024))
    entry = {"draft_token": model.time(draft, size, 1, context),
             "verify_block": {int(k): model.time(verifier, size, int(k), context) for k in ks}}  # fmt: skip
    return replace(cost, draft_token=entry["draft_token"], verify_block=entry["verify_block"], samples={}, batch={},
                   source={**src, "batch": size})  # fmt: skip


def _batch_scale(cost, size, context):
    """A measured profile's parts at batch ``size`` > 1 it did not time: each scaled by the roofline's
    ratio t(size) / t(1) for its model (fitted to the shipped profiles; modelled)."""
    from ._roofline import DEVICES, ModelShape, preset_of

    verifier = ModelShape.from_config(preset_of(cost.source.get("verifier")))
    draft = ModelShape.from_config(preset_of(cost.source.get("draft")))
    hardware = str(cost.source.get("hardware", "")).lower().replace("nvidia", "").strip()
    if hardware not in DEVICES:
        raise ValueError(f"no device specification for {cost.source.get('hardware')!r}")
    model = fit_to_profiles(hardware)[0]

    def ratio(shape, tokens):
        return model.time(shape, size, tokens, context) / model.time(shape, 1, tokens, context)

    return {
        "draft_token": cost.draft_token * ratio(draft, 1),
        "verify_block": {k: t * ratio(verifier, k) for k, t in cost.verify_block.items()},
        "samples": {},
    }


def cost_description(cost, trace=None) -> str:
    """Where a cost model's timings come from, in words, and, for a published profile, that it
    times another model pair than ``trace``'s (a trace set or its metadata) when it does."""
    src = cost.source
    kind = src.get("kind", "cost file")
    if kind == "ratio":
        return "a what-if ratio (not a measurement)"
    if kind == "profile":
        text = f"measured profile {src.get('name')} ({src.get('hardware')}, {src.get('engine')})"
        if src.get("batch"):
            text += f"; at batch {src['batch']} modelled from it by a {src.get('batch_model')}"
        meta = getattr(trace, "metadata", trace) if trace is not None else None
        if meta is not None and _pair(meta) != _pair(src) and None not in _pair(meta):
            verifier, draft = _pair(meta)
            text += (f", timings of {src.get('verifier')} verifying and {src.get('draft')} drafting, another pair than "
                     f"the trace's ({verifier} and {draft}): the trace's acceptance, that pair's costs")  # fmt: skip
        return text
    if kind == "calibration":
        where = f"{src.get('dtype', '?')} on {src.get('device', '?')}, {src.get('created', '')}"
        return f"calibrated on this machine ({where})"
    if kind == "roofline":
        return (f"a roofline (modelled, not measured) of {src.get('verifier')} verifying and {src.get('draft')} "
                f"drafting on {src.get('device')} at {src.get('context')} tokens of context, its efficiency and "
                "overheads fitted to the shipped GB200 profiles")  # fmt: skip
    return "a cost file"


@dataclass
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
            lines.append(f"(requests of {r0['prompt_tokens']:.0f} prompt and {r0['output_tokens']:.0f} output tokens; "
                         "prefill: the part of the speculative request spent processing the prompt)")  # fmt: skip
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
            return ("Speedups per whole request, prompt processing (prefill) included: the cost model timed it "
                    "(`request` columns; `per step` is the generation alone).")  # fmt: skip
        return ("Speedups per verification step (generation alone): the cost model timed no prompt processing, so "
                "the prompt's time is in none of them and a whole request gains less.")  # fmt: skip

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
            return (f"no setting within {bound} is faster than the verifier alone (the best, {setting}): run the "
                    "verifier alone")  # fmt: skip
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
            {"cost": json.loads(self.cost.to_json()), "max_kl": self.max_kl, "warnings": self.warnings,
             "rows": self.rows}, indent=1, default=str,
        )  # fmt: skip


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

    Per step: ``speedup`` = (AL + 1) verify(1) / step_time(m), exact given the cost model (the
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
        if value is not None and not (isinstance(value, (int, float, np.integer, np.floating)) and value >= 0
                                      and np.isfinite(value)):  # fmt: skip
            raise ValueError(f"{name} must be a number of tokens >= 0; got {value!r}")
    if not (isinstance(n_draws, (int, np.integer)) and n_draws >= 2):
        raise ValueError(f"n_draws must be an integer >= 2; got {n_draws!r}")
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
        row["step_time"] = float(cost.step_time(m, r["al"], width, drafted=drafted, forwards=passes, all_accepted=full,
                                                reads=reads, verify_mix=mix))  # fmt: skip
        row["speedup"] = float(cost.speedup(m, r["al"], width, drafted=drafted, forwards=passes, all_accepted=full,
                                            reads=reads, verify_mix=mix))  # fmt: skip
        # draws: AL from its interval, the timed parts from their repeats
        has_interval = bool(np.isfinite(r.get("al_lo", np.nan)) and np.isfinite(r.get("al_hi", np.nan)))
        se = (r["al_hi"] - r["al_lo"]) / 3.92 if has_interval else 0.0
        # every row draws from the same seeded stream (common random numbers): rows of one setting get the
        # same interval whatever else the plan holds, and rows compare paired
        row_rng = np.random.default_rng((int(seed), 1))
        al = np.clip(r["al"] + se * row_rng.standard_normal(n_draws), 0.0, m * 1.0)
        size = m if drafted is None else drafted
        f_block = _timing_factors(cost, width * size + 1, row_rng, n_draws)
        step = cost.step_time(m, al, width, drafted=drafted, forwards=passes, all_accepted=full, draft_factor=f_draft,
                              verify_factor=f_block, reads=reads, verify_mix=mix)  # fmt: skip
        draws = (al + 1) * cost.verify(1) * f_one / step
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
                t = cost.request_times(prompt, output, m, r["al"], width, drafted=drafted, forwards=passes,
                                       all_accepted=full, reads=reads, verify_mix=mix)  # fmt: skip
                row.update(prompt_tokens=float(prompt), output_tokens=float(output),
                           request_seconds=float(t["total"]), baseline_request_seconds=float(t["baseline_total"]),
                           request_speedup=float(t["baseline_total"] / t["total"]),
                           prefill_share=float(t["prefill"] / t["total"]))  # fmt: skip
                steps = output / (al + 1)
                context = prompt + output / 2
                step_c = cost.step_time(m, al, width, drafted=drafted, forwards=passes, context=context,
                                        all_accepted=full, draft_factor=f_draft, verify_factor=f_block,
                                        reads=reads, verify_mix=mix)  # fmt: skip
                spec = t["prefill"] + steps * step_c
                base = t["baseline_prefill"] + output * cost.verify(1, context) * f_one
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
        rows.append({"rule": rule, "draft_policy": policy, "per_batch": per, "key": key, "break_even": even,
                     "pays_at": pays, "verdict": verdict})  # fmt: skip
    return rows
