"""Traces from arrays another tool made: raw logits per position (``trace_from_arrays``) and the
top-K log-probabilities an engine returns (``import_topk_logprobs``), written through the one
writer, so the result is an ordinary trace."""

from __future__ import annotations

import itertools

import numpy as np

from ._trace import Trace
from ._trace_format import DEFAULT_TOP_K, TraceError
from ._trace_writer import TraceWriter

__all__ = ["import_topk_logprobs", "trace_from_arrays"]


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
