"""llama-server's own speculative decoding, driven and measured: the referee of the planner.

``drive_server(url, prompts, ...)`` sends every prompt (token ids) to a running llama-server with
``concurrency`` requests in flight (a pool that sends the next prompt when one ends, as clients of
a server with ``--parallel N`` slots do) and returns, per request, the server's own timings:
tokens generated, the seconds of generation (``predicted_ms``: from the first generated token to
the last, prompt processing apart), and on a server with a draft model ``draft_n`` and
``draft_n_accepted``; with ``--metrics`` the verification steps from the Prometheus counters
(``spec_decode_num_drafts_total``) before and after.

What llama-server runs (tools/server/server-context.cpp, common/speculative.cpp of the llama.cpp
that llama-cpp-python 0.3.36 ships): the draft model drafts greedily (``draft-simple``: its argmax,
stopping below ``--spec-draft-p-min`` on the top-1 of its top-10, at most ``--spec-draft-n-max``,
blocks under ``--spec-draft-n-min`` dropped); the verifier samples every drafted position with the
request's own sampler chain and keeps the drafts while its sample equals them
(``common_sampler_sample_and_accept_n``): the registry's ``strict`` rule under greedy drafts with
the ``llama.cpp(p_min, n_min)`` drafting policy. It is lossless: the tokens are the verifier's own
samples, so a request with the same seed gives the same tokens with and without a draft (up to
the rounding of batched forwards).
"""

from __future__ import annotations

import concurrent.futures
import re
import time
from dataclasses import dataclass

from ._http import ServerError

__all__ = ["RequestRecord", "drive_server", "spec_counters"]


@dataclass(frozen=True)
class RequestRecord:
    """One request as the server timed it."""

    index: int
    tokens: int
    generation_seconds: float
    prompt_seconds: float
    drafted: int
    accepted: int
    token_ids: tuple

    @property
    def steps(self) -> int:
        """Decoding steps after the first token (which prompt processing gives): tokens - 1 - accepted."""
        return max(self.tokens - 1 - self.accepted, 0)


_COUNTER = re.compile(r"^llamacpp:(spec_decode_num_[a-z_]+_total)\s+([0-9.eE+-]+)\s*$", re.MULTILINE)


def spec_counters(client) -> dict:
    """llama-server's speculative-decoding counters from ``/metrics`` (empty without ``--metrics``)."""
    try:
        text = client.get("/metrics", parse=False)
    except ServerError:
        return {}
    return {name: float(value) for name, value in _COUNTER.findall(text)}


def drive_server(speaker, prompts, settings, max_new_tokens, *, concurrency=1, seed=0):
    """(records in prompt order, wall seconds, counters before, counters after) of ``prompts`` (lists of
    token ids) sent to the llama-server behind ``speaker`` (llama.cpp's protocol,
    ``_llamacpp_protocol.LlamaCppNative``)."""
    from .._data._prompts import prompt_seed

    client = speaker.client

    def one(i):
        body = {
            "prompt": list(map(int, prompts[i])),
            "n_predict": int(max_new_tokens),
            "cache_prompt": False,
            "return_tokens": True,
            "stream": False,
            "seed": prompt_seed(seed, str(i)) % 2**32,
            "temperature": float(settings.temperature),
            "top_k": int(settings.top_k),
            "top_p": float(settings.top_p),
            "min_p": 0.0,
            "typical_p": 1.0,
            "repeat_penalty": 1.0,
            "samplers": ["top_k", "temperature", "top_p"],
        }
        answer = client.post("/completion", body)
        t = answer.get("timings") if isinstance(answer, dict) else None
        if not isinstance(t, dict):
            raise ServerError(f"{client.what} {client.public}/completion: no timings in the answer")
        return RequestRecord(
            i,
            int(t.get("predicted_n", 0)),
            float(t.get("predicted_ms", 0.0)) / 1e3,
            float(t.get("prompt_ms", 0.0)) / 1e3,
            int(t.get("draft_n", 0)),
            int(t.get("draft_n_accepted", 0)),
            tuple(answer.get("tokens") or ()),
        )

    before = spec_counters(client)
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=int(concurrency)) as pool:
        records = list(pool.map(one, range(len(prompts))))
    wall = time.perf_counter() - start
    return records, wall, before, spec_counters(client)
