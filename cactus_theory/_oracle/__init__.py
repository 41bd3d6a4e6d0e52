"""The oracle wing: does an engine's speculative sampling emit the law its rule promises? What the oracle asks of
an engine and how it reads a reported row (``_engine``: ``Engine``), the engines (``_decoder_engine``: this
package's decoders; ``_llama_server``: a running llama-server), the exact law of the tested positions and the
candidate acceptance laws (``_law``), the study that draws the samples (``_study``: ``ConformanceStudy``,
``conform``), and the verdict from the records (``_verdict``: ``summarize_conformance``, with the statistics of
``_math._multinomial``: the G test, the binomial and pooled z tests, the power).

What belongs here: anything that judges an engine's emitted law. It imports ``_models`` and ``_servers`` and the
wings below them; only the command line and the public faces import it.
"""
