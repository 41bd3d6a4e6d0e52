"""A cost model measured against running servers: the servers' own step times, over HTTP.

``calibrate_server(verifier_url, draft_url, batches=(1, 2, 4))`` gives a ``CostModel`` whose parts
come from the servers' own timings (llama-server's ``timings``: ``predicted_per_token_ms`` and
``prompt_ms``, measured by the server around its own forward passes, not by this client's clock):

- ``verify_block[1]`` at batch B: the verifier server's time per decoded token while B requests
  decode at once (B concurrent requests, ``ignore_eos``, a fixed length);
- ``verify_block[k]``, k >= 2, at batch B: a step of B sequences verifying k tokens each is one
  forward of B k tokens, timed as the verifier server's processing of B k new tokens after a
  cached prefix of ``context`` tokens (``prompt_ms`` with ``prompt_n`` = B k; B requests sent at
  once race for the server's loop and time a mixture of shared and separate forwards); a
  verification outputs B k rows where prompt processing outputs one, so the B k - 1 more rows'
  unembedding is added, modelled as the share n_vocab n_embd / n_params of one decode step
  (llama-server reports all three in ``/v1/models``; the source says so);
- ``draft_token`` at batch B: the draft server's time per decoded token with B requests at once;
- ``draft_read_token`` at batch B: what one more token per sequence costs the draft server in a
  forward of several (B times the slope of its processing of 1 .. ``max_block`` new tokens after a
  cached prefix):
  llama-server's drafter processes the verifier's block of L + 1 tokens in one such forward every step;
- ``prefill``: each server's processing of prompts of ``prompt_lengths`` tokens (batch 1).

Only llama-server reports these timings; another engine is refused with a message saying so.
Every part is the median of ``repeats`` timed requests (the repeats are kept: the planner's
intervals draw from them). The servers should run nothing else meanwhile, with ``--parallel``
at least the largest batch.
"""

from __future__ import annotations

import concurrent.futures
import platform

import numpy as np

from .._math._validation import check_int, is_integer
from .._util._files import utc_timestamp
from ._http import ServerClient, ServerError, shown
from ._protocol import protocol_class
from ._protocols import detect_protocol, open_server, protocol_names

__all__ = ["calibrate_server", "server_requests"]

FILLER = (
    "The quick brown fox jumps over the lazy dog while the five boxing wizards jump quickly. "
    "Pack my box with five dozen liquor jugs; how vexingly quick daft zebras jump. "
)


def _ids(speaker, n, salt=0):
    """``n`` token ids of plain English text (the salt shifts where the text starts: distinct prefixes)."""
    base = speaker.prompt_ids(FILLER * 4, chat=False, special=False)
    if not base:
        raise ServerError(f"{speaker.client.what} {speaker.client.public}: /tokenize gave no tokens")
    return [base[(i + 7 * salt) % len(base)] for i in range(n)]


def server_requests(speaker, bodies, endpoint="/completion"):
    """The JSON answers of ``bodies`` sent at once (one thread each), in order."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(bodies))) as pool:
        return list(pool.map(lambda b: speaker.client.post(endpoint, b), bodies))


def _timings(answer, where):
    timings = answer.get("timings") if isinstance(answer, dict) else None
    if not isinstance(timings, dict):
        raise ServerError(
            f"{where}: the server reports no timings: calibrate --server needs llama-server's "
            "(vLLM and SGLang: use a shipped profile or the roofline, docs: plan)"
        )
    return timings


#: Milliseconds a timed part may take: a forward is never faster than a microsecond nor slower than an hour.
TIMING_RANGE_MS = (1e-3, 3.6e6)


def _ms(timings, field, where):
    """The server's timing ``field`` in milliseconds, checked: a number in ``TIMING_RANGE_MS``."""
    value = timings.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ServerError(f"{where}: timings.{field} is {shown(repr(value))[:40]}, not a number of milliseconds")
    low, high = TIMING_RANGE_MS
    if not low <= value <= high:
        raise ServerError(
            f"{where}: timings.{field} = {value:g} ms lies outside what a machine measures "
            f"({low:g} to {high:g} ms): refusing to build a cost model from it"
        )
    return float(value)


def _decode_ms(speaker, batch, tokens, context, repeat):
    bodies = [
        {
            "prompt": _ids(speaker, context, salt=repeat * batch + i),
            "n_predict": tokens,
            "ignore_eos": True,
            "cache_prompt": False,
            "temperature": 0.0,
            "samplers": ["top_k"],
            "top_k": 1,
            "id_slot": i,
        }
        for i in range(batch)
    ]
    where = f"{speaker.client.what} {speaker.client.public}/completion"
    return [_ms(_timings(a, where), "predicted_per_token_ms", where) for a in server_requests(speaker, bodies)]


def _block_ms(speaker, batch, k, context, repeat):
    prefixes = [_ids(speaker, context, salt=1000 + repeat * batch + i) for i in range(batch)]
    warm = [{"prompt": pre, "n_predict": 0, "cache_prompt": True, "id_slot": i} for i, pre in enumerate(prefixes)]
    server_requests(speaker, warm)
    bodies = [
        {
            "prompt": pre + _ids(speaker, k, salt=5000 + repeat),
            "n_predict": 1,
            "cache_prompt": True,
            "temperature": 0.0,
            "samplers": ["top_k"],
            "top_k": 1,
            "id_slot": i,
        }
        for i, pre in enumerate(prefixes)
    ]
    where = f"{speaker.client.what} {speaker.client.public}/completion"
    out = []
    for answer in server_requests(speaker, bodies):
        t = _timings(answer, where)
        if t.get("prompt_n") != k:
            raise ServerError(
                f"{where}: the server processed {t.get('prompt_n')} new tokens, not {k}: is its prompt "
                "cache on (--cache-reuse) and --parallel at least the batch?"
            )
        out.append(_ms(t, "prompt_ms", where))
    return out


def _prefill_ms(speaker, length, repeat):
    body = {
        "prompt": _ids(speaker, length, salt=9000 + repeat),
        "n_predict": 1,
        "cache_prompt": False,
        "temperature": 0.0,
        "samplers": ["top_k"],
        "top_k": 1,
    }
    where = f"{speaker.client.what} {speaker.client.public}/completion"
    return _ms(_timings(speaker.client.post("/completion", body), where), "prompt_ms", where)


def _row_share(info) -> float:
    """The share of one decode step that unembedding one row takes: n_vocab n_embd / n_params (0 when the
    server does not say)."""
    extra = info.extra
    vocab, params = info.vocab_size, extra.get("n_params")
    embd = extra.get("n_embd")
    if not (is_integer(vocab) and isinstance(params, (int, float)) and is_integer(embd) and params > 0):
        return 0.0
    return min(vocab * embd / params, 0.5)


def calibrate_server(
    verifier_url,
    draft_url,
    *,
    batches=(1,),
    max_block=8,
    context=256,
    repeats=5,
    tokens=32,
    prompt_lengths=(32, 128, 512),
    api_key_env=None,
    timeout=600.0,
    retries=4,
    progress=None,
):
    """A ``CostModel`` of two llama-servers' own step times (see the module docstring). ``timeout``:
    seconds a request may take in all; ``retries``: further attempts after a 429, 503 or dropped
    connection."""
    from .._analysis._cost import CostModel

    batches = sorted({int(b) for b in batches})
    if not batches or batches[0] < 1:
        raise ValueError(f"batches must be integers >= 1; got {batches}")
    batches = sorted({1, *batches})  # batch 1 is the model's own fields (and the row cost's reference)
    for name, value, low in (
        ("max_block", max_block, 1),
        ("context", context, 1),
        ("repeats", repeats, 1),
        ("tokens", tokens, 2),
    ):
        check_int(value, name, low)
    opened = []
    for url, what in ((verifier_url, "--server"), (draft_url, "--draft-server")):
        with ServerClient(url, api_key_env=api_key_env, timeout=timeout, retries=retries, what=what) as probe:
            speaks = protocol_class(detect_protocol(probe))
        if not speaks.reports_timings:  # the protocol says whether its server times its own steps
            timed = ", ".join(n for n in protocol_names() if protocol_class(n).reports_timings)
            raise ServerError(
                f"{what} {probe.public} speaks {speaks.name}: only llama.cpp's llama-server reports the step "
                f"timings this needs (protocols that carry them: {timed}); time the models on their machine with "
                "cactus-theory calibrate --verifier MODEL --draft MODEL, or plan with a measured GPU profile or a "
                "roofline (plan --cost-profile; docs: plan)"
            )
        opened.append(
            open_server(url, protocol=speaks.name, api_key_env=api_key_env, timeout=timeout, retries=retries, what=what)
        )
    (v_client, verifier), (d_client, draft) = opened
    try:
        for speaker in (verifier, draft):
            slots = speaker.info().slots
            if is_integer(slots) and slots < batches[-1]:
                raise ServerError(
                    f"{speaker.client.what} {speaker.client.public} has {slots} slot(s): start it with "
                    f"--parallel {batches[-1]} to time a batch of {batches[-1]}"
                )
        share = _row_share(verifier.info())
        parts, samples = {}, {}
        decode_one = None
        slope = None
        for b in batches:
            decode = [x for r in range(repeats) for x in _decode_ms(verifier, b, tokens, context, r)]
            drafted = [x for r in range(repeats) for x in _decode_ms(draft, b, tokens, context, r)]
            if b == 1:
                decode_one = float(np.median(decode))
                sizes = sorted({1, max(2, max_block // 2), max(2, max_block)})
                reads = {
                    k: float(np.median([x for r in range(repeats) for x in _block_ms(draft, 1, k, context, r)]))
                    for k in sizes
                }
                slope = max(float(np.polyfit(sizes, [reads[k] for k in sizes], 1)[0]) / 1e3, 1e-9)
            blocks = {1: decode}
            for k in range(2, max_block + 1):
                # a step of b sequences verifying k tokens each is one forward of b k tokens with b k rows out:
                # timed as one prompt of b k new tokens (one row out), plus the b k - 1 other rows
                pp = [x for r in range(repeats) for x in _block_ms(verifier, 1, b * k, context, r)]
                rows = (b * k - 1) * share * decode_one
                blocks[k] = [x + rows for x in pp]
            seconds = {k: [x / 1e3 for x in v] for k, v in blocks.items()}
            parts[b] = {
                "draft_token": float(np.median(drafted)) / 1e3,
                "verify_block": {k: float(np.median(v)) for k, v in seconds.items()},
                "draft_read_token": b * slope,
            }
            samples[b] = {"draft_token": [x / 1e3 for x in drafted], "verify_block": seconds}
            if progress:
                print(
                    f"batch {b}: a verifier step {parts[b]['verify_block'][1] * 1e3:.1f} ms, a draft step "
                    f"{parts[b]['draft_token'] * 1e3:.1f} ms",
                    flush=True,
                )
        prefill, prefill_samples = {}, {}
        for role, speaker in (("verifier", verifier), ("draft", draft)):
            per = {n: [_prefill_ms(speaker, n, r) / 1e3 for r in range(repeats)] for n in prompt_lengths}
            prefill[role] = {n: float(np.median(v)) for n, v in per.items()}
            prefill_samples[role] = per
        source = {
            "kind": "server",
            "method": "llama-server's own timings over HTTP (predicted_per_token_ms; prompt_ms of k tokens after a "
            f"cached prefix, plus k - 1 rows' unembedding modelled as {share:.3f} of a decode step)",
            "verifier": verifier.info().as_dict(),
            "draft": draft.info().as_dict(),
            "client_machine": platform.machine(),
            "created": utc_timestamp(),
            "context": int(context),
            "row_share": share,
        }
        first = parts[1]
        return CostModel(
            draft_token=first["draft_token"],
            verify_block=first["verify_block"],
            source=source,
            prefill=prefill,
            draft_read_token=first["draft_read_token"],
            context=int(context),
            samples={**samples[1], "prefill": prefill_samples},
            batch={b: {**parts[b], "samples": samples[b]} for b in batches if b > 1},
        )
    finally:
        v_client.close()
        d_client.close()
