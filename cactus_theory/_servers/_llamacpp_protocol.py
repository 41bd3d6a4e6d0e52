"""llama.cpp's ``llama-server``, native endpoints.

Which log-probabilities (checked in its source, see ``docs/howto/servers.md``):

- llama.cpp (``n_probs`` with ``post_sampling_probs`` false): the softmax of the raw logits over
  the whole vocabulary (``get_token_probabilities`` in tools/server/server-common.cpp), before
  every sampler: temperature 1, no top-k / top-p, whatever the request samples with. Exactly
  what a trace stores. The draft is teacher-forced with a grammar of token ids (``<[id]>``, one
  per position) that leaves it no other choice, so it decodes the verifier's tokens one by one;
  the log-probs are still those of its raw logits (the grammar acts on sampling only).
"""

from __future__ import annotations

from .._math._validation import is_integer
from ._http import LLAMA_NEUTRAL_SAMPLERS, ServerError, shown
from ._protocol import (
    AlignmentError,
    Generation,
    ServerInfo,
    ServerProtocol,
    json_object,
    rows_from_entries,
    sampling_fields,
    token_id,
)


class LlamaCppNative(ServerProtocol):
    """llama.cpp's ``llama-server``: ``/props``, ``/v1/models``, ``/apply-template``, ``/tokenize``,
    ``/completion`` (``n_probs``, token-id prompts, ``return_tokens``, grammars of token ids)."""

    name = "llama.cpp"
    detect_order = 10
    reports_timings = True

    @classmethod
    def detects(cls, client):
        status, props = client.probe("/props")
        return status == 200 and isinstance(props, dict) and "build_info" in props

    #: Where completions go: llama.cpp's native endpoint, or (``OpenAICompletions``) its OpenAI one.
    endpoint = "/completion"

    def __init__(self, client, *, tokenizer=None, model=None, openai=False):
        super().__init__(client, tokenizer=tokenizer, model=model)
        self.openai = openai
        if openai:
            self.endpoint = "/v1/completions"

    def _read_info(self):
        status, props = self.client.probe("/props")
        if status != 200 or not isinstance(props, dict):
            raise ServerError(
                f"{self.client.what} {self.client.public}: GET /props answered {status}: not a "
                "llama-server (or give --protocol)"
            )
        _, models = self.client.probe("/v1/models")
        model, vocab, extra = None, None, {}
        where = f"{self.client.what} {self.client.public}"
        if isinstance(models, dict) and models.get("data"):
            data = models["data"]
            if not isinstance(data, list):
                raise ServerError(f"{where}/v1/models: data is {shown(repr(data))[:40]}, not a list of models")
            first = json_object(data[0], f"{where}/v1/models", "data[0]")
            model = first.get("id")
            meta = json_object(first.get("meta"), f"{where}/v1/models", "data[0].meta")
            vocab = meta.get("n_vocab")
            extra = {k: meta[k] for k in ("n_params", "n_embd", "size", "n_ctx_train") if k in meta}
        field = "default_generation_settings"
        settings = json_object(props.get(field), f"{where}/props", field)
        path = props.get("model_path")
        if path:
            extra["model_file"] = str(path).replace("\\", "/").rsplit("/", 1)[-1]  # the file's name, not its path
        if settings.get("speculative") is not None:
            extra["speculative"] = bool(settings.get("speculative"))
        return ServerInfo(
            url=self.client.public,
            protocol=self.name,
            engine="llama.cpp",
            version=props.get("build_info"),
            model=model or extra.get("model_file"),
            vocab_size=vocab if is_integer(vocab) else None,
            slots=props.get("total_slots"),
            context=settings.get("n_ctx"),
            extra=extra,
        )

    def prompt_ids(self, text, chat=True, special=True):
        if chat:
            body = self.client.post("/apply-template", {"messages": [{"role": "user", "content": text}]})
            rendered = body.get("prompt") if isinstance(body, dict) else None
            if not isinstance(rendered, str):
                raise ServerError(f"{self.client.what} {self.client.public}/apply-template: no 'prompt' in the answer")
            body = self.client.post("/tokenize", {"content": rendered, "add_special": False, "parse_special": True})
        else:
            body = self.client.post("/tokenize", {"content": text, "add_special": special, "parse_special": special})
        ids = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(ids, list):
            raise ServerError(f"{self.client.what} {self.client.public}/tokenize: no 'tokens' list in the answer")
        return [token_id(t, self.vocab, "/tokenize") for t in ids]

    def _completion_body(self, prompt_ids, k):
        return {
            "prompt": list(map(int, prompt_ids)),
            "n_probs": int(k),
            "post_sampling_probs": False,
            "return_tokens": True,
            "verbose": self.openai,
            "cache_prompt": False,
            "stream": False,
            "min_p": 0.0,
            **LLAMA_NEUTRAL_SAMPLERS,
        }

    def _post(self, body):
        if self.openai:  # the OpenAI endpoint's names for the model and the length; llama.cpp's fields pass through
            body = {**body, "model": self._model, "max_tokens": body["n_predict"]}
        return self.client.post(self.endpoint, body)

    def _parse(self, answer, k, where):
        """(tokens, entries, finish, timings) of a llama.cpp completion answer (native or its OpenAI shape).

        llama-server leaves out the log-probs of a token whose text ends in an incomplete UTF-8 character
        (``process_token`` adds a token's probabilities only once its text is whole): ``tokens`` are the
        answer's own token ids (``return_tokens``; on the OpenAI endpoint ``verbose``'s copy) and
        ``entries`` has None where a position's log-probs are missing (``_fill`` asks for them)."""
        if not isinstance(answer, dict):
            raise ServerError(f"{where}: the answer is not a JSON object")
        native = answer.get("tokens")
        if "choices" in answer:  # the OpenAI-compatible endpoint of llama-server
            choice = (answer.get("choices") or [None])[0]
            if not isinstance(choice, dict):
                raise ServerError(f"{where}: no choices in the answer")
            probs = json_object(choice.get("logprobs"), where, "choices[0].logprobs").get("content")
            finish = choice.get("finish_reason")
            native = json_object(answer.get("__verbose"), where, "__verbose").get("tokens")
        else:
            probs = answer.get("completion_probabilities")
            finish = answer.get("stop_type")
        if probs is None:
            raise ServerError(f"{where}: the server returned no log-probs (does it support n_probs?)")
        if not isinstance(probs, list):
            raise ServerError(f"{where}: log-probs are not a list")
        listed, rows = [], []
        for i, pos in enumerate(probs):
            if not isinstance(pos, dict) or "id" not in pos or not isinstance(pos.get("top_logprobs"), list):
                raise ServerError(
                    f"{where}, position {i}: expected {{id, logprob, top_logprobs}} (post_sampling_probs must be off)"
                )
            listed.append(token_id(pos["id"], self.vocab, f"{where}, position {i}"))
            rows.append([(e.get("id"), e.get("logprob")) for e in pos["top_logprobs"] if isinstance(e, dict)])
        if not isinstance(native, list) or not native:
            return listed, rows, finish, answer.get("timings")
        tokens = [token_id(t, self.vocab, f"{where}, tokens") for t in native]
        entries, j = [], 0
        for i, tok in enumerate(tokens):  # the listed positions are the tokens' in order, some left out
            if j < len(listed) and listed[j] == tok and len(tokens) - i >= len(listed) - j:
                entries.append(rows[j])
                j += 1
            else:
                entries.append(None)
        if j != len(listed):
            raise ServerError(f"{where}: the log-probs' tokens are not the answer's tokens in order")
        return tokens, entries, finish, answer.get("timings")

    def _safe_token(self):
        """A token whose text is one ASCII letter (its log-probs are never left out)."""
        if getattr(self, "_safe", None) is None:
            ids = self.prompt_ids("a", chat=False, special=False)
            if len(ids) != 1:
                raise ServerError(f"{self.client.what} {self.client.public}: 'a' is not one token here")
            self._safe = ids[0]
        return self._safe

    def _fill(self, prompt_ids, tokens, entries, k, where):
        """``entries`` with every missing position's log-probs asked for: the distribution after the prompt
        and the tokens before it, with a one-letter token forced there (the log-probs are the raw logits'
        whatever is sampled; a whole character keeps them in the answer). These come from prompt
        processing rather than decoding: the same up to float rounding."""
        out = list(entries)
        for i, entry in enumerate(entries):
            if entry is not None:
                continue
            body = self._completion_body([*prompt_ids, *tokens[:i]], k)
            body.update(
                {
                    "n_predict": 1,
                    "grammar": f"root ::= <[{self._safe_token()}]>",
                    "temperature": 0.0,
                    "top_k": 1,
                    "top_p": 1.0,
                    "samplers": ["top_k"],
                    "seed": 0,
                }
            )
            _, again, _, _ = self._parse(self._post(body), k, f"{where} (position {i})")
            if not again or again[0] is None:
                raise ServerError(f"{where}: the server gave no log-probs for position {i}, even alone")
            out[i] = again[0]
        return out

    def generate(self, prompt_ids, settings, max_new_tokens, seed, k):
        body = self._completion_body(prompt_ids, k)
        body.update(sampling_fields(settings))
        body.update(
            {"n_predict": int(max_new_tokens), "seed": int(seed) % 2**32, "samplers": ["top_k", "temperature", "top_p"]}
        )  # vLLM's order: top-k, temperature, top-p
        where = f"{self.client.what} {self.client.public}{self.endpoint}"
        tokens, entries, finish, timings = self._parse(self._post(body), k, where)
        partial = tuple(i for i, e in enumerate(entries) if e is None)
        entries = self._fill(prompt_ids, tokens, entries, k, where)
        values, ids = rows_from_entries(entries, k, self.vocab, where)
        return Generation(tokens, values, ids, finish, timings, partial)

    def score(self, prompt_ids, tokens, k, ends=False, partial=()):
        # a grammar of the tokens' ids leaves the sampler one choice per position; the log-probs are
        # those of the raw logits (n_probs before the samplers), so the grammar does not touch them. When
        # the verifier ended on an end-of-generation token (``ends``), a one-letter token is forced in its
        # place (llama.cpp refuses a grammar that ends in one: "empty grammar stack"); that position's
        # distribution is conditioned on the tokens before it only. llama.cpp's grammar also fails on a
        # character split over several tokens, and the server leaves out the log-probs of a token that
        # ends inside one: the positions of such a character (``partial``: where the verifier's answer
        # left them out, and the token that completes it) are asked for one by one (``_fill``), the runs
        # between them each with one grammar.
        tokens = [int(t) for t in tokens]
        safe = self._safe_token()
        alone = set()
        for i in sorted(int(x) for x in partial):
            alone.update((i, i + 1))
        alone = {i for i in alone if i < len(tokens)}
        where = f"{self.client.what} {self.client.public}{self.endpoint} (teacher-forced)"
        entries = [None] * len(tokens)
        start = 0
        while start < len(tokens):
            if start in alone:
                start += 1
                continue
            end = start
            while end < len(tokens) and end not in alone:
                end += 1
            forced = tokens[start:end]
            if ends and end == len(tokens):
                forced = [*forced[:-1], safe]
            body = self._completion_body([*prompt_ids, *tokens[:start]], k)
            body.update(
                {
                    "n_predict": len(forced),
                    "temperature": 0.0,
                    "top_k": 1,
                    "top_p": 1.0,
                    "samplers": ["top_k"],
                    "seed": 0,
                    "ignore_eos": False,
                    "grammar": "root ::= " + " ".join(f"<[{t}]>" for t in forced),
                }
            )
            got, rows, _, _ = self._parse(self._post(body), k, where)
            if got != forced:
                pairs = zip(got, forced, strict=False)
                cut = next((i for i, (x, y) in enumerate(pairs) if x != y), min(len(got), len(forced)))
                raise AlignmentError(
                    f"{where}: the draft did not follow the verifier's tokens (from position {start + cut} of "
                    f"{len(tokens)} they differ)"
                )
            entries[start:end] = rows
            start = end
        entries = self._fill(prompt_ids, tokens, entries, k, where)
        return rows_from_entries(entries, k, self.vocab, where)
