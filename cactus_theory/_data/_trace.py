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

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .._math._sampling import SamplingSettings, processed_probs
from .._math._validation import is_integer
from .._util._files import (
    sha256_file,
)
from ._trace_format import (
    _DISTRIBUTIONS_BYTES,
    _DISTRIBUTIONS_SIZE,
    _ROLES,
    SequenceRecord,
    TraceError,
    _logit_arrays,
    _logsumexp,
    _read_manifest,
    _repeat_mask,
    _row_isin,
    _shard_path,
)

__all__ = ["Trace", "TraceSequence", "load_trace"]


@dataclass
class TraceSequence:
    """One sequence of a trace (arrays are (positions, ...))."""

    #: At most this many bytes of ``distributions`` results are kept for reuse, all sequences together (the
    #: oldest dropped first): a bound on what the analysis of a trace of any size keeps besides its sums.
    KEPT_DISTRIBUTIONS_BYTES: ClassVar[int] = _DISTRIBUTIONS_BYTES

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
            while (
                _DISTRIBUTIONS_SIZE[0] > TraceSequence.KEPT_DISTRIBUTIONS_BYTES and len(_DISTRIBUTIONS) > 1
            ):  # the oldest go first
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
        exact = s.support_within(k)
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
#: bytes)}), at most ``TraceSequence.KEPT_DISTRIBUTIONS_BYTES`` of arrays (the oldest dropped first).
_DISTRIBUTIONS: dict = {}


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
        if not is_integer(index):
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
