"""The OpenAI-compatible ``/v1/completions``: vLLM, or llama-server's own OpenAI endpoint.

Which log-probabilities (checked in the source, see ``docs/howto/servers.md``):

- vLLM (``logprobs`` / ``prompt_logprobs``): the raw model's log-softmax by default
  (``--logprobs-mode raw_logprobs``); a server started with ``processed_logprobs`` returns
  them after temperature and top-k / top-p, which a trace cannot use (recorded in the manifest,
  the docs say to start vLLM with the default). Token ids come back as ``token_id:N`` strings
  with ``return_tokens_as_token_ids``; values of -inf are sent as -9999 (read as -9999, a mass
  of exp(-9999) = 0). The draft: ``prompt_logprobs`` over prompt + tokens, one request.
"""

from __future__ import annotations

from ._http import ServerError, shown
from ._protocol import (
    AlignmentError,
    Generation,
    ServerInfo,
    ServerProtocol,
    json_object,
    protocol_class,
    rows_from_entries,
    sampling_fields,
    token_id,
)


class OpenAICompletions(ServerProtocol):
    """The OpenAI-compatible ``/v1/completions``: vLLM (``logprobs``, ``prompt_logprobs``, token-id
    prompts, ``return_tokens_as_token_ids``, ``/tokenize``) or llama-server's own endpoint (llama.cpp's
    ``n_probs`` and grammars pass through it; its answer carries llama.cpp's ``logprobs.content``)."""

    name = "openai"
    detect_order = 90  # many servers speak it: asked last

    @classmethod
    def detects(cls, client):
        status, models = client.probe("/v1/models")
        return status == 200 and isinstance(models, dict) and isinstance(models.get("data"), list)

    def _read_info(self):
        status, models = self.client.probe("/v1/models")
        if status != 200 or not isinstance(models, dict) or not models.get("data"):
            raise ServerError(
                f"{self.client.what} {self.client.public}: GET /v1/models answered {status} without a "
                "model list: not an OpenAI-compatible server"
            )
        data = models["data"]
        if not isinstance(data, list):
            raise ServerError(
                f"{self.client.what} {self.client.public}/v1/models: data is {shown(repr(data))[:40]}, "
                "not a list of models"
            )
        first = json_object(data[0], f"{self.client.what} {self.client.public}/v1/models", "data[0]")
        self._model = self._model or first.get("id")
        owner = str(first.get("owned_by", ""))
        props_status, props = self.client.probe("/props")
        if props_status == 200 and isinstance(props, dict) and "build_info" in props:  # llama-server
            # llama-server's own protocol speaks for it (asked of the registry, as every protocol is)
            self._llama = protocol_class("llama.cpp")(self.client, model=self._model, openai=True)
            base = self._llama.info()
            self.flavour = "llama.cpp"
            return ServerInfo(
                url=base.url,
                protocol=self.name,
                engine="llama.cpp",
                version=base.version,
                model=self._model,
                vocab_size=base.vocab_size,
                slots=base.slots,
                context=base.context,
                extra=base.extra,
            )
        version_status, version = self.client.probe("/version")
        self.flavour = "vllm" if owner == "vllm" or (version_status == 200 and isinstance(version, dict)) else "openai"
        return ServerInfo(
            url=self.client.public,
            protocol=self.name,
            engine=self.flavour,
            version=version.get("version") if isinstance(version, dict) else None,
            model=self._model,
            vocab_size=None,
            max_logprobs=None,
            context=first.get("max_model_len"),
            extra={"owned_by": owner} if owner else {},
        )

    def prompt_ids(self, text, chat=True, special=True):
        self.info()
        if self.flavour == "llama.cpp":
            return self._llama.prompt_ids(text, chat, special)
        if self.tokenizer is not None:
            return self.tokenizer(text, chat)
        if self.flavour != "vllm":
            return self._local_ids(text, chat)
        if chat:
            payload = {
                "model": self._model,
                "messages": [{"role": "user", "content": text}],
                "add_generation_prompt": True,
            }
        else:
            payload = {"model": self._model, "prompt": text, "add_special_tokens": special}
        body = self.client.post("/tokenize", payload)
        ids = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(ids, list):
            raise ServerError(f"{self.client.what} {self.client.public}/tokenize: no 'tokens' list in the answer")
        return [token_id(t, self.vocab, "/tokenize") for t in ids]

    def generate(self, prompt_ids, settings, max_new_tokens, seed, k):
        self.info()
        if self.flavour == "llama.cpp":
            return self._llama.generate(prompt_ids, settings, max_new_tokens, seed, k)
        body = {
            "model": self._model,
            "prompt": list(map(int, prompt_ids)),
            "max_tokens": int(max_new_tokens),
            "stream": False,
            "logprobs": int(k),
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "seed": int(seed) % 2**31,
            **sampling_fields(settings),
        }
        where = f"{self.client.what} {self.client.public}/v1/completions"
        tokens, entries, finish = self._parse_openai(self.client.post("/v1/completions", body), where)
        values, ids = rows_from_entries(entries, k, self.vocab, where)
        return Generation(tokens, values, ids, finish, None)

    def _parse_openai(self, answer, where):
        """(tokens, entries, finish) of an OpenAI-shaped completion (``logprobs.tokens`` /
        ``top_logprobs`` dicts keyed by ``token_id:N``; vLLM's ``token_ids`` when present)."""
        choice = (answer.get("choices") or [None])[0] if isinstance(answer, dict) else None
        if not isinstance(choice, dict):
            raise ServerError(f"{where}: no choices in the answer")
        logprobs = choice.get("logprobs")
        if not isinstance(logprobs, dict) or not isinstance(logprobs.get("top_logprobs"), list):
            raise ServerError(
                f"{where}: the server returned no log-probs (logprobs=K must be allowed: vLLM's --max-logprobs)"
            )
        names = logprobs.get("tokens") or []
        tokens = [token_id(t, self.vocab, f"{where}, token {i}") for i, t in enumerate(names)]
        ids = choice.get("token_ids")
        if isinstance(ids, list) and [int(t) for t in ids] != tokens:
            raise ServerError(f"{where}: token_ids and the log-probs' tokens disagree")
        entries = []
        for i, top in enumerate(logprobs["top_logprobs"]):
            if top is not None and not isinstance(top, dict):
                raise ServerError(f"{where}, position {i}: top_logprobs must map tokens to log-probs")
            entries.append(None if top is None else list(top.items()))
        if len(entries) != len(tokens):
            raise ServerError(f"{where}: {len(tokens)} tokens but {len(entries)} rows of log-probs")
        return tokens, entries, choice.get("finish_reason")

    def score(self, prompt_ids, tokens, k, ends=False, partial=()):
        self.info()
        if self.flavour == "llama.cpp":
            return self._llama.score(prompt_ids, tokens, k, ends, partial)
        body = {
            "model": self._model,
            "prompt": [*map(int, prompt_ids), *map(int, tokens)],
            "max_tokens": 1,
            "stream": False,
            "prompt_logprobs": int(k),
            "temperature": 0.0,
        }
        where = f"{self.client.what} {self.client.public}/v1/completions (prompt_logprobs)"
        answer = self.client.post("/v1/completions", body)
        choice = (answer.get("choices") or [None])[0] if isinstance(answer, dict) else None
        rows = choice.get("prompt_logprobs") if isinstance(choice, dict) else None
        if not isinstance(rows, list):
            raise ServerError(f"{where}: no prompt_logprobs in the answer (vLLM's extension: is this vLLM?)")
        start = len(prompt_ids)
        if len(rows) != start + len(tokens):
            raise AlignmentError(f"{where}: {len(rows)} prompt positions, expected {start + len(tokens)}")
        entries = []
        for i, row in enumerate(rows[start:]):
            if not isinstance(row, dict):
                raise ServerError(f"{where}, position {i}: expected {{token id: {{logprob, rank}}}}")
            listed = []
            for tok, item in row.items():
                lp = item.get("logprob") if isinstance(item, dict) else item
                listed.append((tok, lp))
            if str(tokens[i]) not in row and tokens[i] not in row:
                raise AlignmentError(
                    f"{where}, position {i}: the forced token {tokens[i]} is not in its row: not scored as sent"
                )
            entries.append(listed)
        return rows_from_entries(entries, k, self.vocab, where)
