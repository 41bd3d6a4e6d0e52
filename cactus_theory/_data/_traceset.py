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
import json
import os
from collections.abc import Iterator

import numpy as np

from .._math._validation import check_int, is_integer
from .._util._files import refuse_overlap, termination_as_exception
from .._util._progress import progress_bar
from ._trace import Trace, TraceSequence
from ._trace_format import RESUME_FIELDS, TraceError, _show, metadata_differences
from ._trace_writer import TraceWriter

__all__ = [
    "MERGE_FIELDS",
    "SET_FIELDS",
    "TraceSet",
    "merge_traces",
    "open_traces",
    "synthesize_trace",
    "trace_fingerprint",
    "unfinished",
]

#: Metadata that the traces of one set must share (models by file hashes), besides K, the
#: vocabulary and whether the tail mass is known.
SET_FIELDS = ("verifier", "draft", "tokenizer_sha256", "sampling")
#: Metadata that the parts of one split dump must share: every field a resumed dump checks.
MERGE_FIELDS = tuple(f for f in RESUME_FIELDS if f not in ("part", "batch"))
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


def _refuse_repeats(directories) -> None:
    """Refuse a directory given twice: by its real path (``runs/a`` and ``$(realpath runs/a)``,
    or a symbolic link to it inside a glob), not by its spelling."""
    seen = {}
    for d in directories:
        real = os.path.realpath(d)
        if real in seen:
            first = seen[real]
            same = f"{d!r}" if os.path.normpath(first) == os.path.normpath(d) else f"{first!r} and {d!r}"
            raise TraceError(
                f"trace directory {same} is given twice (both are {real!r}): each sequence would count twice"
            )
        seen[real] = d


def _names(directories) -> list[str]:
    """Short unique names: the basenames, or the normalised paths where basenames collide."""
    _refuse_repeats(directories)
    base = [os.path.basename(os.path.normpath(d)) or os.path.normpath(d) for d in directories]
    if len(set(base)) == len(base):
        return base
    return [os.path.normpath(d) for d in directories]


def trace_fingerprint(trace: Trace) -> str:
    """The identity of a trace's content: the sha256 of its sequence ids and shard checksums.

    Equal for two copies of one trace; a merge records its parts' fingerprints (``merged_from``),
    so a trace set can tell a merged trace from its parts, and a resumed merge its parts."""
    import hashlib

    ids = sorted(s["id"] for s in trace.manifest["sequences"])
    shards = [s["sha256"] for s in trace.manifest["shards"]]
    return hashlib.sha256(json.dumps([ids, shards]).encode()).hexdigest()


def _refuse_overlapping_traces(traces) -> None:
    """Refuse a set in which one trace holds another's sequences: a copy of it, or a merge of it."""
    prints = [trace_fingerprint(t) for t in traces]
    for i, t in enumerate(traces):
        for j in range(i):
            if prints[i] == prints[j]:
                raise TraceError(
                    f"{t.directory!r} and {traces[j].directory!r} hold the same sequences (one is a copy of the "
                    "other): analyse one of them"
                )
    for i, t in enumerate(traces):
        parts = {m.get("fingerprint") for m in t.metadata.get("merged_from") or [] if isinstance(m, dict)}
        for j, other in enumerate(traces):
            if i != j and prints[j] in parts:
                raise TraceError(
                    f"{t.directory!r} is merged from {other.directory!r}, so the set would count its sequences "
                    "twice: analyse the merged trace or its parts, not both (a glob such as 'parts/*' can match "
                    "a merge's output)"
                )


def unfinished(trace: Trace) -> str | None:
    """Why ``trace`` is an unfinished merge or synthesis (a run killed before its end: fewer
    sequences or positions than its metadata promises), or None. Such a trace is refused by trace
    sets (and so by every analysis) and as a synthesis source: rerun the command that wrote it,
    with the same arguments, to finish it."""
    parts = trace.metadata.get("merged_from")
    if isinstance(parts, list) and parts and all(isinstance(r, dict) and _is_count(r.get("sequences")) for r in parts):
        promised = sum(r["sequences"] for r in parts)
        if len(trace) < promised:
            return (
                f"trace {trace.directory!r} is an unfinished merge: it holds {len(trace)} of the {promised} sequences "
                "its parts have (the merge was stopped): rerun 'cactus-theory merge' with the same parts and --out "
                "to finish it"
            )
    made = trace.metadata.get("synthesized")
    if isinstance(made, dict) and _is_count(made.get("positions")) and trace.n_positions < made["positions"]:
        return (
            f"trace {trace.directory!r} is an unfinished synthesis: it holds {trace.n_positions} of the "
            f"{made['positions']} positions asked for (the run was stopped): rerun synthesize_trace with the same "
            "arguments to finish it"
        )
    return None


def _is_count(value) -> bool:
    return is_integer(value) and value >= 0


class TraceSet:
    """Traces analysed as one dataset, checked to share models, tokenizer, sampling and K.

    Parameters
    ----------
    traces : list of Trace objects or directories (glob patterns allowed, e.g. ``"runs/part-*"``)
    verify : bool
        Check every shard's sha256 when opening (as ``Trace``).

    A mismatch in ``SET_FIELDS``, K, the vocabulary or ``tail_known`` raises a TraceError naming
    the field and both directories. Sequence ids may repeat across traces (two dumps of the same
    prompts); within the set a sequence is (trace name, id). What would count data twice is
    refused: a directory given twice (compared by real path, so a symbolic link or an absolute
    spelling of a relative path is the same directory), two copies of one trace (same
    ``trace_fingerprint``), and a merged trace together with one of its parts. ``names`` are the
    directories' basenames (full paths where basenames collide).
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
        for trace in opened:
            reason = unfinished(trace)
            if reason:
                raise TraceError(reason)
        self.traces = tuple(opened)
        self.names = tuple(_names([t.directory for t in opened]))
        _refuse_overlapping_traces(self.traces)
        for other in self.traces[1:]:
            bad = _differences(self.traces[0], other, SET_FIELDS)
            if bad:
                _refuse(self.traces[0], other, bad, "traces cannot be analysed together")

    @property
    def metadata(self) -> dict:
        return self.traces[0].metadata

    @property
    def sampling(self):
        """The sampling settings the traces share (``Trace.sampling``), checked."""
        return self.traces[0].sampling

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


#: The traces embedded in the package: the default one (GSM8K, HumanEval, MT-Bench; the HF path
#: in bfloat16) and Spec-Bench's translation, summarization, qa, math_reasoning and rag
#: categories (llama.cpp), the same model pair and sampling.
EMBEDDED_TRACES = ("default_trace", "spec_bench_trace")


def embedded_traces(tasks=None, verify: bool = True) -> TraceSet:
    """The embedded trace set for ``tasks``: the default trace alone when no task is asked for or
    it holds every task asked for (so every default number stays the default trace's), else every
    embedded trace (``EMBEDDED_TRACES``), from which the analysis keeps the tasks asked for."""
    paths = _embedded_paths()
    default = Trace(paths[0], verify=verify)
    if not tasks or set(tasks) <= {s["task"] for s in default.manifest["sequences"]}:
        return TraceSet(default)
    return TraceSet([default, *(Trace(p, verify=verify) for p in paths[1:])])


def _embedded_paths() -> list:
    """The directories of the ``EMBEDDED_TRACES`` the package holds, the default first."""
    from importlib import resources

    root = resources.files("cactus_theory") / "data"
    return [str(root / name) for name in EMBEDDED_TRACES if (root / name / "manifest.json").is_file()]


def embedded_tasks() -> dict:
    """{task: the embedded trace that holds it} over ``EMBEDDED_TRACES``."""
    out = {}
    for path in _embedded_paths():
        for rec in Trace(path, verify=False).manifest["sequences"]:
            out.setdefault(rec["task"], os.path.basename(path))
    return out


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


def _part_of(trace: Trace):
    """(I, N) of a part of a split dump (its metadata's ``part``, "I/N"), or None for a whole dump."""
    text = trace.metadata.get("part")
    if text is None:
        return None
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise TraceError(f"{trace.directory!r} has part = {text!r}, not I/N: the manifest is corrupt") from None
    if not 1 <= i <= n:
        raise TraceError(f"{trace.directory!r} has part = {text!r}, outside 1 <= I <= N: the manifest is corrupt")
    return i, n


def _completeness(traces, allow_partial: bool):
    """None for a complete split dump (parts 1..N of one N, each once); else what is missing, as
    recorded in a partial merge's metadata. Raises unless ``allow_partial``."""
    parts = [_part_of(t) for t in traces]
    seen = {}
    for t, part in zip(traces, parts, strict=True):
        if part is not None and part in seen:
            raise TraceError(
                f"{seen[part]!r} and {t.directory!r} are both part {part[0]}/{part[1]}: a part is merged once"
            )
        seen[part] = t.directory
    whole = [t.directory for t, part in zip(traces, parts, strict=True) if part is None]
    totals = sorted({part[1] for part in parts if part})
    problems = []
    if whole:
        kind = "is a whole dump" if len(whole) == 1 else "are whole dumps"
        problems.append(f"{', '.join(map(repr, whole))} {kind}, not a part of a split dump (dump --part I/N)")
    if len(totals) > 1:
        problems.append(f"the parts come from splits into {' and '.join(map(str, totals))} parts")
    missing = []
    if len(totals) == 1:
        have = {i for i, _ in (p for p in parts if p)}
        missing = [f"{i}/{totals[0]}" for i in range(1, totals[0] + 1) if i not in have]
        if missing:
            problems.append(f"part(s) {', '.join(missing)} are missing")
    if not problems:
        return None
    if not allow_partial:
        raise TraceError(
            f"not a complete split dump: {'; '.join(problems)}. Merge every part 1..N of one split "
            "(analyse whole dumps together with 'cactus-theory analyze A B' instead), or pass "
            "--allow-partial (allow_partial=True) to merge them anyway, marked partial"
        )
    return {"missing": missing, "whole_dumps": len(whole), "splits": totals, "reason": "; ".join(problems)}


def _part_record(t: Trace) -> dict:
    return {
        "part": t.metadata.get("part"),
        "sequences": len(t),
        "positions": t.n_positions,
        "fingerprint": trace_fingerprint(t),
        **{k: t.metadata[k] for k in ("created", "device", "versions") if k in t.metadata},
    }


def _check_merge_resume(out, records) -> None:
    """A merge into an existing directory resumes only the same merge: refuse a trace that no merge
    wrote, and a merge of other parts (naming them)."""
    from ._trace_format import _read_manifest

    if not os.path.lexists(os.path.join(str(out), "manifest.json")):
        return
    previous = _read_manifest(str(out))["metadata"].get("merged_from")
    if not isinstance(previous, list):
        raise TraceError(
            f"the output {str(out)!r} is an existing trace that no merge wrote: merge into a new directory"
        )

    def key(rec):
        if not isinstance(rec, dict):
            return repr(rec)
        return rec.get("fingerprint") or json.dumps([rec.get(k) for k in ("part", "sequences", "positions", "created")])

    def label(rec):
        return f"part {rec.get('part')}" if isinstance(rec, dict) and rec.get("part") else "a whole dump"

    before, now = {key(r): r for r in previous}, {key(r): r for r in records}
    if set(before) != set(now):
        gone = [label(before[k]) for k in before if k not in now]
        new = [label(now[k]) for k in now if k not in before]
        detail = []
        if gone:
            detail.append(f"not given now: {', '.join(gone)}")
        if new:
            detail.append(f"new or changed since: {', '.join(new)}")
        detail = "; ".join(detail)
        raise TraceError(
            f"{str(out)!r} holds a merge of other parts ({detail}): a rerun resumes only the same parts; merge "
            "into a new directory"
        )


def merge_traces(out, parts, *, shard_positions=None, progress=None, allow_partial=False) -> Trace:
    """Merge the parts of a split dump (``dump --part I/N``) into one trace at ``out``.

    The parts (directories or glob patterns) must be a complete split: parts 1..N of one N, each
    once (``allow_partial=True`` merges an incomplete set, parts of different splits or whole
    dumps anyway, and marks the result ``partial`` in its metadata, with what is missing). They
    must share every field a resumed dump checks (``MERGE_FIELDS``: models, tokenizer, chat
    template, sampling, dtype, seed, ...), K, the vocabulary, ``tail_known`` and whether full rows
    are stored; their sequence ids must not overlap. Each mismatch is refused naming the field and
    the directories. ``out`` is never one of the parts, nor an existing trace that no merge wrote.
    The sequences are written anew (new shards, new checksums) through a ``TraceWriter``: the
    output directory is locked, every file goes through a temporary name, and an interrupted merge
    resumes when rerun with the same parts (the sequences already in ``out`` are skipped); a rerun
    with other parts (or parts that changed since) is refused, naming them. The merged metadata is
    the parts' common metadata without ``part``, with ``merged_from`` listing each part (its
    ``part``, sequences, positions, ``trace_fingerprint``, creation time, device and versions).
    Returns the merged Trace.
    """
    directories = _expand(parts)
    out_real = os.path.realpath(out)
    for d in directories:
        if not os.path.isdir(d):
            raise TraceError(f"part {d!r} is not a trace directory" + (" (it is a file)" if os.path.exists(d) else ""))
        if os.path.realpath(d) == out_real:
            raise TraceError(f"the output {str(out)!r} is also one of the parts: merge into a new directory")
        try:
            refuse_overlap(out, [d], what="the output")
        except ValueError as exc:
            raise TraceError(f"{exc} (merge into a new directory beside the parts)") from None
    _names(directories)  # refuses a directory given twice
    traces = [Trace(d, verify=True) for d in directories]
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
    partial = _completeness(traces, allow_partial)
    records = [_part_record(t) for t in traces]
    _check_merge_resume(out, records)
    metadata = {k: v for k, v in first.metadata.items() if k not in ("part", "created", "partial")}
    metadata["merged_from"] = records
    if partial is not None:
        metadata["partial"] = partial
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
    check_int(n_positions, "n_positions", 1)
    check_int(block, "block", 1)
    src = source if isinstance(source, Trace) else Trace(source)
    if unfinished(src):
        raise TraceError(unfinished(src))
    try:
        refuse_overlap(directory, [src.directory], what="the output")
    except ValueError as exc:
        raise TraceError(f"{exc} (synthesize into a new directory)") from None
    seqs = [seq for seq in src if seq.n_positions > 0]  # an empty sequence has no block to draw
    if not seqs:
        raise TraceError(f"trace {src.directory!r} holds no sequences with positions to resample")
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
