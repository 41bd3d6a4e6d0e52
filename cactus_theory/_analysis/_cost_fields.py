"""The checks and curves a cost model's fields go through: seconds that are finite and >= 0, maps of
sizes to seconds, timed repeats, and the non-decreasing (isotonic) curve of a verifier's block times.
What a cost model is and does lives in ``_cost``; nothing here knows of it."""

from __future__ import annotations

import json
import os

import numpy as np

from .._math._validation import is_integer


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


#: Seconds a forward pass (one drafted token, a verifier block, a prompt's processing) may take: no machine
#: runs one in under a microsecond, and none a planner is for takes an hour.
FORWARD_SECONDS = (1e-6, 3600.0)


def _forward_seconds(value, name):
    """``_positive``, and 0 or within ``FORWARD_SECONDS``: a timing no machine measures is refused by name."""
    number = _positive(value, name)
    low, high = FORWARD_SECONDS
    if number != 0 and not low <= number <= high:
        raise ValueError(
            f"{name} = {number:g} s lies outside what a machine measures for a forward pass ({low:g} "
            f"to {high:g} s): refusing a cost model built on it (was it written in other units?)"
        )
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
        if not (is_integer(k) or (isinstance(k, str) and k.isascii() and k.isdigit())):
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
        model: {
            L: check(x, f"{name}[{model!r}][{L}]")
            for L, x in _size_map(per, f"{name}[{model!r}]", "prompt lengths").items()
        }
        for model, per in value.items()
    }


def _checked_prefill(prefill):
    return _per_model(
        prefill, "prefill", _positive, '{"verifier": {prompt tokens: s}, "draft": {...}} (either may be left out)'
    )


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
        out["prefill"] = _per_model(
            samples["prefill"], "samples['prefill']", times, '{"verifier": {L: [...]}, "draft": {L: [...]}}'
        )
    return out


def _relative_spread(values):
    """Median absolute deviation over the median: a robust relative spread of repeated timings."""
    values = np.asarray(values, dtype=float)
    centre = np.median(values)
    return float(np.median(np.abs(values - centre)) / centre) if centre > 0 else 0.0


def _read_cost_json(path: str, max_bytes: int):
    """The JSON a cost file holds, each problem a ValueError naming the file: not a regular file, over
    ``max_bytes``, a key repeated in one object, not JSON, nested too deeply."""
    if not os.path.isfile(path):
        if os.path.isdir(path):
            what = "is a directory"
        elif os.path.exists(path):
            what = "is not a regular file (a FIFO, socket or device)"
        else:
            what = "does not exist"
        raise ValueError(f"cost file {path!r} {what} (write one with 'cactus-theory calibrate')")
    size = os.path.getsize(path)
    if size > max_bytes:
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
    return data
