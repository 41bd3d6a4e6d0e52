"""A cost model of one speculative-decoding step (``CostModel``): its parts in seconds, where they
come from (a calibration file, a shipped measured GPU profile, a roofline of any model and device,
a what-if ratio), the same parts with several requests in flight (``at_batch``), and whether its
timings can be trusted. Predictions from it live in ``_plan``; finding a user's calibration in the
cache in ``_calibrations``."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from .._math._validation import is_integer
from .._util._files import atomic_write
from ._cost_fields import (
    _checked_prefill,
    _checked_samples,
    _forward_seconds,
    _isotonic,
    _monotone_curve,
    _positive,
    _read_cost_json,
    _short,
    _size_map,
)
from ._cost_trust import timing_monotonicity, timing_notes, timing_problems, timing_spread

__all__ = ["DEFAULT_COST_PROFILE", "CostModel", "cost_profiles", "fit_to_profiles", "load_cost", "roofline_cost"]

COST_FORMAT = "cactus_theory.cost"
_COST_MAX_BYTES = 1 << 20


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
        Per step, outside the forward passes: cropping, and what the loop costs beyond its forwards
        (from whole steps timed as the decoder runs them: ``source["loop"]``).
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
    alone_overhead : float
        Per token of the verifier alone beyond ``verify_block[1]``: its loop's cost (``source["loop"]``).
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
    alone_overhead: float = 0.0

    def __post_init__(self):
        _positive(self.draft_token, "draft_token")
        _positive(self.alone_overhead, "alone_overhead")
        if self.draft_read_token is not None:
            _positive(self.draft_read_token, "draft_read_token")
        _positive(self.step_overhead, "step_overhead")
        _positive(self.judge_token, "judge_token")
        object.__setattr__(self, "prefill", _checked_prefill(self.prefill))
        if self.context is not None and not (is_integer(self.context) and self.context >= 0):
            raise ValueError(
                f"context must be the context length (tokens) the step costs were timed at; got {_short(self.context)}"
            )
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
        blocks = {
            k: _positive(v, f"verify_block[{k}]")
            for k, v in _size_map(self.verify_block, "verify_block", "block sizes").items()
        }
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
            return replace(
                self,
                draft_token=entry["draft_token"],
                verify_block=entry["verify_block"],
                samples={},
                batch={},
                source=source,
            )
        if size not in self.batch:
            raise ValueError(
                f"the cost model knows batch sizes {list(self.batch_sizes)}, not {size}: calibrate with "
                f"--batch {','.join(map(str, sorted({*self.batch_sizes, size})))} (the llama.cpp engine)"
            )
        entry = self.batch[size]
        samples = {**entry["samples"], **({"prefill": self.samples["prefill"]} if "prefill" in self.samples else {})}
        prefill = {role: {n: size * t for n, t in points.items()} for role, points in self.prefill.items()}
        if "prefill" in samples:
            samples["prefill"] = {
                role: {n: [size * t for t in ts] for n, ts in points.items()}
                for role, points in samples["prefill"].items()
            }
        return replace(
            self,
            draft_token=entry["draft_token"],
            verify_block=entry["verify_block"],
            samples=samples,
            prefill=prefill,
            batch={},
            source={**self.source, "batch": size},
            draft_read_token=entry.get("draft_read_token"),
        )

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

    def step_time(
        self,
        m,
        accepted_length,
        width=1,
        *,
        drafted=None,
        forwards=None,
        context=None,
        all_accepted=0.0,
        draft_factor=1.0,
        verify_factor=1.0,
        reads=0.0,
        verify_mix=None,
    ):
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

    def speedup(
        self,
        m,
        accepted_length,
        width=1,
        *,
        drafted=None,
        forwards=None,
        context=None,
        all_accepted=0.0,
        reads=0.0,
        verify_mix=None,
    ):
        """Tokens per second against the verifier alone: (AL + 1) alone_token() / step_time(m).
        Finite and positive."""
        step = self.step_time(
            m,
            accepted_length,
            width,
            drafted=drafted,
            forwards=forwards,
            context=context,
            all_accepted=all_accepted,
            reads=reads,
            verify_mix=verify_mix,
        )
        return (np.asarray(accepted_length) + 1) * self.alone_token(context) / step

    def alone_token(self, context=None):
        """Seconds a token of the verifier alone (the baseline): verify(1, context) + alone_overhead."""
        return self.verify(1, context) + self.alone_overhead

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

    def request_times(
        self,
        prompt_tokens,
        output_tokens,
        m,
        accepted_length,
        width=1,
        *,
        drafted=None,
        forwards=None,
        all_accepted=0.0,
        reads=0.0,
        verify_mix=None,
    ):
        """Seconds of one whole request, speculative and the verifier alone:
        {"prefill", "decode", "total", "baseline_prefill", "baseline_decode", "baseline_total"}.

        Speculative: both models process the prompt, then output / (AL + 1) steps; the verifier
        alone: its prefill and one ``alone_token()`` per token. Steps run at the mean context during
        decoding (prompt + output / 2) when the model has a context slope."""
        prompt, output = float(prompt_tokens), float(output_tokens)
        context = prompt + output / 2
        steps = output / (np.asarray(accepted_length, dtype=float) + 1)
        prefill = self.prefill_time(prompt, "verifier") + self.prefill_time(prompt, "draft")
        decode = steps * self.step_time(
            m,
            accepted_length,
            width,
            drafted=drafted,
            forwards=forwards,
            context=context,
            all_accepted=all_accepted,
            reads=reads,
            verify_mix=verify_mix,
        )
        base_prefill = self.prefill_time(prompt, "verifier")
        base_decode = output * self.alone_token(context)
        return {
            "prefill": prefill,
            "decode": decode,
            "total": prefill + decode,
            "baseline_prefill": base_prefill,
            "baseline_decode": base_decode,
            "baseline_total": base_prefill + base_decode,
        }

    # -- trust (``_cost_trust``: what each says) --------------------------------------------------
    def spread(self) -> dict:
        """Relative spread (median absolute deviation / median) of each timed part's repeats."""
        return timing_spread(self)

    def monotonicity(self) -> tuple:
        """(blocks timed below a smaller one within the repeats' noise, those beyond it)."""
        return timing_monotonicity(self)

    def notes(self) -> list:
        """What a reader of a plan should know about the timings that is not a problem."""
        return timing_notes(self)

    def problems(self) -> list:
        """Why this cost model's predictions may not hold, in words (empty: none found)."""
        return timing_problems(self)

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
    data = _read_cost_json(path, _COST_MAX_BYTES)
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
        cost = CostModel(**data)
        _forward_seconds(cost.draft_token, "draft_token")  # a file's timings must be ones a machine measures
        for k, seconds in cost.verify_block.items():
            _forward_seconds(seconds, f"verify_block[{k}]")
        return cost
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
            raise ValueError(
                f"roofline profile {name!r}: no model preset {model!r}; the presets: {presets} (other "
                "models: roofline_cost with their config.json)"
            )
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


def roofline_cost(
    verifier,
    draft,
    device="gb200",
    *,
    dtype="bfloat16",
    batches=(1,),
    context=1024,
    ks=(1, 2, 3, 4, 5, 6, 8, 11, 16, 21, 32),
    roofline=None,
) -> CostModel:
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

    if not (is_integer(context) and 0 <= context <= MAX_CONTEXT):
        raise ValueError(f"context must be a number of tokens, 0 to {MAX_CONTEXT:,}; got {context!r}")
    if not batches or any(not is_integer(b) or not 1 <= b <= MAX_BATCH for b in batches):
        raise ValueError(f"batches must be batch sizes, 1 to {MAX_BATCH}; got {batches!r}")
    shapes = [m if isinstance(m, ModelShape) else ModelShape.from_config(m, dtype) for m in (verifier, draft)]
    fitted = fit_to_profiles(spec)[0] if roofline is None else roofline
    model = Roofline(spec, fitted.efficiency, fitted.overhead, fitted.verify_overhead)

    def parts(batch):
        return {
            "draft_token": model.time(shapes[1], batch, 1, context),
            "verify_block": {k: model.time(shapes[0], batch, k, context) for k in ks},
        }

    base = parts(1)
    source = {
        "kind": "roofline",
        "modelled": True,
        "device": spec.name,
        "device_source": spec.source,
        "verifier": shapes[0].name,
        "draft": shapes[1].name,
        "dtype": dtype,
        "context": int(context),
        "efficiency": model.efficiency,
        "overhead": model.overhead,
        "verify_overhead": model.verify_overhead,
        "note": "modelled, not measured: max(bytes / bandwidth, FLOPs / peak) / efficiency + overheads, the "
        "efficiency and overheads fitted to the shipped GB200 vLLM profiles",
    }
    # what at_batch needs to model a batch size not listed here (plain data: the cost file stays JSON)
    source["shapes"] = {"verifier": asdict(shapes[0]), "draft": asdict(shapes[1])}
    source["device_spec"] = asdict(spec)
    source["ks"] = [int(k) for k in ks]
    batch = {int(b): {**parts(int(b)), "samples": {}} for b in sorted(set(batches)) if b > 1}
    return CostModel(
        draft_token=base["draft_token"],
        verify_block=base["verify_block"],
        source=source,
        context=int(context),
        batch=batch,
    )


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
    entry = {
        "draft_token": model.time(draft, size, 1, context),
        "verify_block": {int(k): model.time(verifier, size, int(k), context) for k in ks},
    }
    return replace(
        cost,
        draft_token=entry["draft_token"],
        verify_block=entry["verify_block"],
        samples={},
        batch={},
        source={**src, "batch": size},
    )


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
