"""A logit trace taken over HTTP from the inference servers users already run.

The verifier server samples each prompt's continuation and returns, at every generated position,
its top-K log-probabilities; the draft server is teacher-forced on the verifier's exact token ids
and returns its top-K log-probabilities at the same positions (``_protocol``). Both rows go into an
ordinary trace: the stored "logits" are the normalised log-probabilities and each row's
log-sum-exp is 0, so the tail beyond the top-K has the exactly known mass 1 - sum exp(top-K)
(``tail_known`` true); the analysis is exact for sampling settings with 0 < top_k <= K, as for
any trace.

What is guaranteed:

- alignment is never silent: the two servers' tokenizers are compared before anything is dumped
  (vocabulary sizes, and probe strings through both tokenize endpoints: a mismatch is refused,
  naming the probe); the draft receives the verifier's token ids, and a sequence whose draft
  answer does not line up with them token for token (llama.cpp's grammar not followed, a
  different number of prompt positions) is refused and counted, never analysed shifted;
- many requests are in flight (``concurrency``), each with its time-out and retries (``_http``);
  completed sequences are written in prompt order whatever order they finish in, so the trace
  is the same at any concurrency; the trace lock, temporary names and renames of every writer;
- a rerun resumes: prompts the trace holds are skipped, and one that a dead server left
  incomplete is dumped again from the start (each prompt's sampling seed comes from the seed
  and its id, so it samples the same tokens: a dump interrupted and resumed equals one run
  straight through, bit for bit, on a deterministic server: llama-server with one slot and
  ``cache_prompt`` off, as the dump asks);
- the manifest records each server's URL (without credentials), protocol, engine and version,
  model id and vocabulary, K and the sampling settings; an API key (``api_key_env``) is read from
  the environment and lands nowhere.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass

import numpy as np

from .._data._dump_session import DumpSession, DumpSummary
from .._data._prompts import prompt_seed
from .._data._trace_format import DEFAULT_TOP_K
from .._math._sampling import SamplingSettings
from .._math._validation import check_int
from .._util._files import utc_timestamp
from ._http import ServerError
from ._protocols import AlignmentError, compare_tokenizers, open_server

__all__ = ["ServerDumpSummary", "dump_server_trace"]

#: The summary of a server dump: the one summary type of every dump (``DumpSummary``).
ServerDumpSummary = DumpSummary


def _identity(info):
    """A server's entry in the metadata that a resume compares: what it serves, not where."""
    out = info.as_dict()
    out.pop("url", None)
    out.pop("slots", None)
    return {"server": out}


def dump_server_trace(
    verifier_url,
    draft_url,
    prompts,
    out,
    *,
    settings=None,
    max_new_tokens=128,
    seed=0,
    top_k=DEFAULT_TOP_K,
    limit=None,
    concurrency=1,
    protocol="auto",
    draft_protocol=None,
    api_key_env=None,
    draft_api_key_env=None,
    timeout=600.0,
    retries=4,
    chat=True,
    tokenizer=None,
    vocab_size=None,
    shard_positions=2048,
    progress=None,
) -> DumpSummary:
    """Dump a trace of ``prompts`` (``Prompt`` objects) from two servers into ``out``; resumable.

    ``verifier_url`` generates (``settings``, at most ``max_new_tokens``, seeded per prompt by
    ``seed`` and its id); ``draft_url`` is teacher-forced on its tokens. ``top_k`` is K, the
    log-probs kept per position (at most the servers' limit: vLLM's ``--max-logprobs``, 20 by
    default). ``chat``: apply the verifier server's chat template to each prompt (False: the
    prompt's text as it is). ``tokenizer``: a callable ``(text, chat) -> ids`` for servers without
    a tokenize endpoint (SGLang). ``vocab_size`` where the servers do not state theirs.
    ``concurrency`` requests in flight. See the module docstring for what is guaranteed.
    """
    settings = settings or SamplingSettings()
    prompt_seed(seed, "")
    for name, value, low in (
        ("max_new_tokens", max_new_tokens, 1),
        ("top_k", top_k, 1),
        ("concurrency", concurrency, 1),
        ("shard_positions", shard_positions, 1),
    ):
        check_int(value, name, low)
    if limit is not None:
        check_int(limit, "limit", 0, what="prompts in this run")
    v_client, verifier = open_server(
        verifier_url,
        protocol=protocol,
        api_key_env=api_key_env,
        timeout=timeout,
        retries=retries,
        tokenizer=tokenizer,
        what="--server",
    )
    d_client, draft = open_server(
        draft_url,
        protocol=draft_protocol or protocol,
        api_key_env=draft_api_key_env,
        timeout=timeout,
        retries=retries,
        tokenizer=tokenizer,
        what="--draft-server",
    )
    clients = (v_client, d_client)
    try:
        vocab = compare_tokenizers(verifier, draft)
        if vocab_size is not None:
            if vocab is not None and vocab != vocab_size:
                raise ServerError(f"--vocab-size {vocab_size} disagrees with the servers' vocabulary of {vocab}")
            vocab = int(vocab_size)
        if vocab is None:
            raise ServerError("neither server states its vocabulary size: give --vocab-size (config.json's vocab_size)")
        verifier.known_vocab = draft.known_vocab = vocab
        v_info, d_info = verifier.info(), draft.info()
        metadata = {
            "verifier": _identity(v_info),
            "draft": _identity(d_info),
            "engine": f"server:{v_info.engine}",
            "servers": {"verifier": v_info.as_dict(), "draft": d_info.as_dict()},
            "sampling": settings.as_dict(),
            "seed": int(seed),
            "seeding": "per prompt: sha256 of the prompt id with the seed (prompt_seed)",
            "max_new_tokens": int(max_new_tokens),
            "teacher_forced": False,
            "prompt_format": "chat template of the verifier server" if chat else "raw text",
            "logprobs": "normalised log-probabilities of the raw logits (temperature 1, before samplers); lse = 0",
            "created": utc_timestamp(),
        }
        run = _ServerRun(verifier, draft, clients, settings, int(max_new_tokens), int(seed), int(top_k), bool(chat))
        return _run(run, prompts, out, metadata, vocab, limit, concurrency, shard_positions, progress)
    finally:
        for client in clients:
            client.close()


@dataclass(frozen=True)
class _ServerRun:
    """What every prompt of a server dump shares: the two servers' protocols and clients, the sampling, the
    length, the seed, K and whether the chat template applies (as the batched dump's ``_Run`` is for models)."""

    verifier: object
    draft: object
    clients: tuple
    settings: object
    max_new_tokens: int
    seed: int
    k: int
    chat: bool


def _one(prompt, run):
    """(prompt, ids, generation, draft rows) of one prompt, or (prompt, None, AlignmentError, None)."""
    verifier, draft, settings, k = run.verifier, run.draft, run.settings, run.k
    ids = verifier.prompt_ids(prompt.text, chat=run.chat)
    if not ids:
        raise ServerError(f"prompt {prompt.id!r} tokenizes to nothing: give it some text")
    gen = verifier.generate(ids, settings, run.max_new_tokens, prompt_seed(run.seed, prompt.id), k)
    if not gen.tokens:
        raise ServerError(
            f"--server {verifier.client.public}: an empty completion for prompt {prompt.id!r} (it stopped at once): "
            "check its stop settings, n_predict / max_tokens and the chat template"
        )
    try:
        rows = draft.score(ids, gen.tokens, k, ends=str(gen.finish) in ("eos", "stop"), partial=gen.partial)
    except AlignmentError as exc:
        return prompt, ids, exc, None
    return prompt, ids, gen, rows


def _run(run, prompts, out, metadata, vocab, limit, concurrency, shard_positions, progress):
    """The dump session of a server dump: the prompts still to do, ``concurrency`` in flight, added in prompt
    order."""
    stop = [client.close for client in run.clients]  # in-flight requests end now; what completed is written
    with DumpSession(
        out,
        prompts,
        vocab,
        top_k=run.k,
        metadata=metadata,
        limit=limit,
        shard_positions=shard_positions,
        progress=progress,
        what="dump (server)",
        on_stop=stop,
    ) as session:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=int(concurrency), thread_name_prefix="dump")
        try:
            futures = [pool.submit(_one, p, run) for p in session.todo]
            for future in futures:  # in prompt order: the trace is the same at any concurrency
                prompt, ids, gen, rows = future.result()
                if isinstance(gen, AlignmentError):
                    session.refuse(prompt, gen)
                    continue
                zero = np.zeros(len(gen.tokens))
                compressed = {"target": (gen.logprobs, gen.ids, zero), "draft": (rows[0], rows[1], zero)}
                meta = {"source": prompt.source, "prompt_tokens": len(ids)}
                if gen.finish is not None:
                    meta["finish"] = str(gen.finish)
                if gen.partial:  # asked for alone: prompt processing, not decoding (rounding differs)
                    meta["rescored_positions"] = list(gen.partial)
                session.add(prompt, np.asarray(gen.tokens), compressed, meta=meta)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
    return session.summary
