"""The servers wing: inference servers users already run, over HTTP (llama.cpp's ``llama-server``,
vLLM, SGLang): the transport (``_http``: time-outs, retries, keys kept out of every message), what
each protocol's answers mean (``_protocols``), traces dumped from two servers (``_dump``), a
calibration of a server's own step times (``_calibrate``) and llama-server's own speculative
decoding driven and measured (``_referee``).

What belongs here: anything that talks to a server. What does not: running models in this
process (``_models``), the trace format (``_data``), the planner (``_analysis``). It imports
``_analysis`` and the wings below it, never ``_models`` (a server needs no torch here).
"""
