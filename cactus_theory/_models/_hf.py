"""The Hugging Face side, shared by the dumper and the decoder: loading models (Hugging Face ids,
local directories, GGUF files) with a cache of dequantised GGUF weights, what identifies a model
in a manifest, the chat template, one set of end-of-sequence ids, a KV-cached forward pass and
the one sampling loop."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import sys

from .._math._sampling import processed_probs
from .._util._files import utc_timestamp
from .._util._paths import cache_root
from ._clock import OwnClock, drain, paused
from ._identity import default_threads, file_sha256, model_identity, write_cache_entry
from ._identity import file_entry as _file_entry
from ._identity import source_of_gguf as _source_of_gguf

__all__ = [
    "CachedModel",
    "cached_model",
    "default_threads",
    "encode_chat",
    "eos_ids",
    "generate",
    "load_model",
    "model_identity",
    "sample_token",
    "teacher_forced_logits",
    "tokenizer_hash",
    "torch_threads",
]


def software_versions(engine="hf") -> dict:
    """The versions a dump or a calibration records: Python, torch, transformers, NumPy (and
    llama-cpp-python on engine "llama.cpp")."""
    import platform

    import numpy
    import torch
    import transformers

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
    }
    if engine == "llama.cpp":
        from ._llamacpp import llama_cpp_version

        out["llama_cpp_python"] = llama_cpp_version()
    return out


def engine_of(model) -> str:
    """The engine a loaded model runs on: "llama.cpp" for a ``LlamaCppModel``, else "hf"."""
    return getattr(model, "engine", "hf")


def cached_model(model):
    """A KV-cached runner over ``model`` with ``feed`` / ``crop`` / ``length``: a ``CachedModel``
    on the Hugging Face path, a fresh ``LlamaSequence`` of a llama.cpp model."""
    return model.sequence() if engine_of(model) == "llama.cpp" else CachedModel(model)


def model_threads(model) -> int:
    """The CPU threads a forward of ``model`` uses (torch's setting on the HF path)."""
    if engine_of(model) == "llama.cpp":
        return model.threads
    import torch

    return torch.get_num_threads()


def dtype_and_device(model) -> tuple[str, str]:
    """What a calibration records of a model's arithmetic: (dtype, device)."""
    if engine_of(model) == "llama.cpp":
        return "gguf as stored (llama.cpp kernels)", "cpu"
    weight = next(model.parameters())
    return str(weight.dtype).replace("torch.", ""), str(weight.device)


def model_arithmetic(model) -> dict:
    """What decides a model's rounding, as records keep it: its engine and (Hugging Face) dtype or (llama.cpp)
    the CPU features its kernels were built with, whether it used flash attention and llama-cpp-python's version
    (its llama.cpp); {} for a drafter without weights or a stand-in."""
    if engine_of(model) == "llama.cpp":
        from ._llamacpp import llama_cpp_version

        out = {"engine": "llama.cpp"}
        for key, value in (
            ("kernels", getattr(model, "kernels", None)),
            ("flash_attention", getattr(model, "flash_attention", None)),
            ("version", llama_cpp_version() if getattr(model, "kernels", None) else None),
        ):
            if value:
                out[key] = value
        return out
    try:
        return {"engine": "hf", "dtype": dtype_and_device(model)[0]}
    except (AttributeError, StopIteration, TypeError):
        return {}


def split_model(model_or_triple):
    """(the model, its identity or None) of a ``load_model`` triple or a bare model (a drafter's own
    ``identity`` where it has one)."""
    if isinstance(model_or_triple, tuple):
        return model_or_triple[0], (model_or_triple[2] if len(model_or_triple) > 2 else None)
    return model_or_triple, getattr(model_or_triple, "identity", None)


@contextlib.contextmanager
def torch_threads(threads):
    """Run the block with torch's intra-op threads set to ``threads`` (restored after). A CPU
    forward's float32 results depend on the thread count (the reductions are split by thread), so
    a dump fixes it: a resumed dump then equals the uninterrupted one bit for bit."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_device(device, what: str = "--device"):
    """``device`` as torch names it, where this machine has it: "cpu", "cuda", "cuda:N" (N below the GPUs
    it has), "mps"; anything else, or a device this machine lacks, one ValueError line naming ``what``,
    before any model loads."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{what} must be cpu, cuda, cuda:N or mps; got {device!r}") from None
    if parsed.type == "cpu":
        return str(parsed)
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"{what} {device!r}: this machine has no CUDA device torch can use; use --device cpu")
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(f"{what} {device!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
        return str(parsed)
    if parsed.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ValueError(f"{what} {device!r}: this machine has no MPS device (Apple silicon); use --device cpu")
        return str(parsed)
    raise ValueError(f"{what} must be cpu, cuda, cuda:N or mps; got {device!r}")


@contextlib.contextmanager
def model_threads_for(models, threads=None):
    """Run the block with every model of ``models`` on ``threads`` CPU threads: given, else the CPUs this
    process may use (``os.sched_getaffinity``: a process pinned to one core gets one thread, never torch's
    count of the machine's cores, which oversubscribes a busy machine). Torch's intra-op threads (Hugging
    Face models; restored after) and each llama.cpp model's (``set_threads``). Yields (threads, what the
    progress line says of them)."""
    chosen = int(threads) if threads is not None else default_threads()
    if chosen < 1:
        raise ValueError(f"threads must be an integer >= 1; got {threads!r}")
    why = "--threads" if threads is not None else "the CPUs this process may use"
    for model in models:
        if engine_of(model) == "llama.cpp":
            model.set_threads(chosen)
    if any(engine_of(m) != "llama.cpp" and hasattr(m, "parameters") for m in models):
        with torch_threads(chosen):
            yield chosen, f"{chosen} thread{'s' if chosen > 1 else ''}: {why}"
    else:
        yield chosen, f"{chosen} thread{'s' if chosen > 1 else ''}: {why}"


def torch_dtype(dtype):
    import torch

    if not isinstance(dtype, str):
        return dtype
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in table:
        raise ValueError(f"dtype must be one of {sorted(table)}; got {dtype!r}")
    return table[dtype]


def _looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", "./", "../", "~", "\\")) or (len(spec) > 1 and spec[1] == ":") or os.path.exists(spec)


@contextlib.contextmanager
def _transformers_bars(enabled):
    """transformers' own progress bars (dequantising, loading weights) follow ``enabled``."""
    import sys

    show = enabled or (enabled is None and sys.stderr.isatty())
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - the models extra is missing; the caller says so
        yield
        return
    before = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if show else hf_logging.disable_progress_bar)()
    try:
        if show:
            yield
        else:  # the GGUF dequantiser's bar is a bare tqdm on sys.stderr: point that at /dev/null
            with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
                yield
    finally:
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()


def load_model(spec, device="cpu", dtype="float32", *, cache=True, progress=None, engine="hf", **llama_options):
    """(model, tokenizer, identity); see ``_load_model``. ``progress``: transformers' loading bars
    (True, False, or None: only on a terminal). ``engine="llama.cpp"``: a GGUF file run by
    llama.cpp (``_llamacpp.load_llamacpp``; ``dtype`` and ``cache`` do not apply: the weights stay
    as stored), with ``llama_options`` ``threads``, ``context`` (tokens per sequence) and
    ``sequences`` (sequences one context holds: decoding B prompts at once, or several runs
    alternating, needs one each)."""
    from ._llamacpp import check_engine, load_llamacpp

    if not isinstance(spec, tuple):
        device = check_device(device, "device")
    if check_engine(engine) == "llama.cpp":
        with _transformers_bars(progress):
            return load_llamacpp(spec, device, progress=progress, **llama_options)
    if llama_options:
        raise ValueError(f"{sorted(llama_options)} apply to engine 'llama.cpp' only")
    with _transformers_bars(progress):
        return _load_model(spec, device, dtype, cache, progress)


def _load_model(spec, device="cpu", dtype="float32", cache=True, progress=None):
    """(model, tokenizer, identity) from a Hugging Face id, a local directory, a GGUF file, or an
    already built (model, tokenizer) pair.

    A GGUF file is dequantised by transformers (slow: about a minute for 1.5B parameters); with
    ``cache=True`` the dequantised float32 weights and the tokenizer are kept as safetensors in
    ``cache_root()/dequantised/<sha256 of the GGUF>`` the first time, and later loads read them
    from there (``docs/tutorials/walkthrough.md`` gives the measured times). ``identity`` is
    ``model_identity``'s record. Errors: a local path that does not exist, or an id that is
    neither a local path nor reachable, raise a ValueError saying so.
    """
    if isinstance(spec, tuple):
        model, tokenizer = spec
        return model.to(device).eval(), tokenizer, model_identity(type(model).__name__, "in-memory model", {})
    spec = os.path.expanduser(str(spec))
    tdtype = torch_dtype(dtype)
    if spec.endswith(".gguf"):
        if not os.path.isfile(spec):
            raise ValueError(f"GGUF file {spec!r} does not exist (experiments/fetch_models.py builds the Qwen pair)")
        model, tokenizer = _load_gguf(spec, tdtype, cache, progress)
        name = os.path.basename(spec)
        identity = model_identity(name[: -len(".gguf")], _source_of_gguf(spec), {name: _file_entry(spec)})
    elif _looks_like_path(spec):
        if not os.path.isdir(spec):
            raise ValueError(f"model directory {spec!r} does not exist: give a Hugging Face id, a directory or a .gguf")
        model, tokenizer = _from_pretrained(spec, tdtype)
        files = {
            f: _file_entry(os.path.join(spec, f))
            for f in sorted(os.listdir(spec))
            if f.endswith((".safetensors", ".bin", ".json", ".model", ".txt"))
        }
        identity = model_identity(os.path.basename(os.path.normpath(spec)), "local directory", files)
    else:
        model, tokenizer = _from_pretrained(spec, tdtype)
        identity = model_identity(spec, "huggingface.co", {})
    return model.to(device).eval(), tokenizer, identity


def _from_pretrained(spec, tdtype, **kwargs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(spec, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=tdtype, **kwargs)
    except OSError as exc:
        raise ValueError(
            f"cannot load model {spec!r}: not a local directory, and not reachable as a Hugging Face id "
            f"({str(exc).splitlines()[0][:200]})"
        ) from None
    return model, tokenizer


def gguf_estimate(path):
    """(parameters, seconds, GiB) a GGUF file's first load is expected to take: parameters from
    the file size at Q4_K_M's 4.85 bits per weight; about 45 s per billion parameters to
    dequantise on one of this project's 2-core machines (1.5B: 65-75 s idle, several minutes
    on a busy machine); memory: the float32 weights twice (transformers' dequantised tensors and
    the model) plus 1 GiB."""
    params = os.path.getsize(path) * 8 / 4.85
    return params, 45.0 * params / 1e9, 2 * 4 * params / 2**30 + 1.0


def _load_gguf(path, tdtype, cache, progress=None):
    import torch

    directory, name = os.path.split(os.path.abspath(path))
    root = os.path.join(cache_root(), "dequantised")
    digest = file_sha256(path) if cache else None
    target = os.path.join(root, digest) if cache else None
    if target is not None and os.path.exists(os.path.join(target, "COMPLETE")):
        return _from_pretrained(target, tdtype)
    if progress is not False:  # minutes without a word otherwise: say what is happening and what it costs
        params, seconds, gib = gguf_estimate(path)
        print(
            f"dequantising {name} (about {params / 1e9:.1f}B parameters): about {max(seconds / 60, 0.1):.0f} min and "
            f"{gib:.0f} GiB of memory on 2 cores, longer on a busy machine"
            + ("; cached for later loads" if cache else " (--no-model-cache: every load pays it)"),
            file=sys.stderr,
            flush=True,
        )
    if not cache:
        return _from_pretrained(directory, tdtype, gguf_file=name)
    model, tokenizer = _from_pretrained(directory, torch.float32, gguf_file=name)
    write_cache_entry(
        root,
        digest,
        lambda staging: _save_dequantised(model, tokenizer, staging),
        json.dumps({"gguf": name, "created": utc_timestamp()}),
    )
    return model.to(tdtype), tokenizer


def _save_dequantised(model, tokenizer, directory):
    """Save a model loaded from GGUF (its weights are plain float32 tensors by now) as an ordinary
    checkpoint: transformers refuses ``save_pretrained`` for it, so the config is written without
    its GGUF quantization entry and the tensors with safetensors."""
    import copy

    from safetensors.torch import save_model

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)
    save_model(model, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(directory)


def tokenizer_hash(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256("\n".join(f"{t}\t{i}" for t, i in vocab).encode()).hexdigest()


def encode_chat(tokenizer, text: str, what: str = "the prompt", *, chat: bool = True):
    """Token ids of a single user turn with the generation prompt (the model's chat template); with
    ``chat=False`` the text tokenized as it is (a prompt that ends where the answer's token begins, such as
    "Answer:"). A prompt that tokenises to nothing raises a ValueError naming ``what``."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        ids = list(ids)
    else:
        ids = list(tokenizer(text)["input_ids"])
    if not ids:
        raise ValueError(f"{what} tokenises to nothing ({text[:60]!r}): give it some text")
    return ids


def prompt_ids_with(name):
    """A callable ``(text, chat) -> token ids`` from the Hugging Face tokenizer ``name`` (a hub id or a
    local directory): the model's chat template around the text when ``chat`` (``encode_chat``), else
    the text tokenized as it is. For servers without a tokenize endpoint (SGLang)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name)

    def ids(text, chat):
        return encode_chat(tok, text) if chat else list(tok(text)["input_ids"])

    return ids


def eos_ids(model, tokenizer) -> set[int]:
    """The end-of-sequence ids: the tokenizer's and every one in the model's generation config."""
    ids = {tokenizer.eos_token_id}
    config = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(config if isinstance(config, (list, tuple, set)) else [config])
    return {int(i) for i in ids if i is not None}


@functools.cache
def _takes_cache(model_class) -> bool:
    return "cache" in inspect.signature(model_class.forward).parameters


def forward(model, ids, cache):
    """One cached forward pass: (logits, new cache). transformers >= 5.x names the cache
    argument and output ``cache``; earlier versions ``past_key_values`` (kept where needed). A model whose config
    names the package's slot attention (a copy made while a slot block held it, e.g. sent to a Dask worker) gets
    it registered in this process first (the same arithmetic as sdpa)."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == "cactus_slots":
        from ._slots import _registered

        _registered()
    if _takes_cache(type(model)):
        out = model(input_ids=ids, cache=cache, use_cache=True)
    else:
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    new = getattr(out, "cache", None)
    return out.logits, new if new is not None else out.past_key_values


class CachedModel:
    """A model with a KV cache over a growing token list."""

    def __init__(self, model):
        import torch

        self.model, self.torch = model, torch
        self.cache = None
        self.length = 0  # tokens in the cache

    def feed(self, tokens, want="all"):
        """Run the model on ``tokens`` after the cached prefix; logits (len, V) float32 (``want``
        ="last": only the last row; the forward computes them all on this path)."""
        torch = self.torch
        ids = torch.tensor([list(tokens)], device=next(self.model.parameters()).device)
        with torch.no_grad():
            logits, self.cache = forward(self.model, ids, self.cache)
        self.length += len(tokens)
        return logits[0, -1:].float() if want == "last" else logits[0].float()

    def crop(self, length):
        """Keep the first ``length`` cached tokens (transformers 5: crop takes a negative count)."""
        if length < self.length:
            try:
                self.cache.crop(length - self.length)
            except ValueError:  # transformers 4.x: crop(max_length) keeps that many
                self.cache.crop(length)
            self.length = length


def sample_token(probs, generator) -> int:
    """One token from a probability row (torch), in float64 on the host, with ``generator``."""
    import torch

    return int(torch.multinomial(probs.double().cpu(), 1, generator=generator)[0])


def generate_steps(model, prompt_ids, settings, max_new_tokens, generator, eos, keep_logits=False):
    """``generate`` as a generator that yields after the prefill and after each token, so several
    runs can alternate on one machine (``_decode.interleave``); its clock (``OwnClock``) counts
    only its own time. Returns (as the generator's value) (tokens, raw logit rows as NumPy or None,
    seconds, {"prefill": seconds, "token_seconds": [...]})."""
    clock = OwnClock()
    runner = cached_model(model)
    logits = runner.feed(prompt_ids, want="last")[-1]
    prefill = clock.elapsed()
    yield from paused(clock)
    tokens, rows, stamps = [], [], []
    for _ in range(max_new_tokens):
        if keep_logits:
            rows.append(logits.cpu())
        token = sample_token(processed_probs(logits[None], settings)[0], generator)
        tokens.append(token)
        stamps.append(clock.elapsed() - prefill)
        if token in eos:
            break
        logits = runner.feed([token])[-1]
        yield from paused(clock)
    seconds = clock.elapsed()
    timing = {"prefill": prefill, "token_seconds": stamps}
    if not keep_logits:
        return tokens, None, seconds, timing
    import torch

    return tokens, torch.stack(rows).numpy(), seconds, timing


def generate(model, prompt_ids, settings, max_new_tokens, generator, eos, keep_logits=False, timing=None):
    """The one sampling loop: sample from ``model`` with a KV cache after ``prompt_ids``, until an
    end-of-sequence id or ``max_new_tokens``. Returns (tokens, raw logit rows (T, V) float32 as
    NumPy or None, seconds). ``timing`` (a dict) receives "prefill" (seconds to process the
    prompt) and "token_seconds" (seconds after the prefill at which each token was emitted)."""
    tokens, rows, seconds, times = drain(
        generate_steps(model, prompt_ids, settings, max_new_tokens, generator, eos, keep_logits)
    )
    if timing is not None:
        timing.update(times)
    return tokens, rows, seconds


def teacher_forced_logits(model, prompt_ids, tokens):
    """``model``'s raw next-token logits (T, V) float32 before each of the T ``tokens`` after the
    prompt, from one forward pass over prompt + tokens[:-1] (on llama.cpp: the prompt, then the
    tokens, in one sequence: ``LlamaCppModel.teacher_forced``)."""
    if engine_of(model) == "llama.cpp":
        return model.teacher_forced(prompt_ids, tokens)
    import torch

    device = next(model.parameters()).device
    full = torch.tensor([list(prompt_ids) + list(tokens[:-1])], device=device)
    with torch.no_grad():
        logits = model(input_ids=full).logits[0].float()
    return logits[len(prompt_ids) - 1 :].cpu().numpy()
