"""Local stand-ins for the servers that cannot run here (vLLM and SGLang need GPUs and their own stacks):
HTTP handlers that answer as those engines do, computed from a toy bigram model, so that a test can check
the trace a dump reads against the toy model's own distributions (an independent computation).

These are protocol fixtures, *not* captures of live servers. Their shapes follow the engines' source and
documentation, read for this purpose:

- vLLM (vllm-project/vllm, ``vllm/entrypoints/openai/completion/serving.py``: ``_create_completion_logprobs``
  writes ``logprobs = {text_offset, token_logprobs, tokens, top_logprobs}`` with ``token_id:N`` names under
  ``return_tokens_as_token_ids``, the sampled token added to the top-k dict, -inf sent as -9999;
  ``choices[0].prompt_logprobs`` is a list of ``None`` then ``{token id: {logprob, rank, decoded_token}}``
  holding the top-k and the prompt's own token; ``choices[0].token_ids`` with ``return_token_ids``, as in
  its ``tests/entrypoints/openai/basic/test_return_token_ids.py``; ``/tokenize`` answers ``{count,
  max_model_len, tokens}``; ``/version`` ``{version}``; a request above ``--max-logprobs`` is a 400).
- SGLang (sgl-project/sglang, ``tokenizer_manager.py``: ``detokenize_top_logprobs_tokens`` gives per position
  a list of ``(logprob, token_id, text or None)``, ``None`` where a position has none; ``meta_info`` holds
  ``input_top_logprobs`` from ``logprob_start_len`` and ``output_top_logprobs``; ``/get_model_info``
  ``{model_path, tokenizer_path, is_generation}``).
"""

from __future__ import annotations

import json
import math

import numpy as np

V = 50


class ToyModel:
    """A bigram model over V tokens: the distribution after token t is softmax(W[t]) (log-probs exact in float64)."""

    def __init__(self, seed):
        rng = np.random.default_rng(seed)
        self.w = rng.normal(0, 2.0, (V, V))

    def logprobs(self, last):
        row = self.w[last]
        return row - (row.max() + math.log(np.exp(row - row.max()).sum()))

    def generate(self, prompt, n, seed, stop_at=None):
        """Greedy on the bigram perturbed by the seed (any deterministic rule does: the test reads what was
        returned), stopping after ``n`` tokens or at ``stop_at``."""
        rng = np.random.default_rng(seed)
        out, last = [], prompt[-1]
        for _ in range(n):
            lp = self.logprobs(last) + rng.gumbel(size=V)
            last = int(np.argmax(lp))
            out.append(last)
            if last == stop_at:
                break
        return out


def toy_ids(text, chat):
    """The toy tokenizer: a character's code modulo V (the chat template adds 3 and 4 around it)."""
    ids = [ord(c) % V for c in text]
    return [3, *ids, 4] if chat else ids


def top(lp, k, extra=None):
    order = list(np.argsort(-lp, kind="stable")[:k])
    if extra is not None and extra not in order:
        order.append(extra)
    return order


def vllm_handler(model, *, k_limit=20, faults=None, name="toy/verifier"):
    """A handler answering as vLLM's OpenAI-compatible server (``faults``: a dict of misbehaviours)."""
    faults = {} if faults is None else faults

    def handle(method, path, body, headers):
        if faults.get("busy", 0) > 0:
            faults["busy"] -= 1
            return 503, {"object": "error", "message": "Service Unavailable"}
        if path == "/v1/models":
            return 200, {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "vllm",
                        "root": name,
                        "max_model_len": 4096,
                    }
                ],
            }
        if path == "/version":
            return 200, {"version": "0.11.0"}
        if path in ("/props", "/get_model_info"):
            return 404, {"detail": "Not Found"}
        if path == "/tokenize":
            if "messages" in body:
                ids = toy_ids(body["messages"][0]["content"], True)
            else:
                ids = toy_ids(body["prompt"], False)
            return 200, {"count": len(ids), "max_model_len": 4096, "tokens": ids}
        if path == "/v1/completions":
            if "malformed" in faults:
                return 200, faults["malformed"]
            prompt = body["prompt"]
            if "prompt_logprobs" in body:
                k = body["prompt_logprobs"]
                if k > k_limit:
                    return 400, _vllm_error(
                        f"Requested prompt logprobs of {k}, which is greater than max allowed: {k_limit}"
                    )
                rows = [None]
                for i in range(1, len(prompt)):
                    lp = model.logprobs(prompt[i - 1])
                    rank = {int(t): r + 1 for r, t in enumerate(np.argsort(-lp, kind="stable"))}
                    rows.append(
                        {
                            str(int(t)): {
                                "logprob": max(float(lp[t]), -9999.0),
                                "rank": rank[int(t)],
                                "decoded_token": chr(97 + int(t) % 26),
                            }
                            for t in top(lp, k, prompt[i])
                        }
                    )
                return 200, _vllm_completion(name, [prompt[-1]], None, rows)
            k = body["logprobs"]
            if k > k_limit:
                return 400, _vllm_error(
                    f"Requested sample logprobs of {k}, which is greater than max allowed: {k_limit}"
                )
            tokens = (
                []
                if faults.get("empty")
                else model.generate(prompt, body["max_tokens"], body["seed"], stop_at=faults.get("stop_at"))
            )
            names, token_lps, tops, last = [], [], [], prompt[-1]
            for j, tok in enumerate(tokens):
                lp = model.logprobs(last)
                entries = {f"token_id:{int(t)}": max(float(lp[t]), -9999.0) for t in top(lp, k, tok)}
                if faults.get("short"):
                    entries = dict(list(entries.items())[: k - 2])
                if faults.get("outside") and j == 1:
                    entries = {**entries, "token_id:1000000": -20.0}
                if faults.get("massless") and j == 0:  # every log-prob at vLLM's stand-in for -inf
                    entries = dict.fromkeys(entries, -9999.0)
                if faults.get("infinite") and j == 0:
                    first = next(iter(entries))
                    entries[first] = 12345.5  # written as 1e999 below: JSON that parses to +inf
                names.append(f"token_id:{tok}")
                token_lps.append(float(lp[tok]))
                tops.append(entries)
                last = tok
            logprobs = {
                "text_offset": list(range(len(tokens))),
                "token_logprobs": token_lps,
                "tokens": names,
                "top_logprobs": tops,
            }
            answer = _vllm_completion(name, tokens, logprobs, None)
            if faults.get("infinite"):
                return 200, json.dumps(answer).replace("12345.5", "1e999")
            return 200, answer
        return 404, {"detail": "Not Found"}

    return handle


def _vllm_error(message):
    return {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}


def _vllm_completion(name, tokens, logprobs, prompt_rows):
    choice = {
        "index": 0,
        "text": "".join(chr(97 + t % 26) for t in tokens),
        "logprobs": logprobs,
        "finish_reason": "length",
        "stop_reason": None,
        "prompt_logprobs": prompt_rows,
        "token_ids": tokens,
    }
    return {
        "id": "cmpl-0",
        "object": "text_completion",
        "created": 0,
        "model": name,
        "choices": [choice],
        "usage": {"prompt_tokens": 1, "total_tokens": 1 + len(tokens), "completion_tokens": len(tokens)},
    }


def sglang_handler(model, *, name="toy/verifier"):
    """A handler answering as SGLang's native server."""

    def rows_of(ids, start):
        out = []
        for i in range(start, len(ids)):
            if i == 0:
                out.append(None)
                continue
            lp = model.logprobs(ids[i - 1])
            out.append([[float(lp[t]), int(t), None] for t in top(lp, k_now[0])])
        return out

    k_now = [0]

    def handle(method, path, body, headers):
        if path == "/get_model_info":
            return 200, {"model_path": name, "tokenizer_path": name, "is_generation": True}
        if path == "/get_server_info":
            return 200, {"version": "0.5.4"}
        if path in ("/props", "/v1/models"):
            return 404, {"detail": "Not Found"}
        if path == "/generate":
            ids = body["input_ids"]
            params = body["sampling_params"]
            k_now[0] = body["top_logprobs_num"]
            start = body["logprob_start_len"]
            out = model.generate(ids, params["max_new_tokens"], params.get("sampling_seed", 0))
            full = ids + out
            out_rows = []
            for j in range(len(out)):
                lp = model.logprobs(full[len(ids) + j - 1])
                out_rows.append([[float(lp[t]), int(t), None] for t in top(lp, k_now[0])])
            meta = {
                "id": "0",
                "finish_reason": {"type": "length", "length": len(out)},
                "prompt_tokens": len(ids),
                "completion_tokens": len(out),
                "input_token_logprobs": [[None, t, None] for t in ids[start:]],
                "output_token_logprobs": [[0.0, t, None] for t in out],
                "input_top_logprobs": rows_of(ids, start),
                "output_top_logprobs": out_rows,
            }
            return 200, {"text": "", "output_ids": out, "meta_info": meta}
        return 404, {"detail": "Not Found"}

    return handle


def llama_handler(model, *, partial=frozenset(), safe=7, name="toy.gguf"):
    """A handler answering as llama-server (``/completion`` with ``n_probs``, ``return_tokens`` and grammars of
    token ids), with its behaviour around characters split over tokens (tools/server/server-context.cpp,
    ``process_token``): the log-probs of a token in ``partial`` (one whose text ends inside a character) are
    left out of ``completion_probabilities``, and a grammar that forces such a token fails as llama.cpp's does
    ("Unexpected empty grammar stack after accepting piece")."""
    import re

    def handle(method, path, body, headers):
        if path == "/props":
            return 200, {"build_info": "b1-toy", "total_slots": 1, "default_generation_settings": {"n_ctx": 4096}}
        if path == "/v1/models":
            return 200, {"data": [{"id": name, "meta": {"n_vocab": V}}]}
        if path == "/tokenize":
            text = body["content"]
            return 200, {"tokens": [safe] if text == "a" else toy_ids(text, False)}
        if path == "/completion":
            prompt, n, k = body["prompt"], body["n_predict"], body["n_probs"]
            grammar = body.get("grammar")
            if grammar:
                forced = [int(x) for x in re.findall(r"<\[(\d+)\]>", grammar)]
                if any(t in partial for t in forced):
                    return 500, {
                        "error": {
                            "code": 500,
                            "message": "got exception: Unexpected empty grammar stack after accepting piece: ! (0)",
                        }
                    }
                tokens = forced[:n]
            else:
                tokens = model.generate(prompt, n, body.get("seed", 0))
            probs, last = [], prompt[-1]
            for tok in tokens:
                lp = model.logprobs(last)
                if tok not in partial:
                    probs.append(
                        {
                            "id": tok,
                            "logprob": float(lp[tok]),
                            "top_logprobs": [{"id": int(t), "logprob": float(lp[t])} for t in top(lp, k)],
                        }
                    )
                last = tok
            return 200, {"tokens": tokens, "completion_probabilities": probs, "stop_type": "limit", "timings": {}}
        return 404, {"error": {"message": "no"}}

    return handle


def toyrpc_handler(model, *, name="toy/verifier"):
    """A handler answering as the made-up "toyrpc" API of ``toy_protocol.py``."""

    def rows(last_tokens, k):
        out = []
        for last in last_tokens:
            lp = model.logprobs(last)
            out.append([[int(t), float(lp[t])] for t in top(lp, k)])
        return out

    def handle(method, path, body, headers):
        if path == "/toy/identify":
            return 200, {"engine": "toyserve", "version": "0.1", "model": name, "vocab": V}
        if path == "/toy/tokenize":
            return 200, {"ids": toy_ids(body["text"], body["chat"])}
        if path == "/toy/sample":
            ids = body["ids"]
            out = model.generate(ids, body["n"], body["seed"])
            return 200, {"tokens": out, "top": rows([ids[-1], *out[:-1]], body["k"])}
        if path == "/toy/score":
            ids, tokens = body["ids"], body["tokens"]
            return 200, {"top": rows([ids[-1], *tokens[:-1]], body["k"])}
        return 404, {"detail": "Not Found"}

    return handle
