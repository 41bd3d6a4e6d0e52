"""The trace format on disk, known here alone: the manifest's fields and their checks, shard names and
hashes, the compressed top-K logit rows (``compress_logits``), the records of sequences, and what
decides whether two traces' metadata may be merged. The writer is ``_trace_writer``, the reader
``_trace``, the importers ``_trace_import``."""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass

import numpy as np

from .._math._validation import is_integer
from .._util._files import (
    utc_timestamp,
)

__all__ = [
    "DEFAULT_TOP_K",
    "FORMAT",
    "VERSION",
    "SequenceRecord",
    "TraceError",
    "compress_logits",
    "metadata_differences",
    "model_hashes",
    "stored_metadata",
]

FORMAT = "cactus_theory.trace"


VERSION = 1


DEFAULT_TOP_K = 64


_ROLES = ("target", "draft")


class TraceError(ValueError):
    """A trace directory or file that is missing, truncated, corrupt or inconsistent."""


@dataclass(frozen=True)
class SequenceRecord:
    """What a trace's manifest records of one sequence (``Trace.records``): its id, task, the shard
    that holds it and its place there, its positions and its metadata (source, prompt tokens)."""

    id: str
    task: str
    shard: int
    index: int
    positions: int
    meta: dict

    @property
    def prompt_tokens(self) -> int | None:
        """The prompt's length in tokens, when the dump recorded it."""
        value = self.meta.get("prompt_tokens")
        return value if is_integer(value) else None


def _logsumexp(x):
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return (m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True)))[..., 0]


def compress_logits(logits, top_k: int):
    """(top-K logits float32, top-K ids int32, log-sum-exp float64) of raw logit rows (..., V).

    NaN logits raise. Works on NumPy arrays and torch tensors (moved to the host).
    """
    if hasattr(logits, "detach"):
        logits = logits.detach().float().cpu().numpy()
    x = np.asarray(logits, dtype=np.float64)
    if np.isnan(x).any():
        raise TraceError("logits contain NaN: check the model's output (overflow in float16?)")
    k = min(top_k, x.shape[-1])
    ids = np.argpartition(-x, k - 1, axis=-1)[..., :k]
    vals = np.take_along_axis(x, ids, axis=-1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    ids = np.take_along_axis(ids, order, axis=-1)
    vals = np.take_along_axis(vals, order, axis=-1)
    return vals.astype(np.float32), ids.astype(np.int32), _logsumexp(x)


_DISTRIBUTIONS_SIZE = [0]


_DISTRIBUTIONS_BYTES = 256 * 2**20


def _logit_arrays(logits):
    """The NumPy arrays a RuleLogits holds."""
    import dataclasses

    return [v for f in dataclasses.fields(logits) if isinstance(v := getattr(logits, f.name), np.ndarray)]


def _row_isin(ids, own_ids):
    """Per row: which entries of ``ids`` appear in that row of ``own_ids``."""
    out = np.zeros(ids.shape, dtype=bool)
    for j in range(own_ids.shape[-1]):
        out |= ids == own_ids[:, j : j + 1]
    return out


def _repeat_mask(ids):
    """True at every occurrence of an id after its first, per row."""
    order = np.argsort(ids, axis=-1, kind="stable")
    sorted_ids = np.take_along_axis(ids, order, axis=-1)
    rep_sorted = np.zeros(sorted_ids.shape, dtype=bool)
    rep_sorted[:, 1:] = sorted_ids[:, 1:] == sorted_ids[:, :-1]
    rep = np.zeros_like(rep_sorted)
    np.put_along_axis(rep, order, rep_sorted, axis=-1)
    return rep


def _shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


_SHARD_RE = re.compile(r"^shard-\d{5,}\.safetensors$")


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


#: Metadata a resumed dump must share with the trace it extends (the model entries by file hashes).
RESUME_FIELDS = (
    "verifier",
    "draft",
    "tokenizer_sha256",
    "chat_template",
    "sampling",
    "dtype",
    "engine",
    "seed",
    "seeding",
    "max_new_tokens",
    "teacher_forced",
    "part",
    "sampler",
    "batch",
)


#: Resume fields compared even when the stored trace lacks them (an older scheme).
_RESUME_REQUIRED = ("seeding",)


#: What a field absent from a stored trace means (traces dumped before the field existed).
_ABSENT_MEANS = {
    "engine": "hf",
    "sampler": "torch.multinomial, a torch.Generator per prompt",
    "batch": 1,
}


#: How a dump of models loaded here draws its tokens (recorded as ``sampler``; ``_models._device_rows``).
SAMPLER = "splitmix64 uniforms per prompt seed and position, inverse transform (row_uniforms)"


_MANIFEST_MAX_BYTES = 1 << 30


def _blank_manifest(top_k, vocab_size, metadata, tail_known, store_full=False):
    return {
        "format": FORMAT,
        "version": VERSION,
        "top_k": int(top_k),
        "vocab_size": int(vocab_size),
        "tail_known": bool(tail_known),
        "store_full": bool(store_full),
        "metadata": metadata or {},
        "created": utc_timestamp(),
        "shards": [],
        "sequences": [],
    }


def _is_int(x, low=0):
    return is_integer(x) and x >= low


def _check_manifest(manifest, path):
    """Refuse a manifest of the wrong shape with a TraceError naming the entry (not a KeyError)."""

    def fail(what):
        raise TraceError(f"{path}: {what}: the manifest is corrupt")

    if not isinstance(manifest, dict):
        fail(f"expected a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != FORMAT:
        raise TraceError(f"{path}: format is {manifest.get('format')!r}, expected {FORMAT!r}")
    if manifest.get("version") != VERSION:
        raise TraceError(f"{path}: version {manifest.get('version')!r} is not supported (expected {VERSION})")
    for key, low in (("top_k", 1), ("vocab_size", 2)):
        if not _is_int(manifest.get(key), low):
            fail(f"{key} must be an integer >= {low}; got {manifest.get(key)!r}")
    if not isinstance(manifest.get("metadata", {}), dict):
        fail("metadata must be an object")
    for key in ("tail_known", "store_full"):
        if key in manifest and not isinstance(manifest[key], bool):
            fail(f"{key} must be true or false; got {manifest[key]!r}")
    shards, sequences = manifest.get("shards"), manifest.get("sequences")
    if not isinstance(shards, list) or not isinstance(sequences, list):
        fail("shards and sequences must be lists")
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict):
            fail(f"shards[{i}] must be an object")
        name = shard.get("file")
        if not isinstance(name, str) or not _SHARD_RE.match(name):
            fail(
                f"shards[{i}].file must be the basename of a shard inside the trace directory "
                f"(shard-NNNNN.safetensors); got {name!r}"
            )
        if not isinstance(shard.get("sha256"), str) or not _HEX64.match(shard["sha256"]):
            fail(f"shards[{i}].sha256 must be 64 hex digits")
        for key in ("bytes", "positions"):
            if not _is_int(shard.get(key)):
                fail(f"shards[{i}].{key} must be an integer >= 0; got {shard.get(key)!r}")
    if len({s["file"] for s in shards}) != len(shards):
        fail("a shard file is listed twice")
    seen, per_shard = set(), {}
    for i, seq in enumerate(sequences):
        if not isinstance(seq, dict):
            fail(f"sequences[{i}] must be an object")
        if not isinstance(seq.get("id"), str) or not isinstance(seq.get("task"), str):
            fail(f"sequences[{i}] needs a string id and task")
        if seq["id"] in seen:
            fail(f"sequence id {seq['id']!r} appears twice")
        seen.add(seq["id"])
        if not (_is_int(seq.get("shard")) and seq["shard"] < len(shards)):
            fail(f"sequences[{i}].shard must index one of the {len(shards)} shards; got {seq.get('shard')!r}")
        for key in ("index", "positions"):
            if not _is_int(seq.get(key)):
                fail(f"sequences[{i}].{key} must be an integer >= 0; got {seq.get(key)!r}")
        if not isinstance(seq.get("meta", {}), dict):
            fail(f"sequences[{i}].meta must be an object")
        per_shard.setdefault(seq["shard"], []).append(seq)
    for index, shard in enumerate(shards):
        members = sorted(per_shard.get(index, []), key=lambda r: r["index"])
        if [r["index"] for r in members] != list(range(len(members))):
            fail(f"the sequences of {shard['file']} must be numbered 0..{len(members) - 1}")
        if sum(r["positions"] for r in members) != shard["positions"]:
            fail(f"the sequences of {shard['file']} do not add up to its {shard['positions']} positions")
    return manifest


def stored_metadata(directory) -> dict | None:
    """The metadata of the trace in ``directory`` (checked as a manifest is), or None where there is
    no trace yet (no directory, or no manifest.json in it)."""
    if not os.path.lexists(os.path.join(str(directory), "manifest.json")):
        return None
    return dict(_read_manifest(str(directory)).get("metadata") or {})


def _read_manifest(directory):
    path = os.path.join(directory, "manifest.json")
    if not os.path.isdir(directory):
        if os.path.exists(directory):
            raise TraceError(
                f"{directory!r} is a file, not a trace directory: give the directory that holds manifest.json"
            )
        raise TraceError(f"trace directory {directory!r} does not exist")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise TraceError(
            f"{directory!r} has no manifest.json: not a trace (or a dump that never completed a shard)"
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise TraceError(f"{path} is not a regular file (a link or device): refusing to read it")
    if info.st_size > _MANIFEST_MAX_BYTES:
        raise TraceError(f"{path} has {info.st_size} bytes, more than a manifest can: refusing to read it")
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path} is not valid JSON ({exc}): the manifest is corrupt") from None
    except RecursionError:
        raise TraceError(f"{path} is nested too deeply: the manifest is corrupt") from None
    return _check_manifest(manifest, path)


def _shard_path(directory, record):
    """The path of a listed shard: its basename inside ``directory``, a regular file (not a link)
    of the size the manifest gives; checked before anything is read."""
    path = os.path.join(directory, record["file"])
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise TraceError(f"shard {record['file']} listed in the manifest is missing from {directory!r}") from None
    if not stat.S_ISREG(info.st_mode):
        raise TraceError(f"shard {record['file']} in {directory!r} is not a regular file (a link or device)")
    if info.st_size != record["bytes"]:
        raise TraceError(
            f"shard {record['file']} of {directory!r} has {info.st_size} bytes, the manifest says "
            f"{record['bytes']}: truncated"
        )
    return path


def _check_tokens(tokens, vocab_size, what):
    """Integer token ids in [0, vocab_size), as int32 (ids are never wrapped)."""
    arr = np.asarray(tokens)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise TraceError(f"{what} must be integer token ids; got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False).reshape(-1) if arr.size else np.zeros(0, dtype=np.int64)
    bad = (arr < 0) | (arr >= vocab_size)
    if bad.any():
        raise TraceError(f"{what} holds token id {int(arr[bad][0])}, outside the vocabulary [0, {vocab_size})")
    return arr.astype(np.int32)


def _file_hashes(files):
    """The sha256 sums of a model's files, from {name: sha256} or {name: {"sha256": ..., "bytes": ...}}."""
    return sorted(v["sha256"] if isinstance(v, dict) else str(v) for v in files.values())


def model_hashes(entry):
    """A model entry's identity, the sorted sha256 sums of its files; None if ``entry`` is not a
    model entry (a dict with ``files``)."""
    return _file_hashes(entry["files"]) if isinstance(entry, dict) and "files" in entry else None


def _comparable(value):
    """A metadata value as traces are compared: a model entry by its files' hashes, else its JSON."""
    hashes = model_hashes(value)
    return hashes if hashes is not None else json.dumps(value, sort_keys=True, default=str)


def _show(value) -> str:
    """A metadata value in an error message (a model entry by its hashes), cut at 120 characters."""
    hashes = model_hashes(value)
    text = repr(hashes if hashes is not None else value)
    return text[:120] + "..." if len(text) > 120 else text


def metadata_differences(old, new, fields, *, skip_absent=False):
    """[(field, old value, new value)] for the ``fields`` whose values differ between two metadata
    dicts (model entries by their files' hashes). ``skip_absent``: as a resume compares, a field
    missing from ``new``, or from ``old`` unless required there, is not compared."""
    out = []
    for key in fields:
        always = key == "part" or key in _ABSENT_MEANS
        if skip_absent and not always and (key not in new or (key not in old and key not in _RESUME_REQUIRED)):
            continue  # "part" always: a part of a split dump resumes only as that part, a whole dump as a whole
        a, b = old.get(key, _ABSENT_MEANS.get(key)), new.get(key, _ABSENT_MEANS.get(key))
        if _comparable(a) != _comparable(b):
            out.append((key, a, b))
    return out
