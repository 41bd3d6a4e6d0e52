"""The model side for scripts: loading a model (Hugging Face id, local directory or GGUF file,
dequantised once and cached; or a GGUF file on the llama.cpp engine), its chat template, its
end-of-sequence ids, teacher-forced logits, a file's sha256 and the user cache. Needs the
``models`` extra (torch, transformers, gguf, accelerate); the llama.cpp engine the ``llamacpp``
extra."""

from ._models._hf import (
    cached_model,
    encode_chat,
    engine_of,
    eos_ids,
    file_sha256,
    load_model,
    model_identity,
    teacher_forced_logits,
)
from ._models._llamacpp import ENGINES, LlamaCppModel, llama_cpp_version
from ._util._paths import cache_root

__all__ = [
    "ENGINES",
    "LlamaCppModel",
    "cache_root",
    "cached_model",
    "encode_chat",
    "engine_of",
    "eos_ids",
    "file_sha256",
    "llama_cpp_version",
    "load_model",
    "model_identity",
    "teacher_forced_logits",
]
