"""Writing a trace (``TraceWriter``): sequences appended in order, shards written to a temporary name
and renamed, the manifest rewritten after each shard, the directory locked (never through a
symlink), and a killed dump resumed from its last complete shard to the same bits."""

from __future__ import annotations

import json
import os

import numpy as np

from .._math._validation import check_int
from .._util._files import (
    DirectoryLock,
    LockError,
    atomic_path,
    atomic_write,
    remove_stale_temporaries,
    sha256_file,
)
from ._trace import Trace
from ._trace_format import (
    _ROLES,
    DEFAULT_TOP_K,
    RESUME_FIELDS,
    TraceError,
    _blank_manifest,
    _check_tokens,
    _read_manifest,
    _shard_name,
    _show,
    compress_logits,
    metadata_differences,
)

__all__ = ["TraceWriter"]


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
        check_int(top_k, "top_k", 1)
        check_int(vocab_size, "vocab_size", 2, high=2**31 - 1)
        check_int(shard_positions, "shard_positions", 1)
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
    def sequence_positions(self) -> dict[str, int]:
        """{sequence id: positions} of every sequence the trace holds (written or buffered)."""
        out = {s["id"]: int(s["positions"]) for s in self.manifest["sequences"]}
        out.update({b["id"]: int(b["tokens"].shape[0]) for b in self._buffer})
        return out

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
