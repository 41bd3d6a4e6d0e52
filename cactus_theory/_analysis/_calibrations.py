"""Where cost models are kept and found: the user cache's calibrations (``calibrate``'s default
place, the newest of a trace's model pair), and a cost model's provenance in words."""

from __future__ import annotations

import json
import os

from ._cost import load_cost

__all__ = ["cost_description", "cost_directory", "default_cost_path", "find_calibration", "find_calibration_path"]


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

    from .._data._trace_format import model_hashes as files

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
            text += (
                f", timings of {src.get('verifier')} verifying and {src.get('draft')} drafting, another pair than "
                f"the trace's ({verifier} and {draft}): the trace's acceptance, that pair's costs"
            )
        return text
    if kind == "calibration":
        where = f"{src.get('dtype', '?')} on {src.get('device', '?')}, {src.get('created', '')}"
        return f"calibrated on this machine ({where})"
    if kind == "roofline":
        return (
            f"a roofline (modelled, not measured) of {src.get('verifier')} verifying and {src.get('draft')} "
            f"drafting on {src.get('device')} at {src.get('context')} tokens of context, its efficiency and "
            "overheads fitted to the shipped GB200 profiles"
        )
    return "a cost file"
