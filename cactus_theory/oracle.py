"""The oracle for engines: whether an engine's speculative sampling emits the law its rule promises (``conform``):
the engine's own rows, the exact law of the tested positions, N speculative samples, the G test with its p-value
and power, the acceptance counters against each candidate law. Engines: this package's decoders
(``DecoderEngine``), a running llama-server (``LlamaServerEngine``), or yours (a subclass of ``Engine``)."""

from __future__ import annotations

from ._oracle._decoder_engine import DecoderEngine
from ._oracle._engine import Engine
from ._oracle._law import exact_tested_law
from ._oracle._llama_server import LlamaServerEngine
from ._oracle._study import ConformanceStudy, choose_contexts, conform
from ._oracle._verdict import ConformanceResult, summarize_conformance

__all__ = [
    "ConformanceResult",
    "ConformanceStudy",
    "DecoderEngine",
    "Engine",
    "LlamaServerEngine",
    "choose_contexts",
    "conform",
    "exact_tested_law",
    "summarize_conformance",
]
