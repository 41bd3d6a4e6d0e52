"""The options record: ``analyze_trace`` and ``decode_prompts`` take their settings whole (what the command line
passes) with the same result as the keywords, and refuse both at once."""

import pytest
from trace_builders import random_trace

from cactus_theory import SamplingSettings, analyze_trace
from cactus_theory._analysis._options import AnalysisOptions
from cactus_theory._models._decode_prompts import DecodeOptions


def test_the_record_and_the_keywords_give_the_same_rows(tmp_path):
    trace = random_trace(tmp_path / "t", 1, ["a", "b", "c"])
    settings = SamplingSettings(temperature=0.8, top_k=8, top_p=0.9)
    keywords = {
        "ms": (2, 3),
        "settings": settings,
        "n_boot": 200,
        "seed": 4,
        "bonus_policy": "relaxed",
        "tasks": ["code"],
        "draft_mode": "greedy",
    }
    by_keywords = analyze_trace(trace, ["sps", "cactus(delta=1)"], progress=False, **keywords)
    by_record = analyze_trace(trace, ["sps", "cactus(delta=1)"], progress=False, options=AnalysisOptions(**keywords))
    assert by_record.rows == by_keywords.rows and by_record.rows


def test_a_record_and_keywords_at_once_are_refused(tmp_path):
    trace = random_trace(tmp_path / "t", 1, ["a", "b"])
    with pytest.raises(ValueError, match="give options= or the keywords ms, n_boot, not both"):
        analyze_trace(trace, ["sps"], ms=(2,), n_boot=100, options=AnalysisOptions())
    with pytest.raises(ValueError, match="options must be an AnalysisOptions"):
        analyze_trace(trace, ["sps"], options={"ms": (2,)})
    # a keyword at its default beside a record is no clash
    assert analyze_trace(trace, ["sps"], ms=(4, 8, 20), progress=False, options=AnalysisOptions(ms=(2,), n_boot=0))


def test_decode_options_hold_every_keyword_of_decode_prompts():
    import inspect

    from cactus_theory import decode_prompts

    takes = set(inspect.signature(decode_prompts).parameters) - {
        "verifier",
        "draft",
        "rule",
        "prompts",
        "out",
        "progress",
        "options",
    }
    assert takes == set(DecodeOptions().keywords())
    analysed = set(inspect.signature(analyze_trace).parameters) - {"trace", "rules", "progress", "client", "options"}
    assert analysed == set(AnalysisOptions().keywords())
