"""The newcomer's path, second round (issue 26): tasks per record, loud long steps, any trace
through the whole pipeline, HTML tables and figures without defects."""

import json
import pathlib

import numpy as np
import pytest
from tiny_models import tiny_model, write_tiny_gguf

from cactus_theory import Trace, load_prompts, trace_from_arrays
from cactus_theory._cli import main

ROOT = pathlib.Path(__file__).parents[1]


def _mixed_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [
        {"prompt": "add two and two", "task": "math"},
        {"prompt": "say hello", "task": "chat"},
        {"prompt": "add three and four", "task": "math"},
        {"prompt": "no task here"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_records_own_task_field_labels_it(tmp_path):
    path = _mixed_file(tmp_path)
    prompts = load_prompts(path)
    assert [(p.id, p.task) for p in prompts] == [("math-0", "math"), ("chat-1", "chat"), ("math-2", "math"),
                                                 ("mine-3", "mine")]  # fmt: skip
    assert {p.task for p in load_prompts(path, task="all-mine")} == {"all-mine"}  # --task overrides
    assert {p.task for p in load_prompts(path, task_field=None)} == {"mine"}
    csv = tmp_path / "mine.csv"
    csv.write_text("text,kind\nhello,chat\nsum,math\n")
    assert [p.task for p in load_prompts(csv, task_field="kind")] == ["chat", "math"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "task": "a/b"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl, line 1: the task 'a/b' is not a label"):
        load_prompts(bad)
    bad.write_text(json.dumps({"prompt": "x", "task": ""}) + "\n")
    with pytest.raises(ValueError, match="must be a non-empty string"):
        load_prompts(bad)


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return str(write_tiny_gguf(tiny_model(4), d / "verifier.gguf")), str(
        write_tiny_gguf(tiny_model(5, layers=1), d / "draft.gguf")
    )


@pytest.mark.models
def test_mixed_tasks_give_per_task_rows_in_one_command(tmp_path, capsys, gguf_pair):
    v, d = gguf_pair
    path = _mixed_file(tmp_path)
    assert main(["dump", "--verifier", v, "--draft", d, "--prompts", str(path), "--max-new-tokens", "6",
                 "--out", str(tmp_path / "t"), "--quiet"]) == 0  # fmt: skip
    assert sorted({s.task for s in Trace(tmp_path / "t")}) == ["chat", "math", "mine"]
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "t"), "--rules", "sps", "--m", "2", "--bootstrap", "0", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "task chat" in out and "task math" in out and "task mine" in out


@pytest.mark.models
def test_an_interrupted_dump_says_so_and_the_rerun_says_it_resumes(tmp_path, capsys, gguf_pair, monkeypatch):
    import cactus_theory._models._dump as dump

    v, d = gguf_pair
    path = _mixed_file(tmp_path)
    argv = ["dump", "--verifier", v, "--draft", d, "--prompts", str(path), "--max-new-tokens", "5",
            "--out", str(tmp_path / "t"), "--quiet"]  # fmt: skip
    real, calls = dump.teacher_forced_logits, []

    def stop_on_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as Ctrl-C during the second prompt
        return real(*args, **kwargs)

    monkeypatch.setattr(dump, "teacher_forced_logits", stop_on_the_second)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "stopped after 1 prompt(s) of this run" in err and "1 of 4 prompts are in" in err
    assert "rerun the same command to resume" in err
    monkeypatch.setattr(dump, "teacher_forced_logits", real)
    assert main(argv) == 0
    captured = capsys.readouterr()
    held = Trace(tmp_path / "t")
    assert f"resuming {tmp_path / 't'}: 1 of 4 prompts done" in captured.err
    assert f"the trace holds 4 of 4 prompts, {held.n_positions:,} positions" in captured.err


@pytest.mark.models
def test_a_gguf_load_says_it_dequantises_and_what_it_costs(tmp_path, capsys, gguf_pair):
    from cactus_theory.hf import load_model

    load_model(gguf_pair[1], cache=False, progress=True)
    err = capsys.readouterr().err
    assert "dequantising draft.gguf" in err and "GiB of memory" in err and "--no-model-cache" in err
    help_text = " ".join(main.__globals__["build_parser"]().format_help().split())
    assert "compare" in help_text


def test_compare_reproduces_the_committed_page_and_runs_on_any_trace(tmp_path, capsys):
    assert main(["compare", "--out", str(tmp_path / "c"), "--bootstrap", "1000", "--processes", "2", "--quiet"]) == 0
    ours = (tmp_path / "c" / "rules_comparison.md").read_text().splitlines()
    committed = (ROOT / "docs" / "results" / "rules_comparison.md").read_text().splitlines()
    # the same page but for the line naming the command that made it
    assert [x for x in ours if not x.startswith("Command:")] == [x for x in committed if not x.startswith("Command:")]
    rng = np.random.default_rng(0)
    target = rng.normal(size=(60, 40)) * 2
    trace_from_arrays(tmp_path / "t", target + rng.normal(size=target.shape), target, rng.integers(40, size=60),
                      sequence_lengths=[30, 30], top_k=40,
                      metadata={"sampling": {"temperature": 1.0, "top_k": 40, "top_p": 1.0}})  # fmt: skip
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "t"), "--out", str(tmp_path / "d"), "--bootstrap", "0", "--quiet"]) == 0
    page = (tmp_path / "d" / "rules_comparison.md").read_text()
    assert "# Every rule on a trace" in page and "60 positions" in page
    assert (tmp_path / "d" / "rules_comparison.png").stat().st_size > 1000


def test_family_colours_are_one_per_family_and_plan_labels_do_not_overlap():
    import matplotlib

    matplotlib.use("Agg")
    from cactus_theory import analyze_trace, load_trace, parse_rules, plot_plan, predict_speedup
    from cactus_theory._analysis._plotting import family_colour

    assert family_colour("cactus") == family_colour("cactus") != family_colour("sps")
    names = sorted(__import__("cactus_theory").available_rules())
    assert len({family_colour(n) for n in names}) == len(names)
    result = analyze_trace(load_trace(), parse_rules("sps,tas,cactus,cactus-exact,mentored", (0.25, 0.5, 1, 2)),
                           ms=(2, 4, 8, 12, 20), n_boot=100, tasks=["gsm8k"])  # fmt: skip
    fig = plot_plan(predict_speedup(result, 0.05))
    fig.canvas.draw()
    ax = fig.axes[0]
    boxes = [t.get_window_extent() for t in ax.texts]
    assert boxes
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), "two m= labels overlap"
    # the legend's colour of a family is its colour everywhere
    handles, labels = ax.get_legend_handles_labels()
    handle = handles[next(i for i, x in enumerate(labels) if x.startswith("cactus(delta="))]
    line = handle.lines[0] if hasattr(handle, "lines") else handle  # an errorbar container: its marker line
    assert np.allclose(matplotlib.colors.to_rgb(line.get_color()), matplotlib.colors.to_rgb(family_colour("cactus")))
