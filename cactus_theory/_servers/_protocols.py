"""The server protocols this package speaks, in one registry (``_protocol``): every module of this wing
whose name ends in ``_protocol`` is imported here, found by listing the wing, so that its classes register
(llama.cpp's native API, the OpenAI-compatible one, SGLang's: a new built-in protocol is one new file and no
line here); and what the dump and the calibration both need of a pair of servers: ``open_server`` (the
protocol asked from the server or named) and ``compare_tokenizers`` (two servers must share one tokenizer)."""

from __future__ import annotations

import importlib
import pkgutil
import sys

from ._http import ServerClient, ServerError
from ._protocol import AlignmentError, detect_protocol, make_protocol, protocol_names

__all__ = [
    "BUILTIN_PROTOCOL_MODULES",
    "PROBE_STRINGS",
    "AlignmentError",
    "compare_tokenizers",
    "detect_protocol",
    "make_protocol",
    "open_server",
    "protocol_names",
]

#: The built-in protocol modules, found by their names (defining a protocol class registers it).
BUILTIN_PROTOCOL_MODULES = tuple(
    importlib.import_module(f"{__package__}.{info.name}")
    for info in sorted(pkgutil.iter_modules(sys.modules[__package__].__path__), key=lambda i: i.name)
    if info.name.endswith("_protocol") and info.name != "_protocol"
)

#: Strings both servers tokenize before a dump: their ids must agree (ASCII, code, digits, accents,
#: CJK, emoji, whitespace runs and a chat-template marker).
PROBE_STRINGS = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x ** 2  # squares\n\n\n",
    "3.14159 2718281828 1,000,000 -42",
    "naïve café déjà vu Ünïcödé",
    "数学 가나다 ✓ 🚀🐱",
    "<|im_start|>user\n<|im_end|>",
)


def open_server(
    url, *, protocol="auto", api_key_env=None, timeout=600.0, retries=4, tokenizer=None, what="--server", model=None
):
    """(client, protocol object) for the server at ``url`` (``protocol`` "auto" asks the server)."""
    if protocol != "auto" and protocol not in protocol_names():
        raise ServerError(f"{what}: --protocol must be auto or one of {', '.join(protocol_names())}; got {protocol!r}")
    client = ServerClient(url, api_key_env=api_key_env, timeout=timeout, retries=retries, what=what)
    name = detect_protocol(client) if protocol == "auto" else protocol
    speaker = make_protocol(name, client, tokenizer=tokenizer, model=model)
    speaker.info()
    return client, speaker


def compare_tokenizers(verifier, draft, probes=PROBE_STRINGS):
    """Refuse two servers whose tokenizers differ: vocabulary sizes (where both say) and the ids of
    every probe string (plain tokenization, special tokens parsed). Returns the vocabulary size."""
    a, b = verifier.info(), draft.info()
    if a.vocab_size is not None and b.vocab_size is not None and a.vocab_size != b.vocab_size:
        raise ServerError(
            f"the verifier's vocabulary has {a.vocab_size} tokens, the draft's {b.vocab_size}: a trace "
            "needs one shared tokenizer (TLI's VocabularyMap handles drafters of another vocabulary)"
        )
    for text in probes:
        ids_a, ids_b = verifier.probe_tokenize(text), draft.probe_tokenize(text)
        if ids_a != ids_b:
            cut = next(
                (i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y), min(len(ids_a), len(ids_b))
            )
            raise ServerError(
                f"the two servers tokenize {text[:30]!r} differently (from token {cut}: "
                f"{ids_a[cut : cut + 3]} vs {ids_b[cut : cut + 3]}): they do not share a tokenizer"
            )
    return a.vocab_size if a.vocab_size is not None else b.vocab_size
