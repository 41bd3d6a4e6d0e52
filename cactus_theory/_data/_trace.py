"""Logit traces: an exact, compact, resumable on-disk format (safetensors shards + JSON manifest).

A trace holds sequences of generated positions. For each position it stores, for the verifier
and the draft on the same prefix, the top-K raw logits with their token ids and the
log-sum-exp of the full raw row (so the tail mass exp(lse) - sum exp(top-K) is known exactly),
plus the generated token. Optionally the full rows.

Exactness: after sampling settings with 0 < top_k <= K (the paper's top_k = 20 with the default
K = 64), every processed distribution is supported inside the stored top-K, so every metric is
exact. For other settings (no top-k, or top_k > K) at temperature 1 the tail is kept as one
lumped bucket of exactly known mass: acceptance and divergences then treat the tail as one
token (an approximation, measured against full rows in the tests); other temperatures without
a top-k inside K need full rows.

Files: ``manifest.json`` (format, K, vocabulary, metadata, per-shard sha256, per-sequence
records) and ``shard-NNNNN.safetensors``. Every file is written to a temporary name and renamed;
the manifest is rewritten after each shard, so a killed dump resumes from its last complete
shard. Shards are read lazily and memory-mapped (``safetensors.safe_open``). The guarantees
(locking, atomicity, what is validated on writing and reading) are on ``TraceWriter`` and
``Trace``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .._math._sampling import SamplingSettings, processed_probs
from .._util._files import (
    DirectoryLock,
    LockError,
    atomic_path,
    atomic_write,
    remove_stale_temporaries,
    sha256_file,
    utc_timestamp,
)

__all__ = ["SequenceRecord", "Trace", "TraceError", "TraceSequence", "TraceWriter", "load_trace", "trace_from_arrays"]

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
        return value if isinstance(value, int) and not isinstance(value, bool) else None


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


@dataclass
class TraceSequence:
    """One sequence of a trace (arrays are (positions, ...))."""

    id: str
    task: str
    tokens: np.ndarray
    topk_logits: dict
    topk_ids: dict
    lse: dict
    full_logits: dict | None = None
    meta: dict = field(default_factory=dict)
    manifest_tail_known: bool = True

    @property
    def n_positions(self) -> int:
        return int(self.tokens.shape[0])

    def distributions(self, settings: SamplingSettings | None = None, *, with_logits: bool = False, **kwargs):
        """(draft_probs, target_probs) on a shared support, shape (positions, S).

        The support is the union of both models' stored token ids (each id once), plus one
        lumped tail bucket when the settings do not truncate inside the stored top-K. Exact
        when 0 < top_k <= K or temperature = 0 (or when full rows are stored); see the module
        docstring otherwise.

        ``with_logits=True`` also returns a ``RuleLogits`` on the same support, for the rules
        that need the raw logits: each model's stored logits, its full-vocabulary log-sum-exp,
        which entries it stores (``*_known``), and in place of the others an upper bound (the
        smaller of its K-th stored logit and lse + log(tail mass), also given as ``*_floor`` for
        every token outside the support). Needs exact settings (0 < top_k <= K) or full rows.
        """
        if settings is not None and kwargs:
            raise ValueError("give either settings or keyword settings, not both")
        s = settings if settings is not None else SamplingSettings(**kwargs)
        if self.full_logits is not None:
            return self._distributions(s, with_logits)
        # the same stored rows under the same settings give the same arrays: the sections of a report
        # and the studies read each sequence several times, so the newest results are kept (read-only)
        key = (self._digest(), s, bool(with_logits))
        found = _DISTRIBUTIONS.get(key)
        if found is None:
            found = self._distributions(s, with_logits)
            size = 0
            for value in found:
                for array in (value,) if isinstance(value, np.ndarray) else _logit_arrays(value):
                    array.flags.writeable = False
                    size += array.nbytes
            _DISTRIBUTIONS[key] = (found, size)
            _DISTRIBUTIONS_SIZE[0] += size
            while _DISTRIBUTIONS_SIZE[0] > _DISTRIBUTIONS_BYTES and len(_DISTRIBUTIONS) > 1:  # the oldest go first
                _DISTRIBUTIONS_SIZE[0] -= _DISTRIBUTIONS.pop(next(iter(_DISTRIBUTIONS)))[1]
            return found
        return found[0]

    @staticmethod
    def forget_distributions():
        """Drop the kept results of ``distributions`` (benchmarks that time a first read call this)."""
        _DISTRIBUTIONS.clear()
        _DISTRIBUTIONS_SIZE[0] = 0

    def _digest(self) -> bytes:
        """A digest of the stored rows (ids, logits, log-sum-exps of both models)."""
        import hashlib

        h = hashlib.blake2b(digest_size=16)
        for role in _ROLES:
            for part in (self.topk_ids[role], self.topk_logits[role], self.lse[role]):
                array = np.ascontiguousarray(part)
                h.update(str((array.dtype, array.shape)).encode())
                h.update(array.tobytes())
        h.update(str(self.manifest_tail_known).encode())
        return h.digest()

    def _distributions(self, s, with_logits):
        """``distributions`` computed (see there)."""
        from .._math._logits import RuleLogits

        if self.full_logits is not None:
            rows = {role: np.asarray(self.full_logits[role], dtype=np.float64) for role in _ROLES}
            probs = processed_probs(rows["draft"], s), processed_probs(rows["target"], s)
            if not with_logits:
                return probs
            return (*probs, RuleLogits(target=rows["target"], draft=rows["draft"], temperature=s.temperature))
        k = min(self.topk_ids["target"].shape[-1], self.topk_ids["draft"].shape[-1])
        exact = s.greedy or 0 < s.top_k <= k
        if not exact and not self.manifest_tail_known:
            raise TraceError(
                f"settings {s} need the tail mass beyond the stored top-{k}, which this trace does not know "
                f"(imported from top-k log-prob lists): analyse with 0 < top_k <= {k}"
            )
        if not exact and s.temperature != 1.0:
            raise TraceError(
                f"settings {s} are not exact on a top-{k} trace (no top-k <= {k}) and need the tail's shape at "
                f"temperature {s.temperature}: dump with full rows, or analyse at temperature 1 or with top_k <= {k}"
            )
        if with_logits and not exact:
            raise TraceError(
                f"rules that need raw logits need exact settings on a top-{k} trace (0 < top_k <= {k}) or full "
                f"rows; got {s}"
            )
        ids = np.concatenate([self.topk_ids["target"], self.topk_ids["draft"]], axis=-1)
        repeat = _repeat_mask(ids)
        probs, raw = {}, {}
        for role in _ROLES:
            own_ids, own_vals = self.topk_ids[role], self.topk_logits[role].astype(np.float64)
            value = np.full(ids.shape, -np.inf)
            for j in range(own_ids.shape[-1]):
                value = np.where(ids == own_ids[:, j : j + 1], own_vals[:, j : j + 1], value)
            value = np.where(repeat, -np.inf, value)
            raw[role] = value
            if not exact:
                head = _logsumexp(own_vals)
                with np.errstate(divide="ignore"):
                    tail = self.lse[role] + np.log(np.maximum(-np.expm1(head - self.lse[role]), 0.0))
                value = np.concatenate([value, tail[:, None]], axis=-1)
            probs[role] = processed_probs(value, s)
        if not with_logits:
            return probs["draft"], probs["target"]
        fields = {"temperature": s.temperature}
        for role in _ROLES:
            own_vals = self.topk_logits[role].astype(np.float64)
            lse = np.asarray(self.lse[role], dtype=np.float64)
            with np.errstate(divide="ignore"):
                tail = lse + np.log(np.maximum(-np.expm1(_logsumexp(own_vals) - lse), 0.0))
            floor = np.minimum(own_vals[:, -1], tail)
            known = _row_isin(ids, self.topk_ids[role]) | repeat
            fields[role] = np.where(known, raw[role], floor[:, None])
            fields[f"{role}_known"] = known
            fields[f"{role}_lse"] = lse
            fields[f"{role}_floor"] = floor
        return probs["draft"], probs["target"], RuleLogits(**fields)


#: The newest results of ``TraceSequence.distributions`` ({(rows' digest, settings, with_logits): (result,
#: bytes)}), at most ``_DISTRIBUTIONS_BYTES`` of arrays (the oldest dropped first).
_DISTRIBUTIONS: dict = {}
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
)
#: Resume fields compared even when the stored trace lacks them (an older scheme).
_RESUME_REQUIRED = ("seeding",)
#: What a field absent from a stored trace means (traces dumped before the field existed).
_ABSENT_MEANS = {"engine": "hf"}
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
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


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


class TraceWriter:
    """Append sequences to a trace directory, one safetensors shard at a time; resumes.

    Parameters
    ----------
    directory : str
    vocab_size : int
        Shared vocabulary of draft and verifier (rows of another width raise).
    top_k : int
        Logits kept per row (default 64; exact for sampling settings with top_k <= 64).
    metadata : dict
        Stored in the manifest (models, hashes, tokenizer, chat template, sampling, versions...).
    shard_positions : int
        A shard is written once this many positions are buffered.
    store_full : bool
        Also store full logit rows (float32, V per row).
    tail_known : bool
        False for imports whose log-sum-exp is unknown (e.g. top-k log-prob lists).

    Guarantees. The writer locks the directory for its lifetime (a second writer gets a
    TraceError; the lock of a dead process is taken over). It writes every file under a
    temporary name only it makes, then renames it, and removes only those names (its own, or a
    dead writer's); nothing else in the directory is touched. Used as a context manager (or
    with ``close``), it writes the sequences it holds when the block ends, on an exception, on
    Ctrl-C, or on SIGTERM inside ``termination_as_exception``. An existing trace is resumed
    when its top_k, vocab_size, full-row setting and the ``RESUME_FIELDS`` of its metadata
    agree with the new ones (a mismatch raises a TraceError naming the field); ``done_ids``
    lists the sequences already stored. Token ids are checked to lie in the vocabulary.
    """

    def __init__(
        self,
        directory,
        vocab_size: int,
        *,
        top_k: int = DEFAULT_TOP_K,
        metadata=None,
        shard_positions: int = 4096,
        store_full: bool = False,
        tail_known: bool = True,
    ):
        if not (isinstance(top_k, (int, np.integer)) and top_k >= 1):
            raise ValueError(f"top_k must be an integer >= 1; got {top_k!r}")
        if not (isinstance(vocab_size, (int, np.integer)) and 2 <= vocab_size < 2**31):
            raise ValueError(f"vocab_size must be an integer in [2, 2**31); got {vocab_size!r}")
        if not (isinstance(shard_positions, (int, np.integer)) and shard_positions >= 1):
            raise ValueError(f"shard_positions must be an integer >= 1; got {shard_positions!r}")
        self.directory = str(directory)
        self.store_full = bool(store_full)
        self.shard_positions = int(shard_positions)
        self._buffer: list[dict] = []
        try:
            self._lock = DirectoryLock(self.directory, "trace writer").acquire()
        except LockError as exc:
            raise TraceError(str(exc)) from None
        try:
            remove_stale_temporaries(self.directory)
            if os.path.lexists(os.path.join(self.directory, "manifest.json")):
                self.manifest = _read_manifest(self.directory)
                self._check_resume(top_k, vocab_size, metadata)
                Trace(self.directory, verify=True)  # every listed shard present and intact
            else:
                self.manifest = _blank_manifest(top_k, vocab_size, metadata, tail_known, self.store_full)
                self._write_manifest()
        except BaseException:
            self._lock.release()
            raise

    def _check_resume(self, top_k, vocab_size, metadata):
        m = self.manifest
        fields = [("top_k", m["top_k"], top_k), ("vocab_size", m["vocab_size"], vocab_size)]
        fields.append(("store_full", m.get("store_full", False), self.store_full))
        bad = [(k, a, b) for k, a, b in fields if a != b]
        bad += metadata_differences(m.get("metadata", {}), metadata or {}, RESUME_FIELDS, skip_absent=True)
        if bad:
            key, old, new = bad[0]
            raise TraceError(
                f"cannot resume {self.directory!r}: its {key} is {_show(old)}, this run has {_show(new)}"
                + (f" (and {len(bad) - 1} more field(s) differ)" if len(bad) > 1 else "")
                + ": resume with the same settings, or write a new trace directory"
            )

    @property
    def positions_held(self) -> int:
        """Positions in the trace so far: the shards written and the sequences buffered."""
        return sum(s["positions"] for s in self.manifest["sequences"]) + sum(len(b["tokens"]) for b in self._buffer)

    @property
    def metadata(self) -> dict:
        """The trace's metadata (a resumed trace's own, as first written)."""
        return self.manifest.get("metadata", {})

    @property
    def done_ids(self) -> set[str]:
        return {s["id"] for s in self.manifest["sequences"]} | {b["id"] for b in self._buffer}

    def _write_manifest(self):
        atomic_write(os.path.join(self.directory, "manifest.json"), json.dumps(self.manifest, indent=1).encode())

    def _check_open(self):
        if not self._lock.held:
            raise TraceError(f"the writer of {self.directory!r} is closed")

    def add(self, seq_id: str, task: str, tokens, target_logits, draft_logits, meta=None):
        """Add one sequence from full logit rows (positions, V) of verifier and draft."""
        self._check_open()
        rows = {"target": target_logits, "draft": draft_logits}
        compressed, full = {}, {}
        for role, logits in rows.items():
            width = logits.shape[-1]
            if width != self.manifest["vocab_size"]:
                raise TraceError(
                    f"{role} logits have vocabulary {width}, the trace has {self.manifest['vocab_size']}: "
                    "draft and verifier must share one vocabulary"
                )
            compressed[role] = compress_logits(logits, self.manifest["top_k"])
            if self.store_full:
                full[role] = np.asarray(
                    logits.detach().float().cpu().numpy() if hasattr(logits, "detach") else logits, dtype=np.float32
                )
        self.add_compressed(seq_id, task, tokens, compressed, full or None, meta)

    def add_compressed(self, seq_id, task, tokens, compressed, full=None, meta=None):
        """Add one sequence from {role: (top-K logits, top-K ids, lse)}."""
        self._check_open()
        if not isinstance(seq_id, str) or not seq_id:
            raise TraceError(f"a sequence id must be a non-empty string; got {seq_id!r}")
        if seq_id in self.done_ids:
            raise TraceError(f"sequence {seq_id!r} is already in the trace")
        vocab = self.manifest["vocab_size"]
        tokens = _check_tokens(tokens.cpu() if hasattr(tokens, "cpu") else tokens, vocab, f"sequence {seq_id!r}")
        for role, (vals, ids, lse) in compressed.items():
            if vals.shape[0] != tokens.shape[0] or ids.shape != vals.shape or np.shape(lse) != (tokens.shape[0],):
                raise TraceError(f"{role} rows do not match the {tokens.shape[0]} generated tokens of {seq_id!r}")
            _check_tokens(ids, vocab, f"the {role} top-K ids of {seq_id!r}")
        self._buffer.append(
            {"id": seq_id, "task": task, "tokens": tokens, "compressed": compressed, "full": full, "meta": meta or {}}
        )
        if sum(b["tokens"].shape[0] for b in self._buffer) >= self.shard_positions:
            self.flush()

    def flush(self):
        """Write the buffered sequences as one shard and record it in the manifest."""
        if not self._buffer:
            return
        self._check_open()
        from safetensors.numpy import save_file

        index = len(self.manifest["shards"])
        name = _shard_name(index)
        tensors = {
            "tokens": np.concatenate([b["tokens"] for b in self._buffer]),
            "offsets": np.cumsum([0] + [b["tokens"].shape[0] for b in self._buffer]).astype(np.int64),
        }
        for role in _ROLES:
            tensors[f"{role}_topk_logits"] = np.concatenate([b["compressed"][role][0] for b in self._buffer])
            tensors[f"{role}_topk_ids"] = np.concatenate([b["compressed"][role][1] for b in self._buffer])
            tensors[f"{role}_lse"] = np.concatenate([np.asarray(b["compressed"][role][2]) for b in self._buffer])
            if self._buffer[0]["full"] is not None:
                tensors[f"{role}_full"] = np.concatenate([b["full"][role] for b in self._buffer])
        tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
        path = os.path.join(self.directory, name)
        with atomic_path(path) as tmp:
            save_file(tensors, tmp)
        self.manifest["shards"].append(
            {
                "file": name,
                "sha256": sha256_file(path),
                "bytes": os.path.getsize(path),
                "positions": len(tensors["tokens"]),
            }
        )
        for i, b in enumerate(self._buffer):
            self.manifest["sequences"].append(
                {
                    "id": b["id"],
                    "task": b["task"],
                    "shard": index,
                    "index": i,
                    "positions": int(b["tokens"].shape[0]),
                    **({"meta": b["meta"]} if b["meta"] else {}),
                }
            )
        self._buffer = []
        self._write_manifest()

    def close(self):
        """Write what is buffered and release the directory."""
        if not self._lock.held:
            return
        try:
            self.flush()
        finally:
            self._lock.release()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # on an exception too (Ctrl-C, SIGTERM turned into an exception, a failed model call):
        # the completed sequences held in memory are written before the error propagates
        self.close()

    def __del__(self):  # a writer dropped without close still releases its lock
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.release()


class Trace:
    """A trace on disk, read lazily shard by shard (memory-mapped).

    Opening checks the manifest's shape (a TraceError names the bad entry), that every shard is
    a regular file of the listed size inside the directory, and with ``verify=True`` its sha256.
    Reading a shard checks its arrays against the manifest (offsets, lengths, token ids within
    the vocabulary).
    """

    def __init__(self, directory, verify: bool = True):
        self.directory = str(directory)
        self.manifest = _read_manifest(self.directory)
        for shard in self.manifest["shards"]:
            path = _shard_path(self.directory, shard)
            if verify and sha256_file(path) != shard["sha256"]:
                raise TraceError(
                    f"shard {shard['file']} of {self.directory!r} fails its sha256 checksum: the file is corrupt"
                )

    @property
    def metadata(self) -> dict:
        return self.manifest["metadata"]

    @property
    def sampling(self) -> SamplingSettings:
        """The sampling settings the trace was recorded with (``metadata.sampling``; defaults where
        it records none); a malformed entry raises a TraceError naming the trace and the field."""
        try:
            return SamplingSettings.from_dict(self.metadata.get("sampling"), "metadata.sampling")
        except ValueError as exc:
            raise TraceError(f"{self.directory}: {exc}: the manifest is corrupt") from None

    @property
    def top_k(self) -> int:
        return self.manifest["top_k"]

    @property
    def vocab_size(self) -> int:
        return self.manifest["vocab_size"]

    @property
    def n_shards(self) -> int:
        return len(self.manifest["shards"])

    def records(self, tasks=None) -> list[SequenceRecord]:
        """Every sequence's record (``SequenceRecord``), shard by shard; only those of ``tasks``
        (an iterable of task labels) when given."""
        wanted = None if tasks is None else set(tasks)
        out = [
            SequenceRecord(r["id"], r["task"], r["shard"], r["index"], r["positions"], r.get("meta", {}))
            for r in sorted(self.manifest["sequences"], key=lambda r: (r["shard"], r["index"]))
        ]
        return out if wanted is None else [r for r in out if r.task in wanted]

    def shard_positions(self, index: int) -> int:
        """The positions shard ``index`` holds."""
        return self.manifest["shards"][index]["positions"]

    @property
    def tasks(self) -> list[str]:
        """The task labels of the trace's sequences, sorted."""
        return sorted({r["task"] for r in self.manifest["sequences"]})

    @property
    def n_positions(self) -> int:
        return sum(s["positions"] for s in self.manifest["shards"])

    def __len__(self) -> int:
        return len(self.manifest["sequences"])

    def shard(self, index: int) -> list[TraceSequence]:
        """The sequences of one shard (its tensors memory-mapped by safetensors), checked."""
        from safetensors import SafetensorError, safe_open

        record = self.manifest["shards"][index]
        path = _shard_path(self.directory, record)
        try:
            with safe_open(path, framework="np") as fh:
                data = {k: fh.get_tensor(k) for k in fh.keys()}
        except (SafetensorError, OSError, ValueError) as exc:
            raise TraceError(
                f"shard {record['file']} of {self.directory!r} cannot be read ({exc}): truncated or corrupt"
            ) from None
        seqs = sorted((s for s in self.manifest["sequences"] if s["shard"] == index), key=lambda r: r["index"])
        self._check_shard(record, data, seqs)
        offsets = data["offsets"]
        out = []
        for rec in seqs:
            lo, hi = int(offsets[rec["index"]]), int(offsets[rec["index"] + 1])
            full = None
            if "target_full" in data:
                full = {role: data[f"{role}_full"][lo:hi] for role in _ROLES}
            out.append(
                TraceSequence(
                    id=rec["id"],
                    task=rec["task"],
                    tokens=data["tokens"][lo:hi],
                    topk_logits={role: data[f"{role}_topk_logits"][lo:hi] for role in _ROLES},
                    topk_ids={role: data[f"{role}_topk_ids"][lo:hi] for role in _ROLES},
                    lse={role: data[f"{role}_lse"][lo:hi] for role in _ROLES},
                    full_logits=full,
                    meta=rec.get("meta", {}),
                    manifest_tail_known=self.manifest.get("tail_known", True),
                )
            )
        return out

    def _check_shard(self, record, data, seqs):
        def fail(what):
            raise TraceError(f"shard {record['file']} of {self.directory!r}: {what}: the trace is corrupt")

        needed = ["tokens", "offsets"] + [f"{r}_{k}" for r in _ROLES for k in ("topk_logits", "topk_ids", "lse")]
        missing = [k for k in needed if k not in data]
        if missing:
            fail(f"missing arrays {missing}")
        n = record["positions"]
        offsets = np.asarray(data["offsets"])
        if offsets.ndim != 1 or offsets.size != len(seqs) + 1 or offsets[0] != 0 or offsets[-1] != n:
            fail(f"offsets must run from 0 to {n} over {len(seqs)} sequences")
        if np.any(np.diff(offsets) < 0):
            fail("offsets must not decrease")
        if [int(x) for x in np.diff(offsets)] != [r["positions"] for r in seqs]:
            fail("offsets disagree with the sequences' positions in the manifest")
        k = self.manifest["top_k"]
        for key, shape in (("tokens", (n,)), *((f"{r}_lse", (n,)) for r in _ROLES)):
            if data[key].shape != shape:
                fail(f"{key} has shape {data[key].shape}, expected {shape}")
        for r in _ROLES:
            for key in (f"{r}_topk_logits", f"{r}_topk_ids"):
                if data[key].ndim != 2 or data[key].shape[0] != n or data[key].shape[1] > k:
                    fail(f"{key} has shape {data[key].shape}, expected ({n}, <= {k})")
        vocab = self.manifest["vocab_size"]
        for key in ("tokens", "target_topk_ids", "draft_topk_ids"):
            ids = data[key]
            if ids.size and (ids.min() < 0 or ids.max() >= vocab):
                fail(f"{key} holds ids outside the vocabulary [0, {vocab})")

    def __iter__(self) -> Iterator[TraceSequence]:
        for i in range(self.n_shards):
            yield from self.shard(i)

    def __getitem__(self, index: int) -> TraceSequence:
        """Sequence ``index`` in iteration order (shard by shard); reads only its shard."""
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"a trace is indexed by an integer sequence number; got {type(index).__name__}")
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"sequence index {index} out of range for a trace of {n} sequences")
        order = sorted(self.manifest["sequences"], key=lambda r: (r["shard"], r["index"]))
        rec = order[int(index) % n]
        return next(s for s in self.shard(rec["shard"]) if s.id == rec["id"])


def load_trace(path=None, verify: bool = True) -> Trace:
    """Open a trace directory (default: the trace embedded in the package)."""
    if path is None:
        from importlib import resources

        path = str(resources.files("cactus_theory") / "data" / "default_trace")
    return Trace(path, verify=verify)


def trace_from_arrays(
    directory,
    draft_logits,
    target_logits,
    tokens,
    *,
    sequence_lengths=None,
    tasks=None,
    ids=None,
    top_k=DEFAULT_TOP_K,
    metadata=None,
    store_full=False,
):
    """Build a trace from in-memory logits (NumPy or torch): (positions, V) each, or lists of them.

    Log-probabilities work as logits (same softmax). ``sequence_lengths`` splits concatenated
    rows into sequences. Shapes and vocabularies are checked.
    """

    def as_list(x):
        if isinstance(x, (list, tuple)):
            return list(x)
        arr = x
        if sequence_lengths is None:
            return [arr]
        bounds = np.cumsum([0, *sequence_lengths])
        if bounds[-1] != arr.shape[0]:
            raise ValueError(f"sequence_lengths sum to {bounds[-1]} but there are {arr.shape[0]} rows")
        return [arr[a:b] for a, b in itertools.pairwise(bounds)]

    drafts, targets, toks = as_list(draft_logits), as_list(target_logits), as_list(tokens)
    if not (len(drafts) == len(targets) == len(toks)):
        raise ValueError(
            f"draft_logits, target_logits and tokens give {len(drafts)}, {len(targets)}, {len(toks)} sequences"
        )
    vocab = targets[0].shape[-1]
    for i, (d, t, k) in enumerate(zip(drafts, targets, toks, strict=True)):
        if d.shape[-1] != t.shape[-1]:
            raise TraceError(f"sequence {i}: draft vocabulary {d.shape[-1]} != verifier vocabulary {t.shape[-1]}")
        if d.shape[0] != t.shape[0] or d.shape[0] != len(k):
            raise ValueError(f"sequence {i}: {d.shape[0]} draft rows, {t.shape[0]} verifier rows, {len(k)} tokens")
    if ids is not None and len(set(ids)) != len(ids):
        raise ValueError("ids must be distinct: each names one sequence")
    with TraceWriter(directory, vocab, top_k=top_k, metadata=metadata, store_full=store_full) as writer:
        for i, (d, t, k) in enumerate(zip(drafts, targets, toks, strict=True)):
            writer.add(ids[i] if ids else f"seq-{i}", tasks[i] if tasks else "unknown", k, t, d)
    return Trace(directory)


def import_topk_logprobs(
    directory, draft_topk, target_topk, tokens, *, vocab_size, ids=None, tasks=None, metadata=None
):
    """Trace from top-k log-prob lists as vLLM returns them: per sequence, per position, a dict
    {token_id: logprob}. The tail mass beyond the listed tokens is unknown, so the trace is
    flagged ``tail_known = False``; it is exact only for settings with top_k <= the list length."""
    width = min(min(len(pos) for seq in draft_topk for pos in seq), min(len(pos) for seq in target_topk for pos in seq))
    with TraceWriter(directory, vocab_size, top_k=width, metadata=metadata, tail_known=False) as writer:
        _add_logprob_lists(writer, draft_topk, target_topk, tokens, vocab_size, width, ids, tasks)
    return Trace(directory)


def _add_logprob_lists(writer, draft_topk, target_topk, tokens, vocab_size, width, ids, tasks):
    for i, (dseq, tseq, toks) in enumerate(zip(draft_topk, target_topk, tokens, strict=True)):
        compressed = {}
        for role, seq in (("draft", dseq), ("target", tseq)):
            vals = np.empty((len(seq), width), np.float32)
            idx = np.empty((len(seq), width), np.int32)
            for j, pos in enumerate(seq):
                best = sorted(pos.items(), key=lambda kv: -kv[1])[:width]
                for c, (tok, lp) in enumerate(best):
                    if not 0 <= int(tok) < vocab_size:
                        raise TraceError(
                            f"sequence {i}, position {j}: token id {tok} outside the vocabulary {vocab_size}"
                        )
                    idx[j, c], vals[j, c] = int(tok), float(lp)
            compressed[role] = (vals, idx, np.full(len(seq), np.nan))
        writer.add_compressed(ids[i] if ids else f"seq-{i}", tasks[i] if tasks else "unknown", toks, compressed)
