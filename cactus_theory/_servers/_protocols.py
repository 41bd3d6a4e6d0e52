"""What each server's API says and how it is read: llama.cpp's native ``/completion``, the
OpenAI-compatible ``/v1/completions`` (with vLLM's extensions, or llama.cpp's), SGLang's ``/generate``.

A protocol does four things for the dump (``_dump``), each returning plain arrays:

- ``info()``: what the server is (``ServerInfo``: engine, version, model id, vocabulary, its
  limit on top log-probs where it states one);
- ``prompt_ids(text, chat)``: the token ids of a prompt, with the server's own chat template
  (``chat=True``) or as plain text, from the server's tokenize endpoint (SGLang has none: a
  local Hugging Face tokenizer gives them, ``tokenizer=``);
- ``generate(prompt_ids, settings, max_new_tokens, seed, k)``: the verifier samples a
  continuation and returns, at every generated position, its top-``k`` log-probabilities;
- ``score(prompt_ids, tokens, k)``: the draft is teacher-forced on ``tokens`` and returns its
  top-``k`` log-probabilities at the same positions.

Which log-probabilities (checked in each engine's source, see ``docs/servers.md``):

- llama.cpp (``n_probs`` with ``post_sampling_probs`` false): the softmax of the raw logits over
  the whole vocabulary (``get_token_probabilities`` in tools/server/server-common.cpp), before
  every sampler: temperature 1, no top-k / top-p, whatever the request samples with. Exactly
  what a trace stores. The draft is teacher-forced with a grammar of token ids (``<[id]>``, one
  per position) that leaves it no other choice, so it decodes the verifier's tokens one by one;
  the log-probs are still those of its raw logits (the grammar acts on sampling only).
- vLLM (``logprobs`` / ``prompt_logprobs``): the raw model's log-softmax by default
  (``--logprobs-mode raw_logprobs``); a server started with ``processed_logprobs`` returns
  them after temperature and top-k / top-p, which a trace cannot use (recorded in the manifest,
  the docs say to start vLLM with the default). Token ids come back as ``token_id:N`` strings
  with ``return_tokens_as_token_ids``; values of -inf are sent as -9999 (read as -9999, a mass
  of exp(-9999) = 0). The draft: ``prompt_logprobs`` over prompt + tokens, one request.
- SGLang (``return_logprob``, ``top_logprobs_num``, ``logprob_start_len``): per position a list
  of ``[logprob, token_id, text]``; ``input_top_logprobs`` for the teacher-forced draft. Its
  output log-probs follow the request's temperature unless the server runs with
  ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``: dump SGLang at temperature 1 or set it (the manifest
  records the temperature).

Rows are returned sorted by decreasing log-probability, ``k`` wide; a position with fewer than
``k`` entries, NaN or +inf values, log-probs above 0, a mass above 1, or ids outside the
vocabulary raise a ``ServerError`` naming the position.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from ._http import ServerClient, ServerError, shown

__all__ = ["PROTOCOLS", "AlignmentError", "Generation", "ServerInfo", "detect_protocol", "make_protocol"]

PROTOCOLS = ("llama.cpp", "openai", "sglang")
#: The largest mass a row of log-probs may claim above 1 (float32 rounding of a normalised row).
MASS_TOLERANCE = 1e-4


class AlignmentError(ServerError):
    """A draft answer that does not line up with the verifier's tokens (the sequence is refused)."""


@dataclass(frozen=True)
class ServerInfo:
    """What a server says of itself (recorded in a trace's manifest)."""

    url: str
    protocol: str
    engine: str
    version: str | None
    model: str | None
    vocab_size: int | None
    max_logprobs: int | None = None
    slots: int | None = None
    context: int | None = None
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {"url": self.url, "protocol": self.protocol, "engine": self.engine, "version": self.version,
               "model": self.model, "vocab_size": self.vocab_size}  # fmt: skip
        for key in ("max_logprobs", "slots", "context"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out.update(self.extra)
        return out


@dataclass
class Generation:
    """A sampled continuation: its token ids, and per position the top-k (log-probs, ids) sorted
    by decreasing log-prob ((n, k) each), why it stopped, and the server's timings if it gave them."""

    tokens: list
    logprobs: np.ndarray
    ids: np.ndarray
    finish: str | None = None
    timings: dict | None = None
    #: positions whose log-probs the answer left out and were asked for alone (llama.cpp: a token that ends
    #: inside a character)
    partial: tuple = ()


def _number(value, where):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ServerError(f"{where}: expected a number, got {str(value)[:40]!r}")
    return float(value)


def _token_id(value, vocab, where):
    """An integer token id (or a vLLM ``token_id:N`` string) inside the vocabulary."""
    if isinstance(value, str) and value.startswith("token_id:"):
        value = value[len("token_id:") :]
        if not value.lstrip("-").isdigit():
            raise ServerError(f"{where}: token {value!r} is not a token id")
        value = int(value)
    elif isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ServerError(f"{where}: expected a token id, got {str(value)[:40]!r} (vLLM: ask for "
                          "return_tokens_as_token_ids)")  # fmt: skip
    if value < 0 or (vocab is not None and value >= vocab):
        raise ServerError(f"{where}: token id {value} lies outside the vocabulary [0, {vocab})")
    return value


def rows_from_entries(entries, k, vocab, where):
    """(log-probs (n, k) float32, ids (n, k) int32) from per-position lists of (id, logprob),
    keeping each position's k largest; checked (see the module docstring)."""
    n = len(entries)
    values = np.empty((n, k), np.float32)
    ids = np.empty((n, k), np.int32)
    for i, entry in enumerate(entries):
        here = f"{where}, position {i}"
        if entry is None or len(entry) < k:
            got = 0 if entry is None else len(entry)
            raise ServerError(f"{here}: the server returned {got} log-probs, fewer than K = {k} (lower --top-logits, "
                              "or raise the server's limit)")  # fmt: skip
        pairs = {}
        for tok, lp in entry:
            tok = _token_id(tok, vocab, here)
            lp = _number(lp, here)
            if math.isnan(lp) or lp == math.inf:
                raise ServerError(f"{here}: log-prob {lp} of token {tok} is not a number a distribution can have")
            if lp > MASS_TOLERANCE:
                raise ServerError(f"{here}: log-prob {lp:.6g} of token {tok} is above 0: these are not normalised "
                                  "log-probabilities (raw logits or scores?)")  # fmt: skip
            if tok in pairs and pairs[tok] != lp:
                raise ServerError(f"{here}: token {tok} is listed twice with different log-probs")
            pairs[tok] = lp
        if len(pairs) < k:
            raise ServerError(f"{here}: {len(pairs)} distinct tokens, fewer than K = {k}")
        best = sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        ids[i] = [t for t, _ in best]
        values[i] = [lp for _, lp in best]
        mass = float(np.sum(np.exp(np.asarray([lp for _, lp in best], dtype=np.float64))))
        floor = -math.log(vocab) - MASS_TOLERANCE if vocab else -math.inf
        if mass == 0 or best[0][1] < floor:  # a distribution's likeliest token holds at least 1 / V
            lack = "no mass" if mass == 0 else "less than 1 / V"
            raise ServerError(f"{here}: the likeliest token's log-prob is {best[0][1]:.6g} (every listed token has "
                              f"{lack}): not a normalised distribution")  # fmt: skip
        if mass > 1 + MASS_TOLERANCE:
            raise ServerError(f"{here}: the top-{k} probabilities add up to {mass:.6f} > 1: not one normalised "
                              "distribution")  # fmt: skip
    return values, ids


def _sampling_fields(settings):
    return {"temperature": float(settings.temperature), "top_k": int(settings.top_k), "top_p": float(settings.top_p)}


def _shape_checked(method, name):
    """``method`` of a protocol with any answer of an unexpected JSON shape (a string where an object was
    expected, a missing key, a list too short) turned into one ServerError naming the server."""

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (AttributeError, TypeError, KeyError, IndexError) as exc:
            client = self.client
            raise ServerError(f"{client.what} {client.public}: answered JSON of an unexpected shape ({name}: "
                              f"{shown(exc)[:80]}): is it the kind of server --protocol says?") from None  # fmt: skip

    return checked


def _object(value, where, field):
    """``value`` as a JSON object (a dict; None gives {}), or a ServerError naming ``field``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ServerError(f"{where}: {field} is {shown(repr(value))[:40]}, not a JSON object")
    return value


class _Protocol:
    name = ""
    #: The methods that read a server's answers: an answer of another shape raises a ServerError (one line).
    _READERS = ("_read_info", "prompt_ids", "generate", "score")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls._READERS:
            if name in cls.__dict__:
                setattr(cls, name, _shape_checked(cls.__dict__[name], name))

    def __init__(self, client: ServerClient, *, tokenizer=None, model=None):
        self.client = client
        self.tokenizer = tokenizer
        self._model = model
        self._info = None

    def info(self) -> ServerInfo:
        if self._info is None:
            self._info = self._read_info()
        return self._info

    #: The vocabulary size the dump settled on (where the server states none), for checking ids.
    known_vocab = None

    @property
    def vocab(self):
        return self.info().vocab_size or self.known_vocab

    def _local_ids(self, text, chat):
        """The prompt's ids from the local tokenizer (a callable (text, chat) -> ids), or a ServerError."""
        if self.tokenizer is None:
            raise ServerError(f"{self.client.what} {self.client.public}: this server has no tokenize endpoint: give "
                              "--tokenizer (the model's Hugging Face tokenizer) for the prompts' ids")  # fmt: skip
        return [_token_id(t, self.vocab, "--tokenizer") for t in self.tokenizer(text, chat)]

    def probe_tokenize(self, text) -> list:
        """The ids of ``text`` tokenized plainly (no template, special tokens parsed), for comparing two
        servers' tokenizers."""
        return self.prompt_ids(text, chat=False, special=False)


class LlamaCppNative(_Protocol):
    """llama.cpp's ``llama-server``: ``/props``, ``/v1/models``, ``/apply-template``, ``/tokenize``,
    ``/completion`` (``n_probs``, token-id prompts, ``return_tokens``, grammars of token ids)."""

    name = "llama.cpp"
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
            raise ServerError(f"{self.client.what} {self.client.public}: GET /props answered {status}: not a "
                              "llama-server (or give --protocol)")  # fmt: skip
        _, models = self.client.probe("/v1/models")
        model, vocab, extra = None, None, {}
        where = f"{self.client.what} {self.client.public}"
        if isinstance(models, dict) and models.get("data"):
            data = models["data"]
            if not isinstance(data, list):
                raise ServerError(f"{where}/v1/models: data is {shown(repr(data))[:40]}, not a list of models")
            first = _object(data[0], f"{where}/v1/models", "data[0]")
            model = first.get("id")
            meta = _object(first.get("meta"), f"{where}/v1/models", "data[0].meta")
            vocab = meta.get("n_vocab")
            extra = {k: meta[k] for k in ("n_params", "n_embd", "size", "n_ctx_train") if k in meta}
        settings = _object(props.get("default_generation_settings"), f"{where}/props", "default_generation_settings")
        path = props.get("model_path")
        if path:
            extra["model_file"] = str(path).replace("\\", "/").rsplit("/", 1)[-1]  # the file's name, not its path
        if settings.get("speculative") is not None:
            extra["speculative"] = bool(settings.get("speculative"))
        return ServerInfo(url=self.client.public, protocol=self.name, engine="llama.cpp",
                          version=props.get("build_info"), model=model or extra.get("model_file"),
                          vocab_size=vocab if isinstance(vocab, int) else None,
                          slots=props.get("total_slots"), context=settings.get("n_ctx"), extra=extra)  # fmt: skip

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
        return [_token_id(t, self.vocab, "/tokenize") for t in ids]

    def _completion_body(self, prompt_ids, k):
        return {"prompt": list(map(int, prompt_ids)), "n_probs": int(k), "post_sampling_probs": False,
                "return_tokens": True, "verbose": self.openai, "cache_prompt": False, "stream": False, "min_p": 0.0,
                "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0}  # fmt: skip

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
            probs = _object(choice.get("logprobs"), where, "choices[0].logprobs").get("content")
            finish = choice.get("finish_reason")
            native = _object(answer.get("__verbose"), where, "__verbose").get("tokens")
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
                raise ServerError(f"{where}, position {i}: expected {{id, logprob, top_logprobs}} (post_sampling_probs "
                                  "must be off)")  # fmt: skip
            listed.append(_token_id(pos["id"], self.vocab, f"{where}, position {i}"))
            rows.append([(e.get("id"), e.get("logprob")) for e in pos["top_logprobs"] if isinstance(e, dict)])
        if not isinstance(native, list) or not native:
            return listed, rows, finish, answer.get("timings")
        tokens = [_token_id(t, self.vocab, f"{where}, tokens") for t in native]
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
            body.update({"n_predict": 1, "grammar": f"root ::= <[{self._safe_token()}]>", "temperature": 0.0,
                         "top_k": 1, "top_p": 1.0, "samplers": ["top_k"], "seed": 0})  # fmt: skip
            _, again, _, _ = self._parse(self._post(body), k, f"{where} (position {i})")
            if not again or again[0] is None:
                raise ServerError(f"{where}: the server gave no log-probs for position {i}, even alone")
            out[i] = again[0]
        return out

    def generate(self, prompt_ids, settings, max_new_tokens, seed, k):
        body = self._completion_body(prompt_ids, k)
        body.update(_sampling_fields(settings))
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
            body.update({"n_predict": len(forced), "temperature": 0.0, "top_k": 1, "top_p": 1.0,
                         "samplers": ["top_k"], "seed": 0, "ignore_eos": False,
                         "grammar": "root ::= " + " ".join(f"<[{t}]>" for t in forced)})  # fmt: skip
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


class OpenAICompletions(_Protocol):
    """The OpenAI-compatible ``/v1/completions``: vLLM (``logprobs``, ``prompt_logprobs``, token-id
    prompts, ``return_tokens_as_token_ids``, ``/tokenize``) or llama-server's own endpoint (llama.cpp's
    ``n_probs`` and grammars pass through it; its answer carries llama.cpp's ``logprobs.content``)."""

    name = "openai"

    def _read_info(self):
        status, models = self.client.probe("/v1/models")
        if status != 200 or not isinstance(models, dict) or not models.get("data"):
            raise ServerError(f"{self.client.what} {self.client.public}: GET /v1/models answered {status} without a "
                              "model list: not an OpenAI-compatible server")  # fmt: skip
        data = models["data"]
        if not isinstance(data, list):
            raise ServerError(f"{self.client.what} {self.client.public}/v1/models: data is {shown(repr(data))[:40]}, "
                              "not a list of models")  # fmt: skip
        first = _object(data[0], f"{self.client.what} {self.client.public}/v1/models", "data[0]")
        self._model = self._model or first.get("id")
        owner = str(first.get("owned_by", ""))
        props_status, props = self.client.probe("/props")
        if props_status == 200 and isinstance(props, dict) and "build_info" in props:  # llama-server
            self._llama = LlamaCppNative(self.client, model=self._model, openai=True)
            base = self._llama.info()
            self.flavour = "llama.cpp"
            return ServerInfo(url=base.url, protocol=self.name, engine="llama.cpp", version=base.version,
                              model=self._model, vocab_size=base.vocab_size, slots=base.slots, context=base.context,
                              extra=base.extra)  # fmt: skip
        version_status, version = self.client.probe("/version")
        self.flavour = "vllm" if owner == "vllm" or (version_status == 200 and isinstance(version, dict)) else "openai"
        return ServerInfo(url=self.client.public, protocol=self.name, engine=self.flavour,
                          version=version.get("version") if isinstance(version, dict) else None, model=self._model,
                          vocab_size=None, max_logprobs=None,
                          context=first.get("max_model_len"), extra={"owned_by": owner} if owner else {})  # fmt: skip

    def prompt_ids(self, text, chat=True, special=True):
        self.info()
        if self.flavour == "llama.cpp":
            return self._llama.prompt_ids(text, chat, special)
        if self.tokenizer is not None:
            return self.tokenizer(text, chat)
        if self.flavour != "vllm":
            return self._local_ids(text, chat)
        if chat:
            payload = {"model": self._model, "messages": [{"role": "user", "content": text}],
                       "add_generation_prompt": True}  # fmt: skip
        else:
            payload = {"model": self._model, "prompt": text, "add_special_tokens": special}
        body = self.client.post("/tokenize", payload)
        ids = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(ids, list):
            raise ServerError(f"{self.client.what} {self.client.public}/tokenize: no 'tokens' list in the answer")
        return [_token_id(t, self.vocab, "/tokenize") for t in ids]

    def generate(self, prompt_ids, settings, max_new_tokens, seed, k):
        self.info()
        if self.flavour == "llama.cpp":
            return self._llama.generate(prompt_ids, settings, max_new_tokens, seed, k)
        body = {"model": self._model, "prompt": list(map(int, prompt_ids)), "max_tokens": int(max_new_tokens),
                "stream": False, "logprobs": int(k), "return_tokens_as_token_ids": True, "return_token_ids": True,
                "seed": int(seed) % 2**31, **_sampling_fields(settings)}  # fmt: skip
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
            raise ServerError(f"{where}: the server returned no log-probs (logprobs=K must be allowed: vLLM's "
                              "--max-logprobs)")  # fmt: skip
        names = logprobs.get("tokens") or []
        tokens = [_token_id(t, self.vocab, f"{where}, token {i}") for i, t in enumerate(names)]
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
        body = {"model": self._model, "prompt": [*map(int, prompt_ids), *map(int, tokens)], "max_tokens": 1,
                "stream": False, "prompt_logprobs": int(k), "temperature": 0.0}  # fmt: skip
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


class SGLangGenerate(_Protocol):
    """SGLang's native ``/generate`` (``input_ids``, ``return_logprob``, ``top_logprobs_num``,
    ``logprob_start_len``); the prompt's ids from a local tokenizer (``tokenizer=``)."""

    name = "sglang"

    def _read_info(self):
        status, info = self.client.probe("/get_model_info")
        if status != 200 or not isinstance(info, dict):
            status, info = self.client.probe("/model_info")
        if status != 200 or not isinstance(info, dict):
            raise ServerError(f"{self.client.what} {self.client.public}: GET /get_model_info answered {status}: not "
                              "an SGLang server")  # fmt: skip
        _, server = self.client.probe("/get_server_info")
        version = server.get("version") if isinstance(server, dict) else None
        return ServerInfo(url=self.client.public, protocol=self.name, engine="sglang", version=version,
                          model=info.get("model_path"), vocab_size=info.get("vocab_size")
                          if isinstance(info.get("vocab_size"), int) else None)  # fmt: skip

    def prompt_ids(self, text, chat=True, special=True):
        if self.tokenizer is None:
            return self._local_ids(text, chat)
        return self.tokenizer(text, chat)

    def _call(self, input_ids, max_new_tokens, k, sampling, start):
        body = {"input_ids": list(map(int, input_ids)), "sampling_params": {"max_new_tokens": int(max_new_tokens),
                **sampling}, "return_logprob": True, "top_logprobs_num": int(k), "logprob_start_len": int(start),
                "return_text_in_logprobs": False, "stream": False}  # fmt: skip
        answer = self.client.post("/generate", body)
        if isinstance(answer, list):
            answer = answer[0] if answer else None
        meta = answer.get("meta_info") if isinstance(answer, dict) else None
        if not isinstance(meta, dict):
            raise ServerError(f"{self.client.what} {self.client.public}/generate: no meta_info in the answer")
        return answer, meta

    @staticmethod
    def _entries(rows, where):
        out = []
        for i, row in enumerate(rows):
            if row is None:
                out.append(None)
                continue
            if not isinstance(row, list):
                raise ServerError(f"{where}, position {i}: expected [[logprob, token_id, text], ...]")
            out.append([(e[1], e[0]) for e in row if isinstance(e, (list, tuple)) and len(e) >= 2])
        return out

    def generate(self, prompt_ids, settings, max_new_tokens, seed, k):
        sampling = _sampling_fields(settings)
        sampling["sampling_seed"] = int(seed) % 2**31
        answer, meta = self._call(prompt_ids, max_new_tokens, k, sampling, len(prompt_ids))
        where = f"{self.client.what} {self.client.public}/generate"
        tokens = answer.get("output_ids")
        if not isinstance(tokens, list):
            tokens = [e[1] for e in meta.get("output_token_logprobs") or []]
        tokens = [_token_id(t, self.vocab, where) for t in tokens]
        rows = meta.get("output_top_logprobs")
        if not isinstance(rows, list):
            raise ServerError(f"{where}: the server returned no output_top_logprobs")
        if len(rows) != len(tokens):
            raise ServerError(f"{where}: {len(tokens)} tokens but {len(rows)} rows of log-probs")
        values, ids = rows_from_entries(self._entries(rows, where), k, self.vocab, where)
        finish = meta.get("finish_reason")
        return Generation(tokens, values, ids, finish.get("type") if isinstance(finish, dict) else finish, None)

    def score(self, prompt_ids, tokens, k, ends=False, partial=()):
        _, meta = self._call(list(prompt_ids) + list(tokens), 1, k, {"temperature": 0.0}, len(prompt_ids))
        where = f"{self.client.what} {self.client.public}/generate (input_top_logprobs)"
        rows = meta.get("input_top_logprobs")
        if not isinstance(rows, list):
            raise ServerError(f"{where}: the server returned no input_top_logprobs")
        if len(rows) != len(tokens):
            raise AlignmentError(f"{where}: {len(rows)} input positions from logprob_start_len, expected {len(tokens)}")
        return rows_from_entries(self._entries(rows, where), k, self.vocab, where)


_CLASSES = {"llama.cpp": LlamaCppNative, "openai": OpenAICompletions, "sglang": SGLangGenerate}


def make_protocol(name, client, *, tokenizer=None, model=None):
    if name not in _CLASSES:
        raise ServerError(f"--protocol must be one of {', '.join(PROTOCOLS)} (or auto); got {name!r}")
    return _CLASSES[name](client, tokenizer=tokenizer, model=model)


def detect_protocol(client) -> str:
    """The protocol a server speaks, from what it answers: llama.cpp's ``/props`` (with ``build_info``),
    SGLang's ``/get_model_info``, else an OpenAI-compatible ``/v1/models``."""
    status, props = client.probe("/props")
    if status == 200 and isinstance(props, dict) and "build_info" in props:
        return "llama.cpp"
    status, info = client.probe("/get_model_info")
    if status == 200 and isinstance(info, dict) and "model_path" in info:
        return "sglang"
    status, models = client.probe("/v1/models")
    if status == 200 and isinstance(models, dict) and isinstance(models.get("data"), list):
        return "openai"
    raise ServerError(f"{client.what} {client.public}: answers none of llama.cpp's /props, SGLang's /get_model_info "
                      "or OpenAI's /v1/models: give --protocol, or check the URL")  # fmt: skip
