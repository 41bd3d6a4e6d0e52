"""Traces, trace sets and prompts: the trace format is known here alone (``Trace`` and
``TraceWriter`` give typed records; no other wing reads a manifest). Never imports rules or torch.
Imports ``_math``, ``_util``."""
