"""Logit traces and their analysis: reading, merging and writing traces (``load_trace``, ``open_traces``,
``TraceWriter``; the embedded ones), dumping them from two models or two servers (``dump_trace``,
``dump_server_trace``), importing other logs, the prompts they are dumped on, and each rule's acceptance, accepted
length and emitted drift on them with intervals (``analyze_trace``), on this machine or a Dask cluster."""

from __future__ import annotations

from ._analysis._analyze import AnalysisResult, AnalysisRow, analyze_trace, parse_rules
from ._analysis._engines import local_dask_cluster
from ._data._prompts import (
    Prompt,
    benchmark_file,
    benchmark_prompt,
    data_directory,
    load_prompts,
    mixed_prompts,
    prompt_part,
    prompt_seed,
    select_part,
)
from ._data._trace import Trace, TraceSequence, load_trace
from ._data._trace_format import TraceError
from ._data._trace_import import import_topk_logprobs, trace_from_arrays
from ._data._trace_writer import TraceWriter
from ._data._traceset import TraceSet, embedded_tasks, embedded_traces, merge_traces, open_traces, synthesize_trace
from ._models._dump import DumpSummary, dump_trace
from ._models._imports import import_logits
from ._servers._dump import dump_server_trace
from ._servers._protocols import open_server

__all__ = [
    "AnalysisResult",
    "AnalysisRow",
    "DumpSummary",
    "Prompt",
    "Trace",
    "TraceError",
    "TraceSequence",
    "TraceSet",
    "TraceWriter",
    "analyze_trace",
    "benchmark_file",
    "benchmark_prompt",
    "data_directory",
    "dump_server_trace",
    "dump_trace",
    "embedded_tasks",
    "embedded_traces",
    "import_logits",
    "import_topk_logprobs",
    "load_prompts",
    "load_trace",
    "local_dask_cluster",
    "merge_traces",
    "mixed_prompts",
    "open_server",
    "open_traces",
    "parse_rules",
    "prompt_part",
    "prompt_seed",
    "select_part",
    "synthesize_trace",
    "trace_from_arrays",
]
