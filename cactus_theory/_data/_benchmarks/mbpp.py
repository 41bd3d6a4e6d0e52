"""MBPP (google-research/mbpp, ``mbpp/README.md``: a solution passes the problem's ``test_list`` asserts, after
its ``test_setup_code``): the answer's code block, then the setup, then the asserts, run by ``_util._sandbox``
(isolated by the operating system, only when asked)."""

from __future__ import annotations

import re
from typing import ClassVar

from ..._util._sandbox import run_sandboxed
from ._code import code_block, drop_main_block
from ._registry import PROGRAM_SECONDS, Benchmark, Grade, short, text_field

__all__ = ["MBPP", "mbpp_program"]


class MBPP(Benchmark):
    """MBPP's basic Python problems, pass@1 by their asserts."""

    name: ClassVar[str] = "mbpp"
    file: ClassVar[str] = "mbpp/mbpp.jsonl"
    source: ClassVar[str] = "github.com/google-research/google-research, mbpp/mbpp.jsonl (Apache-2.0)"
    runs_code: ClassVar[bool] = True
    order: ClassVar[int] = 30

    def prompt(self, record):
        tests = record.get("test_list", [])
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            raise ValueError(f"an mbpp record's 'test_list' must be a list of strings; got {short(tests)}")
        return (
            f"{text_field(self.name, record, 'text')}\nYour code should pass this test:\n{chr(10).join(tests[:1])}\n"
            "Reply with Python code only."
        )

    def reference(self, record, where):
        tests = record.get("test_list")
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError(f"{where}: an MBPP record needs 'test_list', a list of assert statements")
        return {"test_list": tests, "test_setup_code": str(record.get("test_setup_code") or "")}

    def grade(self, reference, completion, *, timeout=PROGRAM_SECONDS, pattern=None):
        result = run_sandboxed(mbpp_program(reference, completion), timeout=timeout)
        return Grade(result.passed, None, result.status)


def mbpp_program(reference: dict, completion: str) -> str:
    """The answer's code (the block defining the function the first assert calls), the problem's
    ``test_setup_code``, then its ``test_list`` asserts."""
    ref = reference
    called = re.search(r"assert\s+\(?\s*(?:not\s+)?\(?\s*([A-Za-z_]\w*)\s*\(", ref["test_list"][0])
    code = code_block(completion, called.group(1) if called else None)
    code = completion if code is None else code
    return "\n".join([drop_main_block(code), ref.get("test_setup_code") or "", *ref["test_list"]]) + "\n"
