"""Trace sets, split dumps and merging: parts that cover every prompt once, sets that refuse other models,
merges that refuse overlaps and their own inputs, resumed parts checked, synthesized traces copied exactly."""

import json
import os

import pytest
from trace_builders import random_trace, same_rows, split_parts, trace_metadata

from cactus_theory import SamplingSettings, analyze_trace
from cactus_theory._cli import main
from cactus_theory._data._prompts import Prompt
from cactus_theory._data._trace_writer import TraceWriter
from cactus_theory.traces import Trace, TraceError, TraceSet, merge_traces, prompt_part, select_part, synthesize_trace

RULES = ("sps", "cactus(delta=0.5)", "cactus-exact(delta=1)", "topk(k=3)")


def test_parts_are_disjoint_cover_every_prompt_and_depend_only_on_the_id():
    prompts = [Prompt(id=f"p-{i}", task="t", text="x", index=i) for i in range(300)]
    parts = [select_part(prompts, i, 4) for i in range(1, 5)]
    ids = [p.id for part in parts for p in part]
    assert sorted(ids) == sorted(p.id for p in prompts)
    assert all(40 <= len(part) <= 110 for part in parts)  # about 75 each
    assert [p.id for p in select_part(prompts[::-1], 2, 4)] == [p.id for p in parts[1]][::-1]
    assert prompt_part("p-7", 1) == 1
    with pytest.raises(ValueError, match=r"part must be an integer between 1 and 4"):
        select_part(prompts, 5, 4)


def test_a_trace_set_refuses_other_models_naming_the_field(tmp_path):
    random_trace(tmp_path / "a", 0, ["a0", "a1"])
    other = trace_metadata()
    other["draft"] = {"name": "d", "files": {"d.bin": {"sha256": "e" * 64, "bytes": 1}}}
    random_trace(tmp_path / "b", 1, ["b0"], metadata=other)
    with pytest.raises(TraceError, match="draft"):
        TraceSet([tmp_path / "a", tmp_path / "b"])
    sampling = trace_metadata(sampling=SamplingSettings(temperature=0.5, top_k=8).as_dict())
    random_trace(tmp_path / "c", 2, ["c0"], metadata=sampling)
    with pytest.raises(TraceError, match="sampling"):
        TraceSet([str(tmp_path / "a"), str(tmp_path / "c")])
    with pytest.raises(TraceError, match="no trace directory matches"):
        TraceSet(str(tmp_path / "nothing-*"))


def test_a_trace_set_from_a_glob_keeps_per_trace_rows(tmp_path):
    random_trace(tmp_path / "run-1", 0, ["x0", "x1", "x2"])
    random_trace(tmp_path / "run-2", 1, ["x0", "y1"], metadata=trace_metadata(seed=7))  # ids may repeat, seeds differ
    result = analyze_trace(str(tmp_path / "run-*"), ["sps", "cactus(delta=1)"], ms=(2,), n_boot=100)
    assert result.traces == ["run-1", "run-2"]
    assert {r["trace"] for r in result.rows} == {"all"}
    by_trace = {(r["trace"], r["rule"]): r for r in result.trace_rows}
    assert set(by_trace) == {(t, r) for t in ("run-1", "run-2") for r in ("sps", "cactus(delta=1)")}
    # the pooled acceptance is the positions-weighted mean of the traces' (a ratio of sums)
    one, two = Trace(tmp_path / "run-1"), Trace(tmp_path / "run-2")
    for rule in ("sps", "cactus(delta=1)"):
        pooled = next(r for r in result.rows if r["rule"] == rule and r["task"] == "all")
        a, b = by_trace["run-1", rule], by_trace["run-2", rule]
        want = (a["acceptance"] * one.n_positions + b["acceptance"] * two.n_positions) / (
            one.n_positions + two.n_positions
        )
        assert pooled["acceptance"] == pytest.approx(want, rel=1e-12)
        assert pooled["positions"] == one.n_positions + two.n_positions
    assert len(result.sequences) == 5
    table = result.table(trace="run-2")
    assert "sps" in table and len(table.splitlines()) == 3


def test_merged_trace_analyses_like_its_parts_as_a_set(tmp_path):
    dirs = split_parts(tmp_path)
    merged = merge_traces(tmp_path / "merged", dirs)
    assert len(merged) == 12 and merged.n_positions == sum(Trace(d).n_positions for d in dirs)
    assert "part" not in merged.metadata
    assert [m["part"] for m in merged.metadata["merged_from"]] == ["1/3", "2/3", "3/3"]
    a = analyze_trace(merged, RULES, ms=(2, 4), n_boot=200)
    b = analyze_trace(list(reversed(dirs)), RULES, ms=(2, 4), n_boot=200)  # any order
    same_rows(a.rows, b.rows)
    assert [s.id for s in a.sequences] == [s.id for s in b.sequences]
    # merging again into the same directory resumes: nothing is added twice
    again = merge_traces(tmp_path / "merged", dirs)
    assert len(again) == 12


def test_merge_refuses_overlaps_mismatches_and_its_own_input(tmp_path):
    dirs = split_parts(tmp_path)
    random_trace(tmp_path / "dup", 9, ["q-0"], metadata=trace_metadata(part="1/3"))
    with pytest.raises(TraceError, match="'q-0' is in both"):
        merge_traces(tmp_path / "m1", [*dirs, str(tmp_path / "dup")])  # q-0 is in one of the parts
    random_trace(tmp_path / "seed", 9, ["z-0"], metadata=trace_metadata(seed=5, part="1/3"))
    with pytest.raises(TraceError, match="seed"):
        merge_traces(tmp_path / "m2", [dirs[0], str(tmp_path / "seed")])
    with pytest.raises(TraceError, match="also one of the parts"):
        merge_traces(dirs[0], dirs)
    assert not os.path.exists(tmp_path / "m2" / "manifest.json")


def test_cli_merge_and_analyze_a_glob(tmp_path, capsys):
    dirs = split_parts(tmp_path)
    assert main(["merge", str(tmp_path / "part-*"), "--out", str(tmp_path / "all"), "--quiet"]) == 0
    assert "merged 12 sequences" in capsys.readouterr().out
    assert main(["analyze", str(tmp_path / "part-*"), "--rules", "sps", "--m", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "3 traces" in out and "trace part-2" in out
    assert main(["merge", dirs[0], dirs[0], "--out", str(tmp_path / "bad"), "--quiet"]) == 2


def test_dump_part_metadata_is_checked_on_resume(tmp_path):

    with TraceWriter(tmp_path / "t", 10, metadata=trace_metadata(part="1/2")):
        pass
    with pytest.raises(TraceError, match="part"):
        TraceWriter(tmp_path / "t", 10, metadata=trace_metadata(part="2/2"))
    with pytest.raises(TraceError, match="part"):
        TraceWriter(tmp_path / "t", 10, metadata=trace_metadata())  # a whole dump into a part


def test_synthesized_trace_copies_source_rows_exactly(tmp_path):
    source = random_trace(tmp_path / "src", 3, [f"s{i}" for i in range(6)])
    big = synthesize_trace(source, tmp_path / "big", 500, block=5, seed=1, shard_positions=128)
    assert big.n_positions == 500 and big.n_shards >= 4
    assert big.metadata["synthesized"]["block"] == 5
    rows = {}
    for seq in source:
        for j in range(seq.n_positions):
            rows[seq.topk_logits["target"][j].tobytes() + seq.topk_ids["draft"][j].tobytes()] = int(seq.tokens[j])
    for seq in big:
        for j in range(seq.n_positions):
            key = seq.topk_logits["target"][j].tobytes() + seq.topk_ids["draft"][j].tobytes()
            assert rows[key] == int(seq.tokens[j])  # every row is a source row, token included
    again = synthesize_trace(source, tmp_path / "again", 500, block=5, seed=1, shard_positions=128)
    assert [s.tokens.tolist() for s in again] == [s.tokens.tolist() for s in big]


def test_merge_needs_an_explicit_output(tmp_path, capsys):
    a = random_trace(tmp_path / "wa", 1, ["a-0"], metadata=trace_metadata(part="1/2"))
    b = random_trace(tmp_path / "wb", 2, ["b-0"], metadata=trace_metadata(part="2/2"))
    with pytest.raises(SystemExit) as exc:
        main(["merge", a.directory, b.directory, "--quiet"])  # used to merge wb into wa
    assert exc.value.code == 2 and "--out" in capsys.readouterr().err
    assert len(Trace(a.directory)) == 1


def test_merge_refuses_an_existing_trace_that_no_merge_wrote(tmp_path):
    dirs = split_parts(tmp_path)
    other = random_trace(tmp_path / "other", 7, ["o-0"])
    with pytest.raises(TraceError, match="no merge wrote"):
        merge_traces(other.directory, dirs)
    assert len(Trace(other.directory)) == 1


def test_a_merge_rerun_resumes_only_the_same_parts(tmp_path):
    dirs = split_parts(tmp_path)
    merge_traces(tmp_path / "m", dirs)
    assert len(merge_traces(tmp_path / "m", dirs)) == 12  # the same parts: resumes, adds nothing
    extra = random_trace(tmp_path / "x", 5, ["x-0"], metadata=trace_metadata(part="1/3"))
    with pytest.raises(TraceError, match=r"other parts .*not given now: part 1/3.*new or changed since: part 1/3"):
        merge_traces(tmp_path / "m", [extra.directory, dirs[1], dirs[2]])
    with pytest.raises(TraceError, match="not given now: part 3/3"):
        merge_traces(tmp_path / "m", dirs[:2], allow_partial=True)
    assert len(Trace(tmp_path / "m")) == 12


def test_merge_refuses_incomplete_or_mixed_splits_unless_allowed(tmp_path):
    dirs = split_parts(tmp_path)  # parts 1/3, 2/3, 3/3
    with pytest.raises(TraceError, match=r"part\(s\) 2/3 are missing"):
        merge_traces(tmp_path / "m1", [dirs[0], dirs[2]])
    other = random_trace(tmp_path / "n50", 11, ["w-0"], metadata=trace_metadata(part="1/50"))
    with pytest.raises(TraceError, match="splits into 3 and 50 parts"):
        merge_traces(tmp_path / "m2", [*dirs, other.directory])
    whole = random_trace(tmp_path / "whole", 12, ["v-0"])
    with pytest.raises(TraceError, match="is a whole dump"):
        merge_traces(tmp_path / "m3", [*dirs, whole.directory])
    twice = random_trace(tmp_path / "twice", 13, ["u-0"], metadata=trace_metadata(part="2/3"))
    with pytest.raises(TraceError, match="are both part 2/3"):
        merge_traces(tmp_path / "m4", [*dirs, twice.directory])
    merged = merge_traces(tmp_path / "m5", [dirs[0], dirs[2]], allow_partial=True)
    assert merged.metadata["partial"]["missing"] == ["2/3"]
    assert not os.path.exists(tmp_path / "m1")


def test_cli_merge_partial_and_bad_parts(tmp_path, capsys):
    dirs = split_parts(tmp_path)
    assert main(["merge", dirs[0], "--out", str(tmp_path / "m"), "--quiet"]) == 2
    assert "part(s) 2/3, 3/3 are missing" in capsys.readouterr().err
    assert main(["merge", dirs[0], "--out", str(tmp_path / "m"), "--allow-partial", "--quiet"]) == 0
    assert "partial" in capsys.readouterr().out
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["merge", str(afile), "--out", str(tmp_path / "m2"), "--quiet"]) == 2
    assert "is not a trace directory (it is a file)" in capsys.readouterr().err


def test_a_trace_set_counts_a_directory_once_however_it_is_spelled(tmp_path, monkeypatch):
    dirs = split_parts(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TraceError, match="given twice"):
        TraceSet(["part-1", os.path.realpath("part-1")])
    os.symlink(tmp_path / "part-1", tmp_path / "part-9")  # a link inside the glob
    with pytest.raises(TraceError, match="given twice"):
        TraceSet([str(tmp_path / "part-*")])
    os.remove(tmp_path / "part-9")
    assert len(TraceSet([str(tmp_path / "part-*")]).traces) == 3
    assert dirs


def test_a_trace_set_refuses_a_merge_beside_its_parts_and_copies(tmp_path):
    import shutil

    dirs = split_parts(tmp_path)
    merge_traces(tmp_path / "part-merged", dirs)
    with pytest.raises(TraceError, match=r"merged from .* count its sequences twice"):
        analyze_trace(str(tmp_path / "part-*"), ["sps"], ms=(2,), n_boot=0)
    shutil.copytree(dirs[0], tmp_path / "copy")
    with pytest.raises(TraceError, match="hold the same sequences"):
        TraceSet([dirs[0], str(tmp_path / "copy")])


def test_a_merge_killed_midway_is_refused_until_it_is_finished(tmp_path):
    parts = split_parts(tmp_path)
    out = tmp_path / "merged"
    merge_traces(out, parts, shard_positions=10)
    # what a kill after the first shards leaves: the manifest lists fewer sequences than the parts
    manifest = json.loads((out / "manifest.json").read_text())
    keep = manifest["shards"][:1]
    manifest["sequences"] = [s for s in manifest["sequences"] if s["shard"] == 0]
    manifest["shards"] = keep
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TraceError, match=r"unfinished merge: it holds \d+ of the 12 sequences"):
        analyze_trace(out, ["sps"], ms=(2,), n_boot=0)
    merged = merge_traces(out, parts)  # the rerun finishes it
    assert len(merged) == 12 and analyze_trace(out, ["sps"], ms=(2,), n_boot=0).rows


def test_synthesize_resamples_a_trace_that_holds_an_empty_sequence(tmp_path):
    src = random_trace(tmp_path / "t", 0, ["a", "b", "c"], lengths=[12, 0, 9])
    out = synthesize_trace(src, tmp_path / "s", 40, block=4)
    assert out.n_positions == 40 and all(s.n_positions > 0 for s in out)
