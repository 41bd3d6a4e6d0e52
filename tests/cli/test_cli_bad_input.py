"""Every subcommand refuses bad input in one line naming the option and exits 2, never with a traceback."""

import json
import os

import pytest
from trace_builders import random_trace

from cactus_theory._cli import main


def test_the_messages_of_the_issue(tmp_path, capsys):
    random_trace(tmp_path / "t", 0, ["a", "b"])
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "c.json").write_text(json.dumps({"draft_token": 0.01, "verify_block": {"\u00b2": 0.03, "1": 0.03}}))
    cases = [
        (["analyze", str(tmp_path / "t"), "--out", str(tmp_path / "dangling")], "is a symbolic link"),
        (["analyze", "--rules", "x" * 100_000], "unknown rule"),
        (["plan", "--cost", str(tmp_path / "c.json")], "verify_block keys must be block sizes"),
        (["plan", "--cost", str(fifo)], "is not a regular file"),
        (["analyze", str(tmp_path / "t" / "manifest.json")], "is a file, not a trace directory"),
        (["dump", "--verifier", "v", "--draft", "d", "--prompts", "p", "--out", "o", "--seed", "-1"], "--seed"),
        (["decode", "--verifier", "v", "--draft", "d", "--prompt", "hi", "--seed", "-3"], "--seed"),
        (["analyze", "--bootstrap", "100000000000"], "--bootstrap"),
    ]
    for argv, expected in cases:
        try:
            code = main([*argv, "--quiet"] if argv[0] in ("analyze", "plan") else argv)
        except SystemExit as exc:  # argparse's own refusals exit 2
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2, (argv[:3], err)
        assert expected in err and "Traceback" not in err, (argv[:3], err)
        assert len(err.strip().splitlines()) == 1 and len(err) < 1500, (argv[:3], err)


BAD = [
    ["gamma", "--target-prob", "1.5", "--delta", "1"],
    ["gamma", "--target-prob", "0.3", "--delta", "-1"],
    ["rules", "--nonsense"],
    ["dump", "--verifier", "v", "--draft", "d", "--prompts", "/nonexistent/prompts.txt", "--out", "{tmp}/o"],
    ["dump", "--verifier", "v", "--draft", "d", "--prompts", "p", "--out", "o", "--top-logits", "0"],
    ["analyze", "--rules", "nonsense"],
    ["analyze", "--m", "0"],
    ["analyze", "--delta", "abc"],
    ["analyze", "/nonexistent/trace"],
    ["decode", "--verifier", "v", "--draft", "d", "--prompt", "hi", "--rule", "nonsense"],
    ["decode", "--verifier", "v", "--draft", "d", "--prompt", "hi", "-m", "0"],
    ["calibrate", "--verifier", "v", "--draft", "d", "--max-block", "0"],
    ["calibrate", "--verifier", "/nonexistent/model.gguf", "--draft", "d"],
    ["plan", "--cost", "/nonexistent/cost.json"],
    ["plan", "--max-kl", "nan"],
    ["merge", "/nonexistent/a", "--out", "{tmp}/m"],
    ["merge", "a"],
    ["compare", "/nonexistent/trace"],
    ["compare", "--bootstrap", "5"],
    ["block", "--m", "0"],
    ["block", "--paths", "0"],
    ["trees", "/nonexistent/trace"],
    ["trees", "--k", "0"],
    ["report", "--trace", "/nonexistent/trace", "--out", "{tmp}/r"],
    ["report", "--out", "/proc/nope/r"],
    ["evaluate", "--verifier", "v", "--draft", "d", "--rule", "nonsense", "--out", "{tmp}/e.jsonl"],
    ["evaluate", "--verifier", "v", "--draft", "d", "--rule", "sps", "--limit", "0", "--out", "{tmp}/e.jsonl"],
    ["evaluate", "--summarize", "/nonexistent/records.jsonl"],
]


@pytest.mark.parametrize("argv", BAD, ids=[" ".join(a[:3]) for a in BAD])
def test_every_subcommand_refuses_bad_input_in_one_line_with_exit_2(argv, tmp_path, capsys):
    from cactus_theory._cli._main import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices)
    assert {a[0] for a in BAD} == commands  # every subcommand is tried
    argv = [a.format(tmp=tmp_path) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2, (argv, captured.err)
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in captured.err, captured.err
