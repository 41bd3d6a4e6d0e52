"""Commands check where they write before the work, and an output is never one of its inputs."""

import os

import pytest
from trace_builders import random_trace, split_parts

from cactus_theory._cli import main
from cactus_theory.traces import Trace, TraceError, merge_traces, synthesize_trace


def _cannot_write(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    return str(blocker / "out")  # below a file: no one can make it, root included


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "--out", "{bad}"],
        ["analyze", "--out", "{bad}", "--rules", "sps"],
        ["plan", "--cost-ratio", "0.1", "--out", "{bad}"],
        ["merge", "{part}", "--out", "{bad}"],
        ["dump", "--verifier", "nowhere", "--draft", "nowhere", "--prompts", "{prompts}", "--out", "{bad}"],
        ["calibrate", "--verifier", "nowhere", "--draft", "nowhere", "--out", "{dir}"],
        ["decode", "--verifier", "nowhere", "--draft", "nowhere", "--prompt", "hi", "--out", "{dir}"],
    ],
)
def test_every_command_checks_its_output_location_before_the_work(tmp_path, argv, capsys, monkeypatch):
    from cactus_theory._analysis import _analyze, _shards
    from cactus_theory._models import _hf

    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    values = {"bad": _cannot_write(tmp_path), "dir": str(tmp_path), "part": str(tmp_path), "prompts": str(prompts)}
    started = []

    def work(*args, **kwargs):
        started.append(1)
        raise AssertionError("the work started before the output was checked")

    for module, name in ((_shards, "shard_statistics"), (_hf, "load_model"), (_analyze, "run_local")):
        monkeypatch.setattr(module, name, work)
    assert main([a.format(**values) for a in argv] + ["--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and ("is a file" in err or "is a directory" in err)
    assert not started  # refused before any shard was analysed or any model loaded


def test_synthesize_into_its_own_source_is_refused(tmp_path):
    src = random_trace(tmp_path / "t", 0, ["a", "b"])
    before = (tmp_path / "t" / "manifest.json").read_bytes()
    for out in (tmp_path / "t", tmp_path / "t" / "inside"):
        with pytest.raises(TraceError, match="an output is never one of its inputs"):
            synthesize_trace(src, out, 30)
    assert (tmp_path / "t" / "manifest.json").read_bytes() == before and len(Trace(tmp_path / "t")) == 2


def test_a_merge_inside_one_of_its_parts_is_refused(tmp_path):
    parts = split_parts(tmp_path)
    with pytest.raises(TraceError, match="lies inside the input"):
        merge_traces(os.path.join(parts[0], "merged"), parts)


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze", "{t}", "--out", "{t}", "--m", "2", "--bootstrap", "0"],
        ["analyze", "{t}", "--out", "{t}/sub", "--m", "2", "--bootstrap", "0"],
        ["plan", "{t}", "--out", "{t}", "--m", "2", "--bootstrap", "0"],
        ["compare", "{t}", "--out", "{t}"],
        ["report", "--trace", "{t}", "--out", "{t}"],
    ],
)
def test_commands_refuse_an_output_inside_their_input(tmp_path, argv, capsys):
    random_trace(tmp_path / "t", 0, ["a", "b", "c"])
    before = sorted(os.listdir(tmp_path / "t"))
    code = main([a.format(t=tmp_path / "t") for a in argv] + ["--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "an output is never one of its inputs" in err and len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path / "t")) == before


def test_decode_refuses_appending_records_to_its_prompt_file(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one\ntwo\n")
    code = main(["decode", "--verifier", "v", "--draft", "ngram", "--prompts", str(prompts), "--out", str(prompts)])
    assert code == 2 and "an output is never one of its inputs" in capsys.readouterr().err
    assert prompts.read_text() == "one\ntwo\n"
