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
        (["plan", str(tmp_path / "t"), "--cost-ratio", "0.1", "--chain", "llama.cpp"], "--chain: the sampling of"),
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
    ["conform", "--server", "http://127.0.0.1:9", "--contexts", "0"],
    ["conform", "--verifier", "v", "--alpha", "2"],
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


#: Words of the library's own signatures, which a command line user never typed.
LIBRARY_WORDS = (
    "drift=True",
    "drift=",
    "bonus_policy",
    "static_cache",
    "cuda_graphs",
    "fuse_rule",
    "max_new_tokens",
    "draft_policy",
    "draft_mode",
    "allow_code_execution",
    "load_model(",
    "context=",
    "=True",
    "=False",
)
ARC = "tests/fixtures/benchmarks/arc_challenge/test.jsonl"
REFUSALS = [
    (["decode", "--rule", "block", "--drift"], "--drift"),
    (["decode", "--rule", "hsd", "--drift"], "--drift"),
    (["decode", "--rule", "fly", "--drift"], "--drift"),
    (["decode", "--rule", "block", "--bonus-policy", "relaxed"], "--bonus-policy"),
    (["decode", "--rule", "sps", "--bonus-policy", "relaxed", "--draft", "ngram"], "--bonus-policy"),
    (["decode", "--rule", "sps", "--static-cache", "--drift"], "--static-cache"),
    (["decode", "--rule", "sps", "--cuda-graphs", "--gate", "0:1"], "--static-cache"),
    (["decode", "--rule", "block", "--fuse-rule"], "--fuse-rule"),
    (["decode", "--rule", "sps", "--draft-policy", "llama.cpp(p_min=0.5)"], "draft policy"),
    (["decode", "--rule", "sps", "--draft-policy", "p-min(0.4)", "--draft", "ngram"], "draft policy"),
    (["evaluate", "--rule", "block", "--benchmark", "arc_challenge", "--file", ARC], "--no-drift"),
    (["evaluate", "--rule", "hsd", "--benchmark", "arc_challenge", "--file", ARC], "--no-drift"),
    (["evaluate", "--rule", "sps", "--benchmark", "humaneval"], "--allow-code-execution"),
    (
        ["evaluate", "--rule", "sps", "--benchmark", "gsm8k", "--exact", "--data", "tests/fixtures/benchmarks"],
        "--exact",
    ),
]


@pytest.mark.parametrize(("argv", "flag"), REFUSALS, ids=[" ".join(a[:4]) for a, _ in REFUSALS])
def test_refusals_of_decode_and_evaluate_name_the_command_lines_flags(argv, flag, capsys):
    """Each refusal a decode or evaluate user meets before any model loads says the flag, not the keyword of the
    library's signature behind it."""
    from locations import ROOT

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        models = ["--verifier", "v", "--draft", "d"] if "--draft" not in argv else ["--verifier", "v"]
        prompt = ["--prompt", "hi"] if argv[0] == "decode" else []
        code = main([argv[0], *models, *prompt, *argv[1:]])
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert flag in err, err
    assert not [w for w in LIBRARY_WORDS if w in err], err


@pytest.mark.llamacpp
def test_the_context_follows_the_flag_and_a_refusal_names_it(tmp_path, capsys):
    """Issue 67, item 5: a prompt longer than llama.cpp's context was refused with "load_model(..., context=N)", a
    call the command line user cannot make. Now --context sizes it (within the model's own limit: 4,096 tokens
    for these tiny models), the refusal names the flag and the length needed, and the default fits the limit."""
    from tiny_models import tiny_model, write_tiny_gguf

    verifier = str(write_tiny_gguf(tiny_model(4), tmp_path / "verifier.gguf"))  # 4,096 positions
    draft = str(write_tiny_gguf(tiny_model(5, layers=1), tmp_path / "draft.gguf"))
    long_prompt = " ".join(["one two three four"] * 30)  # 568 tokens of the tiny tokenizer
    base = ["decode", "--verifier", verifier, "--draft", draft, "--engine", "llama.cpp", "--rule", "sps", "-m", "2"]
    base += ["--prompt", long_prompt, "--max-new-tokens", "4", "--quiet"]
    assert main([*base, "--context", "300"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("cactus-theory: error: --context:"), err
    assert "would hold 568 tokens" in err and "give at least 568" in err and "4096" in err, err
    assert not [w for w in LIBRARY_WORDS if w in err], err
    assert main([*base, "--context", "100000"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--context: 100000 tokens is more than the model's own limit of 4096" in err, err
    assert main([*base, "--context", "1024"]) == 0  # the prompt fits now
    assert main(base) == 0  # the default, 2,048 tokens within the model's own limit
    capsys.readouterr()
    assert main([*base[:6], "hf", *base[7:], "--context", "1024"]) == 2  # an option of llama.cpp's alone
    assert "--context sizes llama.cpp's context" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--quality", "records.jsonl", "--temp", "1.0"],
        ["plan", "--rules", "sps", "--temp", "0.3"],
        ["evaluate", "--rescore", "records.jsonl", "--rule", "sps", "--temp", "1.0"],
        ["analyze", "--rul", "sps"],
        ["conform", "--serv", "http://127.0.0.1:9", "--prompts", "p.txt"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_an_abbreviated_flag_is_refused_never_read_as_another(argv, capsys):
    """``--temp`` is not ``--temperature``: what a command reads as written is what argparse parsed."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unrecognized arguments" in err[0], err


def test_plan_quality_refuses_a_bootstrap_of_zero(tmp_path, capsys):
    """The frontier decides by the loss's upper 95% bound: without resamples there is none (never read as 1000)."""
    assert main(["plan", "--quality", str(tmp_path / "r.jsonl"), "--bootstrap", "0", "--cost-ratio", "0.2"]) == 2
    assert "--bootstrap 0 gives no intervals" in capsys.readouterr().err


def test_evaluate_rescore_never_replaces_a_file_it_did_not_make(tmp_path, capsys):
    notes = tmp_path / "my_notes.jsonl"
    notes.write_text("my own notes\n")
    records = tmp_path / "r.jsonl"
    records.write_text("")
    assert main(["evaluate", "--rescore", str(records), "--rule", "sps", "--out", str(notes)]) == 2
    assert "exists: the rescored records go to a new file" in capsys.readouterr().err
    assert notes.read_text() == "my own notes\n"
