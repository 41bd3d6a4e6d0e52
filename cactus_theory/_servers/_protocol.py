"""What a server protocol is: the records it returns, the checks every answer passes, and the base class
of every protocol, which registers itself when defined (as a rule does): adding a protocol is one module
(``docs/contributing/house.md`` has a worked example). The built-in ones: llama.cpp's native
``/completion`` (``_llamacpp_protocol``), the OpenAI-compatible ``/v1/completions`` with vLLM's extensions
or llama.cpp's (``_openai_protocol``), SGLang's ``/generate`` (``_sglang_protocol``).

A protocol does four things for the dump (``_dump``), each returning plain arrays:

- ``info()``: what the server is (``ServerInfo``: engine, version, model id, vocabulary, its
  limit on top log-probs where it states one);
- ``prompt_ids(text, chat)``: the token ids of a prompt, with the server's own chat template
  (``chat=True``) or as plain text, from the server's tokenize endpoint (or a local Hugging Face
  tokenizer, ``tokenizer=``, for a server without one);
- ``generate(prompt_ids, settings, max_new_tokens, seed, k)``: the verifier samples a
  continuation and returns, at every generated position, its top-``k`` log-probabilities;
- ``score(prompt_ids, tokens, k)``: the draft is teacher-forced on ``tokens`` and returns its
  top-``k`` log-probabilities at the same positions.

The log-probabilities must be the raw model's (temperature 1, before every sampler): what a trace
stores. Rows are returned sorted by decreasing log-probability, ``k`` wide; a position with fewer than
``k`` entries, NaN or +inf values, log-probs above 0, a mass above 1, or ids outside the vocabulary
raise a ``ServerError`` naming the position (``rows_from_entries``).
"""

from __future__ import annotations

import abc
import functools
import math
from dataclasses import dataclass, field

import numpy as np

from .._math._validation import is_integer
from ._http import ServerClient, ServerError, shown

__all__ = [
    "AlignmentError",
    "Generation",
    "ProtocolPluginError",
    "ServerInfo",
    "ServerProtocol",
    "detect_protocol",
    "json_object",
    "make_protocol",
    "protocol_names",
    "rows_from_entries",
    "sampling_fields",
    "token_id",
]

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
        out = {
            "url": self.url,
            "protocol": self.protocol,
            "engine": self.engine,
            "version": self.version,
            "model": self.model,
            "vocab_size": self.vocab_size,
        }
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


def token_id(value, vocab, where):
    """An integer token id (or a vLLM ``token_id:N`` string) inside the vocabulary."""
    if isinstance(value, str) and value.startswith("token_id:"):
        value = value[len("token_id:") :]
        if not value.lstrip("-").isdigit():
            raise ServerError(f"{where}: token {value!r} is not a token id")
        value = int(value)
    elif isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)
    if not is_integer(value):
        raise ServerError(
            f"{where}: expected a token id, got {str(value)[:40]!r} (vLLM: ask for return_tokens_as_token_ids)"
        )
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
            raise ServerError(
                f"{here}: the server returned {got} log-probs, fewer than K = {k} (lower --top-logits, "
                "or raise the server's limit)"
            )
        pairs = {}
        for tok, lp in entry:
            tok = token_id(tok, vocab, here)
            lp = _number(lp, here)
            if math.isnan(lp) or lp == math.inf:
                raise ServerError(f"{here}: log-prob {lp} of token {tok} is not a number a distribution can have")
            if lp > MASS_TOLERANCE:
                raise ServerError(
                    f"{here}: log-prob {lp:.6g} of token {tok} is above 0: these are not normalised "
                    "log-probabilities (raw logits or scores?)"
                )
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
            raise ServerError(
                f"{here}: the likeliest token's log-prob is {best[0][1]:.6g} (every listed token has "
                f"{lack}): not a normalised distribution"
            )
        if mass > 1 + MASS_TOLERANCE:
            raise ServerError(
                f"{here}: the top-{k} probabilities add up to {mass:.6f} > 1: not one normalised distribution"
            )
    return values, ids


def sampling_fields(settings):
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
            raise ServerError(
                f"{client.what} {client.public}: answered JSON of an unexpected shape ({name}: "
                f"{shown(exc)[:80]}): is it the kind of server --protocol says?"
            ) from None

    return checked


def json_object(value, where, field):
    """``value`` as a JSON object (a dict; None gives {}), or a ServerError naming ``field``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ServerError(f"{where}: {field} is {shown(repr(value))[:40]}, not a JSON object")
    return value


class ServerProtocol(abc.ABC):
    """What a server's API says and how it is read: subclass it, give it a ``name``, say how a server of
    its kind is recognised (``detects``) and implement the four readers; defining the class registers it
    (``protocol_names``, ``detect_protocol``, ``make_protocol``, the CLI's ``--protocol`` choices and a
    ``--plugin`` module's protocols alike). ``detect_order``: lower is asked first (a protocol that many
    servers speak, such as OpenAI's, goes last). The readers (``_read_info``, ``prompt_ids``, ``generate``,
    ``score``) turn any answer of an unexpected JSON shape into one ``ServerError``."""

    #: The protocol's name (``--protocol NAME``); a class without one (a shared base) is not registered.
    name = ""
    #: Detection order: lower is asked first.
    detect_order = 50
    #: Whether its server reports its own step timings with each generation (prompt processing and each
    #: token): what ``calibrate --server`` times a pair by (llama.cpp's llama-server does).
    reports_timings = False
    #: The methods that read a server's answers: an answer of another shape raises a ServerError (one line).
    _READERS = ("_read_info", "prompt_ids", "generate", "score")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls._READERS:
            if name in cls.__dict__:
                setattr(cls, name, _shape_checked(cls.__dict__[name], name))
        if cls.__dict__.get("name"):
            _register(cls)

    @classmethod
    @abc.abstractmethod
    def detects(cls, client: ServerClient) -> bool:
        """Whether the server behind ``client`` speaks this protocol (asked with ``client.probe``: a GET that
        never raises for an HTTP status), for ``detect_protocol``."""

    @abc.abstractmethod
    def _read_info(self) -> ServerInfo:
        """What the server is (``ServerInfo``), asked once (``info``)."""

    @abc.abstractmethod
    def prompt_ids(self, text, chat=True, special=True) -> list:
        """The token ids of a prompt: with the server's chat template (``chat``) or as plain text (``special``:
        special tokens added and parsed), from its tokenize endpoint or ``self._local_ids``."""

    @abc.abstractmethod
    def generate(self, prompt_ids, settings, max_new_tokens, seed, k) -> Generation:
        """Sample a continuation of ``prompt_ids`` (``settings``: SamplingSettings, at most ``max_new_tokens``,
        ``seed``) with the top-``k`` log-probabilities of the raw model at every generated position."""

    @abc.abstractmethod
    def score(self, prompt_ids, tokens, k, ends=False, partial=()):
        """Teacher-force ``tokens`` after ``prompt_ids``: (log-probs (n, k), ids (n, k)) at each of their
        positions (``rows_from_entries``). ``ends``: the tokens end on an end-of-generation token;
        ``partial``: positions whose log-probs the generating server left out (``Generation.partial``)."""

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
            raise ServerError(
                f"{self.client.what} {self.client.public}: this server has no tokenize endpoint: give "
                "--tokenizer (the model's Hugging Face tokenizer) for the prompts' ids"
            )
        return [token_id(t, self.vocab, "--tokenizer") for t in self.tokenizer(text, chat)]

    def probe_tokenize(self, text) -> list:
        """The ids of ``text`` tokenized plainly (no template, special tokens parsed), for comparing two
        servers' tokenizers."""
        return self.prompt_ids(text, chat=False, special=False)


_REGISTERED: dict = {}


def _register(cls) -> None:
    """Record a protocol class under its name (a class defined again under the same name, as a reloaded
    module does, replaces it; another class may not take a name in use)."""
    old = _REGISTERED.get(cls.name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"protocol name {cls.name!r} is taken by {old.__module__}.{old.__qualname__}")
    _REGISTERED[cls.name] = cls


def protocol_names() -> tuple:
    """The registered protocols' names, in detection order."""
    return tuple(c.name for c in sorted(_REGISTERED.values(), key=lambda c: (c.detect_order, c.name)))


def protocol_class(name):
    """The registered protocol class ``name``."""
    if name not in _REGISTERED:
        raise ServerError(f"--protocol must be one of {', '.join(protocol_names())} (or auto); got {name!r}")
    return _REGISTERED[name]


def make_protocol(name, client, *, tokenizer=None, model=None) -> ServerProtocol:
    """The protocol ``name`` speaking to ``client``."""
    return protocol_class(name)(client, tokenizer=tokenizer, model=model)


class ProtocolPluginError(RuntimeError):
    """A protocol's own code failed (not the user's input, not the server's answer): the message names the
    protocol and the module that defines it."""


def _where(cls) -> str:
    return f"protocol {cls.name!r} ({cls.__module__}.{cls.__qualname__})"


def detect_protocol(client) -> str:
    """The protocol a server speaks: the first registered protocol, in detection order, that ``detects`` it.
    Every protocol is asked, so the client can say which was assumed and why (``client.assumed``: shown
    beside any later error of that server). A protocol whose ``detects`` raises anything but a
    ``ServerError`` (the server unreachable) is a ``ProtocolPluginError`` naming it and its module."""
    found = []
    for name in protocol_names():
        cls = _REGISTERED[name]
        try:
            if cls.detects(client):
                found.append(name)
        except ServerError:
            raise
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            raise ProtocolPluginError(
                f"{client.what} {client.public}: {_where(cls)} failed while detecting the server "
                f"({type(exc).__name__}: {first}): fix that protocol, or give --protocol"
            ) from exc
    if not found:
        raise ServerError(
            f"{client.what} {client.public}: speaks none of the protocols {', '.join(protocol_names())} "
            "(none recognised it): give --protocol, or check the URL"
        )
    name = found[0]
    if len(found) > 1:
        others = ", ".join(repr(n) for n in found[1:])
        client.assumed = (
            f"protocol {name!r} assumed: {others} also recognise this server and {name!r} is asked first; "
            f"give --protocol to choose"
        )
    else:
        client.assumed = f"protocol {name!r} detected; give --protocol to choose another"
    return name
