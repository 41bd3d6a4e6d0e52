"""Dump logit traces from real models (Hugging Face ids, local directories or GGUF files).

The verifier generates ``batch`` sequences at once with the given sampling settings, one token per
sequence and step (a KV cache slot each: ``_slots.SlotModel`` on the Hugging Face engine, one
sequence each of a llama.cpp context), and the draft reads the same tokens in the same steps, so
its next-token logits come on the same prefixes. When a sequence ends, the next prompts take the
free slots. The processing, the sampling, the top-K and the log-sum-exp of every row run where the
model ran (``_device``), and one copy per step brings the whole batch's rows to the host. Or, with
``completions``, both models are teacher-forced on token sequences you already have (outputs you
served, the verifier-alone run of a benchmark): one forward pass per model and sequence, nothing
generated. Resumes: prompts already in the trace are skipped (``_data._dump_session``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .._data._dump_session import DumpSession, DumpSummary
from .._data._prompts import prompt_seed, select_part
from .._data._trace_format import DEFAULT_TOP_K, SAMPLER, TraceError, stored_metadata
from .._math._sampling import SamplingSettings
from .._math._validation import check_count, check_int, is_integer
from .._util._files import json_lines, utc_timestamp
from ._hf import (
    default_threads,
    encode_chat,
    engine_of,
    eos_ids,
    load_model,
    software_versions,
    tokenizer_hash,
    torch_threads,
)
from ._slots import to_device

__all__ = ["DumpSummary", "dump_trace", "load_completions", "prefill_group"]


def load_completions(path) -> dict[str, list[int]]:
    """{prompt id: token ids} from a JSON Lines file of ``{"id": ..., "token_ids": [...]}`` records
    (ids as the prompt loaders make them: ``"gsm8k-0"``, ``"humaneval-3"``, ...)."""
    if not os.path.isfile(path):
        raise ValueError(f"completions file {str(path)!r} does not exist")
    expected = "expected a JSON object with 'id' and 'token_ids' (a list of token ids)"
    out = {}
    for n, rec in json_lines(path, expected):
        try:
            key, tokens = rec["id"], rec["token_ids"]
        except (KeyError, TypeError):
            raise ValueError(f"{path}, line {n}: {expected}") from None
        if key in out:
            raise ValueError(f"{path}, line {n}: prompt id {key!r} appears twice")
        out[key] = tokens
    if not out:
        raise ValueError(f"{path} holds no completions")
    return out


def _check_completions(completions, prompts, max_new_tokens):
    """{prompt id: list of int token ids} for every prompt, or a ValueError naming the problem."""
    if not hasattr(completions, "keys"):
        raise TypeError(f"completions must map prompt ids to token-id lists; got {type(completions).__name__}")
    missing = [p.id for p in prompts if p.id not in completions]
    if missing:
        raise ValueError(
            f"completions has no tokens for {len(missing)} prompt(s), e.g. {missing[:3]}: give every prompt's "
            "token ids, or pass only the prompts you have completions for"
        )
    out = {}
    for p in prompts:
        tokens = np.asarray(completions[p.id])
        if tokens.ndim != 1 or tokens.size == 0 or not np.issubdtype(tokens.dtype, np.integer) or tokens.min() < 0:
            raise ValueError(
                f"completions[{p.id!r}] must be a non-empty 1-D sequence of non-negative integer token ids "
                "(tokenize text with the verifier's tokenizer first)"
            )
        if tokens.size > max_new_tokens:
            raise ValueError(
                f"completions[{p.id!r}] has {tokens.size} tokens, more than max_new_tokens={max_new_tokens}: "
                "pass the max_new_tokens the completions were generated with"
            )
        out[p.id] = [int(t) for t in tokens]
    return out


def prefill_group(batch: int) -> int:
    """Prompts that enter a dump of ``batch`` sequences together (one prefill forward for them): an
    eighth of the batch, at least 1. Groups are fixed by the prompts' order, so a resumed dump
    prefills every prompt in the same company (and so to the same bits) as a run straight through."""
    return max(1, int(batch) // 8)


def dump_trace(
    verifier,
    draft,
    prompts,
    out,
    *,
    completions=None,
    settings=None,
    max_new_tokens=128,
    device="cpu",
    dtype="float32",
    seed=0,
    top_k=DEFAULT_TOP_K,
    limit=None,
    store_full=False,
    shard_positions=2048,
    progress=None,
    cache=True,
    part=None,
    threads=None,
    engine="hf",
    batch=None,
    context=None,
) -> DumpSummary:
    """Dump a trace of ``prompts`` (``Prompt`` objects) into directory ``out``; resumable.

    Without ``completions`` the verifier samples each continuation (``settings``, at most
    ``max_new_tokens``); ``batch`` sequences are generated at once (a KV cache slot each; default: 1,
    or the batch a resumed trace was dumped with), and when
    one ends the next prompts take the free slots (``prefill_group(batch)`` prompts enter together,
    in the prompts' order). Each prompt draws its random numbers from its own stream, seeded by
    ``seed`` and the prompt's id (``prompt_seed``; splitmix64 uniforms per position, recorded as
    ``sampler``), so its tokens do not depend on the prompts beside it, the batch size, an
    interruption or ``limit``; its logits do not either, up to the rounding of the batch's shapes
    (float32: ~1e-6 relative; bfloat16 on a GPU: ~1e-2, where a token whose uniform falls that
    close to a boundary of the cumulative distribution may differ and the rest of that sequence
    with it). With ``completions`` (a mapping from each prompt's id to the token ids generated
    after it, end-of-sequence token included if the output ended with one) nothing is sampled: the
    verifier and the draft are teacher-forced on those tokens, one forward pass each; the metadata
    records ``"teacher_forced": true``. Use it to trace outputs you already have, as long as they
    are: a trace predicts acceptance only over the positions it holds. ``max_new_tokens`` is then
    the limit the completions were generated with (recorded as the trace's horizon).

    The directory is locked while the dump runs; the completed sequences held in memory are written
    out on Ctrl-C, SIGTERM or an error before it stops (``shard_positions`` bounds what a SIGKILL can
    lose). A rerun resumes: prompts the trace holds are skipped, and every step of the rest has the
    shape it had in a run straight through (the same batch, the same prefill groups, attention over
    the same fixed span: the recorded ``attention_span``), so the resumed trace equals the
    uninterrupted one bit for bit on the same machine. Resuming checks the models (file hashes),
    tokenizer, chat template, sampling settings, sampler, dtype, seed, K, batch and max_new_tokens
    against the trace and refuses a mismatch naming the field.

    GGUF models are dequantised once and cached (``load_model``; ``cache=False`` skips it).
    Models are recorded by identity (name, source, file sha256 and size), never by local path.

    ``part=(I, N)`` dumps only part I of N of the prompts (``select_part``: chosen by prompt id,
    so N hosts or GPUs given the same prompts and settings split them without talking to each
    other); each part goes into its own directory and ``merge_traces`` (``cactus-theory
    merge``) combines them. The metadata records ``part`` ("I/N") and a resume checks it.

    ``threads``: torch's intra-op threads for the forward passes (default: the cores this process
    may use, ``default_threads``), recorded in the metadata; a resumed dump uses the trace's, so it
    gives the uninterrupted dump's numbers bit for bit whatever the caller's torch setting (a CPU
    forward's rounding depends on the thread count).

    ``engine``: "hf" (transformers; GGUF files dequantised) or "llama.cpp" (GGUF files run by
    llama.cpp's quantised kernels, ``_llamacpp``; ``dtype`` and ``cache`` do not apply), recorded
    as ``engine`` (a resume on the other engine is refused: their logits differ by rounding).
    ``device`` (recorded) is where the models, the KV caches and the rows' processing live.

    Returns a ``DumpSummary`` (prompts and positions written by this call, the trace's totals, the
    seconds and positions per second).
    """
    settings = settings or SamplingSettings()
    prompt_seed(seed, "")  # the seed is checked before any model is loaded
    if threads is not None:
        check_int(threads, "threads", 1, what="torch's threads for the forward passes")
    if limit is not None:
        check_int(limit, "limit", 0, what="prompts to dump in this run")
    if batch is not None:
        check_count(batch, "batch", what="sequences generated at once")
    check_count(max_new_tokens, "max_new_tokens")
    if part is not None:
        if not (isinstance(part, (tuple, list)) and len(part) == 2):
            raise ValueError(f"part must be (I, N), part I of N; got {part!r}")
        prompts = select_part(prompts, *part)
    if completions is not None:
        completions = _check_completions(completions, prompts, max_new_tokens)
    if batch is None:  # a resume keeps the trace's batch (its shapes: the same bits as a run straight through)
        recorded = (stored_metadata(out) or {}).get("batch", 1)
        batch = recorded if is_integer(recorded) and recorded >= 1 else 1

    options = {"engine": engine, "sequences": int(batch)} if engine != "hf" else {}
    if context is not None:  # llama.cpp: tokens each sequence's context holds
        options["context"] = context
    v_model, v_tok, v_info = load_model(verifier, device, dtype, cache=cache, progress=progress, **options)
    d_model, _d_tok, d_info = load_model(draft, device, dtype, cache=cache, progress=progress, **options)
    vocab = v_model.config.vocab_size if hasattr(v_model.config, "vocab_size") else None
    d_vocab = d_model.config.vocab_size if hasattr(d_model.config, "vocab_size") else None
    if vocab != d_vocab:
        raise TraceError(f"draft vocabulary {d_vocab} != verifier vocabulary {vocab}: they must share one tokenizer")
    ids = {p.id: encode_chat(v_tok, p.text, f"prompt {p.id!r}") for p in prompts}
    metadata = {
        "verifier": v_info,
        "draft": d_info,
        "tokenizer_sha256": tokenizer_hash(v_tok),
        "chat_template": getattr(v_tok, "chat_template", None),
        "sampling": settings.as_dict(),
        "sampler": SAMPLER,
        "engine": engine,
        "dtype": str(dtype) if engine == "hf" else "gguf as stored",
        "device": str(device),
        "batch": int(batch),
        "prefill_group": prefill_group(batch),
        "seed": int(seed),
        "seeding": "per prompt: sha256 of the prompt id with the seed (prompt_seed)",
        "max_new_tokens": int(max_new_tokens),
        "teacher_forced": completions is not None,
        "threads": int(threads) if threads is not None else default_threads(),
        "attention_span": max((len(x) for x in ids.values()), default=1) + int(max_new_tokens),
        "versions": software_versions(engine),
        "created": utc_timestamp(),
    }
    if part is not None:
        metadata["part"] = f"{int(part[0])}/{int(part[1])}"
    eos = eos_ids(v_model, v_tok)
    with DumpSession(
        out,
        prompts,
        vocab,
        top_k=top_k,
        metadata=metadata,
        limit=limit,
        store_full=store_full,
        shard_positions=shard_positions,
        progress=progress,
    ) as session:
        # the trace's own thread count and span, so that a resumed dump rounds as the first run did
        for key in ("threads", "attention_span"):
            recorded = session.metadata.get(key)
            if is_integer(recorded) and recorded >= 1:
                metadata[key] = max(recorded, metadata[key]) if key == "attention_span" else recorded
        for model in (v_model, d_model):
            if engine_of(model) == "llama.cpp":
                model.set_threads(metadata["threads"])
        with torch_threads(metadata["threads"]):
            if completions is not None:
                _dump_teacher_forced(session, v_model, d_model, ids, completions, vocab, top_k, store_full)
            else:
                todo = {p.id for p in session.todo}
                _dump_sampled(
                    session,
                    prompts,
                    todo,
                    ids,
                    (v_model, d_model),
                    settings,
                    max_new_tokens,
                    seed,
                    eos,
                    top_k,
                    store_full,
                    int(batch),
                    metadata["attention_span"],
                )
    return session.summary


def _meta(prompt, prompt_ids):
    return {"source": prompt.source, "prompt_tokens": len(prompt_ids)}


def _host_rows(packed, k):
    """The compressed rows of one model from a packed host row block: (values, ids, lse)."""
    return (packed[:, :k].astype(np.float32), packed[:, k : 2 * k].astype(np.int32), packed[:, 2 * k])


def _pack(rows, k):
    """A model's compressed rows as float64 columns [top-K logits | ids | lse | NaN flag] (device)."""
    import torch

    values, ids, lse, nan = _compress(rows, k)
    return torch.cat([values.double(), ids.double(), lse[:, None], nan.double()[:, None]], dim=1)


def _compress(rows, k):
    from ._device_rows import compress_rows

    return compress_rows(rows, k)


def _dump_teacher_forced(session, v_model, d_model, ids, completions, vocab, k, store_full):
    """Both models teacher-forced on each prompt's completion: one forward per model and prompt."""
    for prompt in session.todo:
        tokens = completions[prompt.id]
        if vocab is not None and max(tokens) >= vocab:
            raise ValueError(
                f"completions[{prompt.id!r}] holds token id {max(tokens)}, outside the verifier's "
                f"vocabulary of {vocab}: tokenize the completions with the verifier's tokenizer"
            )
        packed, full = [], {}
        for role, model in (("target", v_model), ("draft", d_model)):
            rows = _forced_rows(model, ids[prompt.id], tokens)
            packed.append(_pack(rows, k).cpu().numpy())
            if store_full:
                full[role] = rows.float().cpu().numpy()
        session.add(
            prompt, np.asarray(tokens), _compressed(packed, k, prompt), full or None, _meta(prompt, ids[prompt.id])
        )


def _forced_rows(model, prompt_ids, tokens):
    """``model``'s raw logit rows (T, V) before each of the T ``tokens`` after the prompt, as a tensor
    on the model's device (one forward over prompt + tokens[:-1]; llama.cpp: ``teacher_forced``)."""
    import torch

    if engine_of(model) == "llama.cpp":
        return torch.from_numpy(model.teacher_forced(prompt_ids, tokens))
    device = next(model.parameters()).device
    full = torch.tensor([list(prompt_ids) + list(tokens[:-1])], device=device)
    with torch.no_grad():
        return model(input_ids=full).logits[0, len(prompt_ids) - 1 :]


def _compressed(packed, k, prompt):
    """{"target": ..., "draft": ...} from the two packed host blocks, or a TraceError for NaN rows."""
    out = {}
    for role, block in zip(("target", "draft"), packed, strict=True):
        if block[:, 2 * k + 1].any():
            raise TraceError(
                f"the {role} model's logits contain NaN for prompt {prompt.id!r} (overflow in float16?): "
                "dump in float32 or bfloat16"
            )
        out[role] = _host_rows(block, k)
    return out


class _Engine:
    """One model's side of a batched dump: ``slots`` sequences, a group's prefill, a step of the
    running sequences. Hugging Face models run as a ``SlotModel`` attending over a fixed span (every
    step one shape: see ``_slots``); llama.cpp models through their own sequences."""

    def __init__(self, model, slots, span):
        import torch

        self.torch = torch
        if engine_of(model) == "llama.cpp":
            self.slots, self.model, self.device = None, model, torch.device("cpu")
        else:
            from ._slots import SlotModel

            self.slots = SlotModel(model, slots, context=span, fixed_span=True)
            self.model, self.device = self.slots, self.slots.device

    def open(self):
        return self.model.sequence()

    def prefill(self, seqs, prompts_ids):
        """The raw logit rows (G, V) after each prompt, fed to a fresh sequence each (one forward)."""
        torch = self.torch
        if self.slots is None:
            return torch.cat(
                self.model.evaluate([(q, list(x), "last") for q, x in zip(seqs, prompts_ids, strict=True)])
            )
        width = max(len(x) for x in prompts_ids)
        padded = [[self.slots.pad_token] * (width - len(x)) + list(x) for x in prompts_ids]
        ids = to_device(torch, padded, self.device)
        return self.slots.forward_rows([q.slot for q in seqs], ids, [len(x) for x in prompts_ids], "last")

    def step(self, seqs, tokens):
        """The raw logit rows (A, V) after feeding ``tokens`` (a tensor, one per sequence): every slot
        runs (the free ones as padding), so the step's shape does not depend on which are busy."""
        torch = self.torch
        if self.slots is None:
            return torch.cat(
                self.model.evaluate([(q, [t], "last") for q, t in zip(seqs, tokens.tolist(), strict=True)])
            )
        every = self.slots.sequences
        busy = to_device(torch, [q.slot for q in seqs], self.device)
        ids = torch.full((every, 1), self.slots.pad_token, dtype=torch.int64, device=self.device)
        ids.index_copy_(0, busy, tokens.to(torch.int64)[:, None])
        counts = [0] * every
        for q in seqs:
            counts[q.slot] = 1
        logits = self.slots.forward_rows(list(range(every)), ids, counts, "last", all_slots=True)
        return logits.index_select(0, busy)


class _Live:
    """A sequence being generated: its prompt, seed, sequences (verifier, draft), tokens and rows."""

    def __init__(self, prompt, seed, seqs):
        self.prompt, self.seed, self.seqs = prompt, seed, seqs
        self.tokens, self.rows, self.full = [], [], []


def _dump_sampled(session, prompts, todo, ids, models, settings, max_new_tokens, seed, eos, k, store_full, batch, span):
    """Generate every prompt of ``todo`` ``batch`` at a time (see ``dump_trace``) into ``session``.

    The schedule is that of a run straight through: groups of ``prefill_group(batch)`` prompts in
    order enter when that many slots are free, and a prompt the trace holds already occupies its slot
    for as many steps as it has positions without being computed (its slot is padding in the steps).
    So every prompt computed here sits in the slot, and every step has the shape, it had in a run
    straight through: a row's rounding depends on the shapes and on its place in the batch."""
    import torch

    engines = [_Engine(m, batch, span + 1) for m in models]
    device = engines[0].device
    held = session.writer.sequence_positions
    size = prefill_group(batch)
    last = max(i for i, p in enumerate(prompts) if p.id in todo) if todo else -1
    pending = [prompts[i : i + size] for i in range(0, last + 1, size)][::-1]
    live, resting, rows = {}, {}, [None, None]  # slot -> _Live; slot -> [seqs, steps left]; per model (batch, V)
    run = _Run(session, engines, settings, frozenset(eos), max_new_tokens, k, store_full, ids)
    while pending or live or resting:
        while pending and batch - len(live) - len(resting) >= len(pending[-1]):  # a whole group enters at once
            group = pending.pop()
            seqs = [[e.open() for _ in group] for e in engines]
            if any(p.id in todo for p in group):
                firsts = [e.prefill(s, [ids[p.id] for p in group]) for e, s in zip(engines, seqs, strict=True)]
                slots = to_device(torch, [q.seq_id for q in seqs[0]], device)
                for j, first in enumerate(firsts):
                    if rows[j] is None:
                        rows[j] = torch.zeros((batch, first.shape[-1]), dtype=torch.float32, device=device)
                    rows[j].index_copy_(0, slots, first.float())
            for i, p in enumerate(group):
                pair = (seqs[0][i], seqs[1][i])
                if p.id in todo:
                    live[pair[0].seq_id] = _Live(p, prompt_seed(seed, p.id), pair)
                elif p.id in held:  # in the trace already: holds its slot as long as it ran, computing nothing
                    resting[pair[0].seq_id] = [pair, held[p.id]]
                else:  # beyond --limit: prefilled for its group's shapes only
                    for q in pair:
                        q.close()
        if live:
            _step(run, live, rows)
        for slot in list(resting):
            resting[slot][1] -= 1
            if resting[slot][1] <= 0:
                for q in resting.pop(slot)[0]:
                    q.close()


@dataclass(frozen=True)
class _Run:
    """What every step of a batched dump shares: where rows go, the two engines, the sampling and stop settings,
    the stored width and the prompts' ids."""

    session: object
    engines: list
    settings: object
    eos: frozenset
    max_new_tokens: int
    k: int
    store_full: bool
    ids: dict

    @property
    def device(self):
        return self.engines[0].device

    @property
    def width(self):
        return 2 * self.k + 2


def _step(run, live, rows):
    """One step of every live sequence: sample its token, store its rows, feed the token to both models."""
    import torch

    from ._device_rows import process_rows, row_uniforms, sample_rows

    order = sorted(live)
    index = to_device(torch, order, run.device)
    target, draft = rows[0].index_select(0, index), rows[1].index_select(0, index)
    probs, bad = process_rows(target, run.settings)
    seeds = to_device(torch, [live[s].seed for s in order], run.device)
    where = to_device(torch, [len(live[s].tokens) for s in order], run.device)
    tokens = sample_rows(probs, row_uniforms(seeds, where))
    block = torch.cat([tokens.double()[:, None], bad.double()[:, None], _pack(target, run.k), _pack(draft, run.k)], 1)
    block = block.cpu().numpy()  # the step's one copy to the host
    full = (target.cpu().numpy(), draft.cpu().numpy()) if run.store_full else None
    going = []
    for r, slot in enumerate(order):
        seq = live[slot]
        if block[r, 1]:
            raise TraceError(
                f"the verifier's logits for prompt {seq.prompt.id!r} at position {len(seq.tokens)} "
                "contain NaN or mask every token (overflow in float16?): dump in float32 or bfloat16"
            )
        token = int(block[r, 0])
        seq.tokens.append(token)
        seq.rows.append(block[r, 2:])
        if full is not None:
            seq.full.append((full[0][r], full[1][r]))
        if token in run.eos or len(seq.tokens) >= run.max_new_tokens:
            _finish(run, seq)
            del live[slot]
        else:
            going.append(r)
    if going:
        keep = to_device(torch, going, run.device)
        fed = tokens.index_select(0, keep)
        moving = index.index_select(0, keep)
        for j, engine in enumerate(run.engines):
            out = engine.step([live[order[r]].seqs[j] for r in going], fed)
            rows[j].index_copy_(0, moving, out.float())


def _finish(run, seq):
    """Store a completed sequence and free its slots."""
    stacked = np.stack(seq.rows)
    width = run.width
    packed = [stacked[:, :width], stacked[:, width : 2 * width]]
    full = None
    if run.store_full:
        full = {"target": np.stack([f[0] for f in seq.full]), "draft": np.stack([f[1] for f in seq.full])}
    run.session.add(
        seq.prompt,
        np.asarray(seq.tokens),
        _compressed(packed, run.k, seq.prompt),
        full,
        _meta(seq.prompt, run.ids[seq.prompt.id]),
    )
    for q in seq.seqs:
        q.close()
