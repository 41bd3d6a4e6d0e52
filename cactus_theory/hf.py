"""The Hugging Face side for scripts: loading a model (Hugging Face id, local directory or GGUF
file, dequantised once and cached), its chat template, its end-of-sequence ids, a file's sha256
and the user cache. Needs the ``models`` extra (torch, transformers, gguf, accelerate)."""

from ._models._hf import encode_chat, eos_ids, file_sha256, load_model, model_identity
from ._util._paths import cache_root

__all__ = ["cache_root", "encode_chat", "eos_ids", "file_sha256", "load_model", "model_identity"]
