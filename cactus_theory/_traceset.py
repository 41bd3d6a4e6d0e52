"""Several traces as one dataset: trace sets (checked for compatibility), merging the parts of a
split dump, and a synthetic trace generator for tests at scale.

A trace set is what ``analyze_trace`` reads when given several directories or a glob: the
traces must share the models, the tokenizer, the sampling settings and K (``SET_FIELDS``); they
may differ in seed, prompts or dtype (several dumps of one model pair). ``merge_traces`` is
stricter: the parts of one split dump (``dump --part I/N``) share every field a resumed dump
would (``MERGE_FIELDS``), and their sequence ids may not overlap.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator

import numpy as np

from ._io import termination_as_exception
from ._progress import progress_bar
from ._trace import RESUME_FIELDS, Trace, TraceError, TraceSequence, TraceWriter, _show, metadata_differences

__all__ = ["MERGE_FIELDS", "SET_FIELDS", "TraceSet", "merge_traces", "open_traces", "synthesize_trace"]

#: Metadata that the traces of one set must share (models by file hashes), besides K, the
#: vocabulary and whether the tail mass is known.
SET_FIELDS = ("verifier", "draft", "tokenizer_sha256", "sampling")
#: Metadata that the parts of one split dump must share: every field a resumed dump checks.
MERGE_FIELDS = tuple(f for f in RESUME_FIELDS if f != "part")
_MANIFEST_FIELDS = ("top_k", "vocab_size", "tail_known")
_STORED = ("topk_logits", "topk_ids", "lse")  # per role, per position


def _differences(first: Trace, other: Trace, fields, manifest_fields=_MANIFEST_FIELDS):
    """[(field, first's value, other's value)] where two traces disagree."""
    out = [(k, first.manifest.get(k), other.manifest.get(k)) for k in manifest_fields]
    out = [(k, a, b) for k, a, b in out if a != b]
    return out + metadata_differences(first.metadata, other.metadata, fields)


def _refuse(first: Trace, other: Trace, bad, what: str):
    key, a, b = bad[0]
    more = f" (and {len(bad) - 1} more field(s): {', '.join(k for k, _, _ in bad[1:])})" if len(bad) > 1 else ""
    raise TraceError(f"{what}: {other.directory!r} has {key} = {_show(b)}, {first.directory!r} has {_show(a)}{more}")


def _expand(paths) -> list[str]:
    """Directories from paths and glob patterns (a pattern matching no directory is an error)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = []
    for path in paths:
        text = os.fspath(path)
        if glob.has_magic(text):
            matches = sorted(m for m in glob.glob(text) if os.path.isdir(m))
            if not matches:
                raise TraceError(f"no trace directory matches {text!r}")
            out.extend(matches)
        else:
            out.append(text)
    if not out:
        raise TraceError("no trace directories given")
    return out


def _names(directories) -> list[str]:
    """Short unique names: the basenames, or the normalised paths where basenames collide."""
    base = [os.path.basename(os.path.normpath(d)) or os.path.normpath(d) for d in directories]
    if len(set(base)) == len(base):
        return base
    full = [os.path.normpath(d) for d in directories]
    if len(set(full)) != len(full):
        dup = next(d for d in full if full.count(d) > 1)
        raise TraceError(f"trace directory {dup!r} is given twice")
    return full


class TraceSet:
    """Traces analysed as one dataset, checked to share models, tokenizer, sampling and K.

    Parameters
    ----------
    traces : list of Trace objects or directories (glob patterns allowed, e.g. ``"runs/part-*"``)
    verify : bool
        Check every shard's sha256 when opening (as ``Trace``).

    A mismatch in ``SET_FIELDS``, K, the vocabulary or ``tail_known`` raises a TraceError naming
    the field and both directories. Sequence ids may repeat across traces (two dumps of the same
    prompts); within the set a sequence is (trace name, id). ``names`` are the directories'
    basenames (full paths where basenames collide).
    """

    def __init__(self, traces, verify: bool = True):
        items = traces if isinstance(traces, (list, tuple)) else [traces]
        opened = []
        for item in items:
            if isinstance(item, Trace):
                opened.append(item)
            elif isinstance(item, TraceSet):
                opened.extend(item.traces)
            else:
                opened.extend(Trace(d, verify=verify) for d in _expand(item))
        if not opened:
            raise TraceError("a trace set needs at least one trace")
        self.traces = tuple(opened)
        self.names = tuple(_names([t.directory for t in opened]))
        for other in self.traces[1:]:
            bad = _differences(self.traces[0], other, SET_FIELDS)
            if bad:
                _refuse(self.traces[0], other, bad, "traces cannot be analysed together")

    @property
    def metadata(self) -> dict:
        return self.traces[0].metadata

    @property
    def top_k(self) -> int:
        return self.traces[0].top_k

    @property
    def vocab_size(self) -> int:
        return self.traces[0].vocab_size

    @property
    def directory(self) -> str:
        """The directory of a one-trace set, else the directories joined by ', '."""
        return ", ".join(t.directory for t in self.traces)

    @property
    def n_positions(self) -> int:
        return sum(t.n_positions for t in self.traces)

    @property
    def n_shards(self) -> int:
        return sum(t.n_shards for t in self.traces)

    def __len__(self) -> int:
        return sum(len(t) for t in self.traces)

    def __iter__(self) -> Iterator[TraceSequence]:
        for trace in self.traces:
            yield from trace

    def __repr__(self) -> str:
        return f"TraceSet({len(self.traces)} traces, {len(self)} sequences, {self.n_positions} positions)"


def open_traces(traces, verify: bool = True) -> TraceSet:
    """A TraceSet from a Trace, a TraceSet, a directory, a glob pattern or a list of them."""
    return traces if isinstance(traces, TraceSet) else TraceSet(traces, verify=verify)


@contextlib.contextmanager
def _writing(directory, like: Trace, metadata, shard_positions, total, desc, progress, store_full=False):
    """(writer, bar): a TraceWriter for a trace shaped like ``like`` (K, vocabulary, tail), which
    flushes on Ctrl-C / SIGTERM, and a progress bar over ``total`` positions."""
    with (
        termination_as_exception(),
        TraceWriter(
            directory,
            like.vocab_size,
            top_k=like.top_k,
            metadata=metadata,
            shard_positions=shard_positions,
            store_full=store_full,
            tail_known=like.manifest.get("tail_known", True),
        ) as writer,
        progress_bar(total=total, desc=desc, unit="pos", enabled=progress) as bar,
    ):
        yield writer, bar


def merge_traces(out, parts, *, shard_positions=None, progress=None) -> Trace:
    """Merge the parts of a split dump (``dump --part I/N``) into one trace at ``out``.

    The parts (directories or glob patterns) must share every field a resumed dump checks
    (``MERGE_FIELDS``: models, tokenizer, chat template, sampling, dtype, seed, ...), K, the
    vocabulary, ``tail_known`` and whether full rows are stored; their sequence ids must not
    overlap. Each mismatch is refused naming the field and the directories. The sequences are
    written anew (new shards, new checksums) through a ``TraceWriter``: the output directory is
    locked, every file goes through a temporary name, and an interrupted merge resumes (the
    sequences already in ``out`` are skipped). The merged metadata is the parts' common metadata
    without ``part``, with ``merged_from`` listing each part (its ``part``, sequences, positions,
    creation time, device and versions). Returns the merged Trace.
    """
    directories = _expand(parts)
    out_real = os.path.realpath(out)
    for d in directories:
        if os.path.realpath(d) == out_real:
            raise TraceError(f"the output {out!r} is also one of the parts: merge into a new directory")
    traces = [Trace(d, verify=True) for d in directories]
    _names(directories)  # refuses a directory given twice
    first = traces[0]
    for other in traces[1:]:
        bad = _differences(first, other, MERGE_FIELDS, (*_MANIFEST_FIELDS, "store_full"))
        if bad:
            _refuse(first, other, bad, "parts of different dumps cannot be merged")
    owner = {}
    for trace in traces:
        for rec in trace.manifest["sequences"]:
            if rec["id"] in owner:
                raise TraceError(
                    f"sequence id {rec['id']!r} is in both {owner[rec['id']]!r} and {trace.directory!r}: "
                    "parts of one split dump never overlap (was a part dumped twice?)"
                )
            owner[rec["id"]] = trace.directory
    metadata = {k: v for k, v in first.metadata.items() if k not in ("part", "created")}
    metadata["merged_from"] = [
        {
            "part": t.metadata.get("part"),
            "sequences": len(t),
            "positions": t.n_positions,
            **{k: t.metadata[k] for k in ("created", "device", "versions") if k in t.metadata},
        }
        for t in traces
    ]
    size = shard_positions or max([s["positions"] for t in traces for s in t.manifest["shards"]] + [1])
    total = sum(t.n_positions for t in traces)
    store_full = first.manifest.get("store_full", False)
    with _writing(out, first, metadata, size, total, "merge", progress, store_full) as (writer, bar):
        done = writer.done_ids
        for trace in traces:
            for seq in trace:
                if seq.id not in done:
                    compressed = {r: tuple(getattr(seq, k)[r] for k in _STORED) for r in ("target", "draft")}
                    writer.add_compressed(seq.id, seq.task, seq.tokens, compressed, seq.full_logits, seq.meta)
                bar.update(seq.n_positions)
    return Trace(out)


def _concat(pieces, get):
    """The rows [a, b) of ``get(sequence)`` for each (sequence, a, b), end to end."""
    return np.concatenate([get(seq)[a:b] for seq, a, b in pieces])


def synthesize_trace(source, directory, n_positions, *, block=32, seed=0, shard_positions=4096, progress=None):
    """A trace of about ``n_positions`` positions resampled from ``source`` (a block bootstrap).

    Each new sequence takes its length from a source sequence drawn at random and is filled with
    blocks of ``block`` consecutive positions (each drawn uniformly from the source's positions
    that start a full block, a whole sequence where one is shorter), every row copied exactly
    (both models' top-K logits, ids and log-sum-exp, and the token). The per-position
    distributions are the source's; the dependence between positions is kept within blocks and
    broken between them. Sequences are ``synthetic-NNNNNNN`` with the task of their first block;
    the metadata is the source's plus ``synthesized`` (generator, block, seed, positions).
    Deterministic for a given ``seed``. The source is read into memory once. Returns the Trace.
    For benchmarks and tests at scale, not for results about a model pair.
    """
    if not (isinstance(n_positions, (int, np.integer)) and n_positions >= 1):
        raise ValueError(f"n_positions must be an integer >= 1; got {n_positions!r}")
    if not (isinstance(block, (int, np.integer)) and block >= 1):
        raise ValueError(f"block must be an integer >= 1; got {block!r}")
    src = source if isinstance(source, Trace) else Trace(source)
    seqs = list(src)
    if not seqs:
        raise TraceError(f"trace {src.directory!r} holds no sequences to resample")
    rng = np.random.default_rng(seed)
    starts = [(i, s) for i, seq in enumerate(seqs) for s in range(max(seq.n_positions - block, 0) + 1)]
    lengths = np.array([seq.n_positions for seq in seqs])
    metadata = dict(src.metadata)
    metadata["synthesized"] = {
        "generator": "block bootstrap of the source's positions (cactus_theory.synthesize_trace)",
        "block": int(block),
        "seed": int(seed),
        "positions": int(n_positions),
        "source_sequences": len(seqs),
        "source_positions": src.n_positions,
    }
    written, number = 0, 0
    with _writing(directory, src, metadata, shard_positions, int(n_positions), "synthesize", progress) as (writer, bar):
        while written < n_positions:
            length = int(min(lengths[rng.integers(len(lengths))], n_positions - written))
            pieces, task, have = [], None, 0
            while have < length:
                i, s = starts[rng.integers(len(starts))]
                seq = seqs[i]
                take = min(block, seq.n_positions - s, length - have)
                pieces.append((seq, s, s + take))
                task = task or seq.task
                have += take
            seq_id = f"synthetic-{number:07d}"
            if seq_id not in writer.done_ids:  # a resumed run draws the same pieces, copies only the new
                compressed = {
                    r: tuple(_concat(pieces, lambda q, r=r, k=k: getattr(q, k)[r]) for k in _STORED)
                    for r in ("target", "draft")
                }
                writer.add_compressed(seq_id, task, _concat(pieces, lambda q: q.tokens), compressed)
            number += 1
            written += length
            bar.update(length)
    return Trace(directory)
