"""Dump logit traces from real models (Hugging Face ids, local directories or GGUF files).

The verifier generates with the given sampling settings (KV cache, one token at a time); the
draft's next-token logits on the same prefixes come from one forward pass per sequence. Or, with
``completions``, both models are teacher-forced on token sequences you already have (outputs you
served, the verifier-alone run of a benchmark): one forward pass per model and sequence, nothing
generated. Both raw logit rows are compressed into the trace (top-K + log-sum-exp). Resumes:
prompts already in the trace are skipped.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from .._data._prompts import prompt_seed, select_part
from .._data._trace_format import DEFAULT_TOP_K, TraceError
from .._data._trace_writer import TraceWriter
from .._math._sampling import SamplingSettings
from .._util._files import Terminated, json_lines, termination_as_exception, utc_timestamp
from .._util._progress import progress_bar
from ._hf import (
    default_threads,
    encode_chat,
    engine_of,
    eos_ids,
    generate,
    load_model,
    software_versions,
    teacher_forced_logits,
    tokenizer_hash,
    torch_threads,
)

__all__ = ["dump_trace", "load_completions"]


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
):
    """Dump a trace of ``prompts`` (``Prompt`` objects) into directory ``out``; resumable.

    Without ``completions`` the verifier samples each continuation (``settings``, at most
    ``max_new_tokens``, seeded by ``seed`` and the prompt). With ``completions`` (a mapping from
    each prompt's id to the token ids generated after it, end-of-sequence token included if the
    output ended with one) nothing is sampled: the verifier and the draft are teacher-forced on
    those tokens, one forward pass each; the metadata records ``"teacher_forced": true``. Use it to
    trace outputs you already have, as long as they are: a trace predicts acceptance only over
    the positions it holds. ``max_new_tokens`` is then the limit the completions were generated
    with (recorded as the trace's horizon).

    Each prompt's sampling seed derives from ``seed`` and the prompt's id (``prompt_seed``), so
    an interrupted and resumed dump, or one split with ``limit``, gives the same trace as one
    run straight through. The directory is locked while the dump runs; the completed sequences
    held in memory are written out on Ctrl-C, SIGTERM or an error before it stops
    (``shard_positions`` bounds what a SIGKILL can lose). Resuming checks the models (file
    hashes), tokenizer, chat template, sampling settings, dtype, seed, K and max_new_tokens
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

    Returns the number of positions written by this call.
    """
    settings = settings or SamplingSettings()
    prompt_seed(seed, "")  # the seed is checked before any model is loaded
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1):
        raise ValueError(f"threads must be an integer >= 1 (torch's threads for the forward passes); got {threads!r}")
    if limit is not None and not (isinstance(limit, (int, np.integer)) and limit >= 0):
        raise ValueError(f"limit must be an integer >= 0 (prompts to dump in this run); got {limit!r}")
    if part is not None:
        if not (isinstance(part, (tuple, list)) and len(part) == 2):
            raise ValueError(f"part must be (I, N), part I of N; got {part!r}")
        prompts = select_part(prompts, *part)
    if completions is not None:
        completions = _check_completions(completions, prompts, max_new_tokens)

    options = {"engine": engine} if engine != "hf" else {}  # the llama.cpp engine: one sequence at a time here
    v_model, v_tok, v_info = load_model(verifier, device, dtype, cache=cache, progress=progress, **options)
    d_model, _d_tok, d_info = load_model(draft, device, dtype, cache=cache, progress=progress, **options)
    vocab = v_model.config.vocab_size if hasattr(v_model.config, "vocab_size") else None
    d_vocab = d_model.config.vocab_size if hasattr(d_model.config, "vocab_size") else None
    if vocab != d_vocab:
        raise TraceError(f"draft vocabulary {d_vocab} != verifier vocabulary {vocab}: they must share one tokenizer")
    metadata = {
        "verifier": v_info,
        "draft": d_info,
        "tokenizer_sha256": tokenizer_hash(v_tok),
        "chat_template": getattr(v_tok, "chat_template", None),
        "sampling": settings.as_dict(),
        "engine": engine,
        "dtype": str(dtype) if engine == "hf" else "gguf as stored",
        "device": str(device),
        "seed": int(seed),
        "seeding": "per prompt: sha256 of the prompt id with the seed (prompt_seed)",
        "max_new_tokens": int(max_new_tokens),
        "teacher_forced": completions is not None,
        "threads": int(threads) if threads is not None else default_threads(),
        "versions": software_versions(engine),
        "created": utc_timestamp(),
    }
    if part is not None:
        metadata["part"] = f"{int(part[0])}/{int(part[1])}"
    eos = eos_ids(v_model, v_tok)
    written, start, finished = 0, time.perf_counter(), 0

    def note(message):  # what a user must know, progress bars or not: resumed, stopped, done
        print(message, file=sys.stderr, flush=True)

    def held():
        return writer.positions_held

    with (
        termination_as_exception(),
        TraceWriter(
            out, vocab, top_k=top_k, metadata=metadata, store_full=store_full, shard_positions=shard_positions
        ) as writer,
    ):
        # the trace's own thread count, so that a resumed dump rounds as the first run did
        recorded = writer.metadata.get("threads")
        metadata["threads"] = recorded if isinstance(recorded, int) and recorded >= 1 else metadata["threads"]
        done_before = sum(1 for p in prompts if p.id in writer.done_ids)
        if done_before:
            note(f"resuming {out}: {done_before} of {len(prompts)} prompts done, {held():,} positions in the trace")
        todo = [p for p in prompts if p.id not in writer.done_ids][: limit if limit is not None else None]
        bar = progress_bar(todo, desc="dump", unit="prompt", enabled=progress)
        try:
            for model in (v_model, d_model):
                if engine_of(model) == "llama.cpp":
                    model.set_threads(metadata["threads"])
            with torch_threads(metadata["threads"]):
                _dump_prompts(bar, todo, writer, v_model, v_tok, d_model, completions, settings, max_new_tokens, seed,
                              eos, vocab, start, counters := {"written": 0, "finished": 0})  # fmt: skip
        except (KeyboardInterrupt, Terminated):
            bar.close()
            note(
                f"stopped after {counters['finished']} prompt(s) of this run ({counters['written']:,} positions); "
                f"{done_before + counters['finished']} of {len(prompts)} prompts are in {out} ({held():,} positions): "
                "rerun the same command to resume"
            )
            raise
        bar.close()
        written, finished = counters["written"], counters["finished"]
        total = held()
    note(f"this run: {finished} prompt(s), {written:,} positions; the trace holds {done_before + finished} of "
         f"{len(prompts)} prompts, {total:,} positions")  # fmt: skip
    return written


def _dump_prompts(bar, todo, writer, v_model, v_tok, d_model, completions, settings, max_new_tokens, seed, eos,
                  vocab, start, counters):  # fmt: skip
    """The dump loop of ``dump_trace`` (counters: positions written and prompts finished so far)."""
    import torch

    written = 0
    for prompt in bar:
        prompt_ids = encode_chat(v_tok, prompt.text, f"prompt {prompt.id!r}")
        if completions is None:
            gen = torch.Generator().manual_seed(prompt_seed(seed, prompt.id))
            tokens, target_rows, _ = generate(v_model, prompt_ids, settings, max_new_tokens, gen, eos, keep_logits=True)
        else:
            tokens = completions[prompt.id]
            if vocab is not None and max(tokens) >= vocab:
                raise ValueError(
                    f"completions[{prompt.id!r}] holds token id {max(tokens)}, outside the verifier's "
                    f"vocabulary of {vocab}: tokenize the completions with the verifier's tokenizer"
                )
            target_rows = teacher_forced_logits(v_model, prompt_ids, tokens)
        draft_rows = teacher_forced_logits(d_model, prompt_ids, tokens)
        writer.add(
            prompt.id,
            prompt.task,
            tokens,
            target_rows,
            draft_rows,
            meta={"source": prompt.source, "prompt_tokens": len(prompt_ids)},
        )
        written += len(tokens)
        counters["written"], counters["finished"] = written, counters["finished"] + 1
        bar.set_postfix(prompt=prompt.id, tokens=written, tok_s=f"{written / (time.perf_counter() - start):.1f}")
