"""The command line: `cactus-theory gamma` and `python -m cactus_theory`."""

import json
import subprocess
import sys

import mpmath as mp
import mpref
import numpy as np

from cactus_theory._cli import main


def test_gamma_table(capsys):
    assert main(["gamma", "--target-prob", "0.3", "--delta", "1.0", "--draft-prob", "0.8"]) == 0
    out = capsys.readouterr().out
    exact = mpref.gamma_star("kl", 0.3, 1.0)
    assert f"{float(exact):.12f}" in out
    assert "taylor" in out and "safe" in out and "P(accept)" in out


def test_gamma_json_reports_achieved_divergence(capsys):
    assert main(["gamma", "--target-prob", "0.9", "--delta", "0.01", "--json", "--draft-prob", "0.99"]) == 0
    rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert abs(rows["taylor"]["divergence"] - 0.0116) < 5e-5 and not rows["taylor"]["within_delta"]
    assert rows["safe"]["within_delta"] and rows["exact"]["within_delta"]
    assert abs(mp.mpf(rows["exact"]["acceptance"]) - mpref.gamma_star("kl", 0.9, 0.01) / mp.mpf(0.99)) < 1e-14


def _run(*args):
    return subprocess.run([sys.executable, "-m", "cactus_theory", *args], capture_output=True, text=True, check=False)


def test_module_entry_point_and_bad_input():
    ok = _run("gamma", "--target-prob", "0.3", "--delta", "1", "--divergence", "chi2")
    assert ok.returncode == 0 and "chi2" in ok.stdout
    bad = _run("gamma", "--target-prob", "1.3", "--delta", "1")
    assert bad.returncode == 2 and "must be a probability in [0, 1]" in bad.stderr
    bad = _run("gamma", "--target-prob", "0.3", "--delta", "-1")
    assert bad.returncode == 2 and "budget >= 0" in bad.stderr


# --- the command line as a new user meets it (issue 14) -------------------------------------------

import argparse  # noqa: E402

import pytest  # noqa: E402

from cactus_theory._cli._main import build_parser  # noqa: E402
from cactus_theory.traces import Trace, TraceWriter, load_prompts, trace_from_arrays  # noqa: E402


def test_every_option_has_help_and_help_shows_defaults():
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, sub in subs.items():
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"{name} {action.option_strings} has no help"
    text = " ".join(subs["analyze"].format_help().split()).replace("- ", "-")  # argparse wraps after a hyphen
    assert "(default: sps,tas,cactus,cactus-exact,mentored)" in text and "rfsd" in text and "spec-cascade-tok3" in text
    assert "(default: None)" not in text
    assert "(default: 128)" in subs["dump"].format_help() and "JSON Lines" in subs["dump"].format_help()
    assert "(default: 8)" in subs["decode"].format_help() and "lossy" in subs["decode"].format_help()


def _error(capsys, argv, code):
    assert main(argv) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cactus-theory: error: "), err
    return err[0]


@pytest.mark.models
def test_expected_failures_print_one_line(tmp_path, capsys, gguf_pair, own_prompts):
    v, d = gguf_pair
    dump = ["dump", "--verifier", v, "--draft", d, "--prompts", own_prompts, "--field", "instruction", "--quiet"]
    assert "is a file" in _error(capsys, [*dump, "--out", "/etc/passwd/trace"], 2).lower()  # unwritable --out
    line = _error(capsys, [*dump, "--out", str(tmp_path / "t"), "--completions", str(tmp_path / "none.jsonl")], 2)
    assert "does not exist" in line
    line = _error(
        capsys,
        [
            "dump",
            "--verifier",
            "./nowhere",
            "--draft",
            d,
            "--prompts",
            own_prompts,
            "--field",
            "instruction",
            "--out",
            str(tmp_path / "u"),
        ],
        2,
    )
    assert "'./nowhere' does not exist" in line
    line = _error(
        capsys, ["dump", "--verifier", v, "--draft", d, "--prompts", own_prompts, "--out", str(tmp_path / "v")], 2
    )
    assert "pass --field NAME" in line
    TraceWriter(tmp_path / "empty", 64).close()
    assert "holds no sequences" in _error(capsys, ["analyze", str(tmp_path / "empty"), "--quiet"], 2)
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "manifest.json").write_text("[1, 2]")
    assert "corrupt" in _error(capsys, ["analyze", str(tmp_path / "corrupt"), "--quiet"], 2)
    assert "no rules given" in _error(capsys, ["analyze", "--rules", "", "--quiet"], 2)
    decode = ["decode", "--verifier", v, "--draft", d, "--quiet"]
    assert "tokenises to nothing" in _error(capsys, [*decode, "--prompt", ""], 2)
    for argv in ([*dump, "--out", "x", "--max-new-tokens", "0"], [*dump, "--out", "x", "--limit", "-1"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    assert "must be an integer from 1 to 131,072; got 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="holds no sequences"):
        main(["--debug", "analyze", str(tmp_path / "empty"), "--quiet"])


def test_analyze_prints_per_task_tables_and_filters_tasks(tmp_path, capsys):
    rng = np.random.default_rng(0)
    target = rng.normal(size=(60, 80)) * 3
    trace_from_arrays(
        tmp_path / "t",
        target + rng.normal(size=(60, 80)),
        target,
        rng.integers(80, size=60),
        sequence_lengths=[20, 20, 20],
        tasks=["gsm8k", "chat", "gsm8k"],
        top_k=32,
    )
    assert main(["analyze", str(tmp_path / "t"), "--rules", "sps", "--m", "4", "--bootstrap", "0", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert (
        "all tasks (60 positions)" in out and "task chat (20 positions)" in out and "task gsm8k (40 positions)" in out
    )
    assert (
        main(["analyze", str(tmp_path / "t"), "--rules", "sps", "--task", "chat", "--bootstrap", "0", "--quiet"]) == 0
    )
    out = capsys.readouterr().out
    assert "task chat (20 positions)" in out and "gsm8k" not in out
    line = _error(capsys, ["analyze", str(tmp_path / "t"), "--task", "math", "--quiet"], 2)
    assert "not in the trace; its tasks: chat, gsm8k" in line


@pytest.mark.models
def test_own_prompts_dumped_decoded_and_analysed(tmp_path, capsys, gguf_pair, own_prompts):
    """The walkthrough of docs/tutorials/walkthrough.md with tiny GGUF models instead of the Qwen pair."""
    v, d = gguf_pair
    common = ["--verifier", v, "--draft", d, "--prompts", own_prompts, "--field", "instruction", "--quiet"]
    assert main(["dump", *common, "--task", "instructions", "--max-new-tokens", "6", "--out", str(tmp_path / "t")]) == 0
    trace = Trace(tmp_path / "t")
    assert sorted(s.id for s in trace) == [f"instructions-{i}" for i in range(4)]
    manifest = (tmp_path / "t" / "manifest.json").read_text()
    assert str(tmp_path) not in manifest and '"name": "verifier"' in manifest  # identity, not a path
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "t"), "--rules", "sps,cactus(delta=1)", "--bootstrap", "0", "--quiet"]) == 0
    assert "cactus(delta=1)" in capsys.readouterr().out
    records = tmp_path / "records.jsonl"
    argv = [
        "decode",
        *common,
        "--rule",
        "cactus(delta=1)",
        "-m",
        "4",
        "--max-new-tokens",
        "6",
        "--baseline",
        "--out",
        str(records),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "speedup" in out and "my_prompts" in out
    lines = records.read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(x)["baseline"]["tokens"] > 0 for x in lines)
    assert main(argv) == 0  # a rerun reads the records back instead of decoding again
    assert len(records.read_text().splitlines()) == 4


def test_the_model_commands_default_to_the_documented_dtype():
    from cactus_theory._cli._main import build_parser

    parser = build_parser()
    for argv in (
        ["dump", "--verifier", "v", "--draft", "d", "--prompts", "p", "--out", "o"],
        ["decode", "--verifier", "v", "--draft", "d", "--prompt", "hi"],
        ["calibrate", "--verifier", "v", "--draft", "d"],
    ):
        assert parser.parse_args(argv).dtype == "bfloat16"


@pytest.mark.models
def test_several_rules_share_one_baseline_and_interleaving_changes_no_token(
    tmp_path, capsys, gguf_pair, own_prompts, monkeypatch
):
    from cactus_theory import make_rule
    from cactus_theory._math._sampling import SamplingSettings
    from cactus_theory._models import _device_loop as _device_decode
    from cactus_theory._models._hf import encode_chat, eos_ids, load_model
    from cactus_theory._studies import _decoding as _decode_prompts
    from cactus_theory.decode import autoregressive_generate_batch, speculative_generate_batch

    v, d = gguf_pair
    calls = []
    real = _device_decode._autoregressive_steps  # the Hugging Face engine's verifier alone: on its device, batched

    def counted(*a, **k):
        calls.append(1)
        return (yield from real(*a, **k))

    monkeypatch.setattr(_device_decode, "_autoregressive_steps", counted)
    monkeypatch.setattr(_decode_prompts, "INTERLEAVE_SECONDS", 0.0)  # one step a chunk: the runs alternate step by step
    records = tmp_path / "records.jsonl"
    common = [
        "decode",
        "--verifier",
        v,
        "--draft",
        d,
        "--prompts",
        own_prompts,
        "--field",
        "instruction",
        "--quiet",
        "-m",
        "3",
        "--max-new-tokens",
        "8",
        "--baseline",
        "--dtype",
        "float32",
        "--out",
        str(records),
    ]
    assert main([*common, "--rule", "sps"]) == 0
    assert len(calls) == 4  # one baseline per prompt
    assert main([*common, "--rule", "sps", "--rule", "cactus(delta=1)"]) == 0
    assert len(calls) == 4  # cactus decoded with the baselines already recorded: none run again
    rows = [json.loads(x) for x in records.read_text().splitlines()]
    assert len(rows) == 8
    by_prompt = {}
    for r in rows:
        by_prompt.setdefault(r["id"], []).append(r)
    assert all(len(rs) == 2 and rs[0]["baseline"] == rs[1]["baseline"] for rs in by_prompt.values())
    assert rows[0]["setting"]["models"]["draft"]["name"] == "draft" and rows[0]["setting"]["max_new_tokens"] == 8
    # another setting into the same file is refused before anything is decoded, the file untouched
    kept = records.read_text()
    for more, differs in (
        (["--temperature", "0.3"], "sampling.temperature"),
        (["--max-new-tokens", "9"], "max_new_tokens: 8 -> 9"),
        (["--dtype", "bfloat16"], "arithmetic.verifier.dtype"),
        (["--draft", v], "models.draft"),
    ):
        line = _error(capsys, [*common, *more, "--rule", "sps"], 2)
        assert "holds records of another setting" in line and differs in line, line
    assert records.read_text() == kept and len(calls) == 4
    # a file that is not decoding records is never changed
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"prompt": "mine"}')
    line = _error(capsys, [*common[:-1], str(notes), "--rule", "sps"], 2)
    assert "is not a records file of cactus-theory decode" in line and notes.read_text() == '{"prompt": "mine"}'
    # a fresh run of both rules: one baseline per prompt, every run alternating with the others
    fresh = tmp_path / "fresh.jsonl"
    argv = [*common[:-1], str(fresh), "--rule", "sps,cactus(delta=1)"]
    assert main(argv) == 0 and len(calls) == 8
    again = [json.loads(x) for x in fresh.read_text().splitlines()]
    assert all(r["interleaved_with"] == 2 and r["chunks"] > 1 for r in again)
    # interleaved runs emit exactly the tokens each run emits alone
    verifier = load_model(v, dtype="float32", cache=False)
    draft = load_model(d, dtype="float32", cache=False)[0]
    settings = SamplingSettings()
    eos = eos_ids(verifier[0], verifier[1])
    for prompt in load_prompts(own_prompts, field="instruction"):
        ids = encode_chat(verifier[1], prompt.text, "p")
        seed = _decode_seed(prompt.id)
        for r in (x for x in again if x["id"] == prompt.id):
            alone = speculative_generate_batch(
                verifier[0], draft, make_rule(r["rule"]), 3, [ids], [seed], settings, 8, eos
            )[0]
            assert r["token_ids"] == [int(t) for t in alone.tokens]
        base = autoregressive_generate_batch(verifier[0], [ids], [seed], settings, 8, eos)[0]
        assert next(x for x in again if x["id"] == prompt.id)["baseline"]["token_ids"] == base.tokens


def _decode_seed(prompt_id):
    from cactus_theory._data._prompts import prompt_seed

    return prompt_seed(0, prompt_id)


def test_interleave_alternates_runs_and_returns_each_value():
    from cactus_theory._models._clock import interleave

    order = []

    def run(name, steps):
        for i in range(steps):
            order.append((name, i))
            yield
        return name.upper()

    values, loads, chunks = interleave([run("a", 3), run("b", 1), run("c", 2)], chunk_seconds=0.0)
    assert values == ["A", "B", "C"]
    assert order == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("c", 1), ("a", 2)]
    assert chunks == [4, 2, 3]  # the last chunk of each is the one that finds it finished
    assert all(x is None or 0.0 <= x <= 1.0 for x in loads)


@pytest.mark.models
def test_mixed_tasks_give_per_task_rows_in_one_command(tmp_path, capsys, gguf_pair, mixed_prompt_file):
    v, d = gguf_pair
    path = mixed_prompt_file
    assert (
        main(
            [
                "dump",
                "--verifier",
                v,
                "--draft",
                d,
                "--prompts",
                str(path),
                "--max-new-tokens",
                "6",
                "--out",
                str(tmp_path / "t"),
                "--quiet",
            ]
        )
        == 0
    )
    assert sorted({s.task for s in Trace(tmp_path / "t")}) == ["chat", "math", "mine"]
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "t"), "--rules", "sps", "--m", "2", "--bootstrap", "0", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "task chat" in out and "task math" in out and "task mine" in out
