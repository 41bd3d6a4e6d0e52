"""Models and real speculative decoding: loading a Hugging Face model or a GGUF file (``load_model``), decoding
with any rule (``speculative_generate``, batched, on the model's device where it can), the verifier alone beside it,
many prompts as a study (``decode_prompts``), and what the records of decoding say (``decoding_summary``)."""

from __future__ import annotations

from ._analysis._decode_records import answer_drift, batch_throughput, decoding_flags, decoding_summary, matched_times
from ._models._decode_spec import DecodeSpec
from ._models._decoding import (
    DecodeResult,
    NgramDrafter,
    autoregressive_generate,
    autoregressive_generate_batch,
    speculative_generate,
    speculative_generate_batch,
)
from ._models._hf import load_model
from ._studies._decoding import DecodeStudy, decode_prompts

__all__ = [
    "DecodeResult",
    "DecodeSpec",
    "DecodeStudy",
    "NgramDrafter",
    "answer_drift",
    "autoregressive_generate",
    "autoregressive_generate_batch",
    "batch_throughput",
    "decode_prompts",
    "decoding_flags",
    "decoding_summary",
    "load_model",
    "matched_times",
    "speculative_generate",
    "speculative_generate_batch",
]
