"""The model side for scripts: loading a model (Hugging Face id, local directory or GGUF file,
dequantised once and cached; or a GGUF file on the llama.cpp engine), its chat template, its
end-of-sequence ids, teacher-forced logits, a file's sha256 and the user cache; several sequences
in one Hugging Face forward (``SlotModel``) and the rows processed where the model runs
(``process_rows``, ``sample_rows``, ``row_uniforms``, ``compress_rows``); the decoder a ``DecodeSpec`` picks
for a pair (``decoder_for``: its ``generate`` decodes token ids with no chat template and no records). Needs the
``models`` extra (torch, transformers, gguf, accelerate); the llama.cpp engine the ``llamacpp``
extra."""

from ._models._decoding import decoder_for
from ._models._device_rows import compress_rows, process_rows, row_uniforms, sample_rows
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
from ._models._slots import SlotModel
from ._util._paths import cache_root

__all__ = [
    "ENGINES",
    "LlamaCppModel",
    "SlotModel",
    "cache_root",
    "cached_model",
    "compress_rows",
    "decoder_for",
    "encode_chat",
    "engine_of",
    "eos_ids",
    "file_sha256",
    "llama_cpp_version",
    "load_model",
    "model_identity",
    "process_rows",
    "row_uniforms",
    "sample_rows",
    "teacher_forced_logits",
]
