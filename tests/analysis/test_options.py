"""The options record: ``analyze_trace`` and ``decode_prompts`` take their settings whole (what the command line
passes) with the same result as the keywords, and refuse both at once."""

import pytest
from trace_builders import random_trace

from cactus_theory import SamplingSettings, analyze_trace
from cactus_theory._analysis._options import AnalysisOptions
from cactus_theory._models._decode_spec import DecodeSpec


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


def test_one_decode_spec_holds_every_setting_of_decode_prompts_and_refuses_both_forms():
    import dataclasses
    import inspect

    from cactus_theory import SamplingSettings, decode_prompts

    takes = set(inspect.signature(decode_prompts).parameters)
    assert takes == {"verifier", "draft", "rule", "prompts", "spec", "out", "progress", "client", "settings"}
    fields = {f.name for f in dataclasses.fields(DecodeSpec) if f.init}
    assert fields == {
        "rule",
        "m",
        "settings",
        "max_new_tokens",
        "seed",
        "bonus_policy",
        "draft_mode",
        "draft_policy",
        "gate",
        "drift",
        "batch",
        "baseline",
        "chunk_seconds",
        "static_cache",
        "cuda_graphs",
        "fuse_rule",
    }
    assert DecodeSpec(cuda_graphs=True).static_cache  # a captured forward has one shape
    spec = DecodeSpec(m=3, settings=SamplingSettings(temperature=0.5), draft_policy="p-min(0.4)", gate="1:2")
    assert spec.with_rule("cactus(delta=1)").policy_label == spec.policy_label == "p-min(0.4)"
    assert spec.with_rule("sps").judgement.per_token and spec.with_rule(None).judgement is None
    with pytest.raises(ValueError, match="give spec= or the keywords m, not both"):
        decode_prompts(None, None, ["sps"], [], spec, m=2)
    for bad, message in (
        ({"m": 0}, "m must be an integer between 1 and 256"),
        ({"batch": True}, "batch must be an integer"),
        ({"drift": 1}, "drift must be True or False"),
        ({"cuda_graphs": "yes"}, "cuda_graphs must be True or False"),
        ({"fuse_rule": 1}, "fuse_rule must be True or False"),
        ({"chunk_seconds": float("nan")}, "chunk_seconds must be a finite number"),
        ({"bonus_policy": "x"}, "bonus_policy must be one of"),
        ({"draft_policy": "cost-optimal"}, "needs a cost model"),
        ({"rule": "rrs(k=4)"}, "verifies a tree"),
        ({"rule": "block", "drift": True}, "judges whole blocks"),
    ):
        with pytest.raises(ValueError, match=message):
            DecodeSpec(**bad)


def test_analysis_options_hold_every_keyword_of_analyze_trace():
    import inspect

    analysed = set(inspect.signature(analyze_trace).parameters) - {"trace", "rules", "progress", "client", "options"}
    assert analysed == set(AnalysisOptions().keywords())
