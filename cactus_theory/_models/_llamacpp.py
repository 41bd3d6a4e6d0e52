"""The llama.cpp engine: GGUF models run by llama.cpp's own quantised CPU kernels through
``llama-cpp-python``'s low-level binding (>= 0.3.36; the ``llamacpp`` extra), behind the same
small interface as the Hugging Face path (``_hf.CachedModel``): feed tokens after a cached
prefix and get their raw logits, crop the cache back to a prefix.

One ``LlamaCppModel`` holds one llama.cpp context with several sequences (``sequences``, each
with its own slice of the KV cache, ``context`` tokens long): a ``LlamaSequence`` is one of
them, and ``evaluate`` runs the tokens of several sequences in one ``llama_decode`` call (a
batch), each at its own positions. A rejected tail is removed from a sequence's cache with
``llama_memory_seq_rm``. The logits are llama.cpp's, exactly as it computes them: the weights
stay quantised (Q4_K_M for the Qwen pair) and the matrix products run on quantised activations,
so they differ from the Hugging Face path's dequantised float32 / bfloat16 arithmetic (measured
in ``docs/results/llama-cpp-against-hugging-face.md``) and, by rounding, with the shape of the batch they were
computed in (a prefix fed in one call or two). A dump is deterministic all the same: the same
tokens are fed in the same calls on a resume.

The tokenizer is the Hugging Face one read from the GGUF file (the same token ids and chat
template on both engines), cached in ``cache_root()/tokenizers`` after the first load (reading
a 150k-token vocabulary out of a GGUF file takes about 20 s; later loads about a second).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import weakref
from types import SimpleNamespace

import numpy as np

from .._math._validation import SettingError, check_int
from .._util._files import utc_timestamp
from .._util._paths import cache_root

__all__ = [
    "ENGINES",
    "LlamaCppModel",
    "LlamaSequence",
    "check_engine",
    "llama_cpp_version",
    "load_llamacpp",
]

#: The engines that run real models: Hugging Face transformers (any checkpoint; GGUF dequantised)
#: and llama.cpp (GGUF files, quantised kernels, several sequences per batch).
ENGINES = ("hf", "llama.cpp")
#: Tokens of one sequence's KV cache (prompt, output and a drafted block) by default.
DEFAULT_CONTEXT = 2048
#: Tokens one ``llama_decode`` call takes at most (longer inputs are split, deterministically).
DEFAULT_BATCH = 512


def check_engine(engine) -> str:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
    return engine


@functools.cache
def _lib():
    """The binding, imported once, its log silenced and its backend started."""
    try:
        import llama_cpp
    except ImportError:
        raise ValueError(
            "engine 'llama.cpp' needs llama-cpp-python: pip install -e '.[llamacpp]' (it compiles llama.cpp with "
            "cmake and a C++ compiler; pip caches the built wheel)"
        ) from None
    global _LOG_CALLBACK
    _LOG_CALLBACK = llama_cpp.llama_log_callback(_drop_log)  # kept alive here: C holds only a pointer
    llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p())
    llama_cpp.llama_backend_init()
    return llama_cpp


_LOG_CALLBACK = None


#: While a context is made, llama.cpp's log lines are kept here (what it decided of its flash attention).
_HEARD: list | None = None


def _drop_log(level, text, user_data):  # pragma: no cover - called from C
    if _HEARD is not None:
        _HEARD.append(text.decode(errors="replace") if isinstance(text, bytes) else str(text))
    return None


#: ``flash_attention`` as llama.cpp's context parameter takes it.
_FLASH = {"auto": -1, False: 0, True: 1}


def _flash_attention_used(requested, heard) -> str:
    """ "enabled" or "disabled": what llama.cpp used, as asked or, asked "auto", as it said it decided (its log
    line "Flash Attention enabled" / "... set to disabled"); "auto" where it said nothing."""
    if requested is not True and requested is not False:
        text = "".join(heard)
        if "Flash Attention enabled" in text:
            return "enabled"
        if "Flash Attention not supported" in text:
            return "disabled"
        return "auto"
    return "enabled" if requested else "disabled"


def llama_cpp_version():
    """llama-cpp-python's version, or None when it is not installed."""
    try:
        from importlib.metadata import version

        return version("llama_cpp_python")
    except Exception:
        return None


def _release(lib, ctx, model, batch):
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)
    lib.llama_model_free(model)


class LlamaSequence:
    """One sequence of a ``LlamaCppModel``'s context: a KV cache over a growing token list, with
    the interface of ``_hf.CachedModel`` (``feed``, ``crop``, ``length``). Its slot returns to the
    model when it is garbage-collected or ``close``\\ d."""

    def __init__(self, owner, seq_id):
        self.owner, self.seq_id, self.length = owner, seq_id, 0
        self._finalizer = weakref.finalize(self, owner._give_back, seq_id)

    def feed(self, tokens, want="all"):
        """Run the model on ``tokens`` after the cached prefix: their raw logits as a torch
        float32 tensor (len, V) (``want="last"``: only the last row, (1, V))."""
        return self.owner.evaluate([(self, list(tokens), want)])[0]

    def crop(self, length):
        """Keep the first ``length`` cached tokens (``llama_memory_seq_rm`` of the rest)."""
        if length < self.length:
            self.owner._remove(self.seq_id, int(length))
            self.length = int(length)

    def close(self):
        self._finalizer()


def kernels_of(lib) -> str:
    """The CPU features llama.cpp's kernels were built with (``llama_print_system_info``: "AVX2,AVX512,..."),
    which decide its rounding: a portable AVX2 build and an AVX-512 one give slightly different logits."""
    info = lib.llama_print_system_info()
    info = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    return ",".join(re.findall(r"([A-Z0-9_]+) = 1", info))


class LlamaCppModel:
    """A GGUF model loaded by llama.cpp, with one context of ``sequences`` sequences of
    ``context`` tokens each (default 2,048, or the model's own limit, ``train_context``, when it is
    shorter; more than that limit is refused) (``threads`` CPU threads; default: the cores this process
    may use). A sequence that would outgrow its context is refused with the length it needs.

    ``config.vocab_size`` and ``generation_config.eos_token_id`` read as a transformers model's do,
    so the dumper, the decoder and the calibration take either. ``device="cuda"`` offloads every
    layer (a CUDA build of llama-cpp-python; the CPU build ignores it)."""

    engine = "llama.cpp"

    def __init__(
        self,
        path,
        *,
        threads=None,
        context=None,
        sequences=8,
        batch=DEFAULT_BATCH,
        device="cpu",
        flash_attention="auto",
    ):
        from ._identity import default_threads

        for name, value, low in (("context", context, 8), ("sequences", sequences, 1), ("batch", batch, 1)):
            if value is not None or name != "context":
                check_int(value, name, low)
        if not (flash_attention is True or flash_attention is False or flash_attention == "auto"):
            raise ValueError(f"flash_attention must be 'auto', True or False; got {flash_attention!r}")
        lib = _lib()
        self.lib, self.path = lib, str(path)
        self.threads = int(threads) if threads is not None else default_threads()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = -1 if str(device).startswith("cuda") else 0
        model = lib.llama_model_load_from_file(self.path.encode(), params)
        if not model:
            raise ValueError(f"llama.cpp cannot load {self.path!r} (not a GGUF model file it knows)")
        #: The context the model was trained with (its own limit; llama.cpp's n_ctx_train).
        self.train_context = int(lib.llama_model_n_ctx_train(model))
        if context is None:  # the default, within the model's own limit
            context = min(DEFAULT_CONTEXT, self.train_context) if self.train_context > 0 else DEFAULT_CONTEXT
        elif int(context) > self.train_context > 0:
            lib.llama_model_free(model)
            limit = self.train_context
            raise SettingError(
                "context", f"{context} tokens is more than the model's own limit of {limit}", given="context"
            )
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = int(context) * int(sequences)
        cparams.n_seq_max = int(sequences)
        cparams.n_batch = cparams.n_ubatch = int(batch)
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.no_perf = True
        cparams.flash_attn_type = _FLASH["auto" if flash_attention == "auto" else flash_attention]
        global _HEARD
        _HEARD = []
        try:
            ctx = lib.llama_init_from_model(model, cparams)
            #: What llama.cpp used ("enabled" / "disabled"): it changes the logits (by up to 0.1 here).
            self.flash_attention = _flash_attention_used(flash_attention, _HEARD)
        finally:
            _HEARD = None
        if not ctx:
            lib.llama_model_free(model)
            raise ValueError(f"llama.cpp cannot make a context of {sequences} x {context} tokens for {self.path!r}")
        self._model, self._ctx = model, ctx
        self._batch = lib.llama_batch_init(int(batch), 0, 1)
        self._finalizer = weakref.finalize(self, _release, lib, ctx, model, self._batch)
        self._memory = lib.llama_get_memory(ctx)
        vocab = lib.llama_model_get_vocab(model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(vocab))
        # llama.cpp shortens the batch to a context smaller than it: a larger chunk would fail its assertion
        self.batch_tokens, self.sequences = min(int(batch), int(lib.llama_n_batch(ctx))), int(sequences)
        self.kernels = kernels_of(lib)
        self.context = int(lib.llama_n_ctx(ctx)) // int(sequences)
        eos = [int(lib.llama_vocab_eos(vocab)), int(lib.llama_vocab_eot(vocab))]
        self.config = SimpleNamespace(vocab_size=self.vocab_size)
        self.generation_config = SimpleNamespace(eos_token_id=[t for t in eos if t >= 0])
        self._free = list(range(int(sequences)))[::-1]

    # -- sequences ------------------------------------------------------------------------------
    def sequence(self) -> LlamaSequence:
        """A fresh sequence (an empty cache); a ValueError when all ``sequences`` are in use."""
        if not self._free:
            raise ValueError(
                f"all {self.sequences} sequences of this llama.cpp model are in use: load it with more sequences "
                "(load_model(..., sequences=N)) or close some"
            )
        seq_id = min(self._free)  # the lowest free id: a batch of the sequences in use stays in ascending order
        self._free.remove(seq_id)
        self._remove(seq_id, 0)
        return LlamaSequence(self, seq_id)

    def _give_back(self, seq_id):
        if self._finalizer.alive:
            self._remove(seq_id, 0)
            self._free.append(seq_id)

    def _remove(self, seq_id, start):
        if not self.lib.llama_memory_seq_rm(self._memory, int(seq_id), int(start), -1):
            raise RuntimeError(f"llama.cpp could not remove positions >= {start} of sequence {seq_id}")

    # -- forwards --------------------------------------------------------------------------------
    def evaluate(self, requests):
        """Feed several sequences at once: ``requests`` is a list of (``LlamaSequence``, tokens,
        want) with want "all" (every token's logits) or "last" (the last one's); their tokens go
        through llama.cpp in as few ``llama_decode`` calls as ``batch`` allows (one when they fit),
        each token at its sequence's next position. Returns per request a torch float32 tensor of
        raw logits ((len, V), or (1, V) for "last"; (0, V) for no tokens)."""
        import torch

        lib, batch, width = self.lib, self._batch, self.vocab_size
        plan = []  # per token (seq id, position, token, its request's output array or None, row)
        for seq, tokens, want in requests:  # every request checked before any is fed
            if seq.owner is not self:
                raise ValueError("a sequence of another model was given to evaluate")
            if want not in ("all", "last"):
                raise ValueError(f"want must be 'all' or 'last'; got {want!r}")
            if seq.length + len(tokens) > self.context:
                needed = seq.length + len(tokens)
                within = (
                    f"give at least {needed}, within the model's own limit of {self.train_context}"
                    if needed <= self.train_context
                    else f"more than the model's own limit of {self.train_context} too: shorten the prompt"
                )
                raise SettingError(
                    "context",
                    f"a sequence would hold {needed} tokens, more than the context of {self.context} each has: "
                    + within,
                    given="load_model(..., context=N)",
                )
        # the batch holds the sequences in ascending id: llama.cpp splits a batch whose sequence ids are out of
        # order into several passes (measured on the 1.5B verifier, 2 cores: 4 sequences 1.4-1.9x slower a step)
        order = sorted(range(len(requests)), key=lambda r: requests[r][0].seq_id)
        rows = [None] * len(requests)
        for r in order:
            seq, tokens, want = requests[r]
            n_out = len(tokens) if want == "all" else min(len(tokens), 1)
            out = np.empty((n_out, width), dtype=np.float32)
            rows[r] = out
            for i, token in enumerate(tokens):
                index = i if want == "all" else (0 if i == len(tokens) - 1 else None)
                plan.append((seq.seq_id, seq.length + i, int(token), out if index is not None else None, index))
            seq.length += len(tokens)
        for start in range(0, len(plan), self.batch_tokens):
            chunk = plan[start : start + self.batch_tokens]
            batch.n_tokens = len(chunk)
            for i, (seq_id, pos, token, out, _) in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
                batch.seq_id[i][0] = seq_id
                batch.logits[i] = out is not None
            code = lib.llama_decode(self._ctx, batch)
            if code != 0:
                raise RuntimeError(f"llama_decode failed with code {code} (the KV cache is full, or the input is bad)")
            for i, (_, _, _, out, index) in enumerate(chunk):
                if out is not None:
                    out[index] = np.ctypeslib.as_array(lib.llama_get_logits_ith(self._ctx, i), shape=(width,))
        return [torch.from_numpy(r) for r in rows]

    def teacher_forced(self, prompt_ids, tokens):
        """Raw next-token logits (T, V) float32 before each of the T ``tokens`` after the prompt:
        the prompt fed first (its last row kept), then ``tokens[:-1]``, in one fresh sequence."""
        seq = self.sequence()
        try:
            first = seq.feed(list(prompt_ids), want="last")
            rest = seq.feed(list(tokens[:-1])) if len(tokens) > 1 else first[:0]
            import torch

            return torch.cat([first, rest]).numpy()
        finally:
            seq.close()

    def set_threads(self, threads):
        """Use ``threads`` CPU threads from now on (a resumed dump takes its trace's count)."""
        self.threads = int(threads)
        self.lib.llama_set_n_threads(self._ctx, self.threads, self.threads)

    def close(self):
        """Free the context and the model now (else when garbage-collected)."""
        self._finalizer()


def load_tokenizer(path, progress=None):
    """The Hugging Face tokenizer stored in a GGUF file, cached by the file's sha256 in
    ``cache_root()/tokenizers`` (or taken from the HF path's dequantised copy when there is one)."""
    import sys

    from transformers import AutoTokenizer

    from ._identity import file_sha256, write_cache_entry

    digest = file_sha256(path)
    for root in ("tokenizers", "dequantised"):
        cached = os.path.join(cache_root(), root, digest)
        if os.path.exists(os.path.join(cached, "COMPLETE")):
            return AutoTokenizer.from_pretrained(cached)
    if progress is not False:
        print(
            f"reading the tokenizer of {os.path.basename(path)} (once; cached for later loads)",
            file=sys.stderr,
            flush=True,
        )
    directory, name = os.path.split(os.path.abspath(path))
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    write_cache_entry(
        os.path.join(cache_root(), "tokenizers"), digest, tokenizer.save_pretrained, f"{name} {utc_timestamp()}\n"
    )
    return tokenizer


def load_llamacpp(
    spec, device="cpu", *, progress=None, threads=None, context=None, sequences=8, flash_attention="auto"
):
    """(``LlamaCppModel``, tokenizer, identity) for a GGUF file (the identity as the HF path
    records it: name, source, the file's sha256 and size). ``flash_attention``: "auto" (llama.cpp decides;
    on the CPU it enables it), True or False."""
    from ._identity import file_entry, model_identity, source_of_gguf

    if isinstance(spec, tuple) or not str(spec).endswith(".gguf"):
        raise ValueError(
            f"engine 'llama.cpp' runs GGUF files: give a .gguf path (got {str(spec)[:80]!r}); "
            "Hugging Face ids and directories run on engine 'hf'"
        )
    path = os.path.expanduser(str(spec))
    if not os.path.isfile(path):
        raise ValueError(f"GGUF file {path!r} does not exist (experiments/fetch_models.py builds the Qwen pair)")
    model = LlamaCppModel(
        path, threads=threads, context=context, sequences=sequences, device=device, flash_attention=flash_attention
    )
    tokenizer = load_tokenizer(path, progress)
    name = os.path.basename(path)
    identity = model_identity(name[: -len(".gguf")], source_of_gguf(path), {name: file_entry(path)})
    return model, tokenizer, identity
