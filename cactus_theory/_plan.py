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

AL(m) is the analysis's: exact for the trace's positions, averaged over block starts, with its
bootstrap interval, which maps to an interval of the speedup (the speedup increases with AL).
Not captured: the extra draft forward when all m drafts are accepted (the draft's cache must see
the last draft), end-of-sequence truncation, the prompt's prefill, and cache effects of a
growing context (calibrate at a context length like the real one's).

Cost sources: ``calibrate_cost`` (time the forward passes of a real model pair on this machine),
``CostModel.from_ratio`` (a draft/verifier cost ratio with a flat block cost: a GPU at batch 1),
or a JSON cost file written by hand from published profiles (``load_cost``; fields in
``CostModel``).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ._io import atomic_write, csv_text, utc_timestamp

__all__ = ["CostModel", "Plan", "calibrate_cost", "load_cost", "predict_speedup"]

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
        Provenance: how the figures were obtained (calibration: models, dtype, device, versions).
    """

    draft_token: float
    verify_block: dict
    step_overhead: float = 0.0
    judge_token: float = 0.0
    source: dict = field(default_factory=dict)

    def __post_init__(self):
        _positive(self.draft_token, "draft_token")
        _positive(self.step_overhead, "step_overhead")
        _positive(self.judge_token, "judge_token")
        if not isinstance(self.source, dict):
            raise ValueError(f"source must be an object (provenance: kind, models, ...); got {_short(self.source)}")
        if not isinstance(self.verify_block, dict) or not self.verify_block:
            raise ValueError("verify_block must map block sizes k >= 1 to seconds, e.g. {1: 0.2, 9: 0.3}")
        blocks, spelled = {}, {}
        for k, v in self.verify_block.items():
            if isinstance(k, bool) or not (isinstance(k, (int, np.integer)) or (isinstance(k, str) and k.isdigit())):
                raise ValueError(f"verify_block keys must be block sizes (integers >= 1); got {_short(k)}")
            size = int(k)
            if size < 1 or size > 1_000_000:
                raise ValueError(f"verify_block keys must be block sizes from 1 to 1,000,000; got {_short(k)}")
            if size in blocks:
                raise ValueError(f"verify_block gives block size {size} twice ({spelled[size]!r} and {k!r})")
            blocks[size], spelled[size] = _positive(v, f"verify_block[{size}]"), k
        if 1 not in blocks:
            raise ValueError("verify_block needs k = 1 (one token: the verifier alone decoding)")
        if blocks[1] <= 0:
            raise ValueError("verify_block[1] must be > 0: it is the baseline's time per token")
        object.__setattr__(self, "verify_block", dict(sorted(blocks.items())))

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
    def from_ratio(cls, ratio):
        """Draft token cost ``ratio`` (relative to one verifier token), block cost flat in its
        size (a memory-bound verifier: a GPU at batch size 1), no overhead. Units: one verifier
        forward."""
        ratio = _positive(ratio, "cost ratio")
        return cls(draft_token=ratio, verify_block={1: 1.0}, source={"kind": "ratio", "ratio": ratio})

    def verify(self, k):
        """Seconds of a verifier block of k tokens (array-like k), from ``verify_fit``:
        non-decreasing in k, and at least ``verify(1) > 0``."""
        sizes = np.array(list(self.verify_block), dtype=float)
        times = _isotonic(list(self.verify_block.values()))
        k = np.asarray(k, dtype=float)
        if sizes.size == 1:
            return np.full(k.shape, times[0])[()]
        out = np.interp(k, sizes, times)
        slope = max((times[-1] - times[-2]) / (sizes[-1] - sizes[-2]), 0.0)
        return np.where(k > sizes[-1], times[-1] + slope * (k - sizes[-1]), out)[()]

    def step_time(self, m, accepted_length, width=1):
        """Expected seconds of one step drafting m levels that accepts ``accepted_length`` on average.

        ``width`` k > 1: a tree of depth m with k candidates per level (a multi-draft rule): the
        drafter runs once per level (m draft passes, each giving the k children of one node) and
        the verifier scores k m + 1 tokens at once (tree attention)."""
        m = np.asarray(m, dtype=float)
        return (
            m * self.draft_token
            + self.verify(width * m + 1)
            + self.step_overhead
            + (accepted_length + 1) * self.judge_token
        )

    def speedup(self, m, accepted_length, width=1):
        """Tokens per second against the verifier alone: (AL + 1) verify(1) / step_time(m).
        Finite, positive, and at most AL + 1 (a step costs at least one verifier token)."""
        return (np.asarray(accepted_length) + 1) * self.verify(1) / self.step_time(m, accepted_length, width)

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
        what = "is a directory" if os.path.isdir(path) else "does not exist"
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
    known = {"draft_token", "verify_block", "step_overhead", "judge_token", "source"}
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


def cost_directory() -> str:
    """Where ``calibrate`` writes cost files by default (and the report looks for them)."""
    from ._hf import cache_root

    return os.path.join(cache_root(), "costs")


def default_cost_path(verifier_name, draft_name, dtype, device) -> str:
    """The default cost file of a model pair, dtype and device (in ``cost_directory()``)."""
    name = f"{verifier_name}__{draft_name}__{dtype}__{device}"
    return os.path.join(cost_directory(), "".join(c if c.isalnum() or c in "._-" else "_" for c in name) + ".json")


def _median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def calibrate_cost(verifier, draft, *, max_block=21, context=256, repeats=5, settings=None, progress=None):
    """Time the parts of a step for a model pair on this machine: a CostModel.

    ``verifier`` and ``draft`` are (model, tokenizer, identity) triples from ``load_model``.
    Both models first read a context of ``context`` token ids (the tokenizer's encoding of a
    fixed English text, repeated) into their KV caches; then, each a median of ``repeats``:
    one drafted token (a forward of one token, its processed row with ``settings``, the
    sampling); a verifier block of k = 1..``max_block`` tokens (a forward and its k processed
    rows), the cache cropped back after each; the cropping itself; and SpS judging one drafted
    token on rows of the vocabulary's size (as ``speculative_generate`` does). Deterministic
    inputs; the timings are whatever this machine gives (run it idle).
    """
    import torch

    from ._decode import _rule_step
    from ._hf import CachedModel, sample_token, software_versions
    from ._progress import progress_bar
    from ._rules import SpS
    from ._sampling import SamplingSettings, processed_probs

    if not (isinstance(max_block, (int, np.integer)) and max_block >= 1):
        raise ValueError(f"max_block must be an integer >= 1; got {max_block!r}")
    if not (isinstance(repeats, (int, np.integer)) and repeats >= 1):
        raise ValueError(f"repeats must be an integer >= 1; got {repeats!r}")
    if not (isinstance(context, (int, np.integer)) and context >= 1):
        raise ValueError(f"context must be an integer >= 1; got {context!r}")
    settings = settings or SamplingSettings()
    v_model, tokenizer, v_info = verifier
    d_model, _, d_info = draft
    text = (
        "Speculative decoding drafts several tokens with a small model and verifies them with a large one "
        "in a single forward pass; the acceptance rule decides how many of the drafted tokens to keep. "
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if tokenizer is not None else list(range(100))
    ids = (ids * (context // max(len(ids), 1) + 1))[:context]
    ver, drf = CachedModel(v_model), CachedModel(d_model)
    ver.feed(ids)
    drf.feed(ids)
    gen = torch.Generator().manual_seed(0)
    token = ids[-1]

    def draft_step():
        raw = drf.feed([token])[-1]
        p = processed_probs(raw[None], settings)[0]
        sample_token(p, gen)
        p.double().cpu().numpy()
        drf.crop(len(ids))

    def verify_step(k):
        rows = ver.feed(ids[-k:] if k <= len(ids) else [token] * k)
        processed_probs(rows, settings).double().cpu().numpy()
        ver.crop(len(ids))

    bar = progress_bar(total=max_block + 3, desc="calibrate", unit="part", enabled=progress)
    with bar:
        draft_step()  # warm-up
        draft_token = _median_time(draft_step, repeats)
        bar.update(1)
        verify_block = {}
        verify_step(1)
        for k in range(1, max_block + 1):
            verify_block[k] = _median_time(lambda k=k: verify_step(k), repeats)
            bar.update(1)

        def crop_step():
            ver.feed([token])
            drf.feed([token])
            start = time.perf_counter()
            ver.crop(len(ids))
            drf.crop(len(ids))
            return time.perf_counter() - start

        step_overhead = float(np.median([crop_step() for _ in range(repeats)]))
        bar.update(1)
        q_row = processed_probs(ver.feed([token])[-1][None], settings)[0].double().cpu().numpy()
        p_row = processed_probs(drf.feed([token])[-1][None], settings)[0].double().cpu().numpy()
        ver.crop(len(ids))
        drf.crop(len(ids))
        coin = np.random.default_rng(0)
        drafted = int(np.argmax(p_row))
        judge_token = _median_time(lambda: _rule_step(SpS(), p_row, q_row, drafted, None, coin, gen), repeats)
        bar.update(2)
    source = {
        "kind": "calibration",
        "verifier": v_info,
        "draft": d_info,
        "dtype": str(next(v_model.parameters()).dtype).replace("torch.", ""),
        "device": str(next(v_model.parameters()).device),
        "context": int(context),
        "repeats": int(repeats),
        "sampling": settings.as_dict(),
        "threads": torch.get_num_threads(),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}",
        "versions": software_versions(),
        "created": utc_timestamp(),
    }
    return CostModel(
        draft_token=draft_token,
        verify_block=verify_block,
        step_overhead=step_overhead,
        judge_token=judge_token,
        source=source,
    )


@dataclass
class Plan:
    """``predict_speedup``'s result: one row per rule x m x task (the analysis rows plus
    ``tokens_per_step``, ``step_time``, ``speedup`` and its interval ``speedup_lo`` /
    ``speedup_hi``, and ``verify_extrapolated``: the step's verifier block is larger than any
    the cost model timed), the best m per rule, and the fastest setting within ``max_kl``."""

    rows: list
    cost: CostModel
    max_kl: float | None = None

    def best_m(self, task="all") -> list:
        """Per rule, the row with the largest speedup over m."""
        best = {}
        for r in self.rows:
            if r["task"] == task and (r["rule"] not in best or r["speedup"] > best[r["rule"]]["speedup"]):
                best[r["rule"]] = r
        return sorted(best.values(), key=lambda r: -r["speedup"])

    def fastest(self, max_kl=None, task="all"):
        """The fastest row whose mean emitted KL(pi || q) per position is at most ``max_kl``
        (default: the plan's bound; None: no bound). None if no row qualifies."""
        bound = self.max_kl if max_kl is None else max_kl
        rows = [r for r in self.rows if r["task"] == task and (bound is None or r["kl_emitted_target"] <= bound)]
        return max(rows, key=lambda r: r["speedup"]) if rows else None

    def table(self, task="all") -> str:
        """The best m of every rule, fastest first, and the fastest setting within the bound."""
        lines = [
            f"{'rule':<34} {'best m':>6} {'AL':>6} {'tokens/step':>11} {'speedup':>8} {'95% CI':>15} {'KL(pi||q)':>9}"
        ]
        for r in self.best_m(task):
            lines.append(
                f"{r['rule']:<34} {r['m']:>6} {r['al']:>6.2f} {r['tokens_per_step']:>11.2f} {r['speedup']:>7.2f}x "
                f"[{r['speedup_lo']:>5.2f}, {r['speedup_hi']:>5.2f}] {r['kl_emitted_target']:>9.4f}"
            )
        far = sorted({r.get("verified_tokens", r["m"] + 1) for r in self.best_m(task) if r.get("verify_extrapolated")})
        if far:
            lines.append(
                f"(verifier blocks of {', '.join(map(str, far))} tokens extrapolated beyond the "
                f"{self.cost.largest_block} "
                "timed: calibrate with --max-block at least the largest)"
            )
        best = self.fastest(task=task)
        bound = "no bound" if self.max_kl is None else f"KL(pi || q) <= {self.max_kl:g}"
        if best is None:
            lines.append(f"no setting within {bound}")
        else:
            lines.append(f"fastest with {bound}: {best['rule']} at m = {best['m']}: {best['speedup']:.2f}x")
        return "\n".join(lines)

    def to_csv(self) -> str:
        return csv_text(self.rows)

    def to_json(self) -> str:
        return json.dumps(
            {"cost": json.loads(self.cost.to_json()), "max_kl": self.max_kl, "rows": self.rows}, indent=1, default=str
        )


def predict_speedup(analysis, cost, *, max_kl=None) -> Plan:
    """Predicted wall-time speedups of every row of an analysis under a cost model.

    ``analysis``: an ``AnalysisResult`` (``analyze_trace`` with the rules, deltas and m values
    to compare; its AL intervals become speedup intervals). ``cost``: a CostModel, a path to a
    cost file, or a number (the draft/verifier cost ratio, ``CostModel.from_ratio``). Returns a
    Plan; ``max_kl`` bounds the mean emitted KL(pi || q) per position for ``Plan.fastest``.
    Exact given the cost model: the tokens per step are the trace's exact expectations.

    A multi-draft rule's row (``draft_count`` k > 1) is a tree of depth m and width k: m draft
    passes and one verifier pass over k m + 1 tokens. Its AL assumes the accepted child's own
    children are drafted too, as in a full tree (which costs k + ... + k^m tokens); a tree of
    k m tokens that expands one node per level reaches that AL only when the accepted child is
    the expanded one, so for it the prediction is an upper bound.

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
    rows = []
    for r in analysis.rows:
        m, width = r["m"], r.get("draft_count", 1)
        row = dict(r)
        row["tokens_per_step"] = r["al"] + 1
        row["step_time"] = float(cost.step_time(m, r["al"], width))
        row["speedup"] = float(cost.speedup(m, r["al"], width))
        row["speedup_lo"] = float(cost.speedup(m, r["al_lo"], width))
        row["speedup_hi"] = float(cost.speedup(m, r["al_hi"], width))
        # a block larger than any the cost model timed: its verify time is extrapolated
        row["verify_extrapolated"] = bool(width * m + 1 > cost.largest_block and len(cost.verify_block) > 1)
        rows.append(row)
    return Plan(rows=rows, cost=cost, max_kl=max_kl)
