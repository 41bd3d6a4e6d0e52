"""Dumping traces from models: an interrupted dump says so and its rerun says it resumes; a GGUF load says
it dequantises and what that costs."""

import pytest

from cactus_theory import Trace
from cactus_theory._cli import main


@pytest.mark.models
def test_an_interrupted_dump_says_so_and_the_rerun_says_it_resumes(
    tmp_path, capsys, gguf_pair, monkeypatch, mixed_prompt_file
):
    import cactus_theory._models._dump as dump

    v, d = gguf_pair
    path = mixed_prompt_file
    argv = ["dump", "--verifier", v, "--draft", d, "--prompts", str(path), "--max-new-tokens", "5",
            "--out", str(tmp_path / "t"), "--quiet"]  # fmt: skip
    real, calls = dump._finish, []

    def stop_on_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as Ctrl-C as the second prompt completes
        return real(*args, **kwargs)

    monkeypatch.setattr(dump, "_finish", stop_on_the_second)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "stopped after 1 prompt(s) of this run" in err and "1 of 4 prompts are in" in err
    assert "rerun the same command to resume" in err
    monkeypatch.setattr(dump, "_finish", real)
    assert main(argv) == 0
    captured = capsys.readouterr()
    held = Trace(tmp_path / "t")
    assert f"resuming {tmp_path / 't'}: 1 of 4 prompts done" in captured.err
    assert f"the trace holds 4 prompts, {held.n_positions:,} positions" in captured.err


@pytest.mark.models
def test_a_gguf_load_says_it_dequantises_and_what_it_costs(tmp_path, capsys, gguf_pair):
    from cactus_theory.hf import load_model

    load_model(gguf_pair[1], cache=False, progress=True)
    err = capsys.readouterr().err
    assert "dequantising draft.gguf" in err and "GiB of memory" in err and "--no-model-cache" in err
    help_text = " ".join(main.__globals__["build_parser"]().format_help().split())
    assert "compare" in help_text
