"""Benchmarks are registered as rules are: the package's own from one module each, a user's from one file
(``toy_benchmark.py``, the house page's worked example) given with --plugin, in a fresh interpreter (so no
other test sees it registered): listed, offered by --benchmark and --dataset, its problems loaded, graded
and summarised by ``evaluate``."""

import json
import pathlib
import subprocess
import sys

import pytest
from locations import HANG_GUARD, ROOT

from cactus_theory.benchmarks import Benchmark, benchmark_names, get_benchmark

PLUGIN = pathlib.Path(__file__).with_name("toy_benchmark.py")


def test_the_packages_own_benchmarks_are_one_module_each():
    from cactus_theory._data import _benchmarks

    choices = ("arc_challenge", "arc_easy", "commonsense_qa", "openbook_qa")
    modules = {m.__name__.rsplit(".", 1)[1] for m in _benchmarks._MODULES}
    assert modules == {"gsm8k", "humaneval", "mbpp", "choice", *choices, "mt_bench", "spec_bench"}
    names = ("gsm8k", "humaneval", "mbpp", "choice", *choices, "mt_bench", "spec_bench")
    assert benchmark_names(plugins=False) == names
    assert benchmark_names(graded=True, plugins=False) == names[:8]
    assert [n for n in names if get_benchmark(n).one_token] == ["choice", *choices]
    assert [n for n in benchmark_names(plugins=False) if get_benchmark(n).runs_code] == ["humaneval", "mbpp"]
    with pytest.raises(ValueError, match="graded benchmark must be one of gsm8k, humaneval, mbpp, choice, arc_chall"):
        get_benchmark("mt_bench", graded=True)


def test_a_name_is_taken_once():
    class Again(Benchmark):
        def prompt(self, record):
            return ""

    with pytest.raises(ValueError, match="benchmark name 'gsm8k' is taken by"):
        type("Clash", (Again,), {"name": "gsm8k", "__module__": "elsewhere"})


CHILD = """
import json, sys
sys.path[:0] = [{tests!r}]
import toy_benchmark  # registers "toy-sums"
from cactus_theory.benchmarks import benchmark_names, grade, load_problems
problems = load_problems("toy-sums", path={path!r})
print(json.dumps({{
    "names": benchmark_names(graded=True),
    "ids": [p.id for p in problems],
    "right": grade(problems[0], "2 and 3 make 5").correct,
    "wrong": grade(problems[1], "it is 12").correct,
}}))
"""


def test_a_benchmark_defined_outside_the_package_is_one_file(tmp_path):
    path = tmp_path / "sums.jsonl"
    path.write_text('{"a": 2, "b": 3}\n{"a": 10, "b": 1}\n')
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(tests=str(PLUGIN.parent), path=str(path))],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["names"][-1] == "toy-sums" and out["ids"] == ["toy-sums-0", "toy-sums-1"]
    assert (out["right"], out["wrong"]) == (True, False)
    assert "toy-sums" not in benchmark_names()  # this process never imported it


@pytest.mark.llamacpp
@pytest.mark.models
def test_evaluate_grades_a_plugin_benchmark(gguf_pair, tmp_path):
    v_path, d_path = gguf_pair
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps({"a": a, "b": 1}) + "\n" for a in range(3)))
    common = [sys.executable, "-m", "cactus_theory", "--plugin", str(PLUGIN)]
    argv = [
        *common,
        "evaluate",
        "--verifier",
        v_path,
        "--draft",
        d_path,
        "--engine",
        "llama.cpp",
        "--rule",
        "sps",
        "--benchmark",
        "toy-sums",
        "--file",
        str(path),
        "--max-new-tokens",
        "4",
        "-m",
        "2",
        "--quiet",
        "--bootstrap",
        "0",
        "--out",
        str(tmp_path / "records.jsonl"),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_GUARD, cwd=str(ROOT))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| toy-sums | verifier alone | 3 |" in done.stdout and "| toy-sums | sps | 3 |" in done.stdout
    helped = subprocess.run([*common, "evaluate", "--help"], capture_output=True, text=True, timeout=HANG_GUARD)
    assert "toy-sums" in helped.stdout


def test_the_gauntlet_sets_ask_each_question_at_the_answer_position(tmp_path):
    """Each of llm-foundry's four sets read from its own format into the one multiple-choice prompt: the question,
    the choices lettered, "Answer:"; CommonsenseQA's choices read back from its query (written out here by
    hand from the fixture files)."""
    from locations import FIXTURES

    from cactus_theory.quality import load_problems

    BENCHMARKS = FIXTURES / "benchmarks"

    expected = {
        "arc_easy": ("gh ef?", ["ab", "cd", "ef", "gh"], "D", "science"),
        "commonsense_qa": ("ab gh cd?", ["ef ab", "cd", "gh gh", "ab"], "C", None),
        "openbook_qa": ("ab cd ef gh is", ["ab", "cd", "ef", "gh"], "C", "science"),
        "arc_challenge": ("ab cd ef?", ["ab", "cd", "ef", "gh"], "B", "science"),
    }
    for name, (question, choices, answer, subject) in expected.items():
        problems = load_problems(name, BENCHMARKS, limit=None)
        assert len(problems) == (4 if name == "arc_challenge" else 3)
        head = f"The following are multiple choice questions (with answers) about {subject}.\n\n" if subject else ""
        lettered = "".join(f"{'ABCD'[i]}. {c}\n" for i, c in enumerate(choices))
        assert problems[0].prompt.text == f"{head}{question}\n{lettered}Answer:"
        assert problems[0].reference == {"answer": answer, "letters": "ABCD"}
        assert "8c8dd48f72168c5d51e2f7b151595892a8fba43d" in get_benchmark(name).source
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "Question: a?\\nChoices:\\nA. x\\nAnswer:", "choices": ["A", "B"], "gold": 0}\n')
    with pytest.raises(ValueError, match="the query letters 1 choices where 'choices' has 2"):
        load_problems("commonsense_qa", path=str(bad))
